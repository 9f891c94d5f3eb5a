"""The fedkit hook contract (API 2): every hook a method plugin may implement.

A plugin is a module or object with functions named after the hooks below and decorated
with :data:`fedkit_core.plugin.hookimpl`. It only implements the hooks it needs. The core's
own behaviour (FedAvg, the CE/BSM/Dice losses, the standard metrics, model building, the
default optimiser and evaluation view) is made of plugins implementing these same hooks, so a
third-party plugin can replace or extend any of it. Plugins import what they use from
:mod:`fedkit_core.plugin` only.

Every hook receives one context of its side: ``server`` (a :class:`ServerContext`) or
``client`` (a :class:`ClientContext`); the model hooks, which run on both sides, receive
``ctx`` (either; ``ctx.client_id is None`` on the server). Inside a hook,
``ctx.options()`` is the calling plugin's own options and ``ctx.state`` / ``client.scratch``
its own namespaces, whatever name the plugin was registered under.

One round, in the order the hooks are called (see ``docs/architecture.md`` for a diagram)::

    once     server: fedkit_options, fedkit_check       (before any data is loaded)
                     fedkit_register_selection_rules, fedkit_register_round_modes
                     fedkit_server_priors, fedkit_build_model + fedkit_extend_model
             client: fedkit_client_priors, fedkit_build_model + fedkit_extend_model
    round    server: (the selection rule) fedkit_select_clients
                     fedkit_configure_fit                -> arrays + scalars go down
             client: (global arrays loaded) fedkit_round_start
                     fedkit_param_groups, fedkit_optimizer (when an optimiser is made)
                     per batch: fedkit_task_loss + fedkit_loss_terms
                     fedkit_client_report                -> arrays + scalars go up
             server: fedkit_aggregate (may ask clients: fedkit_answer_query)
    evaluate client: fedkit_eval_views, fedkit_client_view -> predictions or statistics up
             server: fedkit_metrics, fedkit_summary

The contract is engine-agnostic: client and server never share objects. Only named arrays
(``dict[str, torch.Tensor]``) and plain scalars (``int``, ``float``, ``str``, ``bool``) cross
between them, so the same plugin runs in fedkit's in-process engine and on Flower. A party
knows only its own statistics: a client's context holds its own sizes and class counts
(``client.info``), the server's none of any client's beyond what messages carry.

Hook kinds:

* **additive**: every active plugin's result is used (dicts are merged, ``None`` is skipped).
* **exclusive** (marked below with :func:`exclusive`): the first non-``None`` result wins;
  built-ins run last, so a plugin returning ``None`` falls back to the built-in behaviour. If
  two active non-built-in plugins implement one, fedkit reports the conflict instead of
  picking. :data:`EXCLUSIVE_HOOKS` is derived from these marks.

Bump :data:`API_VERSION` on any incompatible change; a plugin may declare the version it was
written for as a module/object attribute ``fedkit_api``.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

import pluggy

if TYPE_CHECKING:
    import torch

    from fedkit_core.contract.channels import Channel
    from fedkit_core.contract.data import Batch
    from fedkit_core.contract.messages import Payload, Reply, Scalar, Update
    from fedkit_core.contract.options import Option
    from fedkit_core.hooks.context import ClientContext, ServerContext
    from fedkit_core.models.fedmodel import FedModel

API_VERSION = 2

#: the module (or object) attribute by which a plugin names those of its loss terms
#: (:func:`fedkit_loss_terms`) that are functions of the model's parameters alone, as
#: FedProx's ``fedkit_parameter_terms = ("fedprox.proximal",)``; see that hook
PARAMETER_TERMS = "fedkit_parameter_terms"

hookspec = pluggy.HookspecMarker("fedkit")
hookimpl = pluggy.HookimplMarker("fedkit")

F = TypeVar("F", bound=Callable[..., Any])


def exclusive(spec: F) -> F:
    """Mark a hook spec as exclusive: first result wins, one non-built-in provider at most."""
    spec.fedkit_exclusive = True  # type: ignore[attr-defined]
    return hookspec(firstresult=True)(spec)


class Ask(Protocol):
    """The extra round trip an aggregator may make (see :func:`fedkit_aggregate`)."""

    def __call__(
        self,
        query: str,
        arrays: Mapping[str, torch.Tensor] | None = None,
        scalars: Mapping[str, Scalar] | None = None,
        clients: Sequence[str] | None = None,
    ) -> dict[str, Reply]: ...


# --------------------------------------------------------------------------- declarations


@hookspec
def fedkit_options() -> Sequence[Option]:
    """Declare the plugin's typed config options. Additive; called once when the run is built.

    Return a list of :class:`Option` (with ``min``/``max`` where a range applies). fedkit
    namespaces them under the name the plugin is registered with: option ``lambda_f`` of
    plugin ``fed-mas`` is set with ``--set fed-mas.lambda_f=3`` and read in any hook with
    ``ctx.options()["lambda_f"]``. Values are type- and range-checked before any data is
    loaded, and the defaults appear in the saved config.
    """


@hookspec
def fedkit_check(server: ServerContext) -> str | Sequence[str] | None:
    """Refuse a run the plugin cannot serve. Additive; called once, before any data is loaded.

    ``server.config`` is the resolved config, ``server.task`` names the task and its kind
    (``classification`` or ``segmentation``); data-dependent facts (classes, shapes) are not
    known yet. Return ``None`` when the run is fine, or one message (or several) saying what
    is wrong, e.g. ``"fca needs a classification task, not segmentation"``. The run then stops
    with exit code 2 and these messages.
    """


@hookspec
def fedkit_channels(server: ServerContext) -> Sequence[Channel] | None:
    """Declare what the plugin sends beyond the model update. Additive; called once, before
    any data is loaded, in runs with differential privacy or secure aggregation.

    Return one :class:`Channel` per scalar the plugin's clients report with their updates
    (``fedkit_client_report``), per query it asks (``fedkit_answer_query``), and one of kind
    ``"individual updates"`` when its ``fedkit_aggregate`` reads each client's update rather
    than their sum; each with what it reveals and, when the plugin privatises it in a DP
    run, how (``privatised``). Depend on ``server.options()``: a channel an option turns off
    is not declared. A DP or secure-aggregation run refuses what is not privatised, naming
    the channel; a scalar nobody declared is refused when it is sent.
    """


# --------------------------------------------------------------------------- priors


@hookspec
def fedkit_server_priors(server: ServerContext) -> Mapping[str, torch.Tensor] | None:
    """Build server-side knowledge once, before training. Additive; called once on the server.

    For knowledge that is computed centrally and never trained: text-embedding statistics
    of the class names (FedCB), foundation-model probabilities on public data (FedHelp).
    Return named tensors; prefix the names with the plugin's name (``"fedcb.mu"``). They are
    sent to every client once (in the setup message) and appear in ``ctx.priors`` on both
    sides.
    """


@hookspec
def fedkit_client_priors(client: ClientContext) -> Mapping[str, Any] | None:
    """Build client-side knowledge once per client, before training. Additive.

    For frozen objects that live on the client and are never trained or communicated: a
    pretrained self-supervised encoder (Fed-MAS), a public data set (FedHelp). Return a dict
    of anything (modules, tensors); it is merged into ``client.priors`` and is not
    checkpointed, so it must be rebuilt identically on resume (load from files; seed any
    randomness from the run, e.g. ``derive_seed(client.config["seed"], ...)``). The server
    priors are already in ``client.priors`` when this is called.
    """


# --------------------------------------------------------------------------- model


@exclusive
def fedkit_build_model(ctx: ServerContext | ClientContext) -> FedModel | None:
    """Build the model for one party. Exclusive; called once on the server (the global
    model, ``ctx.client_id is None``) and once per client.

    Return a :class:`FedModel` (backbone -> features -> head) or ``None`` to let the built-in
    builder make one from the ``model`` config key. The shared part (everything not marked
    private) must have the same entries on every client and the server, because it is what
    gets aggregated.
    """


@hookspec
def fedkit_extend_model(model: FedModel, ctx: ServerContext | ClientContext) -> None:
    """Change the model after it is built. Additive; called right after
    :func:`fedkit_build_model`, on the server and on each client, in plugin order.

    Use ``model.add_extra(name, module, private=..., input=...)`` for extra heads or
    projectors (FCA's personalised head, Fed-MAS's projector), replace ``model.head``
    (FedCB's frozen text classifier), or ``model.mark_private(prefix)`` to keep state entries
    on the client: private entries are never uploaded, aggregated or put in the global
    checkpoint; they persist on the client across rounds and are checkpointed with it. Add
    client-only parts (``ctx.client_id is not None``) as private, or add them everywhere.
    On a client, ``ctx.info`` holds its own sizes, so the model may differ per client (a
    large private model on large clients).
    """


# --------------------------------------------------------------------------- local training


@exclusive
def fedkit_select_clients(server: ServerContext, clients: Sequence[str]) -> Sequence[str] | None:
    """Which clients train this round. Exclusive; called on the server at the start of every
    round (``server.round`` is set), before :func:`fedkit_configure_fit`.

    ``clients`` are every client id of the task. Return the ids that train (at least one;
    they train in id order, in parallel), or ``None`` for the built-in sampling
    (``sample_fraction`` of the clients, drawn from the seed and the round). The choice must
    follow from the seed, the round and ``server.state`` alone, so that a resumed run
    chooses as the uninterrupted one did (Cyclic's turns: one client per round).
    """


@hookspec
def fedkit_register_selection_rules(register: Callable[[str, Callable[..., Any]], None]) -> None:
    """Add selection rules: who trains each round. Additive; called once per run.

    Call ``register(name, rule)`` for each rule; a run chooses one with ``selection=name``
    (the built-in ``sample`` asks :func:`fedkit_select_clients`, else draws
    ``sample_fraction`` of the clients). ``rule(server, clients)`` gets the server's context
    (``server.round`` set; ``server.config`` the run's config) and every client id of the
    task, and returns the ids that train (at least one; they train in id order). The choice
    must follow from the seed, the round and ``server.state`` alone, so that a resumed run
    chooses as the uninterrupted one did. Under client-level DP at ``sample_fraction < 1``
    the privacy layer's secret sample replaces the rule. A name registered twice, or an
    unknown ``selection``, is an error listing the known rules.
    """


@hookspec
def fedkit_register_round_modes(register: Callable[[str, type], None]) -> None:
    """Add round modes: how rounds proceed. Additive; called once per run.

    Call ``register(name, mode)`` with a subclass of :class:`fedkit_core.plugin.RoundMode`;
    a run chooses one with ``aggregation=name`` (built in: ``sync``, ``deadline``,
    ``fedbuff``, ``fedasync``). The mode is made once per run with the config, every client
    id and the clients a synchronous round samples; its ``train(federation, transport,
    rnd)`` trains one round into ``federation.ctx.global_state`` by asking the
    :class:`fedkit_core.plugin.Federation` (``strategy.select``, ``fit_messages``, ``fit``,
    ``exchange.failures``, ``strategy.updates``, ``strategy.aggregate``) and returns the
    round's record (``round``, ``global``, ``clients`` and what it trained). What it keeps
    between rounds goes in ``state()``/``restore()`` (checkpointed). Its class attributes
    say whether it keeps simulated time, lets evaluation travel with fit messages, runs
    with SecAgg+, and how many updates a round needs at least; ``check(config, plugins)``
    refuses a run it cannot serve. A name registered twice, or an unknown ``aggregation``,
    is an error listing the known modes.
    """


@hookspec
def fedkit_configure_fit(server: ServerContext, client_id: str) -> Payload | None:
    """What a plugin sends down with this round's fit message. Additive; called on the server
    for each sampled client before training.

    Return a :class:`Payload` of named arrays and scalars (prefix the names with your
    plugin's name); the client finds every plugin's entries in ``client.received`` during the
    round. State the server keeps across rounds belongs in ``server.state``.
    """


@hookspec
def fedkit_round_start(client: ClientContext) -> None:
    """Client statistics before local training. Additive; called on each sampled client
    after the received global arrays are loaded into ``client.model`` and before the first
    local step.

    ``client.model`` holds the received global model (shared entries) and the client's own
    private entries. Use ``client.batches("train")`` for a pass over local data (Fed-MAS
    computes its per-class prior distances ``w_k`` here). Keep what the rest of the round
    needs in ``client.scratch`` (cleared when the next round starts, never checkpointed
    between rounds) and what must outlive the round in ``client.state``.
    """


@hookspec
def fedkit_param_groups(client: ClientContext) -> Sequence[Mapping[str, Any]] | None:
    """Give parts of the client model their own optimiser settings. Additive; called when a
    client's optimiser is (re)built.

    Return optimiser parameter groups: ``{"params": [...], "lr_scale": 0.1, ...}``. Each
    group's learning rate is the round's learning rate times ``lr_scale`` (default 1); other
    keys (``weight_decay``, ``momentum``...) are passed to the optimiser. Parameters not in
    any group form the default group. FedHelp trains its contribution scores this way.
    """


@exclusive
def fedkit_optimizer(
    client: ClientContext, param_groups: Sequence[Mapping[str, Any]]
) -> torch.optim.Optimizer | None:
    """Build the client's optimiser. Exclusive; called when a client's optimiser is made.

    ``param_groups`` are the groups of :func:`fedkit_param_groups` plus the default group,
    each with its ``lr``. Return an optimiser over them, or ``None`` for the built-in one
    (the ``optimizer``, ``lr``, ``momentum``, ``weight_decay`` and ``adam_betas`` keys).
    """


@exclusive
def fedkit_task_loss(
    client: ClientContext, batch: Batch, outputs: Mapping[str, Any]
) -> torch.Tensor | None:
    """The main supervised loss of one batch. Exclusive; called per local step.

    ``outputs`` is what ``client.model(batch.x)`` returned (``"logits"``, ``"features"`` and
    one entry per extra). The built-in implements the ``loss`` config key (CE, balanced
    softmax with the client's own priors, Dice, Dice+CE). Return ``None`` to keep it; return
    a scalar tensor to replace it (e.g. to weight it, as FCA's ``l1``). A plugin that needs
    the task loss of another head calls ``client.task_loss(batch, {"logits": ...})``, which
    runs this hook, so whichever plugin owns the loss applies to every head.
    """


@hookspec
def fedkit_loss_terms(
    client: ClientContext, batch: Batch, outputs: Mapping[str, Any]
) -> Mapping[str, torch.Tensor] | None:
    """Extra loss terms of one batch. Additive; called per local step after the task loss.

    Return named scalar tensors, already weighted (``{"fca.consistency": kl}``). All terms
    of all plugins are summed with the task loss; each term's mean over the round is
    reported. Plugins may run more forward passes here (a public batch, a private model).

    **Parameter terms.** A plugin may name, in a module attribute :data:`PARAMETER_TERMS`
    (``fedkit_parameter_terms = ("fedprox.proximal",)``), terms it returns that are
    functions of the model's trainable parameters and of values fixed before local training
    (the received global model) alone, of no training sample. That promise lets sample-level
    DP-SGD (``dp.level=sample``) keep them: their gradient is computed apart and added to the
    privatised (clipped, noised, averaged) gradient of the other terms before the
    optimiser's step, which is post-processing and leaves the privacy guarantee unchanged
    (docs/privacy.md); an undeclared term on the parameters stops such a run, as DP-SGD
    would drop it. fedkit refuses a declared term computed from the model's outputs or
    through its layers; one computed from the batch another way breaks the promise
    unnoticed. Without DP-SGD the declaration changes nothing.
    """


@hookspec
def fedkit_client_report(client: ClientContext) -> Mapping[str, Scalar] | Payload | None:
    """Scalars (and arrays) a client sends up with its update. Additive; called after local
    training.

    ``client.model`` holds the locally trained weights. Return plain numbers, prefixed by
    the plugin's name (Fed-MAS's ``"fed-mas.rf"``). They reach the server in
    ``Update.scalars`` next to the built-in ``num_examples`` and ``loss``. A plugin that
    sends arrays beside the model (SCAFFOLD's control variates) returns a :class:`Payload`
    instead: its scalars join ``Update.scalars``, its arrays arrive in ``Update.payload``
    (names as given, prefixed by the plugin's name), in the same reply, so their bytes are
    counted with the round's upload.
    """


@hookspec(firstresult=True)
def fedkit_answer_query(
    client: ClientContext,
    query: str,
    arrays: Mapping[str, torch.Tensor],
    scalars: Mapping[str, Scalar],
) -> Reply | None:
    """Answer an extra server-to-client round trip. First result wins; called on a client
    when the aggregator calls ``ask(query, arrays, scalars)`` during :func:`fedkit_aggregate`.

    ``query`` names the question (prefix it with your plugin's name, e.g. ``"fed-lwr.cka"``);
    answer only your own queries and return ``None`` otherwise. ``client.model`` still holds
    the weights this client trained in the current round. Return a :class:`Reply` of arrays
    and scalars (Fed-LWR: per-layer CKA scalars between the local model and the anchor model
    sent in ``arrays``, on the client's own data).
    """


# --------------------------------------------------------------------------- aggregation


@exclusive
def fedkit_aggregate(
    server: ServerContext, updates: Sequence[Update], ask: Ask
) -> Mapping[str, torch.Tensor] | None:
    """Combine the clients' updates into the next global state. Exclusive; called once per
    round on the server.

    ``updates`` holds, per client that finished the round, its uploaded arrays (shared
    entries only) and scalars (``num_examples``, ``loss``, plugin scalars).
    ``server.global_state`` is the previous global state; ``server.state`` keeps the
    aggregator's own state across rounds (checkpointed). ``ask(query, arrays=None,
    scalars=None, clients=None)`` sends one extra message to the clients (default: those in
    ``updates``) and returns ``{client_id: Reply}``; each client answers through
    :func:`fedkit_answer_query`. Return the new global state (every shared entry) or ``None``
    to fall back to FedAvg weighted by ``num_examples`` (built-in). Helpers:
    :func:`weighted_average`, :func:`average_entry`.
    """


# --------------------------------------------------------------------------- evaluation


@hookspec
def fedkit_eval_views(client: ClientContext) -> Mapping[str, str | None] | None:
    """The models a client evaluates, as ``{view name: model output}``. Additive; called on
    each client at every evaluation.

    Return the views to add. The built-in view is ``{"global": "logits"}``: the received
    global model, pooled over all clients into the ``global`` scope. A plugin adds views (FCA: ``{"personal":
    "fca_personal"}``) and may remove one by mapping it to ``None`` (``{"global": None}`` for
    a method whose clients have no common model: the pooled ``global`` scope is then empty).
    Every view is scored pooled and per client under ``views`` in each round record.
    """


@exclusive
def fedkit_client_view(client: ClientContext) -> str | None:
    """Which view scores this client in the per-client scopes (``clients``, ``clients_mean``,
    ``fairness``). Exclusive; called on each client at every evaluation.

    Return ``None`` to keep ``"global"``; a personalising method returns the view its clients serve
    (FCA: ``"personal"``; FedHelp: the private model's view, which differs between small and
    large clients).
    """


@hookspec
def fedkit_metrics(server: ServerContext, arrays: Mapping[str, Any]) -> Mapping[str, float] | None:
    """Compute metrics for one scope. Additive; called on the server for every view, scope
    (pooled, each client) and split (val, test) at each evaluation.

    With ``evaluation=pooled``, ``arrays`` holds numpy arrays: ``"probs"`` (N, classes) and
    ``"labels"`` (N,) for classification; ``"dice"`` (N, classes) per-sample per-class Dice
    (background first) for segmentation. With ``evaluation=federated`` it holds sufficient
    statistics instead (``"confusion"``, ``"score_pos"``, ``"score_neg"``; ``"dice_sum"``,
    ``"count"``; see :mod:`fedkit_core.metrics.statistics`). Return ``{metric name: float}``;
    the built-ins give bacc, bauc, acc, f1_macro, head/medium/tail_acc (classification) and
    dice, dice_bg (segmentation).
    """


@hookspec
def fedkit_summary(server: ServerContext, scopes: Mapping[str, Any]) -> Mapping[str, float] | None:
    """Derived numbers for one evaluation. Additive; called on the server after metrics.

    ``scopes`` holds ``"global"`` (metrics dict), ``"clients"`` ({client id: metrics}),
    ``"clients_mean"``, ``"fairness"`` and ``"views"``. Return named floats (FCA: the mean of
    generalisation and specialisation); they are stored under ``summary`` in each round
    record and in ``final``.
    """


# --------------------------------------------------------------------------- commands


@hookspec
def fedkit_register_commands(cli: Any) -> None:
    """Add commands to the ``fedkit`` command line. Additive; called once per ``fedkit``
    invocation that needs a command the core lacks (or lists them all, ``fedkit --help``),
    for every module named in the entry-point group ``fedkit.commands`` (not the methods'
    ``fedkit.plugins``: listing commands then imports only these light modules); never
    during a run.

    ``cli`` is a ``typer.Typer`` app: add a command with ``@cli.command()`` or a group with
    ``cli.add_typer(app, name="prior")`` (fedkit-priors adds ``fedkit prior`` and ``fedkit
    knowledge`` so). The core's commands keep their names: a plugin command of the same name
    is ignored with a warning. Return nothing. Import heavy libraries inside the command
    functions, so that adding the command costs nothing; raise :class:`FedkitError` for a
    user error (one message, exit code 2).
    """


#: Hooks where only one (non-built-in) plugin may provide the behaviour.
EXCLUSIVE_HOOKS = tuple(
    name
    for name, spec in vars(sys.modules[__name__]).items()
    if name.startswith("fedkit_") and getattr(spec, "fedkit_exclusive", False)
)
