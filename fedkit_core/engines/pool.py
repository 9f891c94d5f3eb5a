"""Lazy clients (``local.live_models``, opt-in): a client of a plugin run builds its model on
the first message that needs it, and at most ``size`` clients of a process hold a live
model; the others idle as their snapshot (:func:`~fedkit_core.engines.snapshot.client_snapshot`,
the very state a checkpoint holds), so that a thousand clients are not a thousand models.

A client taking a model back builds it afresh, seeded as at set-up
(``derive_seed(seed, "model", id)``, inside :func:`torch.random.fork_rng` so that no other
random stream sees the build), and restores its snapshot: what ``fedkit resume`` does for
every client, so the results are those of clients that keep their models, under the rules
resume already needs (the model's state is its ``state_dict``; plugin state holds tensors
and plain values) and two more, checked where they can be:

* plugin state (``ctx.state``, ``ctx.scratch``) never holds the model's own tensors or
  modules, only copies (checked when a client goes idle: a :class:`FedkitError` names the
  entry); plugins keep no other reference to a client's model (not checkable);
* ``fedkit_client_priors`` does not draw from torch's global random stream (the set-up no
  longer builds each client's model between two clients' priors).

What else is kept of an idle model: each module's train/eval mode (which parameters train,
``requires_grad``, is in every snapshot: a kept optimiser is rebuilt on them; a client whose
rebuilt optimiser would hold other parameters than its old one is refused with a FedkitError).
Gradients are not (each fit clears them before its first backward pass, as after a resume). Identical shared
entries of idle clients (every client after an evaluation holds the global model) are
stored once.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any, Protocol

import numpy as np
import torch

from fedkit_core.engines.snapshot import Stateful, client_snapshot, restore_client
from fedkit_core.errors import FedkitError
from fedkit_core.models.fedmodel import FedModel


class Pooled(Stateful, Protocol):
    """A client of the pool (a :class:`~fedkit_core.engines.client.ClientRuntime`), typed
    here so that the pool does not import the client that uses it."""

    dirty: bool

    @property
    def id(self) -> str: ...

    def new_model(self) -> FedModel: ...


class ModelPool:
    """The clients of one process that hold a live model (at most ``size``, the least
    recently used goes idle first) and the idle clients' snapshots."""

    def __init__(self, size: int):
        self.size = size
        self.live: OrderedDict[str, Pooled] = OrderedDict()
        self.idle: dict[str, dict[str, Any]] = {}
        #: the shared entries of the client that went idle last (reused when identical)
        self._shared: dict[str, torch.Tensor] = {}

    def take(self, client: Pooled) -> None:
        """Give ``client`` its live model: built (and its idle state restored) unless it
        holds one; another client goes idle when the pool is full."""
        if client.ctx.model is not None:
            if client.id in self.live:
                self.live.move_to_end(client.id)
            return
        while len(self.live) >= self.size:
            cid = next(iter(self.live))
            self._park(self.live[cid])
            del self.live[cid]
        self._build(client)
        self.live[client.id] = client

    def drop(self, client: Pooled) -> None:
        """Forget ``client``'s model and idle state (it is set up again)."""
        self.live.pop(client.id, None)
        self.idle.pop(client.id, None)
        client.ctx.model = None
        client.optimizer = None

    def _build(self, client: Pooled) -> None:
        device = client.ctx.device
        with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
            client.ctx.model = client.new_model()
        idle = self.idle.get(client.id)
        if idle is None:
            return
        model, dirty = client.ctx.model, client.dirty
        try:
            restore_client(client, idle["snapshot"])  # trainable parameters, then optimiser
            if _optimised(client) != idle["optimised"]:
                raise FedkitError(
                    f"client {client.id!r}: its optimiser, rebuilt when the client was used "
                    "again, does not hold the parameters of the one it had (a plugin changes "
                    "which parameters train between rounds); leave local.live_models unset"
                )
        except BaseException:
            client.ctx.model, client.optimizer = None, None
            raise
        client.dirty = dirty  # restoring what went idle is no state change
        for name, module in model.named_modules():
            module.training = idle["training"][name]
        del self.idle[client.id]

    def _park(self, client: Pooled) -> None:
        """Replace ``client``'s live model by its snapshot."""
        _check_plugin_state(client)
        model, dirty = client.ctx.model, client.dirty
        snapshot = client_snapshot(client)
        client.dirty = dirty  # going idle is no checkpoint
        snapshot["shared"] = self._same_shared(snapshot["shared"])
        self.idle[client.id] = {
            "snapshot": snapshot,
            "training": {name: module.training for name, module in model.named_modules()},
            "optimised": _optimised(client),
        }
        client.ctx.model, client.optimizer = None, None

    def _same_shared(self, shared: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """``shared``, or the last idle client's entries when they are bit for bit equal."""
        last = self._shared
        if last.keys() == shared.keys() and all(_same_bits(last[k], v) for k, v in shared.items()):
            return last
        self._shared = shared
        return shared


def _optimised(client: Pooled) -> list[list[str]] | None:
    """The names of the parameters of each group of ``client``'s optimiser (None: none)."""
    if client.optimizer is None:
        return None
    names = {id(p): name for name, p in client.ctx.model.named_parameters()}
    return [[names[id(p)] for p in group["params"]] for group in client.optimizer.param_groups]


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.dtype != b.dtype or a.shape != b.shape or a.device != b.device:
        return False
    return torch.equal(a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8))


#: values of plugin state that cannot hold a model's tensors
_PLAIN = (str, bytes, int, float, complex, bool, type(None), np.ndarray, np.generic)
_PLAIN += (torch.dtype, torch.device, torch.Generator)


def _check_plugin_state(client: Pooled) -> None:
    """Refuse to idle ``client`` when its plugin state holds its model's tensors or modules
    (they would go on living apart from the model rebuilt later) or values that cannot be
    looked into."""
    model, optimizer = client.ctx.model, client.optimizer
    tensors = [*model.parameters(), *model.buffers()]
    tensors += [p.grad for p in model.parameters() if p.grad is not None]
    if optimizer is not None:
        state = optimizer.state.values()
        tensors += [v for s in state for v in s.values() if isinstance(v, torch.Tensor)]
    owned = {_storage(t) for t in tensors} - {0}
    for part, values in (("state", client.ctx.states), ("scratch", client.ctx.scratches)):
        for plugin, value in values.items():
            bad = _held(value, owned, f"{part}[{plugin!r}]")
            if bad:
                raise FedkitError(
                    f"client {client.id!r}: the plugin {plugin!r} keeps {bad} in its "
                    f"ctx.{part}, which local.live_models cannot idle (a client's model is "
                    "rebuilt when it is used again): keep copies of tensors "
                    "(.detach().clone()) and plain values there, or leave local.live_models "
                    "unset"
                )


def _held(value: Any, owned: set[int], where: str) -> str | None:
    """What in ``value`` (at ``where``) is a model's tensor or module, or cannot be looked
    into; None when nothing."""
    if isinstance(value, torch.nn.Module):
        return f"a module at {where}"
    if isinstance(value, torch.Tensor):
        return f"a tensor of the model at {where}" if _storage(value) in owned else None
    if isinstance(value, dict):
        items = value.items()
    elif isinstance(value, list | tuple | set | frozenset):
        items = enumerate(value)
    elif isinstance(value, _PLAIN):
        return None
    else:
        return f"a {type(value).__name__} at {where}"
    for key, item in items:
        found = _held(item, owned, f"{where}[{key!r}]")
        if found:
            return found
    return None


def _storage(tensor: torch.Tensor) -> int:
    return tensor.untyped_storage().data_ptr()
