"""The hook contract, exercised need by need with throwaway plugins registered at run time.

One probe plugin implements every need of design.md's table (model changes, priors, loss
terms, statistics before/after training, client-persistent state, upload selection, custom
aggregation with an extra round trip, evaluation scopes, a different model per client) and
records what it sees; each test checks one need.
"""

from __future__ import annotations

import hashlib
import inspect
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from fedkit_core import run
from fedkit_core.hooks import hookspecs
from fedkit_core.plugin import FedkitError, Option, Payload, Reply, hookimpl, weighted_average
from fedkit_core.testing import InterruptAfter, tiny

BIG_CLIENT = "site1"


class Probe:
    """Implements every hook and records what it was given."""

    def __init__(self) -> None:
        self.seen: dict[str, list] = {}

    def note(self, key: str, value) -> None:
        self.seen.setdefault(key, []).append(value)

    @hookimpl
    def fedkit_options(self):
        return [Option("term", float, 0.25, "constant extra loss term")]

    @hookimpl
    def fedkit_check(self, server):
        self.note("check", (server.task.kind, server.options()["term"]))

    @hookimpl
    def fedkit_server_priors(self, server):
        return {"probe.class_vec": torch.arange(server.task.num_classes, dtype=torch.float32)}

    @hookimpl
    def fedkit_configure_fit(self, server, client_id):
        server.state["sent"] = server.state.get("sent", 0) + 1
        return Payload(
            {"probe.id": torch.tensor([float(client_id[-1])])}, {"probe.round": server.round}
        )

    @hookimpl
    def fedkit_client_priors(self, client):
        self.note("client_priors_see_server", ("probe.class_vec" in client.priors, client.id))
        encoder = nn.Linear(3, 2).eval().requires_grad_(False)
        return {"probe.encoder": encoder}

    @hookimpl
    def fedkit_extend_model(self, model, ctx):
        self.note("extend", (ctx.client_id, "probe.class_vec" in ctx.priors))
        model.add_extra("probe_proj", nn.Linear(model.feature_dim, 4))
        if ctx.client_id is not None:
            model.add_extra(
                "probe_personal", nn.Linear(model.feature_dim, ctx.task.num_classes), private=True
            )
        if ctx.client_id == BIG_CLIENT:  # a larger private model on one client only
            model.add_extra(
                "probe_large",
                nn.Sequential(nn.Flatten(), nn.LazyLinear(7)),
                private=True,
                input="image",
            )

    @hookimpl
    def fedkit_round_start(self, client):
        self.note("scratch_at_start", dict(client.scratch))
        client.scratch["received_head"] = client.model.head.weight.detach().clone()
        client.state["fits"] = client.state.get("fits", 0) + 1
        self.note(
            "received",
            (
                client.id,
                client.round,
                dict(client.received.scalars),
                client.received.arrays["probe.id"].item(),
            ),
        )
        self.note("own_info", (client.id, client.info.id, client.info.num_train))

    @hookimpl
    def fedkit_loss_terms(self, client, batch, outputs):
        personal = nn.functional.cross_entropy(outputs["probe_personal"], batch.y)
        return {
            "probe.const": torch.tensor(client.options()["term"]),
            "probe.personal": personal,
        }

    @hookimpl
    def fedkit_client_report(self, client):
        moved = (client.model.head.weight.detach() - client.scratch["received_head"]).norm().item()
        return {"probe.moved": moved, "probe.fits": client.state["fits"]}

    @hookimpl
    def fedkit_answer_query(self, client, query, arrays, scalars):
        if query != "probe.dot":
            return None
        local = client.model.head.weight.detach().cpu()
        return Reply(scalars={"dot": float((local * arrays["head"]).sum()), "echo": scalars["tag"]})

    @hookimpl
    def fedkit_aggregate(self, server, updates, ask):
        self.note("uploaded_keys", {u.client_id: sorted(u.arrays) for u in updates})
        self.note("scalars", {u.client_id: dict(u.scalars) for u in updates})
        head = server.global_state["head.weight"]
        replies = ask("probe.dot", arrays={"head": head}, scalars={"tag": "hello"})
        expected = {u.client_id: float((u.arrays["head.weight"] * head).sum()) for u in updates}
        self.note("replies", ({c: r.scalars for c, r in replies.items()}, expected))
        return weighted_average([u.arrays for u in updates], [1.0] * len(updates))

    @hookimpl
    def fedkit_eval_views(self, client):
        return {"personal": "probe_personal"}

    @hookimpl
    def fedkit_client_view(self, client):
        return "personal"

    @hookimpl
    def fedkit_metrics(self, server, arrays):
        if "probs" in arrays:
            return {"probe_n": float(len(arrays["labels"]))}

    @hookimpl
    def fedkit_summary(self, server, scopes):
        return {"probe.gap": scopes["global"]["bacc"] - scopes["clients_mean"]["bacc"]}


