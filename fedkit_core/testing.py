"""Helpers for testing fedkit and fedkit plugins (the core's tests and plugin authors' tests).

* :func:`shared_data` finds the real data sets under ``../shared/data`` (or
  ``$FEDKIT_SHARED_DATA``) and skips the test with a clear reason when they are absent.
* :func:`tiny` / :func:`tiny_seg` give configs that run a whole federation in seconds.
* :func:`tiny_npz` writes a small MedMNIST-style file; :func:`tiny_pretrained` a config
  training the offline ImageNet EfficientNet-Lite0 on it (needs ``fedkit[pretrained]``).
* :class:`InterruptAfter` stops a run after a round, as Ctrl-C would (to test resuming).

With :mod:`fedkit_core.plugin` this module is all a plugin's tests import of fedkit
(``tests/test_plugin_imports.py`` checks it): beside the helpers above, the core's pieces a
test drives directly, loaded when first used (:data:`TEST_SURFACE`): a run's config and
plugins (:func:`resolve_config`, :class:`PluginSet`), its federation (:func:`prepare`), a
party's model through the hooks (:func:`party_model`), one client (:class:`ClientRuntime`
fed :class:`Message` objects), checkpoints, the task registry and a few builders.
"""

from __future__ import annotations

import importlib
import os
from pathlib import Path
from typing import Any

from fedkit_core.contract.observer import Observer

#: name -> (module, attribute) of the core's pieces a plugin's tests may drive directly; the
#: modules load on first use, so importing this module stays light
TEST_SURFACE = {
    "BUNDLED": ("fedkit_core.plugin_manager", "BUNDLED"),
    "ClientCheckpoints": ("fedkit_core.engines.checkpoint", "ClientCheckpoints"),
    "ClientFailure": ("fedkit_core.errors", "ClientFailure"),
    "ClientRuntime": ("fedkit_core.engines.client", "ClientRuntime"),
    "Message": ("fedkit_core.contract.messages", "Message"),
    "PluginSet": ("fedkit_core.plugin_manager", "PluginSet"),
    "ServerCheckpoints": ("fedkit_core.engines.checkpoint", "ServerCheckpoints"),
    "all_tasks": ("fedkit_core.tasks.registry", "all_tasks"),
    "fedkit_command": ("fedkit_core.cli", "main"),
    "imagenet_weights_file": ("fedkit_core.models.imagenet", "weights_file"),
    "load_yaml": ("fedkit_core.config", "load_yaml"),
    "party_model": ("fedkit_core.engines.model", "build_model"),
    "prepare": ("fedkit_core.federation", "prepare"),
    "resolve_config": ("fedkit_core.resolve", "resolve_config"),
    "unet": ("fedkit_core.models.networks", "unet"),
    "write_fake_npz_seg": ("fedkit_core.tasks.npz_seg", "write_fake"),
}


def __getattr__(name: str) -> Any:
    if name in TEST_SURFACE:
        module, attribute = TEST_SURFACE[name]
        return getattr(importlib.import_module(module), attribute)
    raise AttributeError(f"module 'fedkit_core.testing' has no attribute {name!r}")


REPO_ROOT = Path(__file__).resolve().parents[1]


def shared_data_root() -> Path:
    env = os.environ.get("FEDKIT_SHARED_DATA")
    candidates = [Path(env)] if env else []
    candidates += [REPO_ROOT.parent / "shared" / "data", Path.cwd().parent / "shared" / "data"]
    for path in candidates:
        if path.is_dir():
            return path
    return candidates[0]


def shared_data(*parts: str) -> Path:
    """Path of a real data file under the shared data folder; skips the test if absent."""
    import pytest

    path = shared_data_root().joinpath(*parts)
    if not path.exists():
        pytest.skip(
            f"real data {path} is absent (set FEDKIT_SHARED_DATA to the shared data folder)"
        )
    return path


def tiny(**overrides: Any) -> dict[str, Any]:
    """A synthetic classification run of about a second: 3 sites, 4 classes, 2 rounds."""
    config: dict[str, Any] = {
        "task": {
            "name": "synthetic",
            "sites": 3,
            "num_classes": 4,
            "head_samples": 24,
            "imbalance": 4.0,
        },
        "rounds": 2,
        "batch_size": 16,
        "checkpoint": False,
    }
    return _merge(config, overrides)


def tiny_seg(**overrides: Any) -> dict[str, Any]:
    """A synthetic segmentation run of a few seconds: 3 sites, a small U-Net, 2 rounds."""
    config: dict[str, Any] = {
        "task": {"name": "synthetic-seg", "sites": 3, "train_per_site": 8, "image_size": 32},
        "unet_channels": [8, 16, 32],
        "rounds": 2,
        "batch_size": 4,
        "checkpoint": False,
    }
    return _merge(config, overrides)


def tiny_npz(
    folder: str | Path, n: int = 48, size: int = 28, channels: int = 1, seed: int = 0
) -> Path:
    """A MedMNIST-style ``tiny.npz`` in ``folder`` (train ``n``, val and test ``n // 3`` uint8
    images of ``size`` px, two classes told apart by brightness); its path."""
    import numpy as np

    rng = np.random.default_rng(seed)
    arrays = {}
    for split, count in (("train", n), ("val", n // 3), ("test", n // 3)):
        labels = np.arange(count) % 2
        shape = (count, size, size) + ((channels,) if channels == 3 else ())
        brighter = 100 * labels.reshape((-1,) + (1,) * (len(shape) - 1))
        arrays[f"{split}_images"] = (rng.integers(0, 120, size=shape) + brighter).astype(np.uint8)
        arrays[f"{split}_labels"] = labels.reshape(-1, 1)
    path = Path(folder) / "tiny.npz"
    np.savez(path, **arrays)
    return path


def tiny_pretrained(folder: str | Path, **overrides: Any) -> dict[str, Any]:
    """One round of the pretrained EfficientNet-Lite0 at 32 px on :func:`tiny_npz`, 2 clients:
    a method's smoke test with the backbone its paper fine-tunes (a few seconds)."""
    config: dict[str, Any] = {
        "task": {"name": "npz", "path": str(tiny_npz(folder)), "image_size": 32},
        "model": "efficientnet_lite0",
        "pretrained": True,
        "clients": 2,
        "rounds": 1,
        "batch_size": 8,
        "checkpoint": False,
    }
    return _merge(config, overrides)


def _merge(base: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = value
    return out


class InterruptAfter(Observer):
    """An observer that stops a run with ``KeyboardInterrupt`` once round ``round`` has
    ended (its checkpoint is written by then), as Ctrl-C would: for tests of
    ``fedkit resume``."""

    def __init__(self, round: int):
        self.round = round

    def on_round_end(self, record: dict[str, Any]) -> None:
        if record["round"] == self.round:
            raise KeyboardInterrupt
