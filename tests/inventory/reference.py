"""The queue-wait model as first written (plain nested sums): the reference the fast version in
`gpuorch_inventory.core` must equal on every input (tests/inventory/test_waits_fast.py)."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence

from gpuorch_inventory.core import MAX_AHEAD, REFERENCE_GPUS, Demand, Hold


def node_earliest_reference(
    capacity: int, intervals: Sequence[tuple[float, float, int]], gpus: int, duration: float
) -> tuple[float, int] | None:
    """Earliest t (0 or when something ends) with `gpus` free on this node over [t, t+duration),
    and how many GPUs are left free at t after taking them."""
    points = sorted({0.0, *(s for s, _, _ in intervals), *(e for _, e, _ in intervals if math.isfinite(e))})
    used = [sum(g for s, e, g in intervals if s <= p < e) for p in points]
    ends = {0.0, *(e for _, e, _ in intervals if math.isfinite(e))}
    for i, t in enumerate(points):
        if t not in ends:
            continue
        peak = 0
        for j in range(i, len(points)):
            if points[j] >= t + duration:
                break
            peak = max(peak, used[j])
        if capacity - peak >= gpus:
            return t, capacity - used[i] - gpus
    return None


def earliest_start_reference(
    capacity: Mapping[str, int],
    holds: Sequence[Hold],
    ahead: Sequence[Demand],
    request_gpus: int = REFERENCE_GPUS,
    *,
    max_ahead: int = MAX_AHEAD,
) -> float | None:
    """`gpuorch_inventory.core.earliest_start` as it was written first (sums over every point,
    per node): the oracle of the property tests of the timeline version."""
    usage: dict[str, list[tuple[float, float, int]]] = {n: [] for n in capacity}
    for h in holds:
        if h.node in usage and h.gpus > 0:
            end = math.inf if h.remaining is None else max(0.0, h.remaining)
            if end > 0:
                usage[h.node].append((0.0, end, h.gpus))

    def place(gpus: int, duration: float, nodes: Iterable[str]) -> tuple[float, str] | None:
        best: tuple[float, int, str] | None = None
        for n in nodes:
            if n not in capacity or capacity[n] < gpus:
                continue
            found = node_earliest_reference(capacity[n], usage[n], gpus, duration)
            if found is not None and (best is None or (found[0], found[1], n) < best):
                best = (found[0], found[1], n)  # earliest, then best fit (fewest GPUs left), then name
        return None if best is None else (best[0], best[2])

    for d in ahead[:max_ahead]:
        if d.gpus <= 0:
            continue
        duration = math.inf if d.duration is None else max(0.0, d.duration)
        spot = place(d.gpus, duration, sorted(capacity) if d.nodes is None else sorted(d.nodes))
        if spot is not None and duration > 0:
            usage[spot[1]].append((spot[0], spot[0] + duration, d.gpus))
    spot = place(max(1, request_gpus), math.inf, sorted(capacity))
    return None if spot is None else spot[0]


