"""Invariant 5: every wait has an end or a reason that is true now (`check_waits`)."""

from __future__ import annotations

from gpuorch.invariants import check, check_waits
from gpuorch_proto import ClusterSnapshot, RoutingDecision, workload_from_obj
from gpuorch_proto import events as ev
from gpuorch_proto.routing import Check, ClusterVerdict

W = "w-0000000007"
WL = workload_from_obj({"metadata": {"name": "w"}, "spec": {"image": "x@sha256:" + "0" * 64, "command": ["true"]}})
LOSS = 100.0  # the route-requested after the lost attempt
A1 = {"workload_id": W, "attempt_id": f"{W}-a1", "epoch": 1, "cluster": "alpha"}

UNREACHABLE = Check(code="CLUSTER_UNREACHABLE", ok=False, message="unreachable: timeout (last observed 5s ago)", capacity_only=True)
EXCLUDED = Check(code="CLUSTER_NOT_ALLOWED", ok=False, message="excluded by the caller for now", capacity_only=True)
NO_STORE = Check(code="ARTIFACT_STORE", ok=False, message="cannot reach output store 'prod'")


def waiting(at: float, *alpha_checks: Check, n: int = 2) -> ev.Unroutable:
    d = RoutingDecision(
        workload_id=W, decided_at=at, outcome="waiting", summary="waiting",
        verdicts=[ClusterVerdict(cluster="alpha", eligible=False, checks=list(alpha_checks)),
                  ClusterVerdict(cluster="beta", eligible=False, checks=[NO_STORE])],
    )
    return ev.Unroutable(event_id=f"{W}.unroutable.{n}.{at}", workload_id=W, at=at, decision=d, attempt_number=n)


def lost_then_waiting(*after: ev.Base) -> list[tuple[int, ev.Base]]:
    routed = RoutingDecision(workload_id=W, decided_at=0.0, outcome="routed", cluster="alpha", summary="s")
    h: list[ev.Base] = [
        ev.Submitted(workload_id=W, at=0.0, workload=WL),
        ev.Routed(workload_id=W, at=0.0, decision=routed),
        ev.AttemptCreated(at=1.0, attempt_number=1, job_name="j", output_path="/o", checkpoint_path="/c", **A1),
        ev.Lost(at=LOSS - 1, reason="unreachable", **A1),
        ev.RouteRequested(workload_id=W, at=LOSS, attempt_number=2, exclude=["alpha"]),
        waiting(LOSS + 1, UNREACHABLE, EXCLUDED),
        *after,
    ]
    return list(enumerate(h, start=1))


def snap(observed: float, published: float, reachable: bool) -> ClusterSnapshot:
    return ClusterSnapshot(cluster="alpha", reachable=reachable, observed_at=observed, published_at=published)


PARTITIONED = [snap(LOSS - 5, t, False) for t in (LOSS - 4, LOSS, LOSS + 1)]
HEALED_AT = LOSS + 10
HEALED = [*PARTITIONED, *(snap(t, t + 0.1, True) for t in (HEALED_AT, HEALED_AT + 1, HEALED_AT + 6))]


def test_stale_unreachable_reason_after_the_heal_is_a_violation() -> None:
    """Defect 4: healed, the exclusion kept for ever and the old decision never re-published."""
    found = check_waits(lost_then_waiting(), {"alpha": HEALED}, now=HEALED_AT + 30, tolerance=10)
    assert [v.invariant for v in found] == ["wait-reason-current"] * 2
    assert "reachable and fresh since" in found[0].detail
    assert "exclusion ended: observed again" in found[1].detail


def test_within_the_tolerance_after_the_heal_is_not_a_violation() -> None:
    assert check_waits(lost_then_waiting(), {"alpha": HEALED}, now=HEALED_AT + 5, tolerance=10) == []


def test_still_partitioned_is_a_true_reason() -> None:
    assert check_waits(lost_then_waiting(), {"alpha": PARTITIONED}, now=LOSS + 60, tolerance=10) == []


def test_exclusion_outliving_its_bound_is_a_violation() -> None:
    # never observed again: unreachable is true, but the exclusion ends max_snapshot_age after the request
    found = check_waits(lost_then_waiting(), {"alpha": PARTITIONED}, now=LOSS + 200, tolerance=10, max_snapshot_age=120)
    assert len(found) == 1 and "120s after the request" in found[0].detail


def test_re_published_or_routed_after_the_heal_is_not_a_violation() -> None:
    capacity = Check(code="GPU_CAPACITY", ok=False, message="1 of 2 suitable nodes Ready", capacity_only=True)
    republished = waiting(HEALED_AT + 1, capacity)
    assert check_waits(lost_then_waiting(republished), {"alpha": HEALED}, now=HEALED_AT + 60, tolerance=10) == []
    d = RoutingDecision(workload_id=W, decided_at=HEALED_AT + 1, outcome="routed", cluster="alpha", summary="s")
    routed = ev.Routed(workload_id=W, at=HEALED_AT + 1, decision=d, attempt_number=2)
    assert check_waits(lost_then_waiting(routed), {"alpha": HEALED}, now=HEALED_AT + 60, tolerance=10) == []


def test_healed_then_partitioned_again_is_judged_by_the_trailing_run() -> None:
    again = [*HEALED, *(snap(HEALED_AT + 6, t, False) for t in (HEALED_AT + 8, HEALED_AT + 30))]
    found = check_waits(lost_then_waiting(), {"alpha": again}, now=HEALED_AT + 40, tolerance=10)
    # unreachable is true again; the exclusion still ended when alpha was observed after the loss
    assert [("exclusion ended" in v.detail) for v in found] == [True]


def test_no_decision_for_a_requested_attempt_is_a_violation() -> None:
    h = lost_then_waiting()[:-1]  # the route-requested, and nothing from the router
    assert check_waits(h, {}, now=LOSS + 5, tolerance=10) == []
    found = check_waits(h, {}, now=LOSS + 30, tolerance=10)
    assert len(found) == 1 and "no routing decision" in found[0].detail


def test_finished_or_cancelling_work_is_not_checked() -> None:
    done = ev.Cancelled(workload_id=W, at=LOSS + 2, reason="user")
    assert check_waits(lost_then_waiting(done), {"alpha": HEALED}, now=HEALED_AT + 60) == []
    cancelling = ev.CancelRequested(workload_id=W, at=LOSS + 2, reason="user")
    assert check_waits(lost_then_waiting(cancelling), {"alpha": HEALED}, now=HEALED_AT + 60) == []


def test_check_runs_it_when_given_snapshots() -> None:
    h = lost_then_waiting()
    assert check(h) == []  # waiting with a reason: invariant 3 alone is satisfied
    found = check(h, snapshots={"alpha": HEALED}, now=HEALED_AT + 30)
    assert {v.invariant for v in found} == {"wait-reason-current"}
