"""FedHelp's loss terms against the paper's formulas, including KD_b's sign."""

import math

import pytest
import torch
import torch.nn.functional as F
from fedkit_fedhelp import losses


def test_ranking_loss_is_eq6_and_raises_the_proxys_top_classes():
    torch.manual_seed(0)
    large = torch.randn(4, 6, requires_grad=True)
    proxy = torch.randn(4, 6)
    top = proxy.topk(3, dim=1).indices
    expected = (
        -sum((large[i, r].exp() / large[i].exp().sum()).log() for i in range(4) for r in top[i]) / 4
    )
    loss = losses.ranking_loss(large, proxy, 3)
    assert torch.allclose(loss, expected)
    loss.backward()
    with torch.no_grad():
        stepped = large - 0.5 * large.grad
    before = F.softmax(large, 1).gather(1, top).sum()
    after = F.softmax(stepped, 1).gather(1, top).sum()
    assert after > before  # the paper's sign: Q's probability rises (the authors' code inverts it)


def test_binary_ranking_is_ce_on_the_proxys_prediction():
    large, proxy = torch.randn(5, 2), torch.randn(5, 2)
    assert torch.allclose(
        losses.ranking_loss(large, proxy, 1), F.cross_entropy(large, proxy.argmax(1))
    )


def test_api_mixture_is_a_distribution_with_per_sample_scores():
    probs = F.softmax(torch.randn(3, 2, 5), dim=2)
    scores = torch.tensor([[0.0, 0.0], [10.0, -10.0], [-10.0, 10.0]])
    mix = losses.api_mixture(scores, probs)
    assert torch.allclose(mix.sum(1), torch.ones(3))
    assert torch.allclose(mix[0], probs[0].mean(0))
    assert torch.allclose(mix[1], probs[1, 0], atol=1e-6)
    assert torch.allclose(mix[2], probs[2, 1], atol=1e-6)


def test_surrogate_loss_is_ce_plus_weighted_kl_and_skips_unlabelled():
    logits = torch.randn(4, 3)
    mix = F.softmax(torch.randn(4, 3), dim=1)
    labels = torch.tensor([0, 2, -1, -1])
    kl = F.kl_div(F.log_softmax(logits, 1), mix, reduction="batchmean")
    ce = F.cross_entropy(logits[:2], labels[:2])
    assert torch.allclose(losses.surrogate_loss(logits, labels, mix, 0.2), ce + 0.2 * kl, atol=1e-6)
    only_kl = losses.surrogate_loss(logits, torch.full((4,), -1), mix, 0.2)
    assert torch.allclose(only_kl, 0.2 * kl, atol=1e-6)


def test_kl_direction_teacher_first():
    teacher, student = torch.randn(4, 3), torch.randn(4, 3)
    p = F.softmax(teacher, 1)
    expected = (p * (p.log() - F.log_softmax(student, 1))).sum(1).mean()
    assert torch.allclose(losses.kl(teacher, student), expected, atol=1e-6)


def pixels(x: torch.Tensor) -> torch.Tensor:
    """(B, K, H, W) -> (B*H*W, K): every pixel as a sample."""
    return x.permute(0, 2, 3, 1).reshape(-1, x.shape[1])


def test_per_pixel_terms_are_the_classification_terms_over_pixels():
    torch.manual_seed(0)
    large, proxy = torch.randn(2, 3, 4, 5), torch.randn(2, 3, 4, 5)
    assert torch.allclose(losses.kl(large, proxy), losses.kl(pixels(large), pixels(proxy)))
    assert torch.allclose(
        losses.ranking_loss(large, proxy, 1), losses.ranking_loss(pixels(large), pixels(proxy), 1)
    )
    labels = torch.randint(3, (2, 4, 5))
    weight = torch.rand(2, 4, 5) * 3
    ce = F.cross_entropy(pixels(large), labels.flatten(), reduction="none")
    expected = (ce * weight.flatten()).mean()
    assert torch.allclose(losses.weighted_ce(large, labels, weight), expected)


def test_per_pixel_surrogate_loss_weights_ce_and_kl_and_mixes_per_sample():
    torch.manual_seed(1)
    logits = torch.randn(2, 2, 3, 3)
    probs = F.softmax(torch.randn(2, 3, 2, 3, 3), dim=2)  # (B, M, K, H, W)
    scores = torch.tensor([[5.0, 0.0, -5.0], [0.0, 0.0, 0.0]])
    mix = losses.api_mixture(scores, probs)
    a = F.softmax(scores, 1)
    assert torch.allclose(mix[0], (a[0].view(3, 1, 1, 1) * probs[0]).sum(0))
    labels = torch.randint(2, (2, 3, 3))
    labels[1, 0] = -1  # an unknown row of pixels
    weight = torch.rand(2, 3, 3) + 0.5
    log_q = F.log_softmax(logits, 1)
    known = labels >= 0
    ce = -(log_q.gather(1, labels.clamp_min(0)[:, None])[:, 0] * weight)[known].sum() / known.sum()
    kl = ((mix * (mix.log() - log_q)).sum(1) * weight).mean()
    got = losses.surrogate_loss(logits, labels, mix, 0.2, weight)
    assert torch.allclose(got, ce + 0.2 * kl, atol=1e-6)


def test_public_term_places_lambda_r_inside_r_and_lambda_l_on_r():
    # one public sample: surrogate softmax (1/4, 3/4), label 1, API mixture (1/2, 1/2)
    logits = torch.tensor([[0.0, math.log(3.0)]])
    labels = torch.tensor([1])
    mixture = torch.tensor([[0.5, 0.5]])
    ce = -math.log(0.75)
    kl = 0.5 * math.log(0.5 / 0.25) + 0.5 * math.log(0.5 / 0.75)
    got = losses.public_term(logits, labels, mixture, lambda_r=0.1, lambda_l=0.2)
    assert got.item() == pytest.approx(0.2 * (ce + 0.1 * kl), rel=1e-6)  # eqs. 1 and 3
    swapped = losses.public_term(logits, labels, mixture, lambda_r=0.2, lambda_l=0.1)
    assert abs(swapped.item() - got.item()) > 1e-3  # the old placement gives another value


def test_forward_kd_trains_the_proxy_only_with_the_large_model_as_teacher():
    torch.manual_seed(0)
    large_net, proxy_net = torch.nn.Linear(4, 3), torch.nn.Linear(4, 3)
    x = torch.randn(6, 4)
    large, proxy = large_net(x), proxy_net(x)
    term = losses.forward_kd(large, proxy, lambda_f=0.5)
    assert torch.allclose(term, 0.5 * losses.kl(large, proxy))  # KL(large || proxy), lambda_F
    term.backward()
    assert large_net.weight.grad is None and large_net.bias.grad is None
    assert proxy_net.weight.grad.abs().sum() > 0
    with torch.no_grad():  # a step on the proxy brings it closer to the large model
        proxy_net.weight -= 0.5 * proxy_net.weight.grad
        proxy_net.bias -= 0.5 * proxy_net.bias.grad
    assert losses.kl(large.detach(), proxy_net(x)) < term / 0.5
