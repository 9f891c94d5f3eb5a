"""Hostile input (issue 18): YAML bombs, deep nesting, huge numbers and labels, volumes read
as channels, a FIFO as data, out-of-range keys and operating system errors are all one
readable FedkitError (or error line), quickly and without allocating gigabytes."""

import os
import signal

import numpy as np
import pytest

from fedkit_core import FedkitError, run
from fedkit_core.cli import main
from fedkit_core.config import load_yaml, parse_sets
from fedkit_core.resolve import resolve_config
from fedkit_core.tasks.loading import load_task
from fedkit_core.testing import tiny


def _bomb(levels=9):
    lines = ['a0: &a0 ["x", "x", "x", "x", "x", "x", "x", "x", "x"]']
    for i in range(1, levels):
        lines.append(f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]")
    return "\n".join(lines) + f"\nlr_milestones: *a{levels - 1}\n"


@pytest.mark.slow
@pytest.mark.parametrize(
    "text, match",
    [
        (_bomb(), "expands to more than 100000 values"),
        ("x: " + "[" * 3000 + "]" * 3000 + "\n", "nests deeper than"),
        ("x: " + "[" * 40 + "]" * 40 + "\n", "nests deeper than"),
        ("rounds: " + "9" * 5000 + "\n", "holds a value fedkit cannot read"),
    ],
    ids=["alias-bomb", "deep-recursion", "deep", "long-int"],
)
def test_a_hostile_yaml_is_refused_in_a_short_message(tmp_path, text, match):
    path = tmp_path / "c.yaml"
    path.write_text(text)
    with pytest.raises(FedkitError, match=match) as err:
        load_yaml(path)
    assert len(str(err.value)) < 400


def test_values_are_quoted_in_a_line_not_pages():
    with pytest.raises(FedkitError, match=r"expects int, got '1111.*\.\.\.$") as err:
        resolve_config([tiny(), {"rounds": "1" * 100_000 + "x"}])
    assert len(str(err.value)) < 200
    with pytest.raises(FedkitError, match=r"unknown config key 'kkk.*\.\.\.'") as err:
        resolve_config([tiny(), {"k" * 100_000: 1}])
    assert len(str(err.value)) < 2000


@pytest.mark.parametrize(
    "key, value, match",
    [
        ("rounds", 10**30, "rounds' is out of range"),
        ("task.image_size", 1_000_000, "task.image_size must be in \\[1, 4096\\]"),
        ("min_clients", -3, "min_clients must be 0 or more"),
        ("partition.min_size", -5, "partition.min_size must be 0 or more"),
        # found by benchmarks/reliability_probe.py: accepted, or a client's ValueError
        ("weight_decay", -1.0, "weight_decay must be 0 or more"),
        ("momentum", -1.0, "momentum must be 0 or more"),
        ("grad_clip", -1.0, "grad_clip must be above 0"),
        ("lr_gamma", -1.0, "lr_gamma must be above 0"),
        ("adam_betas", [2.0, 3.0], "adam_betas must be two values in \\[0, 1\\)"),
        ("unet_channels", [], "unet_channels must be at least 1 each"),
        ("evaluation_bins", 0, "evaluation_bins must be at least 1"),
        ("task.num_classes", 1, "task.num_classes"),  # internal errors before
        ("task.imbalance", 0.5, "task.imbalance"),
        ("task.head_samples", 0, "task.head_samples"),
    ],
)
def test_out_of_range_keys_are_refused(key, value, match):
    with pytest.raises(FedkitError, match=match):
        resolve_config([tiny(), {key: value}])


def test_more_min_clients_than_clients_is_refused():
    """Not silently lowered to the number of clients: no round could ever have that many."""
    with pytest.raises(FedkitError, match="min_clients is 10 but the federation has 3 clients"):
        run(tiny(min_clients=10))


def test_flower_nodes_must_be_positive():
    with pytest.raises(FedkitError, match="flower.nodes' must be >= 1"):
        resolve_config([tiny(engine="flower"), {"flower.nodes": 0}])
    assert main(["flower", "submit", "--superlink", "127.0.0.1:1", "--nodes", "-1"]) == 2


def test_a_hash_in_a_set_value_is_text_not_a_comment():
    assert parse_sets(["name=a #b", "plugins=[fca]", "note=x#y", 'name2="q #r"']) == {
        "name": "a #b",
        "plugins": ["fca"],
        "note": "x#y",
        "name2": "q #r",
    }


def _npz(path, labels, images=None):
    images = np.zeros((4, 8, 8), np.uint8) if images is None else images
    np.savez(path, train_images=images, train_labels=labels, test_images=images, test_labels=labels)
    return path


@pytest.mark.parametrize(
    "labels, images, match",
    [
        (np.array([0, 1, 2, 10**9]), None, "the largest label is 1000000000"),
        (np.array([0, 1, 0, 1]), np.zeros((4, 16, 8, 8), np.uint8), "a 3-D volume"),
    ],
    ids=["huge-label", "volume"],
)
def test_data_that_would_allocate_gigabytes_is_refused(tmp_path, labels, images, match):
    path = _npz(tmp_path / "d.npz", labels, images)
    cfg, _ = resolve_config({"task": {"name": "npz", "path": str(path)}})
    with pytest.raises(FedkitError, match=match):
        load_task(cfg)


def test_huge_mask_values_are_refused(tmp_path):
    masks = np.zeros((4, 8, 8), np.int64)
    masks[0, 0, 0] = 10**9
    path = tmp_path / "s.npz"
    np.savez(
        path,
        images=np.zeros((4, 8, 8), np.uint8),
        masks=masks,
        split=np.array(["train", "train", "test", "test"]),
    )
    cfg, _ = resolve_config({"task": {"name": "npz-seg", "path": str(path)}})
    with pytest.raises(FedkitError, match="the largest label is 1000000000"):
        load_task(cfg)


def _no_hang(seconds):
    def alarm(*_):
        raise TimeoutError("hung")

    signal.signal(signal.SIGALRM, alarm)
    signal.alarm(seconds)


def test_a_fifo_as_task_path_is_refused_without_hanging(tmp_path):
    fifo = tmp_path / "data.npz"
    os.mkfifo(fifo)
    cfg, _ = resolve_config({"task": {"name": "npz", "path": str(fifo)}})
    _no_hang(20)
    try:
        with pytest.raises(FedkitError, match="neither a file nor a folder"):
            load_task(cfg)
    finally:
        signal.alarm(0)


def test_an_os_error_is_a_user_error_not_a_bug(tmp_path, capsys):
    config = tmp_path / "c.yaml"
    config.write_text("rounds: 1\n")
    out = tmp_path / "file"
    out.write_text("")
    assert main(["run", "-c", str(config), "-o", str(out / "run"), "-q"]) == 2
    err = capsys.readouterr().err
    assert "internal error" not in err and "Not a directory" in err
