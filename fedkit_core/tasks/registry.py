"""The task registry: built-in tasks plus those installed under entry-point group ``fedkit.tasks``.

A task is a :class:`TaskSpec`: a name, a loader returning :class:`TaskData`, its own
``task.*`` options and the defaults it suggests for core keys (a segmentation task picks
U-Net and Dice). Loaders are referenced as ``"module:function"`` so that listing tasks
does not import heavy libraries.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fedkit_core.errors import FedkitError, unknown
from fedkit_core.options import Option

if TYPE_CHECKING:
    from fedkit_core.config import Config
    from fedkit_core.tasks.base import TaskData

ENTRY_POINT_GROUP = "fedkit.tasks"
DATA_ROOT_ENV = "FEDKIT_DATA"


def data_root() -> Path:
    """Where tasks look for their data when ``task.path`` is not set: ``$FEDKIT_DATA``,
    by default ``~/fedkit-data``."""
    return Path(os.environ.get(DATA_ROOT_ENV, "~/fedkit-data")).expanduser()


#: Core defaults every segmentation task suggests (Fed-LWR's training setting).
SEGMENTATION_DEFAULTS: Mapping[str, Any] = {
    "model": "unet",
    "loss": "dice",
    "optimizer": "adam",
    "lr": 1e-3,
    "adam_betas": [0.9, 0.99],
    "weight_decay": 1e-4,
    "keep_optimizer_state": True,
    "batch_size": 8,
}


@dataclass(frozen=True)
class TaskSpec:
    """A registered task."""

    name: str
    description: str
    kind: str
    loader: str | Callable[[Config], TaskData]
    options: tuple[Option, ...] = ()
    defaults: Mapping[str, Any] = field(default_factory=dict)
    needs_path: bool = False
    layout: str = ""
    source: str = ""
    #: folder name under the data root used when ``task.path`` is unset (None: no default)
    default_dir: str | None = None
    #: glob patterns under ``task.path``; the data counts as found when one of them matches
    #: (a cheap check for `fedkit tasks`; the loader reports precisely what is missing)
    markers: tuple[str, ...] = ()
    #: named partitions (``partition.preset``): name -> core config values they default to
    partitions: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)

    def resolve_path(self, path: str | None) -> str | None:
        """``task.path`` if set (``~`` expanded), else the task's default folder under
        :func:`data_root`."""
        if path:
            return str(Path(path).expanduser())
        if not self.needs_path or self.default_dir is None:
            return path
        return str(data_root() / self.default_dir)

    def load(self, config: Config) -> TaskData:
        loader = self.loader
        if isinstance(loader, str):
            module, _, func = loader.partition(":")
            loader = getattr(importlib.import_module(module), func)
        return loader(config)

    def data_status(self, path: str | None) -> str:
        """``generated``, ``found``, ``missing``, ``not in layout`` or ``needs task.path``."""
        if not self.needs_path:
            return "generated"
        if not path:
            return "needs task.path"
        root = Path(path)
        if not root.exists():
            return "missing"
        markers = self.markers if root.is_dir() else ()
        if markers and not any(next(root.glob(pattern), None) for pattern in markers):
            return "not in layout"
        return "found"

    def partition_preset(self, name: str | None) -> dict[str, Any]:
        """The config values of the named partition ``name`` (``{}`` for None)."""
        if name is None:
            return {}
        if not self.partitions:
            raise FedkitError(f"task {self.name!r} has no named partitions (partition.preset)")
        if name not in self.partitions:
            raise unknown(f"partition.preset of task {self.name!r}", name, self.partitions)
        return dict(self.partitions[name])

    def missing_data_error(self, path: str | None) -> FedkitError:
        if not path:
            what = "task.path is not set"
        elif Path(path).exists():
            what = f"task.path={path} holds no data in the expected layout"
        else:
            what = f"task.path={path} does not exist"
        return self.data_error(what + ".")

    def data_error(self, problem: str) -> FedkitError:
        """A FedkitError stating ``problem``, then the expected layout and where to get the data."""
        lines = [f"task {self.name!r}: {problem}"]
        if self.layout:
            lines.append(f"Expected layout: {self.layout}")
        if self.source:
            lines.append(f"The data is published at: {self.source}")
        return FedkitError("\n".join(lines))


_BUILTIN: dict[str, TaskSpec] = {}


def register_task(spec: TaskSpec) -> TaskSpec:
    """Register a task (used by the built-ins; third parties use the entry-point group)."""
    _BUILTIN[spec.name] = spec
    return spec


def all_tasks() -> dict[str, TaskSpec]:
    """Every known task: built-ins, then installed ones (which may not shadow built-ins)."""
    import fedkit_core.tasks.builtin  # noqa: F401  (registers the built-in specs)

    tasks = dict(_BUILTIN)
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        if ep.name in tasks:
            continue
        try:
            spec = ep.load()
        except Exception as err:  # a broken third-party package must not break the CLI
            raise FedkitError(
                f"installed task {ep.name!r} ({ep.value}) failed to load: {err}"
            ) from err
        if not isinstance(spec, TaskSpec):
            raise FedkitError(
                f"entry point {ep.name!r} of group {ENTRY_POINT_GROUP} is not a TaskSpec"
            )
        tasks[ep.name] = spec
    return tasks


def get_task(name: str) -> TaskSpec:
    tasks = all_tasks()
    if name not in tasks:
        raise unknown("task", name, tasks)
    return tasks[name]
