"""The client side of the protocol: one object per client, driven only by messages.

Every engine delivers the same four messages (``setup``, ``fit``, ``query``, ``evaluate``)
and gets the same replies, so plugins behave identically in-process and on Flower. The
client's persistent state (private model entries, optimiser state, plugin state) is
exported by :meth:`ClientRuntime.state_dict` for checkpoints and Flower's node state.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F

from fedkit_core.allocator import keep_freed_memory
from fedkit_core.config import Config
from fedkit_core.contract.channels import reserved
from fedkit_core.contract.context import ClientContext, derive_seed
from fedkit_core.contract.data import SEGMENTATION, Batch, ClientData, TaskInfo
from fedkit_core.contract.messages import (
    Message,
    Payload,
    Reply,
    check_arrays,
    check_scalars,
    enclose,
    take_out,
)
from fedkit_core.contract.protocol import CLASS_COUNTS, EVALUATION, PAYLOAD
from fedkit_core.devices import input_layout, joined, place_model
from fedkit_core.engines.model import build_model
from fedkit_core.engines.trunk import OFF, TrunkCache, cache_mode
from fedkit_core.errors import FedkitError
from fedkit_core.metrics.segmentation import per_sample_dice
from fedkit_core.metrics.statistics import classification_stats, segmentation_stats
from fedkit_core.models.fedmodel import FedModel
from fedkit_core.plugin_manager import PluginSet
from fedkit_core.privacy.checks import declared_channels
from fedkit_core.privacy.layer import client_reply, is_private, privatised_channels
from fedkit_core.privacy.sample_level import DPSGD

if TYPE_CHECKING:
    from fedkit_core.engines.pool import ModelPool


def merged_views(results: list[Mapping[str, str | None] | None]) -> dict[str, str]:
    """The evaluation views of one client: plugins' entries win over the built-in's (which
    come last), and a view mapped to ``None`` is dropped."""
    views: dict[str, str | None] = {}
    for part in reversed(results):
        views.update(part or {})
    return {name: output for name, output in views.items() if output is not None}


class ClientRuntime:
    """A client: its data and context, answering the server's messages."""

    def __init__(
        self,
        client_id: str,
        data: ClientData,
        task: TaskInfo,
        config: Config,
        plugins: PluginSet,
        device: torch.device,
        shared: SharedModel | None = None,
        pool: ModelPool | None = None,
    ):
        """``shared``: a model this client shares with others instead of building its own
        (see :func:`fedkit_core.engines.local.shared_model`); ``pool``: the live models of
        this client's process, when the client builds its model only when a message needs
        it and may idle as its snapshot (``local.live_models``, see
        :mod:`fedkit_core.engines.pool`); else it builds its model at set-up and keeps it.

        The process that holds clients trains them: its freed memory is kept for the next
        step (:func:`~fedkit_core.allocator.keep_freed_memory`, once per process)."""
        keep_freed_memory()
        self.plugins = plugins
        self.shared = shared
        self.pool = pool
        self.ctx = ClientContext(
            task, config, device, client_id=client_id, data=data, info=data.info()
        )
        self.ctx.hook = plugins.hook
        self.optimizer: torch.optim.Optimizer | None = None
        self.dirty = False  # persistent state changed since the last state_dict()
        #: plugin scalars a private run may send (channels declared as privatised)
        self.privatised = (
            privatised_channels(declared_channels(plugins, self.ctx)) if is_private(config) else []
        )
        self.set_up = False  # whether the setup message succeeded
        mode = cache_mode(config, plugins)
        #: the frozen-trunk cache (``freeze_cache``), which ctx.data then holds
        self.trunk = TrunkCache(data, config, device, mode) if mode != OFF else None

    @property
    def id(self) -> str:
        return self.ctx.id

    @property
    def hook(self) -> Any:
        return self.plugins.hook

    def handle(self, message: Message) -> Message:
        handler = {
            "setup": self.setup,
            "fit": self.fit,
            "query": self.query,
            "evaluate": self.evaluate,
        }
        if message.kind not in handler:
            raise ValueError(f"unknown message kind {message.kind!r}")
        return handler[message.kind](message)

    # ------------------------------------------------------------------ setup

    def setup(self, message: Message) -> Message:
        """Receive the server priors; build client priors and the model (once). The reply
        carries the client's class counts only when the run's shot groups need them."""
        ctx = self.ctx
        ctx.priors = dict(message.arrays)
        for priors in self.hook.fedkit_client_priors(client=ctx):
            ctx.priors.update(priors or {})
        self.set_up = False
        if self.shared is not None:
            ctx.model = self.shared.model
            self.shared.join(self)
        elif self.pool is not None:  # built by the first message that needs it
            self.pool.drop(self)
        else:
            ctx.model = self.new_model()
        self.frozen_inputs()
        self.set_up = True
        if ctx.config["task.shot_thresholds"]:
            return Message("setup", {CLASS_COUNTS: torch.tensor(ctx.info.class_counts)})
        return Message("setup")

    def new_model(self) -> FedModel:
        """This client's model as built at set-up (seeded per client: the same model
        whenever it is built)."""
        ctx = self.ctx
        torch.manual_seed(derive_seed(ctx.config["seed"], "model", ctx.id))
        return place_model(build_model(self.plugins, ctx), ctx.device, ctx.config["channels_last"])

    def live(self) -> None:
        """Make sure this client's model is built and holds its state (a client with a
        ``pool`` builds it when first needed and may have gone idle since)."""
        if self.pool is not None:
            self.pool.take(self)
            self.frozen_inputs()

    def frozen_inputs(self) -> None:
        """With the frozen-trunk cache, point ``ctx.data`` at this client's data as the
        model takes them (:meth:`TrunkCache.data_for`); call after the model's state may
        have changed."""
        if self.trunk is not None and self.ctx.model is not None:
            self.ctx.data = self.trunk.data_for(self.ctx.model)

    # ------------------------------------------------------------------ fit

    def fit(self, message: Message) -> Message:
        """Load the global arrays, train locally, return the shared arrays and scalars. A
        previous round's evaluation sent along (:data:`EVALUATION`, of the global arrays
        this message carries) is done first and its reply goes back with the fit's."""
        message, evaluation = take_out(message, EVALUATION, "evaluate")
        # the global arrays and the round's settings; the plugins' entries
        message, payload = take_out(message, PAYLOAD, "fit")
        if not evaluation.scalars:
            return self._fit(message, payload)
        scored = self.evaluate(Message("evaluate", message.arrays, evaluation.scalars))
        return enclose(self._fit(message, payload), scored, EVALUATION)

    def _fit(self, message: Message, payload: Message) -> Message:
        self.live()
        ctx, model = self.ctx, self.ctx.model
        round_, lr = int(message.scalars["round"]), float(message.scalars["lr"])
        trip = message.scalars.get("trip")  # asynchronous aggregation's dispatches
        ctx.seed_round(round_, None if trip is None else int(trip))
        ctx.lr = lr
        ctx.scratches.clear()
        ctx.received = Payload(payload.arrays, payload.scalars)
        model.load_shared(message.arrays)
        self.frozen_inputs()
        self.hook.fedkit_round_start(client=ctx)
        optimizer = self._optimizer(lr)
        clip = ctx.config["grad_clip"]
        params = [p for p in model.parameters() if p.requires_grad]
        sums: dict[str, torch.Tensor] = defaultdict(lambda: torch.zeros((), device=ctx.device))
        model.train()
        # dp.level=sample: DP-SGD's Poisson batches (every epoch's) and clipping optimiser
        dpsgd = DPSGD(ctx, optimizer) if ctx.config["dp.level"] == "sample" else None
        if dpsgd is not None:
            optimizer = dpsgd.optimizer
        passes = [dpsgd.batches()] if dpsgd is not None else self.train_passes(message)
        try:
            self._train(ctx, model, optimizer, params, clip, sums, passes, round_, dpsgd)
        finally:
            if dpsgd is not None:
                dpsgd.__exit__()
        if not self.ctx.config["keep_optimizer_state"]:
            self.optimizer = None
        scalars: dict[str, Any] = {"num_examples": len(ctx.data["train"])}
        steps = int(sums.pop("steps", torch.zeros(())))
        scalars.update({k: float(v) / max(steps, 1) for k, v in sums.items()})
        sent = Payload()
        reported: dict[str, Any] = {}
        for extra in self.hook.fedkit_client_report(client=ctx):
            if isinstance(extra, Payload):
                sent.merge(extra, "fedkit_client_report")
            else:
                reported.update(extra or {})
        reported.update(sent.scalars)
        problem = reserved(reported, f"a plugin of client {ctx.id!r}")
        if problem:
            raise FedkitError(problem)
        scalars.update(reported)
        extras = check_arrays(sent.arrays, f"client {ctx.id} report")
        self.dirty = True
        arrays = model.shared_state()
        if is_private(ctx.config):
            if extras:  # DP and SecAgg+ protect the model's update, not a plugin's arrays
                raise FedkitError(
                    f"a plugin sends arrays up with the update ({', '.join(sorted(extras))}), "
                    "which differential privacy and secure aggregation do not cover; run it "
                    "without dp.* and secagg.enabled"
                )
            if dpsgd is not None:
                scalars.update(dpsgd.report())
            arrays, scalars = client_reply(
                ctx.config,
                message.arrays,
                arrays,
                {**scalars, **{k: v for k, v in message.scalars.items() if k == "dp.clip"}},
                self.privatised,
                f"client {ctx.id!r}",
            )
        arrays = {**arrays, **{PAYLOAD + k: v for k, v in extras.items()}}
        return Message("fit", arrays, check_scalars(scalars, f"client {ctx.id} report"))

    def _train(
        self,
        ctx: ClientContext,
        model: FedModel,
        optimizer: torch.optim.Optimizer,
        params: list[torch.nn.Parameter],
        clip: float | None,
        sums: dict[str, torch.Tensor],
        passes: Iterable[Iterable[Batch | None]],
        round_: int,
        dpsgd: DPSGD | None,
    ) -> None:
        """Local training over ``passes`` (:meth:`train_passes`; DP-SGD: its Poisson
        batches), the loss terms summed per step into ``sums`` (with the number of
        ``steps``)."""
        steps = 0
        for epoch, batches in enumerate(passes):
            for batch in batches:
                if batch is None:  # an empty Poisson sample: DP-SGD's step of noise alone
                    dpsgd.empty_step()
                    steps += 1
                    continue
                outputs = ctx.forward(model, batch.x)
                terms = {"task": ctx.task_loss(batch, outputs)}
                for extra in self.hook.fedkit_loss_terms(client=ctx, batch=batch, outputs=outputs):
                    terms.update(extra or {})
                values = [t.reshape(()) for t in terms.values()]
                loss = values[0] if len(values) == 1 else torch.stack(values).sum()
                optimizer.zero_grad(set_to_none=True)
                if dpsgd is not None:  # DP-SGD clips each sample's gradient (not grad_clip)
                    dpsgd.backward(terms, batch, outputs)
                else:
                    loss.backward()
                    if clip:
                        torch.nn.utils.clip_grad_norm_(params, clip)
                optimizer.step()
                steps += 1
                sums["loss"] += loss.detach()
                for name, term in terms.items():
                    sums[f"loss.{name}"] += term.detach()
            if not torch.isfinite(sums["loss"]):
                raise FedkitError(
                    f"client {ctx.id!r}: the training loss became {sums['loss'].item()} in round "
                    f"{round_}, epoch {epoch + 1}; lower the learning rate or check the data"
                )
        sums["steps"] = torch.tensor(steps)

    def train_passes(self, message: Message) -> Iterator[Iterable[Batch]]:
        """The batches of one round's local training, pass by pass: ``local_epochs``
        shuffled, augmented epochs over the client's training split (the pooled reference's
        trainer draws another number of steps, see :mod:`fedkit_core.engines.pooled`)."""
        for _ in range(self.ctx.config["local_epochs"]):
            yield self.ctx.batches("train", shuffle=True, augment=True)

    def _optimizer(self, lr: float) -> torch.optim.Optimizer:
        """The client's optimiser (built once, or every round unless its state is kept),
        with every group's learning rate set for this round."""
        if self.optimizer is None:
            self.optimizer = self._build_optimizer(lr)
        for group in self.optimizer.param_groups:
            group["lr"] = lr * group.get("lr_scale", 1.0)
        return self.optimizer

    def _build_optimizer(self, lr: float) -> torch.optim.Optimizer:
        ctx = self.ctx
        groups: list[dict[str, Any]] = []
        claimed: set[int] = set()
        for part in self.hook.fedkit_param_groups(client=ctx):
            for group in part or ():
                group = dict(group)
                group["params"] = [p for p in group["params"] if p.requires_grad]
                group.setdefault("lr_scale", 1.0)
                group["lr"] = lr * group["lr_scale"]
                overlap = claimed & {id(p) for p in group["params"]}
                if overlap:
                    raise FedkitError(
                        "a parameter is in two optimiser groups (fedkit_param_groups)"
                    )
                claimed |= {id(p) for p in group["params"]}
                groups.append(group)
        rest = [p for p in ctx.model.parameters() if p.requires_grad and id(p) not in claimed]
        groups.insert(0, {"params": rest, "lr": lr, "lr_scale": 1.0})
        groups = [g for g in groups if g["params"]]
        optimizer = self.hook.fedkit_optimizer(client=ctx, param_groups=groups)
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise FedkitError(
                f"fedkit_optimizer returned {type(optimizer).__name__}, not a torch optimiser"
            )
        return optimizer

    # ------------------------------------------------------------------ query

    def query(self, message: Message) -> Message:
        """An extra round trip during aggregation, answered by the plugin that asked."""
        self.live()
        scalars = dict(message.scalars)
        name = str(scalars.pop("query"))
        reply = self.hook.fedkit_answer_query(
            client=self.ctx, query=name, arrays=message.arrays, scalars=scalars
        )
        if not isinstance(reply, Reply):
            raise FedkitError(f"no active plugin answers the query {name!r}")
        self.dirty = True
        return Message(
            "query",
            check_arrays(reply.arrays, f"reply to {name}"),
            check_scalars(reply.scalars, f"reply to {name}"),
        )

    # ------------------------------------------------------------------ evaluate

    def evaluate(self, message: Message) -> Message:
        """Evaluate every view on the requested splits.

        ``mode=pooled``: predictions go up (``<split>/<view>/probs`` or ``.../dice`` and
        ``<split>/labels``); ``mode=federated``: only sufficient statistics
        (``<split>/<view>/<statistic>``). The scalar ``view`` names the view that scores
        this client.
        """
        ctx = self.ctx
        self.live()
        ctx.round = int(message.scalars.get("round", ctx.round))
        if self.shared is not None:
            return self.shared.evaluate(self, message)
        ctx.model.load_shared(message.arrays)
        self.frozen_inputs()
        views, served = self.views()
        chunks: dict[str, dict[str, list[torch.Tensor]]] = {}
        ctx.model.eval()
        with torch.inference_mode():
            for split in str(message.scalars["splits"]).split(","):
                chunks[split] = defaultdict(list)
                batches = ctx.batches(split, batch_size=ctx.config["eval_batch_size"])
                for batch in batches:
                    for name, values in _scored(ctx, views, batch).items():
                        chunks[split][name].append(values)
        return self.evaluation_reply(message, views, served, chunks)

    def views(self) -> tuple[dict[str, str], str]:
        """The views this client evaluates (``{view: model output}``) and the one that
        scores it."""
        views = merged_views(self.hook.fedkit_eval_views(client=self.ctx))
        served = self.hook.fedkit_client_view(client=self.ctx) or "global"
        if served not in views:
            raise FedkitError(
                f"client {self.id!r} is scored with the view {served!r}, which no plugin "
                f"evaluates (views: {', '.join(views) or 'none'})"
            )
        return views, served

    def evaluation_reply(
        self,
        message: Message,
        views: Mapping[str, str],
        served: str,
        chunks: Mapping[str, Mapping[str, list[torch.Tensor]]],
    ) -> Message:
        """The reply to ``message`` from the per-split scored ``chunks`` (see
        :func:`_scored`) of this client's samples, in order."""
        federated = message.scalars.get("mode") == "federated"
        arrays: dict[str, torch.Tensor] = {}
        for split, parts in chunks.items():
            arrays.update(self._evaluation_arrays(split, parts, views, federated))
        return Message("evaluate", arrays, {"view": served})

    def _evaluation_arrays(
        self,
        split: str,
        chunks: Mapping[str, list[torch.Tensor]],
        views: Mapping[str, str],
        federated: bool,
    ) -> dict[str, torch.Tensor]:
        segmentation = self.ctx.task.kind == SEGMENTATION
        num_classes = self.ctx.task.num_classes
        out: dict[str, torch.Tensor] = {}
        labels = None
        if not segmentation:  # an empty split (a client with few samples) has no batches
            labels = torch.cat(chunks.get("labels") or [torch.zeros(0, dtype=torch.long)])
        if labels is not None and not federated:
            out[f"{split}/labels"] = labels
        for view in views:
            values = (
                torch.cat(chunks[view])
                if chunks.get(view)
                else torch.zeros(0, num_classes, dtype=torch.float32)
            )
            if not federated:
                out[f"{split}/{view}/{'dice' if segmentation else 'probs'}"] = values
                continue
            if segmentation:
                stats = segmentation_stats(values.numpy())
            else:
                stats = classification_stats(
                    values.numpy(), labels.numpy(), self.ctx.config["evaluation_bins"]
                )
            for name, value in stats.items():
                out[f"{split}/{view}/{name}"] = torch.as_tensor(value)
        return out

    # ------------------------------------------------------------------ persistence

    def state_dict(self) -> dict[str, Any]:
        """The client's persistent state: private model entries, optimiser, plugin state,
        the current round's plugin scratch (needed by queries after a fit), and which
        parameters train (a kept optimiser holds those: FedRep freezes its head)."""
        self.live()
        self.dirty = False
        return {
            "private": self.ctx.model.private_state(),
            "optimizer": self.optimizer.state_dict() if self.optimizer is not None else None,
            "plugins": self.ctx.states,
            "scratch": self.ctx.scratches,
            "trainable": {n: p.requires_grad for n, p in self.ctx.model.named_parameters()},
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.live()
        model = self.ctx.model
        model.load_private(state["private"])
        self.frozen_inputs()
        for name, param in model.named_parameters():  # before the optimiser is rebuilt
            param.requires_grad_(state.get("trainable", {}).get(name, param.requires_grad))
        self.ctx.states = {k: dict(v) for k, v in state["plugins"].items()}
        self.ctx.scratches = {k: dict(v) for k, v in state.get("scratch", {}).items()}
        if state["optimizer"] is not None:
            self._optimizer(self.ctx.config["lr"]).load_state_dict(state["optimizer"])


def _scored(ctx: ClientContext, views: Mapping[str, str], batch: Batch) -> dict[str, torch.Tensor]:
    """One evaluation batch scored per view (class probabilities, or per-sample Dice for
    segmentation), plus its labels (classification), on the CPU."""
    outputs = ctx.forward(ctx.model, batch.x)
    segmentation = ctx.task.kind == SEGMENTATION
    out: dict[str, torch.Tensor] = {}
    for view, key in views.items():
        if key not in outputs:
            raise FedkitError(f"the model has no output {key!r} to evaluate")
        if segmentation:
            out[view] = per_sample_dice(outputs[key], batch.y, ctx.task.num_classes).cpu()
        else:
            out[view] = F.softmax(outputs[key].float(), dim=1).cpu()
    if not segmentation:
        out["labels"] = batch.y.cpu()
    return out


class SharedModel:
    """One model that the clients of a process take turns with (see
    :func:`fedkit_core.engines.local.shared_model`), and their evaluation done together.

    An ``evaluate`` message to one member evaluates every member at once, in batches of
    ``eval_batch_size`` samples that run across clients, and keeps the other members'
    replies until they are asked with the same message: a thousand clients of a few samples
    each cost a few full batches instead of thousands of tiny ones (whose fixed cost per
    forward pass dominates). The scores are those of per-client evaluation up to the
    rounding of the convolution kernels, whose summation order can depend on the batch
    size (probabilities agree to ~1e-7, as between the local and Flower engines).
    """

    def __init__(self, model: FedModel):
        self.model = model
        #: the set-up clients using the model in this process, in set-up order
        self.members: dict[str, ClientRuntime] = {}
        self._asked: Message | None = None
        self._replies: dict[str, Message] = {}

    def join(self, client: ClientRuntime) -> None:
        self.members[client.id] = client

    def evaluate(self, client: ClientRuntime, message: Message) -> Message:
        """``client``'s reply to ``message``: kept from the members' joint evaluation of
        the same message, or from evaluating every member now."""
        reply = self._replies.pop(client.id, None)
        if reply is None or not _same(self._asked, message):
            self._replies = self._evaluate_all(message)
            self._asked = message
            reply = self._replies.pop(client.id)
        return reply

    def _evaluate_all(self, message: Message) -> dict[str, Message]:
        """Every member's reply to ``message``. Without plugins (the only case a model is
        shared) every member evaluates the same views, those of the built-in."""
        members = list(self.members.values())
        first = members[0]
        views, served = first.views()  # the built-in's, the same for every member
        self.model.load_shared(message.arrays)
        for member in members:
            member.frozen_inputs()
        self.model.eval()
        chunks: dict[str, dict[str, dict[str, list[torch.Tensor]]]] = {m.id: {} for m in members}
        with torch.inference_mode():
            for split in str(message.scalars["splits"]).split(","):
                parts: dict[str, list[torch.Tensor]] = defaultdict(list)
                for batch in _joint_batches(members, split):
                    for name, values in _scored(first.ctx, views, batch).items():
                        parts[name].append(values)
                whole = {name: torch.cat(values) for name, values in parts.items()}
                offset = 0
                for member in members:
                    n = len(member.ctx.data[split])
                    sliced = {name: [v[offset : offset + n]] for name, v in whole.items()}
                    chunks[member.id][split] = sliced if n else {}
                    offset += n
        return {m.id: m.evaluation_reply(message, views, served, chunks[m.id]) for m in members}


def _joint_batches(members: list[ClientRuntime], split: str) -> Iterator[Batch]:
    """Batches of ``eval_batch_size`` samples running through the members' ``split`` in
    member order (the members' data come from one task: one normaliser), as
    :meth:`ClientContext.batches` makes them."""
    ctx = members[0].ctx
    size = ctx.config["eval_batch_size"]
    images: list[torch.Tensor] = []
    targets: list[torch.Tensor] = []

    def batch() -> Batch:
        x = input_layout(
            ctx.data.normalizer(joined(images, ctx.device)), ctx.config["channels_last"]
        )
        y = joined(targets, ctx.device).long()
        return Batch(x, y, torch.arange(len(y)))

    filled = 0
    for member in members:
        data, done = member.ctx.data[split], 0
        while done < len(data):
            take = min(size - filled, len(data) - done)
            images.append(data.images[done : done + take])
            targets.append(data.targets[done : done + take])
            filled, done = filled + take, done + take
            if filled == size:
                yield batch()
                images, targets, filled = [], [], 0
    if filled:
        yield batch()


def _same(asked: Message | None, message: Message) -> bool:
    """Whether ``message`` asks what ``asked`` asked (the same object, or equal contents)."""
    if asked is None:
        return False
    if asked is message:
        return True
    return (
        asked.scalars == message.scalars
        and asked.arrays.keys() == message.arrays.keys()
        and all(torch.equal(asked.arrays[k], message.arrays[k]) for k in asked.arrays)
    )
