"""Config: YAML nesting, --set parsing, validation with helpful errors, plugin/task keys."""

import pytest

from fedkit_core import FedkitError, Option, resolve_config
from fedkit_core.config import CORE_OPTIONS, load_yaml, parse_sets, resolve, safe_yaml


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


@pytest.mark.parametrize("typo", ["lerning_rate", "learning_rat", "num_round"])
def test_a_typo_of_another_tools_key_suggests_fedkits_own(typo):
    with pytest.raises(FedkitError) as err:
        resolve([{typo: 0.1}], CORE_OPTIONS)
    suggested = {"lerning_rate": "lr", "learning_rat": "lr", "num_round": "rounds"}[typo]
    assert f"Did you mean '{suggested}'" in str(err.value)


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


def test_option_ranges_are_inclusive_and_checked_per_list_item():
    opt = Option("lambda_f", float, 0.5, min=0, max=1)
    assert opt.coerce("0", "k") == 0.0 and opt.coerce(1, "k") == 1.0
    with pytest.raises(FedkitError, match=r"^config key 'fed-mas.lambda_f' must be >= 0, got -1$"):
        opt.coerce(-1, "fed-mas.lambda_f")
    with pytest.raises(FedkitError, match="must be <= 1, got 1.5"):
        opt.coerce("1.5", "k")
    items = Option("sizes", "list[int]", [1], min=1)
    assert items.coerce("[1, 2]", "k") == [1, 2]
    with pytest.raises(FedkitError, match="'k' must be >= 1, got 0"):
        items.coerce([3, 0], "k")
    assert Option("n", int, None, min=1).coerce(None, "k") is None


def test_a_choice_that_yaml_reads_as_a_boolean_is_taken_as_written():
    """``--set fca.consistency=off`` and ``eval_with_fit=true`` reach the option as bools."""
    assert Option("c", str, "paper", choices=("paper", "off")).coerce(False, "k") == "off"
    assert Option("c", str, "auto", choices=("auto", "true", "false")).coerce(True, "k") == "true"
    assert Option("c", str, "a", choices=("a", "yes", "no")).coerce(False, "k") == "no"
    with pytest.raises(FedkitError, match="expects str, got True"):
        Option("c", str, "paper", choices=("paper", "off")).coerce(True, "k")
    cfg, _ = resolve_config([{"plugins": ["fca"]}, {"fca.consistency": False}])
    assert cfg["fca.consistency"] == "off"


def test_option_ranges_show_in_describe():
    assert Option("a", float, 0.5, min=0, max=1).describe() == "float in [0, 1]"
    assert Option("a", int, None, min=1).describe() == "int or null >= 1"
    assert Option("a", "list[float]", [], max=2.5).describe() == "list[float] <= 2.5"


def test_bad_option_ranges_are_caught_where_declared():
    with pytest.raises(ValueError, match="numeric type"):
        Option("a", str, "x", min=0)
    with pytest.raises(ValueError, match="above max"):
        Option("a", int, 1, min=2, max=1)
    with pytest.raises(FedkitError, match="must be >= 0"):
        Option("a", int, -1, min=0)


def test_renamed_option_keeps_every_field_and_its_range_applies_when_resolving():
    opt = Option("lam", float, 0.5, "weight", min=0, max=1)
    named = opt.renamed("probe.lam")
    assert named == Option("probe.lam", float, 0.5, "weight", min=0, max=1)
    assert resolve([{"probe.lam": 0.25}], [named])["probe.lam"] == 0.25
    with pytest.raises(FedkitError, match="'probe.lam' must be <= 1, got 2"):
        resolve([{"probe.lam": 2}], [named])


def test_a_key_given_twice_in_a_yaml_file_is_refused_naming_both_lines(tmp_path):
    path = tmp_path / "twice.yaml"
    path.write_text("rounds: 1\nlr: 0.1\ntask:\n  name: synthetic\nlr: 1.0\n")
    with pytest.raises(
        FedkitError, match=r"\(line 5, column 1\): duplicate key 'lr' \(also on line 2"
    ):
        resolve_config(str(path))
    with pytest.raises(FedkitError, match="duplicate key 'a'"):  # in a flow mapping too
        safe_yaml("task: {a: 1, a: 2}", "--set")
    merged = "base: &b {lr: 0.1, rounds: 2}\nrun:\n  <<: *b\n  lr: 0.5\n"
    assert safe_yaml(merged, "x")["run"] == {"lr": 0.5, "rounds": 2}  # a merge may be overridden


def test_a_key_given_dotted_and_nested_in_one_file_is_refused_like_a_duplicate(tmp_path):
    """Before: the run took the last of them, silently."""
    path = tmp_path / "twice.yaml"
    path.write_text("rounds: 1\ndp.level: client\ndp:\n  level: none\n")
    with pytest.raises(
        FedkitError, match="duplicate key 'dp.level', given as 'dp.level' and as 'dp: level'"
    ):
        resolve_config(str(path))
    path.write_text("task: synthetic\ntask.name: npz\n")
    with pytest.raises(FedkitError, match="duplicate key 'task.name'"):
        resolve_config(str(path))
    path.write_text("dp.level: none\ndp:\n  delta: 0.00001\n")  # two keys of one section
    assert resolve_config(str(path))[0]["dp.delta"] == 0.00001


