"""The progress display says how long a run will take from its first round on: a range
after round 1 (start-up included), then an estimate from the steady rounds with its
uncertainty; off a terminal, it is plain lines."""

import io

import pytest
from rich.console import Console

from fedkit_core.cli.display import PlainProgress, RichProgress, RoundTimer, duration


def test_durations_read_as_people_write_them():
    assert duration(42.4) == "42 s"
    assert duration(200) == "3 min 20 s"
    assert duration(7500) == "2 h 05 min"


def test_the_first_round_prints_the_whole_runs_expected_time_as_a_range():
    clock = iter([100.0, 130.0, 160.0, 190.0])  # start, then 30 s a round
    out = io.StringIO()
    with RichProgress(Console(file=out, width=200), clock=lambda: next(clock)) as progress:
        progress.on_start(total_rounds=10, first_round=1)
        progress.on_round_end({"round": 1})
        assert (
            progress.progress.tasks[0].fields["eta"] == "~4 min 30 s left (2 min 42 s-7 min 39 s)"
        )
        progress.on_round_end({"round": 2})
    said = out.getvalue()
    assert "round 1 took 30 s (start-up included): expect about 5 min 00 s for 10 rounds" in said
    assert "likely 3 min 12 s to 8 min 09 s; refined after round 3" in said


def test_the_estimate_rests_on_the_steady_rounds_with_their_spread():
    timer = RoundTimer(10)
    for seconds in (60.0, 20.0, 24.0):  # a slow start-up round, then steady ones
        timer.add(seconds)
    mid, low, high = timer.left()
    assert mid == 7 * 22.0 and (low, high) == (mid - 7 * 2.0, mid + 7 * 2.0)
    assert timer.eta() == "~2 min 34 s left (± 14 s)"
    assert timer.announcement() == (
        "rounds 2-3 took 22 s each (± 2 s): expect about 4 min 18 s for 10 rounds (± 14 s)"
    )  # round 1 alone would have said 10 min


def test_a_resumed_run_estimates_only_the_rounds_left():
    clock = iter([0.0, 10.0])
    out = io.StringIO()
    with RichProgress(Console(file=out, width=200), clock=lambda: next(clock)) as progress:
        progress.on_start(total_rounds=10, first_round=8)  # rounds 8, 9, 10 left
        progress.on_round_end({"round": 8})
        assert progress.progress.tasks[0].fields["eta"].startswith("~20 s left")
    assert "expect about 30 s for 3 rounds" in out.getvalue()


def test_off_a_terminal_progress_is_plain_lines():
    clock = iter([0.0, 30.0, 50.0, 70.0])
    out = io.StringIO()
    record = {
        "round": 1,
        "evaluated": ["val", "test"],
        "val": {},
        "global": {"bacc": 0.61},
        "clients_mean": {"bacc": 0.6},
        "fairness": {"metric": "bacc", "std": 0.05, "worst": 0.52},
    }
    with PlainProgress(Console(file=out, width=40), clock=lambda: next(clock)) as progress:
        progress.on_start(total_rounds=3, first_round=1)
        for rnd in (1, 2, 3):
            progress.on_round_end({**record, "round": rnd})
    lines = out.getvalue().splitlines()
    assert lines[0] == "rounds 1-3 of 3"
    assert (
        lines[1]
        == "round 1/3  bacc 0.610  clients std 0.050 worst 0.520  ~1 min 00 s left (36 s-1 min 42 s)"
    )
    assert lines[2].startswith("round 1 took 30 s (start-up included): expect about 1 min 30 s")
    assert lines[-1] == "round 3/3  bacc 0.610  clients std 0.050 worst 0.520"
    assert "━" not in out.getvalue() and "\x1b" not in out.getvalue()


def test_a_round_is_its_training_steps_and_evaluation_passes():
    from types import SimpleNamespace

    from fedkit_core.contract.data import ClientInfo
    from fedkit_core.engines.estimate import FORWARD_SHARE, round_seconds

    config = {"batch_size": 10, "eval_batch_size": 20, "local_epochs": 2}
    config |= {"sample_fraction": 0.5, "eval_every": 1}
    infos = {
        "a": ClientInfo("a", num_train=95, num_val=20, num_test=40, class_counts=[]),
        "b": ClientInfo("b", num_train=30, num_val=20, num_test=20, class_counts=[]),
    }
    seconds = round_seconds(SimpleNamespace(config=config), infos, step=1.0)
    # one client sampled (the larger: 10 batches, twice), 5 evaluation batches of twice the size
    assert seconds == 10 * 2 + 5 * 2 * FORWARD_SHARE


@pytest.mark.slow
def test_the_steps_timed_before_round_1_leave_the_runs_random_streams_alone():
    import torch

    from fedkit_core.contract.observer import Observer
    from fedkit_core.engines.estimate import step_seconds
    from fedkit_core.engines.server import Server
    from fedkit_core.federation import prepare
    from fedkit_core.resolve import resolve_config
    from fedkit_core.testing import tiny

    cfg, plugins = resolve_config([tiny()])
    fed = prepare(cfg, plugins)
    server = Server(cfg, plugins, fed.task, fed.device, Observer())
    torch.manual_seed(7)
    before = torch.get_rng_state()
    assert step_seconds(server) > 0
    assert torch.equal(torch.get_rng_state(), before)


def test_the_estimate_is_said_before_round_1():
    out = io.StringIO()
    with PlainProgress(Console(file=out, width=200)) as progress:
        assert progress.wants_estimate
        progress.on_estimate(round_seconds=90.0, rounds=20)
    assert out.getvalue().startswith(
        "before round 1: a few timed training steps suggest about 1 min 30 s a round, "
        "30 min 00 s for 20 rounds"
    )
