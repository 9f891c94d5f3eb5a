"""Shared fixtures of the task-zoo tests: a private cache folder and a loader shortcut."""

from __future__ import annotations

import pytest

from fedkit_core.contract.data import TaskData
from fedkit_core.resolve import resolve_config
from fedkit_core.tasks.loading import load_task


@pytest.fixture(autouse=True)
def private_cache(tmp_path_factory, monkeypatch):
    """Every test caches into its own folder, never into the user's ~/.cache."""
    folder = tmp_path_factory.mktemp("fedkit-cache")
    monkeypatch.setenv("FEDKIT_CACHE", str(folder))
    return folder


@pytest.fixture
def load():
    """``load(task, path, **task_options) -> TaskData`` through the normal config path."""

    def _load(task: str, path, **options) -> TaskData:
        config, _ = resolve_config({"task": {"name": task, "path": str(path), **options}})
        return load_task(config)

    return _load
