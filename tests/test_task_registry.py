"""The task registry (built-ins, entry points, no import cycle), named partitions
(``partition.preset``) and the layout markers of `fedkit tasks`."""

import ast
import sys
import types
from importlib.metadata import EntryPoint
from pathlib import Path

import pytest
import torch

import fedkit_core.tasks
from fedkit_core.contract.data import CLASSIFICATION, Split, TaskData
from fedkit_core.errors import FedkitError
from fedkit_core.resolve import resolve_config
from fedkit_core.tasks import registry
from fedkit_core.tasks.loading import load_task
from fedkit_core.tasks.registry import TaskSpec, all_tasks, get_task

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def preset_task(monkeypatch):
    spec = TaskSpec(
        name="preset-demo",
        description="demo",
        kind="classification",
        loader="fedkit_core.tasks.synthetic:load",
        defaults={"rounds": 3},
        partitions={"two": {"partition.kind": "dirichlet", "clients": 2, "partition.alpha": 9.0}},
    )
    monkeypatch.setattr(registry, "_registered", {})
    return registry.register_task(spec)


def _tiny_data(config) -> TaskData:
    def split(n: int) -> Split:
        return Split(torch.zeros(n, 1, 8, 8, dtype=torch.uint8), torch.arange(n) % 2)

    return TaskData(CLASSIFICATION, ["a", "b"], {"only": {"train": split(8), "test": split(4)}})


@pytest.fixture
def installed(monkeypatch):
    """``installed(name=value, ...)``: entry points of group fedkit.tasks, as if installed,
    over a throwaway module ``throwaway_tasks`` holding a task ``throwaway``."""
    module = types.ModuleType("throwaway_tasks")
    module.SPEC = TaskSpec("throwaway", "a third party's task", CLASSIFICATION, _tiny_data)
    module.broken = object()  # not a TaskSpec
    monkeypatch.setitem(sys.modules, "throwaway_tasks", module)

    def install(**entries: str) -> None:
        eps = [
            EntryPoint(name, value, registry.ENTRY_POINT_GROUP) for name, value in entries.items()
        ]
        monkeypatch.setattr(
            registry,
            "entry_points",
            lambda group: eps if group == registry.ENTRY_POINT_GROUP else [],
        )

    return install


def test_installed_task_is_found_and_loads(installed):
    installed(throwaway="throwaway_tasks")
    spec = get_task("throwaway")
    assert spec.description == "a third party's task"
    assert list(all_tasks())[-1] == "throwaway"  # after the built-ins
    config, _ = resolve_config({"task": "throwaway"})
    assert len(load_task(config).sites["only"]["test"]) == 4


def test_installed_task_may_name_the_spec_object(installed):
    installed(throwaway="throwaway_tasks:SPEC")
    assert get_task("throwaway").kind == CLASSIFICATION


def test_installed_task_cannot_shadow_a_builtin(installed):
    installed(synthetic="throwaway_tasks")
    assert get_task("synthetic").description.startswith("built-in")


@pytest.mark.parametrize(
    "value, message",
    [
        ("no_such_package.tasks", "failed to load: ModuleNotFoundError"),
        ("throwaway_tasks:broken", "neither a TaskSpec"),
        ("throwaway_tasks:SPEC", "holds the spec of a task named 'throwaway'"),
    ],
)
def test_broken_installed_task_is_named(installed, value, message):
    installed(mytask=value)
    for lookup in (lambda: get_task("mytask"), all_tasks):
        with pytest.raises(FedkitError, match=message) as err:
            lookup()
        assert f"task 'mytask' ({value})" in str(err.value)
    assert get_task("synthetic").name == "synthetic"  # other tasks still work


def test_unknown_task_lists_the_known_ones(installed):
    installed(throwaway="throwaway_tasks")
    with pytest.raises(FedkitError, match="throwaway"):
        get_task("throwaway2")


@pytest.mark.parametrize("name", ["pneumoniamnist", "RetinaMNIST"])
def test_a_medmnist_flag_as_task_says_how_to_run_it(name):
    with pytest.raises(FedkitError) as err:
        get_task(name)
    flag = name.lower()
    assert f"--task medmnist --set task.flag={flag}" in str(err.value)
    assert f"--task npz --set task.path=PATH/{flag}.npz" in str(err.value)
    assert "pneumonia-cxr" not in str(err.value)  # not the nearest name of another task


def test_builtins_are_declared_in_pyproject_too():
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["entry-points"][registry.ENTRY_POINT_GROUP] == registry.BUILTINS


def _task_imports(path: Path) -> set[str]:
    """The fedkit_core.tasks modules ``path`` imports, at module level or in functions."""
    package, found = fedkit_core.tasks.__name__, set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module == package:
            found |= {f"{package}.{alias.name}" for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith(package):
            found.add(node.module)
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith(package + ".")}
    return found


def test_no_import_cycle_in_tasks():
    folder = Path(fedkit_core.tasks.__file__).parent
    graph = {
        f"fedkit_core.tasks.{p.stem}": _task_imports(p)
        for p in folder.glob("*.py")
        if p.stem != "__init__"
    }
    # the registry reaches task modules by name only, when a task is looked up
    assert graph["fedkit_core.tasks.registry"] == {"fedkit_core.tasks.spec"}
    done: set[str] = set()

    def visit(module: str, path: tuple[str, ...]) -> None:
        assert module not in path, " -> ".join((*path, module))
        if module not in done:
            for dependency in graph.get(module, ()):
                visit(dependency, (*path, module))
            done.add(module)

    for module in graph:
        visit(module, ())


def test_preset_sets_partition_defaults(preset_task):
    cfg, _ = resolve_config({"task": "preset-demo", "partition": {"preset": "two"}})
    assert (cfg["partition.kind"], cfg["clients"], cfg["partition.alpha"]) == ("dirichlet", 2, 9.0)
    assert cfg["rounds"] == 3  # the task's own defaults still apply


def test_user_keys_win_over_preset(preset_task):
    cfg, _ = resolve_config({"task": "preset-demo", "partition.preset": "two", "clients": 5})
    assert cfg["clients"] == 5
    assert cfg["partition.kind"] == "dirichlet"


def test_unknown_preset_lists_valid_ones(preset_task):
    with pytest.raises(FedkitError, match="two"):
        resolve_config({"task": "preset-demo", "partition.preset": "three"})


def test_markers_decide_found(tmp_path):
    spec = TaskSpec("m", "m", "classification", "x:y", needs_path=True, markers=("*/train/*.png",))
    assert spec.data_status(str(tmp_path / "absent")) == "missing"
    assert spec.data_status(str(tmp_path)) == "not in layout"
    assert "holds no data in the expected layout" in str(spec.missing_data_error(str(tmp_path)))
    (tmp_path / "a" / "train").mkdir(parents=True)
    (tmp_path / "a" / "train" / "x.png").write_bytes(b"")
    assert spec.data_status(str(tmp_path)) == "found"


def test_task_path_expands_home(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    cfg, _ = resolve_config({"task": "npz", "task.path": "~/data.npz"})
    assert cfg["task.path"] == str(tmp_path / "data.npz")
