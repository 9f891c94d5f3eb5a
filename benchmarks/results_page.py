"""Regenerate ``docs/results.md``: does fedkit reproduce each seed method's paper?

For each of the five methods (``CLAIMS``) the page takes its paper's headline claim, runs
the closest real setting this machine can afford (a config in ``benchmarks/results/``) with
``fedkit compare BASELINE METHOD pooled solo`` over paired seeds, until the validation
curves have flattened (:mod:`fedkit_core.results.convergence`), and writes, per method: the
setting and its cost, the tables (mean ± std, paired differences to the baseline, every
client's gain over training alone, or over the baseline where the paper claims per-client
gains), the convergence of every runspec, the validation curves, and a **verdict**:
*reproduced* when every claimed number moves the paper's way with a paired 95% interval
that excludes 0, *not reproduced* otherwise, with the ablation that shows why.

    python benchmarks/results_page.py                     # the committed page (hours on 2 cores)
    python benchmarks/results_page.py --only fedcb,fed-lwr
    python benchmarks/results_page.py --quick             # a smoke run: 2 rounds, 2 seeds

Run from the project root (the configs read ``../shared/data``). Runs are kept under
``--out`` (default ``runs/results-page``) and reused when the page is regenerated with the
same settings, as ``fedkit compare`` does; ``--jobs N`` runs N runs at once, and
``--executor ray --address HOST:PORT`` runs each as a task on a Ray cluster (docs/engines.md,
"Comparisons on a Ray cluster").
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import statistics
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fedkit_core.comparison import compare, executor_for
from fedkit_core.config import load_yaml, parse_sets
from fedkit_core.errors import FedkitError
from fedkit_core.fileio import write_text
from fedkit_core.metrics.paired import paired_difference
from fedkit_core.parallel import Executor
from fedkit_core.results.clients import clients_section, gain_rows, score_rows
from fedkit_core.results.compare import Comparison, diff_rows, runspec_label
from fedkit_core.results.compare import metric_label as label
from fedkit_core.results.convergence import convergence_note
from fedkit_core.results.schema import Results
from fedkit_core.results.tables import markdown_table, rows_markdown

CONFIGS = Path("benchmarks/results")
FIGURES = Path("docs/figures/results")


@dataclass(frozen=True)
class Claim:
    """One key number a paper claims its method improves over its baseline.

    ``key``: a ``compare.json`` number (``final.global.bacc``), or ``gs.<metric>`` for the
    mean of the global model's and the clients' scores (FCA's generalisation &
    specialisation average), or ``client.<metric>`` for "every client gains" (each client's
    paired gain must be significant). ``higher``: which way the paper says it moves."""

    key: str
    higher: bool = True

    @property
    def text(self) -> str:
        if self.key.startswith("gs."):
            return f"mean of global and clients' {self.key[3:]} (G&S average)"
        if self.key.startswith("client."):
            return f"every client's test {self.key[7:]}"
        return label(self.key) + ("" if self.higher else " (lower is better)")


@dataclass(frozen=True)
class Ablation:
    """A second comparison that tests one explanation of a result: its runspecs (the first
    is its baseline), ``--set`` pairs on top of the method's setting, and the question."""

    question: str
    runspecs: tuple[str, ...]
    sets: tuple[str, ...] = ()


@dataclass(frozen=True)
class Method:
    """A section of the page: the method, its paper's headline, the setting here, the
    compared runspecs (baseline, method, then the references) and the claimed numbers."""

    name: str
    slug: str
    paper: str
    setting: str
    config: str
    baseline: str
    method: str
    claims: tuple[Claim, ...]
    #: the reference of the per-client gains: ``solo`` (what joining buys a hospital), or
    #: the baseline where the paper's claim is per client
    reference: str = "solo"
    #: clients printed in bold in the per-client tables (FedHelp: the smallest)
    highlight: tuple[str, ...] = ()
    ablations: tuple[Ablation, ...] = ()
    quick: tuple[str, ...] = ("rounds=2",)
    extra_metrics: tuple[str, ...] = field(default=())
    #: a measurement without training that bears on the verdict (lines of the page)
    diagnosis: Callable[[Method], list[str]] | None = None
    #: the slug of a method with the same config whose baseline and reference runs this
    #: one reuses (they are the same runs: the run folders' configs are checked on reuse)
    shares: str = ""

    @property
    def runspecs(self) -> list[str]:
        return [self.baseline, self.method, "pooled", "solo"]


