"""A deployed message's whole content in one Flower record instead of one object per tensor.

Flower 1.41 moves a message between ServerApp, SuperLink, SuperNode and ClientApp object by
object, one HTTP request per object (the message, its ``RecordDict``, each record, each
``Array`` and each of its chunks): a model of 20 tensors is about 45 requests at each of the
six hops of a message and its reply, and a request costs the SuperLink a few milliseconds of
CPU (its middleware stack, TLS, node authentication). Packed, a message is 3 objects (the
message, its ``RecordDict`` and one ``ConfigRecord``) whatever the model and its scalars.
The bytes are those of the tensors, unchanged, and every scalar keeps its type.

:func:`pack` puts the tensors of every ``ArrayRecord`` of a message's content (:mod:`.records`)
in one ``bytes`` value, with each tensor's record, name, dtype, shape and place in a JSON
header, and the items of its metric and config records under ``RECORD/KEY``, all in one
``ConfigRecord`` (:data:`PACKED`); :func:`unpack` restores the content, and leaves unpacked
content as it is, so the receiving end needs no setting.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, MetricRecord, RecordDict

#: the one record of a packed message
PACKED = "fedkit.packed"
HEADER, BLOB = "fedkit.header", "fedkit.blob"
#: the kinds of record a packed message restores
RECORDS: dict[str, type[Any]] = {
    "arrays": ArrayRecord,
    "metrics": MetricRecord,
    "config": ConfigRecord,
}


def pack(content: RecordDict) -> RecordDict:
    """``content`` as one ``ConfigRecord``: tensors in one byte string, scalars as they are."""
    records: list[list[str]] = []
    tensors: list[list[Any]] = []
    parts: list[bytes] = []
    values: dict[str, Any] = {}
    offset = 0
    for record_name, record in content.items():
        kind = next(k for k, cls in RECORDS.items() if isinstance(record, cls))
        records.append([record_name, kind])
        if kind == "arrays":
            for name, array in record.items():
                data = np.asarray(array.numpy(), order="C")  # (ascontiguousarray makes 0-d 1-d)
                tensors.append([record_name, name, data.dtype.str, list(data.shape), offset])
                parts.append(data.tobytes())
                offset += data.nbytes
        else:
            values.update({f"{record_name}/{key}": value for key, value in record.items()})
    header = json.dumps({"records": records, "tensors": tensors})
    return RecordDict({PACKED: ConfigRecord({HEADER: header, BLOB: b"".join(parts), **values})})


def unpack(content: RecordDict) -> RecordDict:
    """``content`` as :func:`pack` found it (unpacked content: unchanged)."""
    if PACKED not in content.config_records:
        return content
    packed = content.config_records[PACKED]
    header = json.loads(str(packed[HEADER]))
    blob = bytes(packed[BLOB])  # type: ignore[arg-type]
    arrays: dict[str, dict[str, Array]] = {}
    for record_name, name, dtype, shape, offset in header["tensors"]:
        count = int(np.prod(shape, dtype=np.int64))
        values = np.frombuffer(blob, dtype=np.dtype(dtype), count=count, offset=offset)
        arrays.setdefault(record_name, {})[name] = Array(values.reshape(tuple(shape)))
    restored = RecordDict()
    for record_name, kind in header["records"]:
        if kind == "arrays":
            restored[record_name] = ArrayRecord(arrays.get(record_name, {}))
        else:
            prefix = f"{record_name}/"
            items = {k[len(prefix) :]: v for k, v in packed.items() if k.startswith(prefix)}
            restored[record_name] = RECORDS[kind](items)
    return restored
