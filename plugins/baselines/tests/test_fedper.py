"""FedPer: the personal layers never leave the client and train with the base every step;
clients are scored with them; a layer the model lacks, or all of it, is refused."""

from __future__ import annotations

import pytest

from fedkit_core import FedkitError, run
from fedkit_core.testing import tiny

from .baseline_probes import Uploads, Watch, same


def _head(state):
    return {k: v for k, v in state.items() if k.startswith("head.")}


def test_the_head_is_personal_and_trains_with_the_base():
    uploads, watch = Uploads(), Watch()
    results = run(tiny(rounds=2, plugins=["fedper"]), plugins={"uploads": uploads, "watch": watch})
    for rnd in uploads.updates:
        for arrays in rnd.values():
            assert arrays and not any(k.startswith("head.") for k in arrays)
    for (cid, rnd), start in watch.start.items():
        assert not same(_head(start), _head(watch.end[(cid, rnd)])), "the head trains"
    assert not same(_head(watch.end[("site0", 2)]), _head(watch.end[("site1", 2)]))
    assert same(_head(watch.start[("site0", 2)]), _head(watch.end[("site0", 1)]))
    assert results.final["global"] == {} and set(results.final["views"]) == {"personal"}


def test_unknown_or_all_layers_are_refused():
    with pytest.raises(FedkitError, match="no layer 'classifier'"):
        run(tiny(rounds=1, plugins=["fedper"], fedper={"layers": ["classifier"]}))
    with pytest.raises(FedkitError, match="nothing would be shared"):
        run(tiny(rounds=1, plugins=["fedper"], fedper={"layers": ["backbone", "head"]}))
