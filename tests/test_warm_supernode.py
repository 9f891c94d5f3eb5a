"""The waits of a warm SuperNode: pipe wake-ups instead of polls, idle polls backing off."""

import os
import time

from fedkit_core.engines.flower import warm


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
    assert pull() == 7  # a message: the executor is told, the next idle poll comes fast
    assert os.read(task_read, 10) == b"!"
    assert pacer.pause == warm.FIRST_POLL and not pacer.idle
    warm._signal(reply_write)  # the executor pushed its reply: the loop's wait ends at once
    start = time.monotonic()
    pacer.sleep(0.5)
    assert time.monotonic() - start < 0.4
    assert pull() is None and pacer.idle
    pacer.sleep(3)
    assert pacer.pause == warm.FIRST_POLL * 1.5
    for fd in (reply_read, reply_write, task_read, task_write):
        os.close(fd)
