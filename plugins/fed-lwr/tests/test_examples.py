"""The example configs of examples/fed-lwr resolve (the prostate one where that task exists)."""

from pathlib import Path

import pytest

from fedkit_core.testing import all_tasks, load_yaml, resolve_config

EXAMPLES = Path(__file__).resolve().parents[3] / "examples" / "fed-lwr"


@pytest.mark.parametrize("path", sorted(EXAMPLES.glob("*.yaml")), ids=lambda p: p.name)
def test_example_configs_resolve(path):
    task = load_yaml(path)["task"]["name"]
    if task not in all_tasks():
        pytest.skip(f"task {task!r} is not registered in this fedkit")
    config, _ = resolve_config(str(path))
    assert config["plugins"] == ["fed-lwr"]
    assert config["loss"] == "dice" and config["model"] == "unet"
    assert config["batch_size"] == 8 and config["adam_betas"] == [0.9, 0.99]


def test_examples_exist():
    assert {p.name for p in EXAMPLES.glob("*.yaml")} >= {"paper.yaml", "drive-cpu.yaml"}