def test_exclusive_bounds_refuse_the_bound_itself():
    opt = Option("rate", float, 0.5, gt=0, lt=1)
    assert opt.coerce("0.25", "k") == 0.25
    with pytest.raises(FedkitError, match=r"^config key 'k' must be > 0, got 0$"):
        opt.coerce(0, "k")
    with pytest.raises(FedkitError, match=r"^config key 'k' must be < 1, got 1$"):
        opt.coerce(1.0, "k")
    share = Option("share", float, 1.0, gt=0, max=1)  # one side exclusive, one inclusive
    assert share.coerce(1, "k") == 1.0 and share.coerce(1e-12, "k") == 1e-12
    with pytest.raises(FedkitError, match="must be > 0, got 0"):
        share.coerce(0.0, "k")
    items = Option("alphas", "list[float]", None, gt=0)
    assert items.coerce([0.5, 2], "k") == [0.5, 2.0] and items.coerce(None, "k") is None
    with pytest.raises(FedkitError, match=r"'k' must be > 0, got 0$"):
        items.coerce([1, 0], "k")


def test_exclusive_bounds_show_in_describe():
    assert Option("a", float, 0.5, gt=0, lt=1).describe() == "float in (0, 1)"
    assert Option("a", float, 0.5, gt=0, max=1).describe() == "float in (0, 1]"
    assert Option("a", float, 0.5, min=0, lt=1).describe() == "float in [0, 1)"
    assert Option("a", float, None, gt=0).describe() == "float or null > 0"
    assert Option("a", "list[float]", [], lt=2.5).describe() == "list[float] < 2.5"


def test_bad_exclusive_bounds_are_caught_where_declared():
    with pytest.raises(ValueError, match="give min .inclusive. or gt .exclusive., not both"):
        Option("a", float, 1.0, min=0, gt=0)
    with pytest.raises(ValueError, match="give max .inclusive. or lt .exclusive., not both"):
        Option("a", float, 0.5, max=1, lt=1)
    with pytest.raises(ValueError, match="no value is above 1 and below 1"):
        Option("a", float, None, gt=1, lt=1)
    with pytest.raises(ValueError, match="numeric type"):
        Option("a", str, "x", gt=0)
    with pytest.raises(ValueError, match="needs min/max/gt/lt"):
        Option("a", int, 1, rule="at least 1")
    with pytest.raises(FedkitError, match="must be > 0, got 0"):
        Option("a", float, 0.0, gt=0)  # the default is checked too


def test_a_rule_says_the_bounds_in_words():
    """The core's keys say their bounds in words (as before they were options' bounds)."""
    opt = Option("timeout", float, None, gt=0, rule="above 0 (or null: no limit)")
    assert opt.coerce(None, "timeout") is None
    with pytest.raises(
        FedkitError, match=r"^timeout must be above 0 \(or null: no limit\), got 0.0$"
    ):
        opt.coerce(0, "timeout")
    assert opt.describe() == "float or null > 0"


@pytest.mark.parametrize(
    "key, good, bad, message",
    [
        ("rounds", 1, 0, "rounds must be at least 1, got 0"),
        ("clients", None, 0, "clients must be at least 1, got 0"),
        ("seed", 0, -1, "seed must be 0 or more, got -1"),
        ("client_timeout", 0.001, 0, r"client_timeout must be above 0 \(or null: no limit\)"),
        ("lr", 1e-9, 0, "lr must be above 0, got 0.0"),
        ("sample_fraction", 1, 0, r"sample_fraction must be in \(0, 1\], got 0.0"),
        ("task.val_fraction", 0.5, 1, r"task.val_fraction must be in \(0, 1\), got 1.0"),
        ("partition.drop_prob", 0, 1, r"partition.drop_prob must be in \[0, 1\), got 1.0"),
        ("task.image_size", 4096, 4097, r"task.image_size must be in \[1, 4096\] \(or null"),
        ("adam_betas", [0.0, 0.99], [0.9, 1.0], r"adam_betas must be two values in \[0, 1\)"),
        ("partition.alphas", [0.1, 2], [1, 0], r"partition.alphas must be all above 0, got"),
    ],
)
def test_the_core_keys_bounds_are_their_options(key, good, bad, message):
    """No table of ranges beside the options: resolving the core options alone checks them."""
    assert resolve([{key: good}], CORE_OPTIONS)[key] == good
    with pytest.raises(FedkitError, match=message):
        resolve([{key: bad}], CORE_OPTIONS)


def test_list_lengths_are_checked_with_the_keys_words():
    with pytest.raises(
        FedkitError, match=r"^adam_betas must be two values in \[0, 1\), got \[0.5\]$"
    ):
        resolve_config({"adam_betas": [0.5]})
    with pytest.raises(FedkitError, match=r"^unet_channels must be at least 1 each, not empty"):
        resolve_config({"unet_channels": []})
