"""FCA's two heads on each client's own test set, from a finished run's checkpoints.

Why FCA's personalised head can score below its federated head on some clients (issue 42):
for every client of each FCA run folder given, this rebuilds the client as the run did
(fedkit's client runtime, the run's config, its frozen-trunk cache when the run used one),
restores the client's round-``R`` snapshot (its private personalised head, and the shared
weights as they were at the end of its local training in round ``R``) and the server's
round-``R`` global model, and scores on the client's test split:

* ``fed@G``: the federated head on the global model (``final.views.global``);
* ``pers@G``: the personalised head on the global feature extractor (``final.views.personal``,
  the paper's specialisation; both of these are checked against results.json);
* ``pers@L``, ``fed@L``: the same heads on the client's own feature extractor at the end of
  its last local training (the extractor the personalised head was last trained against);
* ``pers@G+bnL``: the global weights with the client's batch-norm running statistics;
* ``...|seen``: the arg max taken only over the classes in the client's training set (the
  personalised head never learns the others: BSM's offset log(0 + eps) = -20.7 takes away
  their loss gradient and weight decay drives their weight rows to zero, so their logit
  stays near 0 while the trained classes' logits float, balanced softmax being blind to a
  shift of all logits).

It prints, per client and averaged over the runs: the bACC of each, and per class (with the
client's training and test counts) the recall of ``fed@G``, ``pers@G`` and ``pers@L|seen``
on the client's test set and the share of its test predictions each of them puts on it.

    OMP_NUM_THREADS=1 python benchmarks/fca_heads.py RUN_DIR [RUN_DIR ...]

e.g. ``/work/runs/results-page/runs/fca/fca/seed{0..4}`` (read only: nothing is written).
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path

import numpy as np
import torch

from fedkit_core.contract.messages import Message
from fedkit_core.contract.observer import Observer
from fedkit_core.engines.client import ClientRuntime
from fedkit_core.engines.server import Server
from fedkit_core.engines.snapshot import restore_client
from fedkit_core.federation import prepare
from fedkit_core.metrics.classification import balanced_accuracy
from fedkit_core.resolve import resolve_config

PERSONAL = "fca_personal"
HEADS = {"fed": "logits", "pers": PERSONAL}
#: the heads whose per-class recall and predictions are printed
PER_CLASS = ("fed@G", "pers@G", "pers@L|seen")


def _load(path: Path) -> dict:
    return torch.load(path, map_location="cpu", weights_only=True)


def _predict(client: ClientRuntime, state: dict) -> dict[str, np.ndarray]:
    """Logits of both heads on the client's test split with shared ``state``, and labels."""
    ctx = client.ctx
    ctx.model.load_shared(state)
    client.frozen_inputs()
    ctx.model.eval()
    preds: dict[str, list[torch.Tensor]] = defaultdict(list)
    with torch.inference_mode():
        for batch in ctx.batches("test", batch_size=ctx.config["eval_batch_size"]):
            outputs = ctx.forward(ctx.model, batch.x)
            for name, key in HEADS.items():
                preds[name].append(outputs[key].float().cpu())
            preds["y"].append(batch.y.cpu())
    return {k: torch.cat(v).numpy() for k, v in preds.items()}


def _with_bn_stats(state: dict, source: dict) -> dict:
    """``state`` with the batch-norm running statistics of ``source``."""
    stats = ("running_mean", "running_var", "num_batches_tracked")
    return {k: source[k] if k.endswith(stats) else v for k, v in state.items()}


