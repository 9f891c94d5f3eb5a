"""Reliability probe (issue 18): hostile inputs and injected faults against a fedkit checkout.

Every case runs ``python -m fedkit_core.cli ...`` (or, for deployment defaults, the CLI
function with its final ``exec`` replaced by a print) in its own temporary folder, under a
per-case timeout, and is classified by explicit criteria (:func:`judge`):

* **clean** (bad inputs): exit code 2 with one readable message (no traceback, not an
  "internal error", at most 25 lines) -- or exit 0 where the input is fine and the behaviour is
  right; no file outside the run folder changed or lost (sha256 before/after); no code from a
  crafted file ran (the marker file its pickle would create is absent); no hang.
* **survived** (faults): the run completed with the failure recorded as an event, the failed
  client's private state as before its failed fit, or, where a retry heals the fault, results
  equal to a fault-free run.
* **n/a**: the checkout lacks a key, option or command the case needs (an older checkout);
  a case may instead drop an optional key and say so in its outcome.

Checkouts are isolated from the fedkit installed in the running venv: a shim folder first on
``PYTHONPATH`` holds the checkout's own entry points (from its ``pyproject.toml`` files) and a
``sitecustomize`` that hides the venv's installed ``fedkit*`` distributions.

    python benchmarks/reliability_probe.py                        # this checkout
    python benchmarks/reliability_probe.py --before ../wt-old --out table.md
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import tomllib
import yaml

HERE = Path(__file__).resolve().parent
PROBE_PLUGIN = HERE / "reliability_probe_plugin"
MEMORY_LIMIT = 8 << 30  # bytes of address space per case (not for Ray): a bug may not swap the box
MAX_LINES = 25  # a "readable message" is at most this many lines of stderr

TINY = {
    "task": {"name": "synthetic", "sites": 3, "num_classes": 4, "head_samples": 24},
    "rounds": 1,
    "batch_size": 16,
    "checkpoint": False,
}


# ------------------------------------------------------------------------------ running a case
@dataclass
class Proc:
    """What one command did."""

    args: list[str]
    rc: int | None
    out: str
    err: str
    seconds: float
    timed_out: bool = False


@dataclass
class Verdict:
    """A case's outcome: ``status`` is clean, survived, bad or n/a; ``text`` says what."""

    status: str
    text: str

    @property
    def good(self) -> bool:
        return self.status in ("clean", "survived")


@dataclass
class Checkout:
    """A fedkit source tree and the environment that runs it in isolation."""

    repo: Path
    work: Path
    env: dict[str, str] = field(default_factory=dict)
    fixtures: dict[str, Path] = field(default_factory=dict)
    lock: threading.RLock = field(default_factory=threading.RLock)
    fork: bool = True
    servers: list[ForkServer] = field(default_factory=list)
    local: threading.local = field(default_factory=threading.local)

    def server(self) -> ForkServer | None:
        """This thread's fork server (started on first use), or None without ``fork``."""
        if not self.fork:
            return None
        if getattr(self.local, "server", None) is None:
            self.local.server = ForkServer(self.env, self.work)
            with self.lock:
                self.servers.append(self.local.server)
        return self.local.server

    def close(self) -> None:
        for server in self.servers:
            server.close()

    def prepare(self) -> None:
        shim = self.work / "shim"
        shim.mkdir(parents=True, exist_ok=True)
        _write_shim(self.repo, shim)
        paths = [shim, self.repo, *_plugin_dirs(self.repo), PROBE_PLUGIN]
        self.env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join(map(str, paths)),
            "OMP_NUM_THREADS": "1",
            "MKL_NUM_THREADS": "1",
            "MPLBACKEND": "Agg",
            "PYTHONDONTWRITEBYTECODE": "1",
            "RAY_USAGE_STATS_ENABLED": "0",
            "COLUMNS": "200",
        }


FORK_SERVER = r"""
import json, os, signal, sys, time
import torch, fedkit_core.cli, fedkit_core.cli.app, fedkit_core.api  # the warm part
from fedkit_core.cli import main

for line in sys.stdin:
    req = json.loads(line)
    out = os.open(req["out"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    err = os.open(req["err"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    start = time.monotonic()
    pid = os.fork()
    if pid == 0:  # the case: as `python -m fedkit_core.cli ARGS` in its folder
        os.setpgrp()
        if req["memory"]:
            import resource
            resource.setrlimit(resource.RLIMIT_AS, (req["memory"], req["memory"]))
        null = os.open(os.devnull, os.O_RDONLY)
        for fd, target in ((null, 0), (out, 1), (err, 2)):
            os.dup2(fd, target)
        os.chdir(req["cwd"])
        os.environ.clear()
        os.environ.update(req["env"])
        sys.argv = ["fedkit", *req["args"]]
        code = 1
        try:
            code = main(req["args"])
        except SystemExit as done:
            code = done.code if isinstance(done.code, int) else 1
        except BaseException:
            import traceback
            traceback.print_exc()
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code or 0)
    os.close(out)
    os.close(err)
    timed_out, status = False, None
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        if time.monotonic() - start > req["timeout"]:
            timed_out = True
            os.killpg(pid, signal.SIGKILL)
            _, status = os.waitpid(pid, 0)
            break
        time.sleep(0.05)
    try:
        os.killpg(pid, signal.SIGKILL)  # what the case left running
    except (ProcessLookupError, PermissionError):
        pass
    rc = os.waitstatus_to_exitcode(status)
    print(json.dumps({"rc": rc, "timed_out": timed_out, "seconds": time.monotonic() - start}),
          flush=True)
"""


