"""Regenerate ``docs/results.md``: every method on every real data set that fits it, each
reported as a paired difference against its baseline over the same seeds.

For each data set (``DATASETS``: a config in ``benchmarks/results/`` and a size) the script
runs ``fedkit compare BASELINE METHOD...`` once per baseline (``METHODS`` names each method's
baseline runspec and the task kinds it fits) and writes the tables, the exact commands and a
verdict per method to the page. A method is added by one line in ``METHODS``.

    OMP_NUM_THREADS=2 python benchmarks/results_page.py              # the committed page
    OMP_NUM_THREADS=2 python benchmarks/results_page.py --quick      # a smoke run, minutes

Run from the project root (the configs read ``../shared/data``). Runs are kept under
``--out`` (default ``runs/results-page``) and reused when the page is regenerated with the
same setting, as ``fedkit compare`` does.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fedkit_core.config import load_yaml, parse_sets
from fedkit_core.results.compare import Comparison, compare, diff_rows, markdown_table
from fedkit_core.results.compare import metric_label as label

CLASSIFICATION, SEGMENTATION = "classification", "segmentation"
CONFIGS = Path("benchmarks/results")


@dataclass(frozen=True)
class Method:
    """A row of the page: its runspec, its baseline runspec (``None``: it is a baseline),
    the task kinds it fits, the compared numbers its paper claims to improve, and why it may
    not win in this CPU-sized setting (printed where its difference is not significant)."""

    name: str
    runspec: str
    baseline: str | None
    kinds: tuple[str, ...]
    claims: tuple[str, ...] = ()
    why_not: str = ""


@dataclass(frozen=True)
class Dataset:
    """A section of the page: a config, its kind, its default number of rounds (``None``:
    the config's, whatever the size) and the ``--set`` pairs for a number of rounds."""

    name: str
    config: str
    kind: str
    about: str
    rounds: int | None = None
    sets: Callable[[int], list[str]] = lambda rounds: []
    quick: tuple[str, ...] = ()
    smoke: bool = False

    def pairs(self, rounds: int | None, quick: bool) -> list[str]:
        """The ``--set`` pairs of a run at ``rounds`` (default: this data set's)."""
        if self.rounds is None:
            return []
        return [*self.sets(2 if quick else rounds or self.rounds), *(self.quick if quick else ())]


MAIN = "{main}"  # stands for the task's main metric in ``Method.claims``

METHODS = [
    Method("FedAvg", "fedavg", None, (CLASSIFICATION, SEGMENTATION)),
    Method(
        "FCA",
        "fca",
        "fedavg",
        (CLASSIFICATION,),
        (f"final.global.{MAIN}", f"final.clients_mean.{MAIN}"),
        "the paper's gains come from 80 rounds of an ImageNet EfficientNet on 224 px "
        "Fed-ISIC2019 images with thousands of samples per client; here a small CNN trains "
        "from scratch on 28 px images, one local epoch on a few hundred samples per client "
        "(issue 15's review of the plugin against the paper found no bug).",
    ),
    Method(
        "Fed-MAS",
        "fed-mas",
        "fedavg",
        (CLASSIFICATION,),
        (f"final.global.{MAIN}",),
        "Fed-MAS distils from and weighs clients by a frozen prior; the only pretrained prior "
        "offline is a CIFAR-10 ResNet-20, which knows nothing of medical images (linear probe "
        "on RetinaMNIST, benchmarks/prior_probe.py: bACC 0.365, random weights 0.352 +- 0.025 "
        "over 3 seeds, six colour statistics 0.372); a SimCLR prior pre-trained on public "
        "X-ray and ultrasound images lifts Fed-MAS on RetinaMNIST but not above FedAvg "
        "(docs/priors.md); on top of that, the same small-client setting as FCA.",
    ),
    Method("FedAvg (CE)", f"{CONFIGS}/fedavg-ce.yaml", None, (CLASSIFICATION,)),
    Method(
        "FedCB",
        f"{CONFIGS}/fedcb.yaml",
        f"{CONFIGS}/fedavg-ce.yaml",
        (CLASSIFICATION,),
        (f"final.global.{MAIN}",),
        "FedCB's frozen classifier is only as good as the text embeddings of the class names; "
        "offline the encoder is a general-purpose sentence model (all-MiniLM-L6-v2), not the "
        "paper's BiomedCLIP, and its embeddings of medical class names are close to each "
        "other (cosine 0.97-0.98 for the DR grades); the paper's gains are at Dirichlet "
        "0.05-0.1 with 10 clients, this page's partition is Dirichlet 0.5 over 5 clients "
        "(docs/plugins/fedcb.md has the 0.05/0.1 runs).",
    ),
    Method(
        "Fed-LWR",
        "fed-lwr",
        "fedavg",
        (SEGMENTATION,),
        ("final.fairness.std", f"final.global.{MAIN}"),
        "the paper trains 200 rounds on six ProstateMRI sites at 384 px; here two sites, "
        "64 px images, a small U-Net and few rounds, so the local models barely leave the "
        "anchor and CKA gives near-uniform layer weights. At 100 rounds and 128 px "
        "(docs/plugins/fed-lwr.md, 5 paired seeds) Fed-LWR with CKA on the training data "
        "lowers the std across sites on every seed, -0.0085 [-0.0158, -0.0012].",
    ),
]


def _cls(name: str, file: str, about: str) -> Dataset:
    return Dataset(
        name,
        f"{CONFIGS}/{name}.yaml",
        CLASSIFICATION,
        f"{file} (MedMNIST v2), {about}; 5 clients, Dirichlet(0.5) label skew re-drawn per "
        "seed, small CNN from scratch, one local epoch, Adam 1e-3 (state kept), wd 5e-4, "
        "gradient norm clipped at 5, BSM loss for every method, lr x0.1 at 75% and 90% of "
        "the rounds",
        rounds=20,
        sets=lambda r: [f"rounds={r}", f"lr_milestones=[{round(0.75 * r)},{round(0.9 * r)}]"],
    )


DATASETS = [
    _cls("pneumonia", "PneumoniaMNIST", "chest X-ray, 2 classes, 4708 training images"),
    _cls("breast", "BreastMNIST", "breast ultrasound, 2 classes, 546 training images"),
    _cls("retina", "RetinaMNIST", "fundus, 5 long-tailed DR grades, 1080 training images"),
    Dataset(
        "drive-chase",
        f"{CONFIGS}/drive-chase.yaml",
        SEGMENTATION,
        "retinal vessels at two real sites (DRIVE, CHASE_DB1), 64 px (32 px with --quick), "
        "U-Net 8-64 channels, Dice loss, Adam (the task defaults for segmentation)",
        rounds=30,
        sets=lambda r: [f"rounds={r}", f"eval_every={max(1, r // 3)}", "task.image_size=64"],
        quick=("task.image_size=32",),
    ),
    Dataset(
        "prostate-smoke",
        f"{CONFIGS}/prostate-smoke.yaml",
        SEGMENTATION,
        "smoke only: the real ProstateSlice layout, one or two slices per site (six sites), "
        "2 rounds; Fed-LWR measures no CKA on splits of fewer than 4 images and keeps the "
        "uniform average there, so it can only tie with FedAvg",
        smoke=True,
    ),
    Dataset(
        "fundus-smoke",
        f"{CONFIGS}/fundus-smoke.yaml",
        SEGMENTATION,
        "smoke only: the real Fundus (RIF) layout, one or two slices per site (four sites), "
        "2 rounds; Fed-LWR measures no CKA on splits of fewer than 4 images and keeps the "
        "uniform average there, so it can only tie with FedAvg",
        smoke=True,
    ),
]


def plan(dataset: Dataset) -> dict[str, list[Method]]:
    """``{baseline runspec: [baseline, methods against it]}`` for the methods that fit."""
    fits = [m for m in METHODS if dataset.kind in m.kinds]
    groups: dict[str, list[Method]] = {}
    for method in fits:
        if method.baseline is not None:
            groups.setdefault(method.baseline, []).append(method)
    return {b: [m for m in fits if m.runspec == b] + ms for b, ms in groups.items()}


def command(specs: Sequence[str], dataset: Dataset, sets: Sequence[str], seeds: str) -> str:
    """The ``fedkit compare`` command that reproduces one comparison."""
    parts = ["fedkit", "compare", *specs, "--config", dataset.config]
    for pair in sets:
        parts += ["--set", pair]
    return shlex.join([*parts, "--seeds", seeds])


def claims(method: Method, main: str) -> list[str]:
    return [c.replace(MAIN, main) for c in method.claims]


def verdict(method: Method, baseline: str, found: Comparison, smoke: bool) -> str:
    """One sentence per claimed number: significant win, significant loss, or not
    distinguishable from seed noise (with the method's reason)."""
    sentences = []
    lost = False
    for key in claims(method, found.main):
        d = found.diff.get(method.runspec, {}).get(key)
        if d is None:
            continue
        ci = f"95% CI t [{d['ci_t'][0]:+.4f}, {d['ci_t'][1]:+.4f}]"
        wtl = f"{d['wins']}/{d['ties']}/{d['losses']} W/T/L"
        better = d["mean"] < 0 if d["better"] == "lower" else d["mean"] > 0
        if d["significant"] and better:
            state = "wins"
        elif d["significant"]:
            state, lost = "loses", True
        else:
            state, lost = "does not win (the interval contains 0)", True
        sentences.append(
            f"{label(key)}: {method.name} {state}, {d['mean']:+.4f} vs {baseline}, {ci}, {wtl}."
        )
    text = f"**{method.name}**: " + " ".join(sentences)
    if smoke:
        return text + " Smoke row: too few images to rank methods."
    return text + (f" Why: {method.why_not}" if lost and method.why_not else "")


def section(dataset: Dataset, sets: Sequence[str], seeds: str, out: Path) -> list[str]:
    """Run the data set's comparisons and return its part of the page."""
    seed_list = [int(s) for s in seeds.split(",")]
    lines = [f"## {dataset.name}", "", dataset.about + ".", ""]
    for methods in plan(dataset).values():
        specs = [m.runspec for m in methods]
        found = compare(
            specs,
            seeds=seed_list,
            out=out / dataset.name,
            base=[load_yaml(dataset.config)],
            sets=parse_sets(sets),
        )
        seconds = {s: row["final.wall_seconds"]["mean"] for s, row in found.table.items()}
        took = ", ".join(f"{s} {t:.0f} s" for s, t in seconds.items())
        print(f"{dataset.name}: {' '.join(specs)}: {took} per run", flush=True)
        keys = [f"final.global.{found.main}", f"final.clients_mean.{found.main}"]
        keys += ["final.fairness.std", "final.fairness.worst"]
        keys = [k for k in keys if all(k in row for row in found.table.values())]
        base_name = methods[0].name
        lines += [
            "```bash",
            command(specs, dataset, sets, seeds),
            "```",
            "",
            f"Mean ± std over seeds {seeds} (final round, test split; training time per run "
            f"on this shared machine: {took}):",
            "",
            markdown_table(
                found.table, keys, headers=[label(k) for k in keys], labels=found.labels
            ),
            f"Paired differences to {base_name} (method minus {base_name}, seed by seed):",
            "",
            _rows(diff_rows(found.diff, keys)),
        ]
        lines += [verdict(m, base_name, found, dataset.smoke) + "\n" for m in methods[1:]]
    return lines


def _rows(rows: Sequence[Mapping[str, Any]]) -> str:
    head = list(rows[0])
    out = ["| " + " | ".join(head) + " |", "|---" * len(head) + "|"]
    return "\n".join(out + ["| " + " | ".join(r[h] for h in head) + " |" for r in rows]) + "\n"


HEADER = """# Results: every method on the real data sets

Regenerated by `benchmarks/results_page.py` (do not edit by hand); this page came from

```bash
{command}
```

Each method is compared with its baseline on the same task, partition, initial model and
client sampling per seed (`fedkit compare` pairs seeds by construction), so the numbers that
matter are the **paired differences**: method minus baseline per seed, their mean, 95%
confidence intervals by paired t and by bootstrap (10000 resamples, fixed seed) and wins /
ties / losses over seeds. A difference is significant only when both intervals exclude 0;
otherwise the method does not win here, and the page says why. Sizes are chosen for a CPU
(2 cores); the papers' own settings need a GPU and data not available here. Times are those
of this machine, which other jobs shared while it ran.
"""


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="smoke size: 2 rounds, 32 px")
    parser.add_argument(
        "--rounds", type=int, help="rounds of every non-smoke data set (default: each one's)"
    )
    parser.add_argument("--seeds", default="0,1,2,3,4", help="comma-separated seeds (>= 2)")
    parser.add_argument("--only", default="", help="comma-separated data sets (default all)")
    parser.add_argument("--out", type=Path, default=Path("runs/results-page"))
    parser.add_argument("--page", type=Path, default=Path("docs/results.md"))
    parser.add_argument("--note", default="", help="a paragraph for the page (why this size)")
    args = parser.parse_args(argv)
    if len(args.seeds.split(",")) < 2:
        parser.error("--seeds needs at least 2 seeds for paired differences")
    wanted = [d for d in DATASETS if not args.only or d.name in args.only.split(",")]
    argv = sys.argv[1:] if argv is None else argv
    shown = ["NOTE" if i and argv[i - 1] == "--note" else a for i, a in enumerate(argv)]
    lines = [HEADER.format(command=shlex.join(["python", "benchmarks/results_page.py", *shown]))]
    if args.note:
        lines.append(f"NOTE: {args.note}\n")
    left_out = [d.name for d in DATASETS if d not in wanted]
    if left_out:
        lines.append(f"Not in this regeneration (left out with --only): {', '.join(left_out)}.\n")
    for n, dataset in enumerate(wanted):
        sets = dataset.pairs(args.rounds, args.quick)
        lines += section(dataset, sets, args.seeds, args.out / ("quick" if args.quick else "runs"))
        missing = [d.name for d in wanted[n + 1 :]]
        tail = [f"\n(Not yet run in this regeneration: {', '.join(missing)}.)\n"] if missing else []
        args.page.write_text("\n".join(lines + tail))  # a partial page survives an interruption
    print(f"wrote {args.page}")


if __name__ == "__main__":
    main()
