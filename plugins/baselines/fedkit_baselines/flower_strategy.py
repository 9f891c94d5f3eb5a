"""A Flower strategy as the aggregation of a fedkit run, on every engine.

A Flower user brings the strategy they trust (flwr's own class: ``FedAdam``, ``FedYogi``,
``FedTrimmedAvg``, ``Krum``, ``FedMedian``, ``Bulyan``, the server-side
``DifferentialPrivacy...`` wrappers, or their own subclass) and gets fedkit's tasks,
metrics, paired comparisons and resume::

    fedkit run --plugin flower-strategy --set flower-strategy.strategy=FedTrimmedAvg \\
        --set 'flower-strategy.args={beta: 0.2}'
    fedkit run --plugin flower-strategy --set flower-strategy.strategy=mypkg.strategies:make

``strategy`` names a class of ``flwr.serverapp.strategy`` (Flower's Message API), or
``module:attribute``: a Strategy instance, class or factory (called with ``args``).

How the strategy's methods map onto fedkit (one call each per round, on the server):

* ``configure_train(round, arrays, config, grid)``: called for what it records (the current
  arrays of ``FedOpt``, ``FedAvgM``, the DP wrappers), with the global state and a grid of
  this round's clients; the messages it returns are not sent. fedkit samples the clients
  (``sample_fraction``, ``min_clients``) and sends its own fit messages; the strategy's
  ``fraction_train`` and ``min_*_nodes`` must allow the round's clients.
* ``aggregate_train(round, replies)`` is ``fedkit_aggregate``: each client's update arrives
  as a reply holding its shared arrays (``arrays``) and a ``MetricRecord`` of
  ``num-examples`` and its numeric scalars (``loss``...); the ``ArrayRecord`` it returns is
  the new global state.
* ``configure_evaluate``, ``aggregate_evaluate``, ``start``, ``summary``: not used; fedkit
  evaluates every client and keeps the records.

Refused, because their clients would have to act on the strategy's instructions:
``FedProx`` (the proximal term: use the ``fedprox`` plugin), ``QFedAvg`` (it needs the loss
at the received model: use ``qfedavg``), the client-side DP wrappers, the XGBoost
strategies, and Flower's legacy ``flwr.server.strategy`` classes. Randomness inside the
strategy (the DP noise, its node sampling) draws from NumPy's and Python's global generators,
seeded per round from the run's seed and restored afterwards. What the strategy keeps
across rounds (moments, momentum, clipping norms: its attributes that hold arrays or plain
values, and those of a wrapped strategy) is saved in the server's plugin state after every
round and given back to the strategy, built afresh, before the next: checkpoints carry it and
``fedkit resume`` continues with it (attributes of other kinds start afresh each round).
Flower's own INFO log lines of the two calls are silenced (warnings still show).
"""

from __future__ import annotations

import importlib
import logging
import random
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import numpy as np
import torch

from fedkit_core.plugin import FedkitError, Option, derive_seed, hookimpl

fedkit_api = 2

#: strategies whose clients must act on the strategy's configuration: refused
REFUSED = {
    "FedProx": "its clients add a proximal term: use the fedprox plugin",
    "QFedAvg": "it needs each client's loss at the received model: use the qfedavg plugin",
    "DifferentialPrivacyClientSideFixedClipping": "its clients clip their updates (a client mod)",
    "DifferentialPrivacyClientSideAdaptiveClipping": "its clients clip their updates (a client mod)",
    "FedXgbBagging": "it aggregates XGBoost trees, not arrays",
    "FedXgbCyclic": "it aggregates XGBoost trees, not arrays",
}


@hookimpl
def fedkit_options():
    return [
        Option(
            "strategy",
            str,
            None,
            "the Flower strategy: a class of flwr.serverapp.strategy (FedTrimmedAvg, Krum, "
            "FedAdam...) or module:attribute (an instance, class or factory)",
        ),
        Option("args", "dict", {}, "keyword arguments of the strategy's class or factory"),
    ]


# ----------------------------------------------------------------------------- building


def _flwr_strategy_module():
    try:
        return importlib.import_module("flwr.serverapp.strategy")
    except ImportError:
        raise FedkitError("flower-strategy needs Flower: pip install 'fedkit[flower]'") from None


