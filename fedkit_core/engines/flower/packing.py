"""One Flower ``Array`` per deployed message instead of one per tensor.

Flower 1.41 moves a message between ServerApp, SuperLink, SuperNode and ClientApp object by
object, one HTTP request per object (a ``RecordDict``, each record, each ``Array`` and each
of its chunks): a model of 20 tensors is about 45 requests at each of the six hops of a
message and its reply, and a request costs the SuperLink a few milliseconds of CPU (its
middleware stack, TLS, node authentication). Packed, a message is 7 objects whatever the
model. The bytes are those of the tensors, unchanged.

:func:`pack` turns the ``arrays`` record of a fedkit message (:mod:`.records`) into one
``uint8`` array and records each tensor's name, dtype, shape and place in a ``ConfigRecord``
(:data:`PACKED`); :func:`unpack` restores the record, and leaves unpacked content as it is,
so the receiving end needs no setting.
"""

from __future__ import annotations

import json

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, RecordDict

#: the record (in a packed message) that lists the packed tensors
PACKED = "fedkit.packed"
ARRAYS, BLOB = "arrays", "blob"


def pack(content: RecordDict) -> RecordDict:
    """``content`` with all arrays of its ``arrays`` record in one ``Array``."""
    record = content.array_records.get(ARRAYS)
    if not record:
        return content
    header, parts, offset = [], [], 0
    for name, array in record.items():
        values = np.asarray(array.numpy(), order="C")  # (ascontiguousarray makes 0-d 1-d)
        header.append([name, values.dtype.str, list(values.shape), offset])
        parts.append(values.reshape(-1).view(np.uint8))
        offset += values.nbytes
    packed = RecordDict(dict(content.items()))
    packed[ARRAYS] = ArrayRecord({BLOB: Array(np.concatenate(parts))})
    packed[PACKED] = ConfigRecord({"header": json.dumps(header)})
    return packed


def unpack(content: RecordDict) -> RecordDict:
    """``content`` with its ``arrays`` record as :func:`pack` found it (unpacked content:
    unchanged)."""
    if PACKED not in content.config_records:
        return content
    header = json.loads(str(content.config_records[PACKED]["header"]))
    blob = content.array_records[ARRAYS][BLOB].numpy()
    arrays = {}
    for name, dtype, shape, offset in header:
        kind = np.dtype(dtype)
        count = int(np.prod(shape, dtype=np.int64))
        values = np.frombuffer(blob, dtype=kind, count=count, offset=offset)
        arrays[name] = Array(values.reshape(tuple(shape)))
    unpacked = RecordDict({k: v for k, v in content.items() if k != PACKED})
    unpacked[ARRAYS] = ArrayRecord(arrays)
    return unpacked
