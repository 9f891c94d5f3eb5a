"""``test-faults``: a fedkit plugin that makes one client fail in one round, for the fault
tests of every engine (raise, hang, or exit its process), or one client slow in every round.

It is found by name in any process whose Python path holds this folder (the ``.dist-info``
beside it declares the entry point), so the same fault crosses into Ray workers and deployed
SuperNodes; it is configured, like any plugin, by options (``test-faults.kind`` ...).
Attempts are counted in files under ``test-faults.dir``, so a fault can fail the first
``times`` attempts of a message and let a retry through, whichever process retries it.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from fedkit_core.plugin import Option, hookimpl


@hookimpl
def fedkit_options():
    return [
        Option(
            "faults",
            "list[str]",
            [],
            "KIND:CLIENT:ROUND[:TIMES]: the client's training in that round raises, hangs, "
            "exits its process (exit) or calls sys.exit (sys-exit), its first TIMES attempts "
            "(default 1)",
        ),
        Option("dir", str, "", "folder for the attempt counters (shared by all processes)"),
        Option(
            "slow",
            "list[str]",
            [],
            "CLIENT:SECONDS: the client sleeps this long before each of its fits (a slow site)",
        ),
    ]


@hookimpl
def fedkit_round_start(client):
    opts = client.options()
    for slow in opts["slow"]:
        cid, seconds = slow.split(":")
        if cid == client.id:
            time.sleep(float(seconds))
    for fault in opts["faults"]:
        kind, cid, rnd, *times = fault.split(":")
        if cid == client.id and int(rnd) == client.round:
            _strike(kind, client.id, Path(opts["dir"]) / f"{cid}-r{rnd}", int(*times or [1]))


def _strike(kind: str, cid: str, counter: Path, times: int) -> None:
    with open(counter, "a") as fh:
        fh.write("x")
    if counter.stat().st_size > times:
        return
    if kind == "raise":
        raise RuntimeError(f"injected fault in {cid}")
    if kind == "exit":
        os._exit(3)  # the client's process dies: no exception, no reply
    if kind == "sys-exit":
        sys.exit(3)
    time.sleep(600)  # hang
