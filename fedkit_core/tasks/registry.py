"""The task registry: the built-in tasks plus those installed under entry-point group
``fedkit.tasks``, as plugins are found under ``fedkit.plugins``.

An entry names a module exposing its :class:`TaskSpec` as ``SPEC`` (``"pkg.retina"``) or
an object that is, or exposes, one (``"pkg.retina:SPEC"``); the entry point's name is the
task's name. :data:`BUILTINS` lists the built-in tasks the same way (pyproject.toml
declares them under the group too, but the registry must not depend on installed
metadata). Modules are imported only when a task is looked up, and no task module imports
this one, so there is no import cycle.
"""

from __future__ import annotations

from importlib.metadata import EntryPoint, entry_points

from fedkit_core.errors import FedkitError, unknown
from fedkit_core.tasks.spec import TaskSpec

ENTRY_POINT_GROUP = "fedkit.tasks"

#: Built-in tasks: name -> the module exposing its ``SPEC`` (in `fedkit tasks` order).
BUILTINS = {
    "synthetic": "fedkit_core.tasks.synthetic",
    "synthetic-seg": "fedkit_core.tasks.synthetic_seg",
    "npz": "fedkit_core.tasks.npz",
    "npz-seg": "fedkit_core.tasks.npz_seg",
    "folder": "fedkit_core.tasks.folder",
    "folder3d": "fedkit_core.tasks.folder3d",
    "prostate": "fedkit_core.tasks.prostate",
    "rif": "fedkit_core.tasks.fundus",
    "ixi": "fedkit_core.tasks.ixi",
    "isic2019": "fedkit_core.tasks.isic",
    "hyperkvasir": "fedkit_core.tasks.hyperkvasir",
    "oct-c8": "fedkit_core.tasks.oct_c8",
    "kvasir-v2": "fedkit_core.tasks.kvasir_v2",
    "rsna-ich": "fedkit_core.tasks.rsna",
    "pneumonia-cxr": "fedkit_core.tasks.pneumonia",
    "lung-cxr": "fedkit_core.tasks.lung",
    "medmnist": "fedkit_core.tasks.medmnist",
}

_registered: dict[str, TaskSpec] = {}


def register_task(spec: TaskSpec) -> TaskSpec:
    """Register a task at runtime (an embedding application's own data, tests); packages
    use the entry-point group instead. A built-in task's name stays the built-in."""
    _registered[spec.name] = spec
    return spec


def _sources() -> dict[str, EntryPoint | TaskSpec]:
    """Every task name -> where its spec comes from: built-ins first, then tasks registered
    at runtime, then installed ones; a later source never shadows an earlier one."""
    sources: dict[str, EntryPoint | TaskSpec] = {
        name: EntryPoint(name, value, ENTRY_POINT_GROUP) for name, value in BUILTINS.items()
    }
    for name, spec in _registered.items():
        sources.setdefault(name, spec)
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        sources.setdefault(ep.name, ep)
    return sources


def _load(name: str, source: EntryPoint | TaskSpec) -> TaskSpec:
    if isinstance(source, TaskSpec):
        return source
    try:
        obj = source.load()
    except Exception as err:  # a broken third-party package: say which one
        raise FedkitError(
            f"task {name!r} ({source.value}) failed to load: {type(err).__name__}: {err}"
        ) from err
    spec = obj if isinstance(obj, TaskSpec) else getattr(obj, "SPEC", None)
    if not isinstance(spec, TaskSpec):
        raise FedkitError(
            f"task {name!r} ({source.value}) of group {ENTRY_POINT_GROUP} is neither a "
            "TaskSpec nor a module or object with a TaskSpec named SPEC"
        )
    if spec.name != name:
        raise FedkitError(
            f"task {name!r} ({source.value}) holds the spec of a task named {spec.name!r}"
        )
    return spec


def all_tasks() -> dict[str, TaskSpec]:
    """Every known task by name: built-ins, then registered and installed ones."""
    return {name: _load(name, source) for name, source in _sources().items()}


#: MedMNIST's 2D data sets: flags of the ``medmnist`` task, not tasks of their own
MEDMNIST_FLAGS = (
    "pathmnist", "chestmnist", "dermamnist", "octmnist", "pneumoniamnist", "retinamnist",
    "breastmnist", "bloodmnist", "tissuemnist", "organamnist", "organcmnist", "organsmnist",
)  # fmt: skip


def get_task(name: str) -> TaskSpec:
    """The task ``name`` (only its own module is imported), or an error listing the tasks
    (a MedMNIST data set's name: how to run it as the ``medmnist`` or ``npz`` task)."""
    sources = _sources()
    if name not in sources and name.lower() in MEDMNIST_FLAGS:
        flag = name.lower()
        raise FedkitError(
            f"unknown task {name!r}: MedMNIST's data sets are flags of the medmnist task, "
            f"`--task medmnist --set task.flag={flag}` (pip install 'fedkit[medmnist]'; "
            f"add --set task.download=true the first time), or, with the file at hand, "
            f"`--task npz --set task.path=PATH/{flag}.npz`"
        )
    if name not in sources:
        raise unknown("task", name, sources)
    return _load(name, sources[name])
