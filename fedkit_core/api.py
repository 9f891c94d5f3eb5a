"""Build and run federations from Python: the functions the CLI is a thin layer over.

>>> from fedkit_core import run
>>> results = run({"task": "synthetic", "rounds": 2})          # doctest: +SKIP
>>> results.final["global"]["bacc"]                             # doctest: +SKIP
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fedkit_core.config import CORE_OPTIONS, Config, load_yaml, peek, resolve
from fedkit_core.engines.client import ClientRuntime
from fedkit_core.engines.local import Checkpointer, LocalTransport
from fedkit_core.engines.registry import engine_options, get_engine
from fedkit_core.engines.server import Observer, Server, check_plugins
from fedkit_core.errors import FedkitError
from fedkit_core.options import Option
from fedkit_core.partitions import partition
from fedkit_core.plugins import PluginSet
from fedkit_core.results.plots import plot_run
from fedkit_core.results.schema import Results, build_results, metrics_csv
from fedkit_core.results.store import RunDir, write_json, write_text
from fedkit_core.tasks.base import CLASSIFICATION, SEGMENTATION, ClientData, ClientInfo, TaskInfo
from fedkit_core.tasks.loading import load_task
from fedkit_core.tasks.registry import get_task

log = logging.getLogger("fedkit")
ConfigLike = Mapping[str, Any] | str | Path | None


def _layers(config: ConfigLike | Sequence[ConfigLike]) -> list[Mapping[str, Any]]:
    items = config if isinstance(config, (list, tuple)) else [config]
    out = []
    for item in items:
        if item is None:
            continue
        out.append(load_yaml(item) if isinstance(item, (str, Path)) else dict(item))
    return out


def resolve_config(
    config: ConfigLike | Sequence[ConfigLike] = None, plugins: Mapping[str, Any] | None = None
) -> tuple[Config, PluginSet]:
    """Validate ``config`` (a dict, a YAML path, or a list of them, later ones winning) and
    activate its plugins (plus ``plugins``: throwaway ``{name: object}`` plugins)."""
    layers = _layers(config)
    names = peek(layers, "plugins", []) or []
    names = Option("plugins", "list[str]", []).coerce(names, "plugins")
    names = [n for n in names if n != "fedavg"] + [n for n in (plugins or {}) if n not in names]
    plugin_set = PluginSet(names, plugins)
    spec = get_task(str(peek(layers, "task.name", "synthetic")))
    task_options = [
        Option(f"task.{o.name}", o.type, o.default, o.help, o.choices, o.nullable)
        for o in spec.options
    ]
    layers.append({"plugins": names})
    # a named partition's values are defaults too: anything the user sets wins
    preset = peek(layers, "partition.preset")
    defaults = {**spec.defaults, **spec.partition_preset(None if preset is None else str(preset))}
    engine = engine_options(str(peek(layers, "engine", "local")))
    cfg = resolve(layers, [*CORE_OPTIONS, *task_options, *plugin_set.options(), *engine], defaults)
    values = dict(cfg)
    if values["loss"] == "auto":
        values["loss"] = "dice" if spec.kind == SEGMENTATION else "ce"
    values["task.path"] = spec.resolve_path(values["task.path"])
    if values["model"] == "auto":
        values["model"] = "unet" if spec.kind == SEGMENTATION else "cnn"
    if spec.kind == CLASSIFICATION and values["loss"] in ("dice", "dice_ce"):
        raise FedkitError(
            f"loss={values['loss']} is for segmentation; task {spec.name!r} is classification"
        )
    _check_ranges(values)
    resolved = Config(values, cfg.options)
    check_plugins(resolved, plugin_set)
    return resolved, plugin_set


#: (keys, test, what the values must be) for the core's numeric keys; None is always allowed
_RANGES: tuple[tuple[tuple[str, ...], Callable[[Any], bool], str], ...] = (
    (
        ("rounds", "local_epochs", "batch_size", "eval_batch_size", "eval_every", "clients"),
        lambda v: v >= 1,
        "at least 1",
    ),
    (("task.image_size",), lambda v: v >= 1, "at least 1 (or null: no resizing)"),
    (("seed",), lambda v: v >= 0, "0 or more"),
    (("lr", "partition.alpha"), lambda v: v > 0, "above 0"),
    (("partition.alphas", "partition.fractions"), lambda v: all(x > 0 for x in v), "all above 0"),
    (("sample_fraction",), lambda v: 0 < v <= 1, "in (0, 1]"),
    (("task.val_fraction", "task.test_fraction"), lambda v: 0 < v < 1, "in (0, 1)"),
    (("partition.drop_prob",), lambda v: 0 <= v < 1, "in [0, 1)"),
)


def _check_ranges(values: Mapping[str, Any]) -> None:
    for keys, ok, what in _RANGES:
        for key in keys:
            if values.get(key) is not None and not ok(values[key]):
                raise FedkitError(f"{key} must be {what}, got {values[key]}")


def pick_device(name: str) -> torch.device:
    """The torch device for ``device=name`` (``auto``: the GPU when there is one).

    On a GPU, cuDNN is set to deterministic algorithms, in every engine's server and clients
    alike, so that a seed gives the same run.
    """
    if name == "auto":
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    else:
        try:
            device = torch.device(name)
        except RuntimeError as err:
            raise FedkitError(f"device={name!r} is not a torch device: {err}") from None
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise FedkitError("device=cuda was asked for but no CUDA GPU is available")
        torch.backends.cudnn.benchmark = False
        torch.backends.cudnn.deterministic = True
    return device


@dataclass
class Federation:
    """Everything a run needs before its first round: config, plugins, data, clients."""

    config: Config
    plugins: PluginSet
    task: TaskInfo
    clients: dict[str, ClientData]
    device: torch.device

    @property
    def infos(self) -> dict[str, ClientInfo]:
        """Every client's own statistics, as only a simulation holding all the data has them."""
        return {cid: data.info() for cid, data in self.clients.items()}


