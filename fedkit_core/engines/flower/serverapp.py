"""The server side on Flower: the fedkit Server driving SuperNodes through a Flower Grid.

:func:`serve` is the body of fedkit's ServerApp, in simulation and deployment alike: wait for
the SuperNodes, ask each which client it serves and what its data looks like (``describe``),
assemble the task description from the answers, then run the same
:class:`~fedkit_core.engines.server.Server` as the local engine over a :class:`FlowerTransport`.
"""

from __future__ import annotations

import json
import logging
import re
import time
from typing import Any

from flwr.app import Context, Error
from flwr.app import Message as FlowerMessage
from flwr.serverapp import Grid

from fedkit_core.config import Config
from fedkit_core.contract.data import TaskInfo
from fedkit_core.contract.messages import Message
from fedkit_core.contract.observer import Observer
from fedkit_core.engines.driver import drive
from fedkit_core.engines.flower.activations import NodeWatch, environment_log
from fedkit_core.engines.flower.fast import fast_layer, retry_object_pulls_sooner
from fedkit_core.engines.flower.node import CONFIG_KEY, OUT_KEY, TASK_KEY
from fedkit_core.engines.flower.packing import pack, unpack
from fedkit_core.engines.flower.records import MESSAGE_TYPES, from_records, to_records
from fedkit_core.engines.server import Server
from fedkit_core.errors import FedkitError
from fedkit_core.federation import pick_device
from fedkit_core.plugin_manager import PluginSet
from fedkit_core.resolve import resolve_config
from fedkit_core.results.schema import Results
from fedkit_core.results.store import RunDir

#: seconds a deployed client's reply may take beyond ``client_timeout`` (transfer and
#: polling) before the server stops waiting for it; the node enforces the timeout itself
DELIVERY_SLACK = 15.0
#: the longest wait between two pulls of replies from an in-memory (simulation) or a remote
#: (deployed) SuperLink; a simulation's first wait is shorter (its pulls cost little)
SIMULATION_PAUSE, DEPLOYED_PAUSE, FIRST_PAUSE = 0.05, 0.05, 0.01


