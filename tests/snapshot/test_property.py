"""Restoring from a snapshot at any point, then replaying the rest, gives what a full replay gives.

The snapshot is taken as the services take it (gpuorch.runtime.snapshot): at an ack floor F,
from a live state that has folded every event at or below F and, for each workload, perhaps a few
of its next events too (a concurrent consumer is ahead on some workloads); the restart replays
from F + 1. Checked for the projection (every service's) and the router's `RouterState`.
"""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpuorch.projection import Projection, dump_projection, load_projection
from gpuorch.runtime.snapshot import decode_body, follower_body
from gpuorch_proto import Event
from gpuorch_router.core import RouterState, dump_state, load_state
from tests.snapshot.histories import histories


def full(history: list[tuple[int, Event]]) -> tuple[Projection, RouterState]:
    p, s = Projection(), RouterState()
    for seq, e in history:
        p.apply(e, seq)
        s.apply(e, seq)
    return p, s


def live_at(history: list[tuple[int, Event]], floor: int, ahead: dict[str, int]) -> tuple[Projection, RouterState]:
    """The state of a concurrent consumer whose ack floor is `floor`: everything up to it, and for
    some workloads their next `ahead[w]` events beyond it (each workload's in its order)."""
    p, s = Projection(), RouterState()
    taken: dict[str, int] = {}
    for seq, e in history:
        if seq > floor:
            w = e.workload_id
            if taken.get(w, 0) >= ahead.get(w, 0):
                ahead[w] = 0  # a workload is folded in order: once one is skipped, the rest wait
                continue
            taken[w] = taken.get(w, 0) + 1
        p.apply(e, seq)
        s.apply(e, seq)
    return p, s


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), history=histories())
def test_snapshot_then_the_rest_equals_a_full_replay(data: st.DataObject, history: list[tuple[int, Event]]) -> None:
    floor = data.draw(st.integers(0, len(history)), label="ack floor")
    wids = sorted({e.workload_id for _, e in history})
    ahead = {w: data.draw(st.integers(0, 3), label=f"ahead {w}") for w in wids}
    p_live, s_live = live_at(history, floor, dict(ahead))

    body = decode_body(follower_body(p_live, {}, dump_state(s_live)))  # through the bytes, as stored
    p, s = load_projection(body.projection), load_state(body.core)
    assert p == p_live and s == s_live, "a snapshot restores exactly what was dumped"
    for seq, e in history:
        if seq > floor:  # what the restart replays: `replay(start_seq=floor + 1)`
            p.apply(e, seq)
            s.apply(e, seq)

    p_full, s_full = full(history)
    assert p == p_full
    assert s == s_full


@given(history=histories())
@settings(max_examples=100, deadline=None)
def test_a_projection_round_trips_through_its_bytes(history: list[tuple[int, Event]]) -> None:
    p, _ = full(history)
    assert load_projection(dump_projection(p)) == p


def test_the_property_can_fail_a_snapshot_that_claims_more_than_it_folded() -> None:
    """The floor matters: a snapshot claiming a sequence its state had not folded loses that event."""
    from tests.snapshot.histories import MAKERS

    history = [(1, MAKERS["submitted"]("w0-a", 0, 1, 1.0)), (2, MAKERS["route-requested"]("w0-a", 0, 2, 2.0))]
    p_live, _ = live_at(history, 1, {})
    p = load_projection(dump_projection(p_live))
    # replaying from 3 (a wrong floor of 2) would miss seq 2
    assert p != full(history)[0]
