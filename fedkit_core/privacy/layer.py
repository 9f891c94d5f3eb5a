"""The privacy layer of a run's server: what its wrappers around the round's strategy
(:mod:`.rounds`) ask of it each round (sampling, the fit message's scalars, the updates the
aggregator may see, the round's accounting) and the mechanism it reports in
``final.privacy``.

Client level (``dp.level=client``): the clients clip their updates (``dp.clip`` in the fit
message); the layer samples the clients and adds the noise to their sum from secret
generators (:mod:`.noise`: seeded from ``os.urandom``, recorded nowhere), and hands the
aggregator plugin a single update, the privatised mean, so that every ``fedkit_aggregate``
(FedAvg, a server optimiser, a plugin's weighting) is post-processing of a DP release. The
accountant of :mod:`.accounting` gives epsilon after every round; ``dp.target_epsilon``
calibrates the noise before round 1 or fixes the last round the budget pays for.

Sample level (``dp.level=sample``): each client runs DP-SGD and keeps its own accountant
(:mod:`.sample_level`); it reports its epsilon (``dp.epsilon``) and whether its budget pays
for another round (``dp.last``); the run's epsilon is the largest any client spent. The
updates go to the aggregator as they are (each is DP already).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from fedkit_core.config import Config
from fedkit_core.contract.channels import (
    CLIENT,
    DP_PREFIX,
    DP_SCALARS,
    NONE,
    SAMPLE,
    dp_level,
    undeclared,
)
from fedkit_core.contract.messages import Update
from fedkit_core.errors import FedkitError
from fedkit_core.privacy import accounting, client_level, noise

log = logging.getLogger("fedkit")

#: fit-message scalar: the clipping norm of this round (client level); update scalar: 1 when
#: the client's update was within the norm (adaptive clipping); update scalars of
#: sample-level DP: the client's epsilon so far, its noise multiplier, whether its budget
#: pays for no further round, and whether it clipped by ghost clipping
CLIP, UNCLIPPED, EPSILON, SIGMA, LAST, GHOST = DP_SCALARS
#: the id of the one update the aggregator sees under client-level DP or secure aggregation
AGGREGATE = "dp-aggregate"
#: the adaptive-clipping bit's entry in a securely aggregated vector
SECURE_BIT = "dp/unclipped"

#: what the evaluation reveals in a private run (results.json and docs/privacy.md)
EVALUATION_NOTE = (
    "not covered: clients score the global model (and their own views) on their val/test "
    "splits, which training never reads; the replies reveal those held-out samples' "
    "predictions and labels (evaluation=pooled) or their confusion matrices and score "
    "histograms (federated). Scores of the global view are a function of the DP model and "
    "held-out data only; views of a client's private model that DP-SGD did not train (a "
    "personalised head under dp.level=client) depend on its training data without noise."
)


def sample_poisson(ids: Sequence[str], rate: float, rng: np.random.Generator) -> list[str]:
    """Each client independently with probability ``rate`` (may be none), in id order."""
    draws = rng.random(len(ids))
    return [cid for cid, u in zip(ids, draws) if u < rate]


def sample_fixed(ids: Sequence[str], size: int, rng: np.random.Generator) -> list[str]:
    """``size`` clients drawn without replacement, in id order."""
    chosen = set(rng.choice(len(ids), size=size, replace=False).tolist())
    return [cid for i, cid in enumerate(ids) if i in chosen]


class ServerPrivacy:
    """The privacy layer of one run's server; with ``dp.level=none`` it changes nothing."""

    def __init__(self, config: Config, num_clients: int):
        self.config = config
        self.level = dp_level(config)
        self.delta = config["dp.delta"]
        self.kind = config["dp.accountant"]
        self.target = config["dp.target_epsilon"]
        self.num_clients = num_clients
        self.rate = config["sample_fraction"]
        self.sampling = config["dp.sampling"]
        self.adaptive = config["dp.clipping"] == "adaptive"
        self.sigma = config["dp.noise_multiplier"]
        self.calibrated = False
        self.planned = config["rounds"]
        self.last_round = self.planned
        #: plugin scalars declared as privatised (the only ones a private update may carry)
        self.allowed: list[str] = []
        if self.level == CLIENT:
            self._set_up_client_level()
        if self.active and noise.reproducible(config):
            log.warning(noise.NOT_PRIVATE)

    # ------------------------------------------------------------------ set-up

    @property
    def active(self) -> bool:
        return self.level != NONE

    @property
    def denominator(self) -> float:
        """The public denominator of the mean: expected (Poisson) or fixed sample size."""
        if self.rate >= 1.0 or self.sampling == accounting.POISSON:
            return self.rate * self.num_clients if self.rate < 1.0 else float(self.num_clients)
        return float(max(1, round(self.rate * self.num_clients)))

    @property
    def count_sigma(self) -> float | None:
        """The noise std of the adaptive count (None: fixed clipping)."""
        if not self.adaptive:
            return None
        chosen = self.config["dp.count_noise"]
        return chosen if chosen is not None else max(self.denominator / 20, self.sigma)

    def mechanism(self, sigma: float | None = None) -> accounting.Mechanism:
        """One round at client level as the accountant sees it (noise multiplier ``sigma``)."""
        return accounting.Mechanism(
            self.sigma if sigma is None else sigma,
            self.rate,
            self.sampling,
            self.num_clients,
        )

    def _set_up_client_level(self) -> None:
        if self.target is not None and self.config["dp.on_target"] == "calibrate":
            self.sigma = accounting.calibrate(
                self.mechanism, self.target, self.delta, self.planned, self.kind
            )
            self.calibrated = True
        elif self.target is not None:
            self.last_round = accounting.affordable_rounds(
                self.mechanism(), self.target, self.delta, self.planned, self.kind
            )
            if self.last_round == 0:
                raise FedkitError(
                    f"dp.target_epsilon={self.target} does not pay for one round with "
                    f"dp.noise_multiplier={self.sigma} (epsilon "
                    f"{accounting.epsilon(self.mechanism(), 1, self.delta, self.kind):.3g} at "
                    f"delta {self.delta}); raise the noise multiplier or the budget"
                )
        self.update_sigma = client_level.update_noise_multiplier(self.sigma, self.count_sigma)

    # ------------------------------------------------------------------ rounds

    def sample(self, ids: Sequence[str], rnd: int) -> list[str] | None:
        """The clients of round ``rnd`` when DP decides them (client level with
        ``sample_fraction < 1``: the accountant amplifies on this sampling, so it is drawn
        from the secret stream), else None."""
        if self.level != CLIENT or self.rate >= 1.0:
            return None
        rng = noise.numpy_rng(self.config, "sample", rnd)
        if self.sampling == accounting.POISSON:
            return sample_poisson(ids, self.rate, rng)
        return sample_fixed(ids, int(self.denominator), rng)

    def fit_scalars(self, state: dict[str, Any]) -> dict[str, float]:
        """What every fit message carries for the privacy layer."""
        if self.level != CLIENT:
            return {}
        return {CLIP: float(state.setdefault("clip", self.config["dp.clip"]))}

    def check_query(self, query: str) -> None:
        """A private run asks clients nothing: a query's answers are per-client values."""
        if self.active or self.config["secagg.enabled"]:
            raise FedkitError(
                f"the aggregator asked the clients {query!r}, a channel beyond the model "
                "update that a private run does not carry (declare it with fedkit_channels)"
            )

    def updates(
        self,
        global_state: Mapping[str, torch.Tensor],
        updates: Sequence[Update],
        state: dict[str, Any],
        rnd: int,
    ) -> list[Update]:
        """The updates the aggregator may see: under client-level DP one, the privatised
        mean of the clipped updates; otherwise ``updates`` (each checked for undeclared
        scalars when private)."""
        if self.level == NONE:
            return list(updates)
        for update in updates:
            problem = undeclared(update.scalars, self.allowed, f"client {update.client_id!r}")
            if problem:
                raise FedkitError(problem)
        if self.level == SAMPLE:
            for update in updates:
                state.setdefault("epsilons", {})[update.client_id] = float(
                    update.scalars.get(EPSILON, 0.0)
                )
                state.setdefault("sigmas", {})[update.client_id] = float(
                    update.scalars.get(SIGMA, 0.0)
                )
                if update.scalars.get(LAST):
                    state["exhausted"] = rnd
                if GHOST in update.scalars:
                    modes = set(state.get("grad_sample", [])) | {
                        "ghost" if update.scalars[GHOST] else "hooks"
                    }
                    state["grad_sample"] = sorted(modes)
            return [
                Update(u.client_id, u.arrays, {"num_examples": u.num_examples}) for u in updates
            ]
        return [self._client_level(global_state, updates, state, rnd)]

    def _client_level(
        self,
        global_state: Mapping[str, torch.Tensor],
        updates: Sequence[Update],
        state: dict[str, Any],
        rnd: int,
    ) -> Update:
        clip = float(state.setdefault("clip", self.config["dp.clip"]))
        # the server re-clips: the bound holds even if a client did not clip
        clipped = [client_level.clip_update(global_state, u.arrays, clip)[0] for u in updates]
        generator = noise.torch_generator(self.config, "dp", rnd)
        mean = client_level.noisy_mean(
            global_state, clipped, self.update_sigma * clip, self.denominator, generator
        )
        if self.adaptive:
            unclipped = sum(float(u.scalars.get(UNCLIPPED, 0.0)) for u in updates)
            self._adapt(state, clip, unclipped, generator)
        state["noise_std"], state["round_clip"] = self.update_sigma * clip, clip
        return Update(AGGREGATE, mean, {"num_examples": 1})

    def secure_updates(
        self,
        global_state: Mapping[str, torch.Tensor],
        summed: Any,
        replies: Mapping[str, Any],
        state: dict[str, Any],
        rnd: int,
    ) -> list[Update]:
        """The update the aggregator sees after secure aggregation: ``summed`` holds the
        weighted mean of the clients' updates (``count`` clients, weights summing to
        ``weight``); under client-level DP (weights 1) its sum is privatised as
        :meth:`updates` does with individual updates."""
        count, mean = int(summed.scalars["count"]), summed.arrays
        if self.level == SAMPLE:
            self.updates(
                global_state, [Update(c, {}, r.scalars) for c, r in replies.items()], state, rnd
            )
        if self.level != CLIENT:
            new = {k: v.clone() for k, v in global_state.items()}
            for k, v in mean.items():
                if k != SECURE_BIT:
                    g = global_state[k]
                    new[k] = (g.double() + v.reshape(g.shape)).to(g.dtype)
            return [Update(AGGREGATE, new, {"num_examples": int(summed.scalars["weight"])})]
        clip = float(state.setdefault("clip", self.config["dp.clip"]))
        total = {k: v * count for k, v in mean.items() if k != SECURE_BIT}
        generator = noise.torch_generator(self.config, "dp", rnd)
        new = client_level.noisy_mean_of_sum(
            global_state, total, self.update_sigma * clip, self.denominator, generator
        )
        if self.adaptive:
            unclipped = float(mean[SECURE_BIT].sum()) * count
            self._adapt(state, clip, unclipped, generator)
        state["noise_std"], state["round_clip"] = self.update_sigma * clip, clip
        return [Update(AGGREGATE, new, {"num_examples": 1})]

    def _adapt(
        self, state: dict[str, Any], clip: float, unclipped: float, generator: torch.Generator
    ) -> None:
        state["clip"], state["fraction"] = client_level.adapt_clip(
            clip,
            unclipped,
            self.count_sigma,
            self.denominator,
            self.config["dp.target_quantile"],
            self.config["dp.clip_lr"],
            generator,
        )

    def record(self, rnd: int, state: dict[str, Any]) -> dict[str, Any] | None:
        """The ``privacy`` entry of round ``rnd``'s record (None: not private)."""
        if self.level == CLIENT:
            entry = {
                "epsilon": accounting.epsilon(self.mechanism(), rnd, self.delta, self.kind),
                "delta": self.delta,
                "clip": state.get("round_clip", float(self.config["dp.clip"])),
                "noise_std": state.get("noise_std", 0.0),
            }
            if self.adaptive:
                entry["next_clip"] = state["clip"]
                entry["unclipped_fraction"] = state["fraction"]
            return entry
        if self.level == SAMPLE:
            spent = state.get("epsilons", {})
            return {
                "epsilon": max(spent.values(), default=0.0),
                "delta": self.delta,
                "clients": dict(spent),
            }
        return None

    def last(self, rnd: int, state: dict[str, Any]) -> bool:
        """Whether round ``rnd`` is the run's last for privacy (its budget is spent)."""
        if self.level == SAMPLE and state.get("exhausted") == rnd:
            self.last_round = rnd
        return rnd >= self.last_round

    def restore(self, state: Mapping[str, Any]) -> None:
        """Resume: a sample-level run whose budget ended it stays ended."""
        if "exhausted" in state:
            self.last_round = min(self.last_round, int(state["exhausted"]))

    # ------------------------------------------------------------------ report

    def sampling_run(self, records: Sequence[Mapping[str, Any]]) -> str:
        """The client sampling the rounds ran (client level): the privacy layer's (Poisson or
        fixed-size, secret), every client, or a plugin's choice (``fedkit_select_clients``,
        e.g. cyclic's one client a round), from the clients each round ``sampled``."""
        if self.rate < 1.0:
            return self.sampling
        sizes = sorted({len(r.get("sampled", ())) for r in records} - {self.num_clients})
        if not sizes:
            return "all clients every round"
        span = str(sizes[0]) if len(sizes) == 1 else f"{sizes[0]}-{sizes[-1]}"
        return (
            f"chosen by a plugin (fedkit_select_clients): {span} of {self.num_clients} "
            "clients a round"
        )

    def accounted_as(self) -> str:
        """What the accountant composed each round (the event of :meth:`mechanism`)."""
        if self.rate >= 1.0:
            return (
                "a Gaussian mechanism on every client every round, without amplification by "
                "sampling; where a plugin's choice trains fewer clients (cyclic), an upper "
                "bound as long as the choice is public and does not depend on the clients' "
                "data (a removed client's turns contribute a zero update), each client taking "
                "part in fewer rounds than accounted"
            )
        if self.sampling == accounting.POISSON:
            return f"a Poisson-sampled Gaussian mechanism at rate {self.rate:g} per round"
        return (
            f"a Gaussian mechanism on {int(self.denominator)} of {self.num_clients} clients "
            "sampled without replacement per round (sensitivity 2C)"
        )

    def summary(
        self, records: Sequence[Mapping[str, Any]], state: dict[str, Any]
    ) -> dict[str, Any] | None:
        """``final.privacy``: the mechanism, its parameters and the epsilon spent."""
        if not self.active:
            return None
        spent = [r["privacy"]["epsilon"] for r in records if "privacy" in r]
        out: dict[str, Any] = {
            "level": self.level,
            "epsilon": spent[-1] if spent else 0.0,
            "delta": self.delta,
            "accountant": f"dp-accounting {self.kind}",
            "target_epsilon": self.target,
            "on_target": self.config["dp.on_target"] if self.target is not None else None,
            "rounds_planned": self.planned,
            "rounds_run": len(spent),
            "evaluation": EVALUATION_NOTE,
            "noise_secret": not noise.reproducible(self.config),
            "noise": noise.describe(self.config),
        }
        if self.level == CLIENT:
            out.update(
                mechanism="DP-FedAvg: client updates clipped to norm C on the clients, Gaussian "
                "noise of std noise_multiplier * C on their sum at the server, divided by a "
                "public denominator; the aggregator sees only that mean",
                noise_multiplier=self.sigma,
                update_noise_multiplier=self.update_sigma,
                calibrated=self.calibrated,
                clip=self.config["dp.clip"],
                clipping=self.config["dp.clipping"],
                sampling=self.sampling_run(records),
                accounted_as=self.accounted_as(),
                sample_rate=self.rate,
                denominator=self.denominator,
                neighbouring=f"{self.mechanism().relation} client",
            )
            if self.adaptive:
                out.update(
                    target_quantile=self.config["dp.target_quantile"],
                    clip_lr=self.config["dp.clip_lr"],
                    count_noise=self.count_sigma,
                    final_clip=state.get("clip"),
                )
        else:
            out.update(
                mechanism="DP-SGD on every client (Opacus): per-sample gradients clipped to "
                "norm C, Gaussian noise of std noise_multiplier * C per step, Poisson-sampled "
                "batches; each client accounts for its own samples",
                clip=self.config["dp.clip"],
                noise_multiplier=self.sigma if not self.target else None,
                client_noise_multipliers=dict(state.get("sigmas", {})),
                client_epsilons=dict(state.get("epsilons", {})),
                neighbouring="add or remove one training sample of a client",
                grad_sample="/".join(state.get("grad_sample", [])) or None,
                calibrated=self.target is not None and self.config["dp.on_target"] == "calibrate",
            )
        return out


