"""Ghost clipping in one backward pass ("book-keeping", Bu et al. 2023), on Opacus's hooks.

Opacus's ghost clipping (``GradSampleModuleFastGradientClipping``) takes each sample's
gradient norm in a first backward pass and the sum of the clipped gradients in a second one,
of ``sum_i c_i * loss_i``. The hooks of the first pass already hold everything that sum needs:
a linear layer's clipped weight gradient is ``sum_i c_i * B_i^T A_i`` (its output gradients
``B_i`` and inputs ``A_i``), and any other layer's is ``sum_i c_i * G_i`` from the per-sample
gradients ``G_i`` the hook computed for its norm. :class:`BookkeepingModule` keeps those
parts and :meth:`~BookkeepingModule.clipped_gradients` combines them once the coefficients
``c_i = min(1, C / norm_i)`` are known, so the second backward pass is not run. The result
is the same sum (to float rounding; ``tests/test_privacy_sample_level.py`` checks it against
an explicit per-sample computation), at the cost of one backward pass and the per-sample work.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn as nn
from opacus.grad_sample import GradSampleModuleFastGradientClipping
from opacus.grad_sample.functorch import ft_compute_per_sample_gradient
from opacus.utils.module_utils import trainable_parameters


class BookkeepingModule(GradSampleModuleFastGradientClipping):
    """Opacus's ghost-clipping module whose backward hooks also keep, per parameter, what
    its clipped gradient sum is made of (see the module docstring)."""

    def __init__(self, m: nn.Module, **kwargs: Any):
        super().__init__(m, **kwargs)
        #: parameter -> ("linear", inputs, output gradients) or ("samples", per-sample grads)
        self.parts: dict[nn.Parameter, tuple] = {}

    def capture_backprops_hook(
        self,
        module: nn.Module,
        _forward_input: torch.Tensor,
        forward_output: torch.Tensor,
        loss_reduction: str,
        batch_first: bool,
    ) -> None:
        if not self.hooks_enabled:
            return
        backprops = forward_output[0].detach()
        activations, backprops = self.rearrange_grad_samples(
            module=module,
            backprops=backprops,
            loss_reduction=loss_reduction,
            batch_first=batch_first,
        )  # backprops: each sample's loss gradient (a mean loss is scaled by the batch size)
        if type(module) is nn.Linear:
            norms = self.NORM_SAMPLERS[nn.Linear](module, activations, backprops)
            inputs = activations[0].to(backprops.dtype)
            for p, norm in norms.items():
                self._keep(p, norm, ("linear", inputs, backprops, p is module.bias))
        else:
            sampler = self.GRAD_SAMPLERS.get(type(module), ft_compute_per_sample_gradient)
            for p, samples in sampler(module, activations, backprops).items():
                if p.requires_grad:
                    norm = samples.reshape(len(samples), -1).norm(2, dim=-1)
                    self._keep(p, norm, ("samples", samples))
        for _, p in trainable_parameters(module):
            p._forward_counter -= 1
        if len(module.activations) == 0 and hasattr(module, "max_batch_len"):
            del module.max_batch_len

    def _keep(self, p: nn.Parameter, norm: torch.Tensor, part: tuple) -> None:
        if p in self.parts:
            raise NotImplementedError(
                "a parameter used twice in one forward pass (tied weights, a layer called "
                "twice): ghost clipping cannot split its gradient per sample"
            )
        p._norm_sample = norm
        self.parts[p] = part

    def clipped_gradients(self, coefficients: torch.Tensor) -> dict[nn.Parameter, torch.Tensor]:
        """``sum_i c_i * g_i`` for every parameter the last backward pass reached; the parts
        are dropped."""
        out = {}
        for p, part in self.parts.items():
            c = coefficients.to(p.device, p.dtype)
            if part[0] == "linear":
                _, inputs, backprops, is_bias = part
                if is_bias:
                    out[p] = torch.einsum("n...i,n->i", backprops, c)
                else:
                    out[p] = torch.einsum("n...i,n...j,n->ij", backprops, inputs, c)
            else:
                out[p] = torch.tensordot(c, part[1], dims=1)
        self.parts = {}
        return out
