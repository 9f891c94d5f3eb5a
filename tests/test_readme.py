"""The README's command lines work as written: each ``fedkit`` line of its "Using it" block
runs, at a tiny size (one round, small stand-in ``.npz`` files in ``$DATA``)."""

import os
import re
import shlex
from pathlib import Path

import pytest

from fedkit_core.cli import main
from fedkit_core.tasks import npz

ROOT = Path(__file__).resolve().parents[1]
#: README lines not run here, and where they are tested instead
ELSEWHERE = {"bash examples/flower/deploy_local.sh": "tests/test_flower.py (deployment)"}
#: appended to a line's arguments: the last value of an option wins
TINY = {"run": ["--rounds", "1"], "compare": ["--rounds", "1", "--seeds", "0,1"]}
#: appended where a line runs the default synthetic task: fewer images per site
SMALL_SYNTHETIC = ["--set", "task.head_samples=20"]


def readme_lines() -> list[str]:
    """The command lines of the README's "Using it" block, continuations joined."""
    text = (ROOT / "README.md").read_text()
    block = re.search(r"## Using it.*?```bash\n(.*?)```", text, re.S).group(1)
    return [line for line in block.replace("\\\n", " ").splitlines() if line.strip()]


def test_the_block_is_found_and_names_its_data_folder():
    lines = readme_lines()
    assert lines[0].startswith("DATA=") and sum(line.startswith("fedkit ") for line in lines) > 8


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    """A folder to run the lines in: ``examples/`` beside it, ``$DATA`` with stand-ins."""
    work = tmp_path_factory.mktemp("readme")
    (work / "examples").symlink_to(ROOT / "examples")
    data = work / "data"
    for name, seed in (("pneumoniamnist", 0), ("retinamnist", 1)):
        fake = npz.write_fake(data / name, train=60, test=24, size=32, seed=seed)
        fake.rename(data / f"{name}.npz")
    return work


@pytest.mark.slow
@pytest.mark.parametrize(
    "line",
    [x for x in readme_lines() if not x.startswith("DATA=")],
    ids=lambda line: " ".join(line.split("#")[0].split()[:4]),
)
def test_readme_line_runs_as_written(line, workdir, monkeypatch, capsys):
    skipped = next((where for start, where in ELSEWHERE.items() if line.startswith(start)), None)
    if skipped:
        pytest.skip(f"tested in {skipped}")
    monkeypatch.chdir(workdir)
    monkeypatch.setenv("DATA", str(workdir / "data"))
    args = shlex.split(os.path.expandvars(line), comments=True)
    assert args[0] == "fedkit", line
    if "--engine" in args and "flower" in args:
        pytest.importorskip("flwr")
    tiny = TINY.get(args[1], [])
    if tiny and "--task" not in args:
        tiny = [*tiny, *SMALL_SYNTHETIC]
    code = main([*args[1:], *tiny])
    assert code == 0, capsys.readouterr().err[-2000:]
