"""benchmarks/reliability_probe.py (issue 18): its classifier tells a clean refusal from a
traceback, an internal error, a hang, a changed file, code that ran and an accepted bad input;
and a few of its cases, run against this checkout, come out clean."""

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location(
    "reliability_probe", ROOT / "benchmarks/reliability_probe.py"
)
rp = importlib.util.module_from_spec(spec)
sys.modules["reliability_probe"] = rp
spec.loader.exec_module(rp)


def proc(rc=2, err="error: config key 'rounds' expects int, got 'abc'\n", **kw):
    return rp.Proc(["fedkit"], rc, "", err, 1.0, **kw)


TRACE = "Traceback (most recent call last):\n  File x\nValueError: boom\n"


@pytest.mark.parametrize(
    "made, expect, status, text",
    [
        (proc(), "error", "clean", "ok"),
        (proc(rc=0, err=""), "error", "bad", "accepted (exit 0)"),
        (proc(rc=1, err=TRACE), "error", "bad", "traceback (exit 1): ValueError: boom"),
        (
            proc(rc=1, err="internal error: KeyError: 'x'\nThis is a bug"),
            "error",
            "bad",
            "internal error (exit 1): internal error: KeyError: 'x'",
        ),
        (proc(rc=2, err="x\n" * 40), "error", "bad", "a message of 40 lines"),
        (proc(rc=2, err=""), "error", "bad", "exit 2 without a message"),
        (proc(rc=None, timed_out=True), "error", "bad", "hang (killed after 1 s)"),
        (proc(rc=137, err=""), "error", "bad", "exit 137: "),
        (proc(rc=0, err=""), "ok", "clean", "ok"),
        (proc(rc=0, err=""), "survive", "survived", "ok"),
        (
            proc(rc=1, err="error: client 'site1' failed"),
            "survive",
            "bad",
            "exit 1: error: client 'site1' failed",
        ),
        (proc(rc=0, err=TRACE), "ok", "bad", "exit 0 with a traceback"),
    ],
)
def test_the_criteria(made, expect, status, text):
    assert rp.judge(made, expect) == rp.Verdict(status, text)


def test_code_that_ran_and_changed_files_outweigh_a_clean_exit():
    assert rp.judge(proc(), "error", code_ran=True).text == "code from the crafted file ran"
    assert rp.judge(proc(), "error", changed=["mine/results.json"]).status == "bad"
    assert rp.judge(proc(rc=0, err=""), "survive", problem="no event").text == "no event"


def test_a_key_the_checkout_lacks_is_not_applicable():
    lacking = proc(err="error: unknown config key 'client_timeout'; valid keys: ...")
    verdict = rp.judge(lacking, "error", requires=["client_timeout"])
    assert verdict == rp.Verdict("n/a", "n/a: `client_timeout` does not exist in this checkout")
    assert rp.judge(lacking, "error", requires=["lr"]).status == "clean"


def test_changes_sees_a_changed_and_a_removed_file(tmp_path):
    (tmp_path / "a").write_text("1")
    (tmp_path / "b").write_text("2")
    before = rp.hashes(tmp_path)
    (tmp_path / "a").write_text("3")
    (tmp_path / "b").unlink()
    assert rp.changes(before, rp.hashes(tmp_path), tmp_path) == ["a", "b"]


def test_counts_and_table():
    cases = [rp.Case("x", rp.BAD, "fedkit x", None), rp.Case("f", rp.FAULT, "fedkit f", None)]
    after = {"x": rp.Verdict("clean", "ok"), "f": rp.Verdict("bad", "hang (killed after 9 s)")}
    before = {"x": rp.Verdict("n/a", "n/a: `x` does not exist"), "f": rp.Verdict("bad", "exit 1")}
    assert rp.counts(cases, after) == {"bad inputs": (1, 1, 0), "faults": (0, 1, 0)}
    text = rp.table(cases, after, before)
    assert "| `f` | fault | fedkit f | **not clean**: exit 1 | **not clean**: hang" in text
    assert "**before**: bad inputs 0/0 clean (1 n/a); faults 0/1 survived (0 n/a)" in text


@pytest.mark.slow
def test_a_few_cases_against_this_checkout_are_clean():
    """Real CLI commands through the probe's own runner (one warm fork server)."""
    ids = ["yaml-alias-bomb", "set-rounds=abc", "run-out-non-run", "unknown-plugin"]
    cases = [c for c in rp.CASES if c.id in ids]
    assert len(cases) == len(ids)
    verdicts = rp.probe(ROOT, cases, jobs=1, log=lambda _: None)
    assert verdicts == {i: rp.Verdict("clean", "ok") for i in ids}


def test_a_logged_run_renders_the_same_verdicts():
    log = "195 cases\nbefore   x: bad (code from the crafted file ran) 12s\nafter   x: clean (ok) 3s\n"
    assert rp.from_log(log) == {
        "before": {"x": rp.Verdict("bad", "code from the crafted file ran")},
        "after": {"x": rp.Verdict("clean", "ok")},
    }
