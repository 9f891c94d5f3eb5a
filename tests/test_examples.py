"""The shipped examples stay valid: configs resolve and the embedding script runs."""

import runpy
from pathlib import Path

import pytest

from fedkit_core import resolve_config

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


@pytest.mark.parametrize(
    "path", sorted(EXAMPLES.rglob("*.yaml")), ids=lambda p: str(p.relative_to(EXAMPLES))
)
def test_example_configs_resolve(path):
    name = path.relative_to(EXAMPLES).as_posix()
    if name.startswith("sites/"):  # site profiles: a run's `sites` file, not a run config
        config, _ = resolve_config([{"sites": str(path)}])
        assert config["sites"]["profiles"]  # read and checked (fedkit_core.sites.load_sites)
        return
    base = OVERLAYS.get(name)
    config, _ = resolve_config([str(EXAMPLES / base), str(path)] if base else str(path))
    assert config["rounds"] >= 1


#: configs meant to be put on top of another (a runspec of `fedkit compare --config BASE`)
OVERLAYS = {
    "fed-mas/kd-only.yaml": "fed-mas/offline.yaml",
    "fedcb/random.yaml": "fedcb/offline.yaml",
    "fedcb/mean-only.yaml": "fedcb/offline.yaml",
    "fed-mas/ssl-prior.yaml": "fed-mas/offline.yaml",
}


@pytest.mark.slow
def test_embedding_example_runs(capsys, monkeypatch):
    import fedkit_core

    original = fedkit_core.run
    monkeypatch.setattr(
        fedkit_core, "run", lambda config, **kw: original({**config, "rounds": 1}, **kw)
    )
    runpy.run_path(str(EXAMPLES / "embed.py"), run_name="__main__")
    out = capsys.readouterr().out
    assert "worst class recall" in out and "fairness" in out


#: each method folder's CPU-sized examples (their headers give a measured time)
CPU_EXAMPLES = {
    "fca": ["retinamnist_cpu.yaml"],
    "fed-lwr": ["drive-cpu.yaml"],
    "fed-mas": ["offline.yaml"],
    "fedcb": ["offline.yaml"],
    "fedhelp": ["offline.yaml", "segmentation.yaml"],
}


@pytest.mark.parametrize("method", sorted(CPU_EXAMPLES))
def test_method_examples_state_time_and_paper_size(method):
    folder = EXAMPLES / method
    assert (folder / "paper.yaml").is_file()  # the paper's real size (a file or a link)
    for name in CPU_EXAMPLES[method]:
        header = (folder / name).read_text().split("\n# Time: ", 1)
        assert len(header) == 2 and "on 2 CPU cores" in header[1].split("\n")[0], name
