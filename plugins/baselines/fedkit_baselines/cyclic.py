"""Cyclic weight transfer: the model visits the clients one after another.

Chang, Balachandar, Lam, Yi, Brown, Beers, Rosen, Rubin, Kalpathy-Cramer. "Distributed deep
learning networks among institutions for medical imaging." JAMIA 25(8), 2018 (PMID 29617797);
FLamby's ``Cyclic`` strategy (Ogier du Terrail et al., NeurIPS 2022 Datasets and Benchmarks).

Each round one client trains the global model for ``local_epochs`` and its model becomes the
next global model (the built-in aggregation of a single update). The clients take turns in
cycles: in a fixed order (their ids; FLamby's ``deterministic_cycle=True``) or, by default, in
a new random order for each cycle (FLamby's default), drawn from the seed and the cycle, so
a resumed run takes the same turns. A run of ``R`` rounds trains ``R`` client turns, as in
FLamby (which gives Cyclic as many rounds as FedAvg, each with one client). Works on any
task; ``sample_fraction`` does not apply.
"""

from __future__ import annotations

import numpy as np

from fedkit_core.plugin import Option, derive_seed, hookimpl

fedkit_api = 2
#: batch.x reaches only the model: the frozen-trunk cache may hand it the trunk's outputs
fedkit_frozen_cache = True


@hookimpl
def fedkit_options():
    return [
        Option(
            "order",
            str,
            "shuffled",
            "the clients' order in each cycle: shuffled (a new random order per cycle, "
            "FLamby's default) or fixed (client id order)",
            choices=("shuffled", "fixed"),
        )
    ]


@hookimpl
def fedkit_check(server):
    if server.config["sample_fraction"] != 1.0:
        return (
            "cyclic trains one client per round, in turns; sample_fraction="
            f"{server.config['sample_fraction']} does not apply (leave it at 1.0)"
        )
    return None


def turn(clients: list[str], round: int, seed: int, order: str) -> str:
    """The client whose turn round ``round`` (1-based) is."""
    cycle, position = divmod(round - 1, len(clients))
    if order == "fixed":
        return clients[position]
    rng = np.random.default_rng(derive_seed(seed, "cyclic", cycle))
    return clients[int(rng.permutation(len(clients))[position])]


@hookimpl
def fedkit_select_clients(server, clients):
    return [turn(list(clients), server.round, server.config["seed"], server.options()["order"])]