def _cfg(name: str) -> str:
    return f"{CONFIGS}/{name}.yaml"


#: the eight OCT-C8 classes of FedCB's paper, for its class-separation diagnosis
OCT_C8 = (
    "age-related macular degeneration",
    "choroidal neovascularization",
    "central serous retinopathy",
    "diabetic macular edema",
    "diabetic retinopathy",
    "drusen",
    "macular hole",
    "normal",
)


def separation(encoder: str, names: Sequence[str], prompts: Sequence[str]) -> tuple[float, ...]:
    """Mean, smallest and largest pairwise cosine between the class means FedCB's frozen
    classifier gets from ``encoder`` for ``names`` (near 1: nearly parallel class vectors)."""
    import torch
    import torch.nn.functional as F
    from fedkit_fedcb.classifier import class_statistics
    from fedkit_fedcb.encoders import text_embeddings

    texts = [[t.format(n) for t in prompts] for n in names]
    mu, _ = class_statistics(text_embeddings(encoder, None, texts, names))
    mu = F.normalize(mu, dim=-1)
    off = (mu @ mu.T)[~torch.eye(len(names), dtype=torch.bool)]
    return float(off.mean()), float(off.min()), float(off.max())


def class_separation(method: Method) -> list[str]:
    """FedCB's frozen classifier is the text encoder's class means: how far apart are they
    for the config's class names, and for the paper's OCT-C8 classes (same encoder, prompts)?"""
    from fedkit_fedcb.plugin import DEFAULT_PROMPTS

    opts = load_yaml(method.config)["fedcb"]
    prompts = opts.get("prompts", DEFAULT_PROMPTS)
    here = separation(opts["encoder"], opts["class_names"], prompts)
    paper = separation(opts["encoder"], OCT_C8, prompts)
    return [
        f"**Diagnosis (no training): how separable is the frozen classifier?** With "
        f"`{opts['encoder']}` and the default prompts, the {len(opts['class_names'])} class "
        f"means of this data set's class names have a mean pairwise cosine of {here[0]:.3f} "
        f"(from {here[1]:.3f} to {here[2]:.3f}); the paper's eight OCT-C8 class names, "
        f"through the same encoder and prompts: {paper[0]:.3f} ({paper[1]:.3f} to "
        f"{paper[2]:.3f}). Ordinal grades of one disease named in words ('mild', 'moderate', "
        "'severe' diabetic retinopathy) give a frozen classifier nearly parallel class "
        "vectors; the paper's classes are distinct diseases. (Computed by "
        "`benchmarks/results_page.py`'s `class_separation`.)",
        "",
    ]


