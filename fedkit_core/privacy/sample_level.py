"""Sample-level DP: DP-SGD on each client through Opacus (Abadi et al. 2016).

Per local step a Poisson sample of the client's training set (each sample with probability
``q = batch_size / n``; ``round(n / batch_size)`` steps an epoch, as Opacus's DPDataLoader) is
drawn from a secret generator (:mod:`.noise`); each sample's gradient is clipped to norm
``dp.clip``, Gaussian noise of std ``sigma * clip`` (from another secret generator) is added to
their sum, which is divided by the expected batch size and steps the client's own optimiser
(SGD, Adam: any). The client keeps its own accountant (:mod:`.accounting`, Poisson sampled
Gaussian over all its steps) and reports its epsilon.

Two ways to clip, the same mechanism (``dp.grad_sample``, see :class:`PerSampleClipping`):

* ``ghost``: ghost clipping (Li et al. 2022) on Opacus's ghost-clipping hooks, in one
  backward pass (Bu et al. 2023's book-keeping, :mod:`.bookkeeping`): the backward pass of the
  batch's mean loss gives each sample's gradient norm layer by layer without storing
  per-sample gradients of linear layers (their norms come from the norms of their inputs and
  output gradients; other layers' per-sample gradients are computed for that layer alone);
  the clipped sum ``sum_i c_i * g_i``, ``c_i = min(1, C / norm_i)``, is then assembled from
  what the hooks kept, where Opacus's own ghost clipping runs a second backward pass. It
  needs each sample's loss: fedkit has it for its built-in task losses
  (:func:`~fedkit_core.builtins.losses.task_loss_per_sample`), so ghost applies when no
  plugin replaces the task loss or adds loss terms other than parameter terms (below).
* ``hooks``: Opacus's ``GradSampleModule`` stores every sample's gradient of every parameter
  and its ``DPOptimizer`` clips them; works with any loss, costs more (memory and time).

``auto`` (the default) takes ghost where it applies, else hooks with a note.

Per-sample gradients come from what flows through the model's layers; a loss term on the
parameters themselves (FedProx's proximal term) reaches ``.grad`` but not them, and DP-SGD's
step would drop it. Under hooks, :meth:`DPSGD.check_captured` compares the two on some steps
(``.grad`` equals the per-sample gradients' mean for any loss of the outputs) and stops the
run naming the plugins when they differ.

Unless the plugin declares the term a *parameter term*
(:data:`~fedkit_core.hooks.hookspecs.PARAMETER_TERMS`): a function of the parameters and
of values fixed before local training alone, of no sample. Such terms are summed apart; their
gradient (``torch.autograd.grad``, leaving the per-sample gradients alone) is added to the
privatised gradient of the other terms after Opacus's clipping, noise and scaling and before
the wrapped optimiser's step (Opacus's step hook). That is post-processing of the noisy
gradient with data-independent values: the guarantee and the accountant's epsilon are those
of the data terms alone. :meth:`DPSGD.check_apart` refuses a declared term whose autograd
graph reaches the model's outputs or passes through its layers (both hooked here). The step
of an empty Poisson sample adds no parameter term: computing it needs the plugins' loss
hook, which takes a batch (such a step comes with probability about ``exp(-batch_size)``).

Batch norm mixes the samples of a batch, so per-sample gradients do not exist for it:
``dp.batchnorm=replace`` replaces it by group norm on every party (Opacus's
``ModuleValidator.fix``), ``refuse`` stops the run naming the modules; other modules Opacus
cannot handle are refused the same way.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch

from fedkit_core.config import Config
from fedkit_core.contract.channels import SAMPLE, dp_level
from fedkit_core.contract.data import Batch
from fedkit_core.devices import gather, input_layout
from fedkit_core.errors import FedkitError
from fedkit_core.hooks.context import ClientContext, take_views
from fedkit_core.hooks.hookspecs import PARAMETER_TERMS
from fedkit_core.models.fedmodel import FedModel
from fedkit_core.privacy import accounting, noise
from fedkit_core.privacy.options import AUTO, GHOST, HOOKS

#: the largest relative gap between ``.grad`` and the mean of the per-sample gradients that
#: float rounding explains (bf16 forward passes round the activations the hooks keep)
BYPASS_RTOL = {"fp32": 1e-4, "bf16": 1e-1}
#: with plugin loss terms, the first steps of a client's round checked for a bypass, then one
#: step in CHECK_EVERY (the check costs about 5% of a step of stored per-sample gradients)
CHECKED_FIRST, CHECK_EVERY = 3, 16
#: the autograd node of a module output under Opacus's (full) backward hooks: a forward
#: pass through a trainable layer of the model
HOOKED_LAYER = "BackwardHookFunctionBackward"

# Opacus's hooks on a first layer whose input needs no gradient: harmless, said every step
warnings.filterwarnings("ignore", message="Full backward hook is firing when gradients")


def prepare_model(model: FedModel, config: Config) -> FedModel:
    """``model`` made fit for DP-SGD (``dp.level=sample``): batch norm replaced by group
    norm (``dp.batchnorm=replace``) or refused, and any other module Opacus cannot give
    per-sample gradients refused, naming them. Other levels: ``model`` unchanged."""
    if dp_level(config) != SAMPLE:
        return model
    from opacus.validators import ModuleValidator

    errors = ModuleValidator.validate(model, strict=False)
    if errors and config["dp.batchnorm"] == "replace":
        model = ModuleValidator.fix(model)
        errors = ModuleValidator.validate(model, strict=False)
    layers = unsupported_layers(model)
    if layers:
        more = f" and {len(layers) - 4} more" if len(layers) > 4 else ""
        errors.append(
            f"{len(layers)} layer(s) hold trainable parameters of their own beside buffers, "
            f"for which Opacus has no per-sample rule: {', '.join(layers[:4])}{more}"
        )
    if errors:
        listed = "; ".join(str(e) for e in errors[:4])
        hint = (
            " (set dp.batchnorm=replace to use group norm instead)"
            if config["dp.batchnorm"] == "refuse"
            else ""
        )
        raise FedkitError(
            f"dp.level=sample (DP-SGD) cannot clip per-sample gradients of this model: "
            f"{listed}{hint}"
        )
    return model


def unsupported_layers(model: torch.nn.Module) -> list[str]:
    """``'name' (type)`` of each layer Opacus cannot give per-sample gradients: a module of
    a type it has no rule for, holding trainable parameters of its own, falls back to
    functorch, which refuses one with buffers (e.g. a plugin's head with a fixed buffer
    beside a learnt scale). Found here, before training, rather than as a client's failure
    in round 1."""
    from opacus import GradSampleModule

    return [
        f"{name!r} ({type(layer).__name__})"
        for name, layer in model.named_modules()
        if type(layer) not in GradSampleModule.GRAD_SAMPLERS
        and any(p.requires_grad for p in layer.parameters(recurse=False))
        and next(layer.buffers(), None) is not None
    ]


def steps_per_round(n: int, config: Config) -> int:
    """Local DP-SGD steps of a client of ``n`` training samples in one round."""
    return config["local_epochs"] * max(1, round(n / config["batch_size"]))


def sample_rate(n: int, config: Config) -> float:
    return min(1.0, config["batch_size"] / max(n, 1))


class ClientAccountant:
    """One client's DP-SGD budget, kept in its state ``{"steps", "sigma"}`` (checkpointed)."""

    def __init__(self, config: Config, n: int, state: dict[str, Any]):
        self.config, self.n, self.state = config, n, state
        self.rate = sample_rate(n, config)
        self.steps = steps_per_round(n, config)
        self.delta = config["dp.delta"]
        self.kind = config["dp.accountant"]
        self.target = config["dp.target_epsilon"]
        if "sigma" not in state:
            state["steps"] = 0
            state["sigma"] = self._sigma()

    @property
    def sigma(self) -> float:
        return float(self.state["sigma"])

    def mechanism(self, sigma: float | None = None) -> accounting.Mechanism:
        return accounting.Mechanism(self.sigma if sigma is None else sigma, self.rate)

    def _sigma(self) -> float:
        """The noise multiplier: dp.noise_multiplier, or calibrated on this client so that
        training in every one of the planned rounds spends ``dp.target_epsilon``."""
        if self.target is None or self.config["dp.on_target"] != "calibrate":
            return float(self.config["dp.noise_multiplier"])
        total = self.steps * self.config["rounds"]
        return accounting.calibrate(
            lambda s: accounting.Mechanism(s, self.rate, steps=total),
            self.target,
            self.delta,
            1,
            self.kind,
        )

    def epsilon(self, steps: int | None = None) -> float:
        steps = self.state["steps"] if steps is None else steps
        return accounting.epsilon(self.mechanism(), steps, self.delta, self.kind)

    def check_budget(self, client: str) -> None:
        """Refuse a round the budget cannot pay for (``dp.on_target=stop``; the server stops
        the run after the last round a client's budget pays for, so this is the first)."""
        if self.target is None or self.config["dp.on_target"] != "stop":
            return
        after = self.epsilon(self.state["steps"] + self.steps)
        if after > self.target:
            raise FedkitError(
                f"dp.target_epsilon={self.target} does not pay for round "
                f"{self.state['steps'] // self.steps + 1} of DP-SGD on client {client!r} "
                f"(epsilon {after:.3g} at delta {self.delta} with noise multiplier "
                f"{self.sigma}, sample rate {self.rate:.3g}, {self.steps} steps a round); "
                "raise dp.noise_multiplier or the budget"
            )

    def spend(self) -> None:
        self.state["steps"] += self.steps

    def last(self) -> bool:
        """Whether the budget pays for no further round (``dp.target_epsilon`` with stop)."""
        if self.target is None or self.config["dp.on_target"] != "stop":
            return False
        return self.epsilon(self.state["steps"] + self.steps) > self.target


