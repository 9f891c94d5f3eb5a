"""Who trains each round: the selection rules, chosen by the ``selection`` key.

A selection rule is a function ``rule(server, clients) -> client ids`` (``server`` a
:class:`~fedkit_core.hooks.context.ServerContext` whose ``round`` is set; ``clients``
every client id of the task). The built-in ``sample`` rule is a method plugin's choice
(``fedkit_select_clients``, e.g. Cyclic's turns) or else ``sample_fraction`` of the
clients drawn from the seed and the round. A plugin adds rules with the hook
``fedkit_register_selection_rules(register)``; the choice must follow from the seed, the
round and ``server.state`` alone, so that a resumed run chooses as the uninterrupted one.
Differential privacy wraps the rule (:mod:`fedkit_core.privacy.rounds`): a secret sample
replaces it where the accountant amplifies on the sampling.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from fedkit_core.contract.options import Option
from fedkit_core.errors import FedkitError, unknown
from fedkit_core.hooks.context import ServerContext, derive_seed

#: a selection rule: the ids that train this round, from every client id of the task
SelectionRule = Callable[[ServerContext, Sequence[str]], Sequence[str]]

#: the built-in rule's name (the default of ``selection``)
SAMPLE = "sample"

SELECTION_OPTIONS = (
    Option(
        "selection",
        str,
        SAMPLE,
        "who trains each round: sample (a method plugin's choice, fedkit_select_clients, "
        "else sample_fraction of the clients drawn from the seed), or a rule a plugin "
        "registers (fedkit_register_selection_rules)",
    ),
)


def round_half_up(x: float) -> int:
    return int(math.floor(x + 0.5))


def cohort_size(clients: int, fraction: float) -> int:
    """How many of ``clients`` a round samples: ``max(1, round(fraction * clients))``."""
    return min(clients, max(1, int(round_half_up(fraction * clients))))


def sample_clients(ids: Sequence[str], fraction: float, seed: int, round: int) -> list[str]:
    """A deterministic sample of ``max(1, round(fraction * n))`` clients, in id order."""
    k = cohort_size(len(ids), fraction)
    if k == len(ids):
        return list(ids)
    rng = np.random.default_rng(derive_seed(seed, "sample", round))
    chosen = set(rng.choice(len(ids), size=k, replace=False).tolist())
    return [cid for i, cid in enumerate(ids) if i in chosen]


def sample_rule(hook: Any) -> SelectionRule:
    """The built-in rule: ``fedkit_select_clients`` of the run's plugins, else
    ``sample_fraction`` of the clients drawn from the seed and the round."""

    def sample(server: ServerContext, clients: Sequence[str]) -> Sequence[str]:
        chosen = hook.fedkit_select_clients(server=server, clients=clients)
        if chosen is not None:
            return chosen
        cfg = server.config
        return sample_clients(clients, cfg["sample_fraction"], cfg["seed"], server.round)

    return sample


def selection_rules(plugins: Any) -> dict[str, SelectionRule]:
    """Every selection rule by name: the built-in one and those the run's plugins register
    (a name registered twice is an error naming it)."""
    rules: dict[str, SelectionRule] = {SAMPLE: sample_rule(plugins.hook)}

    def register(name: str, rule: SelectionRule) -> None:
        if name in rules:
            raise FedkitError(f"selection rule {name!r} is registered twice")
        if not callable(rule):
            raise FedkitError(f"selection rule {name!r} is not callable: {rule!r}")
        rules[name] = rule

    plugins.hook.fedkit_register_selection_rules(register=register)
    return rules


def selection_rule(name: str, plugins: Any) -> SelectionRule:
    """The rule ``selection=name`` chooses; an unknown name lists the known ones."""
    rules = selection_rules(plugins)
    if name not in rules:
        raise unknown("selection rule", name, rules)
    return rules[name]


def select(
    rule: SelectionRule, name: str, server: ServerContext, clients: Sequence[str]
) -> list[str]:
    """The clients ``rule`` (called ``name``) chooses for round ``server.round``, checked,
    in id order."""
    chosen = rule(server, clients)
    who = "fedkit_select_clients" if name == SAMPLE else f"selection rule {name!r}"
    if chosen is None or isinstance(chosen, str) or not all(isinstance(c, str) for c in chosen):
        raise FedkitError(f"{who} returned {chosen!r}, not a list of client ids")
    unknown_ids = sorted(set(chosen) - set(clients))
    if unknown_ids or not chosen:
        raise FedkitError(
            f"{who} chose {list(chosen)!r} in round {server.round}: "
            + (f"unknown clients {unknown_ids}" if unknown_ids else "no client")
        )
    return [cid for cid in clients if cid in set(chosen)]
