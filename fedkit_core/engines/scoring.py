"""A round's scores from the clients' evaluation replies: metrics per split, view and
scope, the clients' mean, fairness and the plugins' summaries."""

from __future__ import annotations

import functools
import logging
import math
from collections import defaultdict
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from fedkit_core.errors import FedkitError
from fedkit_core.hooks.context import ServerContext
from fedkit_core.metrics.fairness import fairness
from fedkit_core.metrics.statistics import add_stats, predicted_classes
from fedkit_core.plugin_manager import BUILTINS
from fedkit_core.results.schema import CSV_COLUMNS

log = logging.getLogger("fedkit")


class Scoring:
    """Scores evaluation replies with the run's ``fedkit_metrics`` and ``fedkit_summary``
    (``hook``); ``federated``: the replies hold sufficient statistics to sum, not
    predictions to concatenate (``evaluation=federated``)."""

    def __init__(self, ctx: ServerContext, hook: Any, federated: bool):
        self.ctx, self.hook, self.federated = ctx, hook, federated
        self._warned: set[tuple[str, ...]] = set()  # warnings given once per run

    def scopes(
        self,
        arrays: dict[str, dict[str, np.ndarray]],
        served: dict[str, str],
        split: str,
    ) -> dict[str, Any]:
        """The scopes of one ``split`` from every client's evaluation ``arrays`` and the
        view that scores each client (``served``)."""
        per_view = _by_view(arrays, split)
        combine = _sum_stats if self.federated else _concat
        views: dict[str, Any] = {}
        predicted = None
        for view, clients in per_view.items():
            scores = {cid: self._metrics(values) for cid, values in clients.items()}
            pooled = combine(list(clients.values()))
            views[view] = {"global": self._metrics(pooled), "clients": scores}
            if view == "global":
                predicted = predicted_classes(pooled)
        clients_scope = {
            cid: views[view]["clients"][cid]
            for cid, view in served.items()
            if view in views and cid in views[view]["clients"]
        }
        main = self.ctx.task.main_metric
        scopes: dict[str, Any] = {
            "global": views.get("global", {}).get("global", {}),
            "clients": clients_scope,
            "clients_mean": _mean_metrics(clients_scope.values()),
            "fairness": fairness(clients_scope, main),
            "views": views,
        }
        summary: dict[str, float] = {}
        for impl in reversed(self.hook.fedkit_summary.get_hookimpls()):  # pluggy's order
            kwargs = {"server": self.ctx, "scopes": scopes}
            part = impl.function(*(kwargs[name] for name in impl.argnames)) or {}
            for name, value in dict(part).items():
                if name in CSV_COLUMNS or name in scopes["clients_mean"]:  # its csv row's
                    self._warn_shadow(impl.plugin_name, name)
                else:
                    summary[name] = value
        scopes["summary"] = summary
        if predicted is not None:  # read by results.json's warnings (one class predicted)
            scopes["predicted_classes"] = predicted
            scopes["one_class_sites"] = one_class_sites(per_view, served)
        return scopes

    def _metrics(self, arrays: Mapping[str, np.ndarray]) -> dict[str, float]:
        """The metrics of one scope: the built-in ones, then each plugin's. A plugin's metric
        named like a built-in one does not replace it, and one that is not finite (NaN,
        inf) is recorded as missing, each with a warning naming the plugin; one that is not
        a number is an error naming it."""
        out: dict[str, float] = {}
        builtin: set[str] = set()
        for impl in self.hook.fedkit_metrics.get_hookimpls():  # built-ins (trylast) first
            kwargs = {"server": self.ctx, "arrays": arrays}
            part = impl.function(*(kwargs[name] for name in impl.argnames)) or {}
            plugin = impl.plugin_name
            if plugin in BUILTINS:
                builtin.update(part)
                out.update(part)
                continue
            if not isinstance(part, Mapping):
                raise FedkitError(
                    f"plugin {plugin!r}: fedkit_metrics returned a {type(part).__name__}, "
                    "not a mapping of metric names to numbers"
                )
            for name, value in part.items():
                if isinstance(value, bool) or not isinstance(value, (int, float, np.number)):
                    raise FedkitError(
                        f"plugin {plugin!r}: its metric {str(name)[:80]!r} is "
                        f"{str(value)[:80]!r} ({type(value).__name__}), not a number"
                    )
                if name in builtin or name in CSV_COLUMNS:
                    self._warn_shadow(plugin, name)
                elif not math.isfinite(float(value)):
                    self._warn_once(
                        (plugin, name, "finite"),
                        f"plugin {plugin!r} gave {value} for its metric {name!r}: recorded "
                        "as missing where it is not finite",
                    )
                else:
                    out[name] = value
        return out

    def _warn_shadow(self, plugin: str, name: str) -> None:
        """Warn (once) that ``plugin``'s metric ``name``, the name of a built-in metric or
        metrics.csv column (round, epsilon, ...), is left out."""
        self._warn_once(
            (plugin, name, "shadow"),
            f"plugin {plugin!r} gives a metric {name!r}, the name of a built-in one, which "
            f"is kept: name the plugin's own '{plugin}.{name}'",
        )

    def _warn_once(self, key: tuple[str, ...], text: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            log.warning(text)


def _mean_metrics(metrics: Iterable[dict[str, float]]) -> dict[str, float]:
    """Unweighted mean over clients of each metric (over the clients reporting it)."""
    collected: dict[str, list[float]] = {}
    for m in metrics:
        for key, value in m.items():
            collected.setdefault(key, []).append(value)
    return {key: float(np.mean(values)) for key, values in collected.items()}


def one_class_sites(
    per_view: Mapping[str, Mapping[str, Mapping[str, np.ndarray]]], served: Mapping[str, str]
) -> dict[str, int]:
    """``{client id: class}`` of the sites whose model (the view that served it) predicted
    one class for every test image there: read by results.json's warnings. Only the class
    is kept, not the classes each site's model predicted (less about a site's data)."""
    out = {}
    for cid, view in served.items():
        found = predicted_classes(per_view.get(view, {}).get(cid, {}))
        if found is not None and len(found) == 1:
            out[cid] = found[0]
    return out


def _by_view(
    arrays: dict[str, dict[str, np.ndarray]], split: str
) -> dict[str, dict[str, dict[str, np.ndarray]]]:
    """``{view: {client id: {name: array}}}`` of one split's evaluation arrays; the labels
    (pooled mode) go with every view."""
    out: dict[str, dict[str, dict[str, np.ndarray]]] = defaultdict(dict)
    for cid, named in arrays.items():
        labels = named.get(f"{split}/labels")
        for key, value in named.items():
            parts = key.split("/")
            if parts[0] != split or len(parts) != 3:
                continue
            entry = out[parts[1]].setdefault(cid, {} if labels is None else {"labels": labels})
            entry[parts[2]] = value
    return out


def _concat(parts: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    return {key: np.concatenate([p[key] for p in parts]) for key in parts[0]}


def _sum_stats(parts: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    return functools.reduce(add_stats, parts)
