"""Site profiles: how fast each hospital computes, how fast its network is, when it is up.

A ``sites`` config value (a YAML file's path, or the same mapping inline) describes the
federation's hospitals for the virtual clock (:mod:`fedkit_core.engines.clock`); nothing
here waits for real. See ``docs/hospitals.md`` for the model of time::

    base: {samples_per_second: 400}      # what a factor such as "0.1x" multiplies
    profiles:
      research-hospital: {compute: 2x, download: 1 Gbit/s, upload: 1 Gbit/s, latency: 5 ms}
      rural-clinic:
        compute: 0.1x                    # or samples per second: 40
        download: 20 Mbit/s              # or bytes per second, or 2.5 MB/s
        upload: 5 Mbit/s
        latency: 80 ms                   # one way, per message
        availability:
          failures_per_day: 2            # or failures_per_hour; each lasts `repair`
          repair: 10 min
          down: [[2 h, 2.5 h]]           # fixed outages (from, to), simulated time
          join: 30 min                   # joins the federation late
    clients:                             # first match wins
      - {index: 0, profile: research-hospital}     # by position in the client order
      - {match: "site*", profile: rural-clinic}    # by id or glob
      - {share: 0.25, profile: rural-clinic}       # a share of the rest, drawn per seed
      - {profile: research-hospital}               # everyone else

``clients`` may also be a mapping ``{id or glob: profile}`` (an integer key is a position);
a profile may be given inline instead of by name. :func:`load_sites` reads a path or a
mapping into the canonical mapping a run's config keeps (so ``config.yaml`` and
``config.sha256`` hold the profiles themselves, not a path to a file that may change);
:func:`parse_sites` turns that mapping into :class:`Sites`.
"""

from __future__ import annotations

import fnmatch
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from fedkit_core.config import load_yaml
from fedkit_core.errors import FedkitError, unknown

#: the speed of ``compute: 1x`` when the file gives no ``base`` (samples per second)
BASE_SAMPLES_PER_SECOND = 100.0
#: a profile's values where the file gives none: the base speed on a hospital LAN
DEFAULTS = {"compute": "1x", "download": "100 Mbit/s", "upload": "100 Mbit/s", "latency": "20 ms"}

_PROFILE_KEYS = ("compute", "download", "upload", "latency", "availability")
_AVAILABILITY_KEYS = ("down", "join", "failures_per_hour", "failures_per_day", "repair")
_RULE_KEYS = ("match", "index", "share", "profile")
_TOP_KEYS = ("base", "profiles", "clients")

_SECONDS = {"ms": 1e-3, "s": 1.0, "sec": 1.0, "min": 60.0, "h": 3600.0, "d": 86400.0}
_PREFIX = {"": 1.0, "k": 1e3, "K": 1e3, "M": 1e6, "G": 1e9}
_DURATION = re.compile(r"^\s*([0-9.eE+-]+)\s*(ms|s|sec|min|h|d)?\s*$")
_BANDWIDTH = re.compile(r"^\s*([0-9.eE+-]+)\s*([kKMG]?)(bit/s|bps|B/s|Bps)\s*$")
_FACTOR = re.compile(r"^\s*([0-9.eE+-]+)\s*x\s*$")


@dataclass(frozen=True)
class Availability:
    """When a site is down: fixed outages (``down``, simulated seconds ``(from, to)``,
    sorted and merged) and random failures at ``failure_rate`` per second, each lasting
    ``repair`` seconds (drawn per run seed and client, see :mod:`fedkit_core.engines.clock`)."""

    down: tuple[tuple[float, float], ...] = ()
    failure_rate: float = 0.0
    repair: float = 0.0

    @property
    def always_up(self) -> bool:
        return not self.down and self.failure_rate == 0.0


@dataclass(frozen=True)
class SiteProfile:
    """One kind of site: training throughput, bandwidth each way, one-way latency per
    message and availability."""

    name: str
    samples_per_second: float
    download: float  # bytes per second, server to site
    upload: float  # bytes per second, site to server
    latency: float  # seconds, each way
    availability: Availability = Availability()


