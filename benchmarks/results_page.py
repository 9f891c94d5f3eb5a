"""Regenerate ``docs/results.md``: does fedkit reproduce each seed method's paper?

For each of the five methods (``CLAIMS``) the page takes its paper's headline claim, runs
the closest real setting this machine can afford (a config in ``benchmarks/results/``) with
``fedkit compare BASELINE METHOD pooled solo`` over paired seeds, until the validation
curves have flattened (:mod:`fedkit_core.results.convergence`), and writes, per method: the
setting and its cost, the tables (mean ± std, paired differences to the baseline, every
client's gain over training alone, or over the baseline where the paper claims per-client
gains), the convergence of every runspec, the validation curves, the measurement of the
method's mechanism, and a **verdict** per claim (:func:`claim_verdict`): *reproduced* when
every claimed number moves the paper's way with a paired 95% interval that excludes 0
(per-client claims: Holm-adjusted paired t-tests over the clients), *inconclusive* when the
curves did not converge or the setting leaves no headroom where the claim failed, *not
reproduced* otherwise, with the ablation that shows why.

    python benchmarks/results_page.py                     # the committed page (hours on 2 cores)
    python benchmarks/results_page.py --only fedcb,fed-lwr
    python benchmarks/results_page.py --quick             # a smoke run: 2 rounds, 2 seeds
    python benchmarks/results_page.py --set KEY=VALUE     # one more config value everywhere

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
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
from scipy import stats

from fedkit_core.comparison import compare, executor_for
from fedkit_core.config import load_yaml, parse_sets
from fedkit_core.errors import FedkitError
from fedkit_core.fileio import write_text
from fedkit_core.metrics.paired import MIN_SEEDS_SIGNIFICANT, paired_difference
from fedkit_core.parallel import Executor
from fedkit_core.results.clients import client_values, clients_section, gain_rows, score_rows
from fedkit_core.results.compare import ENVIRONMENTS_DIFFER, Comparison, diff_rows, runspec_label
from fedkit_core.results.compare import metric_label as label
from fedkit_core.results.convergence import convergence_note
from fedkit_core.results.labels import value_range
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
        if self.per_client:
            return f"every client's test {self.key[7:]}"
        return label(self.key) + ("" if self.higher else " (lower is better)")

    @property
    def per_client(self) -> bool:
        return self.key.startswith("client.")


@dataclass(frozen=True)
class Number:
    """One claimed number: a claim's key, or, for a per-client claim, one client's score
    (``client.<metric>.<client id>``)."""

    claim: Claim
    key: str
    text: str


#: the family-wise error rate of a per-client claim: its clients' paired tests are
#: Holm-adjusted (Holm 1979, step-down Bonferroni) so that "every client gains" is not
#: read off the one of six clients that crossed 5% by chance
ALPHA = 0.05
#: the paired seeds of a section, unless it runs fewer where its runs cost hours here
SEEDS = (0, 1, 2, 3, 4)


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
    #: the paired seeds this CPU affords the section (``--seeds``/``--seeds-of`` override)
    seeds: tuple[int, ...] = SEEDS
    #: whether ``pooled`` and ``solo`` run beside it (False where they cost hours here and
    #: the verdict does not need them; ``--references`` runs them, the page says when not)
    references: bool = True
    quick: tuple[str, ...] = ("rounds=2",)
    extra_metrics: tuple[str, ...] = field(default=())
    #: a measurement without training that bears on the verdict (lines of the page)
    diagnosis: Callable[[Method], list[str]] | None = None
    #: the slug of a method with the same config whose baseline and reference runs this
    #: one reuses (they are the same runs: the run folders' configs are checked on reuse)
    shares: str = ""
    #: ``--set`` pairs of this section on top of its config (two sections, one config)
    sets: tuple[str, ...] = ()
    #: the measurement of the mechanism (lines of the page): what the method did, from the
    #: runs' results (``{runspec: [results of each seed]}``), and whether it did what the
    #: paper says it does
    #: (``where``: the comparison's folder, for what a run keeps beside its results)
    mechanism: Callable[[Method, Mapping[str, Sequence[Results]], Path], list[str]] | None = None

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
    from fedkit_fedcb.classifier import class_geometry, class_statistics
    from fedkit_fedcb.encoders import text_embeddings

    texts = [[t.format(n) for t in prompts] for n in names]
    mu, _ = class_statistics(text_embeddings(encoder, None, texts, names))
    found = class_geometry(mu)
    return found["mean_cos"], found["min_cos"], found["max_cos"]


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
        f"{paper[2]:.3f}). Near 1 the class vectors are nearly parallel and a unit feature "
        "can hardly tell the classes apart (ordinal grades of one disease named in words do "
        "that); the paper's classes are distinct diseases. (Computed by "
        "`benchmarks/results_page.py`'s `class_separation`.)",
        "",
    ]


def _mean_std(values: Sequence[float]) -> str:
    return f"{statistics.fmean(values):.4f} ± {statistics.pstdev(values):.4f}"


def _summaries(done: Sequence[Results], prefix: str) -> dict[str, list[float]]:
    """``{summary key: [value of each seed]}`` of the keys under ``prefix`` that every run
    recorded (a plugin's mechanism record, :func:`fedkit_core.plugin` summary hook)."""
    keys = [set(r.final.get("summary", {})) for r in done]
    common = sorted(set.intersection(*keys)) if keys else []
    return {k: [r.final["summary"][k] for r in done] for k in common if k.startswith(prefix)}


def fca_heads(method: Method, runs: Mapping[str, Sequence[Results]], where: Path) -> list[str]:
    """FCA's two heads on every client's own test set (``views``: ``global`` is the
    federated head of the global model, ``personal`` the client's personalised head), and
    G, S for the baseline and FCA: does the personalised head specialise, as the paper says?"""
    done = runs.get(method.method, [])
    if not done or "personal" not in done[0].final.get("views", {}):
        if "fca" not in method.method:  # an ablation between two runspecs without FCA
            return []
        return ["**Mechanism.** FCA's runs recorded no personalised view.", ""]
    views = [r.final["views"] for r in done]
    rows, pvalues = [], []
    for cid in done[0]["task"]["client_ids"]:
        fed = [v["global"]["clients"][cid]["bacc"] for v in views]
        own = [v["personal"]["clients"][cid]["bacc"] for v in views]
        d = paired_difference(own, fed)
        pvalues.append(paired_p(d["per_seed"]))
        rows.append((cid, fed, own, d))
    adjusted = holm(pvalues)
    table = [
        {
            "client": cid,
            "federated head": _mean_std(fed),
            "personalised head": _mean_std(own),
            "personalised - federated": f"{d['mean']:+.4f}",
            "Holm-adjusted p": f"{p:.3f}",
        }
        for (cid, fed, own, d), p in zip(rows, adjusted)
    ]
    better = [cid for (cid, _, _, d), p in zip(rows, adjusted) if p < ALPHA and d["mean"] > 0]
    worse = [cid for (cid, _, _, d), p in zip(rows, adjusted) if p < ALPHA and d["mean"] < 0]
    parts = []
    for spec in (method.baseline, method.method):
        seeds = runs.get(spec, [])
        if seeds:
            g = [r.final["global"]["bacc"] for r in seeds]
            c = [r.final["clients_mean"]["bacc"] for r in seeds]
            parts.append(f"{spec}: G {_mean_std(g)}, S {_mean_std(c)}")
    return [
        "**Mechanism: FCA's two heads, every client (test bACC on the client's own test "
        "set, final round).** The paper's mechanism is that each client's personalised head "
        "specialises (it beats the federated head on the client's own data) while anchoring "
        f"keeps the federated head general. Here the personalised head is better in "
        f"{len(better)} of {len(rows)} clients beyond seed noise"
        + (f" ({', '.join(better)})" if better else "")
        + f" and worse in {len(worse)}"
        + (f" ({', '.join(worse)})" if worse else "")
        + " (paired t-tests, Holm). "
        "Generalisation (G, the global model's federated head on the pooled test set) and "
        "specialisation (S, mean over clients of the head each serves): " + "; ".join(parts) + ".",
        "",
        rows_markdown(table),
        "Why a personalised head can lose to the federated one on its own client, measured "
        "on these runs' checkpoints by `benchmarks/fca_heads.py` (docs/plugins/fca.md, "
        "'Fed-ISIC2019: why the personalised head loses on some clients'): it keeps "
        "predicting classes the client never trained on (balanced softmax leaves their rows "
        "to weight decay), and S scores it with batch-norm statistics averaged over the "
        "centres rather than the client's own; the script re-scores each head with either "
        "corrected.",
        "",
    ]


def fedmas_weights(method: Method, runs: Mapping[str, Sequence[Results]], where: Path) -> list[str]:
    """Fed-MAS's aggregation weights against the clients' data shares (FedAvg's weights), from
    the runs' record (``fed-mas.weight.*``, ``fed-mas.size_share.*``, ``tv_from_size*``): the
    last round's, their range over the rounds, and a figure of both per round."""
    done = runs.get(method.method, [])
    record = _summaries(done, "fed-mas.")
    if "fed-mas.tv_from_size_mean" not in record:
        return ["**Mechanism.** The Fed-MAS runs recorded no aggregation weights.", ""]
    clients = done[0]["task"]["client_ids"]
    weights = {cid: _per_round(done, f"fed-mas.weight.{cid}") for cid in clients}
    shares = {cid: _per_round(done, f"fed-mas.size_share.{cid}") for cid in clients}
    table = [
        {
            "client": cid,
            "MAS weight, last round": _mean_std(
                record.get(f"fed-mas.weight.{cid}", [float("nan")])
            ),
            "MAS weight, range over rounds (seed mean)": (
                f"{min(weights[cid].values()):.3f} - {max(weights[cid].values()):.3f}"
            ),
            "data share (FedAvg's weight)": _mean_std(
                record.get(f"fed-mas.size_share.{cid}", [float("nan")])
            ),
        }
        for cid in clients
    ]
    classes = present_classes(done[0])
    inverse = {cid: 1 / classes[cid] for cid in clients}
    flat = {cid: v / sum(inverse.values()) for cid, v in inverse.items()}
    for row in table:
        row["classes present"] = str(classes[row["client"]])
        row["1/K, normalised"] = f"{flat[row['client']]:.3f}"
    last = {cid: statistics.fmean(record[f"fed-mas.weight.{cid}"]) for cid in clients}
    tv_flat = 0.5 * sum(abs(last[cid] - flat[cid]) for cid in clients)
    effect = _weight_effect(method, runs, last, record)
    for row in table:
        if effect:
            row[effect[0]] = f"{effect[1][row['client']]:+.3f}"
    from fedkit_fed_mas.mas import NORMALISED, RAW

    rf = done[0]["config"].get("fed-mas", {}).get("rf", RAW)  # a config without it: the default
    figure = FIGURES / (
        f"{method.slug}-weights.png" if rf == RAW else f"{method.slug}-weights-{rf}.png"
    )
    _plot_weights(weights, shares, figure)
    tv = record["fed-mas.tv_from_size_mean"]
    if rf == NORMALISED:
        form = "These runs use the authors' normalised rescue factor (`fed-mas.rf=normalised`)."
        what = (
            "What the normalised factor measures: with both per-class distance vectors "
            "normalised over the K classes a client has, the factor is K x (1/K)^2 = 1/K "
            "wherever the distances are about equal across classes, so the weights follow how "
            "many classes a client holds, whatever its distance to the prior."
        )
    else:
        form = "These runs use the paper's Eq. 3 as printed (`fed-mas.rf=raw`)."
        what = (
            "The raw factor also carries how far a client's features lie from the prior's "
            "overall, so unlike the normalised one it need not follow the class count."
        )
    what += _between_forms(runs, method.method, last, clients)
    return [
        "**Mechanism: whom MAS weighs.** The paper's mechanism is that the rescue factor moves "
        "the aggregation towards the clients whose features are far from the prior's, not "
        "towards the large ones. Total-variation distance between MAS's weights and the data "
        f"shares FedAvg uses, averaged over every round: {_mean_std(tv)} (0: MAS weighed as "
        f"FedAvg would; 1: disjoint). {form}",
        "",
        f"{what} Total-variation distance between the last round's MAS weights (seed mean) "
        f"and 1/K normalised: {tv_flat:.4f} (0: the weights are the class count alone; K "
        "counted in each client's training split by `fedkit data`'s loader)."
        + (effect[2] if effect else ""),
        "",
        rows_markdown(table),
        "",
        f"![Fed-MAS weights per round]({figure.relative_to('docs')})",
        "",
    ]


def _between_forms(
    runs: Mapping[str, Sequence[Results]],
    spec: str,
    weights: Mapping[str, float],
    clients: Sequence[str],
) -> str:
    """A sentence on how far ``weights`` (``spec``'s last round's, seed mean) lie from the
    last round's weights of the other Fed-MAS runspec in ``runs``, the other rescue factor;
    empty when no other runspec recorded Fed-MAS weights."""
    others = [_summaries(done, "fed-mas.weight.") for other, done in runs.items() if other != spec]
    found = [r for r in others if all(f"fed-mas.weight.{cid}" in r for cid in clients)]
    if not found:
        return ""
    record = found[0]
    theirs = {cid: statistics.fmean(record[f"fed-mas.weight.{cid}"]) for cid in clients}
    tv = 0.5 * sum(abs(weights[cid] - theirs[cid]) for cid in clients)
    return (
        " Total-variation distance between the last round's weights under the two rescue "
        f"factors (seed means): {tv:.4f} (0: both forms weigh the clients alike)."
    )


def _weight_effect(
    method: Method,
    runs: Mapping[str, Sequence[Results]],
    weights: Mapping[str, float],
    record: Mapping[str, list[float]],
) -> tuple[str, dict[str, float], str] | None:
    """Each client's change in its own test score against the baseline (seed means), its
    column name, and a sentence on how it follows the weight MAS moved to or from the client
    (its weight minus its data share; Spearman over the clients). None without the
    baseline's runs."""
    done, base = runs.get(method.method, []), runs.get(method.baseline, [])
    metric = done[0]["task"].get("main_metric") if done else None
    if not base or not metric:
        return None

    def mean(results: Sequence[Results], cid: str) -> float:
        return statistics.fmean(r.final["clients"][cid][metric] for r in results)

    change = {cid: mean(done, cid) - mean(base, cid) for cid in weights}
    moved = {
        cid: weights[cid] - statistics.fmean(record[f"fed-mas.size_share.{cid}"]) for cid in weights
    }
    rho = stats.spearmanr([moved[c] for c in weights], [change[c] for c in weights]).statistic
    cut = min(moved, key=moved.get)
    sentence = (
        f" The weight MAS moves (its weight minus the data share) and each client's change in "
        f"its own test {metric} against {method.baseline} have Spearman {rho:+.2f} over the "
        f"{len(weights)} clients; the client MAS cuts most, {cut} ({moved[cut]:+.3f}), "
        f"changes by {change[cut]:+.3f}."
    )
    return f"test {metric} change vs {method.baseline}", change, sentence


def present_classes(run: Results) -> dict[str, int]:
    """How many classes each client's training split holds, for ``run``'s config (the data
    loaded and split as the run did; a benchmark's look at its own data, not the protocol)."""
    from fedkit_core.federation import prepare
    from fedkit_core.resolve import resolve_config

    active = run["config"].get("plugins", [])  # the split is the task's: no plugin is set up
    bare = {k: v for k, v in run["config"].items() if k not in active} | {"plugins": []}
    config, plugins = resolve_config([bare])
    fed = prepare(config, plugins)
    return {cid: sum(int(n) > 0 for n in c.class_counts) for cid, c in fed.infos.items()}


def _per_round(done: Sequence[Results], key: str) -> dict[int, float]:
    """``{round: mean over seeds}`` of a summary ``key`` the runs recorded in their rounds."""
    values: dict[int, list[float]] = {}
    for r in done:
        for rec in r["rounds"]:
            if key in rec.get("summary", {}):
                values.setdefault(rec["round"], []).append(rec["summary"][key])
    return {k: statistics.fmean(v) for k, v in sorted(values.items()) if len(v) == len(done)}


def _plot_weights(
    weights: Mapping[str, Mapping[int, float]],
    shares: Mapping[str, Mapping[int, float]],
    path: Path,
) -> None:
    """Each client's aggregation weight per round (solid) beside its data share (dashed)."""
    import matplotlib

    from fedkit_core.results.plots import save_figure

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 3.6))
    for i, cid in enumerate(weights):
        colour = f"C{i}"
        ax.plot(list(weights[cid]), list(weights[cid].values()), color=colour, label=cid)
        ax.plot(list(shares[cid]), list(shares[cid].values()), color=colour, linestyle="--")
    ax.set_xlabel("round")
    ax.set_ylabel("aggregation weight")
    ax.set_title("Fed-MAS weights (solid) and data shares, FedAvg's weights (dashed)")
    ax.legend(fontsize=7, ncol=2)
    path.parent.mkdir(parents=True, exist_ok=True)
    save_figure(fig, path, ("png",))