@pytest.fixture(scope="module")
def probed():
    probe = Probe()
    results = run(tiny(rounds=3), plugins={"probe": probe})
    return probe, results


def test_every_hook_is_documented():
    for name, spec in inspect.getmembers(hookspecs, inspect.isfunction):
        if not name.startswith("fedkit_"):
            continue
        doc = inspect.getdoc(spec) or ""
        assert len(doc) > 120, f"{name} lacks documentation"
        assert "called" in doc.lower(), f"{name} does not say when it is called"
        assert "return" in doc.lower() or name in ("fedkit_round_start", "fedkit_extend_model"), (
            f"{name} does not say what it returns"
        )
        first = getattr(spec, "fedkit_spec", {}).get("firstresult")
        kind = (
            "exclusive" if name in hookspecs.EXCLUSIVE_HOOKS else "first" if first else "additive"
        )
        assert kind in doc.lower(), f"{name} does not say it is {kind}"


def test_exclusive_hooks_are_declared_on_their_specs():
    assert set(hookspecs.EXCLUSIVE_HOOKS) == {
        "fedkit_build_model",
        "fedkit_optimizer",
        "fedkit_task_loss",
        "fedkit_aggregate",
        "fedkit_client_view",
        "fedkit_select_clients",
    }


def documented_exclusive_hooks(doc: Path) -> set[str]:
    """The hooks docs/architecture.md names in its "Exclusive hooks (...)" bullet."""
    bullet = doc.read_text().split("* Exclusive hooks", 1)[1].split("\n* ", 1)[0]
    return set(re.findall(r"`(fedkit_\w+)`", bullet))


def test_the_architecture_doc_lists_the_exclusive_hooks_marked_on_the_specs():
    doc = Path(__file__).resolve().parents[1] / "docs" / "architecture.md"
    assert documented_exclusive_hooks(doc) == set(hookspecs.EXCLUSIVE_HOOKS)


def test_every_hook_takes_one_context_of_its_side():
    sides = {"server": "server", "client": "client", "ctx": "either"}
    for name, spec in inspect.getmembers(hookspecs, inspect.isfunction):
        # the hooks that declare rather than act (options, CLI commands, selection rules and
        # round modes: they are called before a run's contexts exist)
        declaring = (
            "fedkit_options",
            "fedkit_register_commands",
            "fedkit_register_selection_rules",
            "fedkit_register_round_modes",
        )
        if not name.startswith("fedkit_") or name in declaring:
            continue
        params = list(inspect.signature(spec).parameters)
        contexts = [p for p in params if p in sides]
        assert len(contexts) == 1, f"{name} takes {params}"


def test_plugin_options_are_typed_namespaced_and_saved(probed):
    probe, results = probed
    assert results["config"]["probe"] == {"term": 0.25}
    assert probe.seen["check"][0] == ("classification", 0.25)
    with pytest.raises(FedkitError, match="probe.term"):
        run(tiny(probe={"term": "lots"}), plugins={"probe": Probe()})
    with pytest.raises(FedkitError, match="unknown config key 'probe.trem'"):
        run(tiny(probe={"trem": 1.0}), plugins={"probe": Probe()})


def test_priors_reach_models_and_clients(probed):
    probe, results = probed
    assert all(seen for seen, _ in probe.seen["client_priors_see_server"])
    roles = {client for client, has_prior in probe.seen["extend"] if has_prior}
    assert roles == {None, "site0", "site1", "site2"}  # server and every client built with priors
    # results.json identifies each server prior by its shape, dtype and bytes
    data = np.arange(4, dtype=np.float32).tobytes()
    assert results["priors"] == {
        "probe.class_vec": {
            "shape": [4],
            "dtype": "float32",
            "sha256": hashlib.sha256(data).hexdigest(),
        }
    }


