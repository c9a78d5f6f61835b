"""Fast-path decisions of one signature at new snapshot ages (the per-signature plan) equal the reference's.

The plan path rebuilds only the shown ages and freshness checks; these tests walk `now` across
whole seconds, staleness limits, times before a snapshot was observed, exclusions and memo
clearing, and compare every decision with the reference's on never-used indexes.
"""

from __future__ import annotations

import random

import msgspec
import pytest

from gpuorch.dev.bench.routing import NOW as BNOW
from gpuorch.dev.bench.routing import make_workload, make_world
from gpuorch_proto.inventory import ClusterSnapshot
from gpuorch_proto.routing import RoutingDecision
from gpuorch_proto.workload import Workload
from gpuorch_router.policy import RoutingMemo, SnapshotIndex, route


def _world(seed: int) -> dict[str, ClusterSnapshot]:
    rng = random.Random(seed)
    w = make_world(10, 24, seed=seed)
    out = {n: msgspec.structs.replace(s, observed_at=s.observed_at - rng.random()) for n, s in w.items()}
    first = sorted(out)[1]
    out[first] = msgspec.structs.replace(out[first], reachable=False, error="timeout")
    return out


def _fresh(w: dict[str, ClusterSnapshot], wl: Workload, now: float, **kw: object) -> RoutingDecision:
    fresh = {
        n: SnapshotIndex(msgspec.json.decode(msgspec.json.encode(s), type=ClusterSnapshot))
        for n, s in w.items()
    }
    copy = msgspec.json.decode(msgspec.json.encode(wl), type=Workload)
    return route(copy, "w", fresh, now, **kw)  # type: ignore[arg-type]


@pytest.mark.parametrize("max_age", [1e12, 120.0, 45.5])
@pytest.mark.parametrize("excluded", [False, True])
def test_decisions_at_new_ages_match_fresh_ones(max_age: float, excluded: bool) -> None:
    w = _world(5)
    exclude = tuple(sorted(w)[:1]) if excluded else ()
    rng = random.Random(int(max_age) + excluded)
    times, t = [], -70.0  # from before the youngest snapshot was observed, across staleness limits
    for _ in range(120):
        t += rng.choice([1.001, 0.25, 0.0, 3.5, 17.0])
        times.append(t)
    memo = RoutingMemo()
    got = [
        (t, i, memo.route(make_workload(i % 5, i), "w", w, BNOW + t, exclude=exclude, max_snapshot_age=max_age))
        for i, t in enumerate(times)
    ]
    assert any(world.plans for world in memo.worlds)  # the plan path was taken
    for t, i, decision in got:
        want = _fresh(w, make_workload(i % 5, i), BNOW + t, exclude=exclude, max_snapshot_age=max_age)
        assert decision == want, (t, i)
        assert msgspec.json.encode(decision) == msgspec.json.encode(want)


def test_freshness_checks_cleared_when_full_still_match() -> None:
    """More new ages than the freshness memo holds: it is cleared and rebuilt, results unchanged."""
    memo = RoutingMemo(memo_size=6)
    w = _world(11)
    got = [(t, memo.route(make_workload(1, t), "w", w, BNOW + t * 1.001)) for t in range(60)]
    for t, decision in got:
        assert decision == _fresh(w, make_workload(1, t), BNOW + t * 1.001), t
