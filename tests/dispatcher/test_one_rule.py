"""Each of the dispatcher's next steps is decided by one pure rule, asked by one function (issue 29):
the shell folds each event and calls `reconcile`, as its upkeep and a take-over do, so every
effect comes from the folded view with one event id and one reason. And the shell's judgements of
a cluster (answering or not; a Job missing from the cache really gone) are core rules too."""

from __future__ import annotations

import pytest

from gpuorch import liveness
from gpuorch.projection import AttemptView, Projection, WorkloadView
from gpuorch_dispatcher import core
from gpuorch_proto import events as ev
from tests.dispatcher.test_core import (
    A1,
    W,
    _allowed,
    _created,
    _emitted,
    _failed,
    _fence_req,
    _fenced,
    env,
    routed,
    wl,
)

A2 = f"{W}-a2"


def history(*events: ev.Base, **spec: object) -> Projection:
    p = Projection()
    p.apply(ev.Submitted(workload_id=W, at=0.0, workload=wl(**spec)), 1)
    for i, e in enumerate(events, start=2):
        p.apply(e, i)  # type: ignore[arg-type]
    return p


def of(actions: list[core.Action], kind: type) -> list[ev.Base]:
    return [e for e in _emitted(actions) if isinstance(e, kind)]


def fold(p: Projection, e: ev.Base) -> WorkloadView:
    """Fold `e` as the shell does before it asks the core; the workload's view."""
    p.apply(e, max(v.last_seq for v in p.workloads.values()) + 1)  # type: ignore[arg-type]
    return p.workloads[W]


# ---- workload-failed: budget and permanent failure ------------------------------------------


def _observed_failure(p: Projection, code: int | None, reason: str) -> ev.Failed:
    """The `failed` the dispatcher publishes for a Job the cluster says failed (`on_observation`)."""
    v = p.workloads[W]
    obs = core.JobObservation(exists=True, scheduled=1, running=1, failed=True, exit_code=code, reason=reason)
    (failed,) = [e for e in _emitted(core.on_observation(v, v.attempts[A1], obs, 100.0)) if isinstance(e, ev.Failed)]
    return failed


@pytest.mark.parametrize(
    ("code", "spec", "why"),
    [
        pytest.param(3, {"retry": {"permanent_exit_codes": [3]}}, "permanent failure (exit code 3)", id="permanent-exit-code"),
        pytest.param(1, {"retry": {"budget": 0}}, "retry budget of 0 spent", id="budget-spent"),
        pytest.param(None, {"retry": {"retryable_exit_codes": [1]}}, "permanent failure (exit code None)", id="not-retryable-without-an-exit-code"),
    ],
)
def test_a_folded_failure_fails_the_workload_by_reconcile(code: int | None, spec: dict, why: str) -> None:
    p = history(routed(1), _created(1, 1), **spec)
    failed = _observed_failure(p, code, "DeadlineExceeded")
    v = fold(p, failed)
    acts = _emitted(core.reconcile(v, 101.0, env()))
    assert [type(e) for e in acts] == [ev.FenceRequested, ev.WorkloadFailed]  # its fence first, as the event path did
    assert acts[1] == core.workload_failure(v, 101.0)
    assert acts[1].reason == f"{why} in {A1}: {failed.reason}"  # type: ignore[attr-defined]
    assert acts[0].reason == f"attempt failed: {failed.reason}"  # type: ignore[attr-defined]


def test_a_retryable_failure_within_the_budget_fails_nothing() -> None:
    p = history(routed(1), _created(1, 1))
    v = fold(p, _failed(1, code=1))
    assert core.workload_failure(v, 101.0) is None
    assert [type(e) for e in _emitted(core.reconcile(v, 101.0, env()))] == [ev.FenceRequested]


def test_a_stale_attempt_failing_late_does_not_fail_the_workload_its_replacement_runs() -> None:
    """Attempt 1 was lost and replaced; its cluster came back and its Job failed permanently: the
    workload is its running attempt 2's (the old event path used to fail it)."""
    lost = ev.Lost(workload_id=W, at=2.0, attempt_id=A1, epoch=1, cluster="primary", reason="partition")
    p = history(
        routed(1), _created(1, 1), lost, _fence_req(1), _fenced(1), _allowed(1),
        ev.RouteRequested(workload_id=W, at=3.5, attempt_number=2), routed(2), _created(2, 2),
        ev.Running(workload_id=W, at=5.0, attempt_id=A2, epoch=2, cluster="primary"),
        retry={"permanent_exit_codes": [3]},
    )  # fmt: skip
    late = _failed(1, at=6.0, code=3)
    v = fold(p, late)
    assert core.workload_failure(v, 7.0) is None
    assert core.reconcile(v, 7.0, env()) == [], "its fence was asked when it was lost: nothing again"


