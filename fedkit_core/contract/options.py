"""Typed config options: the unit of configuration shared by the core, tasks and plugins."""

from __future__ import annotations

import operator
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from fedkit_core.errors import FedkitError

_SCALARS = {"int": int, "float": float, "bool": bool, "str": str}
_NUMERIC = {"int", "float", "list[int]", "list[float]"}
_TYPES = {*_SCALARS, *_NUMERIC, "list[str]", "dict", "list[dict]"}


@dataclass(frozen=True)
class Option:
    """One config key: its type, default and help text.

    ``type`` is one of ``int``, ``float``, ``bool``, ``str``, ``list[int]``,
    ``list[float]``, ``list[str]``, ``dict``, ``list[dict]`` (a Python type or its name).
    A default of ``None`` makes the option nullable. ``choices`` restricts the allowed values.

    Bounds of a number (each of a list's items), checked when the config is resolved, before
    any data is loaded: ``min`` and ``max`` are inclusive (``value >= min``), ``gt`` and
    ``lt`` exclusive (``value > gt``: ``Option("lr", float, 1e-3, gt=0)``); a side takes one
    of the two. A value out of bounds is refused as ``config key 'k' must be > 0, got 0``, or,
    where ``rule`` says the bounds in words, as ``k must be <rule>, got 0`` (the core's keys:
    ``rule="above 0 (or null: no limit)"``).
    """

    name: str
    type: Any
    default: Any = None
    help: str = ""
    choices: Sequence[Any] | None = None
    nullable: bool = False
    min: float | None = None
    max: float | None = None
    gt: float | None = None
    lt: float | None = None
    rule: str = ""
    _bounds: tuple[tuple[float, str], ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        kind = self.type.__name__ if isinstance(self.type, type) else str(self.type)
        if kind not in _TYPES:
            raise ValueError(f"option {self.name!r}: unsupported type {self.type!r}")
        object.__setattr__(self, "type", kind)
        self._check_bounds(kind)
        # (limit, symbol) of each bound: what every value of this option is checked against
        bounds = tuple((b[0], b[2]) for b in (self._lower(), self._upper()) if b is not None)
        object.__setattr__(self, "_bounds", bounds)
        if self.default is None:
            object.__setattr__(self, "nullable", True)
        elif self.default is not None:
            object.__setattr__(self, "default", self.coerce(self.default, self.name))

    def _check_bounds(self, kind: str) -> None:
        """Refuse bounds that cannot work: on a type without numbers, both an inclusive and
        an exclusive bound on one side, a lower bound above the upper one, words without
        bounds."""
        lower, upper = self._lower(), self._upper()
        if (lower or upper) and kind not in _NUMERIC:
            raise ValueError(f"option {self.name!r}: min/max/gt/lt need a numeric type, not {kind}")
        for inclusive, exclusive in (("min", "gt"), ("max", "lt")):
            if getattr(self, inclusive) is not None and getattr(self, exclusive) is not None:
                raise ValueError(
                    f"option {self.name!r}: give {inclusive} (inclusive) or {exclusive} "
                    "(exclusive), not both"
                )
        if lower and upper:
            (low, low_name, _), (high, high_name, _) = lower, upper
            if low > high or (low == high and (self.gt is not None or self.lt is not None)):
                raise ValueError(
                    f"option {self.name!r}: {low_name} {low} is above {high_name} {high}"
                    if low > high
                    else f"option {self.name!r}: no value is above {low} and below {high}"
                )
        if self.rule and not (lower or upper):
            raise ValueError(f"option {self.name!r}: rule {self.rule!r} needs min/max/gt/lt")

    def _lower(self) -> tuple[float, str, str] | None:
        """The lower bound as (value, field, symbol), if any."""
        if self.min is not None:
            return self.min, "min", ">="
        if self.gt is not None:
            return self.gt, "gt", ">"
        return None

    def _upper(self) -> tuple[float, str, str] | None:
        """The upper bound as (value, field, symbol), if any."""
        if self.max is not None:
            return self.max, "max", "<="
        if self.lt is not None:
            return self.lt, "lt", "<"
        return None

    def renamed(self, name: str) -> Option:
        """This option under another key (e.g. namespaced ``<plugin>.<name>``), all else kept."""
        return replace(self, name=name)

    def describe(self) -> str:
        """``type`` (with choices and range) as shown in help and error messages."""
        kind = self.type + (" or null" if self.nullable else "")
        if self.choices:
            kind = " | ".join(map(str, self.choices))
        lower, upper = self._lower(), self._upper()
        if lower and upper:
            opening = "[" if self.gt is None else "("
            closing = "]" if self.lt is None else ")"
            kind += f" in {opening}{_number(lower[0])}, {_number(upper[0])}{closing}"
        elif lower or upper:
            bound, _, symbol = lower or upper  # type: ignore[misc]
            kind += f" {symbol} {_number(bound)}"
        return kind

    def coerce(self, value: Any, key: str) -> Any:
        """Return ``value`` converted to this option's type, or raise a FedkitError."""
        if value is None:
            if self.nullable:
                return None
            raise FedkitError(f"config key {key!r} must not be null (expected {self.describe()})")
        if self.type == "list[dict]":
            value = value if isinstance(value, (list, tuple)) else [value]
            if not all(isinstance(v, dict) for v in value):
                raise FedkitError(
                    f"config key {key!r} must be a list of mappings, got {short_repr(value)}"
                )
            result = [dict(v) for v in value]
        elif self.type.startswith("list["):
            item = _SCALARS[self.type[5:-1]]
            if isinstance(value, str):
                value = [v.strip() for v in value.strip("[]").split(",") if v.strip()]
            elif not isinstance(value, (list, tuple)):
                value = [value]
            result = [_coerce_scalar(v, item, key) for v in value]
        elif self.type == "dict":
            if not isinstance(value, dict):
                raise FedkitError(f"config key {key!r} must be a mapping, got {short_repr(value)}")
            result = dict(value)
        else:
            if isinstance(value, bool) and self.type == "str":
                value = _spelt(value, self.choices)  # `--set key=off`: YAML read a bool
            result = _coerce_scalar(value, _SCALARS[self.type], key)
        items = result if isinstance(result, list) else [result]
        if self.choices is not None and any(item not in self.choices for item in items):
            raise FedkitError(
                f"config key {key!r} must be one of {', '.join(map(str, self.choices))}"
                f"{' (each item)' if isinstance(result, list) else ''}; got {short_repr(result)}"
            )
        for limit, symbol in self._bounds:
            for number in items:
                if not _OPERATORS[symbol](number, limit):
                    raise self.refusal(result, key, f"{symbol} {_number(limit)}", number)
        return result

    def refusal(
        self, value: Any, key: str, bound: str = "", number: float | None = None
    ) -> FedkitError:
        """The error refusing ``value`` of ``key``: in this option's ``rule`` where it has
        one (``key must be <rule>, got <value>``), else naming the ``bound`` the ``number``
        (the value or one of its items) broke (``config key 'key' must be >= 0, got -1``).
        Checks of a key that are not ranges (a list's length) refuse with it too."""
        if self.rule:
            return FedkitError(f"{key} must be {self.rule}, got {value}")
        return FedkitError(
            f"config key {key!r} must be {bound}, got {_number(value if number is None else number)}"
        )


#: the test of each bound's symbol: the value passes when it holds
_OPERATORS: dict[str, Callable[[float, float], bool]] = {
    ">=": operator.ge,
    ">": operator.gt,
    "<=": operator.le,
    "<": operator.lt,
}


#: the words YAML 1.1 (config files, ``--set``) reads as a boolean
_BOOLEAN_WORDS = {True: ("true", "yes", "on"), False: ("false", "no", "off")}


def _spelt(value: bool, choices: Sequence[Any] | None) -> str | bool:
    """The one choice that YAML may have read as the boolean ``value`` (``off`` as False,
    ``true`` as True), else ``value`` itself."""
    words = [w for w in _BOOLEAN_WORDS[value] if choices is not None and w in choices]
    return words[0] if len(words) == 1 else value


def _number(value: float) -> str:
    """``-1`` rather than ``-1.0`` in messages: whole floats print as integers."""
    return str(int(value)) if isinstance(value, float) and value.is_integer() else str(value)


#: the largest integer a config key may hold (a 64-bit integer, as torch and numpy need)
MAX_INT = 2**63 - 1


def short_repr(value: Any, limit: int = 80) -> str:
    """``repr(value)`` cut to ``limit`` characters: messages quote input, never pages of it."""
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


def _coerce_scalar(value: Any, kind: type, key: str) -> Any:
    result = _scalar(value, kind, key)
    if kind is int and abs(result) > MAX_INT:
        raise FedkitError(f"config key {key!r} is out of range: {short_repr(result)}")
    return result


def _scalar(value: Any, kind: type, key: str) -> Any:
    bad = FedkitError(f"config key {key!r} expects {kind.__name__}, got {short_repr(value)}")
    if kind is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in {"true", "false", "yes", "no", "1", "0"}:
            return value.lower() in {"true", "yes", "1"}
        raise bad
    if isinstance(value, bool):
        raise bad
    if kind is int:
        if isinstance(value, int):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        if isinstance(value, str):
            try:
                return int(value)
            except ValueError:
                raise bad from None
        raise bad
    if kind is float:
        if isinstance(value, (int, float)):
            return float(value)
        if isinstance(value, str):
            try:
                return float(value)
            except ValueError:
                raise bad from None
        raise bad
    if isinstance(value, (str, int, float)):
        return str(value)
    raise bad
