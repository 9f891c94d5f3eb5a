"""A deployed message's arrays travel as one Flower Array and come back unchanged."""

import numpy as np
import pytest
import torch

pytest.importorskip("flwr")

from flwr.supercore.inflatable.inflatable_object import get_all_nested_objects  # noqa: E402

from fedkit_core.engines.flower.packing import PACKED, pack, unpack  # noqa: E402
from fedkit_core.engines.flower.records import from_records, to_records  # noqa: E402
from fedkit_core.messages import Message  # noqa: E402


def test_packed_arrays_come_back_bitwise_with_their_scalars():
    rng = np.random.default_rng(0)
    arrays = {
        "conv.weight": torch.from_numpy(rng.standard_normal((8, 3, 3, 3)).astype(np.float32)),
        "bn.num_batches_tracked": torch.tensor(7),
        "mask": torch.tensor([True, False, True]),
        "empty": torch.zeros(0, 4, dtype=torch.float64),
        "half": torch.randn(5, dtype=torch.float16),
    }
    content = to_records(Message("fit", arrays, {"round": 3, "lr": 0.1, "name": "x"}))
    packed = pack(content)
    assert PACKED in packed.config_records and len(packed.array_records["arrays"]) == 1
    assert len(get_all_nested_objects(packed)) < len(get_all_nested_objects(content))
    back = from_records(unpack(packed), "fit")
    assert back.scalars == {"round": 3, "lr": 0.1, "name": "x"}
    assert list(back.arrays) == list(arrays)
    for name, tensor in arrays.items():
        assert back.arrays[name].dtype == tensor.dtype and back.arrays[name].shape == tensor.shape
        assert torch.equal(back.arrays[name], tensor)
    assert unpack(content) is content  # unpacked content passes through
    failed = to_records(Message("fit", error="boom"))
    assert from_records(unpack(pack(failed)), "fit").error == "boom"