METHODS = [
    Method(
        "FCA",
        "fca",
        "Wicaksana et al., TMI 2023, Table 4: on Fed-ISIC2019 (six sites, 8 classes) the mean "
        "of generalisation (global model, federated head, pooled test set) and specialisation "
        "(each client's personalised head on its test set) bACC is 75.1 against 69.3 for "
        "FedAvg with balanced softmax.",
        "RetinaMNIST (5 long-tailed grades, 1080 training images), 5 clients with a Dirichlet(0.5) "
        "label skew re-drawn per seed, ImageNet EfficientNet-Lite0 (the offline weights; the "
        "paper: EfficientNet-B0) fine-tuned at 64 px, balanced softmax for every runspec, "
        "Adam 1e-3 with lr x0.1 at rounds 23 and 26, 60 rounds (at 30 the curves still moved "
        "after the second drop, at 40 Fed-MAS's still rose, at 50 FCA's and Fed-MAS's still "
        "moved by 0.007; rounds 48-60, the last fifth, run at 1e-5). The rule is finer than "
        "this validation split can measure: of its 120 images 6 are grade 4, so one of them "
        "changes a seed's validation bACC by 0.033 and the 5-seed mean by 0.0067.",
        _cfg("retina-pretrained"),
        "fedavg",
        "fca",
        (Claim("gs.bacc"),),
    ),
    Method(
        "Fed-MAS",
        "fed-mas",
        "Elbatel et al. 2023, Tables 1-3: on Fed-ISIC2019 with an ImageNet ResNet-18 and a "
        "frozen self-supervised ResNet-50 prior, higher bACC and tail-class accuracy than "
        "FedAvg with balanced softmax (BSM-FL).",
        "The FCA setting above (the same FedAvg runs, and references), with the prior a frozen "
        "ImageNet EfficientNet-Lite0 (the only pretrained image encoder offline; the paper: "
        "MoCo-v2 ResNet-50), tail classes: fewer than 100 training images (grade 4).",
        _cfg("retina-pretrained"),
        "fedavg",
        "fed-mas",
        (Claim("final.global.bacc"), Claim("final.global.tail_acc")),
        shares="fca",
    ),
    Method(
        "FedCB",
        "fedcb",
        "Zhu et al., MICCAI 2024: at Dirichlet 0.05 and 0.1 over 10 clients (OCT-C8, "
        "Kvasir-v2), a frozen classifier from a language model's class-name embeddings gives "
        "higher bACC than FedAvg.",
        "RetinaMNIST at 28 px, 10 clients with a Dirichlet(0.05) label skew, half sampled per "
        "round, 200 rounds (as the paper), the small CNN from scratch (the paper: ResNet-18 "
        "from scratch), the authors' optimiser (SGD 0.01, momentum 0.9, lr x0.99 per round, "
        "batch 8, 2 local epochs), the offline all-MiniLM-L6-v2 text encoder (the paper: "
        "BiomedCLIP), T = 17.5; both runspecs train with cross-entropy. The paper selects its "
        "model on validation: the claim is the test bACC of the round best on validation.",
        _cfg("retina-fedcb"),
        f"{CONFIGS}/fedavg-ce.yaml",
        f"{CONFIGS}/fedcb.yaml",
        (Claim("best.global.bacc"),),
        diagnosis=class_separation,
        ablations=(
            Ablation(
                "is it the class vectors? FedCB with the paper's ablation, a frozen classifier "
                "of random unit vectors (nearly orthogonal), against FedCB with the text "
                "encoder's class vectors (nearly parallel, see the diagnosis above): if their "
                "separation is what FedCB lacks here, the random vectors gain.",
                (f"{CONFIGS}/fedcb.yaml", f"{CONFIGS}/fedcb-random.yaml"),
            ),
        ),
    ),
    Method(
        "Fed-LWR",
        "fed-lwr",
        "Yan et al., MICCAI 2024, Table 1: on ProstateMRI (6 sites) the std of Dice across "
        "sites falls from 4.54 to 0.97 and the mean Dice rises from 88.78 to 93.25 against "
        "FedAvg.",
        "Retinal vessels at two real sites (DRIVE, CHASE_DB1) at 128 px, U-Net 8-64 channels "
        "from scratch (as the paper), the paper's training setting (Dice loss, Adam 1e-3 kept "
        "across rounds, batch 8, 1 local epoch), CKA on the training data.",
        _cfg("drive-chase"),
        "fedavg",
        "fed-lwr",
        (Claim("final.fairness.std", higher=False), Claim("final.clients_mean.dice")),
    ),
    Method(
        "FedHelp",
        "fedhelp",
        "Wang and Lyu, KDD 2025, Table 3: on chest X-ray pneumonia with six clients holding "
        "60/20/8/6/4/2% of the data (two large), every client's accuracy rises over FedAvg "
        "(+2.3 to +11.6%), the small clients' most.",
        "PneumoniaMNIST at 28 px with the paper's client fractions (c0, c1 large), the small "
        "CNN as the shared small model and a CIFAR ResNet-20 as the large private one (the "
        "paper: ResNet-20 and ResNet-110), 60 rounds of SGD 0.05 with lr x0.1 at rounds 41 "
        "and 49 for every runspec (at a constant rate the curves were still swinging at "
        "round 40; the paper: up to 100 rounds with early stopping), offline knowledge from "
        "two frozen pretrained encoders with linear probes on RetinaMNIST's images (the "
        "paper: CLIP zero-shot on CIFAR-100).",
        _cfg("pneumonia-fedhelp"),
        "fedavg",
        "fedhelp",
        (Claim("client.acc"), Claim("client.bacc")),
        reference="fedavg",
        highlight=("c5",),
    ),
]


def command(specs: Sequence[str], config: str, sets: Sequence[str], seeds: str) -> str:
    """The ``fedkit compare`` command that reproduces one comparison."""
    parts = ["fedkit", "compare", *specs, "--config", config]
    for pair in sets:
        parts += ["--set", pair]
    return shlex.join([*parts, "--seeds", seeds])


