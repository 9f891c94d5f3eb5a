"""What a task is: a :class:`TaskSpec`, plus the settings several tasks' specs share.

Every task module exposes its spec as ``SPEC`` next to its loader and its fake-data writer;
the registry (:mod:`fedkit_core.tasks.registry`) finds the module. This module imports no
task module and not the registry, so task modules can import it freely.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fedkit_core.contract.options import Option
from fedkit_core.errors import FedkitError, unknown

if TYPE_CHECKING:
    from fedkit_core.config import Config
    from fedkit_core.contract.data import TaskData

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


def fedcb_partitions(clients: int) -> dict[str, dict[str, Any]]:
    """FedCB's splits: ``clients`` clients, Dirichlet over clients per class, alpha 0.05 or 0.1."""
    return {
        f"fedcb-{alpha}": {
            "partition.kind": "dirichlet",
            "partition.alpha": alpha,
            "clients": clients,
        }
        for alpha in (0.05, 0.1)
    }


@dataclass(frozen=True)
class TaskSpec:
    """A task: its name, its loader, its ``task.*`` options and the defaults it suggests for
    core keys (a segmentation task picks U-Net and Dice), and where its data comes from."""

    name: str
    description: str
    kind: str
    #: ``"module:function"`` or the function itself: ``loader(config) -> TaskData``
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
        if not (root.is_dir() or root.is_file()):
            return "not a file"
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
        elif Path(path).exists() and not (Path(path).is_dir() or Path(path).is_file()):
            what = f"task.path={path} is neither a file nor a folder (a FIFO, socket or device)"
        elif Path(path).exists():
            what = f"task.path={path} holds no data in the expected layout"
        else:
            what = f"task.path={path} does not exist"
        return self.data_error(what + ".")

    def layout_error(self, root: Path | str, problem: str) -> FedkitError:
        """A loader's error: the problem, where it looked, the expected layout and source."""
        return self.data_error(f"{problem} (looked in {root})")

    def data_error(self, problem: str) -> FedkitError:
        """A FedkitError stating ``problem``, then the expected layout and where to get the data."""
        lines = [f"task {self.name!r}: {problem}"]
        if self.layout:
            lines.append(f"Expected layout: {self.layout}")
        if self.source:
            lines.append(f"The data is published at: {self.source}")
        return FedkitError("\n".join(lines))