@dataclass(frozen=True)
class Rule:
    """Which clients a profile applies to: ``match`` (id or glob), ``index`` (positions in
    the client order), ``share`` (a share of the clients no earlier rule took, drawn with
    the run's seed) or none of them (every client left)."""

    profile: SiteProfile
    match: str | None = None
    index: tuple[int, ...] | None = None
    share: float | None = None


@dataclass(frozen=True)
class Sites:
    """Parsed site profiles and the rules that give each client one."""

    profiles: Mapping[str, SiteProfile]
    rules: tuple[Rule, ...]

    def assign(self, client_ids: Sequence[str], seed: int) -> dict[str, SiteProfile]:
        """Each client's profile: the first rule that takes it. A client no rule takes is
        an error (end the rules with one that has neither ``match``, ``index`` nor
        ``share``)."""
        left = list(client_ids)
        position = {cid: k for k, cid in enumerate(client_ids)}
        out: dict[str, SiteProfile] = {}
        for number, rule in enumerate(self.rules):
            if rule.match is not None:
                taken = [c for c in left if c == rule.match or fnmatch.fnmatchcase(c, rule.match)]
            elif rule.index is not None:
                taken = [c for c in left if position[c] in rule.index]
            elif rule.share is not None:
                rng = np.random.default_rng([abs(int(seed)), 31, number])
                count = int(math.floor(rule.share * len(left) + 0.5))
                picked = set(rng.choice(len(left), size=count, replace=False).tolist())
                taken = [c for k, c in enumerate(left) if k in picked]
            else:
                taken = list(left)
            for cid in taken:
                out[cid] = rule.profile
            chosen = set(taken)
            left = [c for c in left if c not in chosen]
        if left:
            raise FedkitError(
                f"sites: no rule of `clients` gives client {left[0]!r} a profile"
                f"{f' (nor {len(left) - 1} more)' if len(left) > 1 else ''}; end the rules "
                "with one for every client left, e.g. `- {profile: NAME}` or `'*': NAME`"
            )
        return out


# ---------------------------------------------------------------------- reading


def load_sites(value: Any, where: str = "sites", base_dir: Path | None = None) -> dict[str, Any]:
    """The canonical ``sites`` mapping of ``value``: a YAML file's path (relative to
    ``base_dir`` when it is found there, else to the working directory) or the mapping
    itself. Rules come back as a list of mappings, every mapping key as text, and the
    whole is checked (:func:`parse_sites`), so a bad file fails before any data is loaded."""
    if isinstance(value, (str, Path)):
        path = Path(value).expanduser()
        if not path.is_absolute() and base_dir is not None and (base_dir / path).is_file():
            path = base_dir / path
        if not path.is_file():
            raise FedkitError(f"{where}: site profiles file not found: {value}")
        value, where = load_yaml(path), f"sites file {path}"
    if not isinstance(value, Mapping):
        raise FedkitError(f"{where} must be a YAML file's path or a mapping of site profiles")
    canonical = _text_keys(dict(value))
    clients = value.get("clients")
    if isinstance(clients, Mapping):
        canonical["clients"] = [
            {"index": key, "profile": _text_keys(profile)}
            if isinstance(key, int) and not isinstance(key, bool)
            else {"match": str(key), "profile": _text_keys(profile)}
            for key, profile in clients.items()
        ]
    parse_sites(canonical, where)
    return canonical