def load_runs(out: Path, specs: Sequence[str], seeds: Sequence[int]) -> dict[str, list[Results]]:
    """The runs a comparison in ``out`` made, ``{runspec: [results of each seed]}``."""
    return {s: [Results.load(out / runspec_label(s) / f"seed{k}") for k in seeds] for s in specs}


def per_seed(found: Comparison, spec: str, key: str) -> list[float] | None:
    """A compared number of ``spec``, seed by seed (``gs.<m>``: the mean of the global and
    the clients' mean ``m``)."""
    row = found.table[spec]
    if key.startswith("gs."):
        g, c = row.get(f"final.global.{key[3:]}"), row.get(f"final.clients_mean.{key[3:]}")
        if g is None or c is None:
            return None
        return [(a + b) / 2 for a, b in zip(g["per_seed"], c["per_seed"])]
    entry = row.get(key)
    return None if entry is None else list(entry["per_seed"])


def judge(
    method: Method, found: Comparison, runs: Mapping[str, Sequence[Results]], seeds: Sequence[int]
) -> tuple[bool, list[str]]:
    """Whether every claim holds (same direction as the paper, paired interval excluding 0),
    and one sentence per claim."""
    ok, sentences = True, []
    for claim in method.claims:
        if claim.key.startswith("client."):
            metric = claim.key[7:]
            section = clients_section(runs, metric, method.baseline, seeds)
            gains = section["gains"].get(method.method, {})
            means = ", ".join(f"{c} {g['mean']:+.3f}" for c, g in gains.items())
            good = [c for c, g in gains.items() if g.get("significant") and g["mean"] > 0]
            bad = [c for c, g in gains.items() if g.get("significant") and g["mean"] < 0]
            holds = bool(gains) and len(good) == len(gains)
            ok &= holds
            sentences.append(
                f"{claim.text}: {len(good)} of {len(gains)} clients gain significantly"
                + (f", {len(bad)} lose significantly ({', '.join(bad)})" if bad else "")
                + f" (means: {means})."
            )
            continue
        values = per_seed(found, method.method, claim.key)
        base = per_seed(found, method.baseline, claim.key)
        if values is None or base is None:
            ok = False
            sentences.append(f"{claim.text}: not measured.")
            continue
        d = paired_difference(values, base, higher_is_better=claim.higher)
        better = d["mean"] > 0 if claim.higher else d["mean"] < 0
        holds = bool(d["significant"] and better)
        ok &= holds
        state = (
            "holds"
            if holds
            else ("reversed" if d["significant"] else "not distinguishable from seed noise")
        )
        sentences.append(
            f"{claim.text}: {d['mean']:+.4f}, 95% CI t [{d['ci_t'][0]:+.4f}, {d['ci_t'][1]:+.4f}], "
            f"bootstrap [{d['ci_bootstrap'][0]:+.4f}, {d['ci_bootstrap'][1]:+.4f}], "
            f"{d['wins']}/{d['ties']}/{d['losses']} W/T/L: {state}."
        )
    return ok, sentences


def keys_of(method: Method, found: Comparison) -> list[str]:
    """The table's columns: the main metric's scopes, fairness, then the claimed numbers."""
    main = found.main
    keys = [f"final.global.{main}", f"final.clients_mean.{main}", "final.fairness.std"]
    keys += ["final.fairness.worst"]
    keys += [c.key for c in method.claims if c.key.startswith(("final.", "best."))]
    keys += list(method.extra_metrics)
    return [k for k in dict.fromkeys(keys) if any(k in row for row in found.table.values())]


