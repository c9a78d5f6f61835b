"""The queue-wait model's fast version equals the plain one (tests/inventory/reference.py) on
random clusters: the same estimate from `earliest_start`, and the same answer from one node's
`_Timeline` as from the nested sums, after any sequence of bookings and asks."""

from __future__ import annotations

import math
import time

from hypothesis import given, settings
from hypothesis import strategies as st

from gpuorch_inventory.core import Demand, Hold, _Timeline, earliest_start
from tests.inventory.reference import earliest_start_reference, node_earliest_reference

NODES = ["a", "b", "c", "d"]
# few distinct values, so that starts and ends coincide (ties are where such code goes wrong)
times = st.sampled_from([0.0, 0.5, 1.0, 2.0, 3.0, 5.0, 7.5, 10.0, 20.0, 100.0])
durations = st.one_of(st.none(), times, st.floats(min_value=0.0, max_value=200.0, allow_nan=False))


@st.composite
def clusters(draw: st.DrawFn) -> tuple[dict[str, int], list[Hold], list[Demand], int]:
    names = draw(st.lists(st.sampled_from(NODES), min_size=1, max_size=4, unique=True))
    capacity = {n: draw(st.integers(0, 8)) for n in names}
    holds = draw(st.lists(st.builds(Hold, st.sampled_from([*NODES, "gone"]), st.integers(0, 8), durations), max_size=10))
    eligible = st.one_of(st.none(), st.frozensets(st.sampled_from([*NODES, "gone"]), max_size=4))
    ahead = draw(st.lists(st.builds(Demand, st.integers(0, 9), durations, eligible), max_size=25))
    return capacity, holds, ahead, draw(st.integers(0, 9))


@settings(max_examples=300, deadline=None)
@given(clusters(), st.integers(1, 30))
def test_earliest_start_equals_the_reference(cluster: tuple[dict[str, int], list[Hold], list[Demand], int], max_ahead: int) -> None:
    capacity, holds, ahead, request = cluster
    fast = earliest_start(capacity, holds, ahead, request, max_ahead=max_ahead)
    assert fast == earliest_start_reference(capacity, holds, ahead, request, max_ahead=max_ahead)


booking = st.tuples(times, st.one_of(times, st.just(math.inf)), st.integers(1, 4))
ask = st.tuples(st.integers(0, 9), st.one_of(st.just(math.inf), times))


@settings(max_examples=300, deadline=None)
@given(st.integers(0, 8), st.lists(st.tuples(st.lists(booking, max_size=4), st.lists(ask, min_size=1, max_size=4)), min_size=1, max_size=8))
def test_one_nodes_timeline_answers_as_the_nested_sums(capacity: int, rounds: list[tuple[list[tuple[float, float, int]], list[tuple[int, float]]]]) -> None:
    tl = _Timeline(capacity)
    intervals: list[tuple[float, float, int]] = []
    for bookings, asks in rounds:
        for s, d, g in bookings:
            e = s + d
            if e > s:  # what earliest_start books: a positive duration from a start
                tl.book(s, e, g)
                intervals.append((s, e, g))
        for gpus, duration in asks:
            assert tl.earliest(gpus, duration) == node_earliest_reference(capacity, intervals, gpus, duration), (intervals, gpus, duration)


def test_a_long_line_ahead_of_a_full_cluster_is_cheap() -> None:
    """The bench's shape: 5 full nodes of 8, 500 one-GPU 10 h demands ahead (well under a
    second; the nested sums took seconds); and the answer is the reference's."""
    capacity = {f"n{i}": 8 for i in range(5)}
    holds = [Hold(f"n{i}", 1, 1000.0 + 97 * i + 13 * g) for i in range(5) for g in range(8)]
    ahead = [Demand(1, 36000.0, frozenset(capacity)) for _ in range(500)]
    began = time.process_time()
    fast = earliest_start(capacity, holds, ahead)
    took = time.process_time() - began
    assert fast == earliest_start_reference(capacity, holds, ahead)
    assert took < 0.5, f"{took:.3f} s"