def build(name: str | None, args: Mapping[str, Any]):
    """The strategy ``name`` (see the module docstring) built with ``args``."""
    strategies = _flwr_strategy_module()
    if not name:
        raise FedkitError(
            "flower-strategy needs a strategy: --set flower-strategy.strategy=FedTrimmedAvg "
            "(a class of flwr.serverapp.strategy) or module:attribute"
        )
    if ":" in name:
        module_name, _, attribute = name.partition(":")
        try:
            target = getattr(importlib.import_module(module_name), attribute)
        except (ImportError, AttributeError) as err:
            raise FedkitError(
                f"flower-strategy.strategy={name!r}: cannot import it ({err})"
            ) from None
    else:
        target = getattr(strategies, name, None)
        if target is None or not isinstance(target, type):
            known = sorted(n for n in getattr(strategies, "__all__", []) if n not in REFUSED)
            raise FedkitError(
                f"flower-strategy.strategy={name!r} is not a class of flwr.serverapp.strategy "
                f"(known: {', '.join(known)}); use module:attribute for your own"
            )
    if isinstance(target, strategies.Strategy):
        if args:
            raise FedkitError("flower-strategy.args is for a class or factory, not an instance")
        strategy = target
    elif callable(target):
        try:
            strategy = target(**dict(args))
        except TypeError as err:
            raise FedkitError(f"flower-strategy: {name}({_kwargs(args)}) failed: {err}") from None
    else:
        raise FedkitError(f"flower-strategy.strategy={name!r} is neither a strategy nor callable")
    _refuse(strategy, strategies)
    return strategy


def _kwargs(args: Mapping[str, Any]) -> str:
    return ", ".join(f"{k}={v!r}" for k, v in args.items())


def _refuse(strategy: Any, strategies) -> None:
    if not isinstance(strategy, strategies.Strategy):
        legacy = type(strategy).__module__.startswith("flwr.server.strategy")
        raise FedkitError(
            f"flower-strategy: {type(strategy).__name__} is not a flwr.serverapp.strategy "
            "Strategy"
            + (
                " (Flower's legacy API: use the class of the same name in flwr.serverapp.strategy)"
                if legacy
                else ""
            )
        )
    for cls in type(strategy).__mro__:
        if cls.__name__ in REFUSED and cls.__module__.startswith("flwr."):
            raise FedkitError(
                f"flower-strategy: {cls.__name__} is refused: {REFUSED[cls.__name__]}"
            )
    inner = getattr(strategy, "strategy", None)
    if inner is not None:
        _refuse(inner, strategies)


@hookimpl
def fedkit_check(server):
    opts = server.options()
    try:
        build(opts["strategy"], opts["args"])
    except FedkitError as err:
        return str(err)
    return None


def strategy_of(server) -> Any:
    """The run's strategy as it stood after the last round: built afresh and given back the
    attributes saved in the server state (so a resumed run and an uninterrupted one are the
    same computation)."""
    opts = server.options()
    strategy = build(opts["strategy"], opts["args"])
    restore(strategy, server.state.get("attributes", {}))
    return strategy


# ----------------------------------------------------------------------------- state


def export(obj: Any) -> dict[str, Any]:
    """The attributes of a strategy that a checkpoint can carry: arrays (alone, in lists,
    dicts or ``ArrayRecord``), plain values and nested strategies (wrappers); functions and
    other objects, given at construction and never changed, are left out."""
    from flwr.app import ArrayRecord

    strategies = _flwr_strategy_module()
    out: dict[str, Any] = {}
    for name, value in vars(obj).items():
        if isinstance(value, strategies.Strategy):
            out[name] = {"strategy": export(value)}
        elif value is None or isinstance(value, (bool, int, float, str)):
            out[name] = {"value": value}
        elif isinstance(value, np.ndarray):
            out[name] = {"array": torch.from_numpy(value.copy())}
        elif isinstance(value, ArrayRecord):
            out[name] = {
                "record": {k: torch.from_numpy(a.numpy().copy()) for k, a in value.items()}
            }
        elif isinstance(value, dict) and all(isinstance(v, np.ndarray) for v in value.values()):
            out[name] = {"dict": {k: torch.from_numpy(v.copy()) for k, v in value.items()}}
        elif isinstance(value, list) and all(isinstance(v, np.ndarray) for v in value):
            out[name] = {"list": [torch.from_numpy(v.copy()) for v in value]}
    return out


def restore(obj: Any, saved: Mapping[str, Any]) -> None:
    """Set the attributes :func:`export` saved back on a freshly built strategy."""
    from flwr.app import Array, ArrayRecord

    for name, entry in saved.items():
        kind, value = next(iter(entry.items()))
        if kind == "strategy":
            restore(getattr(obj, name), value)
            continue
        if kind == "array":
            value = value.numpy().copy()
        elif kind == "record":
            value = ArrayRecord({k: Array(v.numpy().copy()) for k, v in value.items()})
        elif kind == "dict":
            value = {k: v.numpy().copy() for k, v in value.items()}
        elif kind == "list":
            value = [v.numpy().copy() for v in value]
        setattr(obj, name, value)


