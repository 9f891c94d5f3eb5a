"""How a run uses its device: precision, memory layout, and where client data live.

The config keys ``precision``, ``channels_last`` and ``data_on_device`` (issue 16). Their
defaults (``fp32``, ``false``, ``auto``) leave a CPU run exactly as it was: every function
here is then the operation it replaces (``data_on_device`` only acts on a GPU).

* ``precision=bf16``: forward passes run under :func:`torch.autocast` in bfloat16 on the
  device's type and hand out float32 outputs, so losses, softmax and metrics are float32
  (:func:`autocast_forward`). Weights, gradients and optimiser state stay float32.
* ``channels_last``: the model and 4-D image batches in ``torch.channels_last`` layout
  (:func:`place_model`, :func:`input_layout`); uploaded states stay contiguous.
* ``data_on_device``: on a GPU, clients' splits held on the device once, so batches are
  indexed there (:class:`DataPlacement`); otherwise batches are gathered into pinned host
  memory and copied asynchronously (:func:`gather`, :func:`joined`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace
from typing import Any, TypeVar

import torch

from fedkit_core.contract.data import ClientData, Split

#: the most bytes of client data ``data_on_device=auto`` holds on a GPU (and never more than
#: a quarter of the GPU's free memory when the first client is placed): small data sets
#: (MedMNIST at 28-224 px, uint8) fit; large ones stay in host memory
DEVICE_DATA_BYTES = 2**30

T = TypeVar("T")


def autocast_forward(
    fn: Callable[[torch.Tensor], T], x: torch.Tensor, precision: str, device: torch.device
) -> T:
    """``fn(x)`` in the run's ``precision``: ``fp32`` calls it as is; ``bf16`` calls it
    under autocast on ``device``'s type and returns its floating outputs as float32."""
    if precision == "fp32":
        return fn(x)
    with torch.autocast(device.type, dtype=torch.bfloat16):
        out = fn(x)
    return as_float32(out)


def as_float32(out: Any) -> Any:
    """``out`` (a tensor, or dicts, lists and tuples of them) with floating tensors float32."""
    if isinstance(out, torch.Tensor):
        return out.float() if out.is_floating_point() else out
    if isinstance(out, Mapping):
        return {k: as_float32(v) for k, v in out.items()}
    if type(out) in (list, tuple):
        return type(out)(as_float32(v) for v in out)
    return out


def place_model(model: torch.nn.Module, device: torch.device, channels_last: bool) -> Any:
    """``model`` on ``device``, its 4-D weights channels-last when asked."""
    model = model.to(device)
    return model.to(memory_format=torch.channels_last) if channels_last else model


def input_layout(x: torch.Tensor, channels_last: bool) -> torch.Tensor:
    """A batch of images in the run's layout: 4-D batches channels-last when asked."""
    if channels_last and x.dim() == 4:
        return x.contiguous(memory_format=torch.channels_last)
    return x


def gather(t: torch.Tensor, index: torch.Tensor, device: torch.device) -> torch.Tensor:
    """``t[index]`` on ``device``: indexed where ``t`` lives; rows of a host tensor bound for
    a GPU are gathered into pinned memory, so that their copy runs asynchronously."""
    if t.device.type == "cpu" and device.type == "cuda":
        out = torch.empty((len(index), *t.shape[1:]), dtype=t.dtype, pin_memory=True)
        return torch.index_select(t, 0, index, out=out).to(device, non_blocking=True)
    return t[index.to(t.device)].to(device, non_blocking=True)


def joined(parts: list[torch.Tensor], device: torch.device) -> torch.Tensor:
    """``torch.cat(parts)`` on ``device``; host parts bound for a GPU are joined in pinned
    memory and copied asynchronously."""
    if device.type == "cuda" and all(p.device.type == "cpu" for p in parts):
        rows = sum(len(p) for p in parts)
        out = torch.empty((rows, *parts[0].shape[1:]), dtype=parts[0].dtype, pin_memory=True)
        return torch.cat(parts, out=out).to(device, non_blocking=True)
    return torch.cat([p.to(device, non_blocking=True) for p in parts])


