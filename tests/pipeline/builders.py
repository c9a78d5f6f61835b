"""Builders for the pipeline core's tests (after kueue's MakeWorkload): documents, events, policies."""

from __future__ import annotations

from typing import Any

from gpuorch_proto import Workload, event_id, workload_from_obj
from gpuorch_proto import events as ev
from gpuorch_proto.codec import policy_from_obj
from gpuorch_proto.policy import AdmissionPolicy
from gpuorch_router import pipeline as pl

DIGEST = "registry.example.com/train@sha256:" + "ab" * 32
NOW = 1_000_000.0


def make_workload(name: str = "wl", **spec: Any) -> Workload:
    doc: dict[str, Any] = {
        "metadata": {"name": name, "owner": spec.pop("owner", "team-a")},
        "spec": {"image": DIGEST, "command": ["python", "run.py"], **spec},
    }
    return workload_from_obj(doc)


def make_dag(edges: dict[str, list[str]], gpus: dict[str, float] | None = None, **spec: Any) -> Workload:
    """A pipeline whose stages are `edges`' keys (declared in that order) with their dependencies."""
    gpus = gpus or {}
    stages = [{"name": n, "depends_on": d, "resources": {"gpus": gpus.get(n, 0)}} for n, d in edges.items()]
    return make_workload("dag", stages=stages, **spec)


def make_sweep(
    grid: dict[str, list[Any]] | None = None, trials: list[dict[str, Any]] | None = None, **spec: Any
) -> Workload:
    sweep = {"grid": grid} if grid is not None else {"trials": trials}
    return make_workload("sweep", sweep=sweep, **spec)


def started(pipeline_id: str, wl: Workload) -> pl.PipelineState:
    """The state right after expansion: the record and every child's `submitted` folded in."""
    x = pl.expand(pipeline_id, wl, NOW)
    return pl.PipelineState.of(pipeline_id, x.events)


def promoted(state: pl.PipelineState, stage: str, at: float = NOW + 10) -> ev.Promoted:
    wid = state.stages[stage].workload_id
    return ev.Promoted(
        event_id=event_id(f"{wid}-a1", "promoted"),
        workload_id=wid,
        at=at,
        attempt_id=f"{wid}-a1",
        epoch=1,
        cluster="primary",
        output_path=f"prod/{wid}/attempts/{wid}-a1/",
        result_path=f"prod/{wid}/result/",
    )


def completed(state: pl.PipelineState, stage: str, at: float = NOW + 11) -> ev.Completed:
    wid = state.stages[stage].workload_id
    return ev.Completed(workload_id=wid, at=at, attempt_id=f"{wid}-a1", result_path=f"prod/{wid}/result/")


def failed(
    state: pl.PipelineState, stage: str, reason: str = "exit code 2 is permanent"
) -> ev.WorkloadFailed:
    return ev.WorkloadFailed(
        workload_id=state.stages[stage].workload_id, at=NOW + 10, reason=reason, attempts=1
    )


def cancelled(state: pl.PipelineState, stage: str, reason: str = "requested") -> ev.Cancelled:
    return ev.Cancelled(workload_id=state.stages[stage].workload_id, at=NOW + 10, reason=reason)


def released(state: pl.PipelineState, stage: str) -> ev.Released:
    st = state.stages[stage]
    return ev.Released(
        workload_id=st.workload_id, at=NOW + 1, queue="default", pipeline=state.pipeline_id, gpus=st.gpus
    )


def make_policy(**doc: Any) -> AdmissionPolicy:
    return policy_from_obj(doc)


def research(max_gpus: float | None = 16, max_running: int | None = None, **queue: Any) -> AdmissionPolicy:
    limits = {k: v for k, v in (("max_gpus", max_gpus), ("max_running", max_running)) if v is not None}
    return make_policy(queues=[{"name": "default"}, {"name": "research", "limits": limits, **queue}])
