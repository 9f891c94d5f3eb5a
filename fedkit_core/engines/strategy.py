"""How a round's updates are made and combined: a strategy, as a round mode asks it.

A :class:`Strategy` answers the round's questions about the clients' work: who trains (its
selection rule, :mod:`fedkit_core.engines.selection`), what the fit messages carry beside
the model, how the fit exchange runs, which updates the aggregator sees, the aggregate
itself (``fedkit_aggregate``, checked), what the round's record says of the clients, and
when the run's last round is. The plain strategy is the protocol without privacy; the
privacy layer wraps it (:mod:`fedkit_core.privacy.rounds`, as Flower's DP strategies wrap
any strategy), so neither the loop nor the round modes know about DP or SecAgg+.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from fedkit_core.contract.messages import Arrays, Message, Reply, Update, check_arrays, take_out
from fedkit_core.contract.observer import Observer
from fedkit_core.contract.protocol import PAYLOAD
from fedkit_core.engines.exchange import Exchange, Transport
from fedkit_core.engines.selection import SelectionRule, select
from fedkit_core.errors import FedkitError
from fedkit_core.hooks.context import ServerContext
from fedkit_core.plugin_manager import BUILTINS


class Strategy:
    """The plain strategy of a run on ``ctx`` with ``hook`` (its plugins' hooks), choosing
    clients by ``rule`` (called ``rule_name``)."""

    #: whether a round's evaluation may travel inside the next round's fit messages
    carries_evaluation = True

    def __init__(self, ctx: ServerContext, hook: Any, rule: SelectionRule, rule_name: str):
        self.ctx, self.hook = ctx, hook
        self.rule, self.rule_name = rule, rule_name
        #: the run's last round
        self.last_round: int = ctx.config["rounds"]

    def select(self, clients: Sequence[str], rnd: int) -> list[str]:
        """The clients that train in round ``rnd``."""
        return select(self.rule, self.rule_name, self.ctx, clients)

    def fit_scalars(self) -> dict[str, Any]:
        """Scalars every fit message carries beside the round's settings."""
        return {}

    def fit(
        self, exchange: Exchange, transport: Transport, messages: dict[str, Message], rnd: int
    ) -> dict[str, Message]:
        """The fit exchange of round ``rnd``: every client's reply."""
        return exchange.send(transport, messages)

    def updates(self, replies: Mapping[str, Message], ok: Sequence[str], rnd: int) -> list[Update]:
        """The updates the aggregator sees: those of the clients ``ok``."""
        return [_update(cid, replies[cid]) for cid in ok]

    def check_query(self, query: str) -> None:
        """Refuse an aggregator's extra question the run may not carry (none here)."""

    def aggregate(
        self, updates: Sequence[Update], ask: Callable[..., dict[str, Reply]], rnd: int = 0
    ) -> Arrays:
        """The next global state from ``updates`` (``fedkit_aggregate``), checked (naming
        the plugin that made it, see :func:`check_state`)."""
        new_state, aggregator = self._aggregate(list(updates), ask)
        check_state(self.ctx.global_state, new_state, aggregator, rnd, updates)
        return {k: v.detach().cpu() for k, v in new_state.items()}

    def _aggregate(self, updates: list[Update], ask: Callable[..., Any]) -> tuple[Any, str]:
        """The new global state by ``fedkit_aggregate`` (the first implementation, in call
        order, that returns one) and the name of the plugin that made it."""
        hook = self.hook.fedkit_aggregate
        impls = hook.get_hookimpls()
        if any(getattr(i, "hookwrapper", False) or getattr(i, "wrapper", False) for i in impls):
            owners = [i.plugin_name for i in impls if i.plugin_name not in BUILTINS]
            return hook(server=self.ctx, updates=updates, ask=ask), " or ".join(owners)
        kwargs = {"server": self.ctx, "updates": updates, "ask": ask}
        for impl in reversed(impls):  # pluggy's call order
            state = impl.function(*(kwargs[name] for name in impl.argnames))
            if state is not None:
                return state, impl.plugin_name
        return None, "no plugin"

    def train_record(
        self, sampled: Sequence[str], ok: Sequence[str], replies: Mapping[str, Message]
    ) -> dict[str, Any]:
        """What round's record says of its clients: who was sampled, what each reported."""
        return {
            "sampled": list(sampled),
            "train": {cid: self.reported(replies[cid].scalars) for cid in ok},
        }

    def reported(self, scalars: Mapping[str, Any]) -> dict[str, Any]:
        """The scalars of a client's update that its round's record keeps."""
        return {k: v for k, v in scalars.items() if k != "num_examples"}

    def traffic(self, traffic: dict[str, dict[str, int]]) -> dict[str, Any]:
        """A round's ``bytes`` entry from its traffic per client."""
        return traffic

    def round_record(self, rnd: int) -> dict[str, Any]:
        """Entries round ``rnd``'s record gets once its update is made."""
        return {}

    def is_last(self, rnd: int) -> bool:
        """Whether round ``rnd`` is the run's last."""
        return rnd >= self.last_round

    def summary(self, records: Sequence[Mapping[str, Any]]) -> dict[str, Any] | None:
        """``final.privacy`` of a run of ``records`` (None: not private)."""
        return None

    def restore(self) -> None:
        """Take up the state the server's context holds after a resume."""


def asker(
    strategy: Strategy,
    exchange: Exchange,
    observer: Observer,
    transport: Transport,
    rnd: int,
    default: list[str],
) -> Callable[..., dict[str, Reply]]:
    """The ``ask`` an aggregator gets in round ``rnd``: one extra message to the clients
    ``default`` (or those it names), which ``strategy`` may refuse; their replies."""

    def ask(
        query: str,
        arrays: Arrays | None = None,
        scalars: dict | None = None,
        clients: Sequence[str] | None = None,
    ) -> dict[str, Reply]:
        strategy.check_query(query)
        targets = list(clients) if clients is not None else default
        message = Message(
            "query",
            check_arrays(arrays or {}, query),
            {**(scalars or {}), "query": query, "round": rnd},
        )
        observer.on_phase(rnd, query, 0, len(targets))
        replies = exchange.send(transport, {cid: message for cid in targets})
        ok = exchange.failures(query, rnd, replies, required=exchange.required(len(targets)))
        return {cid: Reply(replies[cid].arrays, replies[cid].scalars) for cid in ok}

    return ask


def _update(cid: str, reply: Message) -> Update:
    """A client's fit reply as an :class:`Update`: the model's arrays and the scalars, and
    apart the arrays plugins sent up (:data:`PAYLOAD`)."""
    fit, sent = take_out(reply, PAYLOAD, "fit")
    return Update(cid, fit.arrays, fit.scalars, payload=sent.arrays)


def check_state(
    expected: Arrays, state: Any, aggregator: str, rnd: int, updates: Sequence[Update]
) -> None:
    """Refuse an aggregate of the wrong kind, keys (those of the ``expected`` global
    state) or values (NaN or inf), naming the plugin that made it, or the clients whose
    updates were not finite already (a non-finite state would fail the next round's
    clients, as if their learning rate were too high)."""
    if not isinstance(state, dict):
        raise FedkitError(
            f"fedkit_aggregate ({aggregator}) returned {type(state).__name__}, not a dict "
            "of tensors"
        )
    if set(state) != set(expected):
        missing, extra = sorted(set(expected) - set(state)), sorted(set(state) - set(expected))
        raise FedkitError(
            f"the aggregator ({aggregator}) returned a different state: missing "
            f"{missing[:5]}, extra {extra[:5]}"
        )
    broken = [key for key, value in state.items() if not _finite(value)]
    if not broken:
        return
    senders = [u.client_id for u in updates if not all(map(_finite, u.arrays.values()))]
    if senders:
        raise FedkitError(
            f"the updates of {', '.join(map(repr, senders))} in round {rnd} hold values "
            f"that are not finite (NaN or inf), and so does their aggregate"
        )
    raise FedkitError(
        f"the aggregate of round {rnd} made by plugin {aggregator!r} "
        f"(fedkit_aggregate) holds values that are not finite (NaN or inf) in "
        f"{', '.join(broken[:5])}{', ...' if len(broken) > 5 else ''}, from clients' "
        "updates that are finite: a fault in that plugin's aggregation (e.g. weights "
        "that are NaN or sum to 0)"
    )


def _finite(value: Any) -> bool:
    """Whether a message array holds no NaN or inf (arrays that are not floats always do)."""
    tensor = torch.as_tensor(value)
    return not tensor.is_floating_point() or bool(tensor.isfinite().all())