class FlowerTransport:
    """Delivers fedkit messages as Flower messages through ``grid``.

    A client whose node replies with an error, is reported gone by Flower, or has not replied
    within ``deadline`` seconds gets a failed reply (``error`` set). A failed message is sent
    again up to ``retries`` times (the node's context still holds the client's state from
    before it, so a retry starts from there); then the server records the failure and goes
    on while ``min_clients`` clients remain.

    ``deadline`` is the server's own limit per message (None: wait until the node replies or
    is reported gone); the per-client ``client_timeout`` is enforced where the client runs
    (the simulation backends, a deployed node's executor), since a simulation may serve its
    clients one after another. ``max_pause``: the longest wait between two pulls of replies
    (a simulation's SuperLink is in memory and cheap to poll; a deployed one is remote), and
    ``first_pause`` the first (each next one 1.5 times longer).
    """

    def __init__(
        self,
        grid: Grid,
        observer: Observer,
        deadline: float | None = None,
        retries: int = 0,
        max_pause: float = 0.5,
        packed: bool = False,
        first_pause: float = FIRST_PAUSE,
    ):
        self.grid = grid
        self.max_pause = max_pause
        self.first_pause = min(first_pause, max_pause)
        self.observer = observer
        self.deadline = deadline
        self.retries = retries
        self.packed = packed  # all arrays of a message in one Flower Array (see packing.py)
        self.nodes: dict[str, int] = {}  # client id -> node id
        self.setup_scalars: dict[str, Any] = {}  # added to every setup message
        #: ``aggregation=deadline`` when deployed: seconds a fit message may take
        self.fit_deadline: float | None = None
        #: messages pushed by :meth:`push` whose replies :meth:`pull` has not handed back:
        #: Flower message id -> (client id, kind, deadline on the monotonic clock or None)
        self.waiting: dict[str, tuple[str, str, float | None]] = {}

    def send(self, messages: dict[str, Message]) -> dict[str, Message]:
        replies = self.exchange({self.nodes[cid]: m for cid, m in messages.items()})
        for _ in range(self.retries):
            failed = {
                self.nodes[cid]: message
                for cid, message in messages.items()
                if replies[self.nodes[cid]].error is not None
            }
            if not failed:
                break
            replies.update(self.exchange(failed))
        return {cid: replies[self.nodes[cid]] for cid in messages}

    def secure_fit(
        self,
        messages: dict[str, Message],
        rnd: int,
        config: Config,
        global_state: dict[str, Any],
    ) -> tuple[dict[str, Message], Message]:
        """The fit messages through Flower's SecAgg+ (:mod:`fedkit_core.engines.flower.secure`):
        each client's reply scalars (or failure) and the weighted mean of the updates."""
        from fedkit_core.engines.flower.secure import secure_fit

        by_node = {self.nodes[cid]: m for cid, m in messages.items()}
        replies, summed = secure_fit(self.grid, by_node, rnd, config, global_state)
        self.observer.on_phase(rnd, "secure aggregation", len(messages), len(messages))
        return {cid: replies[self.nodes[cid]] for cid in messages}, summed

    def exchange(self, messages: dict[int, Message]) -> dict[int, Message]:
        """Send one message per node id; the replies (or failures) by node id."""
        if not messages:
            return {}
        first = next(iter(messages.values()))
        rnd = int(first.scalars.get("round", 0))
        deadline = self._deadline(first.kind)
        outgoing = [self._outgoing(node, message, deadline) for node, message in messages.items()]
        received = self._collect(outgoing, deadline)
        out: dict[int, Message] = {}
        for (node, message), sent in zip(messages.items(), outgoing):
            reply = received.get(sent.metadata.message_id)
            if reply is None:
                out[node] = Message(
                    message.kind, error=f"no reply within {deadline} s (node {node})"
                )
            else:
                out[node] = _reply(reply, message.kind)
        phase = str(first.scalars.get("query", first.kind))
        self.observer.on_phase(rnd, phase, len(messages), len(messages))
        return out

    def _deadline(self, kind: str) -> float | None:
        """Seconds a message of ``kind`` may take (``None``: no limit)."""
        limits = [self.deadline] + ([self.fit_deadline] if kind == "fit" else [])
        limits = [d for d in limits if d is not None]
        return min(limits) if limits else None

    def _outgoing(self, node: int, message: Message, deadline: float | None) -> FlowerMessage:
        """``message`` as a Flower message to ``node``."""
        if message.kind == "setup":
            message = Message("setup", message.arrays, {**message.scalars, **self.setup_scalars})
        # a client that misses the deadline must not train on into the next round
        extra = {} if deadline is None else {"ttl": deadline}
        content = to_records(message)
        return FlowerMessage(
            pack(content) if self.packed else content,
            dst_node_id=node,
            message_type=MESSAGE_TYPES[message.kind],
            group_id=str(message.scalars.get("round", 0)),
            **extra,
        )

    def push(self, messages: dict[str, Message]) -> None:
        """Send ``messages`` (by client id) without waiting: :meth:`pull` hands the replies
        back as they come (asynchronous aggregation, in real time)."""
        sent = {
            cid: self._outgoing(self.nodes[cid], m, self._deadline(m.kind))
            for cid, m in messages.items()
        }
        pushed = {str(mid) for mid in self.grid.push_messages(list(sent.values())) if mid}
        now = time.monotonic()
        for cid, flower_message in sent.items():
            mid, kind = str(flower_message.metadata.message_id), messages[cid].kind
            limit = self._deadline(kind)
            self.waiting[mid] = (cid, kind, None if limit is None else now + limit)
            if mid not in pushed:  # answered at the next pull
                self.waiting[mid] = (cid, kind, now)

    def pull(self) -> list[tuple[str, Message]]:
        """Replies to :meth:`push`'s messages, as ``(client id, reply)``: waits until at
        least one has come (or a message's deadline has passed: a failed reply)."""
        pause = self.first_pause
        while self.waiting:
            out = []
            for reply in self.grid.pull_messages(list(self.waiting)):
                cid, kind, _ = self.waiting.pop(reply.metadata.reply_to_message_id)
                out.append((cid, _reply(reply, kind)))
            now = time.monotonic()
            for mid, (cid, kind, stop) in list(self.waiting.items()):
                if stop is not None and now >= stop:
                    del self.waiting[mid]
                    out.append(
                        (cid, Message(kind, error=f"no reply in time (node {self.nodes[cid]})"))
                    )
            if out:
                order = {cid: k for k, cid in enumerate(self.nodes)}
                return sorted(out, key=lambda item: order[item[0]])
            time.sleep(pause)
            pause = min(self.max_pause, pause * 1.5)
        raise FedkitError("pull: no message is waiting for a reply")

    def _collect(
        self, outgoing: list[FlowerMessage], deadline: float | None
    ) -> dict[str, FlowerMessage]:
        """Push ``outgoing`` and pull the replies, by the id of the message they answer,
        until all came or the ``deadline`` passed. Polls after ``first_pause``, backing off
        to ``max_pause``: a reply is seen soon after it arrives without loading the SuperLink."""
        ids = {str(mid) for mid in self.grid.push_messages(outgoing) if mid}
        stop = None if deadline is None else time.monotonic() + deadline
        received: dict[str, FlowerMessage] = {}
        pause = self.first_pause
        while ids:
            # by the message answered: Flower's own error replies (node gone, message
            # expired) come from the SuperLink, not from the node
            for reply in self.grid.pull_messages(list(ids)):
                received[reply.metadata.reply_to_message_id] = reply
                ids.discard(reply.metadata.reply_to_message_id)
            if not ids or (stop is not None and time.monotonic() > stop):
                break
            time.sleep(pause)
            pause = min(self.max_pause, pause * 1.5)
        return received