def round_differences(
    runs: Mapping[str, Sequence[Results]], spec: str, base: str, metric: str
) -> dict[int, float]:
    """``{round: mean over seeds of spec minus base}`` of the pooled validation ``metric``,
    over the rounds both evaluated in every seed (the curves, paired seed by seed)."""

    def curve(r: Results) -> dict[int, float]:
        return {
            rec["round"]: rec["val"]["global"][metric]
            for rec in r["rounds"]
            if metric in rec.get("val", {}).get("global", {})
        }

    pairs = [(curve(a), curve(b)) for a, b in zip(runs.get(spec, []), runs.get(base, []))]
    if not pairs:
        return {}
    common = set.intersection(*(set(a) & set(b) for a, b in pairs))
    return {k: statistics.fmean(a[k] - b[k] for a, b in pairs) for k in sorted(common)}


def fedcb_geometry(method: Method, runs: Mapping[str, Sequence[Results]], where: Path) -> list[str]:
    """The frozen classifier each FedCB-type runspec trained with: its class vectors' mean,
    smallest and largest pairwise cosine (``fedcb.*_cos``, recorded by every run), and the
    per-round paired difference to the baseline (does a gain appear early and fade?)."""
    parts = []
    for spec, done in runs.items():
        record = _summaries(done, "fedcb.")
        if "fedcb.mean_cos" in record:
            parts.append(
                f"`{spec}`: mean pairwise cosine {statistics.fmean(record['fedcb.mean_cos']):.3f} "
                f"({statistics.fmean(record['fedcb.min_cos']):.3f} to "
                f"{statistics.fmean(record['fedcb.max_cos']):.3f})"
            )
    metric = method.claims[0].key.rsplit(".", 1)[1]
    diffs = round_differences(runs, method.method, method.baseline, metric)
    curve = ""
    if diffs:
        rounds = list(diffs)
        tail = rounds[len(rounds) - max(1, len(rounds) // 5) :]
        curve = (
            f" Per round, {method.method} minus {method.baseline} in validation {metric} (mean "
            f"over seeds): above 0 in {sum(v > 0 for v in diffs.values())} of {len(diffs)} "
            f"evaluated rounds, largest {max(diffs.values()):+.4f} (round "
            f"{max(diffs, key=diffs.get)}), mean over the last fifth "
            f"{statistics.fmean(diffs[k] for k in tail):+.4f}."
        )
    return [
        "**Mechanism: the frozen classifier's geometry.** The paper's mechanism is a classifier "
        "fixed before training whose class vectors keep the classes apart under label skew "
        "(near 0: nearly orthogonal; near 1: nearly parallel). Recorded by the runs: "
        + ("; ".join(parts) if parts else "nothing (no FedCB runspec here)")
        + "."
        + curve,
        "",
    ]


def fedlwr_weights(method: Method, runs: Mapping[str, Sequence[Results]], where: Path) -> list[str]:
    """How often Fed-LWR's layer weights were exactly uniform (``fed-lwr.uniform_share_all``),
    and how far they moved otherwise (``fed-lwr.max_dev``)."""
    record = _summaries(runs.get(method.method, []), "fed-lwr.")
    if "fed-lwr.uniform_share_all" not in record:
        return ["**Mechanism.** The Fed-LWR runs recorded no layer weights.", ""]
    share = record["fed-lwr.uniform_share_all"]
    off = statistics.fmean(share) > 0.5
    return [
        "**Mechanism: are the layers re-weighted?** The paper's mechanism gives the clients "
        "whose layers differ most from the uniform anchor more weight, layer by layer. Share "
        f"of layer weightings that were exactly uniform over all rounds: {_mean_std(share)} "
        f"(largest |rho - 1/K| in the last round: {_mean_std(record['fed-lwr.max_dev'])}): "
        + (
            "the method was switched off in most layers (every client's CKA above the clip)."
            if off
            else "the method re-weighted most layers."
        ),
        "",
    ]


def fedhelp_scores(method: Method, runs: Mapping[str, Sequence[Results]], where: Path) -> list[str]:
    """The contribution scores a_m each small client learned (from the client checkpoints of
    FedHelp's runs, :mod:`fedkit_fedhelp.scores`): do they move from uniform, towards which
    API? Also what the public batches may not do (BatchNorm statistics, see the plugin)."""
    from fedkit_fedhelp.scores import client_scores
    from fedkit_fedhelp.scores import statistics as score_statistics

    moved, mean_a = [], []
    for run_dir in sorted((where / runspec_label(method.method)).glob("seed*")):
        for logits in client_scores(run_dir).values():
            found = score_statistics(logits)
            moved.append(found["moved"])
            mean_a.append(found["mean_a"])
    text = (
        f"over the small clients of every seed, {statistics.fmean(moved):.1%} of the public "
        f"samples' scores moved more than 0.05 from uniform; mean a per API "
        f"{[round(statistics.fmean(col), 3) for col in zip(*mean_a)]}"
        if moved
        else "no client checkpoint with contribution scores was found (runs without checkpoints)"
    )
    return [
        "**Mechanism: what the small clients learned from the APIs.** The paper's mechanism "
        "weighs each API per public sample by a learned contribution score a_m. Here: "
        f"{text}. {api_knowledge(method)} The public batches no longer touch the shared "
        "backbone's BatchNorm running statistics (docs/plugins/fedhelp.md).",
        "",
    ]


def api_knowledge(method: Method) -> str:
    """What each API of FedHelp's knowledge file knows: its accuracy on the public labels and
    how often two APIs disagree (:func:`fedkit_priors.knowledge.api_agreement`). The APIs
    answer in the public set's classes, never the task's: what reaches the task is what the
    shared backbone learns from matching them."""
    from fedkit_priors.knowledge import api_agreement, load_knowledge

    path = Path(load_yaml(method.config)["fedhelp"]["knowledge"])
    if not path.is_file():
        return f"(No knowledge file at {path}: the APIs' answers were not measured.)"
    knowledge = load_knowledge(path)
    found = api_agreement(knowledge)

    def short(api: str) -> str:  # the API without its weights' path
        return f"`{api.partition('@')[0]}`"

    known = "; ".join(
        f"{short(api)} acc {found[f'{api} acc']:.3f}, bACC {found[f'{api} bacc']:.3f}"
        for api in knowledge.apis
        if f"{api} acc" in found
    )
    apart = "; ".join(
        f"{short(a)} and {short(b)} on {found[f'{a} vs {b} disagree']:.1%} of them"
        for i, a in enumerate(knowledge.apis)
        for b in knowledge.apis[i + 1 :]
    )
    return (
        f"The APIs answer in the public set's {len(knowledge.classes)} classes "
        f"({', '.join(knowledge.classes)}), not the task's: on the {len(knowledge.labels)} "
        f"public samples' labels {known or 'unknown'}; they disagree: {apart or '-'}."
    )


ISIC_RECIPE = (
    "Fed-ISIC2019 in FLamby's layout and split without BCN (5 centres = 5 clients, 8,667 "
    "training images), the offline ImageNet EfficientNet-Lite0 at 64 px (the papers: "
    "EfficientNet-B0 / ResNet-18 at 224 px) with the stem and stages 0-5 frozen and their "
    "outputs computed once per image (stage 6, the head convolution and the classifier train: "
    "0.9M of 3.4M parameters), FCA's augmentation (random flips, rotation by any angle, Gaussian "
    "blur; parameters in the config, the paper gives none) in 8 views per image computed "
    "once (by the first run of each seed and client, here FedAvg's and pooled's, whose times "
    "include it; the others read them from disk), "
    "balanced softmax for every runspec, Adam 1e-3 (wd 5e-4, state kept per client), one "
    "local epoch of batch 32, 20 rounds with lr x0.1 at rounds 15 and 18 (the paper's 60 and "
    "70 of 80: three quarters of the rounds at the working rate), gradient norm clipped at 5."
)

METHODS = [
    Method(
        "FCA",
        "fca",
        "Wicaksana et al., TMI 2023, Table 4: on Fed-ISIC2019 (six sites, 8 classes, ImageNet "
        "EfficientNet-B0, 80 rounds, Adam) FCA against FedAvg with balanced softmax: "
        "specialisation (each client's personalised head on its own test set) bACC 75.9 vs "
        "69.5, generalisation (the global model's federated head on the pooled test set) 74.3 "
        "vs 69.0, their mean (G&S) 75.1 vs 69.3.",
        ISIC_RECIPE,
        _cfg("isic2019"),
        "fedavg",
        "fca",
        (Claim("gs.bacc"),),
        mechanism=fca_heads,
        ablations=(
            Ablation(
                "is it the averaged batch-norm statistics? FCA with its batch-norm layers kept "
                "on each client (`bn: local`, as FedBN), so that S scores each personalised "
                "head with its client's own running statistics, against FCA as the paper "
                "scores it (statistics averaged over the centres).",
                ("fca", f"{CONFIGS}/fca-bn-local.yaml"),
            ),
            Ablation(
                "and for any federated model? FedBN (FedAvg with the batch-norm layers kept "
                "on each client) against FedAvg: whether averaged statistics are also why "
                "FedAvg trails each centre trained alone (`solo`) on the centre's own test set.",
                ("fedavg", "fedbn"),
            ),
        ),
    ),
    Method(
        "Fed-MAS",
        "fed-mas",
        "Elbatel et al. 2023, Table 3: on FLamby's Fed-ISIC2019 split (six hospitals, ImageNet "
        "ResNet-18, a frozen MoCo-v2 ResNet-50 prior, Adam 3e-4, 200 rounds x 10 local "
        "epochs) the global model's B-acc rises from 78.19 (BSM-FL: FedAvg with balanced "
        "softmax) to 80.87. (Its Tables 1-2 are HyperKvasir: B-acc 59.15 -> 61.61 non-IID, "
        "where the paper claims no tail-accuracy gain over BSM-FL, 16.4 -> 16.2; the tail "
        "gain is IID only.)",
        "The FCA setting above without the frozen-trunk cache (`freeze_cache=off`): Fed-MAS's "
        "prior reads the images, which the cache replaces, so both runspecs here compute "
        "stages 0-5 every batch (still frozen) and train on fresh random augmentations, and "
        "FedAvg is run again uncached beside it rather than taken from FCA's section (whose "
        "runs see 8 fixed views per image). The prior is a frozen ImageNet "
        "EfficientNet-Lite0 (the only pretrained image encoder offline; the paper: MoCo-v2 "
        "ResNet-50), the rescue factor the paper's Eq. 3 (`fed-mas.rf=raw`, fedkit's default; "
        "the authors' code normalises it, the ablation below).",
        _cfg("isic2019"),
        "fedavg",
        "fed-mas",
        (Claim("final.global.bacc"),),
        sets=("freeze_cache=off",),
        mechanism=fedmas_weights,
        seeds=(0, 1, 2),  # about an hour a Fed-MAS run
        references=False,
        ablations=(
            Ablation(
                "does the form of the rescue factor matter? Fed-MAS with the authors' "
                "normalised factor (`fed-mas.rf=normalised`: both per-class distance vectors "
                "normalised to sum 1, so a client's overall distance from the prior no longer "
                "counts) beside the section's FedAvg and Fed-MAS with the paper's Eq. 3.",
                ("fedavg", "fed-mas", f"{CONFIGS}/fed-mas-normalised.yaml"),
            ),
        ),
    ),
    Method(
        "FedCB pilot",
        "fedcb-pilot",
        "Zhu et al., MICCAI 2024, Table 1 (the pilot): on OCT-C8 over 12 clients, FedAvg with a "
        "frozen classifier of random vectors already beats FedAvg: accuracy 76.11 vs 74.82 at "
        "Dirichlet 0.05, 82.67 vs 78.64 at 0.1.",
        "The paper's pilot where it has the best chance here: RetinaMNIST at 28 px, 10 clients "
        "with a Dirichlet(0.1) label skew, every client in every round, 200 rounds, the small "
        "CNN from scratch, the authors' optimiser (SGD 0.01, momentum 0.9, lr x0.99 per round, "
        "batch 8, 2 local epochs; the paper's text says Adam 1e-2), both with cross-entropy; "
        "the claim is the test accuracy and macro F1 of the round best on validation.",
        _cfg("retina-fedcb"),
        f"{CONFIGS}/fedavg-ce.yaml",
        f"{CONFIGS}/fedcb-random.yaml",
        (Claim("best.global.acc"), Claim("best.global.f1_macro")),
        sets=("partition.alpha=0.1", "sample_fraction=1.0"),
        mechanism=fedcb_geometry,
        seeds=(0, 1, 2),
        references=False,
    ),
    Method(
        "FedCB",
        "fedcb",
        "Zhu et al., MICCAI 2024, Table 2: on OCT-C8 (8 retinal diseases, 12 clients, half "
        "sampled per round, ResNet-18 from scratch, 200 rounds) a frozen classifier from a "
        "language model's class-name embeddings raises FedAvg's accuracy from 74.82 to 79.14 "
        "at Dirichlet 0.05 (and 78.64 to 85.00 at 0.1, next section).",
        "Fed-ISIC2019's pooled training images re-split Dirichlet(0.05) over 10 clients, half "
        "sampled per round, the task's real class names (8 skin lesions), the small CNN from "
        "scratch at 32 px, 100 rounds, the authors' optimiser (SGD 0.01, momentum 0.9, lr x0.99 "
        "per round, batch 8, 2 local epochs; the paper's text says Adam 1e-2), the offline "
        "all-MiniLM-L6-v2 text encoder (the paper: BiomedCLIP), T = 17.5; both runspecs with "
        "cross-entropy; the claims are the test accuracy and macro F1 of the round best on "
        "validation.",
        _cfg("isic-fedcb"),
        f"{CONFIGS}/fedavg-ce.yaml",
        f"{CONFIGS}/fedcb.yaml",
        (Claim("best.global.acc"), Claim("best.global.f1_macro")),
        mechanism=fedcb_geometry,
        diagnosis=class_separation,
        seeds=(0, 1, 2),  # 10-19 min a run
        references=False,
        ablations=(
            Ablation(
                "is it the class vectors? FedCB with the paper's ablation, a frozen classifier "
                "of random unit vectors, against FedCB with the text encoder's class vectors: "
                "if the language model's geometry is what helps, the text vectors win.",
                (f"{CONFIGS}/fedcb-random.yaml", f"{CONFIGS}/fedcb.yaml"),
            ),
        ),
    ),
    Method(
        "FedCB at Dirichlet 0.1",
        "fedcb-0.1",
        "Zhu et al., MICCAI 2024, Table 2: on OCT-C8 at Dirichlet 0.1, accuracy 78.64 (FedAvg) "
        "to 85.00 (FedCB).",
        "The FedCB setting above at Dirichlet(0.1), T = 12.5 (the authors' OCT value at 0.1).",
        _cfg("isic-fedcb"),
        f"{CONFIGS}/fedavg-ce.yaml",
        f"{CONFIGS}/fedcb.yaml",
        (Claim("best.global.acc"), Claim("best.global.f1_macro")),
        sets=("partition.alpha=0.1", "fedcb.temperature=12.5"),
        mechanism=fedcb_geometry,
        seeds=(0, 1, 2),
        references=False,
    ),
    Method(
        "Fed-LWR",
        "fed-lwr",
        "Yan et al., MICCAI 2024, Table 1: on ProstateMRI (6 sites) the std of Dice across "
        "sites falls from 4.54 to 0.97 and the mean Dice rises from 88.78 to 93.25 against "
        "FedAvg.",
        "Retinal vessels at two real sites (DRIVE, CHASE_DB1) at 128 px, U-Net 8-64 channels "
        "from scratch (as the paper), the paper's training setting (Dice loss, Adam 1e-3 kept "
        "across rounds, batch 8, 1 local epoch), CKA on the training data, the authors' clip "
        "of CKA at 0.99 (`fed-lwr.weighting=clipped`; the ablation below runs Eq. 5 as printed).",
        _cfg("drive-chase"),
        "fedavg",
        "fed-lwr",
        (Claim("final.fairness.std", higher=False), Claim("final.clients_mean.dice")),
        mechanism=fedlwr_weights,
        ablations=(
            Ablation(
                "is it the clip? Fed-LWR with the paper's Eq. 5 as printed (no 0.99 clip, "
                "every layer re-weighted) against the authors' clip.",
                ("fed-lwr", f"{CONFIGS}/fed-lwr-eq5.yaml"),
            ),
        ),
    ),
    Method(
        "FedHelp",
        "fedhelp",
        "Wang and Lyu, KDD 2025, Table 3: on the chest X-ray pneumonia set with six clients "
        "holding 60/20/8/6/4/2% of the data (two large), FedHelp's accuracy per client is "
        "0.904/0.885/0.846/0.803/0.801/0.765 against FedAvg's 0.786/0.769/0.746/0.723/0.669/"
        "0.649: +8.1 to +13.3 points over FedAvg on every client (the paper's '+2.3% to "
        "+11.6%' is the relative gain over the best baseline of each client, not over FedAvg).",
        "The Kermany chest X-rays (task `pneumonia-cxr`, train 5,216, the official test 624) "
        "at 64 px grey with the paper's six fractions (c0, c1 large), the small CNN as the "
        "shared small model and a CIFAR ResNet-20 as the large private one (the paper: "
        "ResNet-20 and ResNet-110), 20 rounds of SGD 0.05 with lr x0.1 at rounds 14 and 17 for "
        "every runspec, offline knowledge from two frozen pretrained encoders with linear "
        "probes on RetinaMNIST's images as the public set (not the task's data; the paper: "
        "CLIP zero-shot on CIFAR-100); public batches leave the BatchNorm statistics alone.",
        _cfg("chest-fedhelp"),
        "fedavg",
        "fedhelp",
        (Claim("client.acc"),),
        reference="fedavg",
        highlight=("c5",),
        mechanism=fedhelp_scores,
        seeds=(0, 1, 2),
    ),
]


@dataclass(frozen=True)
class Outside:
    """An outside reference on the same data and recipe: a benchmark's strategies, each
    centre alone and pooled, beside the numbers its paper published (no claim, no verdict)."""

    name: str
    slug: str
    source: str
    config: str
    runspecs: tuple[str, ...]
    #: ``{runspec: the published number and where it is from}``; others: not sourced here
    published: Mapping[str, str]
    shares: str = ""
    #: what else a reader needs to read the numbers (e.g. which options were left untuned)
    note: str = ""
    seeds: tuple[int, ...] = SEEDS


FLAMBY = Outside(
    "FLamby's Fed-ISIC2019 benchmark",
    "flamby",
    "Ogier du Terrail et al., FLamby, NeurIPS 2022 Datasets and Benchmarks, on all six "
    "centres with EfficientNet-B0 at 200 px: pooled training about 0.76 balanced accuracy, "
    "FedAvg about 0.53-0.58 depending on strategy and tuning (as quoted in "
    "../shared/data/README.md and issue 42; the per-strategy table is not available offline, "
    "so only those two are printed).",
    _cfg("isic2019"),
    (
        "fedavg",
        "fedprox",
        "scaffold",
        "cyclic",
        "fedadam",
        "fedyogi",
        "fedadagrad",
        "pooled",
        "solo",
    ),
    {"pooled": "about 0.76", "fedavg": "about 0.53 (0.53-0.58 over strategies)"},
    shares="fca",
    seeds=(0, 1, 2),
    note="Every strategy's own options are fedkit's defaults, untuned (FLamby tuned each "
    "strategy's learning rates on its benchmark): FedProx mu 0.01; FedAdam, FedYogi and "
    "FedAdagrad a server step of eta 0.01, tau 1e-3 on top of the clients' Adam 1e-3, a "
    "step that can be large for a fine-tuned network.",
)

#: the page's sections, in order: the methods, FLamby's benchmark after the two ISIC methods
SECTIONS: list[Method | Outside] = [*METHODS[:2], FLAMBY, *METHODS[2:]]


def command(specs: Sequence[str], config: str, sets: Sequence[str], seeds: str) -> str:
    """The ``fedkit compare`` command that reproduces one comparison."""
    parts = ["fedkit", "compare", *specs, "--config", config]
    for pair in sets:
        parts += ["--set", pair]
    return shlex.join([*parts, "--seeds", seeds])


def load_runs(out: Path, specs: Sequence[str], seeds: Sequence[int]) -> dict[str, list[Results]]:
    """The runs a comparison in ``out`` made, ``{runspec: [results of each seed]}``."""
    return {s: [Results.load(out / runspec_label(s) / f"seed{k}") for k in seeds] for s in specs}


def per_seed(
    found: Comparison,
    spec: str,
    key: str,
    runs: Mapping[str, Sequence[Results]] | None = None,
) -> list[float] | None:
    """A compared number of ``spec``, seed by seed (``gs.<m>``: the mean of the global and
    the clients' mean ``m``; ``client.<m>.<id>``: that client's final test ``m``, read from
    ``runs``). ``None`` where it was not measured (a per-client claim as a whole, too: its
    numbers are its clients', see :func:`numbers`)."""
    if key.startswith("client."):
        metric, _, cid = key[7:].partition(".")
        if not cid or runs is None or spec not in runs:
            return None
        values = client_values(runs[spec], metric).get(cid)
        return None if values is None or None in values else [float(v) for v in values]
    row = found.table.get(spec, {})
    if key.startswith("gs."):
        g, c = row.get(f"final.global.{key[3:]}"), row.get(f"final.clients_mean.{key[3:]}")
        if g is None or c is None:
            return None
        return [(a + b) / 2 for a, b in zip(g["per_seed"], c["per_seed"])]
    entry = row.get(key)
    return None if entry is None else list(entry["per_seed"])


def numbers(claim: Claim, runs: Mapping[str, Sequence[Results]]) -> list[Number]:
    """The numbers a claim is judged on: itself, or one per client for a per-client claim
    (the clients the runs scored, in their order)."""
    if not claim.per_client:
        return [Number(claim, claim.key, claim.text)]
    ids = dict.fromkeys(
        cid for done in runs.values() for r in done for cid in r["task"]["client_ids"]
    )
    metric = claim.key[7:]
    return [Number(claim, f"client.{metric}.{cid}", f"{cid}'s test {metric}") for cid in ids]


def headroom_key(number: Number) -> tuple[str, str]:
    """The key (and its text) on which ``pooled`` bounds a claimed number: the number itself,
    except FCA's G&S average, of which ``pooled`` (one model on the union of the data,
    scored on the pooled test set) bounds only the generalisation part (G); a personalised
    head on its own client's test set (S) can beat a pooled model, so nothing here bounds S."""
    if number.key.startswith("gs."):
        metric = number.key[3:]
        return f"final.global.{metric}", f"its generalisation part (G: global {metric})"
    return number.key, number.text


def holm(pvalues: Sequence[float]) -> list[float]:
    """Holm's step-down adjusted p-values (in the order given): the k-th smallest of m is
    multiplied by m - k + 1, then made monotone; reject where the adjusted p < ALPHA."""
    order = sorted(range(len(pvalues)), key=lambda i: pvalues[i])
    adjusted, running = [0.0] * len(pvalues), 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (len(pvalues) - rank) * pvalues[i]))
        adjusted[i] = running
    return adjusted


