"""Sample-level DP: DP-SGD on each client through Opacus (Abadi et al. 2016).

Per local step a Poisson sample of the client's training set (each sample with probability
``q = batch_size / n``; ``round(n / batch_size)`` steps an epoch, as Opacus's DPDataLoader) is
drawn from the client's round generator; Opacus's ``GradSampleModule`` computes per-sample
gradients, its ``DPOptimizer`` clips each to norm ``dp.clip``, adds Gaussian noise of std
``sigma * clip`` (drawn from a generator seeded from the run) and steps the client's own
optimiser (SGD, Adam: any). The client keeps its own accountant (:mod:`.accounting`, Poisson
sampled Gaussian over all its steps) and reports its epsilon.

Batch norm mixes the samples of a batch, so per-sample gradients do not exist for it:
``dp.batchnorm=replace`` replaces it by group norm on every party (Opacus's
``ModuleValidator.fix``), ``refuse`` stops the run naming the modules; other modules Opacus
cannot handle are refused the same way.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterator
from typing import Any

import torch

from fedkit_core.config import Config
from fedkit_core.contract.context import ClientContext, derive_seed
from fedkit_core.contract.data import Batch
from fedkit_core.devices import gather, input_layout
from fedkit_core.errors import FedkitError
from fedkit_core.models.fedmodel import FedModel
from fedkit_core.privacy import accounting
from fedkit_core.privacy.options import SAMPLE

# Opacus's hooks on a first layer whose input needs no gradient: harmless, said every step
warnings.filterwarnings("ignore", message="Full backward hook is firing when gradients")


def prepare_model(model: FedModel, config: Config) -> FedModel:
    """``model`` made fit for DP-SGD (``dp.level=sample``): batch norm replaced by group
    norm (``dp.batchnorm=replace``) or refused, and any other module Opacus cannot give
    per-sample gradients refused, naming them. Other levels: ``model`` unchanged."""
    if config["dp.level"] != SAMPLE:
        return model
    from opacus.validators import ModuleValidator

    errors = ModuleValidator.validate(model, strict=False)
    if errors and config["dp.batchnorm"] == "replace":
        model = ModuleValidator.fix(model)
        errors = ModuleValidator.validate(model, strict=False)
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


class DPSGD:
    """One round of DP-SGD on a client: Poisson batches, per-sample clipping and noise.

    Use ``with DPSGD(client, optimizer) as dp:`` and train on ``dp.batches()`` with
    ``dp.optimizer``; the hooks are removed from the model afterwards.
    """

    def __init__(self, client: ClientContext, optimizer: torch.optim.Optimizer):
        from opacus import GradSampleModule
        from opacus.optimizers import DPOptimizer

        self.client = client
        config = client.config
        n = len(client.data["train"])
        self.accountant = ClientAccountant(config, n, client.states.setdefault("dp", {}))
        self.accountant.check_budget(client.id)
        self.module = GradSampleModule(client.model, loss_reduction="mean", strict=False)
        generator = torch.Generator(device=client.device)
        generator.manual_seed(derive_seed(config["seed"], "dp-sgd", client.round, client.id))
        self.optimizer = DPOptimizer(
            optimizer,
            noise_multiplier=self.accountant.sigma,
            max_grad_norm=config["dp.clip"],
            expected_batch_size=max(1, round(n * self.accountant.rate)),
            loss_reduction="mean",
            generator=generator,
        )

    def __enter__(self) -> DPSGD:
        return self

    def __exit__(self, *exc: object) -> None:
        self.module.to_standard_module()  # the hooks and per-sample gradients go
        for p in self.client.model.parameters():
            for attr in ("grad_sample", "summed_grad"):
                if hasattr(p, attr):
                    delattr(p, attr)

    def batches(self) -> Iterator[Batch | None]:
        """Poisson-sampled batches of the training split, one per local step (``None``: an
        empty sample, whose step adds noise only)."""
        ctx = self.client
        data = ctx.data["train"]
        n, rate = len(data), self.accountant.rate
        for _ in range(self.accountant.steps):
            index = torch.nonzero(torch.rand(n, generator=ctx.rng) < rate).flatten()
            if len(index) == 0:
                yield None
                continue
            x = ctx.data.normalizer(gather(data.images, index.to(data.images.device), ctx.device))
            y = gather(data.targets, index.to(data.targets.device), ctx.device).long()
            if ctx.data.augment is not None:
                x, y = ctx.data.augment(x, y, ctx.rng)
            yield Batch(input_layout(x, ctx.config["channels_last"]), y, index)

    def empty_step(self) -> None:
        """The step of an empty sample: zero per-sample gradients, noise only."""
        for p in self.optimizer.params:
            p.grad_sample = torch.zeros((0, *p.shape), device=p.device, dtype=p.dtype)
        self.optimizer.step()

    def report(self) -> dict[str, Any]:
        """After the round: the client's epsilon so far, its noise multiplier and whether
        its budget pays for no further round."""
        self.accountant.spend()
        eps = self.accountant.epsilon()
        return {
            "dp.epsilon": eps if math.isfinite(eps) else 1e300,
            "dp.noise_multiplier": self.accountant.sigma,
            "dp.last": self.accountant.last(),
        }