def test_no_workload_failure_while_a_cancel_is_under_way() -> None:
    p = history(routed(1), _created(1, 1), ev.CancelRequested(workload_id=W, at=50.0), retry={"budget": 0})
    v = fold(p, _failed(1))
    assert core.workload_failure(v, 101.0) is None


# ---- the replacement's route request ------------------------------------------------------------


def test_the_fencers_verdict_is_folded_and_reconcile_requests_the_replacement_with_its_reason() -> None:
    p = history(routed(1), _created(1, 1), _failed(1, code=1), _fence_req(1), _fenced(1), retry={"backoff": "0s"})
    v = p.workloads[W]
    assert core.replacement_request(v, 101.0, env()) is None, "not before the fencer's verdict"
    allowed = ev.ReplacementAllowed(
        workload_id=W, at=100.5, attempt_id=A1, epoch=1, cluster="primary", how="stopped", reason="its pods had ended"
    )
    v = fold(p, allowed)
    assert v.attempts[A1].replacement_reason == "its pods had ended"
    (request,) = of(core.reconcile(v, 101.0, env()), ev.RouteRequested)
    assert request == core.replacement_request(v, 101.0, env())
    assert request.event_id == f"{W}.route-requested.2"
    assert request.reason == f"replacing {A1} (failed): its pods had ended"  # type: ignore[attr-defined]
    fold(p, request)
    assert core.reconcile(v, 102.0, env()) == [], "asked once"


def test_no_replacement_is_requested_for_a_workload_that_fails() -> None:
    """The budget is spent but `workload-failed` is not folded yet: the fencer's verdict asks for
    no replacement; the workload fails instead."""
    p = history(routed(1), _created(1, 1), _failed(1, code=1), _fence_req(1), _fenced(1), retry={"budget": 0, "backoff": "0s"})
    v = fold(p, _allowed(1, at=100.5))
    assert core.replacement_request(v, 101.0, env()) is None
    assert [type(e) for e in _emitted(core.reconcile(v, 101.0, env()))] == [ev.WorkloadFailed]


# ---- promote-requested ------------------------------------------------------------------------------


def _observed_complete(p: Projection, at: float) -> list[ev.Base]:
    v = p.workloads[W]
    obs = core.JobObservation(exists=True, scheduled=1, running=1, complete=True)
    return _emitted(core.on_observation(v, v.attempts[A1], obs, at))


@pytest.mark.parametrize("stale", [False, True], ids=["current", "fenced-before-it-succeeded"])
def test_a_folded_success_is_promoted_by_reconcile_once(stale: bool) -> None:
    """The observation says `succeeded`; the promotion is asked by `reconcile` once it is folded:
    also for an attempt fenced before it succeeded, which the fencer then refuses
    (`promotion-rejected` on record, DESIGN §7.5)."""
    p = history(routed(1), _created(1, 1), *([_fence_req(1), _fenced(1)] if stale else []))
    seen = _observed_complete(p, 10.0)
    assert ev.Succeeded in [type(e) for e in seen] and ev.PromoteRequested not in [type(e) for e in seen]
    v = p.workloads[W]
    for e in seen:
        v = fold(p, e)
    (asked,) = of(core.reconcile(v, 11.0, env()), ev.PromoteRequested)
    assert (asked.event_id, asked.epoch) == (f"{A1}.promote-requested", 1)  # type: ignore[attr-defined]
    fold(p, asked)
    assert core.promote_request(v, v.attempts[A1], 12.0) is None, "asked once"
    assert of(core.reconcile(v, 12.0, env()), ev.PromoteRequested) == []