def measure(run: Path) -> dict[str, dict]:
    """Per client: labels and the predictions of each head/extractor combination."""
    ckpt = json.loads((run / "checkpoint" / "latest.json").read_text())
    cfg, plugins = resolve_config(str(run / "config.yaml"))
    fed = prepare(cfg, plugins)
    server = Server(cfg, plugins, fed.task, fed.device, Observer())
    server.setup()
    glob = _load(run / "checkpoint" / ckpt["server"])["global_state"]
    out = {}
    for cid in fed.clients:
        client = ClientRuntime(cid, fed.client_data(cid), fed.task, cfg, plugins, fed.device)
        client.setup(Message("setup", server.ctx.priors))
        snap = _load(run / "checkpoint" / "clients" / cid / f"r{ckpt['round']}.pt")
        restore_client(client, snap)  # the private head; shared = end of its local training
        local = {k: v.clone() for k, v in snap["shared"].items()}
        g, loc = _predict(client, glob), _predict(client, local)
        bn = _predict(client, _with_bn_stats(glob, local))
        counts = np.asarray(client.ctx.info.class_counts)
        seen = np.where(counts > 0, 0.0, -np.inf)  # classes absent from its training set out
        out[cid] = {
            "y": g["y"],
            "fed@G": g["fed"].argmax(1),
            "pers@G": g["pers"].argmax(1),
            "pers@L": loc["pers"].argmax(1),
            "fed@L": loc["fed"].argmax(1),
            "pers@G+bnL": bn["pers"].argmax(1),
            "fed@G|seen": (g["fed"] + seen).argmax(1),
            "pers@G|seen": (g["pers"] + seen).argmax(1),
            "pers@L|seen": (loc["pers"] + seen).argmax(1),
            "train_counts": counts,
            # the personalised head's weight rows of the classes it never trained on
            "absent_norm": float(
                snap["client"]["private"][f"extras.{PERSONAL}.weight"][counts == 0].norm()
            ),
        }
    return out


def _per_class(cid: str, runs: list[dict]) -> None:
    """Per class, mean over ``runs`` (one client's): recall on the test set and the share of
    the test predictions, for the heads in :data:`PER_CLASS`."""
    y, counts = runs[0]["y"], runs[0]["train_counts"]
    absent = max(r["absent_norm"] for r in runs) if (counts == 0).any() else None
    print(f"\n{cid}: per class, mean over runs (recall on its test set | % of predictions)")
    if absent is not None:
        print(f"largest norm of the personalised head's rows of absent classes: {absent:.2g}")
    cols = " ".join(f"{k:>11s}" for k in PER_CLASS)
    print(f"class  train  test {cols} | {cols}")
    for c in range(len(counts)):
        recall = [
            f"{np.mean([(r[k][r['y'] == c] == c).mean() for r in runs]):11.2f}"
            if (y == c).any()
            else f"{'-':>11s}"
            for k in PER_CLASS
        ]
        share = [f"{100 * np.mean([(r[k] == c).mean() for r in runs]):11.1f}" for k in PER_CLASS]
        print(f"{c:5d} {counts[c]:6d} {(y == c).sum():5d} {' '.join(recall)} | {' '.join(share)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("runs", nargs="+", type=Path, help="FCA run folders (with checkpoint/)")
    args = parser.parse_args()
    per_run = []
    for run in args.runs:
        per_run.append(measure(run))
        results = json.loads((run / "results.json").read_text())["final"]["views"]
        for cid, m in per_run[-1].items():
            mine = {k: balanced_accuracy(m["y"], m[k]) for k in ("fed@G", "pers@G")}
            saved = {
                "fed@G": results["global"]["clients"][cid]["bacc"],
                "pers@G": results["personal"]["clients"][cid]["bacc"],
            }
            print(
                f"{run.name} {cid}: bACC here/results.json "
                + ", ".join(f"{k} {mine[k]:.3f}/{saved[k]:.3f}" for k in mine)
            )
    kinds = (
        "fed@G",
        "pers@G",
        "pers@L",
        "fed@L",
        "pers@G+bnL",
        "fed@G|seen",
        "pers@G|seen",
        "pers@L|seen",
    )
    print(f"\nbACC on the client's test set, mean over {len(per_run)} runs")
    print(f"{'client':20s} " + " ".join(f"{k:>11s}" for k in kinds))
    for cid in per_run[0]:
        row = [np.mean([balanced_accuracy(r[cid]["y"], r[cid][k]) for r in per_run]) for k in kinds]
        print(f"{cid:20s} " + " ".join(f"{v:11.3f}" for v in row))
    for cid in per_run[0]:
        _per_class(cid, [r[cid] for r in per_run])


if __name__ == "__main__":
    main()
