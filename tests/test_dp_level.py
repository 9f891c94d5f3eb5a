"""``dp.level`` has one reader, :func:`fedkit_core.contract.channels.dp_level`, which takes a
run's config in each form it comes in (resolved, a record's flat keys, ``config.yaml``'s
nesting)."""

from __future__ import annotations

import re
from pathlib import Path

from fedkit_core.contract.channels import CLIENT, NONE, SAMPLE, dp_level
from fedkit_core.resolve import resolve_config

ROOT = Path(__file__).resolve().parents[1]
#: a read of the key: ``config["dp.level"]``, ``config.get("dp.level")``, ``...get("level")``
READ = re.compile(r"""\[\s*["']dp\.level["']\s*\]|\.get\(\s*["'](dp\.)?level["']""")


def test_dp_level_is_read_in_one_module():
    sources = [*(ROOT / "fedkit_core").rglob("*.py"), *(ROOT / "plugins").rglob("*.py")]
    readers = sorted(
        path.relative_to(ROOT).as_posix()
        for path in sources
        if "tests" not in path.parts and READ.search(path.read_text())
    )
    assert readers == ["fedkit_core/contract/channels.py"]


def test_dp_level_of_each_form_of_config():
    resolved, _ = resolve_config({"dp": {"level": SAMPLE}})
    assert dp_level(resolved) == SAMPLE
    assert dp_level({"dp.level": CLIENT}) == CLIENT  # a record's flat keys
    assert dp_level({"dp": {"level": CLIENT}}) == CLIENT  # config.yaml's nesting
    assert dp_level({"rounds": 3}) == NONE  # a record made before dp.* existed
    assert dp_level(resolve_config({})[0]) == NONE