def loss_plugins(hook: Any) -> list[str]:
    """The active plugins that replace the built-in task loss or add loss terms (parameter
    terms or others)."""
    from fedkit_core.plugin_manager import BUILTINS

    impls = [*hook.fedkit_task_loss.get_hookimpls(), *hook.fedkit_loss_terms.get_hookimpls()]
    return sorted({impl.plugin_name for impl in impls if impl.plugin_name not in BUILTINS})


def parameter_terms(hook: Any) -> dict[str, str]:
    """``{term: plugin}``: the loss terms the active plugins declare parameter terms
    (:data:`~fedkit_core.hooks.hookspecs.PARAMETER_TERMS`)."""
    return {
        term: impl.plugin_name
        for impl in hook.fedkit_loss_terms.get_hookimpls()
        for term in getattr(impl.plugin, PARAMETER_TERMS, ())
    }


def split_plugins(hook: Any) -> list[str]:
    """The active plugins whose loss fedkit cannot split per sample: a task loss other than
    the built-in one, or loss terms without a parameter-term declaration (a declaring
    plugin's other terms are refused at its first step, :meth:`DPSGD.split`)."""
    declaring = set(parameter_terms(hook).values())
    replacing = {impl.plugin_name for impl in hook.fedkit_task_loss.get_hookimpls()}
    return [p for p in loss_plugins(hook) if p not in declaring or p in replacing]