def section(
    method: Method,
    sets: Sequence[str],
    seeds: Sequence[int],
    out: Path,
    jobs: int,
    references: bool = True,
    executor: Executor | None = None,
) -> tuple[list[str], dict[str, Any]]:
    """Run one method's comparison (and ablations) and return its part of the page and its
    line in the summary table. Without ``references`` only the baseline and the method run
    (the verdict needs no more), and the section says the references were not run."""
    seeds_text = ",".join(map(str, seeds))
    specs = method.runspecs if references else method.runspecs[:2]
    reference = method.reference if method.reference in specs else method.baseline
    where = out / method.slug
    if method.shares:
        share_runs(out / method.shares, where, [method.baseline, "pooled", "solo"])
    found = compare(
        specs,
        seeds=seeds,
        out=where,
        base=[load_yaml(method.config)],
        sets=parse_sets(sets),
        jobs=jobs,
        executor=executor,
        reference=reference,
    )
    runs = load_runs(where, specs, seeds)
    # the median over seeds: a run resumed after a pause (or one that shared the machine
    # with more jobs) would stretch a mean
    seconds = {
        s: statistics.median(r.final["wall_seconds"] for r in done) for s, done in runs.items()
    }
    took = ", ".join(f"{s} {t / 60:.1f} min" for s, t in seconds.items())
    print(f"{method.slug}: {took} per run", flush=True)
    reproduced, sentences = judge(method, found, runs, seeds)
    keys = keys_of(method, found)
    figure = FIGURES / f"{method.slug}.png"
    figure.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(where / "compare.png", figure)
    lines = [
        f"## {method.name}: {'reproduced' if reproduced else 'not reproduced'}",
        "",
        f"**The paper.** {method.paper}",
        "",
        f"**Here.** {method.setting} Config `{method.config}`; training time per run on this "
        f"machine (median over seeds): {took}.",
        "",
        "```bash",
        command(specs, method.config, sets, seeds_text)
        + (f" --reference {reference}" if reference not in ("solo", specs[0]) else ""),
        "```",
        "",
        *(
            []
            if references
            else [
                "The references `pooled` and `solo` were not run for this section (CPU time: "
                "`--no-references`); the verdict needs only the baseline and the method.",
                "",
            ]
        ),
        f"Mean ± std over seeds {seeds_text} (final round, test split):",
        "",
        markdown_table(found.table, keys, headers=[label(k) for k in keys], labels=found.labels),
        convergence_note(found.convergence),
        "",
        f"![validation curves]({figure.relative_to('docs')})",
        "",
        f"Paired differences to {method.baseline} (runspec minus {method.baseline}, seed by "
        "seed; * in the per-client tables: significant):",
        "",
        rows_markdown(diff_rows(found.diff, keys)),
    ]
    metric = found.clients["metric"]
    lines += [
        f"Test {metric} per client (mean ± std over seeds):",
        "",
        rows_markdown(score_rows(found.clients, found.labels, method.highlight)),
        f"Paired gain in {metric} per client over {found.labels.get(reference, reference)}:",
        "",
        rows_markdown(gain_rows(found.clients, found.labels, method.highlight)),
    ]
    for claim in method.claims:  # a per-client claim in another metric than the main one
        if claim.key.startswith("client.") and claim.key[7:] != metric:
            other = clients_section(runs, claim.key[7:], reference, seeds)
            lines += [
                f"Paired gain in {claim.key[7:]} per client over {reference}:",
                "",
                rows_markdown(gain_rows(other, found.labels, method.highlight)),
            ]
    lines += [
        f"**Verdict: {'reproduced' if reproduced else 'not reproduced'}.** " + " ".join(sentences),
        "",
    ]
    lines += headroom(method, found)
    if method.diagnosis is not None:
        lines += method.diagnosis(method)
    for ablation in method.ablations:
        lines += ablation_section(method, ablation, sets, seeds, out, jobs, executor)
    summary = {
        "method": method.name,
        "claim": "; ".join(c.text for c in method.claims),
        "verdict": "reproduced" if reproduced else "not reproduced",
        "paired seeds": str(len(seeds)),
        "converged": ", ".join(
            f"{s}: {'yes' if c['converged'] else ('no' if c['converged'] is False else '?')}"
            for s, c in found.convergence.items()
        ),
    }
    return lines, summary


def share_runs(source: Path, where: Path, runspecs: Sequence[str]) -> None:
    """Hard-link the seed folders of ``runspecs`` from another method's comparison (same
    config) into ``where``, each where it is not there yet (seed by seed: a section run
    before with fewer seeds gets the new ones shared too); ``compare`` reuses a run only if
    its config is this comparison's, and continues or reruns it otherwise."""
    for spec in runspecs:
        for src in sorted((source / runspec_label(spec)).glob("seed*")):
            dst = where / runspec_label(spec) / src.name
            if src.is_dir() and not dst.exists():
                dst.parent.mkdir(parents=True, exist_ok=True)
                shutil.copytree(src, dst, copy_function=os.link)


