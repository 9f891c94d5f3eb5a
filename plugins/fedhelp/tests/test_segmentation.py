"""FedHelp's segmentation variant on tiny synthetic data: per-pixel knowledge, weight maps,
a large U-Net on the large client, only the small U-Net uploaded."""

import numpy as np
import pytest
from fedkit_priors import Knowledge, save_knowledge

from fedkit_core import run
from fedkit_core.testing import ClientRuntime, tiny_seg


@pytest.fixture
def seg_knowledge(tmp_path):
    """Six 24 px public images (the task's are 32 px: resized on the clients), two APIs."""
    rng = np.random.default_rng(0)
    masks = np.zeros((6, 24, 24), np.int16)
    masks[:, 4:10, 4:10] = 1
    masks[:3, 14:20, 12:22] = 1  # two objects: a border term
    masks[5] = -1  # no mask: KL only
    images = (masks[..., None].clip(0) * 150 + rng.integers(0, 60, (6, 24, 24, 1))).astype(np.uint8)
    probs = rng.dirichlet(np.ones(2), size=(6, 2, 24, 24)).transpose(0, 1, 4, 2, 3)
    path = tmp_path / "seg-knowledge.npz"
    save_knowledge(
        Knowledge(images, probs.astype(np.float16), masks, ["a", "b"], ["bg", "fg"]), path
    )
    return path


def test_segmentation_variant_uploads_the_small_unet_only(seg_knowledge, monkeypatch):
    uploads = []
    fit = ClientRuntime.fit

    def recording(self, message):
        reply = fit(self, message)
        uploads.append((self.id, reply.arrays))
        return reply

    monkeypatch.setattr(ClientRuntime, "fit", recording)
    options = {
        "knowledge": str(seg_knowledge),
        "large_clients": ["site0"],
        "large_unet_channels": [12, 24, 48],
    }
    results = run(tiny_seg(plugins=["fedhelp"], fedhelp=options))
    keys = {frozenset(arrays) for _, arrays in uploads}
    assert len(uploads) == 6 and len(keys) == 1  # the same small U-Net from every client
    assert all(k.startswith("backbone.") for k in next(iter(keys)))
    first = {arrays["backbone.model.0.conv.unit0.conv.weight"].shape[0] for _, arrays in uploads}
    assert first == {8}  # the small U-Net's first block (the large one's has 12 channels)
    train = results.rounds[-1]["train"]
    large_terms = {"loss.fedhelp.kd_b", "loss.fedhelp.kd_f", "loss.fedhelp.large_task"}
    assert large_terms <= set(train["site0"])
    assert "loss.fedhelp.public" in train["site1"] and "loss.fedhelp.kd_b" not in train["site1"]
    assert train["site1"]["loss.task"] > 0 and np.isfinite(train["site1"]["loss.fedhelp.public"])
    final = results.final
    assert set(final["clients"]) == {"site0", "site1", "site2"}
    assert "dice" in final["clients"]["site0"]
    served, small = (final["views"][v]["clients"]["site0"] for v in ("served", "global"))
    assert served != small  # the large client serves its large U-Net
    assert final["global"]  # the averaged small U-Net, pooled over the clients' test sets