class DataPlacement:
    """Which clients of a process hold their splits on the GPU, and the device copies.

    Clients' splits are views of shared host tensors (:meth:`Split.subsets`); the device
    copy is made per stored range, not per view: a range already on the device (another
    client's views of the same gathered copy, a split shared by clients) is reused, so the
    process holds about one device copy of the data, whatever the number of clients.
    ``setting``: ``true`` places every client, ``false`` none, ``auto`` clients while the
    placed bytes stay under :data:`DEVICE_DATA_BYTES` and a quarter of the free GPU memory.
    On a CPU device nothing is placed.
    """

    def __init__(self, device: torch.device, setting: str):
        self.device, self.setting = device, setting
        #: whether clients are placed at all (a test sets it on a CPU to exercise the copies)
        self.active = device.type == "cuda" and setting != "false"
        #: host storage address -> placed ranges (first byte, end byte, device bytes)
        self.copies: dict[int, list[tuple[int, int, torch.Tensor]]] = {}
        self.bytes = 0
        self._cap: int | None = None

    def place(self, data: ClientData) -> ClientData:
        """``data`` with its splits on the device, or ``data`` itself when it stays put."""
        if not self.active:
            return data
        tensors = [t for s in data.splits.values() for t in (s.images, s.targets)]
        wanted = _ranges(t for t in tensors if t.device.type == "cpu" and t.numel())
        missing = {k: r for k, r in wanted.items() if self._copy(k, r[0], r[1]) is None}
        new = sum(hi - lo for lo, hi, _ in missing.values())
        if self.setting == "auto" and self.bytes + new > self.cap():
            return data
        for key, (lo, hi, storage) in missing.items():
            source = torch.empty(0, dtype=torch.uint8).set_(storage, lo, (hi - lo,))
            self.copies.setdefault(key, []).append((lo, hi, source.to(self.device, copy=True)))
            self.bytes += hi - lo
        splits = {
            name: Split(self._moved(s.images), self._moved(s.targets))
            for name, s in data.splits.items()
        }
        return replace(data, splits=splits)

    def cap(self) -> int:
        """The bytes ``auto`` may place (fixed when first asked)."""
        if self._cap is None:
            free, _ = torch.cuda.mem_get_info(self.device)
            self._cap = min(DEVICE_DATA_BYTES, free // 4)
        return self._cap

    def _copy(self, key: int, lo: int, hi: int) -> tuple[int, torch.Tensor] | None:
        """The placed copy holding bytes ``lo:hi`` of storage ``key``: (its first byte, it)."""
        for start, end, copy in self.copies.get(key, ()):
            if start <= lo and hi <= end:
                return start, copy
        return None

    def _moved(self, t: torch.Tensor) -> torch.Tensor:
        """``t`` as the same view of the device copy of its storage."""
        if t.device.type != "cpu" or not t.numel():
            return t.to(self.device, copy=True)
        key = t.untyped_storage().data_ptr()
        lo, hi = _extent(t)
        start, copy = self._copy(key, lo, hi)
        offset = (t.storage_offset() * t.element_size() - start) // t.element_size()
        out = torch.empty(0, dtype=t.dtype, device=self.device)
        return out.set_(copy.untyped_storage(), offset, t.shape, t.stride())


def _extent(t: torch.Tensor) -> tuple[int, int]:
    """The bytes of its storage a non-empty tensor (non-negative strides) spans."""
    first = t.storage_offset()
    last = first + sum((n - 1) * s for n, s in zip(t.shape, t.stride()))
    return first * t.element_size(), (last + 1) * t.element_size()


def _ranges(
    tensors: Iterable[torch.Tensor],
) -> dict[int, tuple[int, int, torch.UntypedStorage]]:
    """Per host storage address: the byte range its tensors span (the start aligned to 16
    bytes, so every tensor's offset into the copy is a whole number of its elements) and
    the storage."""
    out: dict[int, tuple[int, int, torch.UntypedStorage]] = {}
    for t in tensors:
        storage, (lo, hi) = t.untyped_storage(), _extent(t)
        key, lo = storage.data_ptr(), lo - lo % 16
        if key in out:
            lo, hi = min(lo, out[key][0]), max(hi, out[key][1])
        out[key] = (lo, hi, storage)
    return out
