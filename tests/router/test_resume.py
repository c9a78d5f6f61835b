"""Routing considers resume: the router is told the latest valid checkpoint and prefers a cluster
that can resume it (gpuorch_proto.resume.can_resume, the dispatcher's rule too), with the reason
in the decision record: "resumes from step N of <attempt> at <path>" vs "restarts from scratch"."""

from __future__ import annotations

import pytest

from gpuorch_proto import events as ev
from gpuorch_proto.resume import CheckpointRef
from gpuorch_proto.routing import RoutingDecision
from gpuorch_proto.workload import CheckpointPolicy
from gpuorch_router import core
from gpuorch_router.explain import render_explain
from gpuorch_router.fastpath import RoutingMemo
from gpuorch_router.policy import SnapshotIndex, route
from tests.support.builders import NOW, make_snapshot, make_workload

WID = "train-0001"


def world() -> dict[str, SnapshotIndex]:
    """Two clusters equal in everything routing reads (east wins a tie: names break ties)."""
    return {c: SnapshotIndex(make_snapshot(c, artifact_stores=["scratch", "ckpt"])) for c in ("east", "west")}


def workload(portable: bool) -> object:
    return make_workload(checkpoint=CheckpointPolicy(path="ckpt", store="ckpt", interval="10m", portable=portable))


def ckpt(cluster: str = "west", store: str = "ckpt", run: float = 0.0) -> CheckpointRef:
    return CheckpointRef(attempt_id=f"{WID}-a1", cluster=cluster, store=store, path="/stores/ckpt/a1/ckpt.npz", step=900, run_seconds=run)


def check(d: RoutingDecision, cluster: str) -> str:
    v = next(v for v in d.verdicts if v.cluster == cluster)
    return next(c.message for c in v.checks if c.code == "CHECKPOINT")


def test_without_a_checkpoint_the_tie_goes_by_name() -> None:
    d = route(workload(False), WID, world(), NOW)  # type: ignore[arg-type]
    assert d.cluster == "east" and "resume" not in d.summary


def test_a_replacement_prefers_the_cluster_that_can_resume_when_otherwise_equal() -> None:
    d = route(workload(False), WID, world(), NOW, resume=ckpt())  # type: ignore[arg-type]
    assert d.outcome == "routed" and d.cluster == "west"
    assert "resumes from step 900 of train-0001-a1 at /stores/ckpt/a1/ckpt.npz" in check(d, "west")
    assert check(d, "east").endswith(
        "restarts from scratch: checkpoint of train-0001-a1 on west is not portable (spec.checkpoint.portable=false)"
    )
    assert "resumes from step 900" in d.summary and "restarts from scratch" in d.summary  # winner vs runner-up
    assert all(v.eligible for v in d.verdicts)  # resume is a preference, never eligibility


def test_the_run_a_checkpoint_holds_is_saved_in_the_estimate() -> None:
    d = route(workload(True), WID, world(), NOW, resume=ckpt(run=1800.0))  # type: ignore[arg-type]
    est = {v.cluster: v.estimate for v in d.verdicts}
    east, west = est["east"], est["west"]
    assert east is not None and west is not None
    assert east.resume_saved == west.resume_saved == 1800.0  # portable: both can resume it
    assert east.total == pytest.approx(west.total) and d.cluster == "east"
    d = route(workload(False), WID, world(), NOW, resume=ckpt(run=1800.0))  # type: ignore[arg-type]
    est = {v.cluster: v.estimate for v in d.verdicts}
    assert est["west"].resume_saved == 1800.0 and est["east"].resume_saved == 0.0  # type: ignore[union-attr]
    assert est["east"].total - est["west"].total == pytest.approx(1800.0)  # type: ignore[union-attr]
    assert d.cluster == "west" and "saves 30m" in d.summary
    assert "work lost by not resuming +30m" in render_explain(d)  # why not east


def test_a_store_the_cluster_cannot_read_means_restart_there() -> None:
    w = world()
    w["west"] = SnapshotIndex(make_snapshot("west", artifact_stores=["scratch", "ckpt"], checkpoint_stores=["old"]))
    d = route(workload(True), WID, w, NOW, resume=ckpt(cluster="east", store="old", run=600.0))  # type: ignore[arg-type]
    assert d.cluster == "west"
    assert check(d, "east").endswith("restarts from scratch: east cannot read checkpoint store 'old'")


def test_the_router_is_told_through_the_route_request_in_the_log() -> None:
    """The dispatcher's `route-requested` carries the checkpoint; the router's fold keeps it for
    that attempt number only, and `core.decide` (memo or not) routes with it."""
    state = core.RouterState()
    state.apply(ev.RouteRequested(workload_id=WID, at=NOW, attempt_number=2, reason="replacing a1", checkpoint=ckpt()), 1)
    wl = workload(False)
    memo = RoutingMemo()
    for with_memo in (None, memo, memo):
        d2 = core.decide(state, wl, WID, 2, world(), NOW, memo=with_memo)  # type: ignore[arg-type]
        assert d2.cluster == "west" and "resumes from step 900" in check(d2, "west")
        d1 = core.decide(state, wl, WID, 1, world(), NOW, memo=with_memo)  # type: ignore[arg-type]
        assert d1.cluster == "east" and "resume" not in check(d1, "east")  # another attempt: not told
