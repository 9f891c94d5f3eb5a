"""FedModel: the one model shape every plugin works with.

``backbone`` maps images to features, ``head`` maps features to the task's logits, and
``extras`` are named modules plugins add (a personalised head, a projector, a private large
model). The forward pass returns a dict: ``"features"``, ``"logits"`` and one entry per extra.

State entries under a *private* prefix never leave the client: they are excluded from
:meth:`shared_state` (what is uploaded, aggregated and checkpointed globally) and kept in
the client's own state across rounds. Modules under a *frozen* prefix (:meth:`freeze`, the
``freeze`` config key) are not trained and stay in eval mode.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm

from fedkit_core.errors import FedkitError

INPUTS = ("features", "image", "none")


class FedModel(nn.Module):
    """Backbone -> features -> head, plus plugin extras; splits state into shared and private."""

    def __init__(self, backbone: nn.Module, head: nn.Module, feature_dim: int | None):
        super().__init__()
        self.backbone = backbone
        self.head = head
        self.feature_dim = feature_dim
        self.extras = nn.ModuleDict()
        self._extra_inputs: dict[str, str] = {}
        self._eval_only: set[str] = set()
        self._private: list[str] = []
        self._frozen: list[str] = []

    def add_extra(
        self,
        name: str,
        module: nn.Module,
        *,
        private: bool = False,
        input: str = "features",
        eval_only: bool = False,
    ) -> None:
        """Attach ``module`` as ``extras[name]``.

        ``input`` says what the forward pass feeds it: ``"features"`` (the backbone's output),
        ``"image"`` (the raw batch, e.g. a separate private model) or ``"none"`` (not called
        in forward; the plugin calls it itself). ``private=True`` keeps its state on the client.
        ``eval_only=True`` calls it only when the model is in eval mode (a model fine-tuned
        for evaluation costs nothing during local training, whose outputs lack it).
        """
        if input not in INPUTS:
            raise ValueError(f"input must be one of {INPUTS}, got {input!r}")
        if name in self.extras:
            raise FedkitError(f"two plugins add a model extra named {name!r}")
        self.extras[name] = module
        self._extra_inputs[name] = input
        if eval_only:
            self._eval_only.add(name)
        if private:
            self.mark_private(f"extras.{name}")

    def extra_takes_images(self) -> bool:
        """Whether an extra takes the raw batch (``input="image"``) rather than features."""
        return "image" in self._extra_inputs.values()

    def mark_private(self, prefix: str) -> None:
        """Keep every state entry whose name starts with ``prefix`` on the client."""
        if prefix not in self._private:
            self._private.append(prefix)

    def is_private(self, key: str) -> bool:
        return _under(key, self._private)

    def freeze(self, prefixes: list[str] | tuple[str, ...]) -> None:
        """Stop training every module whose name starts with one of ``prefixes`` (e.g.
        ``backbone.net.blocks.0``): its parameters get ``requires_grad=False`` and it stays
        in eval mode, so its batch norms use and keep their (pretrained) running statistics
        and its dropout is off. Frozen entries stay identical on every client (each starts
        from the same global model and none changes them), so aggregating them returns them
        unchanged. A prefix that names no parameter is an error listing the model's parts.
        """
        names = [n for n, _ in self.named_parameters()]
        for prefix in prefixes:
            if not any(_under(n, [prefix]) for n in names):
                parts = sorted({n.rsplit(".", 2)[0] for n in names})
                raise FedkitError(
                    f"freeze: {prefix!r} names no parameter of the model; its parts include "
                    f"{', '.join(parts[:12])}{' ...' if len(parts) > 12 else ''}"
                )
            if prefix not in self._frozen:
                self._frozen.append(prefix)
        for name, param in self.named_parameters():
            if _under(name, self._frozen):
                param.requires_grad_(False)
        self.train(self.training)

    @property
    def frozen(self) -> tuple[str, ...]:
        """The frozen prefixes (:meth:`freeze`)."""
        return tuple(self._frozen)

    def is_frozen(self, key: str) -> bool:
        """Whether the module or state entry ``key`` lies under a frozen prefix."""
        return _under(key, self._frozen)

    def train(self, mode: bool = True) -> FedModel:
        """Set the training mode; frozen modules stay in eval mode."""
        super().train(mode)
        frozen = getattr(self, "_frozen", [])
        if mode and frozen:
            for name, module in self.named_modules():
                if _under(name, frozen):
                    module.train(False)
        return self

    def batch_norm_layers(self, extras: bool = True) -> list[str]:
        """Names of the model's batch-norm layers (``backbone.bn1``...), with those inside
        plugin extras unless ``extras=False`` (the model proper: backbone and head)."""
        return [
            name
            for name, module in self.named_modules()
            if isinstance(module, _BatchNorm) and (extras or not name.startswith("extras."))
        ]

    def keep_batch_norm_local(self) -> list[str]:
        """Mark every batch-norm layer private (weights, biases and running statistics stay
        on each client: FedBN, ``bn=local``); the names marked."""
        names = self.batch_norm_layers()
        for name in names:
            self.mark_private(name)
        return names

    def batch_norm_policy(self) -> str:
        """How the batch-norm layers of the model proper travel: ``average`` (shared:
        aggregated with the weights), ``local`` (private on every client), ``mixed`` (some
        of each) or ``none`` (the model has none)."""
        layers = self.batch_norm_layers(extras=False)
        if not layers:
            return "none"
        private = [self.is_private(f"{name}.entry") for name in layers]  # any entry of it
        return "local" if all(private) else "mixed" if any(private) else "average"

    def forward(self, x: torch.Tensor) -> dict[str, Any]:
        features = self.backbone(x)
        out: dict[str, Any] = {"features": features, "logits": self.head(features)}
        for name, module in self.extras.items():
            if self.training and name in self._eval_only:
                continue
            source = self._extra_inputs[name]
            if source == "features":
                out[name] = module(features)
            elif source == "image":
                out[name] = module(x)
        return out

    def shared_state(self) -> dict[str, torch.Tensor]:
        """Every state entry that is uploaded and aggregated (detached copies, on CPU).

        Copies, never views: an upload must not change when the client trains on. They are
        contiguous whatever the model's layout (``channels_last``).
        """
        return {k: _host_copy(v) for k, v in self.state_dict().items() if not self.is_private(k)}

    def private_state(self) -> dict[str, torch.Tensor]:
        """The entries that stay on the client (detached contiguous copies, on CPU)."""
        return {k: _host_copy(v) for k, v in self.state_dict().items() if self.is_private(k)}

    def load_shared(self, arrays: Mapping[str, torch.Tensor]) -> None:
        """Load received global arrays into the shared entries; private ones are kept."""
        self._load(arrays, self._keys(private=False), "global model")

    def load_private(self, arrays: Mapping[str, torch.Tensor]) -> None:
        self._load(arrays, self._keys(private=True), "client's private state")

    def _keys(self, *, private: bool) -> list[str]:
        return [k for k in self.state_dict() if self.is_private(k) == private]

    def _load(self, arrays: Mapping[str, torch.Tensor], expected, what: str) -> None:
        expected = set(expected)
        missing, extra = expected - set(arrays), set(arrays) - expected
        if missing or extra:
            raise FedkitError(
                f"the {what} does not match this model: missing {sorted(missing)[:5]}, "
                f"unexpected {sorted(extra)[:5]} (do all parties run the same plugins and model?)"
            )
        state = self.state_dict()
        with torch.no_grad():
            for key, value in arrays.items():
                if state[key].shape != value.shape:
                    raise FedkitError(
                        f"the {what} has {key} of shape {tuple(value.shape)}, "
                        f"this model {tuple(state[key].shape)}"
                    )
                state[key].copy_(value)


def _under(key: str, prefixes: list[str]) -> bool:
    """Whether the dotted name ``key`` is one of ``prefixes`` or lies under one."""
    return any(key == p or key.startswith(p + ".") for p in prefixes)


def _host_copy(tensor: torch.Tensor) -> torch.Tensor:
    """A detached contiguous copy of ``tensor`` on the CPU."""
    return tensor.detach().to("cpu", memory_format=torch.contiguous_format, copy=True)
