"""Privacy accounting with Google's ``dp-accounting``: epsilon at delta after each round,
the noise for a target epsilon, and the rounds a budget pays for.

Nothing here is derived by hand: a round is described as a ``DpEvent`` (the Gaussian
mechanism, amplified by the way its participants are sampled) and the library's RDP or PLD
accountant composes the rounds and converts to (epsilon, delta). Which event:

* every participant in every step (``rate == 1``): ``GaussianDpEvent``; add/remove one;
* Poisson sampling at ``rate``: ``PoissonSampledDpEvent``; add/remove one (the DP-FedAvg
  and DP-SGD analysis, McMahan et al. 2018, Abadi et al. 2016);
* a fixed-size sample without replacement: ``SampledWithoutReplacementDpEvent``; replace
  one. Replacing one participant moves the clipped sum by up to ``2 C``, so the event's
  noise multiplier is half the configured one (the noise std is ``sigma * C``).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass

from fedkit_core.errors import FedkitError

#: the sampling schemes the accountant knows
POISSON, FIXED = "poisson", "fixed"
#: the accountants of dp-accounting fedkit uses
ACCOUNTANTS = ("rdp", "pld")


def _library():
    try:
        import dp_accounting
        from absl import logging as absl_logging
    except ImportError:
        raise FedkitError(
            "differential privacy needs Google's dp-accounting: pip install 'fedkit[dp]'"
        ) from None
    # the RDP accountant warns when it leaves out an order whose series does not converge
    # (large sampling rates); the bound from the other orders still holds
    absl_logging.set_verbosity(absl_logging.ERROR)
    return dp_accounting


@dataclass(frozen=True)
class Mechanism:
    """One step of a sampled Gaussian mechanism, as the accountant needs it.

    ``noise_multiplier``: noise std over the clipping norm; ``rate``: the probability (Poisson)
    or fraction (fixed-size) with which each participant joins a step; ``population``: how
    many participants there are (fixed-size sampling draws ``round(rate * population)``);
    ``steps``: steps per composed unit (a round of DP-SGD is several steps).
    """

    noise_multiplier: float
    rate: float = 1.0
    sampling: str = POISSON
    population: int = 1
    steps: int = 1

    def event(self, rounds: int):
        """The ``DpEvent`` of ``rounds`` rounds of this mechanism."""
        dp = _library()
        if self.noise_multiplier <= 0:
            return dp.NonPrivateDpEvent()
        if self.rate >= 1.0:
            step = dp.GaussianDpEvent(self.noise_multiplier)
        elif self.sampling == POISSON:
            step = dp.PoissonSampledDpEvent(self.rate, dp.GaussianDpEvent(self.noise_multiplier))
        else:
            size = max(1, round(self.rate * self.population))
            step = dp.SampledWithoutReplacementDpEvent(
                self.population, size, dp.GaussianDpEvent(self.noise_multiplier / 2)
            )
        return dp.SelfComposedDpEvent(step, rounds * self.steps)

    @property
    def relation(self) -> str:
        """The neighbouring relation the guarantee holds under."""
        fixed = self.rate < 1.0 and self.sampling == FIXED
        return "replace one" if fixed else "add or remove one"


def accountant(kind: str, mechanism: Mechanism):
    """A fresh dp-accounting accountant of ``kind`` for ``mechanism``'s neighbouring relation."""
    dp = _library()
    relation = (
        dp.NeighboringRelation.REPLACE_ONE
        if mechanism.relation == "replace one"
        else dp.NeighboringRelation.ADD_OR_REMOVE_ONE
    )
    if kind == "rdp":
        return dp.rdp.RdpAccountant(neighboring_relation=relation)
    if kind == "pld":
        return dp.pld.PLDAccountant(neighboring_relation=relation)
    raise FedkitError(f"dp.accountant must be one of {', '.join(ACCOUNTANTS)}, got {kind!r}")


@functools.lru_cache(maxsize=4096)
def epsilon(mechanism: Mechanism, rounds: int, delta: float, kind: str = "rdp") -> float:
    """Epsilon at ``delta`` after ``rounds`` rounds of ``mechanism`` (0 before any; kept
    per arguments: the server asks it after every round, a budget's bisection again)."""
    if rounds <= 0:
        return 0.0
    if mechanism.noise_multiplier <= 0:
        return math.inf
    acc = accountant(kind, mechanism)
    acc.compose(mechanism.event(rounds))
    return float(acc.get_epsilon(delta))


def epsilons(mechanism: Mechanism, rounds: int, delta: float, kind: str = "rdp") -> list[float]:
    """Epsilon after each of rounds ``1 .. rounds``."""
    return [epsilon(mechanism, r, delta, kind) for r in range(1, rounds + 1)]


def affordable_rounds(
    mechanism: Mechanism, target: float, delta: float, most: int, kind: str = "rdp"
) -> int:
    """The most rounds (up to ``most``) whose epsilon stays within ``target`` (bisection:
    epsilon grows with the rounds)."""
    low, high = 0, most
    while low < high:
        mid = (low + high + 1) // 2
        if epsilon(mechanism, mid, delta, kind) <= target:
            low = mid
        else:
            high = mid - 1
    return low


def calibrate(
    make: Callable[[float], Mechanism],
    target: float,
    delta: float,
    rounds: int,
    kind: str = "rdp",
) -> float:
    """The smallest noise multiplier ``sigma`` for which ``rounds`` rounds of ``make(sigma)``
    spend at most ``target`` epsilon at ``delta`` (dp-accounting's calibration)."""
    dp = _library()
    if target <= 0:
        raise FedkitError(f"dp.target_epsilon must be above 0, got {target}")
    probe = make(1.0)

    def fresh():
        return accountant(kind, probe)

    try:
        sigma = dp.calibrate_dp_mechanism(
            fresh,
            lambda s: make(s).event(rounds),
            target,
            delta,
            dp.LowerEndpointAndGuess(1e-3, 1.0),
            tol=1e-4,
        )
    except (ValueError, RuntimeError) as err:
        raise FedkitError(
            f"no noise multiplier reaches epsilon {target} at delta {delta} in {rounds} "
            f"rounds ({err}); raise dp.target_epsilon or dp.delta, or run fewer rounds"
        ) from None
    return float(sigma)
