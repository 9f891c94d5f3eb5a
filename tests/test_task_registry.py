"""Named partitions (``partition.preset``) and the layout markers of `fedkit tasks`."""

import pytest

from fedkit_core.errors import FedkitError
from fedkit_core.resolve import resolve_config
from fedkit_core.tasks import registry
from fedkit_core.tasks.registry import TaskSpec


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
    monkeypatch.setitem(registry._BUILTIN, spec.name, spec)
    return spec


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
