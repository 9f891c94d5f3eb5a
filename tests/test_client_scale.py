"""Many clients of a few samples each (issue 16): clients sharing one model are evaluated
together, in batches across clients, and score as if each had evaluated alone."""

import pytest
import torch

from fedkit_core import run
from fedkit_core.contract.messages import Message
from fedkit_core.engines import local
from fedkit_core.engines.client import ClientRuntime, SharedModel
from fedkit_core.testing import tiny


def _many(**overrides):
    """40 clients on ~165 training samples: some clients have no val or test samples; the
    evaluation batches of 8 run across clients."""
    return tiny(
        clients=40,
        sample_fraction=0.1,
        eval_batch_size=8,
        **{"partition.kind": "iid"},
        **overrides,
    )


def _without_times(results):
    return [{k: v for k, v in r.items() if k != "seconds"} for r in results.rounds]


@pytest.mark.slow
@pytest.mark.parametrize("evaluation", ["pooled", "federated"])
def test_joint_evaluation_scores_as_each_client_alone(monkeypatch, evaluation):
    config = _many(evaluation=evaluation, rounds=1)
    joint = run(config)
    scored = [cid for cid, metrics in joint.rounds[-1]["clients"].items() if metrics]
    assert 0 < len(scored) < 40  # clients without test samples have no scores, and no error
    monkeypatch.setattr(local, "shared_model", lambda *a: None)  # a model per client
    alone = run(config)
    assert _without_times(joint) == _without_times(alone)
    assert joint.final["global"] == alone.final["global"]


def test_each_member_gets_its_own_reply_once_per_message(monkeypatch):
    """The joint evaluation runs once per message, every member taking its own reply; the
    same message asked again is evaluated again (nothing stale is handed out)."""
    built: list[SharedModel] = []
    share = local.shared_model
    monkeypatch.setattr(local, "shared_model", lambda *a: built.append(share(*a)) or built[-1])
    calls = []
    joint = SharedModel._evaluate_all
    monkeypatch.setattr(
        SharedModel, "_evaluate_all", lambda self, m: calls.append(m) or joint(self, m)
    )
    results = run(_many(rounds=1))
    assert len(calls) == 1 and len(built[0].members) == 40
    group = built[0]
    member: ClientRuntime = group.members["c0"]
    message = calls[0]
    again = Message(message.kind, dict(message.arrays), dict(message.scalars))
    first = group.evaluate(member, again)  # c0 took its reply already: evaluated anew
    assert len(calls) == 2
    other = group.evaluate(group.members["c1"], again)  # kept from the joint evaluation
    assert len(calls) == 2
    for reply in (first, other):
        assert reply.scalars == {"view": "global"}
    assert torch.equal(first.arrays["test/labels"], member.ctx.data["test"].targets.long())
    assert results.final["round"] == 1


def test_client_splits_are_views_of_one_gathered_copy():
    """A thousand clients' splits cost one indexing operation, not one each: the parts are
    views of one copy, with the very samples ``subset`` gives."""
    import numpy as np

    from fedkit_core.contract.data import Split

    images = torch.arange(30 * 2, dtype=torch.uint8).reshape(30, 2, 1, 1)
    split = Split(images, torch.arange(30) % 3)
    parts = [np.array([4, 2, 9]), np.array([], dtype=int), np.array([0]), np.array([29, 5])]
    views = split.subsets(parts)
    for view, index in zip(views, parts):
        alone = split.subset(index)
        assert torch.equal(view.images, alone.images) and torch.equal(view.targets, alone.targets)
        assert view.targets.dtype == alone.targets.dtype and view.images.is_contiguous()
    storages = {v.images.untyped_storage().data_ptr() for v in views}
    assert len(storages) == 1 and views[0].images.untyped_storage().data_ptr() != (
        images.untyped_storage().data_ptr()
    )