def prepare(config: Config, plugins: PluginSet) -> Federation:
    """Load and partition the task's data and describe it."""
    data = load_task(config)
    clients = partition(data, config)
    sample = data.sample_split().images
    task = TaskInfo(
        name=config["task.name"],
        kind=data.kind,
        class_names=list(data.class_names),
        in_channels=int(sample.shape[1]),
        image_shape=tuple(int(s) for s in next(iter(clients.values()))["train"].images.shape[2:]),
        client_ids=list(clients),
        shot_groups=data.shot_groups,
    )
    return Federation(config, plugins, task, clients, pick_device(config["device"]))


def shot_groups_of(
    config: Config,
    kind: str,
    clients: Sequence[ClientInfo],
    default: dict[str, list[int]] | None,
) -> dict[str, list[int]] | None:
    """Head/medium/tail classes from ``task.shot_thresholds`` and the clients' pooled
    training counts (the task's own groups when no thresholds are set)."""
    thresholds = config["task.shot_thresholds"]
    if not thresholds or kind != CLASSIFICATION:
        return default
    if len(thresholds) != 2:
        raise FedkitError("task.shot_thresholds must be [many, few]")
    counts = sum(np.asarray(c.class_counts) for c in clients)
    many, few = thresholds
    return {
        "head": [c for c, n in enumerate(counts) if n > many],
        "medium": [c for c, n in enumerate(counts) if few <= n <= many],
        "tail": [c for c, n in enumerate(counts) if n < few],
    }


def default_out(config: Config) -> Path:
    label = config["name"] or "+".join(config["plugins"] or ["fedavg"]) + "-" + config["task.name"]
    base = Path("runs") / f"{label}-{datetime.now():%Y%m%d-%H%M%S}"
    path, n = base, 1
    while path.exists():
        n += 1
        path = base.with_name(f"{base.name}-{n}")
    return path