def _reply(reply: FlowerMessage, kind: str) -> Message:
    """A Flower reply as a fedkit reply of ``kind`` (failed on a Flower error)."""
    if reply.has_error():
        return Message(kind, error=_error_text(reply.error))
    return from_records(unpack(reply.content), kind)


def _error_text(error: Error) -> str:
    """A Flower error reply as text: a ClientApp's exception as its message alone."""
    raised = re.search(r"ClientAppException occurred\. Message: (.*)'>$", error.reason, re.S)
    if raised:
        return raised.group(1).strip()
    return f"Flower error {error.code}: {error.reason}"


def wait_for_nodes(grid: Grid, wanted: int, patience: float) -> list[int]:
    """The ids of the connected SuperNodes once ``wanted`` of them are there; more is an
    error (every connected node would receive the model and join the aggregation)."""
    deadline = time.monotonic() + patience
    while True:
        nodes = sorted(grid.get_node_ids())
        if len(nodes) > wanted:
            raise FedkitError(
                f"{len(nodes)} SuperNodes are connected but flower.nodes={wanted}: stop the "
                "nodes that do not belong to this federation, or set flower.nodes to match"
            )
        if len(nodes) == wanted:
            return nodes
        if time.monotonic() > deadline:
            raise FedkitError(
                f"only {len(nodes)} of {wanted} SuperNodes connected within {patience:.0f} s; "
                "start the missing ones or lower flower.nodes"
            )
        time.sleep(0.2)


def describe(transport: FlowerTransport, nodes: list[int]) -> TaskInfo:
    """Ask every node which client it serves; the task description from their answers.

    Also sets ``transport.nodes`` (client id -> node id). Clients are ordered by their
    node's partition index, which gives the same client order as the local engine.
    """
    replies = transport.exchange({node: Message("describe") for node in nodes})
    failed = {node: r.error for node, r in replies.items() if r.error is not None}
    if failed:
        node, error = next(iter(failed.items()))
        raise FedkitError(f"SuperNode {node} cannot serve a fedkit client: {error}")
    answers = sorted(replies.items(), key=lambda item: int(item[1].scalars["index"]))
    described = [json.loads(str(r.scalars["task"])) for _, r in answers]
    site_groups = [d.pop("shot_groups") for d in described]  # may differ between sites
    if any(d != described[0] for d in described):
        raise FedkitError(
            "the SuperNodes describe different tasks (classes, channels or image shape "
            "differ); every site must hold data of the same task"
        )
    clients: list[str] = []
    for node, reply in answers:
        cid = str(reply.scalars["client_id"])
        if cid in clients:
            raise FedkitError(
                f"two SuperNodes serve client {cid!r} (nodes {transport.nodes[cid]} and "
                f"{node}); give each SuperNode its own partition-id"
            )
        clients.append(cid)
        transport.nodes[cid] = node
    # the task's own groups; with task.shot_thresholds the server derives them at setup
    return TaskInfo.from_dict(
        {**described[0], "client_ids": clients, "shot_groups": site_groups[0]}
    )


