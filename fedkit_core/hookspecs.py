"""The fedkit hook contract: every hook a method plugin may implement.

A plugin is a module or object with functions named after the hooks below and decorated
with :data:`fedkit_core.hookimpl`. It only implements the hooks it needs. The core's own
behaviour (FedAvg, the CE/BSM/Dice losses, the standard metrics, model building) is made of
plugins implementing these same hooks, so a third-party plugin can replace or extend any of it.

One round, in the order the hooks are called (see ``docs/architecture.md`` for a diagram)::

    once     server: fedkit_options, fedkit_check, fedkit_server_priors,
                     fedkit_build_model + fedkit_extend_model (the global model)
             client: fedkit_client_priors, fedkit_build_model + fedkit_extend_model
    round    client: (global arrays loaded) fedkit_round_start
                     per batch: fedkit_task_loss + fedkit_loss_terms
                     fedkit_client_report            -> arrays + scalars go up
             server: fedkit_aggregate (may ask clients: fedkit_answer_query)
    evaluate client: fedkit_personal_output          -> prediction arrays go up
             server: fedkit_metrics, fedkit_summary

The contract is engine-agnostic: client and server never share objects. Only named arrays
(``dict[str, torch.Tensor]``) and plain scalars (``int``, ``float``, ``str``, ``bool``) cross
between them, so the same plugin runs in fedkit's in-process engine and on Flower.

Hook kinds:

* **additive**: every active plugin's result is used (dicts are merged, ``None`` is skipped).
* **firstresult**: the first non-``None`` result wins; built-ins run last, so a plugin that
  returns ``None`` falls back to the built-in behaviour. These hooks are *exclusive*: if two
  active non-built-in plugins implement one, fedkit reports the conflict instead of picking.

Bump :data:`API_VERSION` on any incompatible change; a plugin may declare the version it was
written for as a module/object attribute ``fedkit_api``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import pluggy

if TYPE_CHECKING:
    import torch

    from fedkit_core.config import Config
    from fedkit_core.engines.context import ClientContext, ModelContext, ServerContext
    from fedkit_core.messages import Reply, Scalar, Update
    from fedkit_core.models.fedmodel import FedModel
    from fedkit_core.options import Option
    from fedkit_core.tasks.base import Batch, TaskInfo

API_VERSION = 1

hookspec = pluggy.HookspecMarker("fedkit")
hookimpl = pluggy.HookimplMarker("fedkit")

#: Hooks where only one (non-built-in) plugin may provide the behaviour.
EXCLUSIVE_HOOKS = (
    "fedkit_build_model",
    "fedkit_task_loss",
    "fedkit_aggregate",
    "fedkit_personal_output",
)

Ask = Callable[..., "dict[str, Reply]"]


# --------------------------------------------------------------------------- declarations


@hookspec
def fedkit_options() -> Sequence[Option]:
    """Declare the plugin's typed config options. Additive; called once when the run is built.

    Return a list of :class:`fedkit_core.Option`. fedkit namespaces them under the plugin's
    name: option ``lambda_f`` of plugin ``fed-mas`` is set with ``--set fed-mas.lambda_f=3``
    and read with ``config.section("fed-mas")["lambda_f"]``. Values are type-checked and the
    defaults appear in the saved config.
    """


@hookspec
def fedkit_check(task: TaskInfo, config: Config) -> str | Sequence[str] | None:
    """Refuse a run the plugin cannot serve. Additive; called once, before any data moves.

    ``task`` describes the task (kind, classes, clients); ``config`` is the resolved config.
    Return ``None`` when the run is fine, or one message (or several) saying what is wrong,
    e.g. ``"fca needs a classification task, not segmentation"``. The run then stops with
    exit code 2 and these messages.
    """


# --------------------------------------------------------------------------- priors


@hookspec
def fedkit_server_priors(task: TaskInfo, config: Config) -> Mapping[str, torch.Tensor] | None:
    """Build server-side knowledge once, before training. Additive; called once on the server.

    For knowledge that is computed centrally and never trained: text-embedding statistics
    of the class names (FedCB), foundation-model probabilities on public data (FedHelp).
    Return named tensors; prefix the names with the plugin's name (``"fedcb.mu"``). They are
    sent to every client once and appear in ``ModelContext.priors`` and ``ClientContext.priors``.
    """


@hookspec
def fedkit_client_priors(client: ClientContext) -> Mapping[str, Any] | None:
    """Build client-side knowledge once per client, before training. Additive.

    For frozen objects that live on the client and are never trained or communicated: a
    pretrained self-supervised encoder (Fed-MAS), a public data set (FedHelp). Return a dict
    of anything (modules, tensors); it is merged into ``client.priors`` and is not
    checkpointed, so it must be rebuilt identically on resume (load from files, no randomness).
    The server priors are already in ``client.priors`` when this is called.
    """


# --------------------------------------------------------------------------- model


@hookspec(firstresult=True)
def fedkit_build_model(ctx: ModelContext) -> FedModel | None:
    """Build the model for one role. Exclusive firstresult; called once on the server
    (``ctx.client_id is None``: the global model) and once per client.

    Return a :class:`fedkit_core.models.FedModel` (backbone -> features -> head) or ``None``
    to let the built-in builder make one from the ``model`` config key. The shared part
    (everything not marked private) must have the same entries on every client and the
    server, because it is what gets aggregated.
    """


@hookspec
def fedkit_extend_model(model: FedModel, ctx: ModelContext) -> None:
    """Change the model after it is built. Additive; called right after
    :func:`fedkit_build_model`, on the server and on each client, in plugin order.

    Use ``model.add_extra(name, module, private=..., input=...)`` for extra heads or
    projectors (FCA's personalised head, Fed-MAS's projector), replace ``model.head``
    (FedCB's frozen text classifier), or ``model.mark_private(prefix)`` to keep state entries
    on the client: private entries are never uploaded, aggregated or put in the global
    checkpoint; they persist on the client across rounds and are checkpointed with it. Add
    client-only parts (``ctx.client_id is not None``) as private, or add them everywhere.
    ``ctx.client`` carries the client's own sizes, so the model may differ per client (a
    large private model on large clients).
    """


# --------------------------------------------------------------------------- local training


@hookspec
def fedkit_round_start(client: ClientContext) -> None:
    """Client statistics before local training. Additive; called on each sampled client
    after the received global arrays are loaded into ``client.model`` and before the first
    local step.

    ``client.model`` holds the received global model (shared entries) and the client's own
    private entries. Use ``client.batches("train")`` for a pass over local data (Fed-MAS
    computes its per-class prior distances ``w_k`` here) and keep results in
    ``client.state[plugin_name]``.
    """


@hookspec(firstresult=True)
def fedkit_task_loss(
    client: ClientContext, batch: Batch, outputs: Mapping[str, Any]
) -> torch.Tensor | None:
    """The main supervised loss of one batch. Exclusive firstresult; called per local step.

    ``outputs`` is what ``client.model(batch.x)`` returned (``"logits"``, ``"features"`` and
    one entry per extra). The built-in implements the ``loss`` config key (CE, balanced
    softmax with the client's own priors, Dice, Dice+CE). Return ``None`` to keep it; return
    a scalar tensor to replace it (e.g. to weight it, as FCA's ``l1``).
    """


@hookspec
def fedkit_loss_terms(
    client: ClientContext, batch: Batch, outputs: Mapping[str, Any]
) -> Mapping[str, torch.Tensor] | None:
    """Extra loss terms of one batch. Additive; called per local step after the task loss.

    Return named scalar tensors, already weighted (``{"fca.consistency": kl}``). All terms
    of all plugins are summed with the task loss; each term's mean over the round is
    reported. Plugins may run more forward passes here (a public batch, a private model).
    """


@hookspec
def fedkit_client_report(client: ClientContext) -> Mapping[str, Scalar] | None:
    """Scalars a client sends up with its update. Additive; called after local training.

    ``client.model`` holds the locally trained weights. Return plain numbers, prefixed by
    the plugin's name (Fed-MAS's ``"fed-mas.rf"``). They reach the server in
    ``Update.scalars`` next to the built-in ``num_examples`` and ``loss``.
    """


@hookspec(firstresult=True)
def fedkit_answer_query(
    client: ClientContext,
    query: str,
    arrays: Mapping[str, torch.Tensor],
    scalars: Mapping[str, Scalar],
) -> Reply | None:
    """Answer an extra server-to-client round trip. firstresult; called on a client when
    the aggregator calls ``ask(query, arrays, scalars)`` during :func:`fedkit_aggregate`.

    ``query`` names the question (prefix it with your plugin's name, e.g. ``"fed-lwr.cka"``);
    answer only your own queries and return ``None`` otherwise. ``client.model`` still holds
    the weights this client trained in the current round. Return a
    :class:`fedkit_core.Reply` of arrays and scalars (Fed-LWR: per-layer CKA scalars between
    the local model and the anchor model sent in ``arrays``, on the client's validation split).
    """


# --------------------------------------------------------------------------- aggregation


@hookspec(firstresult=True)
def fedkit_aggregate(
    server: ServerContext, updates: Sequence[Update], ask: Ask
) -> Mapping[str, torch.Tensor] | None:
    """Combine the clients' updates into the next global state. Exclusive firstresult;
    called once per round on the server.

    ``updates`` holds, per client that finished the round, its uploaded arrays (shared
    entries only) and scalars (``num_examples``, ``loss``, plugin scalars). ``server.global_state``
    is the previous global state. ``ask(query, arrays=None, scalars=None, clients=None)``
    sends one extra message to the clients (default: those in ``updates``) and returns
    ``{client_id: Reply}``; each client answers through :func:`fedkit_answer_query`.
    Return the new global state (every shared entry) or ``None`` to fall back to FedAvg
    weighted by ``num_examples`` (built-in). Helpers: ``fedkit_core.aggregation``.
    """


# --------------------------------------------------------------------------- evaluation


@hookspec(firstresult=True)
def fedkit_personal_output(client: ClientContext) -> str | None:
    """Which model output a client uses for its own evaluation. Exclusive firstresult;
    called on each client at every evaluation.

    By default (``None``) every scope is evaluated with the global model's ``"logits"``.
    A personalising plugin returns the name of an output of ``client.model`` (whose shared
    part then holds the global weights and whose private part holds the client's own):
    FCA returns its personalised head. The per-client scope (``clients``, fairness) then
    uses it, while the pooled ``global`` scope keeps using the global ``"logits"``.
    """


@hookspec
def fedkit_metrics(task: TaskInfo, arrays: Mapping[str, Any]) -> Mapping[str, float] | None:
    """Compute metrics from pooled predictions. Additive; called on the server for every
    scope (pooled global, each client) and split (val, test) at each evaluation.

    ``arrays`` holds numpy arrays: ``"probs"`` (N, classes) and ``"labels"`` (N,) for
    classification; ``"dice"`` (N, classes) per-sample per-class Dice (background first)
    for segmentation. Return ``{metric name: float}``; the built-ins give bacc, bauc, acc,
    f1_macro, head/medium/tail_acc (classification) and dice, dice_bg (segmentation).
    """


@hookspec
def fedkit_summary(task: TaskInfo, scopes: Mapping[str, Any]) -> Mapping[str, float] | None:
    """Derived numbers for one evaluation. Additive; called on the server after metrics.

    ``scopes`` holds ``"global"`` (metrics dict), ``"clients"`` ({client id: metrics}),
    ``"clients_mean"`` and ``"fairness"``. Return named floats (FCA: the mean of
    generalisation and specialisation); they are stored under ``summary`` in each round
    record and in ``final``.
    """