def paired_p(d: Sequence[float]) -> float:
    """The two-sided paired t-test p-value of the seed differences ``d`` (H0: mean 0); 1
    below :data:`MIN_SEEDS_SIGNIFICANT` seeds, as the page's intervals never count there."""
    d = np.asarray(d, dtype=np.float64)
    if len(d) < MIN_SEEDS_SIGNIFICANT:
        return 1.0
    if np.ptp(d) == 0:  # no spread: the t statistic is 0/0 (all ties) or infinite
        return 1.0 if d[0] == 0 else 0.0
    return float(stats.ttest_1samp(d, 0.0).pvalue)


@dataclass(frozen=True)
class Tested:
    """One claimed number, ``spec`` minus ``against`` seed by seed: the paired difference,
    (per-client claims) the Holm-adjusted p-value, whether it goes the paper's way beyond
    seed noise, and its sentence."""

    number: Number
    d: dict[str, Any]
    p_holm: float | None
    holds: bool
    text: str

    @property
    def reversed(self) -> bool:
        return self.significant and not self.holds

    @property
    def significant(self) -> bool:
        return self.d["significant"] if self.p_holm is None else self.p_holm < ALPHA


def paired_numbers(
    method: Method,
    found: Comparison,
    runs: Mapping[str, Sequence[Results]],
    spec: str,
    against: str,
    bound: bool = False,
) -> tuple[list[Tested], list[Number]]:
    """Every claimed number of ``method``, ``spec`` minus ``against``: the tested ones and
    those not measured. Per-client claims: each client's paired t-test, Holm-adjusted over
    the claim's clients (``significant`` then means adjusted p < ALPHA). ``bound``: on the
    :func:`headroom_key` of each number (``pooled``'s headroom)."""
    tested, missing = [], []
    for claim in method.claims:
        rows = []
        for number in numbers(claim, runs):
            key, text = headroom_key(number) if bound else (number.key, number.text)
            values = per_seed(found, spec, key, runs)
            base = per_seed(found, against, key, runs)
            if values is None or base is None:
                missing.append(number)
                continue
            rows.append(
                (
                    number,
                    text,
                    paired_difference(
                        values, base, higher_is_better=claim.higher, bounds=value_range(key)
                    ),
                )
            )
        adjusted = holm([paired_p(d["per_seed"]) for _, _, d in rows]) if claim.per_client else []
        for k, (number, text, d) in enumerate(rows):
            p = adjusted[k] if claim.per_client else None
            better = d["mean"] > 0 if claim.higher else d["mean"] < 0
            significant = d["significant"] if p is None else p < ALPHA
            sentence = (
                f"{text}, {found.labels.get(spec, spec)} minus "
                f"{found.labels.get(against, against)}: {d['mean']:+.4f}, 95% CI t "
                f"[{d['ci_t'][0]:+.4f}, {d['ci_t'][1]:+.4f}], "
                + (
                    f"bootstrap [{d['ci_bootstrap'][0]:+.4f}, {d['ci_bootstrap'][1]:+.4f}], "
                    if p is None
                    else f"Holm-adjusted p {p:.3f}, "
                )
                + f"{d['wins']}/{d['ties']}/{d['losses']} W/T/L"
            )
            tested.append(Tested(number, d, p, bool(significant and better), sentence))
    return tested, missing


