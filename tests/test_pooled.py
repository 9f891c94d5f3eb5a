"""The pooled reference (``pooled=true``): central training on the union of the clients'
training data with the federation's number of steps, scored on the same test sets as a
method of the same seed."""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest
import torch
import yaml
from torch.optim.optimizer import register_optimizer_step_post_hook

from fedkit_core import resume, run
from fedkit_core.cli import main
from fedkit_core.contract.observer import Observer
from fedkit_core.engines.pooled import TRAINER, round_steps
from fedkit_core.engines.scoring import Scoring
from fedkit_core.errors import FedkitError
from fedkit_core.federation import prepare
from fedkit_core.hooks.context import ClientContext, batch_count
from fedkit_core.resolve import resolve_config
from fedkit_core.testing import InterruptAfter, tiny, tiny_seg

#: four clients of unequal sizes, half of them sampled each round, two local epochs, one
#: process (the step counter below sees this process's optimisers only)
CONFIG = tiny(
    rounds=2,
    clients=4,
    sample_fraction=0.5,
    local_epochs=2,
    partition={"kind": "dirichlet", "alpha": 0.5},
    task={"sites": 1},
    local={"workers": "0"},
)


def federation(config):
    cfg, plugins = resolve_config(config)
    return prepare(cfg, plugins)


def test_batch_count_is_the_number_of_batches_made():
    fed = federation(tiny())
    data = next(iter(fed.clients.values()))
    ctx = ClientContext(fed.task, fed.config, fed.device, client_id="c", data=data)
    whole = data.splits["train"]
    for n in (1, 2, 3, 7, 8, 9, 16, 17):
        data.splits["train"] = whole.subset(np.arange(n))
        for size in (1, 2, 4, 8):
            for drop_last in (False, True):
                for augment in (False, True):
                    made = ctx.batches(
                        "train", batch_size=size, drop_last=drop_last, augment=augment
                    )
                    expected = batch_count(n, size, drop_last=drop_last, augment=augment)
                    assert len(list(made)) == expected, (n, size, drop_last, augment)
    assert batch_count(17, 8, augment=True) == 2  # a trailing single sample does not train
    assert batch_count(1, 8, augment=True) == 1  # unless it is the only one


class StepCounter(Observer):
    """Optimisation steps of every optimiser of this process, per round."""

    def __init__(self) -> None:
        self.total = 0
        self.per_round: list[int] = []
        self.handle = register_optimizer_step_post_hook(self._step)

    def _step(self, optimizer, args, kwargs) -> None:
        self.total += 1

    def on_round_end(self, record) -> None:
        self.per_round.append(self.total - sum(self.per_round))


def counted(config):
    counter = StepCounter()
    try:
        return run(config, observer=counter), counter.per_round
    finally:
        counter.handle.remove()


