"""The client side of the protocol: one object per client, driven only by messages.

Every engine delivers the same four messages (``setup``, ``fit``, ``query``, ``evaluate``)
and gets the same replies, so plugins behave identically in-process and on Flower. The
client's persistent state (private model entries, optimiser state, plugin state) is
exported by :meth:`ClientRuntime.state_dict` for checkpoints and Flower's client context.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from typing import Any

import torch
import torch.nn.functional as F

from fedkit_core.config import Config
from fedkit_core.engines.context import ClientContext, ModelContext, derive_seed
from fedkit_core.errors import FedkitError
from fedkit_core.messages import Message, Reply, check_arrays, check_scalars
from fedkit_core.metrics.segmentation import per_sample_dice
from fedkit_core.models.fedmodel import FedModel
from fedkit_core.plugins import PluginSet
from fedkit_core.tasks.base import SEGMENTATION, ClientData, TaskInfo


def build_model(plugins: PluginSet, ctx: ModelContext) -> FedModel:
    """The model for one role: the firstresult builder, then every plugin's extension."""
    model = plugins.hook.fedkit_build_model(ctx=ctx)
    if not isinstance(model, FedModel):
        raise FedkitError(f"fedkit_build_model returned {type(model).__name__}, not a FedModel")
    plugins.hook.fedkit_extend_model(model=model, ctx=ctx)
    return model


def make_optimizer(params: list[torch.nn.Parameter], config: Config) -> torch.optim.Optimizer:
    kind, lr, wd = config["optimizer"], config["lr"], config["weight_decay"]
    if kind == "sgd":
        return torch.optim.SGD(params, lr=lr, momentum=config["momentum"], weight_decay=wd)
    cls = torch.optim.Adam if kind == "adam" else torch.optim.AdamW
    return cls(params, lr=lr, betas=tuple(config["adam_betas"]), weight_decay=wd)


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
    ):
        self.plugins = plugins
        self.ctx = ClientContext(client_id, task, config, data, device)
        self.optimizer: torch.optim.Optimizer | None = None
        self.dirty = False  # persistent state changed since the last state_dict()

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
        """Receive the server priors; build client priors and the model (once)."""
        ctx = self.ctx
        ctx.priors = dict(message.arrays)
        for priors in self.hook.fedkit_client_priors(client=ctx):
            ctx.priors.update(priors or {})
        torch.manual_seed(derive_seed(ctx.config["seed"], "model", ctx.id))
        model_ctx = ModelContext(ctx.task, ctx.config, ctx.id, ctx.priors)
        ctx.model = build_model(self.plugins, model_ctx).to(ctx.device)
        return Message("setup")

    # ------------------------------------------------------------------ fit

    def fit(self, message: Message) -> Message:
        """Load the global arrays, train locally, return the shared arrays and scalars."""
        ctx, model = self.ctx, self.ctx.model
        round_, lr = int(message.scalars["round"]), float(message.scalars["lr"])
        ctx.seed_round(round_)
        model.load_shared(message.arrays)
        self.hook.fedkit_round_start(client=ctx)
        optimizer = self._optimizer(lr)
        clip = ctx.config["grad_clip"]
        params = [p for p in model.parameters() if p.requires_grad]
        sums: dict[str, torch.Tensor] = defaultdict(lambda: torch.zeros((), device=ctx.device))
        steps = 0
        model.train()
        for epoch in range(ctx.config["local_epochs"]):
            for batch in ctx.batches("train", shuffle=True, augment=True):
                outputs = model(batch.x)
                terms = {
                    "task": self.hook.fedkit_task_loss(client=ctx, batch=batch, outputs=outputs)
                }
                for extra in self.hook.fedkit_loss_terms(client=ctx, batch=batch, outputs=outputs):
                    terms.update(extra or {})
                loss = torch.stack([t.reshape(()) for t in terms.values()]).sum()
                optimizer.zero_grad(set_to_none=True)
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
        if not self.ctx.config["keep_optimizer_state"]:
            self.optimizer = None
        scalars: dict[str, Any] = {"num_examples": len(ctx.data["train"])}
        scalars.update({k: float(v) / max(steps, 1) for k, v in sums.items()})
        for extra in self.hook.fedkit_client_report(client=ctx):
            scalars.update(extra or {})
        self.dirty = True
        return Message(
            "fit", model.shared_state(), check_scalars(scalars, f"client {ctx.id} report")
        )

    def _optimizer(self, lr: float) -> torch.optim.Optimizer:
        if self.optimizer is None:
            params = [p for p in self.ctx.model.parameters() if p.requires_grad]
            self.optimizer = make_optimizer(params, self.ctx.config)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        return self.optimizer

    # ------------------------------------------------------------------ query

    def query(self, message: Message) -> Message:
        """An extra round trip during aggregation, answered by the plugin that asked."""
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
        """Predictions of the global model (and of the client's personal output, if a plugin
        names one) on the requested splits, as arrays ``<split>/<view>/<probs|dice>``."""
        ctx, model = self.ctx, self.ctx.model
        model.load_shared(message.arrays)
        personal = self.hook.fedkit_personal_output(client=ctx)
        views = {"global": "logits"} | ({"personal": personal} if personal else {})
        segmentation = ctx.task.kind == SEGMENTATION
        arrays: dict[str, torch.Tensor] = {}
        model.eval()
        with torch.inference_mode():
            for split in str(message.scalars["splits"]).split(","):
                chunks: dict[str, list[torch.Tensor]] = defaultdict(list)
                for batch in ctx.batches(split, batch_size=ctx.config["eval_batch_size"]):
                    outputs = model(batch.x)
                    for view, key in views.items():
                        if key not in outputs:
                            raise FedkitError(f"the model has no output {key!r} to evaluate")
                        out = outputs[key]
                        if segmentation:
                            chunks[view].append(
                                per_sample_dice(out, batch.y, ctx.task.num_classes).cpu()
                            )
                        else:
                            chunks[view].append(F.softmax(out.float(), dim=1).cpu())
                    if not segmentation:
                        chunks["labels"].append(batch.y.cpu())
                for view, parts in chunks.items():
                    name = (
                        f"{split}/labels"
                        if view == "labels"
                        else (f"{split}/{view}/{'dice' if segmentation else 'probs'}")
                    )
                    arrays[name] = torch.cat(parts)
        return Message("evaluate", arrays, {"num_examples": len(ctx.data["test"])})

    # ------------------------------------------------------------------ persistence

    def state_dict(self) -> dict[str, Any]:
        """The client's persistent state: private model entries, optimiser, plugin state."""
        self.dirty = False
        return {
            "private": self.ctx.model.private_state(),
            "optimizer": self.optimizer.state_dict() if self.optimizer is not None else None,
            "plugins": self.ctx.state,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.ctx.model.load_private(state["private"])
        self.ctx.state = dict(state["plugins"])
        if state["optimizer"] is not None:
            self._optimizer(self.ctx.config["lr"]).load_state_dict(state["optimizer"])
