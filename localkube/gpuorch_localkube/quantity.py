"""Kubernetes resource quantities ("500m", "512Gi", "8") as exact fractions."""

from __future__ import annotations

import functools
import re
from fractions import Fraction

__all__ = ["QuantityError", "format_quantity", "parse_quantity"]

_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL = {
    "n": Fraction(1, 10**9),
    "u": Fraction(1, 10**6),
    "m": Fraction(1, 1000),
    "": Fraction(1),
    "k": Fraction(10**3),
    "M": Fraction(10**6),
    "G": Fraction(10**9),
    "T": Fraction(10**12),
    "P": Fraction(10**15),
    "E": Fraction(10**18),
}
_RE = re.compile(r"^([+-]?(?:\d+(?:\.\d*)?|\.\d+))(Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]|[eE][+-]?\d+)?$")


class QuantityError(ValueError):
    """A string that is not a Kubernetes quantity."""


def parse_quantity(value: object) -> Fraction:
    """Parse a quantity as Kubernetes does; numbers (from JSON) are accepted too."""
    if isinstance(value, str):
        return _parse_text(value)  # Fractions are immutable: one parse per distinct string
    return _parse(value)


@functools.lru_cache(maxsize=4096)
def _parse_text(value: str) -> Fraction:
    return _parse(value)


def _parse(value: object) -> Fraction:
    if isinstance(value, bool):
        raise QuantityError(f"quantities must match the regular expression: {value!r}")
    if isinstance(value, int):
        return Fraction(value)
    if isinstance(value, float):
        return Fraction(str(value))
    if not isinstance(value, str):
        raise QuantityError(f"quantities must be strings or numbers, not {type(value).__name__}")
    m = _RE.match(value.strip())
    if not m:
        raise QuantityError(
            f"quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$': {value!r}"
        )
    number = Fraction(m.group(1))
    suffix = m.group(2) or ""
    if suffix in _BINARY:
        return number * _BINARY[suffix]
    if suffix in _DECIMAL:
        return number * _DECIMAL[suffix]
    return number * Fraction(10) ** int(suffix[1:])


def format_quantity(value: Fraction | int) -> str:
    """A compact string form: integers plainly, fractions in milli-units."""
    v = Fraction(value)
    if v.denominator == 1:
        return str(v.numerator)
    milli = v * 1000
    if milli.denominator == 1:
        return f"{milli.numerator}m"
    return str(float(v))
