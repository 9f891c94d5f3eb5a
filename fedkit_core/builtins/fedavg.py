"""FedAvg (McMahan et al. 2017): the global state is the sample-weighted mean of the updates."""

from __future__ import annotations

from fedkit_core.aggregation import weighted_average
from fedkit_core.hooks.hookspecs import hookimpl


@hookimpl(trylast=True)
def fedkit_aggregate(server, updates, ask):
    """Average every shared entry, weighted by each client's ``num_examples``."""
    return weighted_average([u.arrays for u in updates], [u.num_examples for u in updates])
