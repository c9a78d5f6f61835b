"""Parsing of Kubernetes-style quantities and human durations (pure, cached)."""

from __future__ import annotations

import re
from functools import lru_cache

_BIN = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DEC = {"n": 1e-9, "u": 1e-6, "m": 1e-3, "": 1.0, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15, "E": 1e18}
_QTY = re.compile(r"^([0-9]+(?:\.[0-9]+)?)(Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E)?$")
_DUR = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)")
_DUR_UNIT = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


class UnitError(ValueError):
    """A quantity or duration string that cannot be parsed."""


@lru_cache(maxsize=4096)
def parse_quantity(value: str | int | float) -> float:
    """``"128Gi"`` → bytes, ``"500m"`` → 0.5, ``"16"`` → 16.0."""
    if isinstance(value, (int, float)):
        return float(value)
    m = _QTY.match(value.strip())
    if not m:
        raise UnitError(f"{value!r} is not a quantity (examples: '16', '500m', '128Gi')")
    number, suffix = float(m.group(1)), m.group(2) or ""
    return number * (_BIN[suffix] if suffix in _BIN else _DEC[suffix])


@lru_cache(maxsize=4096)
def parse_duration(value: str | int | float) -> float:
    """``"1h30m"`` → 5400.0 seconds; a bare number is seconds."""
    if isinstance(value, (int, float)):
        if value < 0:
            raise UnitError(f"{value!r} is negative")
        return float(value)
    text = value.strip()
    try:
        return parse_duration(float(text))
    except ValueError:
        pass
    pos, total = 0, 0.0
    for m in _DUR.finditer(text):
        if m.start() != pos:
            break
        total += float(m.group(1)) * _DUR_UNIT[m.group(2)]
        pos = m.end()
    if pos != len(text) or not text:
        raise UnitError(f"{value!r} is not a duration (examples: '90s', '30m', '1h30m')")
    return total


def format_duration(seconds: float) -> str:
    """Compact human form: 7260 → '2h1m', 42.5 → '42.5s'."""
    if seconds < 60:
        return f"{seconds:.3g}s"
    minutes, sec = divmod(round(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    if hours:
        return f"{hours}h{minutes}m" if minutes else f"{hours}h"
    return f"{minutes}m{sec}s" if sec else f"{minutes}m"