#: the three verdicts, and what each says
REPRODUCED, NOT_REPRODUCED, INCONCLUSIVE = "reproduced", "not reproduced", "inconclusive"


def converged(method: Method, found: Comparison) -> bool:
    """Whether the baseline's and the method's validation curves met the convergence rule
    (a runspec whose curve could not be judged, too few evaluations, does not count)."""
    return all(
        found.convergence.get(spec, {}).get("converged") is not False
        for spec in (method.baseline, method.method)
    )


def claim_verdict(
    tested: Sequence[Tested], gaps: Mapping[str, bool] | None, settled: bool
) -> tuple[str, str]:
    """One claim's verdict from its tested numbers: *reproduced* when every number goes the
    paper's way beyond seed noise and the curves converged; *inconclusive* when the curves
    did not converge, or every number that failed (none reversed) had no headroom (``pooled``
    not above the baseline on it: the setting leaves the method nothing to close);
    otherwise *not reproduced*. ``gaps``: ``{number key: pooled above the baseline}``, None
    when ``pooled`` was not run. Returns the verdict and its reason."""
    if not tested:
        return NOT_REPRODUCED, "not measured"
    if not settled:
        return INCONCLUSIVE, "the validation curves did not converge"
    failed = [t for t in tested if not t.holds]
    if not failed:
        return REPRODUCED, "every number goes the paper's way beyond seed noise"
    if any(t.reversed for t in failed):
        return NOT_REPRODUCED, "the method is significantly worse on " + ", ".join(
            t.number.text for t in failed if t.reversed
        )
    if gaps is not None and not any(gaps.get(t.number.key, True) for t in failed):
        return INCONCLUSIVE, "no headroom where it failed: pooled is not above the baseline there"
    reason = "no difference beyond seed noise on " + ", ".join(t.number.text for t in failed)
    return NOT_REPRODUCED, reason + ("" if gaps is not None else " (headroom not measured)")