def test_private_entries_never_uploaded_and_large_model_only_on_its_client(probed):
    probe, _ = probed
    for keys_by_client in probe.seen["uploaded_keys"]:
        for keys in keys_by_client.values():
            assert any(k.startswith("extras.probe_proj.") for k in keys), "shared extras go up"
            assert not any("probe_personal" in k or "probe_large" in k for k in keys)
        assert len({tuple(v) for v in keys_by_client.values()}) == 1, (
            "every client uploads the same entries"
        )


def test_loss_terms_add_up_and_client_scalars_go_up(probed):
    probe, results = probed
    for record in results.rounds:
        for train in record["train"].values():
            assert train["loss.probe.const"] == pytest.approx(0.25)
            total = train["loss.task"] + train["loss.probe.const"] + train["loss.probe.personal"]
            assert train["loss"] == pytest.approx(total, rel=1e-5)
    for rnd, scalars in enumerate(probe.seen["scalars"], start=1):
        for values in scalars.values():
            assert values["num_examples"] > 0
            assert values["probe.moved"] > 0, "statistics before and after training differ"
            assert values["probe.fits"] == rnd, "client state persists across rounds"


def test_extra_round_trip_reaches_every_client_with_its_local_model(probed):
    probe, _ = probed
    for replies, expected in probe.seen["replies"]:
        assert set(replies) == set(expected)
        for cid, scalars in replies.items():
            assert scalars["echo"] == "hello"
            assert scalars["dot"] == pytest.approx(expected[cid], rel=1e-5)


def test_evaluation_scopes_use_personal_output_and_summary(probed):
    _, results = probed
    final = results.final
    assert final["global"]["probe_n"] == sum(
        final["clients"][c]["probe_n"] for c in final["clients"]
    )
    assert final["summary"]["probe.gap"] == pytest.approx(
        final["global"]["bacc"] - final["clients_mean"]["bacc"]
    )


class SecondAggregator:
    @hookimpl
    def fedkit_aggregate(self, server, updates, ask):
        return None


def test_two_aggregators_are_reported_as_a_conflict():
    with pytest.raises(FedkitError, match="fedkit_aggregate"):
        run(tiny(), plugins={"probe": Probe(), "other": SecondAggregator()})


class Refuses:
    @hookimpl
    def fedkit_check(self, server):
        kind = server.task.kind
        return "refuses needs a segmentation task" if kind != "segmentation" else None


def test_check_hook_refuses_a_run():
    with pytest.raises(FedkitError, match="needs a segmentation task"):
        run(tiny(), plugins={"refuses": Refuses()})


class UnknownHook:
    @hookimpl
    def fedkit_agregate(self, server, updates, ask):  # misspelt on purpose
        return None


def test_a_misspelt_hook_is_a_clear_error():
    with pytest.raises(FedkitError, match="does not fit fedkit's hook contract"):
        run(tiny(), plugins={"typo": UnknownHook()})


class Counter:
    """Client state that must survive an interruption and a resume."""

    @hookimpl
    def fedkit_round_start(self, client):
        client.state["fits"] = client.state.get("fits", 0) + 1

    @hookimpl
    def fedkit_client_report(self, client):
        return {"counter.fits": client.state["fits"]}


@pytest.mark.slow
def test_client_state_survives_interruption_and_resume(tmp_path):
    from fedkit_core import resume

    config = tiny(rounds=4, checkpoint=True)
    with pytest.raises(KeyboardInterrupt):
        run(
            config, plugins={"counter": Counter()}, out=tmp_path / "run", observer=InterruptAfter(2)
        )
    resumed = resume(tmp_path / "run", plugins={"counter": Counter()})
    fits = [rec["train"]["site0"]["counter.fits"] for rec in resumed.rounds]
    assert fits == [1, 2, 3, 4]
    straight = run(config, plugins={"counter": Counter()})
    assert resumed.final["global"] == straight.final["global"]
    assert resumed.final["clients"] == straight.final["clients"]


