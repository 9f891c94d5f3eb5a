"""Reliability probe, round four (issue 45): manifest-like files, caches, partial
checkpoints and writers outside run folders, against this checkout, in one process.

Each case prepares a temporary folder (most start from copies of one tiny run interrupted
after 2 of 3 rounds), does one thing through the public API or the CLI's ``main`` and is
judged by explicit criteria:

* **clean**: refused with a FedkitError (exit 2), one message, and no file outside the case's
  folder changed;
* **ok**: the command did the right thing (what "right" is, each case says);
* **FINDING**: a silent wrong result, a file of the user's changed or removed, or an
  internal error (exit 1).

    python benchmarks/reliability_probe_round4.py [--only ID,ID] [--out table.md]

Prints one line per case and the count of each outcome.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import io
import json
import logging
import os
import shutil
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path

import torch
import yaml

from fedkit_core import FedkitError, resume, run
from fedkit_core.cli import main
from fedkit_core.contract.data import CLASSIFICATION, Split, TaskData
from fedkit_core.results.compare import MANIFEST
from fedkit_core.results.store import WRITTEN, OwnedOutputs, write_json
from fedkit_core.tasks import cache
from fedkit_core.testing import tiny

CASES: list[tuple[str, str, Callable[[Path], tuple[str, str]]]] = []
FIXTURE: dict[str, Path] = {}


def case(id: str, group: str):
    def register(fn):
        CASES.append((id, group, fn))
        return fn

    return register


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def cli(*args: str) -> tuple[int, str]:
    """``fedkit ARGS`` in this process: its exit code and what it printed to stderr."""
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        code = main(list(args))
    return code, err.getvalue()


def refusal(fn: Callable[[], object], *must: str) -> tuple[str, str]:
    """``clean`` when ``fn`` raises a FedkitError whose message holds every ``must``."""
    try:
        fn()
    except FedkitError as err:
        text = str(err)
        missing = [m for m in must if m not in text]
        if missing:
            return "FINDING", f"refused, but the message lacks {missing}: {text[:160]}"
        return "clean", text.splitlines()[0][:160]
    except Exception as err:  # an internal error
        return "FINDING", f"internal error {type(err).__name__}: {str(err)[:160]}"
    return "FINDING", "not refused"


def interrupted(tmp: Path) -> Path:
    """A copy of the tiny run interrupted after round 2 of 3."""
    return Path(shutil.copytree(FIXTURE["run"], tmp / "run"))


def make_fixture(root: Path) -> None:
    out = root / "run"
    run(tiny(rounds=2, checkpoint=True), out=out)
    config = yaml.safe_load((out / "config.yaml").read_text())
    (out / "config.yaml").write_text(yaml.safe_dump({**config, "rounds": 3}))
    results = json.loads((out / "results.json").read_text())
    (out / "results.json").write_text(json.dumps({**results, "status": "running"}))
    FIXTURE["run"] = out
    FIXTURE["final"] = run(tiny(rounds=3), out=root / "whole").final["global"]
    for name in ("a", "b"):
        run(tiny(rounds=1, seed={"a": 0, "b": 1}[name]), out=root / "pair" / name)
    FIXTURE["pair"] = root / "pair"


def resumed_right(out: Path, **kwargs) -> tuple[str, str]:
    try:
        final = resume(out, **kwargs).final["global"]
    except FedkitError as err:
        return "clean", str(err).splitlines()[0][:160]
    if final == FIXTURE["final"]:
        return "ok", "resumed to the uninterrupted run's results"
    return "FINDING", "resumed silently with results other than the uninterrupted run's"


# ------------------------------------------------------------------ manifest-like files


def planted_manifest(tmp: Path, listed: dict) -> tuple[Path, Path]:
    victim = tmp / "victim.txt"
    victim.write_text("the user's")
    out = tmp / "cmp"
    out.mkdir()
    write_json(out / MANIFEST, listed)
    return out, victim


@case("manifest-folder-dotdot", "manifest")
def _m1(tmp):
    out, victim = planted_manifest(tmp, {"files": {}, "folders": [".."]})
    verdict = refusal(lambda: OwnedOutputs(out, MANIFEST).claim([]), "delete it")
    return verdict if victim.exists() else ("FINDING", "victim removed")


@case("manifest-files-a-list", "manifest")
def _m2(tmp):
    out, _ = planted_manifest(tmp, {"files": ["../victim.txt"], "folders": []})
    return refusal(lambda: OwnedOutputs(out, MANIFEST).claim([]), "delete it")


@case("manifest-nul-name", "manifest")
def _m3(tmp):
    out, _ = planted_manifest(tmp, {"files": {"a\0b": "x"}, "folders": []})
    return refusal(lambda: OwnedOutputs(out, MANIFEST).claim([]))


@case("manifest-subfolder-path", "manifest")
def _m4(tmp):
    out, victim = planted_manifest(tmp, {"files": {}, "folders": []})
    (out / "sub").mkdir()
    (out / "sub" / "x.txt").write_text("mine")
    write_json(
        out / MANIFEST, {"files": {"sub/x.txt": digest(out / "sub" / "x.txt")}, "folders": []}
    )
    verdict = refusal(lambda: OwnedOutputs(out, MANIFEST).claim([]))
    return verdict if (out / "sub" / "x.txt").exists() else ("FINDING", "sub/x.txt removed")


@case("manifest-hardlink-to-outside", "manifest")
def _m5(tmp):
    out, victim = planted_manifest(tmp, {"files": {}, "folders": []})
    os.link(victim, out / "compare.md")
    write_json(out / MANIFEST, {"files": {"compare.md": digest(victim)}, "folders": []})
    OwnedOutputs(out, MANIFEST).claim([])
    if victim.read_text() == "the user's":
        return "ok", "only the link in the folder removed; the user's file intact"
    return "FINDING", "the user's file changed"


@case("manifest-garbage", "manifest")
def _m6(tmp):
    out, _ = planted_manifest(tmp, {})
    (out / MANIFEST).write_bytes(b"\xff\xfe not json")
    return refusal(lambda: OwnedOutputs(out, MANIFEST).claim([]), "delete it")


@case("manifest-is-a-symlink-out", "manifest")
def _m7(tmp):
    out, victim = planted_manifest(tmp, {"files": {}, "folders": []})
    (out / MANIFEST).unlink()
    target = tmp / "elsewhere.json"
    write_json(target, {"files": {}, "folders": []})
    (out / MANIFEST).symlink_to(target)
    before = target.read_text()
    OwnedOutputs(out, MANIFEST).claim([])
    (out / "compare.md").write_text("fedkit's")
    OwnedOutputs(out, MANIFEST).record([])
    if target.read_text() == before and victim.exists():
        return "ok", "the link replaced (written atomically), its target untouched"
    return "FINDING", "wrote through the symlink into a file outside the folder"


@case("written-list-names-outside", "manifest")
def _m8(tmp):
    out, victim = planted_manifest(tmp, {"files": {}, "folders": []})
    write_json(out / WRITTEN, {"../victim.txt": digest(victim)})
    OwnedOutputs(out, MANIFEST).claim([])
    return (
        ("ok", "ignored: not a name inside the folder")
        if victim.exists()
        else (
            "FINDING",
            "victim removed",
        )
    )


@case("written-list-garbage-user-report", "writer")
def _m9(tmp):
    pair = Path(shutil.copytree(FIXTURE["pair"], tmp / "pair"))
    (pair / WRITTEN).write_text("not json")
    (pair / "report.png").write_bytes(b"the user's figure")
    code, err = cli("report", str(pair / "a"), str(pair / "b"))
    if code == 2 and (pair / "report.png").read_bytes() == b"the user's figure":
        return "clean", err.strip().splitlines()[-1][:160]
    return "FINDING", f"exit {code}; report.png {(pair / 'report.png').read_bytes()[:20]!r}"


@case("written-list-symlink-out", "writer")
def _m10(tmp):
    pair = Path(shutil.copytree(FIXTURE["pair"], tmp / "pair"))
    target = tmp / "victim.json"
    target.write_text('{"mine": 1}')
    (pair / WRITTEN).symlink_to(target)
    code, _ = cli("report", str(pair / "a"), str(pair / "b"))
    if code == 0 and target.read_text() == '{"mine": 1}':
        return "ok", "overlay written, the listed symlink replaced, its target intact"
    return "FINDING", f"exit {code}; target {target.read_text()[:40]!r}"


@case("report-png-symlink-out", "writer")
def _m11(tmp):
    pair = Path(shutil.copytree(FIXTURE["pair"], tmp / "pair"))
    victim = tmp / "victim.png"
    victim.write_bytes(b"user's")
    (pair / "report.png").symlink_to(victim)
    code, err = cli("report", str(pair / "a"), str(pair / "b"))
    if code == 2 and victim.read_bytes() == b"user's":
        return "clean", err.strip().splitlines()[-1][:160]
    return "FINDING", f"exit {code}; victim {victim.read_bytes()[:10]!r}"


@case("report-out-folder-with-user-file", "writer")
def _m12(tmp):
    pair = Path(shutil.copytree(FIXTURE["pair"], tmp / "pair"))
    figs = tmp / "figs"
    figs.mkdir()
    (figs / "report.png").write_bytes(b"user's")
    code, err = cli("report", str(pair / "a"), str(pair / "b"), "--out", str(figs))
    if code == 2 and (figs / "report.png").read_bytes() == b"user's":
        return "clean", err.strip().splitlines()[-1][:160]
    return "FINDING", f"exit {code}"


@case("report-out-file-other-format-exists", "writer")
def _m13(tmp):
    pair = Path(shutil.copytree(FIXTURE["pair"], tmp / "pair"))
    (tmp / "x.pdf").write_bytes(b"user's paper")
    code, err = cli(
        "report", str(pair / "a"), str(pair / "b"), "--out", str(tmp / "x.png"),
        "--figure-formats", "png,pdf",
    )  # fmt: skip
    if code == 2 and (tmp / "x.pdf").read_bytes() == b"user's paper":
        return "clean", err.strip().splitlines()[-1][:160]
    return "FINDING", f"exit {code}; x.pdf {(tmp / 'x.pdf').read_bytes()[:12]!r}"


@case("report-out-named-file", "writer")
def _m14(tmp):
    pair = Path(shutil.copytree(FIXTURE["pair"], tmp / "pair"))
    (tmp / "mine.png").write_bytes(b"old")
    code, _ = cli("report", str(pair / "a"), str(pair / "b"), "--out", str(tmp / "mine.png"))
    if code == 0 and (tmp / "mine.png").read_bytes()[:4] == b"\x89PNG":
        return "ok", "the file the user named with --out is replaced (their choice)"
    return "FINDING", f"exit {code}"


@case("report-twice-replaces-own", "writer")
def _m15(tmp):
    pair = Path(shutil.copytree(FIXTURE["pair"], tmp / "pair"))
    codes = [cli("report", str(pair / "a"), str(pair / "b"))[0] for _ in range(2)]
    listed = json.loads((pair / WRITTEN).read_text())
    if codes == [0, 0] and listed.get("report.png") == digest(pair / "report.png"):
        return "ok", "its own overlay replaced, listed with its digest"
    return "FINDING", f"exits {codes}"


@case("run-figure-symlink-out", "writer")
def _m16(tmp):
    out = Path(shutil.copytree(FIXTURE["pair"] / "a", tmp / "a"))
    victim = tmp / "victim.png"
    victim.write_bytes(b"user's")
    (out / "curves.png").unlink(missing_ok=True)
    (out / "curves.png").symlink_to(victim)
    code, _ = cli("report", str(out))
    if victim.read_bytes() == b"user's" and code == 0:
        return "ok", "the link replaced by the figure; its target intact"
    return "FINDING", f"exit {code}; victim {victim.read_bytes()[:10]!r}"


@case("compare-out-report-then-edited", "writer")
def _m17(tmp):
    pair = Path(shutil.copytree(FIXTURE["pair"], tmp / "pair"))
    OwnedOutputs(pair, MANIFEST).record(["a", "b"])
    cli("report", str(pair / "a"), str(pair / "b"))
    (pair / "report.png").write_bytes(b"edited by the user")
    return refusal(lambda: OwnedOutputs(pair, MANIFEST).claim(["a", "b"]), "report.png")


# ------------------------------------------------------------------ caches


def cache_case(tmp: Path) -> tuple[Path, list[Path], Callable[[], int]]:
    data = tmp / "data"
    data.mkdir()
    files = [data / f"{k}.png" for k in range(3)]
    for k, path in enumerate(files):
        path.write_bytes(bytes([k]) * 16)
    calls = []

    def load(where: str = cache.USER) -> int:
        def build():
            calls.append(1)
            split = Split(torch.zeros((2, 1, 2, 2), dtype=torch.uint8), torch.tensor([0, 1]))
            return TaskData(CLASSIFICATION, ["a", "b"], {"s": {"train": split}}, False, None)

        cache.cached("t", 1, data, files, {}, build, where)
        return len(calls)

    return data, files, load


@case("cache-same-size-mtime", "cache")
def _c1(tmp):
    _, files, load = cache_case(tmp)
    load()
    st = files[0].stat()
    files[0].write_bytes(bytes([7]) * 16)
    os.utime(files[0], ns=(st.st_atime_ns, st.st_mtime_ns))
    return ("ok", "rebuilt") if load() == 2 else ("FINDING", "stale entry reused")


@case("cache-memo-garbage", "cache")
def _c2(tmp):
    data, _, load = cache_case(tmp)
    load()
    memo = cache.digest_memo(data)
    memo.write_text("{not json")
    n = load()
    return ("ok", "memo rebuilt, entry reused") if n == 1 else ("FINDING", f"{n} builds")


@case("cache-memo-a-directory", "cache")
def _c3(tmp):
    data, _, load = cache_case(tmp)
    memo = cache.digest_memo(data)
    memo.mkdir(parents=True)
    return ("ok", "digests recomputed, run goes on") if load() == 1 else ("FINDING", "?")


@case("cache-memo-forged-stamp-changed", "cache")
def _c4(tmp):
    data, files, load = cache_case(tmp)
    load()
    files[1].write_bytes(bytes([9]) * 16)  # the memo keeps the old digest, the stamp changed
    return ("ok", "rebuilt (ctime changed)") if load() == 2 else ("FINDING", "stale reuse")


@case("cache-entry-truncated", "cache")
def _c5(tmp):
    data, _, load = cache_case(tmp)
    load()
    (entry,) = (cache.user_cache_dir() / "tasks").glob("t-*.pt")
    entry.write_bytes(entry.read_bytes()[:100])
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        n = load()
    return ("ok", "rebuilt with a warning") if n == 2 else ("FINDING", f"{n} builds")


@case("cache-entry-symlink-dev-zero", "cache")
def _c6(tmp):
    data, _, load = cache_case(tmp)
    load()
    (entry,) = (cache.user_cache_dir() / "tasks").glob("t-*.pt")
    entry.unlink()
    entry.symlink_to("/dev/zero")
    start = time.perf_counter()
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        n = load()
    seconds = time.perf_counter() - start
    if n == 2 and seconds < 30:
        return "ok", f"rebuilt with a warning in {seconds:.1f} s"
    return "FINDING", f"{n} builds in {seconds:.1f} s"


@case("cache-dir-is-a-file", "cache")
def _c7(tmp):
    data, _, load = cache_case(tmp)
    (cache.user_cache_dir()).mkdir(parents=True, exist_ok=True)
    tasks = cache.user_cache_dir() / "tasks"
    shutil.rmtree(tasks, ignore_errors=True)
    tasks.write_text("a file")
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        try:
            n = load()
        except Exception as err:
            return "FINDING", f"{type(err).__name__}: {err}"
        finally:
            tasks.unlink()
    return ("ok", "run goes on uncached, with a warning") if n == 1 else ("FINDING", "?")


@case("cache-file-renamed-over-another", "cache")
def _c8(tmp):
    _, files, load = cache_case(tmp)
    load()
    shutil.copy2(files[2], files[0])  # cp -p: the bytes of another file, its mtime
    return ("ok", "rebuilt") if load() == 2 else ("FINDING", "stale entry reused")


@case("cache-data-mode-read-only-data", "cache")
def _c9(tmp):
    data, _, load = cache_case(tmp)
    data.chmod(0o555)
    try:
        n = load(cache.DATA)
    finally:
        data.chmod(0o755)
    written = not (data / cache.DATA_CACHE_DIR).exists()
    return ("ok", "data folder untouched") if n == 1 and written else ("FINDING", "wrote data")


# ------------------------------------------------------------------ partial checkpoints


@case("ckpt-server-file-gone", "checkpoint")
def _k1(tmp):
    out = interrupted(tmp)
    (out / "checkpoint" / "server-r2.pt").unlink()
    return refusal(lambda: resume(out), "server-r2.pt", "round 2")


@case("ckpt-latest-json-gone", "checkpoint")
def _k2(tmp):
    out = interrupted(tmp)
    (out / "checkpoint" / "latest.json").unlink()
    return resumed_right(out)


@case("ckpt-client-r1-renamed-r2", "checkpoint")
def _k3(tmp):
    out = interrupted(tmp)
    folder = out / "checkpoint" / "clients" / "site1"
    shutil.copy(folder / "r1.pt", folder / "r2.pt")
    return refusal(lambda: resume(out), "r2.pt")


@case("ckpt-client-digests-swapped", "checkpoint")
def _k4(tmp):
    out = interrupted(tmp)
    clients = out / "checkpoint" / "clients"
    shutil.copy(clients / "site2" / "digests.json", clients / "site1" / "digests.json")
    return refusal(lambda: resume(out), "site1")


@case("ckpt-client-folder-copied-from-another", "checkpoint")
def _k5(tmp):
    out = interrupted(tmp)
    clients = out / "checkpoint" / "clients"
    shutil.rmtree(clients / "site1")
    shutil.copytree(clients / "site2", clients / "site1")
    return resumed_right(out)


@case("ckpt-stray-client-folder", "checkpoint")
def _k6(tmp):
    out = interrupted(tmp)
    shutil.copytree(out / "checkpoint" / "clients" / "site1", out / "checkpoint/clients/site9")
    return resumed_right(out)


@case("ckpt-latest-clients-dotdot", "checkpoint")
def _k7(tmp):
    out = interrupted(tmp)
    latest = out / "checkpoint" / "latest.json"
    manifest = json.loads(latest.read_text())
    manifest["clients"] = ["../../../etc"]
    latest.write_text(json.dumps(manifest))
    return refusal(lambda: resume(out))


@case("ckpt-latest-clients-not-a-list", "checkpoint")
def _k8(tmp):
    out = interrupted(tmp)
    latest = out / "checkpoint" / "latest.json"
    manifest = json.loads(latest.read_text())
    manifest["clients"] = "site1"
    latest.write_text(json.dumps(manifest))
    return refusal(lambda: resume(out), "corrupt")


@case("ckpt-digests-a-list", "checkpoint")
def _k9(tmp):
    out = interrupted(tmp)
    (out / "checkpoint" / "clients" / "site0" / "digests.json").write_text("[1, 2]")
    return refusal(lambda: resume(out))


@case("ckpt-digests-a-directory", "checkpoint")
def _k10(tmp):
    out = interrupted(tmp)
    path = out / "checkpoint" / "clients" / "site0" / "digests.json"
    path.unlink()
    path.mkdir()
    return refusal(lambda: resume(out))


@case("ckpt-client-pt-a-directory", "checkpoint")
def _k11(tmp):
    out = interrupted(tmp)
    path = out / "checkpoint" / "clients" / "site0" / "r2.pt"
    path.unlink()
    path.mkdir()
    return refusal(lambda: resume(out), "r2.pt")


@case("ckpt-clients-a-file", "checkpoint")
def _k12(tmp):
    out = interrupted(tmp)
    shutil.rmtree(out / "checkpoint" / "clients")
    (out / "checkpoint" / "clients").write_text("x")
    return refusal(lambda: resume(out))


@case("ckpt-digests-list-future-round", "checkpoint")
def _k13(tmp):
    out = interrupted(tmp)
    path = out / "checkpoint" / "clients" / "site0" / "digests.json"
    digests = json.loads(path.read_text())
    digests["r9.pt"] = "0" * 64
    path.write_text(json.dumps(digests))
    return resumed_right(out)


@case("ckpt-accept-unverified-then-resume-again", "checkpoint")
def _k14(tmp):
    out = interrupted(tmp)
    (out / "checkpoint" / "clients" / "site0" / "digests.json").unlink()
    verdict = resumed_right(out, accept_unverified=True)
    recorded = json.loads((out / "results.json").read_text()).get("unverified_resumes")
    if verdict[0] == "ok" and recorded:
        return "ok", "resumed to the same results; results.json records the unverified files"
    return "FINDING", f"{verdict}; recorded {recorded}"


@case("ckpt-all-client-folders-gone", "checkpoint")
def _k15(tmp):
    out = interrupted(tmp)
    shutil.rmtree(out / "checkpoint" / "clients")
    return refusal(lambda: resume(out), "is gone")


@case("ckpt-latest-round-raised", "checkpoint")
def _k16(tmp):
    out = interrupted(tmp)
    latest = out / "checkpoint" / "latest.json"
    manifest = json.loads(latest.read_text())
    manifest["round"] = 5
    latest.write_text(json.dumps(manifest))
    return resumed_right(out)


def main_() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    only = set(filter(None, args.only.split(",")))
    logging.getLogger("fedkit").setLevel(logging.ERROR)
    rows, counts = [], {}
    with tempfile.TemporaryDirectory() as root:
        os.environ["FEDKIT_CACHE"] = str(Path(root) / "cache")
        make_fixture(Path(root) / "fixture")
        for n, (id, group, fn) in enumerate(CASES):
            if only and id not in only:
                continue
            tmp = Path(root) / f"case{n}"
            tmp.mkdir()
            os.environ["FEDKIT_CACHE"] = str(tmp / "cache")
            try:
                status, text = fn(tmp)
            except Exception as err:  # the probe's own failure is a finding to look at
                status, text = "FINDING", f"probe error {type(err).__name__}: {err}"
            counts[status] = counts.get(status, 0) + 1
            rows.append(f"| {id} | {group} | {status} | {text.replace('|', '/')} |")
            print(f"{status:8} {id}: {text}", flush=True)
    print(", ".join(f"{k} {v}" for k, v in sorted(counts.items())))
    if args.out:
        table = ["| case | class | outcome | what happened |", "|---|---|---|---|", *rows]
        args.out.write_text("\n".join(table) + "\n")


if __name__ == "__main__":
    main_()
