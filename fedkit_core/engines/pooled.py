"""The pooled reference: one model trained centrally on the union of the clients' training
data, scored on the clients' own test sets.

It is **not federated learning and never a method**: it breaks, by definition, the rule that
a client's data stay on the client. It answers "what would the same model reach if the
hospitals pooled their data?", the upper reference of the FLamby protocol (Ogier du Terrail
et al., NeurIPS 2022 Datasets and Benchmarks: "pooled" training with the federation's number
of steps), beside the lower one, each client training alone (the ``solo`` plugin). It runs
with ``pooled=true`` (runspec ``pooled`` of ``fedkit compare``), on the local engine only
and without method plugins (:func:`fedkit_core.resolve.resolve_config` refuses the rest).

* **Same data, same test sets.** The federation is prepared as for any run of the seed (same
  partition), so each client's validation and test sets are exactly those a method of that
  seed is scored on; only who trains changes.
* **One central trainer** (:class:`PooledTrainer`, party ``pooled``) holds the union of the
  clients' training splits and trains the task's model with the run's loss, optimiser,
  learning-rate schedule, gradient clipping, precision and augmentation, as a client would.
* **The federation's number of steps.** Round r's budget is the number of optimisation
  steps FedAvg's clients sampled in round r make (:func:`round_steps`)::

      steps_r = local_epochs * sum_{k in S_r} batch_count(n_k, batch_size)

  ``S_r`` is the same client sample as a method's round r (``sample_fraction``, drawn from
  the seed), ``n_k`` client k's training samples and ``batch_count`` the batches of local
  training: ``ceil(n_k / B)``, less a trailing batch of a single sample, which local training
  drops (:func:`~fedkit_core.hooks.context.batch_count`). The trainer makes exactly
  ``steps_r`` steps on batches of ``batch_size`` samples of the shuffled union, pass after
  pass (each pass a fresh shuffle from the round's seed; the last one cut at the budget):
  about ``local_epochs`` epochs of the union per round, with up to one more step per sampled
  client and epoch (the clients' incomplete last batches). Steps that plugins add to local
  training (FedRep's head epochs, Ditto's personal model, FedBABU's fine-tuning) are not
  counted: the budget is FedAvg's.
* **Round by round, like the federation.** Each round starts from the previous round's
  model, at that round's learning rate; the optimiser state carries over only with
  ``keep_optimizer_state`` (as the clients'). Round 1 starts from the federation's initial
  global model of the seed.
* **Scored like a method.** Every client evaluates the model on its own validation and test
  sets, so the pooled run fills the same scopes (``global``: the pooled test set;
  ``clients``: each client's test set) and pairs with a method seed by seed.

Checkpoints and ``fedkit resume`` work as for any run: the trainer checkpoints itself as a
client does. Its results say what it is (``reference`` in ``results.json``). It runs in this
process: ``local.workers`` and ``eval_with_fit`` do not apply (the clients only evaluate).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from itertools import islice
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from fedkit_core.config import Config
from fedkit_core.contract.data import Batch, ClientData, Split
from fedkit_core.contract.messages import Message
from fedkit_core.contract.observer import Observer
from fedkit_core.devices import place_model
from fedkit_core.engines.checkpoint import ClientCheckpoints
from fedkit_core.engines.client import ClientRuntime
from fedkit_core.engines.driver import drive
from fedkit_core.engines.model import build_model
from fedkit_core.engines.server import Server, Transport
from fedkit_core.engines.shared import SharedModel
from fedkit_core.engines.workers import LocalTransport
from fedkit_core.errors import FedkitError
from fedkit_core.federation import prepare
from fedkit_core.hooks.context import ClientContext, batch_count, derive_seed
from fedkit_core.plugin_manager import PluginSet

if TYPE_CHECKING:
    from fedkit_core.results.schema import Results
    from fedkit_core.results.store import RunDir

#: the central trainer's party id (its checkpoint folder, its entry in a round's ``train``)
TRAINER = "pooled"
#: the fit message's scalar naming the round's step budget (and the trainer's reply's count)
STEPS = "steps"


def round_steps(
    sizes: Mapping[str, int], sampled: Iterable[str], batch_size: int, local_epochs: int
) -> int:
    """The optimisation steps FedAvg's ``sampled`` clients make in one round: each client
    ``local_epochs`` passes of ``batch_count(n_k, batch_size)`` batches over its ``n_k``
    training samples (``sizes``)."""
    return local_epochs * sum(batch_count(sizes[k], batch_size, augment=True) for k in sampled)


def pooled_data(clients: Mapping[str, ClientData]) -> ClientData:
    """The union of the clients' training splits (in client order) as one party's data, with
    the task's normaliser and augmentation; its own validation and test splits are empty
    (the clients score the model on theirs). Each client's training split becomes a view of
    the union (the same samples), so the training data are held once, not twice."""
    first = next(iter(clients.values()))
    train = Split.concat([data["train"] for data in clients.values()])
    bounds = np.cumsum([0, *(len(data["train"]) for data in clients.values())]).tolist()
    for data, start, stop in zip(clients.values(), bounds, bounds[1:]):
        data.splits["train"] = Split(train.images[start:stop], train.targets[start:stop])
    empty = train.subset(np.zeros(0, dtype=np.int64))
    splits = {"train": train, "val": empty, "test": empty}
    return ClientData(TRAINER, splits, first.num_classes, first.normalizer, first.augment)


class PooledTrainer(ClientRuntime):
    """The central party: a client whose data are the union of all clients' training
    splits and whose round makes the number of steps its fit message names."""

    steps = 0  # the steps made in the current round

    def train_passes(self, message: Message) -> Iterator[Iterable[Batch]]:
        """Passes over the shuffled union until the round's budget (:data:`STEPS`) is made."""
        self.steps = 0
        left = int(message.scalars[STEPS])
        size = self.ctx.config["batch_size"]
        per_pass = batch_count(len(self.ctx.data["train"]), size, augment=True)
        while left > 0:
            take = min(left, per_pass)
            yield self._counted(islice(self.ctx.batches("train", shuffle=True, augment=True), take))
            left -= take

    def _counted(self, batches: Iterable[Batch]) -> Iterator[Batch]:
        for batch in batches:
            self.steps += 1
            yield batch

    def _fit(self, message: Message, payload: Message) -> Message:
        """Local training on the union; the reply also says how many steps were made."""
        reply = super()._fit(message, payload)
        return Message(reply.kind, reply.arrays, {**reply.scalars, STEPS: self.steps})


