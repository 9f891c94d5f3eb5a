"""How the global model is evaluated: the evaluation mode, which splits a round scores, the
best round's kept state, and evaluation carried with the next round's fit messages."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from fedkit_core.config import Config
from fedkit_core.contract.messages import Arrays, Message, enclose, take_out
from fedkit_core.contract.protocol import EVALUATION
from fedkit_core.engines.exchange import Exchange, Transport
from fedkit_core.engines.scoring import Scoring
from fedkit_core.hooks.context import ServerContext
from fedkit_core.results.schema import best_round


class Evaluation:
    """Every client evaluates the global model (and its own views); the round records'
    evaluation entries. ``records``: the run's records so far (the best round is chosen
    among them); ``last_round``: the run's last round as now known; ``deployed``: a Flower
    deployment (``evaluation=auto`` and ``eval_with_fit=auto`` choose by it)."""

    def __init__(
        self,
        config: Config,
        ctx: ServerContext,
        hook: Any,
        exchange: Exchange,
        records: list[dict[str, Any]],
        last_round: Callable[[], int],
        deployed: bool,
    ):
        self.config, self.ctx, self.exchange = config, ctx, exchange
        self.records, self.last_round = records, last_round
        #: evaluation mode: ``evaluation=auto`` is federated when deployed, else pooled
        self.mode = config["evaluation"]
        if self.mode == "auto":
            self.mode = "federated" if deployed else "pooled"
        self.scoring = Scoring(ctx, hook, self.mode == "federated")
        #: whether clients evaluate the global model alone (no plugins, nothing private)
        self.global_only = False
        #: ``eval_test=improved`` with :attr:`global_only`: the round best on validation so
        #: far and its global state, whose test split is scored in the last round if needed
        self.best_state: dict[str, Any] | None = None
        #: whether a round's evaluation may travel with the next round's fit messages
        #: (``eval_with_fit``; only with :attr:`global_only`, see :meth:`setup`)
        self.with_fit = config["eval_with_fit"] == "true" or (
            config["eval_with_fit"] == "auto" and deployed
        )
        #: the record of the last round while its evaluation waits for the next round's
        #: fit messages
        self.pending: dict[str, Any] | None = None

    def setup(self, global_only: bool) -> None:
        """Whether clients evaluate the global model alone, known once the model is built."""
        self.global_only = global_only
        self.with_fit = self.with_fit and global_only

    def evaluate(self, transport: Transport, rnd: int) -> dict[str, Any]:
        """Every client evaluates the new global model (and its own views); metrics per
        split, view and scope. Validation is scored in every evaluated round, the test split
        with ``eval_test=every`` in every one too; with ``improved`` only in the last round
        and in the round that :func:`best_round` (the choice of ``final.best``) reports, so
        the final and best-round results are those of ``every``.

        A round whose validation makes it the best so far is tested at once when clients
        evaluate with state of their own (plugins, private model entries); else evaluation
        depends on the global model alone, which is kept (:attr:`best_state`) and tested in
        the last round only if no later round did better (its record gets the test scopes
        then), so a run tests the test split once or twice."""
        splits = self._splits(rnd)
        arrays, served = self._evaluate(transport, rnd, splits, self.ctx.global_state)
        return self._evaluated(transport, rnd, splits, arrays, served)

    def with_fit_messages(
        self, transport: Transport, messages: dict[str, Message], pending: dict[str, Any]
    ) -> dict[str, Message]:
        """Send the fit ``messages`` with the evaluation of the ``pending`` round (of the
        global state they carry) to every client: sampled clients get it inside their fit
        message, the others on its own. Records the evaluation in ``pending``; returns the
        fit replies."""
        rnd = pending["round"]
        splits = self._splits(rnd)
        evaluation = self._message(rnd, splits, self.ctx.global_state)
        asked = Message("evaluate", scalars=evaluation.scalars)  # the fit carries the state
        combined = {
            cid: enclose(messages[cid], asked, EVALUATION) if cid in messages else evaluation
            for cid in self.ctx.task.client_ids
        }
        replies = self.exchange.send(transport, combined)
        fits: dict[str, Message] = {}
        evaluations: dict[str, Message] = {}
        for cid, reply in replies.items():
            if cid in messages:
                fits[cid], evaluations[cid] = take_out(reply, EVALUATION, "evaluate")
            else:
                evaluations[cid] = reply
        arrays, served = self._results(rnd, evaluations)
        pending.update(self._evaluated(transport, rnd, splits, arrays, served))
        return fits

    def _splits(self, rnd: int) -> str:
        """The splits round ``rnd`` evaluates first: validation, and test where
        ``eval_test`` asks for it in every evaluated round, and in the last round."""
        if self.config["eval_test"] == "every" or rnd == self.last_round():
            return "val,test"
        return "val"

    def _evaluated(
        self,
        transport: Transport,
        rnd: int,
        splits: str,
        arrays: dict[str, dict[str, np.ndarray]],
        served: dict[str, str],
    ) -> dict[str, Any]:
        """The evaluation entries of round ``rnd``'s record from the clients' replies for
        ``splits`` (see :meth:`evaluate`); asks for the test split where it must."""
        every = self.config["eval_test"] == "every"
        val = self.scoring.scopes(arrays, served, "val")
        if "test" in splits.split(","):
            if not every and not self._improves(rnd, val):
                self._test_kept_best(transport, rnd, val)
        else:
            if not self._improves(rnd, val):
                return {"evaluated": ["val"], "val": val}
            if self.global_only:
                state = {k: v.clone() for k, v in self.ctx.global_state.items()}
                self.best_state = {"round": rnd, "state": state}
                return {"evaluated": ["val"], "val": val}
            arrays, served = self._evaluate(transport, rnd, "test", self.ctx.global_state)
        test = self.scoring.scopes(arrays, served, "test")
        return {"evaluated": ["val", "test"], **test, "val": val}

    def _test_kept_best(self, transport: Transport, last: int, val: Mapping[str, Any]) -> None:
        """Score the test split of the kept best round's global model into its record (the
        ``last`` round, of validation scopes ``val``, did not do better)."""
        kept = self.best_state
        if kept is None or self._best_so_far(last, val) != kept["round"]:
            return
        rnd = kept["round"]
        arrays, served = self._evaluate(transport, rnd, "test", kept["state"])
        record = next(r for r in self.records if r["round"] == rnd)
        record.update({"evaluated": ["val", "test"], **self.scoring.scopes(arrays, served, "test")})

    def _evaluate(
        self, transport: Transport, rnd: int, splits: str, state: Arrays
    ) -> tuple[dict[str, dict[str, np.ndarray]], dict[str, str]]:
        """Send every client an ``evaluate`` message of the global ``state`` of round
        ``rnd`` for ``splits``; the replies' arrays and the view that scores each client."""
        message = self._message(rnd, splits, state)
        replies = self.exchange.send(transport, {cid: message for cid in self.ctx.task.client_ids})
        return self._results(rnd, replies)

    def _message(self, rnd: int, splits: str, state: Arrays) -> Message:
        return Message("evaluate", state, {"round": rnd, "splits": splits, "mode": self.mode})

    def _results(
        self, rnd: int, replies: dict[str, Message]
    ) -> tuple[dict[str, dict[str, np.ndarray]], dict[str, str]]:
        """The arrays of every client's evaluation reply and the view that scores it."""
        required = self.exchange.required(len(self.ctx.task.client_ids))
        ok = self.exchange.failures("evaluate", rnd, replies, required=required)
        served = {cid: str(replies[cid].scalars["view"]) for cid in ok}
        arrays = {cid: {k: v.numpy() for k, v in replies[cid].arrays.items()} for cid in ok}
        return arrays, served

    def _improves(self, rnd: int, val: Mapping[str, Any]) -> bool:
        """Whether round ``rnd``'s validation scopes make it the best round so far."""
        return self._best_so_far(rnd, val) == rnd

    def _best_so_far(self, rnd: int, val: Mapping[str, Any]) -> int | None:
        """The best round on validation of the records and round ``rnd`` (scopes ``val``)."""
        evaluated = [r for r in self.records if "val" in r] + [{"round": rnd, "val": val}]
        best = best_round(evaluated, self.ctx.task.main_metric)
        return None if best is None else best[0]["round"]
