"""``dp(...)`` in a ``fedkit compare`` runspec: a method under differential privacy.

``fedavg+dp(eps=1)`` is FedAvg with client-level DP whose noise is calibrated to epsilon 1;
``fca+dp(eps=4,level=sample)`` FCA with DP-SGD; any ``dp.*`` key may be given by its name
(``dp(noise_multiplier=1.2,clip=0.5)``), with the short forms ``eps`` (``target_epsilon``)
and ``sigma`` (``noise_multiplier``). The level defaults to ``client``. ``--set dp.*`` pairs
apply to every runspec (they change nothing where ``dp.level`` is ``none``).
"""

from __future__ import annotations

import re
from typing import Any

from fedkit_core.contract.channels import CLIENT
from fedkit_core.contract.options import Option
from fedkit_core.errors import FedkitError
from fedkit_core.privacy.options import DP_OPTIONS

_TERM = re.compile(r"^dp\((.*)\)$")
_SHORT = {"eps": "target_epsilon", "epsilon": "target_epsilon", "sigma": "noise_multiplier"}
_OPTIONS: dict[str, Option] = {o.name: o for o in DP_OPTIONS}


def split_terms(spec: str) -> list[str]:
    """``a+b+dp(x=1,y=2)`` -> ``["a", "b", "dp(x=1,y=2)"]`` (a ``+`` inside parentheses
    stays: ``dp(eps=1e+1)``)."""
    terms, depth, current = [], 0, ""
    for char in spec:
        depth += (char == "(") - (char == ")")
        if char == "+" and depth == 0:
            terms.append(current)
            current = ""
        else:
            current += char
    return [t for t in [*terms, current] if t]


def dp_term(term: str) -> dict[str, Any] | None:
    """The ``dp`` config section of a ``dp(...)`` term (None: not one)."""
    match = _TERM.match(term.strip())
    if match is None:
        return None
    section: dict[str, Any] = {"level": CLIENT}
    for item in filter(None, (p.strip() for p in match.group(1).split(","))):
        key, sep, value = item.partition("=")
        key = _SHORT.get(key.strip(), key.strip())
        if not sep or key not in _OPTIONS:
            raise FedkitError(
                f"runspec term {term!r}: {item!r} is not key=value with a dp option "
                f"(eps, sigma, {', '.join(sorted(_OPTIONS))})"
            )
        section[key] = _OPTIONS[key].coerce(value.strip(), f"dp.{key}")
    return section


def method_and_dp(spec: str) -> tuple[str, dict[str, Any] | None]:
    """A runspec's method part (``fedavg`` when empty) and its ``dp`` section."""
    terms = split_terms(spec)
    dp = [section for t in terms if (section := dp_term(t)) is not None]
    if len(dp) > 1:
        raise FedkitError(f"runspec {spec!r} has more than one dp(...) term")
    method = "+".join(t for t in terms if dp_term(t) is None) or "fedavg"
    return method, (dp[0] if dp else None)
