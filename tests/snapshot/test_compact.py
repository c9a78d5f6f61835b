"""The services' compact views (`Projection(compact=True)`, gpuorch.projection) answer what the
services ask exactly as whole views do, over random event histories; and a compact projection
restored from its snapshot (`Follower.restore`: decoded, then `compact_all`) is the one dumped."""

from __future__ import annotations

from dataclasses import replace

import msgspec
from hypothesis import HealthCheck, given, settings

from gpuorch.follow import Follower
from gpuorch.projection import Projection, WorkloadView, dump_projection, load_projection, settled
from gpuorch_dispatcher.core import estimated_queue_wait
from gpuorch_proto import Event, encode
from gpuorch_router.preempt import capacity_clusters
from tests.snapshot.histories import histories

_decode = msgspec.json.Decoder(Event).decode


def fold(history: list[tuple[int, Event]], compact: bool) -> Projection:
    """Each projection folds its own decoded copy of the log (as each service process does)."""
    p = Projection(retire=True, compact=compact)
    for seq, e in history:
        p.apply(_decode(encode(e)), seq)
    return p


def decision_answers(v: WorkloadView) -> object:
    """What the services read of a view's routing decision."""
    d = v.decision
    if d is None:
        return None
    return (
        d.workload_id, d.outcome, d.cluster, d.queue, d.placement, d.decided_at, capacity_clusters(d),
        [(x.cluster, x.eligible, [c for c in x.checks if not c.ok]) for x in d.verdicts],
        # the router's learning pass: staging on the promoted attempt's cluster
        {x.cluster: (x.estimate.data_staging, x.estimate.image_staging) for x in d.verdicts if x.estimate is not None},
        # the dispatcher's requeue limit: the router's queue-wait estimate for each attempt's cluster
        {aid: estimated_queue_wait(v, a) for aid, a in v.attempts.items()},
    )  # fmt: skip


def assert_same_answers(c: WorkloadView, w: WorkloadView) -> None:
    drop = {"decision": None, "history": [], "idempotency_key": None}
    assert replace(c, **drop) == replace(w, **drop)  # type: ignore[arg-type]
    assert c.workload == w.workload  # the document, equal (shared parts, same values)
    assert decision_answers(c) == decision_answers(w)
    assert (c.terminal, c.live_attempts, c.latest_attempt, c.next_attempt_number) == (
        w.terminal, w.live_attempts, w.latest_attempt, w.next_attempt_number,
    )  # fmt: skip
    assert settled(c) == settled(w)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(history=histories())
def test_a_compact_projection_answers_as_the_whole_one(history: list[tuple[int, Event]]) -> None:
    whole, compact = fold(history, False), fold(history, True)
    assert whole.workloads.keys() == compact.workloads.keys()
    assert whole.retired == compact.retired  # retired records: the same whatever the live form
    assert whole.last_seq == compact.last_seq
    for wid, w in whole.workloads.items():
        assert_same_answers(compact.workloads[wid], w)
        assert not compact.workloads[wid].history


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(history=histories())
def test_a_compact_projection_restores_from_its_snapshot(history: list[tuple[int, Event]]) -> None:
    live = fold(history, True)
    f = Follower()
    assert f.projection.compact, "the services' follower keeps compact views"
    f.restore(load_projection(dump_projection(live)), {w: {"traceparent": f"00-{w}"} for w in live.workloads})
    assert f.projection.workloads == live.workloads
    assert f.projection.retired == live.retired
    for wid in live.workloads:
        assert f.traceparent(wid) == f"00-{wid}"


def test_a_compact_view_shares_the_parts_of_equal_documents() -> None:
    from gpuorch_proto import event_id
    from gpuorch_proto import events as ev
    from tests.support.builders import NOW, make_workload

    p = Projection(retire=True, compact=True)
    for i in range(2):
        wid = f"w{i}"
        wl = _decode(encode(ev.Submitted(event_id=event_id(wid, "submitted"), workload_id=wid, at=NOW, workload=make_workload(f"t{i}", gpus=1))))
        p.apply(wl, i + 1)
    a, b = (p.workloads[w].workload for w in ("w0", "w1"))
    assert a is not None and b is not None and a != b
    assert a.spec.resources is b.spec.resources and a.spec.retry is b.spec.retry
