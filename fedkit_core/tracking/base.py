"""What every tracking backend shares: an :class:`Observer` that turns a run's events into
"start a tracked run with these params", "log these metrics at this step" and "attach these
files", so that a backend only implements those calls."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from types import ModuleType
from typing import Any

from fedkit_core import extras
from fedkit_core.contract.observer import Observer
from fedkit_core.results.schema import has_test
from fedkit_core.results.store import RunDir

#: the files of a run folder attached to the tracked run at its end
FIGURE_SUFFIXES = (".png", ".pdf", ".svg")


def require(module: str, extra: str) -> ModuleType:
    """Import a backend's library, or say which fedkit extra installs it."""
    return extras.require(
        module, f"--logger {extra}", extra, "or 'fedkit[tracking]' for every logger"
    )


def flat_params(config: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """A nested config as dotted keys; lists and None become strings (what trackers accept)."""
    out: dict[str, Any] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            out.update(flat_params(value, f"{name}."))
        else:
            out[name] = value if isinstance(value, (bool, int, float, str)) else str(value)
    return out


def round_metrics(record: Mapping[str, Any]) -> dict[str, float]:
    """The numbers of one round record, as ``split/scope/metric`` (scopes: global,
    clients_mean, fairness, summary, client/<id>), ``train/<id>/<loss>`` and ``seconds``."""
    out: dict[str, float] = {}
    for split, scopes in (("test", record), ("val", record.get("val") or {})):
        for scope in ("global", "clients_mean", "fairness", "summary"):
            _put(out, f"{split}/{scope}", scopes.get(scope) or {})
        for cid, metrics in (scopes.get("clients") or {}).items():
            _put(out, f"{split}/client/{cid}", metrics)
    for cid, losses in (record.get("train") or {}).items():
        _put(out, f"train/{cid}", losses)
    _put(out, "", {"seconds": record.get("seconds")})
    return out


def _put(out: dict[str, float], prefix: str, metrics: Mapping[str, Any]) -> None:
    for key, value in metrics.items():
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            out[_safe(f"{prefix}/{key}" if prefix else key)] = float(value)


def _safe(name: str) -> str:
    """Metric names every backend accepts (MLflow: letters, digits, ``_-. /``)."""
    return re.sub(r"[^\w\-. /]", "_", name)


def figures(run_dir: Path) -> list[Path]:
    """The figures a run wrote to its folder, sorted."""
    return sorted(p for p in Path(run_dir).iterdir() if p.suffix in FIGURE_SUFFIXES)


class Tracker(Observer):
    """Logs a run to an experiment tracker: the resolved config as params when the rounds
    start, each round's metrics with the round as step, the figures at the end.

    ``run_dir``: the run folder (its ``config.yaml`` gives the params unless ``config`` is
    given; its figures are attached at the end). A tracked run left open by an error is
    closed as failed by :meth:`close` (or by using the tracker as a context manager).

    With ``eval_test=improved`` the best round's test scores can reach its record only at
    the end of the run (its global model is kept and tested then); they are logged at that
    round's step when the run ends (:meth:`log_late_metrics`).
    """

    #: the backend's library (imported when the tracker is made, so that a missing one
    #: fails before the run) and the fedkit extra that installs it
    library = ""
    extra = ""

    def __init__(self, run_dir: str | Path | None = None, config: Mapping[str, Any] | None = None):
        self.lib = require(self.library, self.extra)
        self.run_dir = Path(run_dir) if run_dir is not None else None
        self.config = config
        self.active = False
        self.untested: set[int] = set()  # rounds logged without test scores

    # backend calls ---------------------------------------------------------------------

    def start(self, name: str, params: dict[str, Any]) -> None:
        raise NotImplementedError

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        raise NotImplementedError

    def log_late_metrics(self, metrics: dict[str, float], step: int) -> None:
        """Metrics of a round whose step was logged before (a backend whose steps must
        increase overrides this)."""
        self.log_metrics(metrics, step)

    def log_files(self, paths: Iterable[Path]) -> None:
        raise NotImplementedError

    def finish(self, ok: bool) -> None:
        raise NotImplementedError

    # observer events ---------------------------------------------------------------------

    def on_start(self, total_rounds: int, first_round: int) -> None:
        if self.active:
            return
        config = self.config
        if config is None:
            config = RunDir(self.run_dir).load_config() if self.run_dir else {}
        name = str(self.run_dir) if self.run_dir else "fedkit"
        self.start(name, flat_params(config))
        self.active = True

    def on_round_end(self, record: dict[str, Any]) -> None:
        if self.active:
            self.log_metrics(round_metrics(record), int(record["round"]))
            if not has_test(record):
                self.untested.add(int(record["round"]))

    def on_end(self, results: Mapping[str, Any], run_dir: Path | None) -> None:
        if self.active:
            for record in results.get("rounds", []):
                if int(record["round"]) in self.untested and has_test(record):
                    test = {k: v for k, v in round_metrics(record).items() if k[:5] == "test/"}
                    self.log_late_metrics(test, int(record["round"]))
        if self.active and run_dir is not None:
            self.log_files(figures(run_dir))
        self.close(ok=True)

    def close(self, ok: bool = False) -> None:
        """End the tracked run (as failed unless ``ok``); nothing if none is open."""
        if self.active:
            self.active = False
            self.finish(ok)

    def __enter__(self) -> Tracker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close(ok=exc[0] is None)
