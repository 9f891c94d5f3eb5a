"""Per-client data held in memory (``register_clients``) run through ``fedkit_core.run``."""

import numpy as np
import pytest
import torch
from torch.utils.data import TensorDataset

import fedkit_core
from fedkit_core.errors import FedkitError
from fedkit_core.tasks import fakes
from fedkit_core.tasks.memory import register_clients


def arrays(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """``n`` grey 8x8 images whose grey level encodes their label (0 or 1), labels (N, 1)."""
    rng = np.random.default_rng(seed)
    labels = np.arange(n) % 2
    return np.stack([fakes.class_image(rng, int(y), (8, 8)) for y in labels]), labels[:, None]


def test_numpy_arrays_and_a_dataset_run_as_the_clients():
    x, y = arrays(12, 2)
    dataset = TensorDataset(torch.from_numpy(x)[:, None], torch.from_numpy(y[:, 0]))
    register_clients(
        "memory-test",
        {"north": {"train": arrays(20, 0), "test": arrays(6, 1)}, "south": {"train": dataset}},
        class_names=["healthy", "sick"],
    )
    config = {"task": "memory-test", "rounds": 1, "batch_size": 8, "checkpoint": False}
    results = fedkit_core.run(config)
    assert results["task"]["client_ids"] == ["north", "south"]
    assert results["task"]["class_names"] == ["healthy", "sick"]
    assert results["task"]["in_channels"] == 1
    assert set(results.final["clients"]) == {"north", "south"}
    again = fedkit_core.run({**config, "task": {"name": "memory-test", "image_size": 6}})
    assert again["task"]["image_shape"] == [6, 6]  # each run loads the data afresh


def test_bad_client_data_is_a_user_error():
    x, y = arrays(4, 0)
    with pytest.raises(FedkitError, match=r"client 'a', split 'train': 4 images but 3"):
        register_clients("memory-bad", {"a": {"train": (x, y[:3])}})
    with pytest.raises(FedkitError, match="labels must be integers"):
        register_clients("memory-bad", {"a": {"train": (x, y[:, 0] + 0.5)}})
    with pytest.raises(FedkitError, match="expected .images, labels. or a dataset"):
        register_clients("memory-bad", {"a": {"train": 3}})