def test_pooled_makes_the_federations_steps_each_round():
    sizes = {cid: len(d["train"]) for cid, d in federation(CONFIG).clients.items()}
    # a batch size that leaves one client a trailing single sample (which does not train)
    size = next(b for b in range(5, 40) if any(n % b == 1 for n in sizes.values()))
    config = {**CONFIG, "batch_size": size}
    fedavg, fedavg_steps = counted(config)
    pooled, pooled_steps = counted({**config, "pooled": True})
    assert pooled_steps == fedavg_steps
    for record in pooled.rounds:
        sampled = record["sampled"]
        assert len(sampled) == 2 and list(record["train"]) == [TRAINER]
        by_hand = 2 * sum(n // size + (n % size > 1) for n in (sizes[k] for k in sampled))
        assert record["train"][TRAINER]["steps"] == by_hand
        assert by_hand == round_steps(sizes, sampled, size, 2)
    # the same clients are sampled as in the method's rounds, and the budgets differ by round
    assert [r["sampled"] for r in pooled.rounds] == [r["sampled"] for r in fedavg.rounds]
    assert len(set(pooled_steps)) > 1


def test_pooled_is_scored_on_the_test_sets_of_a_method_of_the_seed(monkeypatch):
    scored: list[dict[str, tuple[int, str]]] = []
    scopes = Scoring.scopes

    def spy(self, arrays, served, split):
        if split == "test":
            scored.append(
                {
                    cid: (len(a["test/labels"]), hashlib.sha256(a["test/labels"]).hexdigest())
                    for cid, a in arrays.items()
                }
            )
        return scopes(self, arrays, served, split)

    monkeypatch.setattr(Scoring, "scopes", spy)
    fedavg = run(CONFIG)
    per_method = len(scored)
    pooled = run({**CONFIG, "pooled": True})
    assert scored[0] == scored[per_method]  # the same clients, sizes and labels
    assert set(scored[0]) == set(fedavg.final["clients"]) == set(pooled.final["clients"])
    assert sum(n for n, _ in scored[0].values()) > 0
    assert (
        pooled["reference"]["kind"] == "pooled" and "NOT federated" in pooled["reference"]["about"]
    )
    assert "reference" not in fedavg
    assert set(pooled.final["global"]) == set(fedavg.final["global"])
    assert pooled.final["global"] != fedavg.final["global"]


def test_pooled_trains_the_union_of_the_clients_training_data(monkeypatch):
    seen = {}
    from fedkit_core.engines import pooled as module

    union = module.pooled_data

    def spy(clients):
        before = [c["train"].targets.clone() for c in clients.values()]
        data = union(clients)
        seen["union"] = data["train"].targets
        seen["clients"] = [c["train"] for c in clients.values()]
        seen["before"] = before
        return data

    monkeypatch.setattr(module, "pooled_data", spy)
    run({**CONFIG, "pooled": True, "rounds": 1})
    assert torch.equal(seen["union"], torch.cat(seen["before"])) and len(seen["union"]) > 0
    storage = seen["union"].untyped_storage().data_ptr()
    for split, before in zip(seen["clients"], seen["before"]):  # views: the data held once
        assert split.targets.untyped_storage().data_ptr() == storage
        assert torch.equal(split.targets, before)


@pytest.mark.slow
def test_an_interrupted_pooled_run_resumes_to_the_same_results(tmp_path):
    config = {**CONFIG, "rounds": 3, "pooled": True, "checkpoint": True}
    config["keep_optimizer_state"] = True  # the trainer's optimiser is checkpointed too
    # the task's own training settings apply to the trainer, as to a method's clients
    config.update(loss="bsm", optimizer="sgd", lr=0.05, grad_clip=5.0)
    config.update(lr_schedule="step", lr_milestones=[2])
    whole = run(config)
    out = tmp_path / "run"
    with pytest.raises(KeyboardInterrupt):
        run(config, out=out, observer=InterruptAfter(2))
    resumed = resume(out)
    assert resumed.final["global"] == whole.final["global"]
    assert resumed.final["clients"] == whole.final["clients"]
    assert [r["train"] for r in resumed.rounds] == [r["train"] for r in whole.rounds]


@pytest.mark.parametrize(
    ("extra", "says"),
    [
        ({"engine": "flower"}, "only engine=local"),
        ({"plugins": ["solo"]}, "without method plugins"),
    ],
)
def test_pooled_refuses_what_it_cannot_be(extra, says):
    with pytest.raises(FedkitError, match=says):
        resolve_config({**tiny(), "pooled": True, **extra})


@pytest.mark.slow
def test_compare_shows_pooled_and_solo_beside_a_method(tmp_path, capsys):
    config = tmp_path / "tiny.yaml"
    config.write_text(yaml.safe_dump(tiny(rounds=1)))
    out = tmp_path / "cmp"
    args = ["compare", "fedavg", "pooled", "solo", "--config", str(config), "--seeds", "0,1"]
    assert main([*args, "--out", str(out)]) == 0
    printed = " ".join(capsys.readouterr().out.split())
    assert "pooled (reference: centralised)" in printed and "solo (reference: local)" in printed
    assert "gain in test bACC over solo per client" in printed
    table = json.loads((out / "compare.json").read_text())
    assert table["references"] == {"pooled": "pooled", "solo": "local"}
    assert set(table["clients"]["gains"]) == {"fedavg", "pooled"}
    assert set(table["clients"]["gains"]["pooled"]) == {"site0", "site1", "site2"}
    pooled = json.loads((out / "pooled" / "seed0" / "results.json").read_text())
    assert pooled["config"]["pooled"] is True and pooled["reference"]["kind"] == "pooled"


@pytest.mark.slow
def test_pooled_segmentation():
    results = run(tiny_seg(pooled=True, rounds=1))
    assert results["reference"]["kind"] == "pooled"
    assert "dice" in results.final["global"] and len(results.final["clients"]) == 3
