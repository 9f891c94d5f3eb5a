"""The zoo as a whole: `fedkit tasks`, missing-data errors, and caching through a loader."""

import importlib

import pytest
from typer.testing import CliRunner

from fedkit_core.cli import app as cli
from fedkit_core.errors import FedkitError
from fedkit_core.tasks import files, fundus
from fedkit_core.tasks.registry import BUILTINS, all_tasks, get_task

ZOO = (
    "prostate",
    "rif",
    "ixi",
    "isic2019",
    "hyperkvasir",
    "oct-c8",
    "kvasir-v2",
    "rsna-ich",
    "pneumonia-cxr",
    "lung-cxr",
    "medmnist",
)


def test_fedkit_tasks_lists_every_task_and_its_data(tmp_path, monkeypatch):
    monkeypatch.setenv("FEDKIT_DATA", str(tmp_path))
    fundus.write_fake(tmp_path / "rif")
    (tmp_path / "prostate").mkdir()
    monkeypatch.setattr(cli.console, "width", 250)  # one table row per line
    result = CliRunner().invoke(cli.app, ["tasks"])
    assert result.exit_code == 0, result.output
    rows: dict[str, str] = {}  # task name -> its row's lines joined (path under description)
    for line in (line for line in result.output.splitlines() if "│" in line):
        name = line.split("│")[1].strip()
        if name:
            current = name
            rows[name] = line
        else:
            rows[current] += line
    for name in ("synthetic", "npz", "npz-seg", *ZOO):
        assert name in rows, name
    assert "found" in rows["rif"] and str(tmp_path / "rif") in rows["rif"]
    assert "not in layout" in rows["prostate"]
    assert "missing" in rows["ixi"]
    assert "split1, split2" in rows["rsna-ich"]


@pytest.mark.parametrize("name", ("npz", "npz-seg", *ZOO))
def test_each_task_module_is_one_unit(tmp_path, name):
    """A built-in task's module holds its spec, its loader and a fake copy of its data in
    the layout the spec describes (its markers find it)."""
    module = importlib.import_module(BUILTINS[name])
    assert module.SPEC is get_task(name) and callable(module.load)
    path = module.write_fake(tmp_path / "data")
    assert module.SPEC.data_status(str(path)) == "found"


@pytest.mark.parametrize("name", ZOO)
def test_every_task_documents_its_data(name):
    spec = all_tasks()[name]
    assert spec.needs_path and spec.layout and spec.source.count("http") >= 1
    assert spec.default_dir == name


@pytest.mark.slow
@pytest.mark.parametrize("name", ZOO)
@pytest.mark.parametrize("state", ["absent", "empty"])
def test_missing_data_names_layout_and_source(tmp_path, load, name, state):
    path = tmp_path / "data"
    if state == "empty":
        path.mkdir()
        (path / "unrelated").mkdir()
    with pytest.raises(FedkitError) as err:
        load(name, path)
    message = str(err.value)
    assert all_tasks()[name].layout in message
    assert "published at" in message or "medmnist.com" in message


def test_second_load_skips_decoding(tmp_path, load, monkeypatch):
    fundus.write_fake(tmp_path, counts={"train": 2, "test": 1})
    calls = []
    read = files.read_image
    monkeypatch.setattr(files, "read_image", lambda *a, **k: calls.append(1) or read(*a, **k))
    first = load("rif", tmp_path, image_size=8)
    decoded = len(calls)
    second = load("rif", tmp_path, image_size=8)
    assert decoded == 12 and len(calls) == decoded  # 4 domains x 3 images, then none
    for site in first.sites:
        assert (first.sites[site]["test"].targets == second.sites[site]["test"].targets).all()
    load("rif", tmp_path, image_size=12)  # other options: decoded again
    assert len(calls) == 2 * decoded
