"""FCA's loss terms against hand computations in numpy (paper eqs. 2, 4, 5)."""

from types import SimpleNamespace

import numpy as np
import pytest
import torch
from fedkit_fca import losses, plugin

from fedkit_core.plugin import log_prior, plugin_scope

rng = np.random.default_rng(0)
FED = rng.normal(size=(6, 4)) * 2
PERSONAL = rng.normal(size=(6, 4)) * 2
LABELS = np.array([0, 1, 1, 2, 0, 1])
COUNTS = np.array([5, 12, 3, 0])  # class 3 is missing on this client


def softmax(z):
    e = np.exp(z - z.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def np_bsm(logits, labels, counts, eps):
    shifted = logits + np.log(counts / counts.sum() + eps)
    return float(np.mean(-np.log(softmax(shifted)[np.arange(len(labels)), labels])))


def np_kl(teacher, student):
    """KL(softmax(teacher) || softmax(student)), summed over classes, averaged over samples."""
    q, p = softmax(teacher), softmax(student)
    return float(np.mean(np.sum(q * (np.log(q) - np.log(p)), axis=1)))


def np_authors(teacher, student):
    """nn.KLDivLoss() (mean over all elements) fed probabilities + 1e-11 on both sides."""
    q, p = softmax(teacher) + 1e-11, softmax(student) + 1e-11
    return float(np.mean(q * (np.log(q) - p)))


def t(a, grad=False):
    return torch.tensor(a, dtype=torch.float32, requires_grad=grad)


def test_balanced_softmax_uses_the_clients_priors_with_eps():
    prior = log_prior(COUNTS, 1e-9)
    got = losses.head_loss(t(FED), torch.tensor(LABELS), prior)
    assert got.item() == pytest.approx(np_bsm(FED, LABELS, COUNTS, 1e-9), rel=1e-5)
    # the missing class is pushed down by log(1e-9), not by -inf
    assert prior[3].item() == pytest.approx(np.log(1e-9), rel=1e-5)


def test_calibration_off_is_plain_cross_entropy():
    got = losses.head_loss(t(FED), torch.tensor(LABELS), None)
    want = np.mean(-np.log(softmax(FED)[np.arange(6), LABELS]))
    assert got.item() == pytest.approx(want, rel=1e-5)


def test_paper_consistency_is_the_kl_from_the_personal_head():
    got = losses.consistency(t(FED), t(PERSONAL), losses.PAPER, losses.PERSONAL_TO_FED)
    assert got.item() == pytest.approx(np_kl(PERSONAL, FED), rel=1e-5)
    assert got.item() > 0
    same = losses.consistency(t(FED), t(FED), losses.PAPER, losses.PERSONAL_TO_FED)
    assert same.item() == pytest.approx(0.0, abs=1e-6)


def test_authors_code_consistency_reproduces_their_kldivloss_call():
    got = losses.consistency(t(FED), t(PERSONAL), losses.AUTHORS_CODE, losses.PERSONAL_TO_FED)
    assert got.item() == pytest.approx(np_authors(PERSONAL, FED), rel=1e-5)
    # and it is not a KL divergence: identical heads do not give zero
    same = losses.consistency(t(FED), t(FED), losses.AUTHORS_CODE, losses.PERSONAL_TO_FED)
    assert abs(same.item()) > 1e-3


@pytest.mark.parametrize(
    ("direction", "fed_grad", "personal_grad", "want"),
    [
        (losses.PERSONAL_TO_FED, True, False, np_kl(PERSONAL, FED)),
        (losses.FED_TO_PERSONAL, False, True, np_kl(FED, PERSONAL)),
        (losses.BOTH, True, True, np_kl(PERSONAL, FED) + np_kl(FED, PERSONAL)),
    ],
)
def test_direction_sets_teacher_and_stop_gradient(direction, fed_grad, personal_grad, want):
    fed, personal = t(FED, grad=True), t(PERSONAL, grad=True)
    value = losses.consistency(fed, personal, losses.PAPER, direction)
    assert value.item() == pytest.approx(want, rel=1e-5)
    value.backward()
    assert (fed.grad is not None and fed.grad.abs().sum() > 0) == fed_grad
    assert (personal.grad is not None and personal.grad.abs().sum() > 0) == personal_grad


def fake_client(**options):
    opts = {opt.name: opt.default for opt in plugin.fedkit_options()} | options
    return SimpleNamespace(
        options=lambda: opts,
        log_prior=lambda eps: log_prior(COUNTS, eps),
    )


def test_local_loss_is_l1_bsm_plus_l2_bsm_plus_kl():
    """The hooks together give eq. 5 with l1 = 1, l2 = 3 and the paper's KL."""
    client = fake_client()
    batch = SimpleNamespace(y=torch.tensor(LABELS))
    outputs = {"logits": t(FED), plugin.PERSONAL: t(PERSONAL)}
    with plugin_scope("fca"):
        task = plugin.fedkit_task_loss(client=client, batch=batch, outputs=outputs)
        terms = plugin.fedkit_loss_terms(client=client, batch=batch, outputs=outputs)
    assert set(terms) == {"fca.personal", "fca.consistency"}
    total = task + sum(terms.values())
    want = (
        1 * np_bsm(FED, LABELS, COUNTS, 1e-9)
        + 3 * np_bsm(PERSONAL, LABELS, COUNTS, 1e-9)
        + np_kl(PERSONAL, FED)
    )
    assert total.item() == pytest.approx(want, rel=1e-5)


def test_options_weight_and_switch_off_the_terms():
    client = fake_client(l1=0.5, l2=2.0, consistency="off", calibration="ce")
    batch = SimpleNamespace(y=torch.tensor(LABELS))
    outputs = {"logits": t(FED), plugin.PERSONAL: t(PERSONAL)}
    with plugin_scope("fca"):
        task = plugin.fedkit_task_loss(client=client, batch=batch, outputs=outputs)
        terms = plugin.fedkit_loss_terms(client=client, batch=batch, outputs=outputs)
    assert set(terms) == {"fca.personal"}
    ce = lambda z: np.mean(-np.log(softmax(z)[np.arange(6), LABELS]))  # noqa: E731
    assert task.item() == pytest.approx(0.5 * ce(FED), rel=1e-5)
    assert terms["fca.personal"].item() == pytest.approx(2.0 * ce(PERSONAL), rel=1e-5)
