"""Preemption only of checkpoint-safe work (issue 13, item 6): the pure plan, the dispatcher's
reaction, the router's yield, explain, and the invariant."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuorch.invariants import check
from gpuorch.projection import Projection
from gpuorch_dispatcher import core as dcore
from gpuorch_proto import ClusterRegistryEntry, RoutingDecision, Workload, workload_from_obj
from gpuorch_proto import events as ev
from gpuorch_proto.routing import Check, ClusterVerdict
from gpuorch_proto.storage import StoreConfig
from gpuorch_proto.workload import interruptible
from gpuorch_router import core as rcore
from gpuorch_router import preempt
from gpuorch_router.explain import render_waits

DIGEST = "example.org/train@sha256:" + "ab" * 32
NOW = 1_000_000.0


def make(
    name: str = "w", *, gpus: int = 4, priority: int = 0, preemptible: bool = False, ckpt: bool = True
) -> Workload:
    spec: dict[str, Any] = {
        "image": DIGEST,
        "command": ["python", "-m", "gpuorch.workloads.train"],
        "resources": {"gpus": gpus},
        "priority": priority,
    }
    if preemptible:
        spec["preemptible"] = True
    if ckpt:
        spec["checkpoint"] = {"path": "ckpt", "portable": True}
    return workload_from_obj({"metadata": {"name": name, "owner": "alice"}, "spec": spec})


def waiting(*clusters: str, permanent: tuple[str, ...] = ()) -> RoutingDecision:
    vs = [
        ClusterVerdict(
            cluster=c,
            eligible=False,
            checks=[
                Check(code="GPU_CAPACITY", ok=False, message="no node has 8 free GPUs", capacity_only=True)
            ],
        )
        for c in clusters
    ]
    vs += [
        ClusterVerdict(
            cluster=c, eligible=False, checks=[Check(code="GPU_MEMORY", ok=False, message="40 GiB < 80 GiB")]
        )
        for c in permanent
    ]
    return RoutingDecision(
        workload_id="hi", decided_at=NOW, outcome="waiting", summary="waiting for capacity", verdicts=vs
    )


def holder(
    wid: str,
    *,
    cluster: str = "primary",
    gpus: float = 4,
    priority: int = 0,
    interruptible: bool = True,
    started: float = NOW - 100,
    preempted_for: str | None = None,
) -> preempt.Holder:
    return preempt.Holder(wid, f"{wid}-a1", 1, cluster, gpus, priority, interruptible, started, preempted_for)


HIGH = make("hi", gpus=8, priority=10)


def test_lower_priority_interruptible_work_is_preempted_and_says_so() -> None:
    hs = [
        holder("sweep-a", priority=1),
        holder("sweep-b", priority=1),
        holder("prod", priority=5, interruptible=False),
    ]
    p = preempt.plan("hi", HIGH, ["primary"], hs, {"primary": 0})
    assert p.cluster == "primary" and {h.workload_id for h in p.victims} == {"sweep-a", "sweep-b"}
    msgs = {w.workload_id: w.message for w in p.waits}
    assert (
        msgs["sweep-a"] == "waiting for GPUs held by sweep-a (priority 1, interruptible: will be preempted)"
    )
    assert msgs["prod"] == "waiting for GPUs held by prod (priority 5, not interruptible: never preempted)"
    evs = p.events(NOW)
    assert [type(e) for e in evs] == [ev.PreemptionPlanned, ev.PreemptionRequested, ev.PreemptionRequested]
    req = evs[1]
    assert (
        isinstance(req, ev.PreemptionRequested)
        and req.preemptor == "hi"
        and req.reason.startswith(preempt.PREEMPTED_BY + "hi")
    )
    assert req.event_id == f"{req.attempt_id}.preemption-requested"


def test_work_that_is_not_interruptible_is_never_preempted_even_at_the_lowest_priority() -> None:
    hs = [holder("a", priority=0, interruptible=False, gpus=8)]
    p = preempt.plan("hi", HIGH, ["primary"], hs, {"primary": 0})
    assert p.victims == () and p.cluster is None
    assert p.waits[0].message.endswith("not interruptible: never preempted)")
    assert "no interruptible work below priority 10" in p.reason


def test_equal_or_higher_priority_is_not_preempted() -> None:
    hs = [holder("a", priority=10, gpus=8)]
    p = preempt.plan("hi", HIGH, ["primary"], hs, {"primary": 0})
    assert p.victims == () and "not below priority 10: not preempted" in p.waits[0].message


def test_only_as_many_as_needed_lowest_priority_then_latest_started() -> None:
    hs = [
        holder("old", priority=1, started=NOW - 5000),
        holder("new", priority=1, started=NOW - 10),
        holder("low", priority=0),
        holder("more", priority=2),
    ]
    p = preempt.plan("hi", HIGH, ["primary"], hs, {"primary": 0})
    assert [h.workload_id for h in p.victims] == [
        "low",
        "new",
    ]  # 8 GPUs: priority 0, then the least work lost
    p = preempt.plan("hi", HIGH, ["primary"], hs, {"primary": 4})
    assert [h.workload_id for h in p.victims] == ["low"]  # 4 free + 4 preempted


def test_the_cluster_needing_the_least_is_chosen_and_only_where_capacity_is_all_that_is_missing() -> None:
    hs = [
        holder("p1", cluster="primary", priority=3, gpus=8),
        holder("b1", cluster="burst", priority=1),
        holder("b2", cluster="burst", priority=1),
        holder("x", cluster="small", priority=0, gpus=8),
    ]
    p = preempt.plan(
        "hi", HIGH, preempt.capacity_clusters(waiting("primary", "burst", permanent=("small",))), hs, {}
    )
    assert p.cluster == "burst" and {h.workload_id for h in p.victims} == {"b1", "b2"}
    assert "x" not in {
        w.workload_id for w in p.waits
    }  # it could never run on `small`: its GPUs are no one's to take


def test_nothing_more_is_preempted_while_earlier_victims_are_stopping() -> None:
    hs = [holder("a", priority=1, preempted_for="hi"), holder("b", priority=1)]
    p = preempt.plan("hi", HIGH, ["primary"], hs, {"primary": 0})
    assert p.victims == () and p.reason == "waiting for a to stop (preempted for it)"
    assert (
        preempt.plan("hi", HIGH, ["primary"], [holder("b", priority=1, gpus=8)], {}, in_flight=["a"]).victims
        == ()
    )


def test_a_workload_that_is_not_waiting_for_capacity_preempts_nothing() -> None:
    routed = RoutingDecision(
        workload_id="hi", decided_at=NOW, outcome="routed", cluster="primary", summary="ok"
    )
    assert preempt.capacity_clusters(routed) == []
    assert preempt.plan("hi", HIGH, [], [holder("a", gpus=8)], {}).victims == ()


@st.composite
def holders(draw: st.DrawFn) -> list[preempt.Holder]:
    n = draw(st.integers(0, 12))
    return [
        holder(
            f"w{i}",
            cluster=draw(st.sampled_from(["primary", "burst"])),
            gpus=draw(st.sampled_from([1, 2, 4, 8])),
            priority=draw(st.integers(0, 12)),
            interruptible=draw(st.booleans()),
            started=NOW - draw(st.integers(0, 1000)),
        )
        for i in range(n)
    ]


@given(hs=holders(), need=st.sampled_from([1, 2, 4, 8, 16]), prio=st.integers(0, 12), free=st.integers(0, 8))
@settings(max_examples=300, deadline=None)
def test_never_a_victim_that_is_not_interruptible_or_not_lower_and_never_more_than_needed(
    hs: list[preempt.Holder], need: int, prio: int, free: int
) -> None:
    wl = make("hi", gpus=need, priority=prio)
    p = preempt.plan("hi", wl, ["primary", "burst"], hs, {"primary": free, "burst": free})
    for h in p.victims:
        assert h.interruptible and h.priority < prio and h.cluster == p.cluster
    if p.victims:
        got = free + sum(h.gpus for h in p.victims)
        assert got >= need  # it frees enough
        assert got - p.victims[-1].gpus < need  # and the last one was needed
    assert {w.workload_id for w in p.waits if w.preempt} == {h.workload_id for h in p.victims}


# ---- the dispatcher: the victim is fenced, through the existing machinery ------------------

W = "victim-0123456789"


def env() -> dcore.Environment:
    reg = {"primary": ClusterRegistryEntry(artifact_stores=["prod", "scratch"])}
    return dcore.Environment(
        registry=reg,
        stores={"prod": StoreConfig(url="s3://bucket/prod"), "scratch": StoreConfig(url="s3://bucket/scratch"), "primary-nfs": StoreConfig(url="s3://lake/primary-nfs")},
        time_scale=1,
    )


def running_victim(wl: Workload) -> Projection:
    d = RoutingDecision(workload_id=W, decided_at=1.0, outcome="routed", cluster="primary", summary="ok")
    p = Projection()
    for i, e in enumerate(
        [
            ev.Submitted(workload_id=W, at=0.0, workload=wl),
            ev.Routed(workload_id=W, at=1.0, decision=d, attempt_number=1),
            ev.AttemptCreated(
                workload_id=W,
                at=1.0,
                attempt_id=f"{W}-a1",
                epoch=1,
                cluster="primary",
                attempt_number=1,
                job_name=f"{W}-a1",
                output_path="/o",
                checkpoint_path="/c1",
            ),
            ev.Running(workload_id=W, at=2.0, attempt_id=f"{W}-a1", epoch=1, cluster="primary"),
        ],
        start=1,
    ):
        p.apply(e, i)  # type: ignore[arg-type]
    return p


def request(priority: int = 0) -> ev.PreemptionRequested:
    return ev.PreemptionRequested(
        workload_id=W,
        at=3.0,
        attempt_id=f"{W}-a1",
        epoch=1,
        cluster="primary",
        preemptor="hi",
        preemptor_priority=10,
        priority=priority,
        reason="preempted by hi (priority 10) on primary",
    )


def test_the_dispatcher_fences_a_preempted_attempt_and_the_replacement_resumes() -> None:
    p = running_victim(make("victim", preemptible=True))
    v = p.workloads[W]
    assert dcore.reconcile(v, 3.0, env()) == []  # running, nothing asked of it
    p.apply(request(), 5)  # the router's plan, folded: `reconcile` fences it
    assert v.attempts[f"{W}-a1"].reason == request().reason
    acts = dcore.reconcile(v, 3.0, env())
    fence = [a.event for a in acts if isinstance(a, dcore.Emit)]
    assert (
        len(fence) == 1
        and isinstance(fence[0], ev.FenceRequested)
        and fence[0].reason.startswith("preempted by hi")
    )
    assert fence[0].policy == "strict" and not fence[0].stopped  # its Job is deleted and confirmed gone first
    p.apply(fence[0], 6)
    assert dcore.reconcile(p.workloads[W], 3.5, env()) == []  # asked once
    for i, e in enumerate(
        [
            ev.Fenced(workload_id=W, at=4.0, attempt_id=f"{W}-a1", epoch=1, cluster="primary", new_epoch=2),
            ev.CancelConfirmed(
                workload_id=W, at=5.0, attempt_id=f"{W}-a1", epoch=1, cluster="primary", how="deleted"
            ),
        ],
        start=7,
    ):
        p.apply(e, i)
    allowed = ev.ReplacementAllowed(
        workload_id=W, at=5.0, attempt_id=f"{W}-a1", epoch=1, cluster="primary", how="confirmed"
    )
    p.apply(allowed, 9)
    acts = dcore.reconcile(p.workloads[W], 5.0, env())
    assert (
        isinstance(acts[0], dcore.Emit)
        and isinstance(acts[0].event, ev.RouteRequested)
        and acts[0].event.attempt_number == 2
    )
    e = dcore.Environment(**{**env().__dict__, "checkpoints": {f"{W}-a1": "/c1/ckpt.npz"}})
    routed2 = ev.Routed(
        workload_id=W,
        at=6.0,
        decision=RoutingDecision(
            workload_id=W, decided_at=6.0, outcome="routed", cluster="primary", summary="ok"
        ),
        attempt_number=2,
    )
    (create,) = dcore.on_routed(p.workloads[W], routed2, 6.0, e)
    assert (
        isinstance(create, dcore.CreateJob) and create.created.mode == "resume" and create.created.epoch == 2
    )


def test_the_dispatcher_refuses_to_preempt_work_that_is_not_interruptible() -> None:
    p = running_victim(make("victim", preemptible=False))
    p.apply(request(), 5)
    assert "preemption-requested" in p.workloads[W].attempts[f"{W}-a1"].times
    assert dcore.reconcile(p.workloads[W], 3.0, env()) == []


# ---- the router: the freed GPUs go to the preemptor first ---------------------------------


def test_a_preempted_workloads_replacement_waits_until_its_preemptor_runs() -> None:
    s = rcore.RouterState()
    s.apply(request(), 1)
    routed = RoutingDecision(workload_id=W, decided_at=NOW, outcome="routed", cluster="primary", summary="ok")
    held = rcore.yielding(s, W, 2, routed, 10.0)
    assert held.outcome == "waiting" and held.cluster is None and held.summary.startswith("preempted by hi")
    assert rcore.yielding(s, W, 2, routed, 3.0 + preempt.YIELD_FOR) == routed  # bounded
    s.apply(
        ev.Routed(
            workload_id="hi",
            at=11.0,
            decision=RoutingDecision(
                workload_id="hi", decided_at=11.0, outcome="routed", cluster="primary", summary="ok"
            ),
        ),
        2,
    )
    assert rcore.yielding(s, W, 2, routed, 12.0).outcome == "waiting"  # routed, but queued there
    s.apply(
        ev.Running(workload_id="hi", at=2.0, attempt_id="hi-a0", epoch=1, cluster="primary"), 3
    )  # before it preempted
    assert rcore.yielding(s, W, 2, routed, 12.5).outcome == "waiting"
    s.apply(ev.Running(workload_id="hi", at=12.0, attempt_id="hi-a1", epoch=1, cluster="primary"), 4)
    assert rcore.yielding(s, W, 2, routed, 13.0) == routed


def test_explain_says_who_waits_for_whom() -> None:
    p = preempt.plan(
        "hi",
        HIGH,
        ["primary"],
        [holder("sweep", priority=1, gpus=4), holder("prod", priority=5, interruptible=False)],
        {},
    )
    planned = p.events(NOW)[0]
    assert isinstance(planned, ev.PreemptionPlanned)
    text = "\n".join(render_waits(planned))
    assert "waiting for GPUs held by prod (priority 5, not interruptible: never preempted)" in text
    assert (
        "waiting for GPUs held by sweep (priority 1, interruptible, but preempting it would not free enough)"
        in text
    )


# ---- the invariant ------------------------------------------------------------------------


def _log(victim: Workload, preemptor_priority: int = 10) -> list[tuple[int, ev.Base]]:
    hi = make("hi", gpus=8, priority=preemptor_priority)
    return list(
        enumerate(
            [
                ev.Submitted(workload_id="hi", at=0.0, workload=hi),
                ev.Submitted(workload_id=W, at=0.0, workload=victim),
                request(),
            ],
            start=1,
        )
    )


def test_the_invariant_catches_preemption_of_work_that_is_not_interruptible() -> None:
    assert [
        v
        for v in check(_log(make("v", preemptible=True)), require_terminal=False)
        if v.invariant == "preempted-only-interruptible"
    ] == []
    bad = [
        v
        for v in check(_log(make("v", preemptible=False)), require_terminal=False)
        if v.invariant == "preempted-only-interruptible"
    ]
    assert len(bad) == 1 and "not interruptible" in bad[0].detail
    same = [
        v
        for v in check(_log(make("v", preemptible=True), preemptor_priority=0), require_terminal=False)
        if v.invariant == "preempted-only-interruptible"
    ]
    assert len(same) == 1
    fenced = ev.FenceRequested(
        workload_id=W, at=4.0, attempt_id=f"{W}-a9", epoch=1, cluster="primary", reason="preempted by hi"
    )
    stray = [
        v
        for v in check([*_log(make("v", preemptible=True)), (9, fenced)], require_terminal=False)
        if v.invariant == "preempted-only-interruptible"
    ]
    assert len(stray) == 1 and "without a preemption-requested" in stray[0].detail


# ---- the router's round: level-triggered over the projection -------------------------------


def _queued_world() -> tuple[Projection, Any, int]:
    """`hi` (priority 10, 2 GPUs) queued on `primary`, whose 4 GPUs `trial` (interruptible,
    priority 1) and `steady` (not interruptible) hold: the projection, the snapshot, the last seq."""
    from gpuorch_proto import ClusterSnapshot
    from gpuorch_proto.inventory import NodeInfo

    def run(p: Projection, wid: str, wl: Workload, seq: int, *, queued: bool = False) -> int:
        d = RoutingDecision(
            workload_id=wid, decided_at=1.0, outcome="routed", cluster="primary", summary="ok"
        )
        a = f"{wid}-a1"
        evs: list[ev.Base] = [
            ev.Submitted(workload_id=wid, at=0.0, workload=wl),
            ev.Routed(workload_id=wid, at=1.0, decision=d, attempt_number=1),
            ev.AttemptCreated(
                workload_id=wid,
                at=1.0,
                attempt_id=a,
                epoch=1,
                cluster="primary",
                attempt_number=1,
                job_name=a,
                output_path="/o",
                checkpoint_path="/c",
            ),
        ]
        if queued:
            evs.append(
                ev.Unschedulable(
                    workload_id=wid,
                    at=2.0,
                    attempt_id=a,
                    epoch=1,
                    cluster="primary",
                    message="0/1 nodes are available: 1 Insufficient nvidia.com/gpu.",
                )
            )
        else:
            evs.append(ev.Running(workload_id=wid, at=2.0, attempt_id=a, epoch=1, cluster="primary"))
        for e in evs:
            seq += 1
            p.apply(e, seq)  # type: ignore[arg-type]
        return seq

    p = Projection()
    seq = run(p, "trial", make("trial", gpus=2, priority=1, preemptible=True), 0)
    seq = run(p, "steady", make("steady", gpus=2), seq)
    seq = run(p, "hi", make("hi", gpus=2, priority=10), seq, queued=True)
    snap = ClusterSnapshot(
        cluster="primary",
        reachable=True,
        observed_at=3.0,
        published_at=3.0,
        nodes=[NodeInfo(name="n", gpus_allocatable=4, gpus_free=0)],
    )
    return p, snap, seq


def test_the_round_preempts_for_work_queued_at_its_destination_once() -> None:
    p, snap, seq = _queued_world()
    s = rcore.RouterState()
    out = rcore.preemptions(s, p.workloads.values(), [snap], 4.0)
    assert [type(e) for e in out] == [ev.PreemptionPlanned, ev.PreemptionRequested]
    assert (
        out[1].workload_id == "trial"
        and out[0].workload_id == "hi"
        and out[0].event_id == "hi.preemption-planned.1"
    )
    for i, e in enumerate(out, start=seq + 1):
        s.apply(e, i)
    seq += len(out)
    # `trial` is being preempted for it now: `hi` waits for it to stop, no new victim
    then = rcore.preemptions(s, p.workloads.values(), [snap], 5.0)
    assert [e.event_id for e in then] == ["hi.preemption-planned.2"]
    assert then[0].victims == [] and "waiting for trial to stop" in then[0].reason  # type: ignore[attr-defined]
    s.apply(then[0], seq + 1)
    assert (
        rcore.preemptions(s, p.workloads.values(), [snap], 6.0) == []
    )  # the same plan, once in the log, is not published again
    assert (
        rcore.preemptions(rcore.RouterState(), [p.workloads["steady"], p.workloads["hi"]], [snap], 5.0)[
            0
        ].victims
        == []
    )  # type: ignore[attr-defined]


def test_a_plan_is_a_pure_decision_decided_again_until_the_log_has_it() -> None:
    """`preemptions` only reads the state: a publish that failed is decided again (the same ids,
    so a publish that did go through is de-duplicated), and folding the plan back counts it once,
    so the next plan is the 2nd `preemption-planned`."""
    from gpuorch_router.core import dump_state

    p, snap, seq = _queued_world()
    s = rcore.RouterState()
    before = dump_state(s)
    first = rcore.preemptions(s, p.workloads.values(), [snap], 4.0)
    assert dump_state(s) == before  # deciding changed nothing
    again = rcore.preemptions(s, p.workloads.values(), [snap], 5.0)  # the publish failed: decided again
    assert [e.event_id for e in again] == [e.event_id for e in first] == [
        "hi.preemption-planned.1",
        "trial-a1.preemption-requested",
    ]
    for i, e in enumerate(first, start=seq + 1):  # the log echoes the plan back
        s.apply(e, i)
    assert s.planned == {"hi": 1}  # counted once, by the fold
    assert s.plans["hi"] == preempt.planned_signature(first[0])  # type: ignore[arg-type]
    nxt = rcore.preemptions(s, p.workloads.values(), [snap], 6.0)  # waits for `trial` to stop
    assert [e.event_id for e in nxt] == ["hi.preemption-planned.2"]


@pytest.mark.parametrize(
    ("preemptible", "ckpt", "expected"),
    [(True, True, True), (True, False, False), (False, True, False), (False, False, False)],
    ids=["declared-with-checkpoint", "declared-without-checkpoint", "checkpoint-only", "neither"],
)
def test_interruptible_means_declared_preemptible_and_checkpointing(preemptible: bool, ckpt: bool, expected: bool) -> None:
    base = make(ckpt=ckpt)  # (validation refuses preemptible work without a checkpoint: built past it)
    wl = msgspec.structs.replace(base, spec=msgspec.structs.replace(base.spec, preemptible=preemptible))
    assert interruptible(wl) is expected


def test_interruptible_is_written_once() -> None:
    """Every reader of `spec.preemptible` asks `gpuorch_proto.workload.interruptible` (issue 29):
    only it (and validation, which refuses what it would not call interruptible) reads the field."""
    import ast
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    allowed = {root / "proto/gpuorch_proto/workload.py", root / "proto/gpuorch_proto/validate.py"}
    readers = [
        str(f.relative_to(root))
        for top in ("proto", "services", "gpuorch")
        for f in (root / top).rglob("*.py")
        if f not in allowed
        and any(isinstance(n, ast.Attribute) and n.attr == "preemptible" for n in ast.walk(ast.parse(f.read_text())))
    ]
    assert readers == []


def test_the_examples_load_and_say_what_they_claim() -> None:
    from pathlib import Path

    import yaml

    from gpuorch_proto.codec import load_policy_yaml

    root = Path(__file__).resolve().parents[2] / "examples" / "pipelines"
    wl = workload_from_obj(yaml.safe_load((root / "preemption.yaml").read_text()))
    assert interruptible(wl) and wl.spec.priority == 1
    policy = load_policy_yaml((root / "fair-share.yaml").read_text())
    fs = policy.queue("research").fair_share  # type: ignore[union-attr]
    assert fs is not None and fs.weights == {"vision-team": 1.0, "nlp-team": 1.0}
    not_ckpt = yaml.safe_load((root / "preemption.yaml").read_text())
    del not_ckpt["spec"]["checkpoint"]
    import pytest

    with pytest.raises(Exception, match="checkpoint"):
        workload_from_obj(not_ckpt)
