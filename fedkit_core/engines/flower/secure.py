"""Secure aggregation on the Flower engine: Flower's own SecAgg+ (``SecAggPlusWorkflow`` on
the server, ``secaggplus_mod`` on the clients) around fedkit's fit exchange.

A round's fit messages go out as the workflow's legacy ``FitIns`` (the message's arrays as
parameters, its scalars and the arrays' names as config) through a stand-in strategy; each
client's mod runs the protocol (key agreement, secret shares) and, in its masking stage,
hands the message to fedkit's client, which trains as usual. Back goes the client's update
``x_k - g`` (floating-point entries, in the global state's order; with adaptive DP clipping
also its unclipped bit) as the vector to mask, weighted by ``num_examples`` (1 under
client-level DP). The server unmasks only the weighted mean of the surviving clients' vectors
(Flower handles dropouts by reconstructing their masks from the shares), and fedkit adds it
to the global state. Flower's protocol carries ``num_examples`` and the reply's other
metrics in the clear (a private fedkit client sends no other scalar); integer counters (batch
norm's ``num_batches_tracked``) are not aggregated and keep the global value.

Precision: Flower quantises each weighted coordinate in ``[-clip_range, clip_range]`` to
``quantization`` levels and each weight ``num_examples / max_weight`` to 2^22 levels, so the
secure mean differs from the plain one by about ``clip_range / quantization`` per
coordinate; a client whose weighted update leaves the range, or whose weight exceeds
``max_weight``, fails with a message saying which key to raise.

Flower's API for it: Flower 1.42 has SecAgg+ only as
``flwr.server.workflow.SecAggPlusWorkflow`` and ``flwr.client.mod.secaggplus_mod`` (its
Message-API strategies, ``flwr.serverapp``, have none). The workflow takes a ``flwr.server.LegacyContext`` around a ``Strategy`` and sends
the strategy's ``FitIns`` as records through Flower's ``recorddict_compat``; the mod reads
the masking stage's reply back through it as a ``FitRes``. So this module speaks that
layout: the same converters, the workflow's state keys (``flwr.server.workflow.constant``)
and the proxies its own default workflow hands the strategy (``GridClientProxy``), the
modules the workflow and the mod import themselves.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, RecordDict
from flwr.app import Message as FlowerMessage
from flwr.client.mod import secaggplus_mod
from flwr.common import Code, FitIns, FitRes, Status, ndarrays_to_parameters, parameters_to_ndarrays
from flwr.common.secure_aggregation.secaggplus_constants import RECORD_KEY_CONFIGS
from flwr.compat.common import recorddict_compat as compat
from flwr.server import LegacyContext, SimpleClientManager
from flwr.server.compat.grid_client_proxy import GridClientProxy
from flwr.server.strategy import Strategy
from flwr.server.workflow import SecAggPlusWorkflow
from flwr.server.workflow.constant import MAIN_CONFIGS_RECORD, MAIN_PARAMS_RECORD
from flwr.server.workflow.constant import Key as WorkflowKey
from flwr.serverapp import Grid

from fedkit_core.config import Config
from fedkit_core.contract.channels import dp_level
from fedkit_core.contract.messages import Arrays, Message
from fedkit_core.errors import FedkitError
from fedkit_core.privacy.layer import SECURE_BIT as BIT
from fedkit_core.privacy.layer import UNCLIPPED

#: the FitIns config entry naming the message's arrays, in order
NAMES = "fedkit.names"


def to_fitins(message: Message) -> FitIns:
    """A fedkit fit message as legacy ``FitIns``: arrays as parameters, names in config."""
    names = list(message.arrays)
    return FitIns(
        ndarrays_to_parameters([message.arrays[n].numpy() for n in names]),
        {**message.scalars, NAMES: "\n".join(names)},  # legacy config holds scalars only
    )


def from_fitins(fitins: FitIns) -> Message:
    config = dict(fitins.config)
    names = str(config.pop(NAMES)).split("\n") if config.get(NAMES) else []
    arrays = parameters_to_ndarrays(fitins.parameters)
    return Message(
        "fit", {n: torch.from_numpy(np.array(a, copy=True)) for n, a in zip(names, arrays)}, config
    )


def vector_names(global_state: Mapping[str, torch.Tensor], adaptive: bool) -> list[str]:
    """The masked vector's entries: the floating-point shared entries, then the bit."""
    names = [k for k, v in global_state.items() if v.dtype.is_floating_point]
    return names + ([BIT] if adaptive else [])


def secure_vector(
    received: Mapping[str, torch.Tensor],
    reply: Message,
    config: Config,
    where: str,
) -> FitRes:
    """The client's ``FitRes`` for the masking stage: its update from ``received`` and the
    weight Flower multiplies it by; only ``num_examples`` and the privacy layer's scalars
    travel beside (in the clear, as Flower's protocol sends metrics)."""
    adaptive = dp_level(config) == "client" and config["dp.clipping"] == "adaptive"
    scalars = dict(reply.scalars)
    bit = float(scalars.pop(UNCLIPPED, 0.0))
    weight = 1 if dp_level(config) == "client" else int(scalars.get("num_examples", 1))
    ratio = weight / config["secagg.max_weight"]
    if ratio > 1:
        raise FedkitError(
            f"{where}: secure aggregation weights its update by num_examples={weight} / "
            f"secagg.max_weight={config['secagg.max_weight']:g} > 1; raise secagg.max_weight"
        )
    vector = []
    for name in vector_names(received, adaptive):
        if name == BIT:
            value = np.array([bit], dtype=np.float64)
        else:
            value = (reply.arrays[name].double() - received[name].double()).numpy()
        largest = float(np.abs(value).max(initial=0.0)) * ratio
        if largest > config["secagg.clip_range"]:
            raise FedkitError(
                f"{where}: secure aggregation quantises weighted updates in [-R, R] with "
                f"R = secagg.clip_range = {config['secagg.clip_range']:g}, but {name!r} moves by "
                f"{largest:.4g}; raise secagg.clip_range"
            )
        vector.append(value)
    scalars["num_examples"] = weight
    return FitRes(Status(Code.OK, ""), ndarrays_to_parameters(vector), weight, scalars)


