"""The progress display says how long a run will take from its first round on."""

import io

from rich.console import Console

from fedkit_core.cli.display import RichProgress, duration


def test_durations_read_as_people_write_them():
    assert duration(42.4) == "42 s"
    assert duration(200) == "3 min 20 s"
    assert duration(7500) == "2 h 05 min"


def test_the_first_round_prints_the_whole_runs_expected_time():
    clock = iter([100.0, 130.0, 160.0, 190.0])  # start, then 30 s a round
    out = io.StringIO()
    with RichProgress(Console(file=out, width=100), clock=lambda: next(clock)) as progress:
        progress.on_start(total_rounds=10, first_round=1)
        progress.on_round_end({"round": 1})
        assert progress.progress.tasks[0].fields["eta"] == "~4 min 30 s left"
        progress.on_round_end({"round": 2})
    assert "round 1 took 30 s: expect about 5 min 00 s for 10 rounds" in out.getvalue()


def test_a_resumed_run_estimates_only_the_rounds_left():
    clock = iter([0.0, 10.0])
    out = io.StringIO()
    with RichProgress(Console(file=out, width=100), clock=lambda: next(clock)) as progress:
        progress.on_start(total_rounds=10, first_round=8)  # rounds 8, 9, 10 left
        progress.on_round_end({"round": 8})
        assert progress.progress.tasks[0].fields["eta"] == "~20 s left"
    assert "expect about 30 s for 3 rounds" in out.getvalue()
