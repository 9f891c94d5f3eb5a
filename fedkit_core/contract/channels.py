"""What a run sends beyond the model update, and whether a private run may send it.

A plugin declares each channel it adds with :func:`fedkit_core.hooks.hookspecs.fedkit_channels`
(a :class:`Channel`): a scalar its clients report with their updates, the answers to its
queries, or an aggregation that needs every client's update one by one. A DP run
(``dp.level``) or a secure-aggregation run (``secagg.enabled``) refuses, before any data is
loaded, every channel the plugin does not privatise itself, naming it; what nobody declared
is refused when it is sent (:func:`undeclared`).

The core's own channels are handled here: the clients' training loss is not sent in a
private run; ``num_examples`` is not sent under client-level DP (updates are averaged
unweighted), is treated as public under sample-level DP (as Opacus's accountant treats the
data set's size), and travels in the clear under Flower's SecAgg+ (its protocol weights by
it); the class counts of ``task.shot_thresholds`` are refused.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

#: kinds of channel
REPORT, QUERY, INDIVIDUAL = "report", "query", "individual updates"


@dataclass(frozen=True)
class Channel:
    """One thing a plugin sends beyond the model update.

    ``name``: the scalar or query it travels under (``"fed-mas.rf"``); ``carries``: what it
    reveals, for people (``"each client's rescue factor, from its class statistics"``);
    ``kind``: :data:`REPORT` (a scalar sent up with each update), :data:`QUERY` (answers to
    the plugin's ``ask``) or :data:`INDIVIDUAL` (the aggregation reads each client's update,
    not only their sum); ``privatised``: how the plugin privatises it in a DP run (``None``:
    it does not, and a DP run refuses the plugin).
    """

    name: str
    carries: str
    kind: str = REPORT
    privatised: str | None = None


#: dp.level values
NONE, CLIENT, SAMPLE = "none", "client", "sample"


def dp_level(config: Mapping[str, Any]) -> str:
    """The run's ``dp.level`` (:data:`NONE`, :data:`CLIENT`, :data:`SAMPLE`): the one place the
    key is read. ``config`` is a resolved config or a run record's, flat (``dp.level``) or
    nested as in ``config.yaml`` (``dp: {level: ...}``); a record without the key (a run
    made before ``dp.*`` existed) is at ``none``."""
    level = config.get("dp.level")
    if level is None and isinstance(config.get("dp"), Mapping):
        level = config["dp"].get("level")
    return level or NONE


#: scalars the core itself sends with an update in a private run
CORE_SCALARS = ("num_examples",)
#: the prefix of the privacy layer's own scalars (privatised by the layer itself): the
#: namespace is the core's, a plugin reporting a value under it is refused (:func:`reserved`)
DP_PREFIX = "dp."
#: the privacy layer's scalars, the only ``dp.*`` names an update may carry: the clipping
#: norm (fit message), the adaptive-clipping bit, and DP-SGD's epsilon, noise multiplier,
#: last-round flag and clipping mode
DP_SCALARS = (
    "dp.clip",
    "dp.unclipped",
    "dp.epsilon",
    "dp.noise_multiplier",
    "dp.last",
    "dp.ghost",
)


def refusals(channels: Iterable[tuple[str, Channel]], level: str, secure: bool) -> list[str]:
    """Why a run with ``dp.level=level`` (``none``, ``client``, ``sample``) and secure
    aggregation ``secure`` cannot carry the ``(plugin, channel)`` pairs; empty when it can."""
    problems = []
    for plugin, channel in channels:
        what = f"{plugin} sends {channel.kind} {channel.name!r}: {channel.carries}"
        if secure and channel.kind in (INDIVIDUAL, REPORT, QUERY):
            problems.append(
                f"secure aggregation shows the server only the sum of the updates, but {what}; "
                f"run {plugin} without secagg.enabled"
            )
        elif level == "client" and channel.privatised is None:
            problems.append(
                f"dp.level=client privatises only the sum of the clipped updates, but {what} "
                f"(not privatised); run {plugin} without dp, or with options that drop it"
            )
        elif (
            level == "sample"
            and channel.privatised is None
            and channel.kind != INDIVIDUAL  # each update is itself DP under DP-SGD
        ):
            problems.append(
                f"dp.level=sample privatises only the model updates (DP-SGD), but {what} "
                f"(not privatised); run {plugin} without dp, or with options that drop it"
            )
    return problems


def reserved(scalars: Mapping[str, Any], where: str) -> str | None:
    """The message refusing a plugin's scalar in the core's ``dp.*`` namespace (which would
    otherwise pass as the privacy layer's own); ``None`` when there is none."""
    taken = sorted(k for k in scalars if k.startswith(DP_PREFIX))
    if not taken:
        return None
    return (
        f"{where} reports {taken[0]!r}: the {DP_PREFIX}* names are reserved for fedkit's "
        "privacy layer; name the value after the plugin (and declare it with fedkit_channels "
        "for a private run)"
    )


def undeclared(scalars: Mapping[str, Any], allowed: Iterable[str], where: str) -> str | None:
    """The message refusing a scalar of ``scalars`` that is neither a core scalar, the
    privacy layer's (:data:`DP_SCALARS`), nor ``allowed`` (declared and privatised);
    ``None`` when all are."""
    allowed = set(allowed) | set(CORE_SCALARS) | set(DP_SCALARS)
    extra = sorted(k for k in scalars if k not in allowed)
    if not extra:
        return None
    return (
        f"{where} would send {extra[0]!r} with its update, a channel beyond the model update "
        "that no plugin declared as privatised (fedkit_channels); a private run sends none"
    )