def _text_keys(value: Any) -> Any:
    """``value`` with every mapping key as text (results are JSON; keys must sort)."""
    if isinstance(value, Mapping):
        return {str(k): _text_keys(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_text_keys(v) for v in value]
    return value


def parse_sites(spec: Mapping[str, Any], where: str = "sites") -> Sites:
    """:class:`Sites` from a canonical ``sites`` mapping (see :func:`load_sites`); every
    problem is a :class:`FedkitError` naming the entry."""
    _known(spec, _TOP_KEYS, where, "key")
    base = spec.get("base") or {}
    if not isinstance(base, Mapping):
        raise FedkitError(f"{where}: base must be a mapping, e.g. {{samples_per_second: 400}}")
    _known(base, ("samples_per_second",), f"{where}: base", "key")
    speed = _positive(
        base.get("samples_per_second", BASE_SAMPLES_PER_SECOND),
        f"{where}: base.samples_per_second",
    )
    named = spec.get("profiles") or {}
    if not isinstance(named, Mapping):
        raise FedkitError(f"{where}: profiles must be a mapping of name to profile")
    profiles = {
        str(name): _profile(str(name), body, speed, f"{where}: profiles.{name}")
        for name, body in named.items()
    }
    rules_spec = spec.get("clients")
    if rules_spec is None:
        if len(profiles) != 1:
            raise FedkitError(
                f"{where}: say which clients get which profile under `clients` (e.g. "
                "`clients: {site0: research-hospital, '*': rural-clinic}`)"
            )
        rules_spec = [{"profile": next(iter(profiles))}]
    if not isinstance(rules_spec, list):
        raise FedkitError(f"{where}: clients must be a list of rules or a mapping")
    rules = tuple(
        _rule(rule, profiles, speed, f"{where}: clients[{n}]") for n, rule in enumerate(rules_spec)
    )
    return Sites(profiles, rules)


def _rule(spec: Any, profiles: Mapping[str, SiteProfile], speed: float, where: str) -> Rule:
    if not isinstance(spec, Mapping):
        raise FedkitError(f"{where} must be a mapping such as {{match: 'site*', profile: NAME}}")
    _known(spec, _RULE_KEYS, where, "key")
    selectors = [k for k in ("match", "index", "share") if spec.get(k) is not None]
    if len(selectors) > 1:
        raise FedkitError(f"{where}: use one of match, index and share, not {selectors}")
    if "profile" not in spec:
        raise FedkitError(f"{where} names no profile")
    body = spec["profile"]
    if isinstance(body, str):
        if body not in profiles:
            raise unknown("site profile", body, profiles)
        profile = profiles[body]
    else:
        profile = _profile(f"{where}.profile", body, speed, f"{where}.profile")
    index = spec.get("index")
    if index is not None:
        index = _indices(index, where)
    share = spec.get("share")
    if share is not None:
        share = _number(share, f"{where}.share")
        if not 0 < share <= 1:
            raise FedkitError(f"{where}.share must be in (0, 1], got {share}")
    match = spec.get("match")
    return Rule(profile, None if match is None else str(match), index, share)


def _indices(value: Any, where: str) -> tuple[int, ...]:
    """``0``, ``[0, 2]`` or ``"1-3"`` (inclusive) as positions."""
    if isinstance(value, str) and re.fullmatch(r"\s*\d+\s*-\s*\d+\s*", value):
        lo, hi = (int(v) for v in value.split("-"))
        return tuple(range(lo, hi + 1))
    items = value if isinstance(value, list) else [value]
    if not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in items):
        raise FedkitError(f"{where}.index must be positions (0, [0, 2] or '1-3'), got {value!r}")
    return tuple(items)


def _profile(name: str, body: Any, base_speed: float, where: str) -> SiteProfile:
    if not isinstance(body, Mapping):
        raise FedkitError(f"{where} must be a mapping of {', '.join(_PROFILE_KEYS)}")
    _known(body, _PROFILE_KEYS, where, "key")
    values = {**DEFAULTS, **body}
    return SiteProfile(
        name=name,
        samples_per_second=_compute(values["compute"], base_speed, f"{where}.compute"),
        download=bandwidth(values["download"], f"{where}.download"),
        upload=bandwidth(values["upload"], f"{where}.upload"),
        latency=duration(values["latency"], f"{where}.latency", zero=True),
        availability=_availability(body.get("availability"), f"{where}.availability"),
    )


