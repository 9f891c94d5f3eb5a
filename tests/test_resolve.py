"""Resolution in one pass: the layers are read once for the choices (plugins, task, engine,
partition preset), each registry is asked once, the config is merged and checked once."""

import pytest

import fedkit_core.resolve as resolve_module
from fedkit_core import FedkitError, Option, resolve_config
from fedkit_core.config import Choices, read_choices
from fedkit_core.plugin import hookimpl


def test_choices_come_from_the_highest_layer_that_sets_them():
    layers = [
        {"plugins": ["fca"], "task": "npz", "engine": "flower", "partition": {"preset": "a"}},
        {"task": {"name": "synthetic-seg", "sites": 3}},
        {"task.name": "synthetic", "partition.preset": "b"},
        {"plugins": None},
    ]
    assert read_choices(layers) == Choices([], "synthetic", "flower", "b")
    assert read_choices([]) == Choices([], "synthetic", "local", None)
    assert read_choices([{"plugins": "fca,fed-lwr", "task": {"sites": 2}}]).plugins == [
        "fca",
        "fed-lwr",
    ]
    with pytest.raises(FedkitError, match="config key 'plugins' expects str"):
        read_choices([{"plugins": [{"a": 1}]}])


class _Counted:
    """A throwaway plugin with one option that counts how often it is asked for them."""

    def __init__(self):
        self.asked = 0

    @hookimpl
    def fedkit_options(self):
        self.asked += 1
        return [Option("weight", float, 0.5, "a weight", gt=0)]


def _count(monkeypatch, name, calls):
    real = getattr(resolve_module, name)

    def counted(*args, **kwargs):
        calls[name] = calls.get(name, 0) + 1
        return real(*args, **kwargs)

    monkeypatch.setattr(resolve_module, name, counted)


def test_resolution_reads_the_layers_once_and_asks_each_registry_once(monkeypatch, tmp_path):
    calls: dict[str, int] = {}
    for name in ("read_choices", "PluginSet", "get_task", "engine_options", "merge", "Config"):
        _count(monkeypatch, name, calls)
    probe = _Counted()
    path = tmp_path / "run.yaml"
    path.write_text("task: {name: synthetic, sites: 3}\nrounds: 3\npartition: {kind: iid}\n")
    layers = [str(path), {"plugins": ["fca"], "probe": {"weight": 2}}, {"rounds": 4}]
    cfg, plugins = resolve_config(layers, plugins={"probe": probe})
    assert calls == dict.fromkeys(calls, 1) and len(calls) == 6
    assert probe.asked == 1
    assert cfg["rounds"] == 4 and cfg["task.sites"] == 3 and cfg["probe.weight"] == 2
    assert plugins.active == ["fca", "probe"] and cfg["plugins"] == ["fca", "probe"]


def test_a_plugin_option_out_of_its_exclusive_bound_is_refused_when_resolving():
    with pytest.raises(FedkitError, match=r"^config key 'probe.weight' must be > 0, got 0$"):
        resolve_config({"probe": {"weight": 0}}, plugins={"probe": _Counted()})


def test_precedence_later_layers_win_for_choices_and_values():
    """--config < a runspec's YAML < --set and flags: the later layer wins, for the keys
    that choose (task) as for the others (their defaults follow the task chosen)."""
    cfg, _ = resolve_config([{"task": "synthetic-seg", "rounds": 2}, {"task": "synthetic"}])
    assert cfg["task.name"] == "synthetic" and cfg["model"] == "cnn" and cfg["rounds"] == 2
    cfg, _ = resolve_config([{"rounds": 2}, {"task": "synthetic"}])
    assert cfg["rounds"] == 2  # the user's value beats the task's default (20)
    assert resolve_config({"task": "synthetic"})[0]["rounds"] == 20