class PooledServer(Server):
    """The server of the pooled reference: every round, one fit message to the trainer with
    the step budget of the clients a federation would sample (:func:`round_steps`); the
    clients only evaluate. ``sizes``: each client's training samples (a centralised setting
    knows them)."""

    def __init__(self, *args: Any, sizes: Mapping[str, int], **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.sizes = dict(sizes)
        # evaluation cannot travel with fit messages: the clients receive none
        self.evaluation.with_fit = False

    def setup_clients(self, transport: Transport, ids: Iterable[str]) -> None:
        """The clients, which only evaluate, as in every run; then the trainer."""
        super().setup_clients(transport, ids)
        replies = self.exchange.send(transport, {TRAINER: Message("setup", self.ctx.priors)})
        self.exchange.failures("setup", 0, replies, required=1)

    def fit_messages(self, sampled: Sequence[str], rnd: int) -> dict[str, Message]:
        message = self.fit_message(TRAINER, rnd)
        cfg = self.config
        steps = round_steps(self.sizes, sampled, cfg["batch_size"], cfg["local_epochs"])
        return {TRAINER: Message("fit", message.arrays, {**message.scalars, STEPS: steps})}


def execute_pooled(
    cfg: Config,
    plugins: PluginSet,
    run_dir: RunDir | None,
    observer: Observer,
    resume: bool,
) -> Results:
    """Run the pooled reference of ``cfg`` in this process (what the local engine does
    with ``pooled=true``): the trainer and the clients as parties of one transport."""
    started = time.perf_counter()
    fed = prepare(cfg, plugins)
    if TRAINER in fed.clients:
        raise FedkitError(
            f"a client of this task is called {TRAINER!r}, the name of the pooled reference's "
            "trainer; the pooled reference cannot run on it"
        )
    sizes = {cid: len(data["train"]) for cid, data in fed.clients.items()}
    union = pooled_data(fed.clients)  # before the clients are placed: one copy of the data
    server = PooledServer(cfg, plugins, fed.task, fed.device, observer, sizes=sizes)
    # the clients only evaluate the global model: one model serves them all
    torch.manual_seed(derive_seed(cfg["seed"], "model", "clients"))
    model = build_model(plugins, ClientContext(fed.task, cfg, fed.device))
    shared = SharedModel(place_model(model, fed.device, cfg["channels_last"]))
    parties: dict[str, ClientRuntime] = {
        cid: ClientRuntime(cid, fed.client_data(cid), fed.task, cfg, plugins, fed.device, shared)
        for cid in fed.clients
    }
    trainer = PooledTrainer(TRAINER, fed.placement.place(union), fed.task, cfg, plugins, fed.device)
    parties[TRAINER] = trainer
    stores = None
    if run_dir is not None and cfg["checkpoint"]:
        stores = {cid: ClientCheckpoints.of(run_dir.checkpoint, cid) for cid in parties}
    transport = LocalTransport(parties, observer, stores)
    return drive(server, transport, fed.clients, plugins, run_dir, resume=resume, started=started)
