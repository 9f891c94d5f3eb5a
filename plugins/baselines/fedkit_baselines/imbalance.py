"""What the class-imbalance losses share: the client's own class counts as a tensor, the
checks that they only replace a classification task's loss, and per-sample focal losses and
class-balanced weights (used by ``focal``, ``cb`` and ``ldam-drw``)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from fedkit_core.plugin import CLASSIFICATION, ClientContext, ServerContext


def counts(client: ClientContext) -> torch.Tensor:
    """The client's own training samples per class (float, on its device); never sent."""
    return torch.as_tensor(client.class_counts, dtype=torch.float32, device=client.device)


def check_task_loss(server: ServerContext, name: str) -> str | None:
    """The refusal of a plugin that replaces the task loss of a classification task, if any."""
    if server.task.kind != CLASSIFICATION:
        return f"{name} is a classification loss; {server.task.name!r} is {server.task.kind}"
    if server.config["loss"] not in ("auto", "ce"):
        return (
            f"{name} replaces the task loss, so loss={server.config['loss']} would be ignored; "
            "leave `loss` at its default"
        )
    return None


def focal_per_sample(logits: torch.Tensor, target: torch.Tensor, gamma: float) -> torch.Tensor:
    """``-(1 - p_y)^gamma log p_y`` per sample (Lin et al. 2017); ``gamma = 0`` is CE."""
    log_p = F.log_softmax(logits.float(), dim=1).gather(1, target[:, None])[:, 0]
    return -((1 - log_p.exp()) ** gamma) * log_p


def class_balanced_weights(n: torch.Tensor, beta: float) -> torch.Tensor:
    """Cui et al. 2019: ``(1 - beta) / (1 - beta^n_c)``, the inverse effective number of
    samples, normalised to sum to the number of classes present; 0 for absent classes (they
    are never a local target). ``beta = 0`` gives 1 for every present class."""
    present = n > 0
    weights = torch.zeros_like(n)
    weights[present] = (1 - beta) / (1 - beta ** n[present])
    return weights * present.sum() / weights.sum()
