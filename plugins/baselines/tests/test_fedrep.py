"""FedRep: the head never leaves the client; head epochs (body fixed) then body epochs (head fixed)."""

import pytest
from fedkit_baselines import fedrep

from fedkit_core import FedkitError, resume, run
from fedkit_core.testing import InterruptAfter, tiny, tiny_seg

from .baseline_probes import Uploads, Watch, same


def _split(state, prefix):
    return {k: v for k, v in state.items() if k.startswith(prefix)}


def test_head_never_uploaded_and_the_epochs_split():
    uploads, before, after = Uploads(), Watch(), Watch()
    results = run(
        tiny(rounds=2, fedrep={"head_epochs": 2}),
        plugins={"before": before, "fedrep": fedrep, "uploads": uploads, "after": after},
    )
    for rnd in uploads.updates:
        for arrays in rnd.values():
            assert arrays and not any(key.startswith("head.") for key in arrays)
            assert any(key.startswith("backbone.") for key in arrays)
    for key, received in before.start.items():
        headed, trained = after.start[key], after.end[key]
        # head epochs: the head moved, the received body (weights) did not
        assert not same(_split(received, "head."), _split(headed, "head."))
        body = [k for k in received if k.startswith("backbone.") and "running" not in k]
        body = [k for k in body if "num_batches" not in k]
        assert all((received[k] == headed[k]).all() for k in body)
        # body epochs: the body moved, the head did not
        assert same(_split(headed, "head."), _split(trained, "head."))
        assert not all((headed[k] == trained[k]).all() for k in body)
    assert results.final["global"] == {} and results.final["clients"]


def test_no_head_epochs_leave_the_head_as_it_was():
    before, after = Watch("head"), Watch("head")
    run(
        tiny(rounds=1, fedrep={"head_epochs": 0}),
        plugins={"before": before, "fedrep": fedrep, "after": after},
    )
    for key, start in before.start.items():
        assert same(start, after.end[key])


def test_segmentation_is_refused():
    with pytest.raises(FedkitError, match="fedrep personalises a classification head"):
        run(tiny_seg(rounds=1), plugins={"fedrep": fedrep})


@pytest.mark.slow
def test_a_run_with_kept_optimiser_state_resumes_exactly(tmp_path):
    # the kept optimiser holds the body alone (the head is frozen when it is built): a
    # resumed client must rebuild it on the same parameters before loading its state
    config = tiny(
        rounds=3, plugins=["fedrep"], keep_optimizer_state=True, fedrep={"head_epochs": 1}
    )
    straight = run(config)
    out = tmp_path / "run"
    with pytest.raises(KeyboardInterrupt):
        run({**config, "checkpoint": True}, out=out, observer=InterruptAfter(2))
    resumed = resume(out)
    assert resumed.final["clients"] == straight.final["clients"]
    assert [r["train"] for r in resumed.rounds] == [r["train"] for r in straight.rounds]