def hides_sampling(config: Config) -> bool:
    """Whether the run's client sampling is secret (client-level DP at ``sample_fraction < 1``:
    the accountant amplifies on it), so that nothing the run writes may say which clients a
    round sampled: records hold the count, traffic one total, no client snapshot is stored."""
    return dp_level(config) == CLIENT and config["sample_fraction"] < 1.0


#: what a record says in place of a client's id where the sampling is secret
HIDDEN_CLIENT = "(hidden: secret DP client sampling)"
#: the one traffic entry of a round whose sampling is secret (every client's bytes summed)
ALL_CLIENTS = "(all clients)"


def is_private(config: Config) -> bool:
    """Whether a run carries DP or secure aggregation (its reports are restricted)."""
    return dp_level(config) != NONE or bool(config["secagg.enabled"])


def private_scalars(scalars: Mapping[str, Any]) -> dict[str, Any]:
    """The record-safe part of an update's scalars in a private run: none of a client's own
    values (the privacy layer's per-client bits and epsilons stay out of results.json)."""
    return {k: v for k, v in scalars.items() if not k.startswith(DP_PREFIX)}


def client_reply(
    config: Config,
    received: Mapping[str, torch.Tensor],
    trained: dict[str, torch.Tensor],
    scalars: Mapping[str, Any],
    allowed: Sequence[str],
    where: str,
) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """What a client of a private run sends up after training: its update (clipped at
    client level, from the ``received`` global state, to the fit message's ``dp.clip``) and
    only the scalars the run may carry: ``num_examples`` (not at client level), the privacy
    layer's own, and plugin scalars declared as privatised (``allowed``); the training loss
    stays on the client; any other scalar is refused."""
    level = dp_level(config)
    own = {k: v for k, v in scalars.items() if k in DP_SCALARS}
    plugin = {
        k: v
        for k, v in scalars.items()
        if k not in own and k != "num_examples" and k != "loss" and not k.startswith("loss.")
    }
    problem = undeclared(plugin, allowed, where)
    if problem:
        raise FedkitError(problem)
    out = {**plugin, **own}
    if level == CLIENT:
        trained, within = client_level.clip_update(received, trained, float(scalars[CLIP]))
        out.pop(CLIP, None)
        if config["dp.clipping"] == "adaptive":
            out[UNCLIPPED] = float(within)
    else:
        out["num_examples"] = scalars["num_examples"]
    return trained, out


def privatised_channels(channels: Sequence[Any]) -> list[str]:
    """The names of the declared channels a plugin privatises (allowed in private runs)."""
    return [c.name for _, c in channels if c.privatised is not None]
