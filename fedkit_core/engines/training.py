"""A client's local training: its optimiser and the training loop of one round, with
DP-SGD wired in at ``dp.level=sample``.

The optimiser is built by the plugins' hooks (``fedkit_param_groups``, ``fedkit_optimizer``)
and kept between rounds with ``keep_optimizer_state`` (else built afresh every round): it is
the part of a client's state between rounds that :class:`LocalTraining` holds.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable
from typing import Any

import torch

from fedkit_core.contract.channels import SAMPLE, dp_level
from fedkit_core.contract.data import Batch
from fedkit_core.errors import FedkitError
from fedkit_core.hooks.context import ClientContext
from fedkit_core.privacy.sample_level import DPSGD

#: the passes of one round's training (each an iterable of batches), made when needed
Passes = Callable[[], Iterable[Iterable[Batch | None]]]


class LocalTraining:
    """One client's optimiser (kept between rounds or not) and its round of training."""

    def __init__(self, ctx: ClientContext):
        self.ctx = ctx
        self.optimizer: torch.optim.Optimizer | None = None

    def round(
        self, optimizer: torch.optim.Optimizer, round_: int, passes: Passes
    ) -> tuple[dict[str, Any], Callable[[], dict[str, Any]] | None]:
        """Train ``ctx.model`` with ``optimizer`` (:meth:`optimiser`, at the round's rate)
        over ``passes`` (DP-SGD: its own Poisson batches instead): the round's scalars
        (``num_examples``, the loss terms' means per step) and, under DP-SGD, what gives its
        report (epsilon spent: called once the reply is sent)."""
        ctx, model = self.ctx, self.ctx.model
        params = [p for p in model.parameters() if p.requires_grad]
        sums: dict[str, torch.Tensor] = defaultdict(lambda: torch.zeros((), device=ctx.device))
        model.train()
        # dp.level=sample: DP-SGD's Poisson batches (every epoch's) and clipping optimiser
        dpsgd = DPSGD(ctx, optimizer) if dp_level(ctx.config) == SAMPLE else None
        if dpsgd is not None:
            optimizer = dpsgd.optimizer
        batches = [dpsgd.batches()] if dpsgd is not None else passes()
        try:
            self._train(optimizer, params, sums, batches, round_, dpsgd)
        finally:
            if dpsgd is not None:
                dpsgd.__exit__()
        if not ctx.config["keep_optimizer_state"]:
            self.optimizer = None
        scalars: dict[str, Any] = {"num_examples": len(ctx.data["train"])}
        steps = int(sums.pop("steps", torch.zeros(())))
        scalars.update({k: float(v) / max(steps, 1) for k, v in sums.items()})
        return scalars, (dpsgd.report if dpsgd is not None else None)

    def _train(
        self,
        optimizer: torch.optim.Optimizer,
        params: list[torch.nn.Parameter],
        sums: dict[str, torch.Tensor],
        passes: Iterable[Iterable[Batch | None]],
        round_: int,
        dpsgd: DPSGD | None,
    ) -> None:
        """Local training over ``passes``, the loss terms summed per step into ``sums``
        (with the number of ``steps``)."""
        ctx, model, clip = self.ctx, self.ctx.model, self.ctx.config["grad_clip"]
        steps = 0
        for epoch, batches in enumerate(passes):
            for batch in batches:
                if batch is None:  # an empty Poisson sample: DP-SGD's step of noise alone
                    dpsgd.empty_step()
                    steps += 1
                    continue
                outputs = ctx.forward(model, batch.x)
                terms = {"task": ctx.task_loss(batch, outputs)}
                for extra in ctx.hook.fedkit_loss_terms(client=ctx, batch=batch, outputs=outputs):
                    terms.update(extra or {})
                values = [t.reshape(()) for t in terms.values()]
                loss = values[0] if len(values) == 1 else torch.stack(values).sum()
                optimizer.zero_grad(set_to_none=True)
                if dpsgd is not None:  # DP-SGD clips each sample's gradient (not grad_clip)
                    dpsgd.backward(terms, batch, outputs)
                else:
                    loss.backward()
                    if clip:
                        torch.nn.utils.clip_grad_norm_(params, clip)
                optimizer.step()
                steps += 1
                sums["loss"] += loss.detach()
                for name, term in terms.items():
                    sums[f"loss.{name}"] += term.detach()
            if not torch.isfinite(sums["loss"]):
                raise FedkitError(
                    f"client {ctx.id!r}: the training loss became {sums['loss'].item()} in round "
                    f"{round_}, epoch {epoch + 1}; lower the learning rate or check the data"
                )
        sums["steps"] = torch.tensor(steps)

    def optimiser(self, lr: float) -> torch.optim.Optimizer:
        """The client's optimiser (built once, or every round unless its state is kept),
        with every group's learning rate set for this round."""
        if self.optimizer is None:
            self.optimizer = self._build(lr)
        for group in self.optimizer.param_groups:
            group["lr"] = lr * group.get("lr_scale", 1.0)
        return self.optimizer

    def _build(self, lr: float) -> torch.optim.Optimizer:
        ctx = self.ctx
        groups: list[dict[str, Any]] = []
        claimed: set[int] = set()
        for part in ctx.hook.fedkit_param_groups(client=ctx):
            for group in part or ():
                group = dict(group)
                group["params"] = [p for p in group["params"] if p.requires_grad]
                group.setdefault("lr_scale", 1.0)
                group["lr"] = lr * group["lr_scale"]
                overlap = claimed & {id(p) for p in group["params"]}
                if overlap:
                    raise FedkitError(
                        "a parameter is in two optimiser groups (fedkit_param_groups)"
                    )
                claimed |= {id(p) for p in group["params"]}
                groups.append(group)
        rest = [p for p in ctx.model.parameters() if p.requires_grad and id(p) not in claimed]
        groups.insert(0, {"params": rest, "lr": lr, "lr_scale": 1.0})
        groups = [g for g in groups if g["params"]]
        optimizer = ctx.hook.fedkit_optimizer(client=ctx, param_groups=groups)
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise FedkitError(
                f"fedkit_optimizer returned {type(optimizer).__name__}, not a torch optimiser"
            )
        return optimizer
