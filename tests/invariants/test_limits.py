"""Invariant 9 ("within-limits"): released, unfinished work never exceeds the admission policy's
limits; and invariant 5 leaves work that admission holds to it (the router is asked from the release)."""

from __future__ import annotations

from gpuorch.invariants import check_limits, check_waits
from gpuorch_proto import RoutingDecision, workload_from_obj
from gpuorch_proto import events as ev
from gpuorch_proto.policy import AdmissionPolicy, QueuePolicy
from gpuorch_proto.workload import Limits

WL = workload_from_obj({"metadata": {"name": "w"}, "spec": {"image": "x@sha256:" + "0" * 64, "command": ["true"]}})
ORG_ONE = AdmissionPolicy(organisation=Limits(max_running=1))


def rel(wid: str, at: float, queue: str = "default", gpus: float = 1.0) -> ev.Released:
    return ev.Released(workload_id=wid, at=at, queue=queue, gpus=gpus)


def seq(events: list[ev.Base]) -> list[tuple[int, ev.Base]]:
    return list(enumerate(events, start=1))


def test_a_release_past_max_running_is_a_violation() -> None:
    h = [rel("w-1", 1.0), rel("w-2", 2.0)]
    got = check_limits(seq(h), ORG_ONE)
    assert [(v.invariant, v.workload_id) for v in got] == [("within-limits", "w-2")]
    assert "while 1 workloads of organisation run (max_running 1)" in got[0].detail


def test_a_slot_freed_by_the_end_of_the_work_may_be_taken() -> None:
    for end in (
        ev.Completed(workload_id="w-1", at=1.5, attempt_id="w-1-a1", result_path="/r"),
        ev.WorkloadFailed(workload_id="w-1", at=1.5, reason="budget"),
        ev.Cancelled(workload_id="w-1", at=1.5),
        ev.Rejected(workload_id="w-1", at=1.5, reason="no", decision=RoutingDecision(workload_id="w-1", decided_at=1.5, outcome="rejected", summary="no")),
    ):
        assert check_limits(seq([rel("w-1", 1.0), end, rel("w-2", 2.0)]), ORG_ONE) == [], end
    # a rejected message (no decision) ends nothing
    bounced = ev.Rejected(workload_id="w-1", at=1.5, reason="bad message")
    assert [v.workload_id for v in check_limits(seq([rel("w-1", 1.0), bounced, rel("w-2", 2.0)]), ORG_ONE)] == ["w-2"]


def test_a_redelivered_release_counts_once() -> None:
    assert check_limits(seq([rel("w-1", 1.0), rel("w-1", 1.1)]), ORG_ONE) == []


def test_queue_limits_count_their_queue_and_gpu_limits_gpus() -> None:
    policy = AdmissionPolicy(queues=[QueuePolicy(name="default", limits=Limits(max_running=1)), QueuePolicy(name="batch", limits=Limits(max_gpus=4))])
    assert check_limits(seq([rel("w-1", 1.0), rel("w-2", 2.0, queue="batch")]), policy) == []
    got = check_limits(seq([rel("w-2", 2.0, queue="batch", gpus=4), rel("w-3", 3.0, queue="batch", gpus=1)]), policy)
    assert [(v.workload_id, "queue batch" in v.detail and "max_gpus 4" in v.detail) for v in got] == [("w-3", True)]
    assert check_limits(seq([rel("w-1", 1.0), rel("w-2", 2.0)]), AdmissionPolicy()) == []


def test_held_work_is_not_awaiting_the_router_and_released_work_is_from_its_release() -> None:
    sub = ev.Submitted(workload_id="w-1", at=0.0, workload=WL)
    held = ev.Held(workload_id="w-1", at=0.1, reason="held: organisation at 1 of 1 running workloads", queue="default")
    assert check_waits(seq([sub, held]), {}, now=100.0) == []
    released = [sub, held, rel("w-1", 95.0)]
    assert check_waits(seq(released), {}, now=100.0) == []  # asked 5 s ago, within the tolerance
    assert [v.invariant for v in check_waits(seq(released), {}, now=120.0)] == ["wait-reason-current"]
    assert [v.invariant for v in check_waits(seq([sub]), {}, now=100.0)] == ["wait-reason-current"]  # never held: as before