def clipping_mode(config: Config, hook: Any) -> str:
    """``ghost`` or ``hooks``: ``dp.grad_sample`` resolved against the run's plugins (ghost
    needs each sample's loss; ``auto`` falls back to hooks with a note, ``ghost`` refuses)."""
    chosen = config["dp.grad_sample"]
    if chosen == HOOKS:
        return HOOKS
    owners = split_plugins(hook)
    if not owners:
        return GHOST
    why = (
        f"plugin{'s' if len(owners) > 1 else ''} {', '.join(map(repr, owners))} "
        "replace the task loss or add loss terms, which fedkit cannot split into each "
        "sample's loss"
    )
    if chosen == GHOST:
        raise FedkitError(
            f"dp.grad_sample=ghost (ghost clipping) needs each sample's loss, but {why}; "
            "use dp.grad_sample=hooks (per-sample gradients, any loss)"
        )
    assert chosen == AUTO
    warnings.warn(
        f"dp.grad_sample=auto: DP-SGD clips stored per-sample gradients (hooks), not ghost "
        f"clipping, since {why}",
        stacklevel=2,
    )
    return HOOKS


class PerSampleClipping:
    """Opacus's DP-SGD step around ``model`` and ``optimizer``: each sample's gradient
    clipped to norm ``clip``, Gaussian noise of std ``sigma * clip`` on their sum (from
    ``generator``), divided by ``expected_batch_size``; ``mode`` ghost or hooks (the module
    docstring). Train with :meth:`backward` (and :meth:`apart` for parameter terms) and
    ``self.optimizer.step()``; :meth:`close` removes the hooks."""

    def __init__(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        mode: str,
        clip: float,
        sigma: float,
        expected_batch_size: int,
        generator: torch.Generator,
    ):
        from opacus import GradSampleModule
        from opacus.optimizers import DPOptimizer, DPOptimizerFastGradientClipping

        from fedkit_core.privacy.bookkeeping import BookkeepingModule

        self.model, self.mode, self.clip = model, mode, clip
        if mode == GHOST:
            self.module = BookkeepingModule(
                model, loss_reduction="mean", strict=False, max_grad_norm=clip
            )
            wrapper = DPOptimizerFastGradientClipping
        else:
            self.module = GradSampleModule(model, loss_reduction="mean", strict=False)
            wrapper = DPOptimizer
        self.optimizer = wrapper(
            optimizer,
            noise_multiplier=sigma,
            max_grad_norm=clip,
            expected_batch_size=expected_batch_size,
            loss_reduction="mean",
            generator=generator,
        )
        #: the gradient of the step's parameter terms, added after the privatisation
        self.extra: dict[torch.nn.Parameter, torch.Tensor] = {}
        self.optimizer.attach_step_hook(self._add_extra)

    def apart(self, term: torch.Tensor | None) -> None:
        """Keep the gradient of ``term``, a loss of the parameters alone, for the next step:
        it is added to each parameter's privatised gradient (after clipping, noise and
        scaling), and reaches neither ``.grad`` nor the per-sample gradients before."""
        self.extra = {}
        if term is None or not term.requires_grad:
            return
        params = [p for p in self.optimizer.params if p.requires_grad]
        grads = torch.autograd.grad(term, params, allow_unused=True)
        self.extra = {p: g for p, g in zip(params, grads) if g is not None}

    def _add_extra(self, optimizer: Any) -> None:
        """Opacus's step hook: runs after its clipping, noise and scaling, before the step."""
        for p, grad in self.extra.items():
            p.grad.add_(grad.to(p.grad.dtype))
        self.extra = {}

    def backward(
        self, loss: torch.Tensor, per_sample: Callable[[], torch.Tensor] | None = None
    ) -> None:
        """Leave what the optimiser's step needs: per-sample gradients (hooks: ``loss``,
        the batch's mean loss, backward) or the sum of the clipped gradients in ``.grad``
        (ghost: one backward pass of the mean of ``per_sample()``, each sample's loss, shape
        (N,), whose hooks give the norms and the parts of that sum)."""
        if self.mode == HOOKS:
            loss.backward()
            return
        per_sample().mean().backward()
        clipped = self.module.clipped_gradients(self._coefficients())
        for p in self.optimizer.params:  # a parameter the batch did not reach: no gradient
            p.grad = clipped[p] if p in clipped else torch.zeros_like(p)

    def bypassed(self, rtol: float) -> dict[str, float]:
        """After a ``hooks`` :meth:`backward`: the parameters whose ordinary gradient
        (``.grad``, of the whole loss) differs from the mean of their per-sample gradients
        by more than ``rtol`` of the larger norm, with that relative gap. The two are equal,
        up to float rounding, for any loss computed from the model's forward pass (Opacus
        splits exactly what flows through its layers); a gap is the gradient of a term that
        reached the parameter another way (a term on the parameters themselves, FedProx's
        proximal term), which DP-SGD's step would drop."""
        gaps = {}
        for name, p in self.model.named_parameters():
            samples = getattr(p, "grad_sample", None)
            if p.grad is None or isinstance(samples, list):
                continue
            mean = samples.mean(0) if samples is not None else torch.zeros_like(p.grad)
            scale = torch.maximum(p.grad.norm(), mean.norm())
            gap = float((p.grad - mean).norm() / scale) if scale > 0 else 0.0
            if gap > rtol:
                gaps[name] = gap
        return gaps

    def _coefficients(self) -> torch.Tensor:
        """``min(1, C / (norm_i + 1e-6))`` per sample (as Opacus's optimisers clip), from the
        per-layer norms the first pass left; parameters the batch did not reach have none."""
        norms = []
        for p in self.module.trainable_parameters:
            norm = getattr(p, "_norm_sample", None)
            if norm is not None:
                norms.append(norm.to(norms[0].device if norms else norm.device))
                p._norm_sample = None
        total = torch.stack(norms).norm(2, dim=0)
        return (self.clip / (total + 1e-6)).clamp(max=1.0)

    def empty_step(self) -> None:
        """The step of an empty Poisson sample: no gradient, noise only."""
        self.extra = {}
        self.optimizer.zero_grad(set_to_none=True)  # the last step's sum is marked processed
        for p in self.optimizer.params:
            if self.mode == GHOST:
                p.grad = torch.zeros_like(p)
            else:
                p.grad_sample = torch.zeros((0, *p.shape), device=p.device, dtype=p.dtype)
        self.optimizer.step()

    def close(self) -> None:
        """Remove the hooks and Opacus's attributes from the model's parameters."""
        self.module.to_standard_module()
        for p in self.model.parameters():
            for attr in ("grad_sample", "summed_grad", "_norm_sample"):
                if hasattr(p, attr):
                    delattr(p, attr)


