"""Usage errors of the fedkit command, `fedkit config`, and the install hint of a bundled plugin."""

import pytest

from fedkit_core import plugin_manager
from fedkit_core.cli import main
from fedkit_core.resolve import resolve_config


@pytest.mark.parametrize(
    "argv, expected",
    [
        # a mistyped option: named, with the close matches (click: "Did you mean one of";
        # typer >= 0.26: "Possible options")
        (["run", "--round", "2"], ["--round", "--rounds"]),
        # a value of the wrong type: the option named
        (["run", "--rounds", "abc"], ["Invalid value for '--rounds'"]),
        # a missing argument
        (["compare"], ["Missing argument", "Try 'fedkit compare --help'"]),
        # an unknown command, with one suggestion
        (["rnu"], ["No such command 'rnu'", "Did you mean 'run'?"]),
        # a mistyped option of a subcommand group
        (["flower", "--hlep"], ["No such option", "--help"]),
    ],
    ids=["option", "value", "argument", "command", "group-option"],
)
def test_usage_errors_exit_2_and_say_what_to_type(argv, expected, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    for text in expected:
        assert text in err
    assert "internal error" not in err
    assert err.count("Did you mean") <= 1


def test_help_exits_0_and_points_run_to_config(capsys):
    assert main(["run", "--help"]) == 0
    assert "fedkit config" in capsys.readouterr().out


def test_config_lists_every_key_with_type_default_and_help(capsys):
    argv = ["config", "--plugin", "fca", "--task", "synthetic", "--engine", "flower"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    cfg, _ = resolve_config({"plugins": ["fca"], "task.name": "synthetic", "engine": "flower"})
    lines = [line.strip() for line in out.splitlines()]
    words = " ".join(out.split())  # long lines wrap at 80 columns
    for key, option in cfg.options.items():
        assert f" {key} {option.describe()} = " in words, key
    # the plugin's, the task's and the engine's keys, each in its section, with help
    for line in ("plugin fca", "task synthetic", "engine flower", "checkpoint  bool = true"):
        assert line in lines
    assert "fca.l1  float = 1.0" in lines
    assert "weight of the federated head's calibrated loss (lambda_1)" in words
    assert "< --config FILE < a runspec's own YAML (fedkit compare) < --set" in words
    assert max(map(len, out.splitlines())) <= 80


def test_unknown_bundled_plugin_says_what_to_install(monkeypatch, capsys):
    monkeypatch.setattr(plugin_manager, "installed", dict)  # as on a core-only install
    assert main(["config", "--plugin", "fed-mas"]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "unknown plugin 'fed-mas'" in err
    assert "pip install -e plugins/fed-mas" in err
    assert main(["config", "--plugin", "fedcb"]) == 2  # with the extra of its default encoder
    err = " ".join(capsys.readouterr().err.split())
    assert "pip install -e 'plugins/fedcb[offline]' ([offline]: its default text encoder" in err
    assert main(["config", "--plugin", "fedprx"]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "unknown plugin 'fedprx'" in err and "pip install" not in err
