"""Names for readers: metric names in figures and tables, which model served the clients, and
which runs are references rather than methods."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from fedkit_core.contract.channels import NONE, dp_level

METRICS = {  # results.json name: (long name for axes, short name for table headers)
    "bacc": ("balanced accuracy", "bACC"),
    "bauc": ("balanced AUC (macro one-vs-rest)", "bAUC"),
    "acc": ("accuracy", "acc"),
    "f1_macro": ("macro F1", "macro F1"),
    "dice": ("Dice (foreground mean)", "Dice"),
    "dice_bg": ("Dice with background", "Dice+bg"),
    "head_acc": ("head-class accuracy", "head acc"),
    "medium_acc": ("medium-class accuracy", "medium acc"),
    "tail_acc": ("tail-class accuracy", "tail acc"),
}


def metric_name(name: str, short: bool = False) -> str:
    """``bacc`` -> ``balanced accuracy`` (``bACC`` when ``short``); a plugin's summary
    number ``fca.gs_bacc`` -> ``fca gs bACC``; unknown names are returned as they are."""
    plugin, _, key = name.rpartition(".")
    if key in METRICS:
        text = METRICS[key][short]
    else:
        base = next((m for m in METRICS if key.endswith(f"_{m}")), None)
        text = (
            key.replace("_", " ")
            if base is None
            else f"{key[: -len(base) - 1]} " + (METRICS[base][short])
        )
    return f"{plugin} {text}" if plugin else text


def value_range(path: str) -> tuple[float, float] | None:
    """The range of a compared number (a metric path such as ``final.global.bacc``): (0, 1)
    for the metrics of :data:`METRICS` (a plugin's ``fca.gs_bacc`` too) and the worst
    client's, (0, 0.5) for the std of scores in [0, 1]; ``None`` where unbounded (times)."""
    if path.endswith("fairness.std"):
        return (0.0, 0.5)
    key = path.rpartition(".")[2]
    if (
        path.endswith("fairness.worst")
        or key in METRICS
        or any(key.endswith(f"_{m}") for m in METRICS)
    ):
        return (0.0, 1.0)
    return None


def client_view(final: Mapping[str, Any]) -> str:
    """The evaluation view whose models produced ``final["clients"]``: ``global`` when every
    client was scored with the global model (not personalised), else the personal view's
    name (``personal`` when the view cannot be told)."""
    views = final.get("views") or {}
    for name in ("global", *sorted(v for v in views if v != "global")):
        if name in views and views[name].get("clients") == final.get("clients"):
            return name
    return "global" if not views else "personal"


#: the runs that are references, not methods: what each one is, for results and tables
REFERENCES = {
    "pooled": "pooled reference, NOT federated: one model trained centrally on the union of "
    "the clients' training data (the data leave the clients), with the federation's number "
    "of steps, scored on the clients' test sets",
    "local": "local reference: each client trains alone on its own data (the solo plugin), "
    "nothing is shared",
}


def method_label(config: Mapping[str, Any]) -> str:
    """What trained a run, from its resolved ``config``: its plugins (``fca+focal``),
    ``fedavg`` without any, ``pooled`` for the pooled reference."""
    if config.get("pooled"):
        return "pooled"
    return "+".join(config.get("plugins") or []) or "fedavg"


def setting_parts(config: Mapping[str, Any], always: bool = False) -> list[str]:
    """What sets a run apart beyond method and task, from its resolved ``config``: the model,
    the aggregation mode and the DP level, and the site profiles (their file's stem). With
    ``always`` the defaults are said too (``sync``, ``no DP``), as a figure's title does;
    without, only what differs from them (a run folder's name)."""
    parts = [str(config.get("model") or "cnn")]
    mode = config.get("aggregation") or "sync"
    if always or mode != "sync":
        parts.append(f"aggregation {mode}" if always else mode)
    sites = config.get("sites")
    if sites:
        parts.append(f"sites {Path(str(sites)).stem}" if always else Path(str(sites)).stem)
    level = dp_level(config)
    if level != NONE:
        parts.append(f"{level}-level DP" if always else f"dp-{level}")
    elif always:
        parts.append("no DP")
    return parts


def run_label(config: Mapping[str, Any], task: str, setting: bool = True) -> str:
    """A run's name for readers: its config's ``name``, else its method on its ``task``, with
    (``setting``) the model, aggregation mode, DP level and sites in parentheses."""
    if config.get("name"):
        return str(config["name"])
    kind = reference_of(config)
    what = method_label(config) + (f" ({kind} reference)" if kind else "")
    return f"{what} on {task}" + (f" ({', '.join(setting_parts(config))})" if setting else "")


def reference_of(config: Mapping[str, Any]) -> str | None:
    """The reference a run's resolved ``config`` makes it (a :data:`REFERENCES` key):
    ``pooled`` with ``pooled=true``, ``local`` with the ``solo`` plugin; ``None`` for a
    method."""
    if config.get("pooled"):
        return "pooled"
    if "solo" in (config.get("plugins") or []):
        return "local"
    return None


def chance_level(metric: str, num_classes: int | None) -> float | None:
    """The score of guessing at random, drawn in bar charts so a bar reads against it:
    ``1/num_classes`` for the accuracies (``acc``, ``bacc``, ``head_acc``, ...), 0.5 for an
    AUC; ``None`` where no such line applies (Dice, F1) or the classes are unknown."""
    key = metric.rpartition(".")[2]
    if "auc" in key:
        return 0.5
    if (key in ("acc", "bacc") or key.endswith("_acc")) and num_classes:
        return 1.0 / num_classes
    return None