def client_mod(
    fit: Callable[[Message, Context], Message], config_of: Callable[[Context], Config]
) -> Callable[[FlowerMessage, Context, Callable], FlowerMessage]:
    """The ClientApp's train mod: a SecAgg+ message goes through Flower's
    ``secaggplus_mod``, whose masking stage calls ``fit`` (fedkit's client) on the fedkit
    message inside the legacy ``FitIns``; any other message passes on unchanged."""

    def inner(msg: FlowerMessage, ctxt: Context) -> FlowerMessage:
        message = from_fitins(compat.recorddict_to_fitins(msg.content, keep_input=True))
        reply = fit(message, ctxt)
        if reply.error is not None:
            raise (reply.exception or FedkitError(reply.error))
        config = config_of(ctxt)
        fitres = secure_vector(message.arrays, reply, config, f"node {ctxt.node_id}")
        return FlowerMessage(compat.fitres_to_recorddict(fitres, keep_input=True), reply_to=msg)

    def mod(msg: FlowerMessage, ctxt: Context, call_next: Callable) -> FlowerMessage:
        configs = msg.content.config_records.get(RECORD_KEY_CONFIGS)
        if configs is None:
            return call_next(msg, ctxt)
        # the mod consumes its stage entry: a copy, since an in-memory simulation hands
        # every node the same record
        content = RecordDict(dict(msg.content.items()))
        content[RECORD_KEY_CONFIGS] = ConfigRecord(dict(configs))
        msg.content = content
        return secaggplus_mod(msg, ctxt, inner)

    return mod


class _RoundStrategy(Strategy):
    """The stand-in strategy of one SecAgg+ round: fedkit's fit messages as ``FitIns`` for
    the sampled nodes, and the unmasked mean the workflow hands to ``aggregate_fit``."""

    def __init__(self, grid: Grid, fitins: dict[int, FitIns]):
        self.grid, self.fitins = grid, fitins
        self.results: list[tuple[Any, FitRes]] | None = None
        self.failures: list[Any] = []

    def initialize_parameters(self, client_manager):
        return None

    def configure_fit(self, server_round, parameters, client_manager):
        return [(GridClientProxy(nid, self.grid, 0), ins) for nid, ins in self.fitins.items()]

    def aggregate_fit(self, server_round, results, failures):
        self.results, self.failures = list(results), list(failures)
        return (results[0][1].parameters if results else None), {}

    def configure_evaluate(self, server_round, parameters, client_manager):
        return []

    def aggregate_evaluate(self, server_round, results, failures):
        return None, {}

    def evaluate(self, server_round, parameters):
        return None


def secure_fit(
    grid: Grid,
    messages: dict[int, Message],
    rnd: int,
    config: Config,
    global_state: Mapping[str, torch.Tensor],
) -> tuple[dict[int, Message], Message]:
    """One SecAgg+ round over ``messages`` (node id -> fit message): each node's reply
    scalars (or its failure) and the unmasked weighted mean of the updates (arrays by name;
    scalars ``count``: the clients in it, ``weight``: their summed weights)."""
    strategy = _RoundStrategy(grid, {nid: to_fitins(m) for nid, m in messages.items()})
    state = RecordDict()
    state.config_records[MAIN_CONFIGS_RECORD] = ConfigRecord({WorkflowKey.CURRENT_ROUND: rnd})
    state.array_records[MAIN_PARAMS_RECORD] = ArrayRecord()
    context = LegacyContext(
        Context(run_id=0, node_id=0, node_config={}, state=state, run_config={}),
        strategy=strategy,
        client_manager=SimpleClientManager(),
    )
    workflow = SecAggPlusWorkflow(
        num_shares=float(config["secagg.shares"]),
        reconstruction_threshold=float(config["secagg.threshold"]),
        clipping_range=float(config["secagg.clip_range"]),
        quantization_range=int(config["secagg.quantization"]),
        max_weight=float(config["secagg.max_weight"]),
        timeout=config["secagg.timeout"],
    )
    workflow(grid, context)
    if not strategy.results:
        reasons = "; ".join(str(f) for f in strategy.failures[:3]) or "too few clients answered"
        raise FedkitError(
            f"secure aggregation halted in round {rnd}: fewer clients than SecAgg+'s "
            f"reconstruction threshold finished the protocol ({reasons})"
        )
    adaptive = dp_level(config) == "client" and config["dp.clipping"] == "adaptive"
    names = vector_names(global_state, adaptive)
    mean = parameters_to_ndarrays(strategy.results[0][1].parameters)
    replies: dict[int, Message] = {
        nid: Message("fit", error="dropped out of secure aggregation") for nid in messages
    }
    weight = 0
    for proxy, fitres in strategy.results:
        replies[proxy.node_id] = Message("fit", {}, dict(fitres.metrics))
        weight += fitres.num_examples
    arrays: Arrays = {
        n: torch.from_numpy(np.asarray(v, dtype=np.float64)) for n, v in zip(names, mean)
    }
    return replies, Message("fit", arrays, {"count": len(strategy.results), "weight": weight})
