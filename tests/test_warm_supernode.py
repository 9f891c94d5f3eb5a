"""The waits of a warm SuperNode: pipe wake-ups instead of polls, idle polls backing off."""

import os
import time
import types

from fedkit_core.engines.flower import fast, warm


def test_a_signal_ends_a_wait_and_a_closed_pipe_does_not_spin():
    read, write = os.pipe()
    warm._signal(write)
    start = time.monotonic()
    warm._wait(read, 5.0)
    assert time.monotonic() - start < 1.0  # woken, not timed out
    os.close(write)
    start = time.monotonic()
    warm._wait(read, 0.2)  # the writer is gone: a plain sleep, not an instant return
    assert time.monotonic() - start >= 0.19
    os.close(read)


def test_the_pacer_wakes_the_executor_and_backs_off_only_while_idle():
    reply_read, reply_write = os.pipe()
    task_read, task_write = os.pipe()
    pacer = warm.Pacer(reply_read, task_write)
    answers = iter([None, 7, None])
    pull = pacer.wrap(lambda: next(answers))
    assert pull() is None and pacer.idle
    pacer.pause = 0.01
    pacer.sleep(3)  # idle: the pause, then a longer one next time
    assert pacer.pause == 0.01 * 1.5
    assert pull() == 7  # a message: the executor is told, the next idle poll comes soon
    assert os.read(task_read, 10) == b"!"
    assert pacer.pause == warm.ACTIVE_POLL and not pacer.idle
    warm._signal(reply_write)  # the executor pushed its reply: the loop's wait ends at once
    start = time.monotonic()
    pacer.sleep(0.5)
    assert time.monotonic() - start < 0.4
    assert pull() is None and pacer.idle
    pacer.sleep(3)
    assert pacer.pause == warm.ACTIVE_POLL  # while the run is likely to send more
    for fd in (reply_read, reply_write, task_read, task_write):
        os.close(fd)


def test_a_wait_says_whether_it_was_signalled():
    read, write = os.pipe()
    assert not warm._wait(read, 0.01)
    warm._signal(write)
    assert warm._wait(read, 5.0)
    os.close(write)
    assert not warm._wait(read, 0.01)  # the writer is gone
    os.close(read)


def test_idle_polls_stay_short_while_a_run_is_likely_to_send_more(monkeypatch):
    reply_read, reply_write = os.pipe()
    task_read, task_write = os.pipe()
    pacer = warm.Pacer(reply_read, task_write)
    pull = pacer.wrap(lambda: 7)
    pull()  # a message came: the following idle pauses stay at most ACTIVE_POLL
    pacer.idle = True
    monkeypatch.setattr(warm, "_wait", lambda fd, seconds: False)
    for _ in range(30):
        pacer.sleep(3)
    assert pacer.pause == warm.ACTIVE_POLL < warm.POLL
    pacer.last -= warm.ACTIVE  # long after the last message: back off to POLL
    for _ in range(30):
        pacer.sleep(3)
    assert pacer.pause == warm.POLL
    for fd in (reply_read, reply_write, task_read, task_write):
        os.close(fd)


def test_the_executor_asks_for_a_task_only_when_the_supernode_signals_one(monkeypatch):
    monkeypatch.setattr(warm, "SAFETY", 0.01)
    task_read, task_write = os.pipe()
    reply_read, reply_write = os.pipe()
    os.set_blocking(reply_write, False)
    tokens = iter([None, "a", None, None])  # at the start: none; signalled: one, then none
    asked, ran, rounds = [], [], iter(range(40))

    def acquire():
        asked.append(time.monotonic())
        return next(tokens)

    def alive():
        step = next(rounds, None)
        if step == 10:
            warm._signal(task_write)  # the SuperNode stored a message
        return step is not None

    warm.serve_tasks(acquire, ran.append, task_read, reply_write, alive)
    assert ran == ["a"] and len(asked) == 3  # not once per SAFETY wait
    assert os.read(reply_read, 10) == b"!"  # the reply was signalled
    for fd in (task_read, task_write, reply_read, reply_write):
        os.close(fd)


def test_object_pulls_retry_a_missing_object_soon():
    from flwr.supercore.inflatable.inflatable_utils import ObjectUnavailableError

    module = types.SimpleNamespace()
    fast.retry_object_pulls_sooner(module)
    missing = iter([True, True, False])

    def pull_object(object_id):
        if next(missing):
            raise ObjectUnavailableError(object_id)
        return b"content"

    start = time.monotonic()
    assert module.pull_objects(["x"], pull_object) == {"x": b"content"}
    assert time.monotonic() - start < 0.5  # Flower's own retries: 1 s, then 2 s