def test_promote_request_needs_success() -> None:
    p = history(routed(1), _created(1, 1))
    assert core.promote_request(p.workloads[W], p.workloads[W].attempts[A1], 5.0) is None
    v = fold(p, ev.Succeeded(workload_id=W, at=6.0, attempt_id=A1, epoch=1, cluster="primary", output_path="/o"))
    req = core.promote_request(v, v.attempts[A1], 7.0)
    assert req is not None and req.event_id == f"{A1}.promote-requested" and req.output_path == "/o"


# ---- completed ------------------------------------------------------------------------------------------


def _promoted(at: float = 20.0) -> ev.Promoted:
    return ev.Promoted(workload_id=W, at=at, attempt_id=A1, epoch=1, cluster="primary", result_path="s3://r/w/result", output_path="/o")


def test_a_folded_promotion_completes_the_workload_and_deletes_its_job() -> None:
    p = history(routed(1), _created(1, 1), ev.Succeeded(workload_id=W, at=10.0, attempt_id=A1, epoch=1, cluster="primary", output_path="/o"),
                ev.PromoteRequested(workload_id=W, at=10.5, attempt_id=A1, epoch=1, cluster="primary", output_path="/o"))  # fmt: skip
    v = fold(p, _promoted())
    acts = core.reconcile(v, 21.0, env())
    assert of(acts, ev.Completed) == [core.completed(v, 21.0)]
    assert of(acts, ev.Completed)[0].result_path == "s3://r/w/result"  # type: ignore[attr-defined]
    assert [a.reason for a in acts if isinstance(a, core.DeleteJob)] == ["completed and promoted"]
    fold(p, of(acts, ev.Completed)[0])
    assert core.reconcile(v, 22.0, env()) == [], "completed: nothing more, its Job asked to go once"


def test_a_promotion_after_the_workload_ended_completes_nothing_and_deletes_the_job() -> None:
    p = history(routed(1), _created(1, 1), ev.Cancelled(workload_id=W, at=15.0, reason="user"))
    v = fold(p, _promoted())
    assert core.completed(v, 21.0) is None
    acts = core.reconcile(v, 21.0, env())
    assert [type(a) for a in acts if not isinstance(a, core.DeleteJob)] == [core.Emit]  # the live attempt's fence
    assert [a.reason for a in acts if isinstance(a, core.DeleteJob)] == ["promoted after the workload was cancelled"]


# ---- the shell's judgements of a cluster, as rules ----------------------------------------------


def _attempt(created_at: float | None) -> AttemptView:
    a = AttemptView(A1, 1, 1, "primary")
    if created_at is not None:
        a.times["created"] = created_at
    return a


@pytest.mark.parametrize(
    ("created_rv", "cache_rv", "complete_at", "created_at", "sure"),
    [
        pytest.param(100, None, 50.0, 10.0, False, id="ours-cache-not-listed"),
        pytest.param(100, 99, 50.0, 10.0, False, id="ours-cache-behind-the-create"),
        pytest.param(100, 100, 5.0, 10.0, True, id="ours-cache-covers-the-create"),
        pytest.param(None, 200, None, 10.0, False, id="taken-over-cache-never-complete"),
        pytest.param(None, 200, 10.5, 10.0, False, id="taken-over-complete-within-the-clock-margin"),
        pytest.param(None, 200, 11.5, 10.0, True, id="taken-over-complete-past-the-margin"),
        pytest.param(None, 200, 11.5, None, True, id="taken-over-creation-time-unknown"),
    ],
)
def test_a_job_missing_from_the_cache_is_gone_only_when_the_cache_proves_it(
    created_rv: int | None, cache_rv: int | None, complete_at: float | None, created_at: float | None, sure: bool
) -> None:
    a = _attempt(created_at)
    assert core.absent_for_sure(a, created_rv=created_rv, cache_rv=cache_rv, complete_at=complete_at) is sure


def test_a_cluster_is_judged_from_its_caches_only_while_it_answers() -> None:
    assert liveness.answering(failing=False, synced=True)
    assert not liveness.answering(failing=True, synced=True)
    assert not liveness.answering(failing=False, synced=False)
    # never heard from: failing from now, so not lost at once
    assert liveness.silent_for(None, 100.0, 3.0) is None
    c = liveness.contact(liveness.contact(None, False, 100.0), False, 104.0)
    why = liveness.silent_for(c, 104.0, 3.0)
    assert why is not None and why == liveness.silence(c, 104.0, 3.0) and "4.0s" in why