def judge(
    method: Method,
    found: Comparison,
    runs: Mapping[str, Sequence[Results]],
    seeds: Sequence[int],
) -> tuple[str, list[str]]:
    """The section's verdict and one sentence per claim. Each claim gets
    :func:`claim_verdict`; the section is reproduced when every claim is, not reproduced
    when one is not, inconclusive otherwise."""
    tested, missing = paired_numbers(method, found, runs, method.method, method.baseline)
    gaps = gap_table(method, found, runs)
    settled = converged(method, found)
    verdicts, sentences = [], []
    for claim in method.claims:
        mine = [t for t in tested if t.number.claim == claim]
        absent = [n for n in missing if n.claim == claim]
        verdict, reason = (
            claim_verdict(mine, gaps, settled)
            if not absent
            else (
                NOT_REPRODUCED,
                "not measured: " + ", ".join(n.text for n in absent),
            )
        )
        verdicts.append(verdict)
        if claim.per_client and mine:
            good = [t.number.key.rsplit(".", 1)[1] for t in mine if t.holds]
            bad = [t.number.key.rsplit(".", 1)[1] for t in mine if t.reversed]
            means = ", ".join(
                f"{t.number.key.rsplit('.', 1)[1]} {t.d['mean']:+.3f} (p {t.p_holm:.3f})"
                for t in mine
            )
            detail = (
                f"{len(good)} of {len(mine)} clients gain significantly (paired t-tests, "
                f"Holm-adjusted over the {len(mine)} clients, family-wise {ALPHA:.0%})"
                + (f", {len(bad)} lose significantly ({', '.join(bad)})" if bad else "")
                + f" (means, adjusted p: {means})"
            )
        else:
            detail = "; ".join(t.text for t in mine)
        head = f"{claim.text}: " if claim.per_client else ""  # a number's text names it
        sentences.append(f"{head}{detail}: **{verdict}** ({reason}).")
    if all(v == REPRODUCED for v in verdicts):
        return REPRODUCED, sentences
    return (NOT_REPRODUCED if NOT_REPRODUCED in verdicts else INCONCLUSIVE), sentences


