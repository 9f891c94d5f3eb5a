"""The baselines leaderboard of docs/plugins/baselines.md: FedAvg, the FLamby/Flower
strategies and the personalised methods of issue 30 on the shared MedMNIST sets, paired over
seeds, with the pooled and local reference rows.

    OMP_NUM_THREADS=2 nice python benchmarks/baselines_leaderboard.py        # 5 seeds, both sets
    python benchmarks/baselines_leaderboard.py --datasets retina --seeds 0,1,2 --rounds 30
    python benchmarks/baselines_leaderboard.py --quick                       # a smoke run

Each data set is one ``fedkit compare`` of every method (``METHODS``) and the reference
runspecs that this installation has (``--references``: ``pooled`` is centralised training on
the pooled data, ``solo`` each client alone; a reference fedkit does not know is skipped with
a note). The setting is ``benchmarks/leaderboard/<dataset>.yaml``: 28 px, 5 clients, a
Dirichlet(0.5) label skew re-drawn per seed, the small CNN, one local epoch, Adam, every
method at its default options; rounds and the lr milestones (75% and 90%) follow ``--rounds``.
Runs are kept under ``--out/<dataset>`` and reused, as ``fedkit compare`` does, so an
interrupted leaderboard continues where it stopped.

The table is sorted by the clients' mean bACC (each client scored with the model the method
serves it: personalised methods their personal model), with the pooled ``global`` bACC, the
fairness of the clients, the paired difference to FedAvg (95% t interval over the seeds;
``*`` where both intervals exclude 0), the batch-norm policy, and how much the validation
bACC still moved over the last fifth of the rounds (``val drift``: the mean of the last fifth
minus the mean of the fifth before it; near 0 means converged). It is written to
``--out/leaderboard.md`` and printed.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from fedkit_core.comparison import compare
from fedkit_core.config import load_yaml
from fedkit_core.errors import FedkitError
from fedkit_core.resolve import resolve_config
from fedkit_core.results.compare import Comparison, runspec_label, runspec_layers

CONFIGS = Path("benchmarks/leaderboard")
DATASETS = {"retina": 60, "pneumonia": 40}  # default rounds per data set
METHODS = [
    "fedavg",
    "fedbn",
    "scaffold",
    "fedadam",
    "fedyogi",
    "fedadagrad",
    "fedavgm",
    "fednova",
    "feddyn",
    "cyclic",
    "fedper",
    "apfl",
    "perfedavg",
]
REFERENCES = ["pooled", "solo"]


def sets_for(rounds: int) -> dict[str, object]:
    return {"rounds": rounds, "lr_milestones": [round(0.75 * rounds), round(0.9 * rounds)]}


def available(specs: Sequence[str], base: dict, sets: dict) -> tuple[list[str], list[str]]:
    """The runspecs whose config resolves here, and notes on those that do not."""
    ok, notes = [], []
    for spec in specs:
        try:
            resolve_config(runspec_layers(spec, [base], sets))
            ok.append(spec)
        except FedkitError as err:
            notes.append(f"{spec}: skipped ({str(err).splitlines()[0]})")
    return ok, notes


def val_drift(run_dir: Path) -> float | None:
    """The validation main metric's mean over the last fifth of the evaluated rounds minus
    its mean over the fifth before (global view, or the clients' mean without one)."""
    results = json.loads((run_dir / "results.json").read_text())
    main = results["task"]["main_metric"]
    curve = []
    for record in results["rounds"]:
        val = record.get("val", {})
        value = val.get("global", {}).get(main, val.get("clients_mean", {}).get(main))
        if value is not None:
            curve.append(value)
    k = max(1, len(curve) // 5)
    if len(curve) < 2 * k:
        return None
    return float(np.mean(curve[-k:]) - np.mean(curve[-2 * k : -k]))


def cell(entry: dict | None) -> str:
    return "n/a" if entry is None else f"{entry['mean']:.3f} ± {entry['std']:.3f}"


def diff_cell(diff: dict | None) -> str:
    if diff is None:
        return "—"
    lo, hi = diff["ci_t"]
    star = "*" if diff["significant"] else ""
    return f"{diff['mean']:+.3f} [{lo:+.3f}, {hi:+.3f}]{star}"


def table(found: Comparison, out: Path, seeds: Sequence[int], references: Sequence[str]) -> str:
    main = found.main
    rows = []
    for spec, metrics in found.table.items():
        drifts = [val_drift(out / runspec_label(spec) / f"seed{s}") for s in seeds]
        drifts = [d for d in drifts if d is not None]
        diff = found.diff.get(spec, {})
        rows.append(
            (
                spec in references,
                -metrics.get(f"final.clients_mean.{main}", {"mean": -1})["mean"],
                "| "
                + " | ".join(
                    [
                        f"{spec} (reference)" if spec in references else spec,
                        cell(metrics.get(f"final.clients_mean.{main}")),
                        cell(metrics.get(f"final.global.{main}")),
                        cell(metrics.get("final.fairness.std")),
                        cell(metrics.get("final.fairness.worst")),
                        diff_cell(diff.get(f"final.clients_mean.{main}")),
                        diff_cell(diff.get(f"final.global.{main}")),
                        found.bn.get(spec, ""),
                        f"{np.mean(drifts):+.3f}" if drifts else "n/a",
                    ]
                )
                + " |",
            )
        )
    head = (
        f"| method | clients mean {main} | global {main} | fairness std | worst client | "
        f"Δ clients mean vs fedavg [95% t CI] | Δ global vs fedavg | bn | val drift |\n"
        + "|---" * 9
        + "|"
    )
    return head + "\n" + "\n".join(r[2] for r in sorted(rows)) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--datasets", default=",".join(DATASETS))
    parser.add_argument("--seeds", default="0,1,2,3,4")
    parser.add_argument("--rounds", type=int, default=None, help="default: per data set")
    parser.add_argument("--methods", default=",".join(METHODS))
    parser.add_argument("--references", default=",".join(REFERENCES))
    parser.add_argument("--out", type=Path, default=Path("runs/leaderboard"))
    parser.add_argument("--jobs", type=int, default=1, help="runs in parallel processes")
    parser.add_argument("--quick", action="store_true", help="2 rounds, 2 seeds: a smoke run")
    args = parser.parse_args(argv)
    seeds = [0, 1] if args.quick else [int(s) for s in args.seeds.split(",")]
    methods = args.methods.split(",")
    references = [r for r in args.references.split(",") if r]
    sections = []
    for name in args.datasets.split(","):
        config = CONFIGS / f"{name}.yaml"
        rounds = 2 if args.quick else args.rounds or DATASETS[name]
        base, sets = load_yaml(config), sets_for(rounds)
        specs, notes = available([*methods, *references], base, sets)
        out = args.out / name
        print(f"{name}: {len(specs)} runspecs x {len(seeds)} seeds, {rounds} rounds", flush=True)
        found = compare(specs, seeds=seeds, out=out, base=[base], sets=sets, jobs=args.jobs)
        command = (
            f"fedkit compare {' '.join(specs)} --config {config} --set rounds={rounds} "
            f"--set 'lr_milestones={sets['lr_milestones']}' --seeds {','.join(map(str, seeds))}"
        )
        sections.append(
            f"### {name}: {rounds} rounds, seeds {', '.join(map(str, seeds))}\n\n"
            f"```bash\n{command}\n```\n\n"
            + table(found, out, seeds, references)
            + "".join(f"\n{n}" for n in notes)
        )
    text = "\n\n".join(sections) + "\n"
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "leaderboard.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
