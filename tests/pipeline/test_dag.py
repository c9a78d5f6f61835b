"""The DAG: a stage is ready when every dependency is promoted; a failure stops its dependents
with the failed stage named; cancelling the pipeline cancels every stage; the graph as `get` shows it."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuorch_proto import events as ev
from gpuorch_proto.jobenv import job_env
from gpuorch_router import pipeline as pl

from .builders import NOW, cancelled, completed, failed, make_dag, promoted, released, started

THREE = {"prep": [], "train": ["prep"], "eval": ["train", "prep"]}
DIAMOND = {"a": [], "b": ["a"], "c": ["a"], "d": ["b", "c"]}


def ready_names(state: pl.PipelineState) -> list[str]:
    return [r.stage for r in pl.ready_stages(state, NOW)]


def test_only_the_stage_without_dependencies_is_ready_at_first() -> None:
    s = started("p", make_dag(THREE))
    [r] = pl.ready_stages(s, NOW)
    assert (r.stage, r.workload_id, r.event_id, r.inputs, r.reason) == (
        "prep",
        "p--prep",
        "p--prep.stage-ready",
        [],
        "no dependencies",
    )


def test_a_stage_is_ready_once_its_dependency_is_promoted_and_reads_that_result_by_version() -> None:
    s = started("p", make_dag(THREE))
    for e in pl.ready_stages(s, NOW):
        s.apply(e)
    s.apply(released(s, "prep"))
    assert ready_names(s) == []  # released and running, not promoted: train waits
    s.apply(promoted(s, "prep"))
    [r] = pl.ready_stages(s, NOW)
    assert r.stage == "train"
    assert r.inputs == [
        ev.StageInput(
            stage="prep",
            workload_id="p--prep",
            attempt_id="p--prep-a1",
            result_path="prod/p--prep/result/",
            store="scratch",
        )
    ]
    assert r.reason == "every dependency promoted: prep (p--prep-a1)"
    env = job_env({}, r.inputs)
    assert (
        env["GPUORCH_INPUT_PREP"] == "prod/p--prep/result/"
        and env["GPUORCH_INPUT_PREP_VERSION"] == "p--prep-a1"
    )
    s.apply(r)
    assert ready_names(s) == []  # a stage is ready once


@pytest.mark.parametrize(
    ("promoted_stages", "ready"),
    [
        pytest.param(["a"], ["b", "c"], id="fan-out-after-the-root"),
        pytest.param(["a", "b"], ["c"], id="join-waits-for-the-other-branch"),
        pytest.param(["a", "b", "c"], ["d"], id="join-ready-when-both-promoted"),
    ],
)
def test_a_diamond_becomes_ready_in_waves(promoted_stages: list[str], ready: list[str]) -> None:
    s = started("p", make_dag(DIAMOND))
    for name in promoted_stages:
        s.apply(ev.StageReady(workload_id=s.stages[name].workload_id, at=NOW, pipeline="p", stage=name))
        s.apply(promoted(s, name))
    assert ready_names(s) == ready


@pytest.mark.parametrize(
    ("end", "reason"),
    [
        pytest.param(
            failed, "not run: it depends on stage train, which failed: exit code 2 is permanent", id="failed"
        ),
        pytest.param(
            cancelled, "not run: it depends on stage train, which was cancelled: requested", id="cancelled"
        ),
    ],
)
def test_a_stage_that_ends_without_a_result_stops_its_dependents_naming_it(end: object, reason: str) -> None:
    s = started(
        "p",
        make_dag({"prep": [], "train": ["prep"], "eval": ["train"], "report": ["eval"], "other": ["prep"]}),
    )
    s.apply(promoted(s, "prep"))
    s.apply(end(s, "train"))  # type: ignore[operator]
    blocked = pl.blocked_by_failure(s, NOW)
    assert [(b.stage, b.failed_stage) for b in blocked] == [("eval", "train"), ("report", "train")]
    assert blocked[0].reason == reason
    assert blocked[1].reason.startswith("not run: it depends on stage train (through eval), which")
    for b in blocked:
        s.apply(b)
    assert s.stages["eval"].status == "blocked" and s.stages["other"].status == "pending"
    assert pl.blocked_by_failure(s, NOW) == []  # decided once


def test_a_rejected_stage_counts_as_failed() -> None:
    from gpuorch_proto import RoutingDecision

    s = started("p", make_dag({"a": [], "b": ["a"]}))
    decision = RoutingDecision(
        workload_id="p--a", decided_at=NOW, outcome="rejected", summary="no GPU anywhere"
    )
    s.apply(ev.Rejected(workload_id="p--a", at=NOW, reason="no cluster can ever run it", decision=decision))
    assert [b.failed_stage for b in pl.blocked_by_failure(s, NOW)] == ["a"]


def test_cancelling_the_pipeline_cancels_every_unfinished_stage_and_readies_none() -> None:
    s = started("p", make_dag(THREE))
    s.apply(promoted(s, "prep"))
    s.apply(completed(s, "prep"))
    s.apply(ev.CancelRequested(workload_id="p", at=NOW, reason="user asked"))
    cancels = pl.cancel_all(s, s.cancel_reason, NOW)
    assert [(c.workload_id, c.event_id) for c in cancels] == [
        ("p--train", "p--train.cancel.pipeline"),
        ("p--eval", "p--eval.cancel.pipeline"),
    ]
    assert cancels[0].reason == "pipeline p cancelled: user asked"
    assert pl.ready_stages(s, NOW) == [] and pl.blocked_by_failure(s, NOW) == []
    for c in cancels:
        s.apply(ev.Cancelled(workload_id=c.workload_id, at=NOW, reason=c.reason))
    assert pl.cancel_all(s, "again", NOW) == []
    out = pl.outcome(s, NOW)
    assert out is not None and out.outcome == "cancelled"
    assert out.stages == {"prep": "completed", "train": "cancelled", "eval": "cancelled"}


@pytest.mark.parametrize(
    ("ends", "outcome", "reason"),
    [
        pytest.param(
            {"prep": "c", "train": "c", "eval": "c"},
            "completed",
            "3 of 3 stages completed",
            id="all-completed",
        ),
        pytest.param(
            {"prep": "c", "train": "f", "eval": "b"},
            "failed",
            "1 of 3 stages completed; 1 failed, 1 blocked; stage train failed: exit code 2 is permanent",
            id="one-failed",
        ),
        pytest.param({"prep": "c", "train": "c"}, None, "", id="not-finished"),
    ],
)
def test_the_pipeline_ends_once_every_stage_has(
    ends: dict[str, str], outcome: str | None, reason: str
) -> None:
    s = started("p", make_dag(THREE))
    for name, how in ends.items():
        if how == "c":
            s.apply(promoted(s, name))
            s.apply(completed(s, name))
        elif how == "f":
            s.apply(failed(s, name))
        else:
            for b in pl.blocked_by_failure(s, NOW):
                s.apply(b)
    out = pl.outcome(s, NOW)
    assert (out.outcome if out else None, out.reason if out else "") == (outcome, reason)
    if out is not None:
        s.apply(out)
        assert pl.outcome(s, NOW) is None  # once


def test_the_graph_as_get_shows_it() -> None:
    s = started("p", make_dag(THREE, gpus={"train": 8}))
    s.apply(promoted(s, "prep"))
    s.apply(completed(s, "prep"))
    for r in pl.ready_stages(s, NOW):
        s.apply(r)
    s.apply(ev.Held(workload_id="p--train", at=NOW, reason="held: queue research at 16 of 16 GPUs"))
    assert pl.render_graph(s).splitlines() == [
        "pipeline p: 1 of 3 stages completed",
        "  prep   completed  no GPU   p--prep: result prod/p--prep/result/ (p--prep-a1)",
        "  train  held       8 GPU    p--train after prep: held: queue research at 16 of 16 GPUs",
        "  eval   pending    no GPU   p--eval after train, prep: waiting for train",
    ]


def test_events_about_other_workloads_change_nothing() -> None:
    s = started("p", make_dag(THREE))
    before = pl.render_graph(s)
    s.apply(ev.WorkloadFailed(workload_id="q--prep", at=NOW, reason="x"))
    s.apply(ev.CancelRequested(workload_id="q", at=NOW))
    assert pl.render_graph(s) == before and not s.cancel_requested


# ---- properties -------------------------------------------------------------------------------


@st.composite
def dags(draw: st.DrawFn) -> dict[str, list[str]]:
    """A random DAG: stage i may depend on any stage before it."""
    n = draw(st.integers(1, 8))
    names = [f"s{i}" for i in range(n)]
    return {
        names[i]: draw(st.lists(st.sampled_from(names[:i]), unique=True, max_size=3)) if i else []
        for i in range(n)
    }


@given(edges=dags(), data=st.data())
@settings(max_examples=200, deadline=None)
def test_a_stage_is_never_ready_before_every_dependency_is_promoted(
    edges: dict[str, list[str]], data: st.DataObject
) -> None:
    s = started("p", make_dag(edges))
    for _ in range(3 * len(edges)):
        for r in pl.ready_stages(s, NOW):
            assert all(s.stages[d].promoted for d in edges[r.stage]), r
            assert [i.stage for i in r.inputs] == edges[r.stage]
            s.apply(r)
        for b in pl.blocked_by_failure(s, NOW):
            s.apply(b)
        runnable = [st_ for st_ in s.stages.values() if st_.status == "ready"]
        if not runnable:
            break
        pick = data.draw(st.sampled_from(runnable))
        s.apply(data.draw(st.sampled_from([promoted(s, pick.name), failed(s, pick.name)])))
        if s.stages[pick.name].promoted:
            s.apply(completed(s, pick.name))
    for name, stage in s.stages.items():
        if stage.status not in ("pending", "blocked"):
            assert all(s.stages[d].promoted for d in edges[name])
    # every stage ends: completed, failed, or blocked by a failure upstream; nothing is stuck
    assert all(stage.finished for stage in s.stages.values())
    for name, stage in s.stages.items():
        failed_upstream = any(s.stages[d].status in ("failed", "blocked") for d in edges[name])
        assert (stage.status == "blocked") == failed_upstream
