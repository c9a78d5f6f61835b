"""The dispatcher's retry-vs-resume and the router's resume preference use one rule (gpuorch_proto.resume).

`choose_mode` decides resume exactly where `can_resume` says so, and a replacement's
`route-requested` tells the router the same checkpoint (where it is, the run it holds).
"""

from __future__ import annotations

import pytest

from gpuorch.projection import Projection
from gpuorch_dispatcher import core
from gpuorch_proto import ClusterRegistryEntry, RoutingDecision, workload_from_obj
from gpuorch_proto import events as ev
from gpuorch_proto.resume import can_resume, readable_stores
from gpuorch_proto.storage import StoreConfig

DIGEST = "example.org/train@sha256:" + "ab" * 32
W = "train-0123456789"
A1 = f"{W}-a1"
REGISTRY = {
    "primary": ClusterRegistryEntry(artifact_stores=["prod", "scratch"]),
    "spare": ClusterRegistryEntry(artifact_stores=["scratch"], checkpoint_stores=["prod"]),
    "short": ClusterRegistryEntry(artifact_stores=["scratch"]),
}


def env(checkpoints: dict[str, str] | None = None) -> core.Environment:
    return core.Environment(
        registry=REGISTRY, stores={"prod": StoreConfig(url="s3://bucket/prod"), "scratch": StoreConfig(url="s3://bucket/scratch"), "primary-nfs": StoreConfig(url="s3://lake/primary-nfs")},
        time_scale=10.0, checkpoints=checkpoints or {},
    )


def view(portable: bool, *, interval: str | None = "5m") -> Projection:
    ck: dict[str, object] = {"path": "ckpt", "portable": portable}
    if interval:
        ck["interval"] = interval
    w = workload_from_obj({"metadata": {"name": "train", "owner": "alice"}, "spec": {
        "image": DIGEST, "command": ["python", "train.py"], "resources": {"gpus": 1},
        "checkpoint": ck, "output": {"store": "prod"}, "retry": {"budget": 3, "backoff": "0s"}}})
    d = RoutingDecision(workload_id=W, decided_at=1.0, outcome="routed", cluster="primary", summary="because")
    p = Projection()
    events: list[ev.Base] = [
        ev.Submitted(workload_id=W, at=0.0, workload=w),
        ev.Routed(workload_id=W, at=1.0, decision=d, attempt_number=1, event_id=f"{W}.routed.1"),
        ev.AttemptCreated(workload_id=W, at=1.0, attempt_id=A1, epoch=1, cluster="primary", attempt_number=1, job_name=A1, output_path="/o", checkpoint_path="/c1"),
        ev.Running(workload_id=W, at=100.0, attempt_id=A1, epoch=1, cluster="primary"),
        ev.Failed(workload_id=W, at=220.0, attempt_id=A1, epoch=1, cluster="primary", reason="boom", exit_code=1),
    ]
    for i, e in enumerate(events, start=1):
        p.apply(e, i)  # type: ignore[arg-type]
    return p


@pytest.mark.parametrize("portable", [True, False])
@pytest.mark.parametrize("cluster", sorted(REGISTRY))
def test_choose_mode_resumes_exactly_where_the_rule_says(portable: bool, cluster: str) -> None:
    v = view(portable).workloads[W]
    e = env({A1: "/stores/prod/w/a1/ckpt.npz"})
    mode, path, why = core.choose_mode(v, cluster, e)
    ckpt = core.latest_checkpoint(v, e)
    assert ckpt is not None and ckpt.store == "prod" and ckpt.cluster == "primary"
    verdict = can_resume(ckpt, portable=portable, cluster=cluster, readable=readable_stores(REGISTRY[cluster]))
    assert (mode == "resume") is verdict.ok and why == verdict.reason
    assert path == ("/stores/prod/w/a1/ckpt.npz" if verdict.ok else None)


def test_no_checkpoint_file_is_a_retry() -> None:
    v = view(True).workloads[W]
    assert core.latest_checkpoint(v, env()) is None
    assert core.choose_mode(v, "primary", env())[:2] == ("retry", None)


def test_the_checkpoint_holds_the_run_up_to_the_last_interval() -> None:
    v = view(True).workloads[W]
    ckpt = core.latest_checkpoint(v, env({A1: "/p"}))
    assert ckpt is not None
    # running 100 -> failed 220: 120 real s x time scale 10 = 1200 simulated s, less one 5m interval
    assert ckpt.run_seconds == pytest.approx(1200 - 300)
    no_interval = core.latest_checkpoint(view(True, interval=None).workloads[W], env({A1: "/p"}))
    assert no_interval is not None and no_interval.run_seconds == pytest.approx(1200)


def test_the_replacements_route_request_names_the_latest_checkpoint() -> None:
    p = view(False)
    v = p.workloads[W]
    (fence,) = [a.event for a in core.reconcile(v, 221.0, env()) if isinstance(a, core.Emit)]
    allowed = ev.ReplacementAllowed(workload_id=W, at=230.0, attempt_id=A1, epoch=1, cluster="primary", how="stopped")
    for i, e in enumerate([fence, allowed], start=10):
        p.apply(e, i)  # type: ignore[arg-type]
    without = core.reconcile(v, 230.0, env())
    assert core.needs_checkpoints(without)  # so the shell reads the files and decides again
    acts = core.reconcile(v, 230.0, env({A1: "/stores/prod/w/a1/ckpt.npz"}))
    req = next(a.event for a in acts if isinstance(a, core.Emit) and isinstance(a.event, ev.RouteRequested))
    assert isinstance(req, ev.RouteRequested) and req.checkpoint is not None
    assert (req.checkpoint.attempt_id, req.checkpoint.cluster, req.checkpoint.store) == (A1, "primary", "prod")
    assert req.checkpoint.path == "/stores/prod/w/a1/ckpt.npz"
    assert not core.needs_checkpoints([a for a in acts if not isinstance(a, core.Emit)])
