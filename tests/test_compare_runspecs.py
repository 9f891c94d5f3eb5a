"""`fedkit compare`: the config layers each runspec gets."""

from fedkit_core.results import compare


def test_plugin_keys_of_the_shared_config_and_sets_reach_only_runspecs_using_the_plugin(
    monkeypatch,
):
    monkeypatch.setattr(compare, "installed", lambda: {"meth": None, "other": None})
    shared = {"plugins": ["meth"], "rounds": 7, "meth": {"alpha": 2}, "other.beta": 1}
    sets = {"lr": 0.1, "meth.alpha": 3}

    fedavg = compare.runspec_layers("fedavg", [shared], sets)
    assert fedavg == [{"plugins": ["meth"], "rounds": 7}, {"plugins": []}, {"lr": 0.1}]

    both = compare.runspec_layers("meth+other", [shared], sets)
    assert both[0] == shared and both[1] == {"plugins": ["meth", "other"]}
    assert both[2] == sets