class DPSGD:
    """One round of DP-SGD on a client: Poisson batches, per-sample clipping and noise.

    Use ``with DPSGD(client, optimizer) as dp:`` and train on ``dp.batches()`` with
    ``dp.optimizer``, calling ``dp.backward`` for the loss; the hooks are removed from the
    model afterwards.
    """

    def __init__(self, client: ClientContext, optimizer: torch.optim.Optimizer):
        self.client = client
        config = client.config
        n = len(client.data["train"])
        self.accountant = ClientAccountant(config, n, client.states.setdefault("dp", {}))
        self.accountant.check_budget(client.id)
        self.mode = clipping_mode(config, client.hook)
        # the noise and the Poisson batches come from the secret stream (.noise): the
        # accountant's amplification by sampling assumes nobody knows which samples a step
        # used, and noise regenerated from a recorded seed could be subtracted
        generator = noise.torch_generator(
            config, "dp-sgd", client.round, client.id, device=client.device
        )
        self.sampler = noise.torch_generator(config, "dp-sgd-batches", client.round, client.id)
        self.clipping = PerSampleClipping(
            client.model,
            optimizer,
            self.mode,
            clip=config["dp.clip"],
            sigma=self.accountant.sigma,
            expected_batch_size=max(1, round(n * self.accountant.rate)),
            generator=generator,
        )
        self.optimizer = self.clipping.optimizer
        # hooks: steps checked for loss terms that bypass the per-sample gradients
        # (:meth:`check_captured`): with plugin loss terms the first CHECKED_FIRST of the
        # round (a proximal term's gradient is zero on the first) and every CHECK_EVERY-th;
        # without, the first
        self.watched = loss_plugins(client.hook) if self.mode == HOOKS else []
        #: ``{term: plugin}`` of the declared parameter terms, and those a step lacked
        self.declared = parameter_terms(client.hook)
        self.missing: list[str] = []
        self.step = 0

    def __enter__(self) -> DPSGD:
        return self

    def __exit__(self, *exc: object) -> None:
        self.clipping.close()

    def backward(self, terms: Mapping[str, torch.Tensor], batch: Batch, outputs: Any) -> None:
        """Backward for one step of the named loss ``terms`` (``task`` and the plugins'):
        the declared parameter terms' gradient kept apart for the step (:meth:`split`,
        :meth:`check_apart`); the other terms' sum backward under hooks, each sample's
        built-in task loss under ghost (the only other term then)."""
        from fedkit_core.builtins.losses import task_loss_per_sample

        data, apart = self.split(terms)
        extra = None
        if apart:
            extra = _total(apart)
            self.check_apart(extra, outputs)
        self.clipping.apart(extra)
        self.clipping.backward(
            _total(data), lambda: task_loss_per_sample(self.client, batch, outputs)
        )
        if self.mode == HOOKS and self._checks(self.step):
            self.check_captured()
        self.step += 1

    def split(
        self, terms: Mapping[str, torch.Tensor]
    ) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
        """``terms`` as (the data terms, the declared parameter terms); under ghost, a term
        of neither the task nor a declaration is refused (ghost clips the task loss)."""
        data = {n: t for n, t in terms.items() if n not in self.declared}
        apart = {n: t for n, t in terms.items() if n in self.declared}
        self.missing = sorted(set(self.declared) - set(apart))
        others = sorted(set(data) - {"task"})
        if self.mode == GHOST and others:
            owners = sorted(set(self.declared.values()))
            raise FedkitError(
                f"dp.grad_sample=ghost clips each sample's task loss, but the loss terms "
                f"{', '.join(map(repr, others))} of plugin{'s' if len(owners) > 1 else ''} "
                f"{', '.join(map(repr, owners))} are not declared parameter terms "
                f"({PARAMETER_TERMS}), which fedkit cannot split into each sample's loss; use "
                "dp.grad_sample=hooks (per-sample gradients, any loss)"
            )
        return data, apart

    def check_apart(self, term: torch.Tensor, outputs: Any) -> None:
        """Refuse declared parameter terms whose autograd graph reaches the model's outputs
        or passes through one of its trainable layers (whose outputs carry Opacus's
        backward hooks): they depend on the batch, and their gradient, added after the
        noise, would not be private."""
        reached = _reaches(term, outputs)
        if reached is None:
            return
        owners = sorted(set(self.declared.values()))
        raise FedkitError(
            f"dp.level=sample: the loss terms {', '.join(map(repr, sorted(self.declared)))} "
            f"that plugin{'s' if len(owners) > 1 else ''} {', '.join(map(repr, owners))} "
            f"declare{'' if len(owners) > 1 else 's'} parameter terms ({PARAMETER_TERMS}: "
            "functions of the parameters alone, added after DP-SGD's noise) are computed "
            f"from {reached}, so from the batch, and would leak it (client "
            f"{self.client.id!r}, round {self.client.round}); remove the declaration of a "
            "term that depends on the data"
        )

    def _checks(self, step: int) -> bool:
        if not self.watched:
            return step == 0
        return step < CHECKED_FIRST or step % CHECK_EVERY == 0

    def check_captured(self) -> None:
        """Refuse a loss whose gradient does not all reach the per-sample gradients (hooks):
        DP-SGD clips and noises those, so a loss term acting on the parameters directly
        (not through the model's outputs) would be left out of the step without a word."""
        rtol = BYPASS_RTOL[self.client.config["precision"]]
        gaps = self.clipping.bypassed(rtol)
        if not gaps:
            return
        name, gap = max(gaps.items(), key=lambda item: item[1])
        owners = (
            f"the loss of plugin{'s' if len(self.watched) > 1 else ''} "
            f"{', '.join(map(repr, self.watched))}"
            if self.watched
            else "the loss"
        )
        raise FedkitError(
            f"dp.level=sample cannot privatise {owners}: part of its gradient reaches the "
            "model's parameters other than through its layers (a loss term on the parameters "
            "themselves, such as Ditto's proximal term or FedDyn's linear term, "
            "or parameters combined outside a layer, as APFL's mixture), so Opacus's "
            "per-sample gradients do not contain it and DP-SGD would drop it silently "
            f"(client {self.client.id!r}, round {self.client.round}: "
            f"the gradient of {name!r} differs from the mean of its per-sample gradients by "
            f"{gap:.2g} of its norm, {len(gaps)} parameter{'s' if len(gaps) > 1 else ''} in "
            "all). Run this method without dp.level=sample (dp.level=client privatises any "
            "local training), or, for a term of the parameters alone, declare it in the "
            f"plugin's {PARAMETER_TERMS}"
            + (
                f" (declared there but not returned: {', '.join(map(repr, self.missing))})"
                if self.missing
                else ""
            )
        )

    def batches(self) -> Iterator[Batch | None]:
        """Poisson-sampled batches of the training split, one per local step (``None``: an
        empty sample, whose step adds noise only)."""
        ctx = self.client
        data = ctx.data["train"]
        n, rate = len(data), self.accountant.rate
        for _ in range(self.accountant.steps):
            index = torch.nonzero(torch.rand(n, generator=self.sampler) < rate).flatten()
            if len(index) == 0:
                yield None
                continue
            views = ctx.data.views.get("train")  # the frozen-trunk cache's, augmented
            if views is not None:
                x = ctx.data.normalizer(take_views(views, index, ctx.rng, ctx.device))
            else:
                x = ctx.data.normalizer(
                    gather(data.images, index.to(data.images.device), ctx.device)
                )
            y = gather(data.targets, index.to(data.targets.device), ctx.device).long()
            if ctx.data.augment is not None:  # not the client's stored stream: its draws
                x, y = ctx.data.augment(x, y, self.sampler)  # would count the empty samples
            yield Batch(input_layout(x, ctx.config["channels_last"]), y, index)

    def empty_step(self) -> None:
        """The step of an empty sample: no gradient, noise only."""
        self.clipping.empty_step()

    def report(self) -> dict[str, Any]:
        """After the round: the client's epsilon so far, its noise multiplier, whether its
        budget pays for no further round and whether it clipped by ghost clipping."""
        self.accountant.spend()
        eps = self.accountant.epsilon()
        return {
            "dp.epsilon": eps if math.isfinite(eps) else 1e300,
            "dp.noise_multiplier": self.accountant.sigma,
            "dp.last": self.accountant.last(),
            "dp.ghost": self.mode == GHOST,
        }


def _total(terms: Mapping[str, torch.Tensor]) -> torch.Tensor:
    values = [t.reshape(()) for t in terms.values()]
    return values[0] if len(values) == 1 else torch.stack(values).sum()


def _reaches(term: torch.Tensor, outputs: Any) -> str | None:
    """What of the batch's forward pass ``term``'s autograd graph reaches: ``"the model's
    outputs"``, ``"a layer of the model"`` (a module output under Opacus's hooks) or
    ``None``."""
    stops = {t.grad_fn for t in _tensors(outputs) if t.grad_fn is not None}
    seen: set[Any] = set()
    stack = [term.grad_fn]
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        if node in stops:
            return "the model's outputs"
        if type(node).__name__ == HOOKED_LAYER:
            return "a layer of the model"
        stack.extend(child for child, _ in node.next_functions)
    return None


def _tensors(value: Any) -> Iterator[torch.Tensor]:
    """The tensors in ``value`` (a tensor, or mappings and sequences of them)."""
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, Mapping):
        for item in value.values():
            yield from _tensors(item)
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _tensors(item)
