"""Where a private run's privacy-relevant random numbers come from.

The noise of DP (the server's Gaussian noise at client level, the adaptive count's noise,
DP-SGD's noise on each client) and the sampling the accountant amplifies on (Poisson or
fixed-size client sampling at client level, DP-SGD's Poisson batches) must be unknown to
whoever reads the run's files: noise regenerated from a recorded seed can be subtracted,
and the reported epsilon would then promise nothing. Each generator here is therefore
seeded afresh from the operating system's CSPRNG (:mod:`secrets`, i.e. ``os.urandom``);
the seed lives only in memory, in the generator of one draw, and no file, checkpoint or
message records it. Everything else in a run (initialisation, shuffling, augmentation, the
clients' order) stays a function of the run's ``seed``.

``dp.reproducible_noise=true`` (for tests that need DP runs to be exact) draws from the
run's seed instead, as fedkit did before: such a run is **not private** and says so in
results.json (``final.privacy.noise``) and on the console.
"""

from __future__ import annotations

import secrets

import numpy as np
import torch

from fedkit_core.config import Config
from fedkit_core.hooks.context import derive_seed

#: ``final.privacy.noise`` of a run whose noise no file records
SECRET = (
    "secret: every DP noise draw and the DP sampling are seeded from os.urandom in memory "
    "only; no file of the run records them"
)
#: ``final.privacy.noise`` (and the console's warning) under dp.reproducible_noise=true
NOT_PRIVATE = (
    "NOT PRIVATE: dp.reproducible_noise=true draws the DP noise and sampling from the run's "
    "seed (recorded in config.yaml and results.json), so whoever reads the run's files can "
    "regenerate the noise and remove it; the epsilon reported promises nothing (tests only)"
)


def reproducible(config: Config) -> bool:
    """Whether the run's DP randomness comes from its seed (not private; tests only)."""
    return bool(config["dp.reproducible_noise"])


def describe(config: Config) -> str:
    """What ``final.privacy.noise`` says about the run's DP randomness."""
    return NOT_PRIVATE if reproducible(config) else SECRET


def seed(config: Config, *parts: object) -> int:
    """A 64-bit seed for one privacy-relevant generator: fresh from the OS's CSPRNG, never
    stored; from ``(seed, *parts)`` under ``dp.reproducible_noise``."""
    if reproducible(config):
        return derive_seed(config["seed"], *parts)
    return secrets.randbits(64)


def torch_generator(
    config: Config, *parts: object, device: torch.device | str = "cpu"
) -> torch.Generator:
    """A torch generator for DP noise (see :func:`seed`)."""
    return torch.Generator(device=device).manual_seed(seed(config, *parts))


def numpy_rng(config: Config, *parts: object) -> np.random.Generator:
    """A numpy generator for DP sampling: 128 bits of OS entropy (see :func:`seed`)."""
    if reproducible(config):
        return np.random.default_rng(derive_seed(config["seed"], *parts))
    return np.random.default_rng(secrets.randbits(128))