def gap_table(
    method: Method, found: Comparison, runs: Mapping[str, Sequence[Results]]
) -> dict[str, bool] | None:
    """``{number key: pooled above the baseline beyond seed noise on it}`` (its
    :func:`headroom_key`), or None when ``pooled`` was not run."""
    if "pooled" not in found.table:
        return None
    tested, _ = paired_numbers(method, found, runs, "pooled", method.baseline, bound=True)
    return {t.number.key: t.holds for t in tested}


def keys_of(method: Method, found: Comparison) -> list[str]:
    """The table's columns: the main metric's scopes, fairness, then the claimed numbers."""
    main = found.main
    keys = [f"final.global.{main}", f"final.clients_mean.{main}", "final.fairness.std"]
    keys += ["final.fairness.worst"]
    keys += [c.key for c in method.claims if c.key.startswith(("final.", "best."))]
    keys += list(method.extra_metrics)
    return [k for k in dict.fromkeys(keys) if any(k in row for row in found.table.values())]


def cost(runs: Mapping[str, Sequence[Results]], skip: Sequence[str] = ()) -> float:
    """Training time of the runs in hours (each run's wall seconds, summed; the runspecs
    in ``skip`` are shared with another section, which counts them)."""
    return (
        sum(
            r.final.get("wall_seconds", 0.0)
            for s, done in runs.items()
            if s not in skip
            for r in done
        )
        / 3600
    )


def run_comparison(
    runspecs: Sequence[str],
    where: Path,
    config: str,
    sets: Sequence[str],
    seeds: Sequence[int],
    jobs: int,
    executor: Executor | None,
    reference: str | None = None,
) -> Comparison:
    """``fedkit compare`` of ``runspecs`` on a page config with ``sets`` on top, into ``where``
    (finished runs are reused, so a regenerated page trains only what is missing)."""
    return compare(
        list(runspecs),
        seeds=seeds,
        out=where,
        base=[load_yaml(config)],
        sets=parse_sets(sets),
        jobs=jobs,
        executor=executor,
        reference=reference,
    )