def _availability(spec: Any, where: str) -> Availability:
    if spec is None:
        return Availability()
    if not isinstance(spec, Mapping):
        raise FedkitError(f"{where} must be a mapping of {', '.join(_AVAILABILITY_KEYS)}")
    _known(spec, _AVAILABILITY_KEYS, where, "key")
    down: list[tuple[float, float]] = []
    if spec.get("join") is not None:
        down.append((0.0, duration(spec["join"], f"{where}.join", zero=True)))
    for n, interval in enumerate(spec.get("down") or []):
        if not isinstance(interval, (list, tuple)) or len(interval) != 2:
            raise FedkitError(f"{where}.down[{n}] must be [from, to], e.g. [2 h, 2.5 h]")
        start = duration(interval[0], f"{where}.down[{n}]", zero=True)
        end = duration(interval[1], f"{where}.down[{n}]", zero=True)
        if end <= start:
            raise FedkitError(f"{where}.down[{n}] ends before it starts: {list(interval)}")
        down.append((start, end))
    rates = [k for k in ("failures_per_hour", "failures_per_day") if spec.get(k) is not None]
    if len(rates) > 1:
        raise FedkitError(f"{where}: give failures_per_hour or failures_per_day, not both")
    rate = 0.0
    if rates:
        per = 3600.0 if rates[0] == "failures_per_hour" else 86400.0
        rate = _number(spec[rates[0]], f"{where}.{rates[0]}") / per
        if rate < 0:
            raise FedkitError(f"{where}.{rates[0]} must be 0 or more")
    repair = 0.0
    if rate > 0:
        if spec.get("repair") is None:
            raise FedkitError(f"{where}: a failure rate needs `repair` (how long a failure lasts)")
        repair = duration(spec["repair"], f"{where}.repair")
    return Availability(merge_intervals(down), rate, repair)


def merge_intervals(intervals: Sequence[tuple[float, float]]) -> tuple[tuple[float, float], ...]:
    """Sorted intervals with the overlapping and touching ones joined."""
    out: list[list[float]] = []
    for start, end in sorted(intervals):
        if out and start <= out[-1][1]:
            out[-1][1] = max(out[-1][1], end)
        else:
            out.append([start, end])
    return tuple((a, b) for a, b in out)


# ---------------------------------------------------------------------- values with units


def duration(value: Any, where: str, zero: bool = False) -> float:
    """Seconds from a number or text with a unit (``300 ms``, ``10 min``, ``2 h``, ``1 d``)."""
    seconds = None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        seconds = float(value)
    elif isinstance(value, str) and (found := _DURATION.match(value)):
        seconds = _float(found.group(1)) * _SECONDS[found.group(2) or "s"]
    if seconds is None or not math.isfinite(seconds) or seconds < 0 or (seconds == 0 and not zero):
        kind = "0 or more" if zero else "above 0"
        raise FedkitError(
            f"{where}: {value!r} is not a duration {kind} (seconds, or e.g. 300 ms, 10 min, 2 h)"
        )
    return seconds


def bandwidth(value: Any, where: str) -> float:
    """Bytes per second from a number or text with a unit (``20 Mbit/s``, ``2.5 MB/s``)."""
    rate = None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        rate = float(value)
    elif isinstance(value, str) and (found := _BANDWIDTH.match(value)):
        bits = found.group(3) in ("bit/s", "bps")
        rate = _float(found.group(1)) * _PREFIX[found.group(2)] / (8.0 if bits else 1.0)
    if rate is None or not math.isfinite(rate) or rate <= 0:
        raise FedkitError(
            f"{where}: {value!r} is not a bandwidth above 0 (bytes per second, or e.g. "
            "20 Mbit/s, 2.5 MB/s)"
        )
    return rate


def _compute(value: Any, base: float, where: str) -> float:
    if isinstance(value, str) and (found := _FACTOR.match(value)):
        return _positive(_float(found.group(1)), where) * base
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return _positive(value, where)
    raise FedkitError(
        f"{where}: {value!r} is not a training speed (samples per second, or a factor of "
        "base.samples_per_second such as 0.1x)"
    )


def _positive(value: Any, where: str) -> float:
    number = _number(value, where)
    if not number > 0:
        raise FedkitError(f"{where} must be above 0, got {value!r}")
    return number


def _number(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise FedkitError(f"{where} must be a number, got {value!r}")
    if not math.isfinite(value):
        raise FedkitError(f"{where} must be finite, got {value!r}")
    return float(value)


def _float(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        return math.nan


def _known(spec: Mapping[str, Any], keys: Sequence[str], where: str, kind: str) -> None:
    for key in spec:
        if key not in keys:
            error = unknown(kind, str(key), keys)
            raise FedkitError(f"{where}: {error}")
