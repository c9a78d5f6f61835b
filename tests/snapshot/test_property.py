"""Restoring from a snapshot at any point, then replaying the rest, gives what a full replay gives.

The snapshot is taken as the services take it (gpuorch.runtime.snapshot): at an ack floor F,
from a live state that has folded every event at or below F and, for each workload, perhaps a few
of its next events too (a concurrent consumer is ahead on some workloads); the restart replays
from F + 1. Checked for the projection (every service's), the router's `RouterState` and its pipeline `Gate`.
"""

from __future__ import annotations

from dataclasses import replace

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpuorch.projection import (
    Projection,
    WorkloadView,
    dump_projection,
    load_projection,
    same_document,
    settled,
)
from gpuorch.runtime.snapshot import decode_body, follower_body
from gpuorch_proto import Event
from gpuorch_router.core import RouterState, dump_router, load_router
from gpuorch_router.pipeline import Gate
from tests.snapshot.histories import histories

Folded = tuple[Projection, Projection, RouterState, Gate]  # client's, services' (retire=True), router's


def fold(state: Folded, e: Event, seq: int) -> None:
    """As the router folds an event (`Router.fold`); dispatcher and fencer fold the projection alone."""
    for part in state:
        part.apply(e, seq)


def same_gate(a: Gate, b: Gate) -> bool:
    """Equal but for the dirty marks (which only say "look again"; a restored gate looks at everything)."""
    return replace(a, dirty=True, dirty_pipelines=set()) == replace(b, dirty=True, dirty_pipelines=set())


def full(history: list[tuple[int, Event]]) -> Folded:
    state: Folded = (Projection(), Projection(retire=True), RouterState(), Gate())
    for seq, e in history:
        fold(state, e, seq)
    return state


def live_at(history: list[tuple[int, Event]], floor: int, ahead: dict[str, int]) -> Folded:
    """The state of a concurrent consumer whose ack floor is `floor`: everything up to it, and for
    some workloads their next `ahead[w]` events beyond it (each workload's in its order)."""
    state: Folded = (Projection(), Projection(retire=True), RouterState(), Gate())
    taken: dict[str, int] = {}
    for seq, e in history:
        if seq > floor:
            w = e.workload_id
            if taken.get(w, 0) >= ahead.get(w, 0):
                ahead[w] = 0  # a workload is folded in order: once one is skipped, the rest wait
                continue
            taken[w] = taken.get(w, 0) + 1
        fold(state, e, seq)
    return state


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), history=histories())
def test_snapshot_then_the_rest_equals_a_full_replay(data: st.DataObject, history: list[tuple[int, Event]]) -> None:
    floor = data.draw(st.integers(0, len(history)), label="ack floor")
    wids = sorted({e.workload_id for _, e in history})
    ahead = {w: data.draw(st.integers(0, 3), label=f"ahead {w}") for w in wids}
    c_live, p_live, s_live, g_live = live_at(history, floor, dict(ahead))

    c_body = decode_body(follower_body(c_live, {}))
    body = decode_body(follower_body(p_live, {}, dump_router(s_live, g_live)))  # through the bytes, as stored
    s, g, _ = load_router(body.core)
    restored: Folded = (load_projection(c_body.projection), load_projection(body.projection), s, g)
    assert restored[0] == c_live and restored[1] == p_live, "a snapshot restores exactly what was dumped"
    assert s == s_live and same_gate(g, g_live)
    for seq, e in history:
        if seq > floor:  # what the restart replays: `replay(start_seq=floor + 1)`
            fold(restored, e, seq)

    c_full, p_full, s_full, g_full = full(history)
    assert restored[0] == c_full
    assert restored[1] == p_full
    assert restored[2] == s_full
    assert same_gate(restored[3], g_full)
    assert not c_full.retired, "the client's projection keeps every view whole"
    assert set(p_full.workloads) | set(p_full.retired) == set(c_full.workloads)
    for wid, r in p_full.retired.items():  # what a service reads of a retired workload is what the whole view says
        assert_same_kept(r.view(wid), c_full.workloads[wid])


def assert_same_kept(v: WorkloadView, whole: WorkloadView) -> None:
    """A view rebuilt from its retired record agrees with the whole view on everything it keeps."""
    assert settled(whole)
    for name in ("status", "reason", "epoch", "promoted_attempt", "result_path", "cancel_requested", "routed_attempts",
                 "route_requested", "pipeline", "stage", "last_seq", "terminal"):  # fmt: skip
        assert getattr(v, name) == getattr(whole, name), name
    assert v.attempts.keys() == whole.attempts.keys()
    for aid, a in v.attempts.items():
        assert replace(a, checkpoint_path="", mode_reason="", resume_from=None, unschedulable="") == replace(
            whole.attempts[aid], checkpoint_path="", mode_reason="", resume_from=None, unschedulable=""
        )
    if whole.workload is None:
        assert v.workload is None
    else:
        assert v.workload is not None and same_document(v, whole.workload)
        kept = v.workload
        assert kept.metadata.owner == whole.workload.metadata.owner
        assert kept.spec.output.store == whole.workload.spec.output.store
        assert (kept.spec.lease, kept.spec.fencing) == (whole.workload.spec.lease, whole.workload.spec.fencing)
        assert kept.spec.resources.gpus == whole.workload.spec.resources.gpus


@given(history=histories())
@settings(max_examples=100, deadline=None)
def test_a_projection_round_trips_through_its_bytes(history: list[tuple[int, Event]]) -> None:
    for p in full(history)[:2]:
        assert load_projection(dump_projection(p)) == p


def test_the_property_can_fail_a_snapshot_that_claims_more_than_it_folded() -> None:
    """The floor matters: a snapshot claiming a sequence its state had not folded loses that event."""
    from tests.snapshot.histories import MAKERS

    history = [(1, MAKERS["submitted"]("w0-a", 0, 1, 1.0)), (2, MAKERS["route-requested"]("w0-a", 0, 2, 2.0))]
    p_live = live_at(history, 1, {})[0]
    p = load_projection(dump_projection(p_live))
    # replaying from 3 (a wrong floor of 2) would miss seq 2
    assert p != full(history)[0]
