"""The light core: a default run imports none of the libraries behind fedkit's extras
(timm, open_clip, monai, nibabel), and a feature that needs a missing one is a user error
naming the extra that installs it."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import yaml

from fedkit_core.cli import main
from fedkit_core.errors import FedkitError
from fedkit_core.extras import EXTRA_OF, require
from fedkit_core.models import build_backbone
from fedkit_core.models.networks import unet
from fedkit_core.testing import tiny

#: imports fedkit's entry points, loads every installed plugin, runs one round of a small
#: default-model run through the CLI, and prints which optional libraries got imported
PROBE = """
import json, sys
import fedkit_core, fedkit_core.api, fedkit_core.cli
from fedkit_core.plugin_manager import installed
for entry_point in installed().values():
    entry_point.load()
code = fedkit_core.cli.main(["run", "--config", sys.argv[1], "--out", sys.argv[2], "-q"])
loaded = sorted(m for m in sys.modules if m.partition(".")[0] in sys.argv[3].split(","))
print(json.dumps({"code": code, "loaded": loaded}))
"""


@pytest.mark.slow
def test_a_default_run_imports_no_optional_library(tmp_path):
    config = tmp_path / "tiny.yaml"
    config.write_text(yaml.safe_dump(tiny(rounds=1)))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MPLBACKEND": "Agg"}
    argv = [str(config), str(tmp_path / "run"), ",".join(EXTRA_OF)]
    done = subprocess.run(
        [sys.executable, "-c", PROBE, *argv], capture_output=True, text=True, env=env, timeout=300
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report == {"code": 0, "loaded": []}


def test_require_names_the_extra():
    assert require("json", "reading").dumps is json.dumps
    with pytest.raises(
        FedkitError, match=r"task ixi needs the `nibabel` package: pip install 'fedkit\[nifti\]'"
    ):
        require("nibabel.fedkit_no_such_module", "task ixi")


@pytest.mark.parametrize(
    ("module", "build", "extra"),
    [
        ("timm", lambda: build_backbone("resnet18", 3), "timm"),
        ("timm", lambda: build_backbone("efficientnet_lite0", 3), "timm"),
        ("timm", lambda: build_backbone("efficientnet_lite0", 3, pretrained=True), "pretrained"),
        ("monai", lambda: unet(2, 1, 2, (8, 16)), "monai"),
    ],
)
def test_a_missing_library_names_its_extra(monkeypatch, module, build, extra):
    monkeypatch.setitem(sys.modules, module, None)  # `import module` now fails
    with pytest.raises(
        FedkitError, match=rf"needs the `{module}` package: pip install 'fedkit\[{extra}\]'"
    ):
        build()


def test_the_cli_reports_a_missing_extra_without_a_traceback(monkeypatch, tmp_path, capsys):
    config = tmp_path / "tiny.yaml"
    config.write_text(yaml.safe_dump(tiny(rounds=1, model="resnet18")))
    monkeypatch.setitem(sys.modules, "timm", None)
    code = main(["run", "--config", str(config), "--out", str(tmp_path / "run"), "-q"])
    err = capsys.readouterr().err
    assert code == 2
    assert "pip install 'fedkit[timm]'" in err and "Traceback" not in err
