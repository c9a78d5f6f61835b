"""Finished workloads retired to compact records in the services' projections (gpuorch.projection):
every decision a service takes on a late event for a finished workload is the one it takes on the
whole view; the client's projection keeps every view whole; the router's learnt history survives
a restart through its snapshot."""

from __future__ import annotations

from collections.abc import Iterable

import msgspec
import pytest

from gpuorch.projection import Projection, WorkloadView, dump_projection, load_projection, same_document
from gpuorch_dispatcher import core as dcore
from gpuorch_fencer import core as fcore
from gpuorch_proto import Event, FenceRecord
from gpuorch_proto import events as ev
from gpuorch_proto.storage import StoreConfig
from tests.snapshot.histories import MAKERS, WORKLOADS
from tests.support.builders import NOW

ENV = dcore.Environment(registry={}, stores={"scratch": StoreConfig(url="s3://bucket/store")})
LIFE = ["submitted", "routed", "attempt-created", "admitted", "running", "succeeded", "promote-requested", "promoted", "completed"]


def life(wid: str, kinds: Iterable[tuple[str, int]]) -> list[Event]:
    return [MAKERS[k](wid, 0, n, NOW + i) for i, (k, n) in enumerate(kinds)]


def both(events: list[Event]) -> tuple[Projection, Projection]:
    """The client's projection (whole views) and a service's (retiring), folded alike."""
    whole, services = Projection(), Projection(retire=True)
    for seq, e in enumerate(events, 1):
        whole.apply(e, seq)
        services.apply(e, seq)
    return whole, services


def completed(wid: str = "w1") -> list[Event]:
    return life(wid, [(k, 1) for k in LIFE])


def test_a_finished_workload_is_retired_in_the_services_and_whole_for_the_client() -> None:
    whole, services = both(completed())
    assert "w1" in services.retired and "w1" not in services.workloads
    assert "w1" in whole.workloads and not whole.retired
    full = whole.workloads["w1"]
    assert full.decision is not None and full.history, "the client still shows everything"
    v = services.get("w1")
    assert v is not None and v.retired and v.decision is None and not v.history
    assert (v.status, v.promoted_attempt, v.result_path, v.epoch) == (full.status, full.promoted_attempt, full.result_path, full.epoch)
    assert len(services) == len(whole) == 1 and "w1" in services
    small, big = len(dump_projection(services)), len(dump_projection(whole))
    assert small * 4 < big, f"retired record {small} B vs whole view {big} B"


def test_a_workload_with_an_attempt_the_fencer_still_pursues_is_not_retired_until_it_is_gone() -> None:
    # attempt 1 lost, fenced, never confirmed gone; attempt 2 completes the workload
    events = life("w1", [("submitted", 1), ("routed", 1), ("attempt-created", 1), ("running", 1), ("lost", 1), ("fence-requested", 1),
                         ("fenced", 1), ("attempt-created", 2), ("running", 2), ("succeeded", 2), ("promoted", 2), ("completed", 2)])  # fmt: skip
    whole, services = both(events)
    assert "w1" in services.workloads, "a fenced attempt not yet gone keeps the view whole (the fencer resumes its pursuit)"
    assert fcore.pursuits_to_resume(services.workloads.values(), 1.0) == fcore.pursuits_to_resume(whole.workloads.values(), 1.0) != []
    services.apply(MAKERS["cancel-confirmed"]("w1", 0, 1, NOW + 50), len(events) + 1)
    assert "w1" in services.retired, "settled once the pursued attempt is confirmed gone"


def _same_actions(whole: WorkloadView, retired: WorkloadView, e: Event) -> None:
    assert dcore.reconcile(retired, NOW + 100, ENV) == dcore.reconcile(whole, NOW + 100, ENV), type(e).__name__


@pytest.mark.parametrize("late", ["failed", "lost", "attempt-created", "promoted", "cancel-confirmed", "replacement-allowed"])
def test_the_dispatcher_decides_a_late_event_for_a_retired_workload_as_for_the_whole_view(late: str) -> None:
    events = completed()
    e = MAKERS[late]("w1", 0, 2, NOW + 99) if late != "replacement-allowed" else ev.ReplacementAllowed(
        workload_id="w1", at=NOW + 99, attempt_id="w1-a1", epoch=1, cluster="east", how="fast")  # fmt: skip
    whole, _ = both([*events, e])
    wv, rv = whole.get("w1"), Projection(retire=True)
    for seq, x in enumerate(events, 1):
        rv.apply(x, seq)
    retired_view = rv.apply(e, len(events) + 1)  # what the dispatcher's handler gets for the late event
    assert wv is not None and retired_view is not None
    _same_actions(wv, retired_view, e)
    assert dcore.on_cancel(retired_view, "w1", "late", NOW) == dcore.on_cancel(wv, "w1", "late", NOW) == []
    assert dcore.reconcile(retired_view, NOW, ENV) == dcore.reconcile(wv, NOW, ENV)


