"""Config: YAML nesting, --set parsing, validation with helpful errors, plugin/task keys."""

import pytest

from fedkit_core import FedkitError, resolve_config
from fedkit_core.config import CORE_OPTIONS, load_yaml, parse_sets, resolve


def test_nested_yaml_and_dotted_keys_resolve_the_same(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("rounds: 3\ntask:\n  name: npz\n  path: x.npz\npartition:\n  kind: dirichlet\n")
    a = resolve([load_yaml(path)], CORE_OPTIONS)
    b = resolve(
        [{"rounds": 3, "task.name": "npz", "task.path": "x.npz", "partition.kind": "dirichlet"}],
        CORE_OPTIONS,
    )
    assert dict(a) == dict(b)
    assert a.nested()["task"]["path"] == "x.npz"


def test_later_layers_win_and_values_are_typed():
    cfg = resolve(
        [{"lr": 0.1}, parse_sets(["lr=0.5", "rounds=7", "partition.alphas=[1, 2.5]"])], CORE_OPTIONS
    )
    assert cfg["lr"] == 0.5 and cfg["rounds"] == 7 and cfg["partition.alphas"] == [1.0, 2.5]


def test_unknown_key_names_close_matches_and_valid_keys():
    with pytest.raises(FedkitError) as err:
        resolve([{"round": 3}], CORE_OPTIONS)
    assert "Did you mean 'rounds'" in str(err.value) and "local_epochs" in str(err.value)


@pytest.mark.parametrize(
    "layer, message",
    [
        ({"rounds": "many"}, "expects int"),
        ({"lr": [1]}, "expects float"),
        ({"optimizer": "lbfgs"}, "must be one of"),
        ({"keep_optimizer_state": "maybe"}, "expects bool"),
    ],
)
def test_wrong_types_are_errors(layer, message):
    with pytest.raises(FedkitError, match=message):
        resolve([layer], CORE_OPTIONS)


def test_bad_yaml_and_missing_file_are_user_errors(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("rounds: [1,\n")
    with pytest.raises(FedkitError, match="not valid YAML"):
        load_yaml(bad)
    with pytest.raises(FedkitError, match="not found"):
        load_yaml(tmp_path / "absent.yaml")
    with pytest.raises(FedkitError, match="key=value"):
        parse_sets(["rounds"])


def test_task_options_and_defaults_join_the_schema():
    cfg, _ = resolve_config({"task": {"name": "synthetic-seg", "sites": 5}})
    assert cfg["task.sites"] == 5 and cfg["model"] == "unet" and cfg["loss"] == "dice"
    with pytest.raises(FedkitError, match="task.flavour"):
        resolve_config({"task": {"name": "synthetic", "flavour": 1}})


def test_unknown_task_and_plugin_are_user_errors():
    with pytest.raises(FedkitError, match="unknown task 'synthetc'.*Did you mean 'synthetic'"):
        resolve_config({"task": "synthetc"})
    with pytest.raises(FedkitError, match="unknown plugin 'no-such-method'"):
        resolve_config({"plugins": ["no-such-method"]})
    with pytest.raises(FedkitError, match="is for segmentation"):
        resolve_config({"loss": "dice"})