class ForkServer:
    """A Python process that imported the checkout's fedkit (and torch) once and forks a child
    per command, which then runs ``fedkit_core.cli.main(args)`` -- what ``python -m
    fedkit_core.cli args`` runs -- in the case's folder and environment. It saves the import
    (seconds per case on a loaded 2-core machine); ``--no-fork`` runs plain subprocesses."""

    def __init__(self, env: dict[str, str], work: Path):
        self.work = Path(tempfile.mkdtemp(prefix="server-", dir=work))
        self.proc = subprocess.Popen(
            [sys.executable, "-c", FORK_SERVER],
            cwd=self.work,  # not the caller's folder: `-c` puts the current folder on sys.path
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )

    def run(self, args: list[str], cwd: Path, env: dict, timeout: float, memory: bool) -> Proc:
        out, err = self.work / "out", self.work / "err"
        request = {
            "args": args,
            "cwd": str(cwd),
            "env": env,
            "timeout": timeout,
            "memory": MEMORY_LIMIT if memory else 0,
            "out": str(out),
            "err": str(err),
        }
        assert self.proc.stdin and self.proc.stdout
        self.proc.stdin.write(json.dumps(request) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError("the fork server died")
        reply = json.loads(line)
        read = lambda p: p.read_text(errors="replace")  # noqa: E731
        argv = ["python", "-m", "fedkit_core.cli", *args]
        return Proc(argv, reply["rc"], read(out), read(err), reply["seconds"], reply["timed_out"])

    def close(self) -> None:
        if self.proc.stdin:
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def _plugin_dirs(repo: Path) -> list[Path]:
    found = [p.parent for p in sorted((repo / "plugins").glob("*/pyproject.toml"))]
    return found + [p.parent for p in sorted((repo / "examples").glob("*/pyproject.toml"))]


SITECUSTOMIZE = '''"""Hide the fedkit distributions installed in the venv: this checkout's come from here."""
import importlib.metadata as _md
import sysconfig as _sc

_SITE = _sc.get_paths()["purelib"]
_all = _md.distributions


def _mine(**kw):
    for dist in _all(**kw):
        name = (dist.metadata["Name"] or "").lower().replace("_", "-")
        if name.startswith("fedkit") and str(getattr(dist, "_path", "")).startswith(_SITE):
            continue
        yield dist


_md.distributions = _mine
'''


def _write_shim(repo: Path, shim: Path) -> None:
    """Dist-info folders with the entry points of ``repo``'s core and plugins."""
    (shim / "sitecustomize.py").write_text(SITECUSTOMIZE)
    for project in [repo / "pyproject.toml", *(d / "pyproject.toml" for d in _plugin_dirs(repo))]:
        meta = tomllib.loads(project.read_text()).get("project", {})
        name = meta.get("name", project.parent.name)
        info = shim / f"{name.replace('-', '_')}-{meta.get('version', '0')}.dist-info"
        info.mkdir(exist_ok=True)
        (info / "METADATA").write_text(
            f"Metadata-Version: 2.1\nName: {name}\nVersion: {meta.get('version', '0')}\n"
        )
        groups = meta.get("entry-points", {})
        lines = []
        for group, entries in groups.items():
            lines.append(f"[{group}]")
            lines += [f"{k} = {v}" for k, v in entries.items()]
        (info / "entry_points.txt").write_text("\n".join(lines) + "\n")


class Ctx:
    """One case's folder and its ways of running the checkout."""

    def __init__(self, checkout: Checkout, folder: Path, timeout: float, limit_memory: bool):
        self.checkout, self.dir, self.timeout = checkout, folder, timeout
        self.limit_memory = limit_memory
        self.env = {**checkout.env, "FEDKIT_CACHE": str(folder / "user-cache")}

    def path(self, name: str) -> Path:
        return self.dir / name

    def fedkit(self, *args: str, timeout: float | None = None) -> Proc:
        """``python -m fedkit_core.cli args``, from the warm fork server when there is one."""
        server = self.checkout.server()
        if server is None:
            return self.run([sys.executable, "-m", "fedkit_core.cli", *args], timeout)
        return server.run(
            list(args), self.dir, self.env, timeout or self.timeout, self.limit_memory
        )

    def python(self, code: str, timeout: float | None = None) -> Proc:
        return self.run([sys.executable, "-c", code], timeout)

    def start(self, args: Sequence[str]) -> subprocess.Popen:
        limit = self.limit_memory

        def setup():  # its own process group (so all its children die with it), memory cap
            os.setpgrp()
            if limit:
                import resource

                resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))

        return subprocess.Popen(
            list(args),
            cwd=self.dir,
            env=self.env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            errors="replace",
            preexec_fn=setup,
        )

    def wait(self, proc: subprocess.Popen, timeout: float | None = None) -> Proc:
        start, timed_out = time.monotonic(), False
        try:
            out, err = proc.communicate(timeout=timeout or self.timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
            _kill_group(proc.pid)
            out, err = proc.communicate()
        _kill_group(proc.pid)  # what the command left running (a hung thread's process, Ray)
        seconds = time.monotonic() - start
        return Proc(list(map(str, proc.args)), proc.returncode, out, err, seconds, timed_out)

    def run(self, args: Sequence[str], timeout: float | None = None) -> Proc:
        return self.wait(self.start(args), timeout)

    def config(self, file: str = "tiny.yaml", **overrides) -> str:
        """A tiny synthetic run's YAML (``overrides`` merged over :data:`TINY`)."""
        self.path(file).write_text(yaml.safe_dump(_merge(TINY, overrides)))
        return file

    def fixture(self, name: str) -> Path:
        """A copy (in this case's folder) of a run made once per checkout: ``finished`` (1
        checkpointed round), ``clean2`` (2 rounds without faults)."""
        with self.checkout.lock:
            made = self.checkout.fixtures.get(name)
            if made is None:
                made = self.checkout.work / "fixtures" / name
                shutil.rmtree(made, ignore_errors=True)
                made.parent.mkdir(parents=True, exist_ok=True)
                builder = Ctx(self.checkout, made.parent, 900, True)
                FIXTURES[name](builder, made)
                self.checkout.fixtures[name] = made
        return Path(shutil.copytree(made, self.path(name)))


def _kill_group(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


def _merge(base: dict, over: dict) -> dict:
    out = dict(base)
    for key, value in over.items():
        out[key] = (
            _merge(out[key], value)
            if isinstance(value, dict) and isinstance(out.get(key), dict)
            else value
        )
    return out


def _fixture_finished(ctx: Ctx, out: Path) -> None:
    ctx.config("fixture.yaml", checkpoint=True)
    proc = ctx.fedkit("run", "-c", "fixture.yaml", "-o", str(out), "-q")
    if proc.rc != 0:
        raise RuntimeError(f"fixture run failed: {proc.err[-500:]}")


def _fixture_clean2(ctx: Ctx, out: Path) -> None:
    ctx.config("clean2.yaml", rounds=2)
    proc = ctx.fedkit("run", "-c", "clean2.yaml", "-o", str(out), "-q")
    if proc.rc != 0:
        raise RuntimeError(f"fixture run failed: {proc.err[-500:]}")


FIXTURES: dict[str, Callable[[Ctx, Path], None]] = {
    "finished": _fixture_finished,
    "clean2": _fixture_clean2,
}


# ------------------------------------------------------------------------------ the criteria
def message(proc: Proc) -> str:
    """The line of stderr that says what went wrong (the ``error:`` line when there is one)."""
    lines = [ln.strip() for ln in proc.err.splitlines() if ln.strip()]
    for line in lines:
        if re.match(r"(internal )?error\b|Error:", line):
            return line
    return lines[-1] if lines else ""


def missing(proc: Proc, requires: Iterable[str]) -> str | None:
    """The first of ``requires`` (config key, ``--option``, command) this checkout lacks."""
    for name in requires:
        pattern = (
            rf"No such option:? '?{re.escape(name)}"
            if name.startswith("-")
            else rf"unknown config key '{re.escape(name)}'|No such command '{re.escape(name)}'"
            rf"|unknown plugin '{re.escape(name)}'"
        )
        if proc.rc == 2 and re.search(pattern, proc.err):
            return name
    return None


def _short(text: str, width: int = 90) -> str:
    text = " ".join(text.split()).replace("|", "\\|")
    return text if len(text) <= width else text[: width - 3] + "..."


def judge(
    proc: Proc,
    expect: str,
    *,
    requires: Iterable[str] = (),
    changed: Sequence[str] = (),
    code_ran: bool = False,
    problem: str | None = None,
) -> Verdict:
    """Classify ``proc`` by the criteria in this module's docstring.

    ``expect``: ``error`` (a clean refusal: exit 2), ``ok`` (exit 0), ``safe`` (either),
    ``survive`` (a fault: exit 0 and no ``problem``). ``changed``: files outside the run
    folder that changed or vanished; ``code_ran``: the crafted file's marker exists;
    ``problem``: a case-specific check that failed (None: it passed).
    """
    if code_ran:
        return Verdict("bad", "code from the crafted file ran")
    if changed:
        return Verdict("bad", "changed or removed: " + ", ".join(changed))
    if proc.timed_out:
        return Verdict("bad", f"hang (killed after {proc.seconds:.0f} s)")
    lacking = missing(proc, requires)
    if lacking:
        return Verdict("n/a", f"n/a: `{lacking}` does not exist in this checkout")
    traceback = "Traceback (most recent call last)" in proc.err + proc.out
    internal = re.search(r"^\s*internal error", proc.err, re.M)
    if expect in ("error", "safe") and proc.rc != 0:
        if traceback:
            return Verdict("bad", f"traceback (exit {proc.rc}): {_short(message(proc), 60)}")
        if internal:
            return Verdict("bad", f"internal error (exit {proc.rc}): {_short(message(proc), 60)}")
        if proc.rc != 2:
            return Verdict("bad", f"exit {proc.rc}: {_short(message(proc), 60)}")
        if len(proc.err.splitlines()) > MAX_LINES:
            return Verdict("bad", f"a message of {len(proc.err.splitlines())} lines")
        if not message(proc):
            return Verdict("bad", "exit 2 without a message")
    elif expect == "error":
        return Verdict("bad", "accepted (exit 0)" + (f"; {problem}" if problem else ""))
    elif proc.rc != 0:
        kind = "traceback, " if traceback else ""
        return Verdict("bad", f"{kind}exit {proc.rc}: {_short(message(proc), 60)}")
    elif traceback:
        return Verdict("bad", "exit 0 with a traceback")
    if problem:
        return Verdict("bad", problem)
    return Verdict("survived" if expect == "survive" else "clean", "ok")


def hashes(*roots: Path) -> dict[str, str]:
    """sha256 of every file under ``roots`` (a file root counts as itself)."""
    out = {}
    for root in roots:
        files = [root] if root.is_file() else sorted(p for p in root.rglob("*") if p.is_file())
        for path in files:
            out[str(path)] = hashlib.sha256(path.read_bytes()).hexdigest()
    return out


def changes(before: dict[str, str], after: dict[str, str], base: Path) -> list[str]:
    """Files of ``before`` that changed or vanished, relative to ``base``."""
    return [
        os.path.relpath(path, base) for path, digest in before.items() if after.get(path) != digest
    ]


# ------------------------------------------------------------------------------ the cases
@dataclass
class Case:
    """One probe: ``fn(ctx)`` runs it and returns its verdict."""

    id: str
    group: str
    cmd: str
    fn: Callable[[Ctx], Verdict]
    timeout: float = 300
    limit_memory: bool = True


CASES: list[Case] = []
BAD, FAULT = "bad input", "fault"


def case(id: str, group: str, cmd: str, timeout: float = 300, limit_memory: bool = True):
    def register(fn):
        CASES.append(Case(id, group, cmd, fn, timeout, limit_memory))
        return fn

    return register


def refused(ctx: Ctx, *args: str, requires: Iterable[str] = (), guard: Sequence[str] = ()):
    """Runs ``fedkit args``; clean when it is a clean exit 2 leaving ``guard`` files intact."""
    protected = [ctx.path(g) for g in guard]
    before = hashes(*[p for p in protected if p.exists()])
    proc = ctx.fedkit(*args)
    return judge(
        proc, "error", requires=requires, changed=changes(before, hashes(*protected), ctx.dir)
    )


def bad_set(id: str, *sets: str, cmd: str | None = None, requires: Iterable[str] = (), **cfg):
    """A ``fedkit run`` of the tiny config with ``--set`` values that must be refused."""
    shown = cmd or "fedkit run " + " ".join(f"--set {s}" for s in sets)

    @case(id, BAD, shown)
    def fn(ctx: Ctx) -> Verdict:
        args = ["run", "-c", ctx.config(**cfg), "-o", "run", "-q"]
        for value in sets:
            args += ["--set", value]
        return refused(ctx, *args, requires=requires)

    return fn


def bad_args(id: str, *args: str, cmd: str | None = None, requires: Iterable[str] = (), setup=None):
    """``fedkit args`` (after ``setup(ctx)``) must be refused; ``{tiny}`` is the tiny config."""

    @case(id, BAD, cmd or "fedkit " + " ".join(args))
    def fn(ctx: Ctx) -> Verdict:
        if setup:
            setup(ctx)
        tiny = ctx.config()
        return refused(ctx, *[a.replace("{tiny}", tiny) for a in args], requires=requires)

    return fn


def bad_yaml(id: str, text: str | bytes, cmd: str):
    """``fedkit run -c bad.yaml`` with ``text`` must be refused."""

    @case(id, BAD, cmd)
    def fn(ctx: Ctx) -> Verdict:
        path = ctx.path("bad.yaml")
        path.write_bytes(text if isinstance(text, bytes) else text.encode())
        return refused(ctx, "run", "-c", "bad.yaml", "-o", "run", "-q")

    return fn


def npz(path: Path, **arrays) -> Path:
    with open(path, "wb") as fh:
        np.savez(fh, **arrays)
    return path


def _cls_arrays(n: int = 24, labels=None, images=None) -> dict:
    rng = np.random.default_rng(0)
    labels = np.arange(n) % 2 if labels is None else labels
    images = rng.integers(0, 255, (len(labels), 8, 8), dtype=np.uint8) if images is None else images
    return {
        "train_images": images,
        "train_labels": labels,
        "test_images": images,
        "test_labels": labels,
    }


def bad_npz(id: str, cmd: str, make: Callable[[Path], None], task: str = "npz"):
    """``fedkit run --task npz`` on a data file ``make(path)`` writes must be refused."""

    @case(id, BAD, cmd)
    def fn(ctx: Ctx) -> Verdict:
        make(ctx.path("d.npz"))
        config = ctx.config(task={"name": task, "path": "d.npz"}, clients=2)
        return refused(ctx, "run", "-c", config, "-o", "run", "-q", guard=["d.npz"])

    return fn


# --- code execution -----------------------------------------------------------------------------
MARKER = "PWNED"
PAYLOAD = (
    "import torch, sys\n"
    "class P:\n"
    "    def __reduce__(self):\n"
    "        return (open, ({marker!r}, 'w'))\n"
    "for path in sys.argv[1:]:\n"
    "    torch.save({{'next_round': P(), 'state': P()}}, path)\n"
)


def plant(ctx: Ctx, paths: Sequence[Path]) -> None:
    """Overwrite ``paths`` with a pickle that creates :data:`MARKER` when loaded."""
    code = PAYLOAD.format(marker=str(ctx.path(MARKER)))
    proc = ctx.run([sys.executable, "-c", code, *map(str, paths)])
    if proc.rc != 0:
        raise RuntimeError(proc.err[-500:])


def unfinish(run_dir: Path, rounds: int = 2) -> None:
    """Mark a finished run as interrupted with ``rounds`` to go."""
    results = json.loads((run_dir / "results.json").read_text())
    (run_dir / "results.json").write_text(json.dumps({**results, "status": "running"}))
    config = yaml.safe_load((run_dir / "config.yaml").read_text())
    config["rounds"] = rounds
    (run_dir / "config.yaml").write_text(yaml.safe_dump(config))


def _crafted(ctx: Ctx, which: str) -> Path:
    run_dir = ctx.fixture("finished")
    unfinish(run_dir)
    pts = sorted((run_dir / "checkpoint").rglob("*.pt"))
    if which == "clients":
        pts = [p for p in pts if "client" in str(p.relative_to(run_dir / "checkpoint"))]
    elif which == "server":
        pts = [p for p in pts if "client" not in str(p.relative_to(run_dir / "checkpoint"))]
    plant(ctx, pts)
    return run_dir


def _code_exec(ctx: Ctx, run_dir: Path, *args: str, expect: str = "error") -> Verdict:
    outside = hashes(*[p for p in ctx.dir.iterdir() if p.name not in (run_dir.name, "run")])
    proc = ctx.fedkit(*args)
    after = hashes(*[p for p in ctx.dir.iterdir() if p.name not in (run_dir.name, "run")])
    return judge(
        proc,
        expect,
        code_ran=ctx.path(MARKER).exists(),
        changed=[c for c in changes(outside, after, ctx.dir) if c != MARKER],
    )


for _which in ("all", "server", "clients"):

    @case(f"resume-pickle-{_which}", "code execution", f"fedkit resume RUN  ({_which} .pt pickled)")
    def _resume_pickle(ctx: Ctx, which=_which) -> Verdict:
        run_dir = _crafted(ctx, which)
        return _code_exec(ctx, run_dir, "resume", run_dir.name)


@case("resume-manifest-outside", "code execution", "fedkit resume RUN  (manifest -> ../evil.pt)")
def _manifest_outside(ctx: Ctx) -> Verdict:
    run_dir = ctx.fixture("finished")
    unfinish(run_dir)
    plant(ctx, [ctx.path("evil.pt")])
    for manifest in (run_dir / "checkpoint").rglob("*.json"):
        data = json.loads(manifest.read_text())
        for key, value in data.items():
            if isinstance(value, str) and value.endswith(".pt"):
                data[key] = os.path.relpath(ctx.path("evil.pt"), manifest.parent)
        manifest.write_text(json.dumps(data))
    return _code_exec(ctx, run_dir, "resume", run_dir.name)


@case("resume-manifest-absolute", "code execution", "fedkit resume RUN  (manifest -> /abs/evil.pt)")
def _manifest_absolute(ctx: Ctx) -> Verdict:
    run_dir = ctx.fixture("finished")
    unfinish(run_dir)
    plant(ctx, [ctx.path("evil.pt")])
    for manifest in (run_dir / "checkpoint").rglob("*.json"):
        data = json.loads(manifest.read_text())
        data.update(
            {k: str(ctx.path("evil.pt")) for k, v in data.items() if str(v).endswith(".pt")}
        )
        manifest.write_text(json.dumps(data))
    return _code_exec(ctx, run_dir, "resume", run_dir.name)


@case(
    "compare-pickle", "code execution", "fedkit compare fedavg --seeds 0  (crafted unfinished run)"
)
def _compare_pickle(ctx: Ctx) -> Verdict:
    config = ctx.config(checkpoint=True)
    first = ctx.fedkit("compare", "fedavg", "--seeds", "0", "-c", config, "--out", "cmp", "-q")
    runs = [p.parent for p in ctx.path("cmp").rglob("results.json") if p.parent != ctx.path("cmp")]
    if first.rc != 0 or not runs:
        return judge(first, "ok")
    for run_dir in runs:
        unfinish(run_dir)
        plant(ctx, sorted((run_dir / "checkpoint").rglob("*.pt")))
    proc = ctx.fedkit("compare", "fedavg", "--seeds", "0", "-c", config, "--out", "cmp", "-q")
    return judge(proc, "safe", code_ran=ctx.path(MARKER).exists())


@case("resume-garbage-pt", BAD, "fedkit resume RUN  (.pt files are random bytes)")
def _garbage_pt(ctx: Ctx) -> Verdict:
    run_dir = ctx.fixture("finished")
    unfinish(run_dir)
    for path in (run_dir / "checkpoint").rglob("*.pt"):
        path.write_bytes(os.urandom(200))
    return refused(ctx, "resume", run_dir.name)


@case("resume-truncated-pt", BAD, "fedkit resume RUN  (.pt files cut in half)")
def _truncated_pt(ctx: Ctx) -> Verdict:
    run_dir = ctx.fixture("finished")
    unfinish(run_dir)
    for path in (run_dir / "checkpoint").rglob("*.pt"):
        path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    return refused(ctx, "resume", run_dir.name)


@case("resume-garbled-manifest", BAD, "fedkit resume RUN  (manifest is not JSON)")
def _garbled_manifest(ctx: Ctx) -> Verdict:
    run_dir = ctx.fixture("finished")
    unfinish(run_dir)
    for manifest in (run_dir / "checkpoint").rglob("*.json"):
        manifest.write_bytes(b"\xff{")
    return refused(ctx, "resume", run_dir.name)


# --- overwrites -------------------------------------------------------------------------------
@case("run-out-non-run", "overwrite", "fedkit run -o MINE  (MINE holds results.json, notes.txt)")
def _out_non_run(ctx: Ctx) -> Verdict:
    mine = ctx.path("mine")
    mine.mkdir()
    (mine / "results.json").write_text('{"my": "results"}')
    (mine / "notes.txt").write_text("keep")
    return refused(ctx, "run", "-c", ctx.config(), "-o", "mine", "-q", guard=["mine"])


for _cmd in ("data", "report"):

    @case(
        f"{_cmd}-o-dataset",
        "overwrite",
        f"fedkit {_cmd} {'-c tiny.yaml' if _cmd == 'data' else 'RUN1 RUN2'} -o other.npz  (an existing data set)",
    )
    def _o_dataset(ctx: Ctx, cmd=_cmd) -> Verdict:
        npz(ctx.path("other.npz"), **_cls_arrays())
        if cmd == "data":
            args = ["data", "-c", ctx.config(), "-o", "other.npz"]
        else:
            first = ctx.fixture("finished")
            second = shutil.copytree(first, ctx.path("finished2"))
            args = ["report", first.name, second.name, "-o", "other.npz"]
        return refused(ctx, *args, guard=["other.npz"])


@case(
    "failed-run-blocks-rerun",
    "overwrite",
    "fedkit run -o R (data absent: exit 2); fedkit run -o R  (another config)",
)
def _failed_rerun(ctx: Ctx) -> Verdict:
    """Clean: the failed run leaves no ``config.yaml`` claiming R, and the rerun succeeds."""
    bad = ctx.config("bad.yaml", task={"name": "npz", "path": "absent.npz"})
    first = ctx.fedkit("run", "-c", bad, "-o", "r", "-q")
    verdict = judge(first, "error")
    if not verdict.good:
        return verdict
    left = ctx.path("r/config.yaml").exists()
    second = ctx.fedkit("run", "-c", ctx.config(), "-o", "r", "-q")
    if second.rc != 0:
        return judge(second, "ok", problem="the rerun was refused")
    return judge(second, "ok", problem="the failed run left config.yaml in R" if left else None)


def _edited(key: str, value, requires=()):
    @case(f"resume-edited-{key}", "overwrite", f"fedkit resume RUN  (config.yaml: {key} edited)")
    def fn(ctx: Ctx) -> Verdict:
        run_dir = ctx.fixture("finished")
        unfinish(run_dir)
        config = yaml.safe_load((run_dir / "config.yaml").read_text())
        config[key] = value
        (run_dir / "config.yaml").write_text(yaml.safe_dump(config))
        proc = ctx.fedkit("resume", run_dir.name, "-q")
        recorded = any(run_dir.glob("*edit*"))
        if proc.rc == 0 and not recorded:
            return Verdict("bad", "the edit was resumed silently")
        return judge(proc, "safe")

    return fn


_edited("lr", 0.5)
_edited("plugins", ["fca"])


@case("concurrent-default-folders", "overwrite", "2 x fedkit run (same config, no -o) at once")
def _concurrent(ctx: Ctx) -> Verdict:
    config = ctx.config(name="same")
    procs = [ctx.start([sys.executable, "-m", "fedkit_core.cli", "run", "-c", config, "-q"])]
    procs.append(ctx.start([sys.executable, "-m", "fedkit_core.cli", "run", "-c", config, "-q"]))
    done = [ctx.wait(p) for p in procs]
    for proc in done:
        if proc.rc != 0 or proc.timed_out:
            return judge(proc, "ok")
    folders = {p.parent for p in ctx.dir.rglob("results.json")}
    if len(folders) != 2:
        return Verdict("bad", f"{len(folders)} run folder(s) for 2 runs: they collided")
    return Verdict("clean", "ok")


@case("orphan-tmp-files", "overwrite", "fedkit resume RUN  (killed writers' .tmp files in RUN)")
def _orphans(ctx: Ctx) -> Verdict:
    run_dir = ctx.fixture("finished")
    unfinish(run_dir)
    orphans = [run_dir / ".results.json.x1.tmp", run_dir / "checkpoint" / ".s.pt.x2.tmp"]
    for orphan in orphans:
        orphan.write_bytes(b"half")
    (run_dir / "keep.tmp").write_text("the user's")
    proc = ctx.fedkit("resume", run_dir.name, "-q")
    left = [o.name for o in orphans if o.exists()]
    problem = f"orphans left: {', '.join(left)}" if left else None
    if not (run_dir / "keep.tmp").exists():
        problem = "removed the user's keep.tmp"
    return judge(proc, "ok", problem=problem)


# --- bad input: the list ------------------------------------------------------------------
def _bomb(levels: int = 9) -> str:
    lines = ['a0: &a0 ["x", "x", "x", "x", "x", "x", "x", "x", "x"]']
    for i in range(1, levels):
        lines.append(f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]")
    return "\n".join(lines) + f"\nlr_milestones: *a{levels - 1}\n"


bad_yaml("yaml-alias-bomb", _bomb(), "fedkit run -c bomb.yaml  (9 levels of 9 aliases)")
bad_yaml(
    "yaml-deep-nesting", "x: " + "[" * 3000 + "]" * 3000 + "\n", "fedkit run -c  (3000 nested [)"
)
bad_yaml("yaml-huge-int", "rounds: " + "9" * 5000 + "\n", "fedkit run -c  (rounds: 5000 digits)")
bad_set("huge-int-set", "rounds=" + "9" * 30, cmd="fedkit run --set rounds=9...9 (30 digits)")
bad_set("image-size-huge", "task.image_size=1000000")
bad_set("image-size-zero", "task.image_size=0")
bad_set("min-clients-negative", "min_clients=-3")
bad_set("min-clients-above-clients", "min_clients=10")
bad_set("partition-min-size-negative", "partition.min_size=-5", "partition.kind=dirichlet")
bad_set("plugin-option-range", "plugins=[fca]", "fca.eps=-1")
bad_set("flower-nodes-zero", "engine=flower", "flower.nodes=0")
bad_args(
    "submit-nodes-negative",
    "flower",
    "submit",
    "--superlink",
    "127.0.0.1:1",
    "--nodes",
    "-1",
    requires=["--nodes", "submit"],
)
bad_npz(
    "npz-huge-label",
    "fedkit run --task npz  (a label of 10^9)",
    lambda p: npz(p, **_cls_arrays(labels=np.array([0, 1] * 11 + [0, 10**9]))),
)
bad_npz(
    "npz-seg-huge-mask",
    "fedkit run --task npz-seg  (a mask value of 10^9)",
    lambda p: npz(
        p,
        images=np.zeros((8, 8, 8), np.uint8),
        masks=np.pad(np.array([[[10**9]]]), ((0, 7), (0, 7), (0, 7))),
        split=np.array(["train"] * 6 + ["test"] * 2),
    ),
    task="npz-seg",
)
bad_npz(
    "npz-4d-volume",
    "fedkit run --task npz  (images 24x16x8x8: volumes)",
    lambda p: npz(p, **_cls_arrays(images=np.zeros((24, 16, 8, 8), np.uint8))),
)


@case("fifo-task-path", BAD, "fedkit run --set task.path=FIFO", timeout=90)
def _fifo(ctx: Ctx) -> Verdict:
    os.mkfifo(ctx.path("d.npz"))
    return refused(ctx, "run", "-c", ctx.config(task={"name": "npz", "path": "d.npz"}), "-q")


@case("out-under-a-file", BAD, "fedkit run -o FILE/run  (OSError: not a directory)")
def _out_file(ctx: Ctx) -> Verdict:
    ctx.path("file").write_text("")
    return refused(ctx, "run", "-c", ctx.config(), "-o", "file/run", "-q", guard=["file"])


@case("out-read-only-fs", BAD, "fedkit run -o /proc/fedkit-run  (read-only file system)")
def _out_proc(ctx: Ctx) -> Verdict:
    return refused(ctx, "run", "-c", ctx.config(), "-o", "/proc/fedkit-probe-run", "-q")


@case("report-o-dev-full", BAD, "fedkit report RUN1 RUN2 -o /dev/full/x.png  (OSError)")
def _dev_full(ctx: Ctx) -> Verdict:
    first = ctx.fixture("finished")
    second = shutil.copytree(first, ctx.path("finished2"))
    return refused(ctx, "report", first.name, second.name, "-o", "/dev/full/x.png")


@case("set-hash-kept", BAD, "fedkit run --set 'name=a #b'  (exit 0, name 'a #b')")
def _hash(ctx: Ctx) -> Verdict:
    proc = ctx.fedkit("run", "-c", ctx.config(), "-o", "run", "-q", "--set", "name=a #b")
    name = None
    if ctx.path("run/results.json").exists():
        name = json.loads(ctx.path("run/results.json").read_text())["config"].get("name")
    return judge(proc, "ok", problem=None if name == "a #b" else f"name recorded as {name!r}")


# --- deployment defaults and cache permissions ----------------------------------------------------
EXEC_PRINT = (
    "import json, sys\n"
    "import fedkit_core.cli.app  # before flower: older checkouts import them in this order\n"
    "from fedkit_core.cli import flower, main\n"
    "flower._exec = lambda command: print(json.dumps(command))\n"
    "sys.exit(main({args!r}))\n"
)


def _commands(proc: Proc) -> list[list[str]]:
    return [json.loads(ln) for ln in proc.out.splitlines() if ln.startswith("[")]


@case("superlink-bind", "deployment", "fedkit flower superlink --insecure  (address it binds)")
def _bind(ctx: Ctx) -> Verdict:
    proc = ctx.python(EXEC_PRINT.format(args=["flower", "superlink", "--insecure"]))
    words = " ".join(" ".join(c) for c in _commands(proc))
    bad = re.findall(r"0\.0\.0\.0[:\d]*|\[::\][:\d]*", words)
    problem = f"binds {', '.join(bad)} (all interfaces)" if bad else None
    if not words:
        problem = "no command"
    return judge(proc, "ok", problem=problem)


@case("superlink-node-auth", "deployment", "fedkit flower superlink --ca-cert.. --cert.. --key..")
def _node_auth(ctx: Ctx) -> Verdict:
    for name in ("ca.crt", "server.crt", "server.key"):
        ctx.path(name).write_text("pem")
    args = [
        "flower",
        "superlink",
        "--ca-cert",
        "ca.crt",
        "--cert",
        "server.crt",
        "--key",
        "server.key",
    ]
    proc = ctx.python(EXEC_PRINT.format(args=args))
    words = " ".join(" ".join(c) for c in _commands(proc))
    problem = None if "--enable-supernode-auth" in words else "SuperNodes are not authenticated"
    return judge(proc, "ok", problem=problem if words else "no command")


@case("cache-permissions", "cache", "fedkit data --task pneumonia-cxr  (data folder mode 700)")
def _cache_perms(ctx: Ctx) -> Verdict:
    from PIL import Image

    data = ctx.path("data")
    rng = np.random.default_rng(0)
    for split in ("train", "test"):
        for cls in ("NORMAL", "PNEUMONIA"):
            folder = data / split / cls
            folder.mkdir(parents=True)
            for i in range(8):
                Image.fromarray(rng.integers(0, 255, (8, 8), dtype=np.uint8)).save(
                    folder / f"{i}.png"
                )
    for path in [data, *data.rglob("*")]:
        path.chmod(0o700 if path.is_dir() else 0o600)
    ctx.path("cache.yaml").write_text(
        yaml.safe_dump({"task": {"name": "pneumonia-cxr", "path": "data", "image_size": 8}})
    )
    proc = ctx.fedkit("data", "-c", "cache.yaml", "--clients", "2", "-o", "part.png")
    entries = [p for d in (data, ctx.path("user-cache")) for p in d.rglob("*.pt")]
    open_ = [os.path.relpath(p, ctx.dir) for p in entries if p.stat().st_mode & 0o077]
    problem = f"readable by others: {', '.join(open_)}" if open_ else None
    return judge(proc, "ok", problem=problem if entries else "no cache entry written")


# --- a broader sweep of bad input ------------------------------------------------------------------
bad_args("unknown-command", "nosuch")
bad_args("unknown-flag", "run", "--nosuch", cmd="fedkit run --nosuch")
bad_args(
    "unknown-plugin",
    "run",
    "-c",
    "{tiny}",
    "-q",
    "--plugin",
    "nosuch",
    cmd="fedkit run --plugin nosuch",
)
bad_args("unknown-task", "run", "-q", "--task", "nosuch", cmd="fedkit run --task nosuch")
bad_args(
    "unknown-engine",
    "run",
    "-c",
    "{tiny}",
    "-q",
    "--engine",
    "nosuch",
    cmd="fedkit run --engine nosuch",
)
bad_args("rounds-flag-text", "run", "--rounds", "abc", cmd="fedkit run --rounds abc")
bad_args(
    "clients-flag-negative",
    "run",
    "-c",
    "{tiny}",
    "-q",
    "--clients",
    "-1",
    cmd="fedkit run --clients -1",
)
bad_args(
    "clients-flag-zero", "run", "-c", "{tiny}", "-q", "--clients", "0", cmd="fedkit run --clients 0"
)
bad_args("seed-flag-text", "run", "--seed", "x", cmd="fedkit run --seed x")
bad_args("config-absent", "run", "-c", "absent.yaml", "-q", cmd="fedkit run -c absent.yaml")
bad_args("config-is-folder", "run", "-c", ".", "-q", cmd="fedkit run -c .  (a folder)")
bad_args(
    "set-without-equals",
    "run",
    "-c",
    "{tiny}",
    "-q",
    "--set",
    "rounds",
    cmd="fedkit run --set rounds",
)
bad_args("set-empty-key", "run", "-c", "{tiny}", "-q", "--set", "=3", cmd="fedkit run --set =3")
bad_args(
    "set-empty-segment",
    "run",
    "-c",
    "{tiny}",
    "-q",
    "--set",
    "task..name=x",
    cmd="fedkit run --set task..name=x",
)
bad_args("config-plugin-unknown", "config", "--plugin", "nosuch", requires=["config"])
bad_args("resume-absent", "resume", "absent", cmd="fedkit resume absent")
bad_args(
    "resume-empty-folder",
    "resume",
    "empty",
    setup=lambda c: c.path("empty").mkdir(),
    cmd="fedkit resume EMPTY  (an empty folder)",
)
bad_args("resume-a-file", "resume", "{tiny}", cmd="fedkit resume tiny.yaml  (a file)")
bad_args("report-absent", "report", "absent", cmd="fedkit report absent")
bad_args(
    "report-empty-folder",
    "report",
    "empty",
    setup=lambda c: c.path("empty").mkdir(),
    cmd="fedkit report EMPTY",
)
bad_args("report-no-args", "report", cmd="fedkit report  (no run)")
bad_args(
    "compare-unknown-plugin",
    "compare",
    "nosuch",
    "--seeds",
    "0",
    "-c",
    "{tiny}",
    "-q",
    cmd="fedkit compare nosuch --seeds 0",
)
bad_args(
    "compare-seeds-text",
    "compare",
    "fedavg",
    "--seeds",
    "a,b",
    "-c",
    "{tiny}",
    "-q",
    cmd="fedkit compare fedavg --seeds a,b",
)
bad_args(
    "compare-seeds-empty",
    "compare",
    "fedavg",
    "--seeds",
    "",
    "-c",
    "{tiny}",
    "-q",
    cmd="fedkit compare fedavg --seeds ''",
)
bad_args("data-unknown-task", "data", "--task", "nosuch", cmd="fedkit data --task nosuch")
bad_args(
    "data-clients-zero",
    "data",
    "-c",
    "{tiny}",
    "--clients",
    "0",
    "-o",
    "p.png",
    cmd="fedkit data --clients 0",
)
bad_args(
    "supernode-no-superlink",
    "flower",
    "supernode",
    "--partition-id",
    "0",
    "--insecure",
    cmd="fedkit flower supernode  (no --superlink)",
    requires=["supernode"],
)
bad_args(
    "submit-bad-address",
    "flower",
    "submit",
    "--superlink",
    "nohost",
    "-c",
    "{tiny}",
    cmd="fedkit flower submit --superlink nohost",
    requires=["submit"],
)

for _sets in [
    ("rounds=abc",),
    ("rounds=1.5",),
    ("rounds=0",),
    ("rounds=-1",),
    ("rounds=[1]",),
    ("lr=abc",),
    ("lr=-1",),
    ("lr=nan",),
    ("lr=inf",),
    ("lr=[0.1]",),
    ("batch_size=0",),
    ("batch_size=-4",),
    ("batch_size=x",),
    ("local_epochs=0",),
    ("local_epochs=-1",),
    ("seed=abc",),
    ("seed=-1",),
    ("checkpoint=maybe",),
    ("plugins=5",),
    ("plugins=[nosuch]",),
    ("nosuch=1",),
    ("task.nosuch=1",),
    ("fca.l1=1",),
    ("task=5",),
    ("loss=nosuch",),
    ("loss=dice",),
    ("optimizer=nosuch",),
    ("model=nosuch",),
    ("model=nosuch.module:factory",),
    ("device=quantum",),
    ("device=cuda:99",),
    ("sample_fraction=0",),
    ("sample_fraction=2",),
    ("sample_fraction=-0.5",),
    ("momentum=-1",),
    ("weight_decay=-1",),
    ("eval_every=0",),
    ("eval_batch_size=0",),
    ("grad_clip=-1",),
    ("lr_schedule=nosuch",),
    ("lr_gamma=-1",),
    ("lr_milestones=[a]",),
    ("adam_betas=[2,3]",),
    ("unet_channels=[]",),
    ("model_weights=absent.pt",),
    ("partition.kind=nosuch",),
    ("partition.preset=nosuch",),
    ("partition.kind=dirichlet", "partition.alpha=0"),
    ("partition.kind=dirichlet", "partition.alpha=-1"),
    ("partition.kind=dirichlet", "partition.min_size=100000"),
    # fractions are relative shares: [0.5] alone is one client with all data (valid), so the
    # bad input is a count that does not match the clients
    ("partition.kind=fractions", "clients=3", "partition.fractions=[0.5]"),
    ("partition.kind=fractions", "partition.fractions=[-1,2,0]"),
    ("partition.kind=class-dirichlet", "partition.drop_prob=2"),
    ("task.sites=0",),
    ("task.sites=-2",),
    ("task.num_classes=0",),
    ("task.num_classes=1",),
    ("task.head_samples=0",),
    ("task.imbalance=0",),
    ("task.imbalance=-2",),
    ("task.val_fraction=1.5",),
    ("task.test_fraction=-0.1",),
    ("task.mean=[0.5]", "task.std=[0]"),
    ("task.path=absent.npz", "task.name=npz"),
    ("task.name=npz",),
    ("task.name=prostate", "task.path=."),
    ("evaluation=nosuch",),
    ("evaluation_bins=0",),
]:
    bad_set(
        "set-"
        + "-".join(s.split("=")[0].replace(".", "_") + "=" + s.split("=")[1] for s in _sets)[:60],
        *_sets,
    )

bad_set("client-timeout-negative", "client_timeout=-1", requires=["client_timeout"])
bad_set("client-timeout-zero", "client_timeout=0", requires=["client_timeout"])
bad_set("client-retries-negative", "client_retries=-1", requires=["client_retries"])
bad_set("local-workers-negative", "local.workers=-1", requires=["local.workers"])
bad_set("local-workers-text", "local.workers=many", requires=["local.workers"])
bad_set("local-threads-zero", "local.threads=0", requires=["local.threads"])
bad_set("flower-backend-unknown", "engine=flower", "flower.backend=nosuch")
bad_set("flower-client-cpus-negative", "engine=flower", "flower.client_cpus=-1")

bad_yaml("yaml-syntax", "rounds: [1\n", "fedkit run -c  (unclosed [)")
bad_yaml("yaml-tab", "rounds:\t2\n\tlr: 1\n", "fedkit run -c  (tabs)")
bad_yaml("yaml-a-list", "- 1\n- 2\n", "fedkit run -c  (a list, not a mapping)")
bad_yaml("yaml-a-scalar", "hello\n", "fedkit run -c  (a scalar)")
bad_yaml("yaml-binary", os.urandom(64) + b"\x00\xff", "fedkit run -c  (binary bytes)")
bad_yaml(
    "yaml-python-tag",
    "rounds: !!python/object/apply:os.system ['touch PWNED']\n",
    "fedkit run -c  (!!python/object tag)",
)
bad_yaml(
    "yaml-duplicate-section",
    "task: 5\ntask:\n  name: [1, 2]\n",
    "fedkit run -c  (task: 5 / list name)",
)

bad_npz(
    "npz-random-bytes",
    "fedkit run --task npz  (random bytes)",
    lambda p: p.write_bytes(os.urandom(500)),
)
bad_npz("npz-empty-file", "fedkit run --task npz  (0 bytes)", lambda p: p.write_bytes(b""))
bad_npz(
    "npz-text-file",
    "fedkit run --task npz  (a text file)",
    lambda p: p.write_text("images,labels\n"),
)
bad_npz("npz-no-arrays", "fedkit run --task npz  (no arrays)", lambda p: npz(p))
bad_npz(
    "npz-no-labels",
    "fedkit run --task npz  (no labels)",
    lambda p: npz(p, train_images=np.zeros((4, 8, 8), np.uint8)),
)
bad_npz(
    "npz-length-mismatch",
    "fedkit run --task npz  (24 images, 10 labels)",
    lambda p: npz(p, **{**_cls_arrays(), "train_labels": np.zeros(10, int)}),
)
bad_npz(
    "npz-float-labels",
    "fedkit run --task npz  (labels 0.5, 1.5)",
    lambda p: npz(p, **_cls_arrays(labels=np.arange(24) % 2 + 0.5)),
)
bad_npz(
    "npz-negative-labels",
    "fedkit run --task npz  (a label of -1)",
    lambda p: npz(p, **_cls_arrays(labels=np.array([0, 1] * 11 + [0, -1]))),
)
bad_npz(
    "npz-nan-images",
    "fedkit run --task npz  (float images with NaN)",
    lambda p: npz(p, **_cls_arrays(images=np.full((24, 8, 8), np.nan, np.float32))),
)
bad_npz(
    "npz-zero-samples",
    "fedkit run --task npz  (0 samples)",
    lambda p: npz(p, **_cls_arrays(labels=np.zeros(0, int), images=np.zeros((0, 8, 8), np.uint8))),
)
bad_npz(
    "npz-object-array",
    "fedkit run --task npz  (an object array: pickle)",
    lambda p: npz(p, **{**_cls_arrays(), "train_labels": np.array([object()] * 24)}),
)
bad_npz(
    "npz-string-labels",
    "fedkit run --task npz  (labels are strings)",
    lambda p: npz(p, **_cls_arrays(labels=np.array(["a", "b"] * 12))),
)
bad_npz(
    "npz-1d-images",
    "fedkit run --task npz  (images are 1-D)",
    lambda p: npz(p, **_cls_arrays(images=np.zeros(24, np.uint8))),
)
bad_npz(
    "npz-seg-mask-shape",
    "fedkit run --task npz-seg  (masks 4x4, images 8x8)",
    lambda p: npz(
        p,
        images=np.zeros((8, 8, 8), np.uint8),
        masks=np.zeros((8, 4, 4), np.uint8),
        split=np.array(["train"] * 6 + ["test"] * 2),
    ),
    task="npz-seg",
)
bad_npz(
    "npz-seg-no-split",
    "fedkit run --task npz-seg  (no masks)",
    lambda p: npz(p, images=np.zeros((8, 8, 8), np.uint8)),
    task="npz-seg",
)


@case("npz-is-folder", BAD, "fedkit run --task npz --set task.path=EMPTY_DIR")
def _npz_folder(ctx: Ctx) -> Verdict:
    ctx.path("d").mkdir()
    return refused(
        ctx, "run", "-c", ctx.config(task={"name": "npz", "path": "d"}), "-q", "-o", "run"
    )


@case("nan-loss", BAD, "fedkit run --set lr=1e30  (loss turns NaN)")
def _nan_loss(ctx: Ctx) -> Verdict:
    proc = ctx.fedkit(
        "run", "-c", ctx.config(rounds=2, optimizer="sgd"), "-o", "run", "-q", "--set", "lr=1e30"
    )
    return judge(proc, "error")


@case("resume-finished", BAD, "fedkit resume RUN  (already finished: exit 0, says so)")
def _resume_finished(ctx: Ctx) -> Verdict:
    run_dir = ctx.fixture("finished")
    before = hashes(run_dir / "results.json")
    proc = ctx.fedkit("resume", run_dir.name, "-q")
    return judge(proc, "safe", changed=changes(before, hashes(run_dir / "results.json"), ctx.dir))


@case("resume-corrupt-results", BAD, "fedkit resume RUN  (results.json is not JSON)")
def _resume_corrupt(ctx: Ctx) -> Verdict:
    run_dir = ctx.fixture("finished")
    (run_dir / "results.json").write_text("{half")
    return refused(ctx, "resume", run_dir.name)


@case("resume-foreign-results", BAD, "fedkit resume RUN  (results.json fedkit did not write)")
def _resume_foreign(ctx: Ctx) -> Verdict:
    run_dir = ctx.fixture("finished")
    (run_dir / "results.json").write_text('{"status": "running", "rounds": 5}')
    return refused(ctx, "resume", run_dir.name)


@case("resume-no-config", BAD, "fedkit resume RUN  (config.yaml deleted)")
def _resume_no_config(ctx: Ctx) -> Verdict:
    run_dir = ctx.fixture("finished")
    unfinish(run_dir)
    (run_dir / "config.yaml").unlink()
    return refused(ctx, "resume", run_dir.name)


@case("resume-no-checkpoint", BAD, "fedkit resume RUN  (checkpoint/ deleted)")
def _resume_no_ckpt(ctx: Ctx) -> Verdict:
    run_dir = ctx.fixture("finished")
    unfinish(run_dir)
    shutil.rmtree(run_dir / "checkpoint")
    proc = ctx.fedkit("resume", run_dir.name, "-q")
    return judge(proc, "safe")


@case("resume-config-garbage", BAD, "fedkit resume RUN  (config.yaml: rounds: abc)")
def _resume_bad_config(ctx: Ctx) -> Verdict:
    run_dir = ctx.fixture("finished")
    unfinish(run_dir)
    (run_dir / "config.yaml").write_text("rounds: abc\n")
    return refused(ctx, "resume", run_dir.name)


@case("report-corrupt-results", BAD, "fedkit report RUN  (results.json is not JSON)")
def _report_corrupt(ctx: Ctx) -> Verdict:
    run_dir = ctx.fixture("finished")
    (run_dir / "results.json").write_text("{half")
    return refused(ctx, "report", run_dir.name, "-o", "rep")


@case("report-foreign-results", BAD, "fedkit report RUN  (a results.json fedkit did not write)")
def _report_foreign(ctx: Ctx) -> Verdict:
    ctx.path("mine").mkdir()
    ctx.path("mine/results.json").write_text('{"my": "results"}')
    return refused(ctx, "report", "mine", "-o", "rep", guard=["mine"])


@case("report-ok", BAD, "fedkit report RUN -o rep  (fine input: exit 0)")
def _report_ok(ctx: Ctx) -> Verdict:
    run_dir = ctx.fixture("finished")
    before = hashes(run_dir)
    proc = ctx.fedkit("report", run_dir.name, "-o", "rep")
    return judge(proc, "ok", changed=changes(before, hashes(run_dir), ctx.dir))


for _listing in ("tasks", "plugins"):
    bad_args(f"{_listing}-ok", _listing, "--nosuch", cmd=f"fedkit {_listing} --nosuch")


# --- faults ----------------------------------------------------------------------------------------
def fault_config(ctx: Ctx, faults: Sequence[str], engine: str = "local", **over) -> str:
    counters = ctx.path("attempts")
    counters.mkdir(exist_ok=True)
    config = {
        "rounds": 2,
        "plugins": ["probe-faults"],
        "probe-faults": {"faults": list(faults), "dir": str(counters)},
        **over,
    }
    if engine != "local":
        config.update(engine="flower", flower={"backend": engine})
    return ctx.config("fault.yaml", **config)


def _results(ctx: Ctx) -> dict | None:
    path = ctx.path("run/results.json")
    return json.loads(path.read_text()) if path.exists() else None


def _fits(results: dict, rnd: int, client: str) -> int | None:
    for key, value in results["rounds"][rnd]["train"].get(client, {}).items():
        if key.endswith("fits"):
            return value
    return None


def _same_metrics(a: dict, b: dict, tol: float) -> bool:
    if isinstance(a, dict):
        return (
            isinstance(b, dict)
            and a.keys() == b.keys()
            and all(_same_metrics(a[k], b[k], tol) for k in a)
        )
    if isinstance(a, float) and isinstance(b, (int, float)):
        return abs(a - b) <= tol or (a != a and b != b)
    return a == b


OPTIONAL = {"client_timeout", "client_retries", "local"}


def _fault_run(ctx: Ctx, faults, engine: str, over: dict) -> tuple[Proc, str]:
    """Runs the fault config; keys the checkout lacks (:data:`OPTIONAL`) are dropped, once
    each, and named in the returned prefix."""
    dropped: list[str] = []
    while True:
        config = fault_config(ctx, faults, engine, **over)
        proc = ctx.fedkit("run", "-c", config, "-o", "run", "-q")
        lacking = missing(
            proc, [*over, *[f"{k}.{s}" for k, v in over.items() if isinstance(v, dict) for s in v]]
        )
        top = lacking.split(".")[0] if lacking else None
        if top not in OPTIONAL or top not in over:
            prefix = f"without {', '.join(dropped)} (absent): " if dropped else ""
            return proc, prefix
        dropped.append(lacking)
        over = {k: v for k, v in over.items() if k != top}
        shutil.rmtree(ctx.path("run"), ignore_errors=True)
        shutil.rmtree(ctx.path("attempts"), ignore_errors=True)


def _prefixed(prefix: str, verdict: Verdict) -> Verdict:
    if prefix and verdict.status != "n/a":
        return Verdict(verdict.status, prefix + verdict.text)
    return verdict


def fault(
    id: str,
    cmd: str,
    faults: Sequence[str],
    engine: str = "local",
    healed: bool = False,
    timeout: float = 400,
    **over,
):
    """A run with ``faults`` injected survives: exit 0 and the failure recorded as an event for
    the faulty client and round, which keeps no state of its failed fit (one fit fewer in the
    next round than the others) -- or, ``healed`` by a retry, no event and the fault-free
    run's metrics."""

    @case(id, FAULT, cmd, timeout=timeout, limit_memory=engine != "ray")
    def fn(ctx: Ctx) -> Verdict:
        proc, prefix = _fault_run(ctx, faults, engine, over)
        results = _results(ctx)
        problem = None
        if proc.rc == 0 and results is not None:
            events = results.get("events") or []
            if healed:
                clean = json.loads((ctx.fixture("clean2") / "results.json").read_text())
                tol = 0.0 if engine == "local" else 1e-6
                if events:
                    problem = f"retry did not heal it: {len(events)} event(s)"
                elif not _same_metrics(clean["final"]["global"], results["final"]["global"], tol):
                    problem = "results differ from the fault-free run"
            else:
                kind, client, rnd = faults[0].split(":")[:3]
                hit = [
                    e for e in events if e.get("client") == client and e.get("round") == int(rnd)
                ]
                others = [c for c in results["rounds"][1]["train"] if c != client]
                if not hit:
                    problem = "the failure was not recorded as an event"
                elif (
                    int(rnd) == 1
                    and others
                    and _fits(results, 1, client) != _fits(results, 1, others[0]) - 1
                ):
                    problem = (
                        f"{client} kept state of its failed fit ({_fits(results, 1, client)} fits "
                        f"counted, {_fits(results, 1, others[0]) - 1} done)"
                    )
        elif proc.rc == 0:
            problem = "no results.json"
        return _prefixed(prefix, judge(proc, "survive", problem=problem))

    return fn


fault(
    "local-raise",
    "fedkit run  (site1 raises in round 1; min_clients=2)",
    ["raise:site1:1"],
    min_clients=2,
)
fault(
    "local-sys-exit",
    "fedkit run  (site1 calls sys.exit in round 1)",
    ["sys-exit:site1:1"],
    min_clients=2,
)
fault(
    "local-hang",
    "fedkit run --set client_timeout=20  (site1 hangs)",
    ["hang:site1:1"],
    min_clients=2,
    client_timeout=20,
    timeout=400,
)
fault(
    "local-exit",
    "fedkit run --set local.workers=1  (site1's process exits)",
    ["exit:site1:1"],
    min_clients=2,
    local={"workers": 1},
)
fault(
    "local-raise-retry",
    "fedkit run --set client_retries=1  (site1 raises once)",
    ["raise:site1:1:1"],
    healed=True,
    client_retries=1,
)
fault(
    "local-hang-retry",
    "fedkit run client_timeout=20 client_retries=1  (site1 hangs once)",
    ["hang:site1:1:1"],
    healed=True,
    client_timeout=20,
    client_retries=1,
    timeout=400,
)
fault(
    "local-exit-retry",
    "fedkit run local.workers=1 client_retries=1  (exit once)",
    ["exit:site1:1:1"],
    healed=True,
    local={"workers": 1},
    client_retries=1,
)
fault(
    "thread-raise",
    "fedkit run --engine flower (thread)  (site1 raises)",
    ["raise:site1:1"],
    "thread",
    min_clients=2,
)
fault(
    "thread-sys-exit",
    "fedkit run --engine flower (thread)  (site1 sys.exit)",
    ["sys-exit:site1:1"],
    "thread",
    min_clients=2,
)
fault(
    "thread-hang",
    "fedkit run --engine flower (thread) client_timeout=20  (site1 hangs)",
    ["hang:site1:1"],
    "thread",
    min_clients=2,
    client_timeout=20,
    timeout=400,
)
fault(
    "thread-hang-last",
    "flower (thread) client_timeout=20  (site2 hangs in the last round)",
    ["hang:site2:2"],
    "thread",
    min_clients=2,
    client_timeout=20,
    timeout=400,
)
fault(
    "thread-raise-retry",
    "flower (thread) client_retries=1  (site1 raises once)",
    ["raise:site1:1:1"],
    "thread",
    healed=True,
    client_retries=1,
)
fault(
    "ray-raise",
    "fedkit run --engine flower (ray)  (site1 raises)",
    ["raise:site1:1"],
    "ray",
    min_clients=2,
    timeout=400,
)
fault(
    "ray-exit",
    "fedkit run --engine flower (ray)  (site1's worker exits)",
    ["exit:site1:1"],
    "ray",
    min_clients=2,
    timeout=400,
)


def fault_error(id: str, cmd: str, faults: Sequence[str], **over):
    """Too many clients fail: a clear error (exit 1 or 2, no traceback, naming the client)."""

    @case(id, FAULT, cmd)
    def fn(ctx: Ctx) -> Verdict:
        proc, prefix = _fault_run(ctx, faults, "local", over)
        verdict = judge(proc, "safe")
        if (
            verdict.status == "bad"
            and proc.rc == 1
            and "internal error" not in proc.err
            and ("Traceback" not in proc.err)
        ):
            verdict = Verdict("clean", "ok")  # a plugin's bug is exit 1 by design
        if verdict.good:
            if proc.rc == 0:
                verdict = Verdict("bad", "exit 0 although no client finished a round")
            elif "site" not in message(proc):
                verdict = Verdict("bad", f"does not name the client: {_short(message(proc), 60)}")
            else:
                verdict = Verdict("survived", "a clear error")
        return _prefixed(prefix, verdict)

    return fn


fault_error(
    "local-all-fail-min0",
    "fedkit run --set min_clients=0  (every client raises)",
    ["raise:site0:1", "raise:site1:1", "raise:site2:1"],
    min_clients=0,
)
fault_error(
    "local-too-few-left",
    "fedkit run --set min_clients=3  (site1 raises)",
    ["raise:site1:1"],
    min_clients=3,
)


# ------------------------------------------------------------------------------ driving the probe
def probe(
    repo: Path, cases: Sequence[Case], jobs: int = 2, log=print, fork: bool = True
) -> dict[str, Verdict]:
    """Run ``cases`` against the checkout at ``repo``; their verdicts by id."""
    with tempfile.TemporaryDirectory(prefix="fedkit-probe-") as work:
        checkout = Checkout(Path(repo).resolve(), Path(work), fork=fork)
        checkout.prepare()

        def one(c: Case) -> tuple[str, Verdict]:
            folder = Path(work) / "cases" / c.id
            folder.mkdir(parents=True)
            start = time.monotonic()
            try:
                verdict = c.fn(Ctx(checkout, folder, c.timeout, c.limit_memory))
            except Exception as err:  # the probe's own setup failed: say so, do not hide it
                verdict = Verdict(
                    "bad", f"probe setup failed: {type(err).__name__}: {_short(str(err), 80)}"
                )
            log(f"  {c.id}: {verdict.status} ({verdict.text}) {time.monotonic() - start:.0f}s")
            shutil.rmtree(folder, ignore_errors=True)
            return c.id, verdict

        try:
            with ThreadPoolExecutor(jobs) as pool:
                return dict(pool.map(one, cases))
        finally:
            checkout.close()


def counts(cases: Sequence[Case], verdicts: dict[str, Verdict]) -> dict[str, tuple[int, int, int]]:
    """(good, total applicable, n/a) for bad inputs (every non-fault case) and faults."""
    out = {}
    for label, in_group in (
        ("bad inputs", lambda c: c.group != FAULT),
        ("faults", lambda c: c.group == FAULT),
    ):
        mine = [verdicts[c.id] for c in cases if in_group(c) and c.id in verdicts]
        applicable = [v for v in mine if v.status != "n/a"]
        out[label] = (sum(v.good for v in applicable), len(applicable), len(mine) - len(applicable))
    return out


def _cell(verdict: Verdict | None) -> str:
    if verdict is None:
        return "not run"
    if verdict.good and verdict.text == "ok":
        return verdict.status
    mark = {"clean": "", "survived": "", "bad": "**not clean**: ", "n/a": ""}[verdict.status]
    if verdict.status == "survived":
        return verdict.text
    return mark + _short(verdict.text, 80)


def table(
    cases: Sequence[Case], after: dict[str, Verdict], before: dict[str, Verdict] | None
) -> str:
    """The markdown table: case, command, before, after; then the counts."""
    head = ["case", "group", "command"] + (["before"] if before is not None else []) + ["after"]
    rows = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for c in cases:
        cells = [f"`{c.id}`", c.group, _short(c.cmd, 90)]
        if before is not None:
            cells.append(_cell(before.get(c.id)))
        cells.append(_cell(after.get(c.id)))
        rows.append("| " + " | ".join(cells) + " |")
    lines = ["\n".join(rows), ""]
    for name, verdicts in (("before", before), ("after", after)):
        if verdicts is None:
            continue
        summary = counts(cases, verdicts)
        bad, flt = summary["bad inputs"], summary["faults"]
        lines.append(
            f"- **{name}**: bad inputs {bad[0]}/{bad[1]} clean ({bad[2]} n/a); "
            f"faults {flt[0]}/{flt[1]} survived ({flt[2]} n/a)"
        )
    return "\n".join(lines) + "\n"


LOG_LINE = re.compile(r"^(before|after) +(\S+): (clean|survived|bad|n/a) \((.*)\) \d+s$")


def from_log(text: str) -> dict[str, dict[str, Verdict]]:
    """The verdicts a probe logged (``NAME   ID: STATUS (TEXT) SECONDSs`` lines)."""
    runs: dict[str, dict[str, Verdict]] = {}
    for line in text.splitlines():
        match = LOG_LINE.match(line)
        if match:
            name, cid, status, what = match.groups()
            runs.setdefault(name, {})[cid] = Verdict(status, what)
    return runs


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--repo", type=Path, default=HERE.parent, help="the checkout probed (after)"
    )
    parser.add_argument("--before", type=Path, help="an older checkout for the 'before' column")
    parser.add_argument("--only", help="regex: run only the cases whose id matches")
    parser.add_argument("--jobs", type=int, default=2, help="cases run at once")
    parser.add_argument("--out", type=Path, help="also write the markdown table here")
    parser.add_argument("--json", type=Path, help="also write the verdicts as JSON here")
    parser.add_argument(
        "--no-fork", action="store_true", help="a fresh interpreter per command (slower)"
    )
    parser.add_argument(
        "--from-log", type=Path, help="render the table from a probe's stderr log (no runs)"
    )
    args = parser.parse_args(argv)
    cases = [c for c in CASES if not args.only or re.search(args.only, c.id)]
    if args.from_log:
        runs = from_log(args.from_log.read_text())
        text = table(cases, runs.get("after", {}), runs.get("before"))
        print(text)
        if args.out:
            args.out.write_text(text)
        return 0
    print(f"{len(cases)} cases", file=sys.stderr)
    log = lambda line: print(line, file=sys.stderr, flush=True)  # noqa: E731
    trees = {"after": args.repo, **({"before": args.before} if args.before else {})}
    with ThreadPoolExecutor(len(trees)) as pool:  # both checkouts at once
        runs = {
            name: pool.submit(
                probe, tree, cases, args.jobs, lambda s, n=name: log(f"{n} {s}"), not args.no_fork
            )
            for name, tree in trees.items()
        }
        after = runs["after"].result()
        before = runs["before"].result() if "before" in runs else None
    text = table(cases, after, before)
    print(text)
    if args.out:
        args.out.write_text(text)
    if args.json:
        data = {
            name: {k: vars(v) for k, v in verdicts.items()}
            for name, verdicts in (("before", before or {}), ("after", after))
        }
        args.json.write_text(json.dumps(data, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