def ablation_section(
    method: Method,
    ablation: Ablation,
    sets: Sequence[str],
    seeds: Sequence[int],
    out: Path,
    jobs: int,
    executor: Executor | None = None,
) -> list[str]:
    """One ablation: its question, command and paired differences."""
    pairs = [*sets, *ablation.sets]
    where = out / f"{method.slug}-ablation-{runspec_label(ablation.runspecs[-1])}"
    if not ablation.sets:  # the section's own runs of the same config are reused
        shared = [spec for spec in ablation.runspecs if spec in method.runspecs]
        share_runs(out / method.slug, where, shared)
    found = compare(
        list(ablation.runspecs),
        seeds=seeds,
        out=where,
        base=[load_yaml(method.config)],
        sets=parse_sets(pairs),
        jobs=jobs,
        executor=executor,
    )
    keys = keys_of(method, found)
    return [
        f"**Ablation: {ablation.question}**",
        "",
        "```bash",
        command(ablation.runspecs, method.config, pairs, ",".join(map(str, seeds))),
        "```",
        "",
        markdown_table(found.table, keys, headers=[label(k) for k in keys], labels=found.labels),
        rows_markdown(diff_rows(found.diff, keys)),
        answer(method, found, ablation.runspecs[0], ablation.runspecs[-1]),
        "",
    ]


def differences(
    method: Method, found: Comparison, spec: str, against: str
) -> list[tuple[Claim, dict[str, Any], str]]:
    """Per claimed number (per-client claims aside), ``spec`` minus ``against`` seed by seed,
    and its sentence: mean, t interval, wins/ties/losses."""
    out = []
    for claim in method.claims:
        values, base = per_seed(found, spec, claim.key), per_seed(found, against, claim.key)
        if values is None or base is None:
            continue
        d = paired_difference(values, base, higher_is_better=claim.higher)
        out.append(
            (
                claim,
                d,
                f"{claim.text}, {found.labels.get(spec, spec)} minus "
                f"{found.labels.get(against, against)}: {d['mean']:+.4f}, 95% CI t "
                f"[{d['ci_t'][0]:+.4f}, {d['ci_t'][1]:+.4f}], "
                f"{d['wins']}/{d['ties']}/{d['losses']} W/T/L",
            )
        )
    return out


def answer(method: Method, found: Comparison, first: str, last: str) -> str:
    """The ablation's answer: per claim, ``last`` minus ``first`` and whether it is more
    than seed noise."""
    parts = [
        f"{text}: {'a difference' if d['significant'] else 'no difference beyond seed noise'}."
        for _, d, text in differences(method, found, last, first)
    ]
    return "**Answer.** " + " ".join(parts) if parts else ""


def headroom(method: Method, found: Comparison) -> list[str]:
    """How far centralised training (``pooled``) lies above the baseline on each claimed
    number: the gap a method that corrects the federation's heterogeneity can close. Where
    ``pooled`` itself is not above the baseline beyond seed noise, the setting leaves such a
    method no measured gap, and a null verdict says little about the method."""
    found_gaps = (
        differences(method, found, "pooled", method.baseline) if "pooled" in found.table else []
    )
    if not found_gaps:
        return []
    gap = any(
        d["significant"] and (d["mean"] > 0 if claim.higher else d["mean"] < 0)
        for claim, d, _ in found_gaps
    )
    return [
        "**Headroom.** "
        + " ".join(f"{text}." for _, _, text in found_gaps)
        + (
            " Centralised training is above the baseline beyond seed noise: there is a "
            "federated gap here for the method to close."
            if gap
            else " Centralised training is not above the baseline beyond seed noise: this "
            "setting leaves no measured federated gap for the method to close."
        ),
        "",
    ]


HEADER = """# Results: does fedkit reproduce the papers?

Regenerated by `benchmarks/results_page.py` (do not edit by hand); this page came from

```bash
{command}
```

For each seed method, its paper's headline claim is tested in the closest real setting this
project's 2-core CPU machine can run (real data from `../shared/data`, pretrained weights
only where the paper uses them and only those available offline), **against its paper's
baseline on the same partition, initial model and client sampling per seed**, beside two
references: `pooled` (one model trained centrally on the union of the clients' training data
with the federation's number of steps: not federated, the upper reference of the FLamby
protocol) and `solo` (each client trains alone). Runs go on until the validation curves have
flattened: the seed-mean validation curve of the main metric moves less than 0.005 (its
least-squares trend) over the last fifth of the rounds; each section says so per runspec
and shows the curves.

A claim is **reproduced** when the paired difference (method minus baseline, seed by seed)
goes the paper's way and both its 95% intervals (paired t, and bootstrap with 10000
resamples) exclude 0; otherwise it is **not reproduced**, and the section says what was
measured and what explains it; its **headroom** (`pooled` minus the baseline on the claimed
numbers) says whether the setting leaves a federated gap for a method to close at all. The
settings are the papers' training recipes scaled to a CPU (image size, rounds, data);
nothing is tuned for one method that its baseline does not get.
Times are this machine's, with other jobs sharing it.
"""


