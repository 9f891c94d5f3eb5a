"""Build and run federations from Python: the functions the CLI is a thin layer over.

>>> from fedkit_core import run
>>> results = run({"task": "synthetic", "rounds": 2})          # doctest: +SKIP
>>> results.final["global"]["bacc"]                             # doctest: +SKIP

A run's config is resolved once (:mod:`fedkit_core.resolve`), its run directory created,
and the run handed to its engine (:mod:`fedkit_core.engines.registry`); nothing here knows
how an engine works.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from fedkit_core.config import Config
from fedkit_core.contract.channels import NONE, dp_level
from fedkit_core.contract.observer import Observer
from fedkit_core.engines.checkpoint import ServerCheckpoints
from fedkit_core.engines.driver import write_missing_outputs
from fedkit_core.engines.registry import get_engine
from fedkit_core.errors import FedkitError, NoSpace, no_space
from fedkit_core.fileio import write_text
from fedkit_core.plugin_manager import PluginSet
from fedkit_core.resolve import ConfigLike, resolve_config
from fedkit_core.results.schema import Results
from fedkit_core.results.store import RunDir, write_json

log = logging.getLogger("fedkit")


def run(
    config: ConfigLike | Sequence[ConfigLike] = None,
    *,
    plugins: Mapping[str, Any] | None = None,
    out: str | Path | None = None,
    observer: Observer | None = None,
    reuse: bool = False,
) -> Results:
    """Run a federation and return its results.

    ``config``: a dict of config keys (nested or dotted), a YAML path, or a list of those.
    ``plugins``: extra plugin objects by name (e.g. defined in the embedding code).
    ``out``: a directory for results.json, metrics.csv, plots and checkpoints; ``None``
    keeps everything in memory. A directory that already holds a run is refused, unless
    ``reuse`` is true and the run has the same config (see :func:`run_resolved`).
    """
    cfg, plugin_set = resolve_config(config, plugins)
    return run_resolved(cfg, plugin_set, out=out, observer=observer, reuse=reuse)


def run_resolved(
    cfg: Config,
    plugin_set: PluginSet,
    *,
    out: str | Path | None = None,
    observer: Observer | None = None,
    reuse: bool = False,
) -> Results:
    """Run a config already resolved by :func:`~fedkit_core.resolve.resolve_config` (what the
    CLI does, having resolved it to name the run directory).

    ``reuse`` (what ``fedkit compare`` does): when ``out`` holds a run of this same config
    (same config hash), continue it, or return it when complete. A run of another config is
    never reused or overwritten: that is an error naming the differing keys. ``out`` is locked
    while the run is written, so a second process writing it is refused.
    """
    engine = get_engine(cfg["engine"])
    observer = observer or Observer()
    if out is None:
        return engine.execute(cfg, plugin_set, None, observer, resume=False)
    run_dir = RunDir(out)
    if reuse and run_dir.is_run():  # a complete run is only read: it may be read-only
        run_dir.require_config(cfg.nested(), cfg.defaults())
        if (done := _complete(run_dir)) is not None:
            return done
    with run_dir.lock(private=bool(cfg["private"])):
        if reuse and run_dir.is_run():
            run_dir.require_config(cfg.nested(), cfg.defaults())
            done = _complete(run_dir)
            if done is not None:
                return done
            _check_digests(ServerCheckpoints(run_dir.checkpoint), False, run_dir)
            return _continue(run_dir, cfg, plugin_set, observer)
        run_dir.create(cfg.nested())
        run_dir.save_config(cfg.nested())
        try:
            with _full_disk_hint(run_dir, cfg["checkpoint"]):
                return engine.execute(cfg, plugin_set, run_dir, observer, resume=False)
        except BaseException:
            run_dir.discard_config()
            raise


def resume(
    out: str | Path,
    *,
    plugins: Mapping[str, Any] | None = None,
    observer: Observer | None = None,
    accept_edits: bool = False,
    rounds: int | None = None,
    accept_unverified: bool = False,
) -> Results:
    """Continue the run in ``out`` from its last completed round (same final results as an
    uninterrupted run), on the engine it was started on. A complete run is returned as it is;
    a run another live process is writing is refused.

    ``rounds``: extend the run, complete or not, to that many rounds (more than it has run):
    the rounds so far are kept, and the training is the same as a run planned that long
    (its lr schedule counts rounds, not fractions of them). A run under differential
    privacy is not extended: its noise was calibrated for the rounds it planned. Raising
    ``rounds`` in ``config.yaml`` does the same.

    A ``config.yaml`` edited since the run started (its hash no longer matches
    ``config.sha256``) is refused, as the rounds run so far used the old values; with
    ``accept_edits`` the run continues with the edited config and the change is recorded in
    ``config-edits.log``.

    Checkpoint files without a digest (a run of an older fedkit) are refused; with
    ``accept_unverified`` the run continues from them and results.json records it
    (``unverified_resumes``).
    """
    run_dir = RunDir(out)
    run_dir.load_config()  # not a run: refused before the lock makes a folder
    with run_dir.lock():
        before = run_dir.config.read_text()
        if rounds is not None:
            _plan_rounds(run_dir, rounds)
        saved = run_dir.load_config()
        checkpoints = ServerCheckpoints(run_dir.checkpoint)
        done = _complete(run_dir)
        if done is not None and not _more_rounds_planned(saved, checkpoints):
            write_missing_outputs(run_dir, done)  # killed after its results, before its plots
            return done
        cfg, plugin_set = resolve_config(saved, plugins)
        try:
            run_dir.check_edits(accept_edits, checkpoints.config(), cfg.defaults())
            _check_digests(checkpoints, accept_unverified, run_dir)
        except FedkitError:
            if rounds is not None:  # a refused --rounds leaves config.yaml as it was
                write_text(run_dir.config, before)
            raise
        return _continue(run_dir, cfg, plugin_set, observer or Observer())


def _check_digests(checkpoints: ServerCheckpoints, accept: bool, run_dir: RunDir) -> None:
    """Refuse checkpoint files no digest covers (this fedkit always writes them), unless
    ``accept``-ed (``--accept-unverified``): then noted for results.json."""
    missing = checkpoints.unverified()
    if not missing:
        return
    if not accept:
        raise FedkitError(
            f"these checkpoint files have no recorded digest, so damage or edits to them "
            f"cannot be detected: {'; '.join(missing[:5])}{'; ...' if len(missing) > 5 else ''}"
            f". This fedkit writes digests with every checkpoint: they were deleted, or the "
            f"run was made by an older fedkit; to continue from these files anyway run "
            f"`fedkit resume {run_dir.path} --accept-unverified` (recorded in results.json)"
        )
    log.warning("resuming from checkpoint files without digests: %s", "; ".join(missing))
    checkpoints.accept(missing)


def _plan_rounds(run_dir: RunDir, rounds: int) -> None:
    """Set ``rounds`` in the run's ``config.yaml`` (an extension :meth:`RunDir.check_edits`
    accepts), refusing a run without a checkpoint, fewer rounds than it has run and a run
    under differential privacy."""
    config = run_dir.load_config()
    ran = ServerCheckpoints(run_dir.checkpoint).round()
    if ran is None:
        raise FedkitError(
            f"{run_dir.path} has no checkpoint (checkpoint=false, or no round done): it cannot "
            "be extended"
        )
    if rounds <= ran:
        raise FedkitError(
            f"{run_dir.path} has run {ran} rounds; --rounds must be more to extend it"
        )
    if dp_level(config) != NONE:
        raise FedkitError(
            f"{run_dir.path} runs under differential privacy, calibrated for its "
            f"{config.get('rounds')} planned rounds: it is not extended; start a new run "
            f"planned for {rounds} rounds"
        )
    run_dir.write_config_only({**config, "rounds": rounds})


def _more_rounds_planned(config: Mapping[str, Any], checkpoints: ServerCheckpoints) -> bool:
    """Whether ``config.yaml`` plans more rounds than the checkpoint holds (an extension)."""
    ran = checkpoints.round()
    return ran is not None and isinstance(config.get("rounds"), int) and config["rounds"] > ran


def _complete(run_dir: RunDir) -> Results | None:
    if run_dir.results.is_file() and run_dir.load_results().get("status") == "complete":
        return Results(run_dir.load_results())
    return None


def _continue(run_dir: RunDir, cfg: Config, plugin_set: PluginSet, observer: Observer) -> Results:
    """The unfinished run in ``run_dir`` (of config ``cfg``), continued from its last
    checkpoint."""
    if not cfg["checkpoint"]:
        raise FedkitError(f"{run_dir.path} was run with checkpoint=false and cannot be resumed")
    engine = get_engine(cfg["engine"])
    with _full_disk_hint(run_dir, True):
        return engine.execute(cfg, plugin_set, run_dir, observer, resume=True)


@contextmanager
def _full_disk_hint(run_dir: RunDir, checkpointed: bool) -> Iterator[None]:
    """A write that found the disk full, wherever it happened, as one :class:`NoSpace`
    error (exit 2) that says how to go on: what was written is intact. A run without
    checkpoints (``checkpoint=false``) cannot be resumed: it is told to run again, and its
    results.json says it stopped (``status: failed``) where that can still be written."""
    try:
        yield
    except (OSError, NoSpace) as err:
        found = no_space(err)
        if not isinstance(found, NoSpace):
            raise
        if not run_dir.results.is_file():
            then, kept = "free space and run it again", "no round was completed"
        elif checkpointed:
            then = f"free space and run `fedkit resume {run_dir.path}` to continue after it"
            kept = f"{run_dir.path} keeps the rounds done so far, intact"
        else:
            kept = f"{run_dir.path} keeps the results of the rounds done so far" + (
                " (status failed)" if _mark_failed(run_dir) else " (its status still says running)"
            )
            then = "it ran with checkpoint=false and cannot be resumed: free space and run it again"
        raise NoSpace(f"{found}; {kept}: {then}") from None


def _mark_failed(run_dir: RunDir) -> bool:
    """Set results.json's status to ``failed`` (a stopped run that cannot be resumed);
    whether that could be written."""
    try:
        results = run_dir.load_results()
        write_json(run_dir.results, {**results, "status": "failed"})
    except (OSError, FedkitError):
        return False
    return True