def run(
    config: ConfigLike | Sequence[ConfigLike] = None,
    *,
    plugins: Mapping[str, Any] | None = None,
    out: str | Path | None = None,
    observer: Observer | None = None,
) -> Results:
    """Run a federation and return its results.

    ``config``: a dict of config keys (nested or dotted), a YAML path, or a list of those.
    ``plugins``: extra plugin objects by name (e.g. defined in the embedding code).
    ``out``: a directory for results.json, metrics.csv, plots and checkpoints; ``None``
    keeps everything in memory.
    """
    cfg, plugin_set = resolve_config(config, plugins)
    run_dir = RunDir(out) if out is not None else None
    if run_dir is not None:
        run_dir.create()
        run_dir.save_config(cfg.nested())
    return _execute(cfg, plugin_set, run_dir, observer, resume=False)


def resume(
    out: str | Path, *, plugins: Mapping[str, Any] | None = None, observer: Observer | None = None
) -> Results:
    """Continue the run in ``out`` from its last completed round (same final results as an
    uninterrupted run). A complete run is returned as it is."""
    run_dir = RunDir(out)
    saved = run_dir.load_config()
    if run_dir.results.is_file() and run_dir.load_results().get("status") == "complete":
        return Results(run_dir.load_results())
    cfg, plugin_set = resolve_config(saved, plugins)
    if not cfg["checkpoint"]:
        raise FedkitError(f"{out} was run with checkpoint=false and cannot be resumed")
    return _execute(cfg, plugin_set, run_dir, observer, resume=True)


def _execute(
    cfg: Config,
    plugin_set: PluginSet,
    run_dir: RunDir | None,
    observer: Observer | None,
    resume: bool,
) -> Results:
    if cfg["engine"] != "local":
        if resume:
            raise FedkitError(
                f"runs on engine={cfg['engine']} cannot be resumed; start the run again"
            )
        return get_engine(cfg["engine"]).execute(cfg, plugin_set, run_dir, observer)
    started = time.perf_counter()
    fed = prepare(cfg, plugin_set)
    observer = observer or Observer()
    server = Server(cfg, plugin_set, fed.task, fed.device, observer)
    clients = {
        cid: ClientRuntime(cid, data, fed.task, cfg, plugin_set, fed.device)
        for cid, data in fed.clients.items()
    }
    transport = LocalTransport(clients, observer)
    checkpointer = Checkpointer(run_dir.checkpoint) if run_dir and cfg["checkpoint"] else None
    saved = checkpointer.load() if (checkpointer and resume) else None
    if resume and saved is None and run_dir.results.is_file() and run_dir.load_results()["rounds"]:
        log.warning("no checkpoint in %s: the run starts again from round 1", run_dir.checkpoint)
    server.setup(priors=saved[0]["priors"] if saved else None)
    server.setup_clients(transport, clients)
    if saved:
        server.restore(saved[0])
        for cid, state in saved[1].items():
            clients[cid].load_state_dict(state)
    server.seconds += time.perf_counter() - started

    def after_round(srv: Server) -> None:
        if checkpointer is not None:
            checkpointer.save(srv, clients)
        write_results("running", server, plugin_set, run_dir)

    server.run(transport, on_round=after_round)
    return finish_run(server, plugin_set, run_dir)


def write_results(
    status: str, server: Server, plugin_set: PluginSet, run_dir: RunDir | None
) -> Results:
    """The results of ``server``'s rounds so far, written to ``run_dir`` (if any)."""
    results = build_results(
        status=status,
        config=server.config.nested(),
        plugins=plugin_set.run_versions(),
        task=server.task.to_dict(),
        device=str(server.ctx.device),
        records=server.records,
        events=server.events,
        wall_seconds=server.seconds,
        setup_bytes=server.setup_traffic,
    )
    if run_dir is not None:
        write_json(run_dir.results, results)
        write_text(run_dir.metrics_csv, metrics_csv(server.records))
    return results


def finish_run(server: Server, plugin_set: PluginSet, run_dir: RunDir | None) -> Results:
    """Write the complete results and their plots."""
    results = write_results("complete", server, plugin_set, run_dir)
    if run_dir is not None:
        plot_run(results, run_dir.path)
    return results
