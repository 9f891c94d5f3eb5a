"""A membership-inference check of a run's global model: the loss-threshold attack.

The attacker holds the global model and a sample, and guesses "member" (the sample was in
some client's training split) when the model's loss on it is low (Yeom et al. 2018): the
attack's score is minus the per-sample loss, and its ROC AUC over as many members (training
samples) as non-members (held-out test samples of the same clients) says how much the
model gives membership away; 0.5 is chance. DP bounds every such attack: at epsilon the
true-positive rate is at most ``e^eps * FPR + delta``. Run it with
``benchmarks/privacy_attack.py`` (docs/privacy.md has its figures).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from fedkit_core.engines.checkpoint import ServerCheckpoints
from fedkit_core.engines.model import build_model
from fedkit_core.errors import FedkitError
from fedkit_core.federation import prepare
from fedkit_core.hooks.context import ServerContext, derive_seed
from fedkit_core.resolve import resolve_config
from fedkit_core.results.store import RunDir


def per_sample_losses(model: torch.nn.Module, data: Any, normalizer: Any) -> np.ndarray:
    """Cross-entropy of the global model on each sample of one split (CPU, batches of 256)."""
    model.eval()
    out = []
    with torch.inference_mode():
        for start in range(0, len(data), 256):
            x = normalizer(data.images[start : start + 256])  # as training batches get it
            y = data.targets[start : start + 256].long()
            logits = model(x)["logits"]
            out.append(F.cross_entropy(logits, y, reduction="none").numpy())
    return np.concatenate(out) if out else np.zeros(0)


def attack_auc(member_losses: np.ndarray, other_losses: np.ndarray, seed: int = 0) -> float:
    """The loss-threshold attack's ROC AUC on as many members as non-members (the larger
    set subsampled with ``seed``)."""
    from sklearn.metrics import roc_auc_score

    n = min(len(member_losses), len(other_losses))
    if n == 0:
        raise FedkitError("the attack needs members and non-members")
    rng = np.random.default_rng(seed)
    members = rng.choice(member_losses, n, replace=False)
    others = rng.choice(other_losses, n, replace=False)
    labels = np.r_[np.ones(n), np.zeros(n)]
    return float(roc_auc_score(labels, -np.r_[members, others]))


def membership_auc(run_dir: str | Path, non_members: str = "val") -> dict[str, Any]:
    """The loss-threshold attack against the global model of a finished run (its checkpoint
    is needed: ``checkpoint=true``): members are the clients' training samples, non-members
    their ``non_members`` split (``val``: where it is drawn from the training pool, as
    MedMNIST's, members and non-members differ only in membership; a test set from another
    source would let the attack score the distribution shift). Returns the AUC, the sample
    counts and the mean losses."""
    run = RunDir(Path(run_dir))
    snapshot = ServerCheckpoints(run.checkpoint).load()
    if snapshot is None:
        raise FedkitError(f"{run_dir} has no checkpoint (run with checkpoint=true)")
    cfg, plugins = resolve_config(run.path / "config.yaml")
    fed = prepare(cfg, plugins)
    ctx = ServerContext(fed.task, cfg, torch.device("cpu"))
    ctx.priors = snapshot["priors"]
    torch.manual_seed(derive_seed(cfg["seed"], "model", "server"))
    model = build_model(plugins, ctx)
    model.load_shared(snapshot["global_state"])
    members, others = [], []
    for data in fed.clients.values():
        members.append(per_sample_losses(model, data["train"], data.normalizer))
        others.append(per_sample_losses(model, data[non_members], data.normalizer))
    member, other = np.concatenate(members), np.concatenate(others)
    return {
        "auc": attack_auc(member, other, cfg["seed"]),
        "members": len(member),
        "non_members": len(other),
        "member_loss": float(member.mean()),
        "non_member_loss": float(other.mean()),
    }