def test_fit_messages_carry_plugin_payloads_and_server_state_persists(probed):
    probe, results = probed
    for cid, rnd, scalars, ident in probe.seen["received"]:
        assert scalars == {"probe.round": rnd}
        assert ident == float(cid[-1])
    assert len(probe.seen["received"]) == 3 * 3  # 3 rounds x 3 clients


def test_scratch_is_emptied_each_round_and_clients_see_only_their_own_info(probed):
    probe, _ = probed
    assert all(not scratch for scratch in probe.seen["scratch_at_start"])
    assert all(cid == own for cid, own, _ in probe.seen["own_info"])


def test_the_task_description_carries_no_client_statistics(probed):
    _, results = probed
    assert set(results["task"]["client_ids"]) == {"site0", "site1", "site2"}
    text = repr(results["task"])
    assert "class_counts" not in text and "num_train" not in text


def test_bytes_are_counted_per_client_and_round(probed):
    _, results = probed
    for record in results.rounds:
        assert set(record["bytes"]) == {"site0", "site1", "site2"}
        for counts in record["bytes"].values():
            assert counts["down"] > 0 and counts["up"] > 0
    assert results.final["bytes"]["up"] == sum(
        c["up"] for r in results.rounds for c in r["bytes"].values()
    ) + sum(c["up"] for c in results["setup_bytes"].values())


class OwnsLoss:
    """A task loss of its own: a constant, so another plugin's head can be checked to use it."""

    @hookimpl
    def fedkit_task_loss(self, client, batch, outputs):
        return outputs["logits"].sum() * 0 + 7.0


class UsesTaskLoss:
    @hookimpl
    def fedkit_loss_terms(self, client, batch, outputs):
        return {"uses.aux": client.task_loss(batch, {"logits": outputs["logits"] * 2})}


def test_a_plugin_runs_the_task_loss_through_the_hook_chain():
    results = run(tiny(rounds=1), plugins={"owns": OwnsLoss(), "uses": UsesTaskLoss()})
    for train in results.rounds[0]["train"].values():
        assert train["loss.uses.aux"] == pytest.approx(7.0)


class FrozenHead:
    """Gives the head its own optimiser group with a zero learning rate."""

    @hookimpl
    def fedkit_param_groups(self, client):
        return [{"params": list(client.model.head.parameters()), "lr_scale": 0.0}]

    @hookimpl
    def fedkit_round_start(self, client):
        client.scratch["head"] = client.model.head.weight.detach().clone()
        client.scratch["body"] = next(client.model.backbone.parameters()).detach().clone()

    @hookimpl
    def fedkit_client_report(self, client):
        head = (client.model.head.weight.detach() - client.scratch["head"]).abs().max()
        body = (next(client.model.backbone.parameters()).detach() - client.scratch["body"]).abs()
        return {"frozen.head": float(head), "frozen.body": float(body.max())}


def test_param_groups_give_parts_of_the_model_their_own_learning_rate():
    results = run(
        tiny(rounds=1, optimizer="sgd", momentum=0.0, lr=0.1), plugins={"f": FrozenHead()}
    )
    for train in results.rounds[0]["train"].values():
        assert train["frozen.head"] == 0.0
        assert train["frozen.body"] > 0.0


class NoCommonModel:
    """Clients serve a private head only: the pooled global scope is meaningless."""

    @hookimpl
    def fedkit_extend_model(self, model, ctx):
        if ctx.client_id is not None:
            model.add_extra("own", nn.Linear(model.feature_dim, ctx.task.num_classes), private=True)

    @hookimpl
    def fedkit_eval_views(self, client):
        return {"global": None, "own": "own"}

    @hookimpl
    def fedkit_client_view(self, client):
        return "own"


def test_views_are_additive_and_the_global_scope_can_be_declared_meaningless():
    results = run(tiny(rounds=1), plugins={"nc": NoCommonModel()})
    final = results.final
    assert final["global"] == {}
    assert set(final["views"]) == {"own"}
    assert final["clients"] == final["views"]["own"]["clients"]
    assert final["fairness"]["std"] >= 0
    assert final["best"]["round"] == 1  # chosen on the clients' mean when there is no global


class Buggy:
    @hookimpl
    def fedkit_loss_terms(self, client, batch, outputs):
        raise ZeroDivisionError("a bug in the plugin")