def serve(
    grid: Grid,
    cfg: Config,
    plugin_set: PluginSet,
    run_dir: RunDir | None,
    observer: Observer,
    nodes: int,
    *,
    resume: bool = False,
    deployed: bool = False,
) -> Results:
    """Run the federation of ``cfg`` on the SuperNodes of ``grid``; write and return results.
    With ``resume``, continue from the checkpoint in ``run_dir`` (the nodes restore their
    clients from their own checkpoints)."""
    started = time.perf_counter()
    opts = cfg.section("flower")
    timeout = cfg["client_timeout"]
    # in a simulation the backend enforces client_timeout per client (it may serve them one
    # after another); deployed nodes run side by side, so the server bounds each message too
    deadline = timeout + DELIVERY_SLACK if deployed and timeout is not None else None
    pause = SIMULATION_PAUSE if not deployed else DEPLOYED_PAUSE
    # a deployed client's reply takes a round trip through the SuperLink and its node, and
    # every pull costs the SuperLink an HTTPS request: no faster pulls than the longest
    transport = FlowerTransport(
        grid,
        observer,
        deadline,
        cfg["client_retries"],
        max_pause=pause,
        packed=deployed,
        first_pause=pause if deployed else FIRST_PAUSE,
    )
    task = describe(transport, wait_for_nodes(grid, nodes, opts["wait"]))
    if deployed and cfg["sites"] is not None:
        raise FedkitError(
            "`sites` simulates the hospitals' time for a simulation; a deployment runs on the "
            "real ones: drop `sites` (aggregation modes work on real time there)"
        )
    if deployed and cfg["aggregation"] == "deadline":
        transport.fit_deadline = cfg["deadline"]
    server = Server(cfg, plugin_set, task, pick_device(cfg["device"]), observer, deployed)
    transport.setup_scalars = {TASK_KEY: json.dumps(task.to_dict())}
    # who serves each client, and second activations of their keys, as the SuperLink saw them
    watch = NodeWatch(transport.nodes, deployed, environment_log() if deployed else None)
    watch(server)  # the ServerApp's log warns before the first round
    return drive(
        server,
        transport,
        task.client_ids,
        plugin_set,
        run_dir,
        resume=resume,
        started=started,
        before_write=watch,
    )


class LogObserver(Observer):
    """Progress of a deployed run in the ServerApp's log (``flwr log RUN_ID``)."""

    def __init__(self) -> None:
        self.logger = logging.getLogger("flwr")

    def on_start(self, total_rounds: int, first_round: int) -> None:
        self.logger.info("fedkit: %d rounds", total_rounds)

    def on_round_end(self, record: dict[str, Any]) -> None:
        scores = ", ".join(f"{k} {v:.4f}" for k, v in record.get("global", {}).items())
        self.logger.info(
            "fedkit: round %d done in %.1f s %s", record["round"], record["seconds"], scores
        )


def serve_deployed(grid: Grid, context: Context) -> None:
    """The ServerApp of a deployed run: config and output folder come from the run config."""
    raw = context.run_config.get(CONFIG_KEY)
    if not raw:
        raise FedkitError(
            f"the run config lacks {CONFIG_KEY!r}; submit with `fedkit flower submit`"
        )
    cfg, plugin_set = resolve_config(json.loads(str(raw)))
    if cfg["flower.fast"] and fast_layer("flower.fast"):
        from flwr.superlink.grid import http_grid

        retry_object_pulls_sooner(http_grid)  # the nodes' replies
    if cfg["flower.nodes"] is None:
        raise FedkitError("set flower.nodes to the number of SuperNodes (one per client)")
    out = str(context.run_config.get(OUT_KEY, ""))
    run_dir = RunDir(out) if out else None
    if run_dir is not None:
        run_dir.create(cfg.nested())
        run_dir.save_config(cfg.nested())
    serve(grid, cfg, plugin_set, run_dir, LogObserver(), cfg["flower.nodes"], deployed=True)
