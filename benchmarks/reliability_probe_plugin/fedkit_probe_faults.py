"""``probe-faults``: one client fails in one round, for ``benchmarks/reliability_probe.py``.

Like ``tests/fault_plugin`` but importing only names that fedkit has exported since before
issue 18 (``fedkit_core.Option``, ``hookimpl``), so the same fault runs against an old
checkout. Found by name through the Python path (the ``.dist-info`` beside it), in every
process: Ray workers and local worker processes included. Each client counts its fits in its
private state *before* the fault strikes and reports the count, so a failed fit that leaves
state behind shows as one fit too many in the next round.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from fedkit_core import Option, hookimpl

NAME = "probe-faults"


@hookimpl
def fedkit_options():
    return [
        Option(
            "faults", "list[str]", [], "KIND:CLIENT:ROUND[:TIMES] (raise, hang, exit, sys-exit)"
        ),
        Option("dir", str, "", "folder of the attempt counters (shared by all processes)"),
    ]


@hookimpl
def fedkit_round_start(client):
    client.state["fits"] = client.state.get("fits", 0) + 1
    opts = client.options(NAME)
    for fault in opts["faults"]:
        kind, cid, rnd, *times = fault.split(":")
        if cid == client.id and int(rnd) == client.round:
            _strike(kind, Path(opts["dir"]) / f"{cid}-r{rnd}", int(*times or [99]))


@hookimpl
def fedkit_client_report(client):
    return {"fits": client.state["fits"]}


def _strike(kind: str, counter: Path, times: int) -> None:
    with open(counter, "a") as fh:
        fh.write("x")
    if counter.stat().st_size > times:
        return
    if kind == "raise":
        raise RuntimeError("injected fault")
    if kind == "exit":
        os._exit(3)
    if kind == "sys-exit":
        sys.exit(3)
    time.sleep(600)  # hang