def test_a_plugin_bug_on_a_client_is_exit_code_1_with_client_and_round():
    from fedkit_core.errors import ClientFailure

    with pytest.raises(ClientFailure) as caught:
        run(tiny(rounds=1), plugins={"buggy": Buggy()})
    assert caught.value.exit_code == 1
    assert "client 'site0' failed in round 1" in str(caught.value)
    assert "ZeroDivisionError" in str(caught.value) and "--debug" in str(caught.value)


def test_a_plugin_registered_under_another_name_reads_its_options_under_that_name():
    import fedkit_fca.plugin as fca

    results = run(tiny(rounds=1, myfca={"l1": 0.0}), plugins={"myfca": fca})
    assert results["config"]["myfca"]["l1"] == 0.0
    for train in results.rounds[0]["train"].values():
        assert train["loss.task"] == 0.0  # l1 = 0 zeroes FCA's federated-head loss
        assert train["loss.fca.personal"] > 0
    assert "personal" in results.final["views"]


def test_plugin_option_ranges_and_checks_come_before_any_data_is_loaded(tmp_path):
    missing = {"task": {"name": "npz", "path": str(tmp_path / "missing.npz")}}
    with pytest.raises(FedkitError, match=">= 0"):
        run({**missing, "probe": {"term": -1.0}}, plugins={"probe": Ranged()})
    with pytest.raises(FedkitError, match="needs a segmentation task"):
        run(missing, plugins={"refuses": Refuses()})
    with pytest.raises(FedkitError, match="missing.npz"):  # the data error comes after
        run(missing)


class Ranged:
    @hookimpl
    def fedkit_options(self):
        return [Option("term", float, 0.25, "a non-negative weight", min=0.0)]


class Carrier:
    """Sends arrays up beside the model (a report returning a Payload) and chooses the
    round's clients: two of three, in turns."""

    def __init__(self, choice=None) -> None:
        self.seen: list[dict] = []
        self.choice = choice

    @hookimpl
    def fedkit_select_clients(self, server, clients):
        if self.choice is not None:
            return self.choice
        return [c for i, c in enumerate(clients) if i != (server.round - 1) % len(clients)]

    @hookimpl
    def fedkit_client_report(self, client):
        return Payload({"carrier.head": 2 * client.model.head.weight.detach()}, {"carrier.n": 7})

    @hookimpl
    def fedkit_aggregate(self, server, updates, ask):
        self.seen.append({u.client_id: u for u in updates})
        return None  # the built-in FedAvg


def test_a_report_sends_arrays_up_beside_the_model_and_their_bytes_count():
    carrier = Carrier()
    results = run(tiny(rounds=3, eval_test="every"), plugins={"carrier": carrier})
    assert [r["sampled"] for r in results.rounds] == [
        ["site1", "site2"],
        ["site0", "site2"],
        ["site0", "site1"],
    ]
    for updates in carrier.seen:
        for update in updates.values():
            assert set(update.payload) == {"carrier.head"}
            assert torch.equal(update.payload["carrier.head"], 2 * update.arrays["head.weight"])
            assert not any(k.startswith("payload/") for k in update.arrays)
            assert update.scalars["carrier.n"] == 7

    # the same run without the payload: its bytes up are the payload's fewer
    class Plain(Carrier):
        @hookimpl
        def fedkit_client_report(self, client):
            return {"carrier.n": 7}

    plain = run(tiny(rounds=3, eval_test="every"), plugins={"carrier": Plain()})
    head = carrier.seen[0]["site1"].payload["carrier.head"]
    extra = head.numel() * head.element_size() + len("payload/carrier.head")
    for mine, theirs in zip(results.rounds, plain.rounds, strict=True):
        for cid in mine["sampled"]:
            assert mine["bytes"][cid]["up"] - theirs["bytes"][cid]["up"] == extra


@pytest.mark.parametrize(
    ("choice", "message"), [(["nowhere"], "unknown clients"), ([], "no client")]
)
def test_a_bad_choice_of_clients_is_a_clear_error(choice, message):
    with pytest.raises(FedkitError, match=message):
        run(tiny(rounds=1), plugins={"carrier": Carrier(choice)})
