"""FedModel's state split (uploads are copies, private entries never travel) and weights files."""

import pytest
import torch
from torch import nn

from fedkit_core.errors import FedkitError
from fedkit_core.models.fedmodel import FedModel
from fedkit_core.models.networks import load_weights


def _model() -> FedModel:
    model = FedModel(nn.Linear(3, 4), nn.Linear(4, 2), 4)
    model.add_extra("personal", nn.Linear(4, 2), private=True)
    return model


def test_shared_state_is_a_copy_not_a_view():
    model = _model()
    upload = model.shared_state()
    before = upload["head.weight"].clone()
    with torch.no_grad():
        model.head.weight.add_(1.0)
    assert torch.equal(upload["head.weight"], before)


def test_private_entries_stay_out_of_the_upload():
    model = _model()
    assert not any(k.startswith("extras.personal") for k in model.shared_state())
    assert set(model.private_state()) == {"extras.personal.weight", "extras.personal.bias"}


def test_load_shared_keeps_private_entries():
    model, other = _model(), _model()
    private = model.private_state()
    model.load_shared(other.shared_state())
    assert torch.equal(model.head.weight, other.head.weight)
    assert torch.equal(model.extras["personal"].weight, private["extras.personal.weight"])


def test_strict_weights_tolerate_missing_batchnorm_counters(tmp_path):
    net = nn.Sequential(nn.Conv2d(1, 2, 3), nn.BatchNorm2d(2))
    state = {k: v for k, v in net.state_dict().items() if not k.endswith("num_batches_tracked")}
    torch.save(state, tmp_path / "w.pt")
    load_weights(net, str(tmp_path / "w.pt"), strict=True)
    del state["1.running_var"]
    torch.save(state, tmp_path / "partial.pt")
    with pytest.raises(FedkitError, match="does not fit"):
        load_weights(net, str(tmp_path / "partial.pt"), strict=True)


def test_the_batch_norm_policy_follows_what_is_private():
    def model() -> FedModel:
        body = nn.Sequential(nn.Conv2d(1, 2, 3), nn.BatchNorm2d(2), nn.Flatten(), nn.Linear(8, 4))
        built = FedModel(body, nn.Sequential(nn.BatchNorm1d(4), nn.Linear(4, 2)), 4)
        built.add_extra("copy", nn.BatchNorm1d(4), private=True)  # a plugin's, not the model's
        return built

    assert model().batch_norm_layers(extras=False) == ["backbone.1", "head.0"]
    assert model().batch_norm_policy() == "average"
    local = model()
    assert local.keep_batch_norm_local() == ["backbone.1", "head.0", "extras.copy"]
    assert local.batch_norm_policy() == "local"
    assert not any("running_mean" in k for k in local.shared_state())
    mixed = model()
    mixed.mark_private("head")
    assert mixed.batch_norm_policy() == "mixed"
    assert FedModel(nn.Linear(3, 4), nn.Linear(4, 2), 4).batch_norm_policy() == "none"
