"""Throwaway plugins that watch what crosses the wire and what clients hold (test helpers)."""

from __future__ import annotations

import torch

from fedkit_core.plugin import hookimpl


def snapshot(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().cpu().clone() for k, v in module.state_dict().items()}


def same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


class Uploads:
    """Records the arrays every update carries (keys and values) and defers to the
    aggregator in charge."""

    def __init__(self) -> None:
        self.updates: list[dict[str, dict[str, torch.Tensor]]] = []

    @hookimpl
    def fedkit_aggregate(self, server, updates, ask):
        self.updates.append({u.client_id: dict(u.arrays) for u in updates})
        return None


class Watch:
    """Records a client's model (or a part) at round start and after training, per round."""

    def __init__(self, part: str | None = None) -> None:
        self.part = part
        self.start: dict[tuple[str, int], dict[str, torch.Tensor]] = {}
        self.end: dict[tuple[str, int], dict[str, torch.Tensor]] = {}

    def _state(self, client) -> dict[str, torch.Tensor]:
        module = client.model if self.part is None else client.model.get_submodule(self.part)
        return snapshot(module)

    @hookimpl
    def fedkit_round_start(self, client):
        self.start[(client.id, client.round)] = self._state(client)

    @hookimpl
    def fedkit_client_report(self, client):
        self.end[(client.id, client.round)] = self._state(client)
