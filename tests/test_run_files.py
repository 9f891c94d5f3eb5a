"""The files of a run (issue 34): who may read them, runs only read (read-only folders,
damaged or crafted results.json), a complete run's missing outputs written again, and no
temporary file of a killed writer left behind."""

import json
import os
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

import fedkit_core
from fedkit_core import resume, run
from fedkit_core.cli import main
from fedkit_core.fileio import FILE_MODE
from fedkit_core.testing import tiny


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """A complete run of one round, its figures as PNG and SVG (copied by the tests that
    change it)."""
    out = tmp_path_factory.mktemp("files") / "run"
    run({**tiny(rounds=1), "figure_formats": ["png", "svg"]}, out=out)
    return out


def _copy(source: Path, target: Path) -> Path:
    import shutil

    return Path(shutil.copytree(source, target))


@pytest.fixture
def read_only(monkeypatch):
    """``freeze(folder)``: the folder and everything in it read-only, as for a user who may
    not write there; also when the tests run as root, whom permissions do not stop: a
    temporary file made under it (every write of fedkit's) then fails as for that user."""
    frozen: list[Path] = []
    real_access, real_mkstemp = os.access, tempfile.mkstemp

    def inside(path) -> bool:
        path = Path(path).absolute()
        return any(path == f or f in path.parents for f in frozen)

    def access(path, mode, *args, **kwargs):
        if mode & os.W_OK and inside(path):
            return False
        return real_access(path, mode, *args, **kwargs)

    def mkstemp(*args, dir=None, **kwargs):
        if dir is not None and inside(dir):
            raise PermissionError(13, "Permission denied", str(dir))
        return real_mkstemp(*args, dir=dir, **kwargs)

    monkeypatch.setattr(os, "access", access)
    monkeypatch.setattr(tempfile, "mkstemp", mkstemp)

    def freeze(folder: Path) -> dict[str, bytes]:
        for path in [folder, *folder.rglob("*")]:
            path.chmod(stat.S_IMODE(path.stat().st_mode) & ~0o222)
        frozen.append(folder.absolute())
        return {str(p): p.read_bytes() for p in folder.rglob("*") if p.is_file()}

    yield freeze
    for folder in frozen:
        for path in [folder, *folder.rglob("*")]:
            path.chmod(stat.S_IMODE(path.stat().st_mode) | 0o200)


@pytest.mark.slow
def test_files_of_a_run_follow_the_umask_and_a_private_run_is_only_its_owners(tmp_path):
    shared = run(tiny(rounds=1), out=tmp_path / "shared")
    assert shared.final
    umask = os.umask(0)
    os.umask(umask)
    assert 0o666 & ~umask == FILE_MODE  # what open() gives: documented in docs/results.md
    for path in (tmp_path / "shared").rglob("*"):
        mode = stat.S_IMODE(path.stat().st_mode)
        assert mode == (0o777 & ~umask if path.is_dir() else FILE_MODE), path
    assert main(["run", "--rounds", "1", "--private", "-q", "-o", str(tmp_path / "mine")]) == 0
    mine = tmp_path / "mine"
    assert stat.S_IMODE(mine.stat().st_mode) == 0o700
    inside = list(mine.rglob("*"))
    assert any(p.match("checkpoint/clients/site0/r1.pt") for p in inside)
    for path in inside:
        assert stat.S_IMODE(path.stat().st_mode) == (0o700 if path.is_dir() else 0o600), path


@pytest.mark.slow
def test_resume_of_a_complete_run_writes_the_outputs_it_lacks(finished, tmp_path):
    killed = _copy(finished, tmp_path / "run")  # as if killed right after results.json
    for name in ("metrics.csv", "curves.png", "curves.svg", "clients.svg"):
        (killed / name).unlink()
    before = (killed / "results.json").read_bytes()
    resume(killed)
    for name in ("metrics.csv", "curves.png", "curves.svg", "clients.svg"):
        assert (killed / name).is_file(), name
    assert (killed / "metrics.csv").read_bytes() == (finished / "metrics.csv").read_bytes()
    assert (killed / "results.json").read_bytes() == before


@pytest.mark.slow
def test_an_interrupted_writers_temporary_file_goes_with_the_next_write(finished, tmp_path):
    target = _copy(finished, tmp_path / "run")
    killed = (  # a `fedkit report` killed while writing curves.png
        "import os, sys; from pathlib import Path; from fedkit_core.fileio import write_atomic;"
        "write_atomic(Path(sys.argv[1]), lambda fh: (fh.write(b'half a png'), fh.flush(), os._exit(9)))"
    )
    env = {**os.environ, "PYTHONPATH": str(Path(fedkit_core.__file__).parents[1])}
    done = subprocess.run([sys.executable, "-c", killed, str(target / "curves.png")], env=env)
    assert done.returncode == 9
    assert list(target.glob(".curves.png.*.tmp"))  # what the kill left
    assert main(["report", str(target)]) == 0
    assert not list(target.glob(".*.tmp"))


DAMAGED = {
    "deep nesting": '{"status": "complete", "config": ' + "[" * 100_000 + "]" * 100_000 + "}",
    "no final": {"status": "complete", "config": {}, "task": {}, "rounds": []},
    "rounds not a list": {"status": "complete", "config": {}, "task": {}, "rounds": 3, "final": {}},
    "wrong types inside": {
        "status": "complete",
        "config": {},
        "task": {"main_metric": 5, "client_ids": 7},
        "rounds": [{"round": "one", "val": []}],
        "final": {"global": [], "round": "x"},
    },
}


@pytest.mark.parametrize("case", list(DAMAGED))
def test_report_on_a_damaged_or_crafted_results_file_is_one_clear_error(
    finished, tmp_path, capsys, case
):
    target = _copy(finished, tmp_path / "run")
    text = DAMAGED[case]
    (target / "results.json").write_text(text if isinstance(text, str) else json.dumps(text))
    capsys.readouterr()
    assert main(["report", str(target)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "results" in err, err
    assert "Traceback" not in err and "internal error" not in err


@pytest.mark.slow
def test_report_and_compare_summarise_read_only_runs(tmp_path, read_only, capsys):
    from fedkit_core.comparison import compare

    out = tmp_path / "cmp"
    layer = [tiny(rounds=1)]
    compare(["fedavg"], seeds=[0], out=out, base=layer)
    files = read_only(out)
    run_dir = out / "fedavg" / "seed0"
    capsys.readouterr()
    assert main(["report", str(run_dir)]) == 0
    said = " ".join(capsys.readouterr().out.split())  # the console wraps long paths
    assert "final metrics" in said and "is read-only: its figures are left as they are" in said
    found = compare(["fedavg"], seeds=[0], out=out, base=layer)  # the complete run, reused
    assert not found.written and found.table["fedavg"]["final.global.bacc"]["per_seed"]
    overlay = tmp_path / "overlay.png"
    assert main(["report", str(run_dir), str(run_dir), "-o", str(overlay)]) == 0
    assert overlay.is_file()  # the figure went to the writable place given
    assert {str(p): p.read_bytes() for p in out.rglob("*") if p.is_file()} == files
