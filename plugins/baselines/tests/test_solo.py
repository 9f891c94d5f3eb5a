"""Solo: nothing uploaded or aggregated; each client's training simply continues locally."""

import pytest
from fedkit_baselines import solo

from fedkit_core import run
from fedkit_core.testing import tiny, tiny_seg

from .baseline_probes import Uploads, Watch, same


def test_nothing_is_uploaded_and_each_client_continues_from_its_own_weights():
    uploads, watch = Uploads(), Watch()
    results = run(tiny(rounds=3), plugins={"solo": solo, "uploads": uploads, "watch": watch})
    assert len(uploads.updates) == 3
    assert all(arrays == {} for rnd in uploads.updates for arrays in rnd.values())
    # local training: the model a client starts a round with is the one it ended the last
    # round with (nothing received replaces any weight), and training changes it
    for (cid, rnd), end in watch.end.items():
        assert not same(watch.start[(cid, rnd)], end)
        if (cid, rnd + 1) in watch.start:
            assert same(watch.start[(cid, rnd + 1)], end)
    # the clients' models differ: no averaging ever happened
    last = [state for (cid, rnd), state in watch.end.items() if rnd == 3]
    assert not same(last[0], last[1])
    assert results.final["global"] == {}
    assert set(results.final["clients"]) == {"site0", "site1", "site2"}


@pytest.mark.slow
def test_flower_gives_the_local_engines_results():
    pytest.importorskip("flwr")
    config = tiny(rounds=2)
    local = run(config, plugins={"solo": solo})
    flower = run(
        {**config, "engine": "flower", "flower": {"backend": "thread"}}, plugins={"solo": solo}
    )
    for cid, metrics in local.final["clients"].items():
        assert flower.final["clients"][cid] == pytest.approx(metrics, abs=1e-6)


def test_segmentation_runs_locally():
    results = run(tiny_seg(rounds=1), plugins={"solo": solo})
    assert all("dice" in m for m in results.final["clients"].values())