def section(
    method: Method,
    sets: Sequence[str],
    seeds: Sequence[int],
    out: Path,
    jobs: int,
    references: bool = True,
    executor: Executor | None = None,
    ablations: bool = True,
) -> tuple[list[str], dict[str, Any]]:
    """Run one method's comparison (and ablations) and return its part of the page and its
    line in the summary table. Without ``references`` only the baseline and the method run
    (the verdict needs no more), and the section says the references were not run; without
    ``ablations`` the section names the ablations it did not run."""
    seeds_text = ",".join(map(str, seeds))
    sets = [*method.sets, *sets]
    specs = method.runspecs if references else method.runspecs[:2]
    reference = method.reference if method.reference in specs else method.baseline
    where = out / method.slug
    shared = [method.baseline, "pooled", "solo"] if method.shares else []
    if method.shares:
        share_runs(out / method.shares, where, shared)
    found = run_comparison(specs, where, method.config, sets, seeds, jobs, executor, reference)
    runs = load_runs(where, specs, seeds)
    # the median over seeds: a run resumed after a pause (or one that shared the machine
    # with more jobs) would stretch a mean
    seconds = {
        s: statistics.median(r.final["wall_seconds"] for r in done) for s, done in runs.items()
    }
    took = ", ".join(f"{s} {t / 60:.1f} min" for s, t in seconds.items())
    hours = cost(runs, shared)
    print(f"{method.slug}: {took} per run", flush=True)
    verdict, sentences = judge(method, found, runs, seeds)
    keys = keys_of(method, found)
    figure = FIGURES / f"{method.slug}.png"
    figure.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(where / "compare.png", figure)
    lines = [
        f"## {method.name}: {verdict}",
        "",
        f"**The paper.** {method.paper}",
        "",
        f"**Here.** {method.setting} Config `{method.config}`; training time per run on this "
        f"machine (median over seeds): {took}; the section's runs took {hours:.2f} h of "
        "training in all"
        + (
            f" (the runs of {', '.join(shared)} are {method.shares}'s, counted there)"
            if shared
            else ""
        )
        + ".",
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
                "The references `pooled` and `solo` were not run for this section (CPU time; "
                f"`--references {method.slug}` runs them); the verdict needs only the baseline "
                "and the method, and without `pooled` the headroom is not measured.",
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
        *(
            [f"**Warning: {ENVIRONMENTS_DIFFER}.** " + "; ".join(found.environments) + ".", ""]
            if found.environments
            else []
        ),
        f"Paired differences to {method.baseline} (runspec minus {method.baseline}, seed by "
        "seed; * in the per-client tables: significant, unadjusted):",
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
        if claim.per_client and claim.key[7:] != metric:
            other = clients_section(runs, claim.key[7:], reference, seeds)
            lines += [
                f"Paired gain in {claim.key[7:]} per client over {reference}:",
                "",
                rows_markdown(gain_rows(other, found.labels, method.highlight)),
            ]
    lines += [f"**Verdict: {verdict}.** " + " ".join(sentences), ""]
    lines += headroom(method, found, runs)
    if method.mechanism is not None:
        lines += method.mechanism(method, runs, where)
    if method.diagnosis is not None:
        lines += method.diagnosis(method)
    if ablations:
        for ablation in method.ablations:
            more, spent = ablation_section(method, ablation, sets, seeds, out, jobs, executor)
            lines += more
            hours += spent
    else:
        lines += unrun_ablations(method)
    summary = {
        "method": method.name,
        "claim": "; ".join(c.text for c in method.claims),
        "verdict": verdict,
        "paired seeds": str(len(seeds)),
        "converged": ", ".join(
            f"{s}: {'yes' if c['converged'] else ('no' if c['converged'] is False else '?')}"
            for s, c in found.convergence.items()
        ),
        "cost (h)": f"{hours:.2f}",
    }
    return lines, summary


def outside_section(
    ref: Outside,
    sets: Sequence[str],
    seeds: Sequence[int],
    out: Path,
    jobs: int,
    executor: Executor | None = None,
) -> tuple[list[str], dict[str, Any]]:
    """An outside benchmark's strategies on this page's data and recipe, its published
    numbers beside ours: the ordering of the strategies and the pooled - FedAvg gap."""
    where = out / ref.slug
    shared = ["fedavg", "pooled", "solo"] if ref.shares else []
    if ref.shares:
        share_runs(out / ref.shares, where, shared)
    found = run_comparison(ref.runspecs, where, ref.config, sets, seeds, jobs, executor)
    runs = load_runs(where, ref.runspecs, seeds)
    hours = cost(runs, shared)
    main = f"final.global.{found.main}"
    ours = {s: found.table[s][main]["mean"] for s in ref.runspecs if main in found.table[s]}
    order = sorted(ours, key=lambda s: -ours[s])
    rows = [
        {
            "runspec": found.labels.get(s, s),
            f"global {found.main}, here": (
                f"{found.table[s][main]['mean']:.4f} ± {found.table[s][main]['std']:.4f}"
                if s in ours
                else "-"
            ),
            f"clients' mean {found.main}, here": (
                "{mean:.4f} ± {std:.4f}".format(
                    **found.table[s][f"final.clients_mean.{found.main}"]
                )
                if f"final.clients_mean.{found.main}" in found.table[s]
                else "-"
            ),
            "rank here": str(order.index(s) + 1) if s in ours else "-",
            f"{ref.name}, published": ref.published.get(s, "not sourced here"),
        }
        for s in ref.runspecs
    ]
    gap = ""
    if {"pooled", "fedavg"} <= set(ours):
        d = paired_difference(
            per_seed(found, "pooled", main) or [], per_seed(found, "fedavg", main) or []
        )
        gap = (
            f"Pooled minus FedAvg here: {d['mean']:+.4f}, 95% CI t [{d['ci_t'][0]:+.4f}, "
            f"{d['ci_t'][1]:+.4f}] (published: about +0.18 to +0.23 from the numbers above, "
            "on six centres at 200 px)."
        )
    lines = [
        f"## {ref.name}: an outside reference",
        "",
        f"**The benchmark.** {ref.source}",
        "",
        f"**Here.** The FCA setting's data and recipe (config `{ref.config}`), every "
        "strategy with balanced softmax as the runs above; `solo` is FLamby's 'each centre "
        "alone' (scored here on each centre's own test set). "
        + (f"{ref.note} " if ref.note else "")
        + f"The section's runs took {hours:.2f} h of training"
        + (f" (fedavg, pooled and solo are {ref.shares}'s, counted there)" if shared else "")
        + ".",
        "",
        "```bash",
        command(ref.runspecs, ref.config, sets, ",".join(map(str, seeds))),
        "```",
        "",
        rows_markdown(rows),
        convergence_note(found.convergence),
        "",
        "Ordering here (global test bACC, final round): " + " > ".join(order) + ". " + gap,
        "",
    ]
    summary = {
        "method": ref.name,
        "claim": "outside reference: ordering and pooled - FedAvg gap",
        "verdict": "reference",
        "paired seeds": str(len(seeds)),
        "converged": ", ".join(
            f"{s}: {'yes' if c['converged'] else ('no' if c['converged'] is False else '?')}"
            for s, c in found.convergence.items()
        ),
        "cost (h)": f"{hours:.2f}",
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


def unrun_ablations(method: Method) -> list[str]:
    """The lines that name a section's ablations skipped with ``--no-ablations``, so that a
    page never reads as though its method had none."""
    if not method.ablations:
        return []
    plural = "s" if len(method.ablations) > 1 else ""
    asked = "; ".join(f"*{a.question}*" for a in method.ablations)
    return [
        f"Not run in this regeneration (CPU time: `--no-ablations`): the ablation{plural} {asked}",
        "",
    ]


def ablation_section(
    method: Method,
    ablation: Ablation,
    sets: Sequence[str],
    seeds: Sequence[int],
    out: Path,
    jobs: int,
    executor: Executor | None = None,
) -> tuple[list[str], float]:
    """One ablation: its question, command and paired differences, and the hours its own
    runs took (those shared with the section are counted there)."""
    pairs = [*sets, *ablation.sets]
    where = out / f"{method.slug}-ablation-{runspec_label(ablation.runspecs[-1])}"
    shared: list[str] = []
    if not ablation.sets:  # the section's own runs of the same config are reused
        shared = [spec for spec in ablation.runspecs if spec in method.runspecs]
        share_runs(out / method.slug, where, shared)
    found = run_comparison(ablation.runspecs, where, method.config, pairs, seeds, jobs, executor)
    runs = load_runs(where, ablation.runspecs, seeds)
    keys = keys_of(method, found)
    lines = [
        f"**Ablation: {ablation.question}**",
        "",
        "```bash",
        command(ablation.runspecs, method.config, pairs, ",".join(map(str, seeds))),
        "```",
        "",
        markdown_table(found.table, keys, headers=[label(k) for k in keys], labels=found.labels),
        rows_markdown(diff_rows(found.diff, keys)),
        convergence_note(found.convergence),
        "",
        answer(method, found, runs, ablation.runspecs),
        "",
    ]
    if method.mechanism is not None:  # the mechanism of the ablation's last runspec
        variant = replace(method, baseline=ablation.runspecs[0], method=ablation.runspecs[-1])
        lines += method.mechanism(variant, runs, where)
    return lines, cost(runs, shared)


def answer(
    method: Method,
    found: Comparison,
    runs: Mapping[str, Sequence[Results]],
    runspecs: Sequence[str],
) -> str:
    """The ablation's answer: per claimed number, its last runspec minus each of the others
    and whether that is more than seed noise."""
    parts = [
        f"{t.text}: {'a difference' if t.significant else 'no difference beyond seed noise'}."
        for other in runspecs[:-1]
        for t in paired_numbers(method, found, runs, runspecs[-1], other)[0]
    ]
    return "**Answer.** " + " ".join(parts) if parts else ""


def headroom(
    method: Method, found: Comparison, runs: Mapping[str, Sequence[Results]] | None = None
) -> list[str]:
    """How far centralised training (``pooled``) lies above the baseline on each claimed
    number (per client for a per-client claim, Holm-adjusted; FCA's G&S on its G part, see
    :func:`headroom_key`): the gap a method that corrects the federation's heterogeneity
    can close. Judged per number: where ``pooled`` is not above the baseline beyond seed
    noise, that number leaves such a method no measured gap."""
    if "pooled" not in found.table:
        return []
    tested, _ = paired_numbers(method, found, runs or {}, "pooled", method.baseline, bound=True)
    if not tested:
        return []
    open_ = [t for t in tested if t.holds]
    shut = [t for t in tested if not t.holds]
    lines = ["**Headroom.** " + " ".join(f"{t.text}." for t in tested)]
    if open_:
        lines.append(
            "Centralised training is above the baseline beyond seed noise on "
            + ", ".join(t.number.text for t in open_)
            + ": there is a federated gap there for the method to close."
        )
    if shut:
        lines.append(
            "It is not on "
            + ", ".join(t.number.text for t in shut)
            + ": this setting leaves no measured federated gap there."
        )
    if any(t.number.key.startswith("gs.") for t in tested):
        lines.append(
            "For the G&S average only its generalisation part has an upper reference: "
            "`pooled` is one model on all clients' data, scored on the pooled test set; a "
            "client's personalised head on its own test set (specialisation) can beat a pooled "
            "model, so nothing here bounds S, and the headroom is measured on G."
        )
    return [" ".join(lines), ""]


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
resamples) exclude 0, for every number it claims; a claim on every client is tested client
by client with paired t-tests whose p-values are **Holm-adjusted** over the clients
(family-wise error 5%), so that one client crossing 5% by chance does not count. A claim is
**inconclusive** when the baseline's or the method's validation curve did not converge, or
when it failed only on numbers where the setting leaves no **headroom** (`pooled` not above
the baseline beyond seed noise on that number: no federated gap for a method to close; for
FCA's G&S average `pooled` bounds only the generalisation part). With converged curves, a
method significantly worse than its baseline is **not reproduced**, as is any other failure. A section is reproduced when all its
claims are, not reproduced when one is not, inconclusive otherwise; it says what was
measured, what the method's mechanism did (recorded by the runs themselves) and what
explains the result. The settings are the papers' training recipes scaled to a CPU (image
size, rounds, data); nothing is tuned for one method that its baseline does not get. Each
section gives its cost (hours of training of its runs) and the summary table the total.
Times are this machine's, with other jobs sharing it.
"""


def not_run(method: Method | Outside) -> dict[str, str]:
    """The summary line of a section this regeneration did not run (``--only``, or not yet)."""
    claims = getattr(method, "claims", None)
    claim = "; ".join(c.text for c in claims) if claims is not None else "outside reference"
    return {
        "method": method.name,
        "claim": claim,
        "verdict": "not run here",
        "paired seeds": "-",
        "converged": "-",
        "cost (h)": "-",
    }


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="smoke size: 2 rounds")
    parser.add_argument(
        "--seeds",
        default="",
        help="comma-separated seeds (>= 2) for every section (default: each section's own, "
        "0-4, or 0-2 where its runs cost hours here)",
    )
    parser.add_argument("--only", default="", help="comma-separated methods (default all)")
    parser.add_argument(
        "--no-references",
        default="",
        metavar="METHODS",
        help="comma-separated methods that run only with their baseline (the verdict), "
        "without pooled and solo (where their runs cost hours here); the page says so",
    )
    parser.add_argument(
        "--references",
        default="",
        metavar="METHODS",
        help="comma-separated methods that run pooled and solo although their section skips "
        "them by default (FedCB and Fed-MAS, whose runs cost hours here)",
    )
    parser.add_argument(
        "--no-ablations",
        default="",
        metavar="METHODS",
        help="comma-separated methods whose ablations are not run (CPU time); the page says so",
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
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        dest="sets",
        metavar="KEY=VALUE",
        help="a config value for every section's runs (e.g. the frozen-trunk cache's key "
        "once it exists: the ISIC settings freeze their trunk with `freeze`); the page shows it",
    )
    args = parser.parse_args(argv)
    seeds = [int(s) for s in args.seeds.split(",")] if args.seeds else None
    try:
        executor = executor_for(args.executor, args.jobs, args.address)
    except FedkitError as err:
        parser.error(str(err))
    if seeds is not None and len(seeds) < 2:
        parser.error("--seeds needs at least 2 seeds for paired differences")
    slugs = {m.slug for m in SECTIONS}
    for flag in ("only", "no_references", "references", "no_ablations"):
        unknown = [x for x in getattr(args, flag).split(",") if x and x not in slugs]
        if unknown:
            name = "--" + flag.replace("_", "-")
            parser.error(f"{name}: unknown sections {unknown}; choose from {sorted(slugs)}")
    wanted = [m for m in SECTIONS if not args.only or m.slug in args.only.split(",")]
    seeds_of = {}
    for item in args.seeds_of:
        slug, _, listed = item.partition("=")
        if slug not in slugs or len(listed.split(",")) < 2:
            parser.error(f"--seeds-of expects METHOD=SEEDS with >= 2 seeds, got {item!r}")
        seeds_of[slug] = [int(s) for s in listed.split(",")]
    argv = sys.argv[1:] if argv is None else argv
    shown = ["NOTE" if i and argv[i - 1] == "--note" else a for i, a in enumerate(argv)]
    head = [HEADER.format(command=shlex.join(["python", "benchmarks/results_page.py", *shown]))]
    if args.note:
        head.append(f"NOTE: {args.note}\n")
    body: list[str] = []
    summary: list[dict[str, Any]] = []
    out = args.out / ("quick" if args.quick else "runs")
    for n, item in enumerate(wanted):
        quick = list(getattr(item, "quick", ("rounds=2",))) if args.quick else []
        quick += args.sets
        chosen = seeds_of.get(item.slug, seeds or list(item.seeds))
        if isinstance(item, Outside):
            lines, line = outside_section(item, quick, chosen, out, args.jobs, executor)
        else:
            lines, line = section(
                item,
                quick,
                chosen,
                out,
                args.jobs,
                references=(item.references or item.slug in args.references.split(","))
                and item.slug not in args.no_references.split(","),
                executor=executor,
                ablations=item.slug not in args.no_ablations.split(","),
            )
        body += lines
        summary.append(line)
        missing = [m.name for m in wanted[n + 1 :]]
        tail = [f"\n(Not yet run in this regeneration: {', '.join(missing)}.)\n"] if missing else []
        rows = summary + [
            not_run(m) for m in SECTIONS if m.name not in {r["method"] for r in summary}
        ]
        table = rows_markdown([{k.capitalize(): v for k, v in r.items()} for r in rows])
        total = sum(float(r["cost (h)"]) for r in summary)
        spent = f"Training time of the runs on this page: {total:.1f} h (each run's wall time, summed).\n"
        write_text(
            args.page, "\n".join([*head, table, spent, *body, *tail])
        )  # a partial page survives
    print(f"wrote {args.page}")


if __name__ == "__main__":
    main()
