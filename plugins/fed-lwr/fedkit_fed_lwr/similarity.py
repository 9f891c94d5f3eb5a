"""Per-layer similarity between a client's local model and the anchor, on the client's data.

Forward hooks on the layers turn each output into what the measure needs *inside the hook*
(a Gram matrix per block of samples for CKA), so no activation is kept beyond its layer and
later in-place operations (``ReLU(inplace=True)``) cannot alter what was measured. The
anchor is the same module run with the anchor's weights (``torch.func.functional_call``),
so no model is copied. Both passes run in eval mode under ``torch.inference_mode``: one
forward pass each per batch, no backward pass, and the HSIC algebra of all layers and
blocks of a batch is one batched computation (no loop over samples or layers).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping, Sequence
from contextlib import contextmanager

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call

from fedkit_fed_lwr.cka import MIN_BLOCK, block_grams, cka_from_terms, hsic_terms

MEASURES = ("cka", "cosine")
LOCAL, ANCHOR = 0, 1


class Meter(ABC):
    """Collects each layer's output per pass (``side``: LOCAL or ANCHOR) and, after both
    passes over a batch, folds them into running sums (``step``)."""

    def __init__(self) -> None:
        self.side = LOCAL
        self.outputs: tuple[dict[str, list[torch.Tensor]], dict[str, list[torch.Tensor]]] = (
            {},
            {},
        )
        self.sums: dict[str, torch.Tensor] = {}

    def observe(self, name: str, output: torch.Tensor) -> None:
        parts = self.prepare(output)
        seen = self.outputs[self.side].get(name)
        # a module called more than once per forward: its outputs are concatenated features
        self.outputs[self.side][name] = parts if seen is None else self.combine(seen, parts)

    def step(self) -> None:
        local, anchor = self.outputs
        names = list(local)
        if names:
            totals = self.fold(names, local, anchor)
            for i, name in enumerate(names):
                self.sums[name] = totals[i] + self.sums[name] if name in self.sums else totals[i]
        local.clear()
        anchor.clear()

    @abstractmethod
    def prepare(self, output: torch.Tensor) -> list[torch.Tensor]:
        """What is kept of one layer output (computed at once, inside the hook)."""

    @abstractmethod
    def combine(self, seen: list[torch.Tensor], parts: list[torch.Tensor]) -> list[torch.Tensor]:
        """Merge two outputs of one module in one forward pass."""

    @abstractmethod
    def fold(self, names: list[str], local: dict, anchor: dict) -> torch.Tensor:
        """The batch's contribution to each layer's running sums: (layers, ...)."""

    @abstractmethod
    def result(self) -> dict[str, float]:
        """The similarity of each layer."""


class CKAMeter(Meter):
    """Sums the three HSIC terms of every layer over blocks of ``block`` samples."""

    def __init__(self, block: int, estimator: str):
        super().__init__()
        self.block, self.estimator = block, estimator

    def prepare(self, output: torch.Tensor) -> list[torch.Tensor]:
        return block_grams(output, self.block)

    def combine(self, seen: list[torch.Tensor], parts: list[torch.Tensor]) -> list[torch.Tensor]:
        return [a + b for a, b in zip(seen, parts)]  # Gram of concatenated features

    def fold(self, names: list[str], local: dict, anchor: dict) -> torch.Tensor:
        total = torch.zeros(3, len(names), dtype=torch.float64)
        for group in range(len(local[names[0]])):  # full blocks, then a smaller remainder
            gk = torch.stack([local[n][group] for n in names])  # (layers, blocks, n, n)
            gl = torch.stack([anchor[n][group] for n in names])
            total = total + hsic_terms(gk, gl, self.estimator).cpu()  # (3, layers)
        return total.T

    def result(self) -> dict[str, float]:
        out = {name: cka_from_terms(terms) for name, terms in self.sums.items()}
        return {name: value for name, value in out.items() if value is not None}


class CosineMeter(Meter):
    """Mean over samples of the cosine similarity of flattened features (ablation v1)."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def prepare(self, output: torch.Tensor) -> list[torch.Tensor]:
        return [output.reshape(len(output), -1).float().clone()]

    def combine(self, seen: list[torch.Tensor], parts: list[torch.Tensor]) -> list[torch.Tensor]:
        return [torch.cat([seen[0], parts[0]], 1)]

    def fold(self, names: list[str], local: dict, anchor: dict) -> torch.Tensor:
        self.count += len(local[names[0]][0])
        return torch.stack(
            [F.cosine_similarity(local[n][0], anchor[n][0], dim=1).double().sum() for n in names]
        )

    def result(self) -> dict[str, float]:
        return {name: float(total) / self.count for name, total in self.sums.items()}


@contextmanager
def hooked(model: nn.Module, layers: Sequence[str], meter: Meter):
    """Send every tensor output of the named layers to ``meter``."""
    modules = dict(model.named_modules())

    def make(name: str):
        def hook(_module, _inputs, output):
            if isinstance(output, torch.Tensor):
                meter.observe(name, output.as_subclass(torch.Tensor))

        return hook

    handles = [modules[name].register_forward_hook(make(name)) for name in layers]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


def layer_similarity(
    model: nn.Module,
    anchor: Mapping[str, torch.Tensor],
    inputs: Iterable[torch.Tensor],
    layers: Sequence[str],
    *,
    measure: str = "cka",
    block: int = 8,
    estimator: str = "unbiased",
) -> tuple[dict[str, float], int]:
    """Similarity of each layer between ``model`` as it is (the local model) and ``model``
    with the ``anchor`` state entries loaded, over the ``inputs`` batches.

    Returns ``({layer: similarity}, samples used)``. CKA splits each batch into blocks of
    ``block`` samples (one Gram each) and skips a remainder under ``MIN_BLOCK`` (4)
    samples; a layer whose CKA is undefined (features that do not vary) is left out.
    ``model`` is left unchanged, in its original train/eval mode.
    """
    if measure not in MEASURES:
        raise ValueError(f"measure must be one of {MEASURES}, got {measure!r}")
    meter = CKAMeter(block, estimator) if measure == "cka" else CosineMeter()
    device = next(model.parameters()).device
    anchor = {key: value.to(device) for key, value in anchor.items()}
    was_training = model.training
    model.eval()
    used = 0
    try:
        with torch.inference_mode(), hooked(model, layers, meter):
            for x in inputs:
                meter.side = LOCAL
                model(x)
                meter.side = ANCHOR
                functional_call(model, anchor, (x,))
                meter.step()
                used += len(x) if measure == "cosine" else _blocked(len(x), block)
    finally:
        model.train(was_training)
    return meter.result(), used


def _blocked(n: int, block: int) -> int:
    """How many of ``n`` samples fall in a block CKA uses."""
    rest = n % block
    return n - rest + (rest if rest >= MIN_BLOCK else 0)
