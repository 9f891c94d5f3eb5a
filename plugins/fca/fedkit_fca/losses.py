"""FCA's loss terms (paper section 3.3): calibrated head losses and classifier anchoring.

* Each head is calibrated with balanced softmax on the client's own class priors (eq. 2).
* The consistency term distils one head into the other through a KL divergence with the
  teacher side detached (eqs. 3-4). The paper's direction is personal -> federated: the
  personalised head is the teacher, ``KL(softmax(personal) || softmax(federated))``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from fedkit_core.plugin import balanced_softmax_ce

PAPER = "paper"
AUTHORS_CODE = "authors_code"
OFF = "off"
VARIANTS = (PAPER, AUTHORS_CODE, OFF)

PERSONAL_TO_FED = "personal_to_fed"
FED_TO_PERSONAL = "fed_to_personal"
BOTH = "both"
DIRECTIONS = (PERSONAL_TO_FED, FED_TO_PERSONAL, BOTH)

#: what the authors' code adds to both probability vectors before its KL call
AUTHORS_EPS = 1e-11


def head_loss(
    logits: torch.Tensor, target: torch.Tensor, log_prior: torch.Tensor | None
) -> torch.Tensor:
    """Balanced softmax with ``log_prior`` (the paper's calibration), or plain CE when None."""
    if log_prior is None:
        return F.cross_entropy(logits, target)
    return balanced_softmax_ce(logits, target, log_prior)


def distill(student: torch.Tensor, teacher: torch.Tensor, variant: str = PAPER) -> torch.Tensor:
    """Pull ``student``'s predictions towards the detached ``teacher``'s.

    ``paper``: ``KL(softmax(teacher) || softmax(student))`` averaged over the batch
    (``F.kl_div`` with log-probabilities and ``batchmean``: a true KL divergence).
    ``authors_code``: what the authors' code computes with ``nn.KLDivLoss()``: the student's
    *probabilities* (plus 1e-11) where log-probabilities are expected, averaged over every
    element (batch x classes): ``mean(q * (log q - p))`` with ``q``, ``p`` the teacher's and
    student's probabilities. Not a KL divergence; its gradient pushes ``p`` up where ``q``
    is large, scaled down by the number of classes.
    """
    q = F.softmax(teacher.detach().float(), dim=1)
    if variant == PAPER:
        return F.kl_div(F.log_softmax(student.float(), dim=1), q, reduction="batchmean")
    if variant == AUTHORS_CODE:
        p = F.softmax(student.float(), dim=1) + AUTHORS_EPS
        # reduction="none" then mean: what KLDivLoss's default "mean" did in the authors'
        # torch (a later torch release is to make "mean" behave like "batchmean")
        return F.kl_div(p, q + AUTHORS_EPS, reduction="none").mean()
    raise ValueError(f"unknown consistency variant {variant!r}; expected {PAPER} or {AUTHORS_CODE}")


def consistency(
    federated: torch.Tensor,
    personal: torch.Tensor,
    variant: str = PAPER,
    direction: str = PERSONAL_TO_FED,
) -> torch.Tensor:
    """The anchoring term between the two heads' logits (paper Table 8 for the directions).

    ``personal_to_fed`` (the paper's FCA): the personalised head teaches the federated one.
    ``fed_to_personal``: the federated head teaches the personalised one. ``both``: the sum
    of the two, each with its teacher detached (the heads co-regularise each other).
    """
    if direction == PERSONAL_TO_FED:
        return distill(federated, personal, variant)
    if direction == FED_TO_PERSONAL:
        return distill(personal, federated, variant)
    if direction == BOTH:
        return distill(federated, personal, variant) + distill(personal, federated, variant)
    raise ValueError(f"unknown consistency direction {direction!r}; expected one of {DIRECTIONS}")
