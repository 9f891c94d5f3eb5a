"""A tiny knowledge file for the federation tests (random public images and API answers)."""

import numpy as np
import pytest
from fedkit_priors import Knowledge, save_knowledge


@pytest.fixture
def knowledge_file(tmp_path):
    rng = np.random.default_rng(0)
    probs = rng.dirichlet(np.ones(5), size=(12, 2)).astype(np.float32)
    labels = np.array([0, 1, 2, 3, 4, -1] * 2)
    images = rng.integers(0, 256, size=(12, 20, 20, 3), dtype=np.uint8)
    path = tmp_path / "knowledge.npz"
    save_knowledge(Knowledge(images, probs, labels, ["a", "b"], list("vwxyz")), path)
    return path
