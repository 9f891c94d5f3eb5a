"""The plugin's loss terms on fixed tensors: each lambda where the paper puts it, each
gradient to the model the term teaches."""

import math
from types import SimpleNamespace

import fedkit_fedhelp.plugin as fh
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from fedkit_core.plugin import CLASSIFICATION


class _Lambda(nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, x):
        return self.fn(x)


def test_small_client_term_is_lambda_l_times_r_with_lambda_r_on_the_kl():
    """One public sample, a surrogate giving softmax (1/4, 3/4), label 1, two APIs mixed
    with scores (0, ln 3): a = (1/4, 3/4)."""
    surrogate = nn.Linear(1, 2)
    with torch.no_grad():
        surrogate.weight.zero_()
        surrogate.bias.copy_(torch.tensor([0.0, math.log(3.0)]))
    scores = fh.Scores(1, 2)
    with torch.no_grad():
        scores.logits.copy_(torch.tensor([[0.0, math.log(3.0)]]))
    model = SimpleNamespace(
        backbone=_Lambda(lambda x: x.flatten(1)[:, :1]),
        extras={fh.SURROGATE: surrogate, fh.SCORES: scores},
    )
    api_probs = torch.tensor([[[0.5, 0.5], [0.9, 0.1]]])  # (P, M, K)
    client = SimpleNamespace(
        options=lambda: {"lambda_r": 0.1, "lambda_l": 0.2},
        model=model,
        priors={
            "fedhelp.public": torch.zeros(1, 1, 2, 2, dtype=torch.uint8),
            "fedhelp.probs": api_probs,
            "fedhelp.labels": torch.tensor([1]),
        },
        config={"batch_size": 1},
        rng=torch.Generator().manual_seed(0),
        data=SimpleNamespace(normalizer=lambda x: x.float()),
        device=torch.device("cpu"),
        task=SimpleNamespace(kind=CLASSIFICATION),
    )
    term = fh._small_terms(client)["fedhelp.public"]
    mix = [0.25 * 0.5 + 0.75 * 0.9, 0.25 * 0.5 + 0.75 * 0.1]
    q = [0.25, 0.75]
    kl = sum(m * math.log(m / p) for m, p in zip(mix, q))
    assert term.item() == pytest.approx(0.2 * (-math.log(0.75) + 0.1 * kl), rel=1e-6)


def _large_client(lambda_f=1.0, lambda_b=0.2):
    return SimpleNamespace(
        options=lambda: {"top_q": 0, "lambda_f": lambda_f, "lambda_b": lambda_b},
        task=SimpleNamespace(num_classes=3),
        task_loss=lambda batch, out: F.cross_entropy(out["logits"], batch.y),
    )


def test_large_client_terms_each_reach_only_the_model_they_teach():
    torch.manual_seed(0)
    proxy_net, large_net = nn.Linear(5, 3), nn.Linear(5, 3)
    batch = SimpleNamespace(x=torch.randn(8, 5), y=torch.randint(3, (8,)))
    outputs = {"logits": proxy_net(batch.x), fh.LARGE: large_net(batch.x)}
    terms = fh._large_terms(_large_client(lambda_f=0.5), batch, outputs)
    assert set(terms) == {"fedhelp.kd_f", "fedhelp.large_task", "fedhelp.kd_b"}
    reached = {}
    for name, term in terms.items():
        proxy_net.zero_grad(set_to_none=True)
        large_net.zero_grad(set_to_none=True)
        term.backward(retain_graph=True)
        reached[name] = {
            who
            for who, net in (("proxy", proxy_net), ("large", large_net))
            if net.weight.grad is not None and net.weight.grad.abs().sum() > 0
        }
    assert reached == {
        "fedhelp.kd_f": {"proxy"},  # the large model is KD_f's teacher, never its student
        "fedhelp.large_task": {"large"},
        "fedhelp.kd_b": {"large"},
    }
    proxy, large = outputs["logits"], outputs[fh.LARGE]
    p = F.softmax(large, 1)
    expected = 0.5 * (p * (p.log() - F.log_softmax(proxy, 1))).sum(1).mean()
    assert torch.allclose(terms["fedhelp.kd_f"], expected)  # lambda_F * KL(large || proxy)


def _bn_client(backbone: nn.Module, public: torch.Tensor):
    samples = len(public)
    return SimpleNamespace(
        options=lambda: {"lambda_r": 0.1, "lambda_l": 0.2},
        model=SimpleNamespace(
            backbone=backbone,
            extras={fh.SURROGATE: nn.Linear(4, 3), fh.SCORES: fh.Scores(samples, 2)},
        ),
        priors={
            "fedhelp.public": public,
            "fedhelp.probs": torch.full((samples, 2, 3), 1 / 3),
            "fedhelp.labels": torch.zeros(samples, dtype=torch.long),
        },
        config={"batch_size": 8},
        rng=torch.Generator().manual_seed(0),
        data=SimpleNamespace(normalizer=lambda x: x.float() / 255),
        device=torch.device("cpu"),
        task=SimpleNamespace(kind=CLASSIFICATION),
    )


def test_public_batches_leave_the_uploaded_backbones_batchnorm_statistics_alone():
    """The public images (another data set) go through the shared backbone in train mode
    for R; the BatchNorm running buffers the client uploads must still be those of its
    private batches only (a plain train-mode pass of the same batch does move them)."""
    torch.manual_seed(0)
    backbone = nn.Sequential(
        nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.AdaptiveAvgPool2d(1), nn.Flatten()
    ).train()
    public = torch.randint(150, 256, (16, 3, 8, 8), dtype=torch.uint8)  # far from N(0, 1)
    before = {
        k: v.clone() for k, v in backbone.state_dict().items() if "running" in k or "num" in k
    }
    term = fh._small_terms(_bn_client(backbone, public))["fedhelp.public"]
    term.backward()
    after = backbone.state_dict()
    for key, value in before.items():
        assert torch.equal(after[key], value), key
    assert backbone[0].weight.grad is not None  # R still trains the shared backbone
    backbone(public[:8].float() / 255)  # the same batch without the guard moves them
    assert not torch.equal(backbone[1].running_mean, before["1.running_mean"])
