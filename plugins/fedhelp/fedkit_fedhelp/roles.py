"""Which clients are large, decided without telling any client another's size.

Three ways, exactly one per run:

* ``large_clients`` (ids): known at setup.
* ``large_min_size``: each client compares its own training size with the threshold at
  setup; nothing about sizes leaves any client.
* ``num_large`` (the N largest): ranking needs every size in one place. The server keeps the
  ``num_examples`` each client reports with its first update (the figure FedAvg already
  weights by) and, once it has every client's, sends each client one boolean, its own role,
  with every later fit message. Until then (the first round) every client trains as a small
  one; a client whose role turns large starts training its large model in the next round.

Clients whose role can change (``num_large``) carry the large model from setup, switched off
by a buffer ``on`` (kept in the private state, so a resumed run keeps the role).
"""

from __future__ import annotations

import torch
from torch import nn

from fedkit_core.plugin import FedkitError, Payload

LARGE = "fedhelp_large"
#: the fit-message scalar carrying a client's own role (``num_large`` only)
ROLE = "fedhelp.large"


class Gated(nn.Module):
    """The large private model (a FedModel used as image -> logits), run only while ``on``."""

    def __init__(self, model: nn.Module, on: bool):
        super().__init__()
        self.model = model
        self.register_buffer("on", torch.tensor(on))

    def forward(self, x: torch.Tensor) -> torch.Tensor | None:
        return self.model(x)["logits"] if bool(self.on) else None


def check(opts: dict) -> list[str]:
    """Exactly one of the three ways must be given."""
    given = [k for k in ("large_clients", "num_large", "large_min_size") if opts[k]]
    if len(given) != 1:
        return [
            "fedhelp needs exactly one of fedhelp.large_clients, fedhelp.num_large or "
            f"fedhelp.large_min_size (given: {', '.join(given) or 'none'})"
        ]
    return []


def known_at_setup(ctx) -> bool | None:
    """The client's role at setup from its own id or size; ``None`` while the server has
    not ranked the sizes (``num_large``)."""
    opts = ctx.options()
    if opts["large_clients"]:
        return ctx.id in opts["large_clients"]
    if opts["large_min_size"]:
        return ctx.info.num_train >= opts["large_min_size"]
    return None


def is_large(client) -> bool:
    """The client's current role: whether its large model is switched on."""
    extras = client.model.extras
    return LARGE in extras and bool(extras[LARGE].on)


def receive(client) -> None:
    """Switch the large model on or off as this round's fit message says (``num_large``)."""
    role = client.received.scalars.get(ROLE)
    if role is not None and LARGE in client.model.extras:
        client.model.extras[LARGE].on.fill_(bool(role))


def record_sizes(server, updates) -> None:
    """Keep each client's reported ``num_examples`` (``num_large`` only)."""
    if server.options()["num_large"]:
        sizes = server.state.setdefault("sizes", {})
        sizes.update({u.client_id: u.num_examples for u in updates})


def role_payload(server, client_id: str) -> Payload | None:
    """The client's own role, once the server has every client's size (``num_large``)."""
    count = server.options()["num_large"]
    sizes = server.state.get("sizes", {})
    if not count or set(sizes) != set(server.task.client_ids):
        return None
    ranked = sorted(sizes, key=lambda cid: (-sizes[cid], server.task.client_ids.index(cid)))
    return Payload(scalars={ROLE: client_id in ranked[:count]})


def check_ids(server) -> None:
    """Refuse unknown ids in ``large_clients`` and a ``num_large`` not below the clients."""
    opts, ids = server.options(), server.task.client_ids
    unknown = sorted(set(opts["large_clients"]) - set(ids))
    if unknown:
        raise FedkitError(
            f"fedhelp.large_clients names unknown clients {unknown}; the clients are {ids}"
        )
    if opts["num_large"] >= len(ids):
        raise FedkitError(
            f"fedhelp.num_large={opts['num_large']} leaves no small client among {len(ids)}"
        )
