"""One line of the bench table: every bench returns a list of these."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Row:
    bench: str
    case: str
    metric: str
    value: float
    unit: str