def not_run(method: Method) -> dict[str, str]:
    """The summary line of a method this regeneration did not run (``--only``, or not yet)."""
    claim = "; ".join(c.text for c in method.claims)
    return {
        "method": method.name,
        "claim": claim,
        "verdict": "not run here",
        "paired seeds": "-",
        "converged": "-",
    }


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="smoke size: 2 rounds")
    parser.add_argument("--seeds", default="0,1,2,3,4", help="comma-separated seeds (>= 2)")
    parser.add_argument("--only", default="", help="comma-separated methods (default all)")
    parser.add_argument(
        "--no-references",
        default="",
        metavar="METHODS",
        help="comma-separated methods that run only with their baseline (the verdict), "
        "without pooled and solo (where their runs cost hours here); the page says so",
    )
    parser.add_argument(
        "--seeds-of",
        action="append",
        default=[],
        metavar="METHOD=SEEDS",
        help="another seed list for one method (e.g. fca=0,1,2 where its runs cost hours); "
        "the page says each method's number of paired seeds",
    )
    parser.add_argument("--jobs", type=int, default=1, help="runs at once (fedkit compare --jobs)")
    parser.add_argument(
        "--executor", default="local", help="local or ray (fedkit compare --executor)"
    )
    parser.add_argument("--address", help="the Ray cluster's head, HOST:PORT (--executor ray)")
    parser.add_argument("--out", type=Path, default=Path("runs/results-page"))
    parser.add_argument("--page", type=Path, default=Path("docs/results.md"))
    parser.add_argument("--note", default="", help="a paragraph for the page")
    args = parser.parse_args(argv)
    seeds = [int(s) for s in args.seeds.split(",")]
    try:
        executor = executor_for(args.executor, args.jobs, args.address)
    except FedkitError as err:
        parser.error(str(err))
    if len(seeds) < 2:
        parser.error("--seeds needs at least 2 seeds for paired differences")
    wanted = [m for m in METHODS if not args.only or m.slug in args.only.split(",")]
    seeds_of = {}
    for item in args.seeds_of:
        slug, _, listed = item.partition("=")
        if slug not in {m.slug for m in METHODS} or len(listed.split(",")) < 2:
            parser.error(f"--seeds-of expects METHOD=SEEDS with >= 2 seeds, got {item!r}")
        seeds_of[slug] = [int(s) for s in listed.split(",")]
    argv = sys.argv[1:] if argv is None else argv
    shown = ["NOTE" if i and argv[i - 1] == "--note" else a for i, a in enumerate(argv)]
    head = [HEADER.format(command=shlex.join(["python", "benchmarks/results_page.py", *shown]))]
    if args.note:
        head.append(f"NOTE: {args.note}\n")
    body: list[str] = []
    summary: list[dict[str, Any]] = []
    for n, method in enumerate(wanted):
        sets = list(method.quick) if args.quick else []
        out = args.out / ("quick" if args.quick else "runs")
        lines, line = section(
            method,
            sets,
            seeds_of.get(method.slug, seeds),
            out,
            args.jobs,
            references=method.slug not in args.no_references.split(","),
            executor=executor,
        )
        body += lines
        summary.append(line)
        missing = [m.name for m in wanted[n + 1 :]]
        tail = [f"\n(Not yet run in this regeneration: {', '.join(missing)}.)\n"] if missing else []
        rows = summary + [
            not_run(m) for m in METHODS if m.name not in {r["method"] for r in summary}
        ]
        table = rows_markdown([{k.capitalize(): v for k, v in r.items()} for r in rows])
        write_text(args.page, "\n".join([*head, table, *body, *tail]))  # a partial page survives
    print(f"wrote {args.page}")


if __name__ == "__main__":
    main()