# ----------------------------------------------------------------------------- aggregation


@contextmanager
def _seeded(seed: int) -> Iterator[None]:
    """NumPy's and Python's global generators seeded for the strategy, then restored."""
    numpy_state, python_state = np.random.get_state(), random.getstate()
    np.random.seed(seed)
    random.seed(seed)
    try:
        yield
    finally:
        np.random.set_state(numpy_state)
        random.setstate(python_state)


@contextmanager
def _quiet() -> Iterator[None]:
    """Flower's INFO lines (``configure_train: Sampled 3 nodes``) silenced, warnings kept."""
    logger = logging.getLogger("flwr")
    level = logger.level
    logger.setLevel(max(level, logging.WARNING))
    try:
        yield
    finally:
        logger.setLevel(level)


@contextmanager
def message_identity() -> Iterator[None]:
    """Flower's messages need a task identity; outside a Flower process (fedkit's local
    engine) a placeholder one is set while they are made."""
    from flwr.supercore.task_identity import TaskIdentity

    try:
        TaskIdentity.run_id  # noqa: B018 (set when running inside Flower)
        yield
        return
    except RuntimeError:
        pass
    TaskIdentity.run_id, TaskIdentity.task_id, TaskIdentity.node_id = 0, 0, 0
    try:
        yield
    finally:
        TaskIdentity.run_id, TaskIdentity.task_id, TaskIdentity.node_id = None, None, None


def round_grid(nodes: list[int]):
    from flwr.serverapp import Grid

    class RoundGrid(Grid):
        """This round's clients as Flower node ids; nothing is sent through it."""

        def get_node_ids(self):
            return list(nodes)

        def _unused(self, *args, **kwargs):
            raise FedkitError("flower-strategy: the strategy tried to send messages itself")

        set_run = create_message = push_messages = pull_messages = send_and_receive = _unused

        @property
        def run(self):
            return self._unused()

    return RoundGrid()


def _metrics(scalars: Mapping[str, Any]) -> dict[str, int | float]:
    """A client's numeric scalars for a MetricRecord, ``num_examples`` as ``num-examples``."""
    out: dict[str, int | float] = {}
    for key, value in scalars.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        out["num-examples" if key == "num_examples" else key] = value
    return out


@hookimpl
def fedkit_aggregate(server, updates, ask):
    from flwr.app import (
        Array,
        ArrayRecord,
        ConfigRecord,
        Message,
        MessageType,
        MetricRecord,
        RecordDict,
    )

    strategy = strategy_of(server)
    ids = list(server.task.client_ids)
    nodes = [ids.index(u.client_id) + 1 for u in updates]
    needs = max(
        getattr(strategy, "min_available_nodes", 0), getattr(strategy, "min_train_nodes", 0)
    )
    if len(nodes) < needs:
        raise FedkitError(
            f"flower-strategy: {type(strategy).__name__} wants at least {needs} clients a round "
            f"(min_available_nodes / min_train_nodes), round {server.round} has {len(nodes)}"
        )
    state = server.global_state
    arrays = ArrayRecord({k: Array(v.numpy()) for k, v in state.items()})
    rnd = server.round
    seed = derive_seed(server.config["seed"], "flower-strategy", rnd)
    with message_identity(), _seeded(seed), _quiet():
        strategy.configure_train(rnd, arrays, ConfigRecord(), round_grid(nodes))
        replies = []
        for node, update in zip(nodes, updates):
            asked = Message(RecordDict(), dst_node_id=node, message_type=MessageType.TRAIN)
            content = RecordDict(
                {
                    "arrays": ArrayRecord({k: Array(v.numpy()) for k, v in update.arrays.items()}),
                    "metrics": MetricRecord(_metrics(update.scalars)),
                }
            )
            replies.append(Message(content, reply_to=asked))
        aggregated, _ = strategy.aggregate_train(rnd, replies)
    if aggregated is None:
        raise FedkitError(
            f"flower-strategy: {type(strategy).__name__}.aggregate_train returned no arrays in "
            f"round {rnd} (see Flower's log above)"
        )
    if set(aggregated.keys()) != set(state):
        raise FedkitError(
            f"flower-strategy: {type(strategy).__name__} returned other arrays than the model's"
        )
    server.state["attributes"] = export(strategy)
    return {
        k: torch.from_numpy(np.asarray(aggregated[k].numpy()))
        .to(state[k].dtype)
        .reshape(state[k].shape)
        for k in state
    }