def test_a_late_attempt_of_a_cancelled_workload_is_still_fenced_with_its_lease() -> None:
    events = life("w1", [("submitted", 1), ("cancel-requested", 1), ("cancelled", 1)])
    whole, services = both(events)
    assert "w1" in services.retired
    late = MAKERS["attempt-created"]("w1", 0, 1, NOW + 10)
    rv, wv = services.apply(late, 4), whole.apply(late, 4)
    assert rv is not None and wv is not None
    acts = dcore.reconcile(rv, NOW + 10, ENV)
    assert acts == dcore.reconcile(wv, NOW + 10, ENV)
    fence = [a.event for a in acts if isinstance(a, dcore.Emit) and isinstance(a.event, ev.FenceRequested)]
    assert fence and fence[0].lease_expires_at == NOW + 10 + 600, "fenced with the workload's own lease (10m)"


def test_the_fencer_still_refuses_a_late_promote_for_a_retired_workload() -> None:
    # attempt 1 lost, fenced (epoch 2) and confirmed gone; attempt 2 promoted: then attempt 1's late promote
    events = life("w1", [("submitted", 1), ("routed", 1), ("attempt-created", 1), ("running", 1), ("lost", 1), ("fence-requested", 1),
                         ("fenced", 1), ("cancel-confirmed", 1), ("attempt-created", 2), ("running", 2), ("succeeded", 2),
                         ("promoted", 2), ("completed", 2)])  # fmt: skip
    whole, services = both(events)
    assert "w1" in services.retired
    late = ev.PromoteRequested(workload_id="w1", at=NOW + 99, attempt_id="w1-a1", epoch=1, cluster="east", output_path="file:///store/w1/attempts/w1-a1")
    for p in (whole, services):
        v = p.get("w1")
        assert v is not None and v.workload is not None
        a = v.attempts["w1-a1"]
        facts = fcore.AttemptFacts(created_epoch=a.epoch if "created" in a.times else None, succeeded=a.status == "succeeded")
        assert v.workload.spec.output.store == "scratch", "the store the fencer derives the paths from"
        problem = fcore.promotion_problem(late, facts, fcore.attempt_url("file:///store", "w1", "w1-a1"))
        assert problem == fcore.promotion_problem(late, facts, fcore.attempt_url("file:///store", "w1", "w1-a1"))
        assert fcore.deferred_promotion(v, MAKERS["attempt-created"]("w1", 0, 1, NOW)) is None
    wa, ra = whole.workloads["w1"].attempts["w1-a1"], services.get("w1").attempts["w1-a1"]  # type: ignore[union-attr]
    assert (ra.epoch, ra.status, ra.times.get("created")) == (wa.epoch, wa.status, wa.times.get("created"))
    rec = FenceRecord(epoch=2, current_attempt="w1-a2", promoted_attempt="w1-a2")
    d = fcore.on_promote_requested(rec, late, NOW + 99, "file:///store/w1/result/manifest.json", "not read")
    assert d.promote is None and any(isinstance(x, ev.PromotionRejected) for x in d.events), d.events


def test_a_resent_submit_of_a_retired_workload_is_a_duplicate_and_another_body_is_not() -> None:
    _, services = both(completed())
    v = services.get("w1")
    assert v is not None and v.retired
    decoded = msgspec.msgpack.decode(msgspec.msgpack.encode(WORKLOADS[0]), type=type(WORKLOADS[0]))  # as it comes off the wire
    assert same_document(v, WORKLOADS[0]) and same_document(v, decoded)
    assert not same_document(v, WORKLOADS[1])


def test_a_redelivered_event_of_a_retired_workload_changes_nothing() -> None:
    events = completed()
    _, services = both(events)
    before = dump_projection(services)
    for seq, e in enumerate(events, 1):
        services.apply(e, seq)
    assert dump_projection(services) == before
    assert load_projection(before) == services


def test_the_routers_history_survives_a_restart_through_its_snapshot() -> None:
    from gpuorch.config import Settings
    from gpuorch_router import core as rcore
    from gpuorch_router.service import Router

    events = [e for i in range(3) for e in completed(f"w{i}")]
    full = Router(Settings(prefix="t"))
    for seq, e in enumerate(events, 1):
        full.fold(e, seq)
    assert full.history is not None and sum(full.history.samples.values()) == 3, "learnt from each completed workload once"
    assert not full.follower.projection.workloads, "and every one retired"

    half = Router(Settings(prefix="t"))
    cut = len(events) // 2
    for seq, e in enumerate(events[:cut], 1):
        half.fold(e, seq)
    restored = Router(Settings(prefix="t"))
    restored.follower.restore(load_projection(dump_projection(half.follower.projection)), {})
    restored.state, restored.gate, restored.history = rcore.load_router(rcore.dump_router(half.state, half.gate, half.history))
    for seq, e in enumerate(events, 1):
        if seq > cut:
            restored.fold(e, seq)
    assert rcore.same_history(restored.history, full.history)
    assert not rcore.same_history(None, full.history), "the comparison can fail"
    assert restored.state == full.state and not full.state.published, "a finished workload's decision signature is not kept"
