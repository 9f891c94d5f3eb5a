"""A deployed message travels as one Flower record and comes back unchanged."""

import numpy as np
import pytest
import torch

pytest.importorskip("flwr")

from flwr.supercore.inflatable.inflatable_object import get_all_nested_objects  # noqa: E402

from fedkit_core.contract.messages import Message  # noqa: E402
from fedkit_core.engines.flower.packing import PACKED, pack, unpack  # noqa: E402
from fedkit_core.engines.flower.records import from_records, to_records  # noqa: E402


def test_packed_arrays_come_back_bitwise_with_their_scalars():
    rng = np.random.default_rng(0)
    arrays = {
        "conv.weight": torch.from_numpy(rng.standard_normal((8, 3, 3, 3)).astype(np.float32)),
        "bn.num_batches_tracked": torch.tensor(7),
        "mask": torch.tensor([True, False, True]),
        "empty": torch.zeros(0, 4, dtype=torch.float64),
        "half": torch.randn(5, dtype=torch.float16),
    }
    scalars = {"round": 3, "lr": 0.1, "steps": 1.0, "name": "x", "last": True}
    content = to_records(Message("fit", arrays, scalars))
    packed = pack(content)
    assert list(packed) == [PACKED]  # one record: a RecordDict and a ConfigRecord to send
    assert len(get_all_nested_objects(packed)) == 2 < len(get_all_nested_objects(content))
    back = from_records(unpack(packed), "fit")
    assert back.scalars == scalars
    assert {k: type(v) for k, v in back.scalars.items()} == {k: type(v) for k, v in scalars.items()}
    assert list(back.arrays) == list(arrays)
    for name, tensor in arrays.items():
        assert back.arrays[name].dtype == tensor.dtype and back.arrays[name].shape == tensor.shape
        assert torch.equal(back.arrays[name], tensor)
    assert unpack(content) is content  # unpacked content passes through
    failed = to_records(Message("fit", error="boom"))
    assert from_records(unpack(pack(failed)), "fit").error == "boom"
    bare = from_records(unpack(pack(to_records(Message("describe", scalars={"i": 2})))), "query")
    assert bare.arrays == {} and bare.scalars == {"i": 2}
