"""One routing path (issue 29, item 5).

`gpuorch submit --dry-run` decides by what the router calls (`gpuorch_router.dryrun`): the cases
where the old dry run (`decision.route` over the raw snapshots) and the router disagreed now agree,
and over generated logs and snapshots the dry run's decision equals the one the router service
object (`Router`, folding the same log, taking the same snapshots) makes. The fast path's
verdicts are the reference's, cluster by cluster, over generated inputs.
"""

from __future__ import annotations

import asyncio
import math
from pathlib import Path
from typing import Any

import msgspec
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from opentelemetry.context import Context

from gpuorch.config import Settings, load_registry
from gpuorch.follow import Follower
from gpuorch.runtime.shell import Incoming, Reject
from gpuorch_proto import (
    ClusterSnapshot,
    Event,
    Names,
    RoutingDecision,
    Workload,
    encode,
    event_id,
    k8s,
    workload_id_for,
)
from gpuorch_proto import events as ev
from gpuorch_proto.resume import CheckpointRef
from gpuorch_proto.workload import Toleration
from gpuorch_router import decision as ref
from gpuorch_router.demand import parse_demand
from gpuorch_router.dryrun import DryRun, dry_run, trusted_snapshots
from gpuorch_router.fastpath import RoutingMemo
from gpuorch_router.index import SnapshotIndex
from gpuorch_router.policy import build_index, route
from gpuorch_router.service import Router
from tests.router.test_fastpath import checkpoints, histories, workloads, world
from tests.snapshot.histories import MAKERS, WORKLOADS
from tests.support.builders import H100_80, NOW, make_node, make_snapshot, make_workload

NAMES = Names("gpuorch")


def messages(*snaps: ClusterSnapshot) -> list[tuple[str, ClusterSnapshot]]:
    """Snapshots as the CLI reads them: each on its cluster's subject."""
    return [(NAMES.inventory(s.cluster), s) for s in snaps]


class _Msg:
    """A snapshot message as the router's subscription hands it over (subject, body)."""

    def __init__(self, subject: str, snap: ClusterSnapshot) -> None:
        self.subject, self.data = subject, encode(snap)


def the_router(events: list[tuple[int, Event]], msgs: list[tuple[str, ClusterSnapshot]], registry: Path | None = None) -> Router:
    """The router service object that has these snapshots, taken by its own handler
    (`Router.on_snapshot`), and has folded the log (`Router.fold`)."""
    router = Router(Settings(registry=registry))

    async def take() -> None:
        for subject, snap in msgs:
            await router.on_snapshot(_Msg(subject, snap))

    asyncio.run(take())
    for seq, e in events:
        router.fold(e, seq)
    return router


def routers_decision(router: Router, wl: Workload, wid: str, now: float) -> RoutingDecision | None:
    """What the router decides for `wid` now: a new workload's first attempt (the gate's round
    calls `Router.decide(wl, wid, 1, now)`), or the attempt a known one waits for (re-evaluation);
    None when it waits for none."""
    view = router.follower.projection.get(wid)
    if view is None or view.workload is None:
        return router.decide(wl, wid, 1, now)
    n = router.pending_attempt(wid)
    return None if n is None else router.decide(view.workload, wid, n, now)


def the_dry_run(events: list[tuple[int, Event]], msgs: list[tuple[str, ClusterSnapshot]], wl: Workload, wid: str, now: float,
                registry: Path | None = None) -> DryRun:  # fmt: skip
    """What `gpuorch submit --dry-run` computes from what it read (`cli._submit_dry_run`)."""
    reg = load_registry(registry) if registry else None
    snaps = trusted_snapshots(msgs, NAMES, reg.clusters if reg else None)
    return dry_run(wl, wid, events, snaps, now, projection=Follower.of(Settings().tuning).projection,
                   time_scale=reg.time_scale if reg else 1.0)  # fmt: skip


def old_dry_run(msgs: list[tuple[str, ClusterSnapshot]], wl: Workload, wid: str, now: float) -> RoutingDecision:
    """What `--dry-run` computed before: the reference over the raw snapshots, nothing else."""
    return route(wl, wid, {s.cluster: build_index(s) for _, s in msgs}, now)


def same(a: RoutingDecision | None, b: RoutingDecision | None) -> None:
    assert msgspec.to_builtins(a) == msgspec.to_builtins(b)


def numbered(events: list[ev.Base]) -> list[tuple[int, Event]]:
    return list(enumerate(events, start=1))  # type: ignore[arg-type]


# --- the cases where the old dry run and the router disagreed ----------------------------------

W = "w-0000000042"


def _attempt(wid: str, n: int, cluster: str) -> dict[str, Any]:
    return {"workload_id": wid, "attempt_id": k8s.attempt_id(wid, n), "epoch": n, "cluster": cluster}


def running_on_alpha(wl: Workload, msgs: list[tuple[str, ClusterSnapshot]], t: float) -> list[ev.Base]:
    """`W` submitted, routed to alpha and its attempt 1 created there, 100 s before `t`."""
    first = route(wl, W, {s.cluster: build_index(s) for _, s in msgs}, t - 100)
    return [
        ev.Submitted(workload_id=W, at=t - 100, workload=wl),
        ev.Routed(event_id=f"{W}.routed.1", workload_id=W, at=t - 100, decision=first, attempt_number=1),
        ev.AttemptCreated(at=t - 99, attempt_number=1, job_name="j", output_path="/o", checkpoint_path="/c", **_attempt(W, 1, "alpha")),
    ]


def lost_on_alpha(t: float) -> tuple[list[tuple[int, Event]], list[tuple[str, ClusterSnapshot]], Workload, str]:
    """Only alpha reaches the output store; attempt 1 was lost there, attempt 2 excludes it. alpha
    answers again but was last observed before the request: still excluded, so waiting."""
    wl = make_workload(output_store="prod")
    msgs = messages(make_snapshot("alpha", observed_at=t - 5), make_snapshot("beta", observed_at=t, artifact_stores=["scratch"]))
    a = _attempt(W, 1, "alpha")
    log = [
        *running_on_alpha(wl, msgs, t),
        ev.Lost(at=t - 2, reason="cluster unreachable", **a),
        ev.RouteRequested(workload_id=W, at=t, attempt_number=2, exclude=["alpha"], reason="lost"),
    ]
    return numbered(log), msgs, wl, W


def stage_input(t: float) -> tuple[list[tuple[int, Event]], list[tuple[str, ClusterSnapshot]], Workload, str]:
    """A released pipeline stage whose dependency's result is in a store only `a` reaches; `b`
    has faster GPUs. Routed with its inputs it goes to `a`; without them (the old dry run) to `b`."""
    wid, wl = "p--train", make_workload(gpus=8)
    msgs = messages(
        make_snapshot("a", observed_at=t, artifact_stores=["scratch", "east-results"]),
        make_snapshot("b", [make_node("b-0", product=H100_80)], observed_at=t, artifact_stores=["scratch"]),
    )
    prep = ev.StageInput(stage="prep", workload_id="p--prep", attempt_id="p--prep-a1", result_path="east-results/p--prep/result/",
                         store="east-results", size_bytes=20 * 10**9)  # fmt: skip
    log = [
        ev.Submitted(workload_id=wid, at=t - 10, workload=wl),
        ev.StageReady(event_id=f"{wid}.stage-ready", workload_id=wid, at=t - 5, pipeline="p", stage="train", inputs=[prep]),
        ev.Released(workload_id=wid, at=t - 5, reason="no limits", pipeline="p"),
    ]
    return numbered(log), msgs, wl, wid


def preempted(t: float) -> tuple[list[tuple[int, Event]], list[tuple[str, ClusterSnapshot]], Workload, str]:
    """Attempt 1 preempted for P, which is not placed yet: the replacement yields to it."""
    wl = make_workload()
    msgs = messages(make_snapshot("alpha", observed_at=t))
    a = _attempt(W, 1, "alpha")
    log = [
        *running_on_alpha(wl, msgs, t),
        ev.Submitted(workload_id="p-0000000001", at=t - 20, workload=make_workload("urgent", gpus=8, priority=10)),
        ev.PreemptionRequested(at=t - 10, preemptor="p-0000000001", preemptor_priority=10, priority=0, reason="for p", **a),
        ev.RouteRequested(workload_id=W, at=t - 5, attempt_number=2, reason="preempted"),
    ]
    return numbered(log), msgs, wl, W


def registry_facts(t: float, tmp: Path) -> tuple[list[tuple[int, Event]], list[tuple[str, ClusterSnapshot]], Workload, str, Path]:
    """beta (faster GPUs) claims the `prod` store in its snapshot; the router's registry says
    beta has only `scratch`: the registry's facts count (`trusted_snapshot`), so only alpha can."""
    f = tmp / "clusters.yaml"
    f.write_text(yaml.safe_dump({"clusters": [
        {"name": "alpha", "registry": {"artifact_stores": ["prod", "scratch"]}},
        {"name": "beta", "registry": {"artifact_stores": ["scratch"]}},
    ]}))  # fmt: skip
    msgs = messages(
        make_snapshot("alpha", observed_at=t, artifact_stores=["prod", "scratch"]),
        make_snapshot("beta", [make_node("beta-0", product=H100_80)], observed_at=t, artifact_stores=["prod", "scratch"]),
    )
    wl = make_workload(output_store="prod")
    return [], msgs, wl, workload_id_for("k1", wl.metadata.name), f


@pytest.mark.parametrize("case", ["lost attempt excluded", "stage input location", "preempted replacement yields"])
def test_the_dry_run_agrees_with_the_router_where_the_old_one_did_not(case: str) -> None:
    t = NOW
    events, msgs, wl, wid = {"lost attempt excluded": lost_on_alpha, "stage input location": stage_input,
                             "preempted replacement yields": preempted}[case](t)  # fmt: skip
    now = t + 1
    router = routers_decision(the_router(events, msgs), wl, wid, now)
    old = old_dry_run(msgs, wl, wid, now)
    assert router is not None and (old.outcome, old.cluster) != (router.outcome, router.cluster), "the old dry run disagreed"
    got = the_dry_run(events, msgs, wl, wid, now)
    same(got.decision, router)
    if case == "lost attempt excluded":
        assert router.outcome == "waiting" and got.attempt == 2
        alpha = next(v for v in router.verdicts if v.cluster == "alpha")
        assert any(c.code == "CLUSTER_NOT_ALLOWED" and "excluded" in c.message for c in alpha.checks)
    elif case == "stage input location":
        assert (router.outcome, router.cluster, old.cluster) == ("routed", "a", "b")
    else:
        assert router.outcome == "waiting" and "preempted by p-0000000001" in router.summary


def test_the_dry_run_takes_the_registrys_facts_as_the_router_does(tmp_path: Path) -> None:
    events, msgs, wl, wid, reg = registry_facts(NOW, tmp_path)
    router = routers_decision(the_router(events, msgs, reg), wl, wid, NOW + 1)
    old = old_dry_run(msgs, wl, wid, NOW + 1)
    assert router is not None and (router.cluster, old.cluster) == ("alpha", "beta"), "beta's own claim made it win"
    same(the_dry_run(events, msgs, wl, wid, NOW + 1, reg).decision, router)
    # a snapshot of a cluster the registry does not know is refused, by the dry run as by the router
    stray = messages(make_snapshot("gamma", observed_at=NOW))
    assert trusted_snapshots([*msgs, *stray], NAMES, {"alpha": msgs[0][1].registry}).keys() == {"alpha"}


def test_a_submit_the_router_refuses_is_refused_by_the_dry_run() -> None:
    """The same key, another document: the router rejects the submit; the dry run says so."""
    wl = make_workload()
    wid = workload_id_for("k1", wl.metadata.name)
    events = numbered([ev.Submitted(workload_id=wid, at=NOW, workload=wl, idempotency_key="k1")])
    other = make_workload(gpus=2)
    router = the_router(events, messages(make_snapshot("alpha")))
    submit = ev.Submit(workload=other, idempotency_key="k1")
    msg = Incoming(event=submit, subject="gpuorch.cmd.submit", stream="CMD", stream_seq=9, delivered=1, headers={},
                   msg_id="k1", context=Context(), data=encode(submit))  # fmt: skip
    with pytest.raises(Reject, match="exists with a different body"):
        asyncio.run(router.on_command(msg))
    got = the_dry_run(events, messages(make_snapshot("alpha")), other, wid, NOW + 1)
    assert got.refused and got.decision is None and "exists with a different body" in got.note
    # the same document: a duplicate the router ignores; routed already, it waits for no decision
    routed = ev.Routed(event_id=event_id(wid, "routed", 1), workload_id=wid, at=NOW, attempt_number=1,
                       decision=route(wl, wid, {"alpha": build_index(make_snapshot("alpha"))}, NOW))  # fmt: skip
    done = the_dry_run(numbered([events[0][1], routed]), messages(make_snapshot("alpha")), wl, wid, NOW + 1)
    assert not done.refused and done.decision is None and done.attempt is None and "waits for no routing decision" in done.note


# --- property: the dry run decides as the router, over generated logs ----------------------------

CLUSTERS = ("east", "west")


def _stage_ready(wid: str, w: int, n: int, at: float) -> Event:
    store = ("scratch", "prod", "east-results")[n - 1]
    inputs = [ev.StageInput(stage="dep", workload_id="p--dep", attempt_id="p--dep-a1", result_path=f"{store}/p--dep/r/", store=store,
                            size_bytes=10**9 * n)]  # fmt: skip
    return ev.StageReady(event_id=event_id(wid, "stage-ready"), workload_id=wid, at=at, pipeline="p", stage="s", inputs=inputs)


def _preemption(wid: str, w: int, n: int, at: float) -> Event:
    return ev.PreemptionRequested(at=at, preemptor=f"w{1 + n % 2}-a", preemptor_priority=10, priority=0, reason="for a priority",
                                  **_attempt(wid, 1, "east"))  # fmt: skip


def _route_requested(wid: str, w: int, n: int, at: float) -> Event:
    ck = CheckpointRef(attempt_id=k8s.attempt_id(wid, 1), cluster="east", store="scratch", path="ck/a.npz", run_seconds=600.0) if n == 3 else None
    return ev.RouteRequested(workload_id=wid, at=at, attempt_number=max(n, 2), exclude=[CLUSTERS[n % 2]], checkpoint=ck)


EXTRA = {
    "stage-ready": _stage_ready,
    "released": lambda wid, w, n, at: ev.Released(workload_id=wid, at=at, reason="admitted"),
    "preemption-requested": _preemption,
    "replacement": _route_requested,
}
KINDS = [*MAKERS, *EXTRA, "released", "released", "replacement"]  # (drawn a little more often)


LIFE = ["submitted", "routed", "attempt-created", "admitted", "running", "succeeded", "promoted", "completed"]
SCENARIOS: dict[str, list[tuple[str, int]]] = {  # the target workload's run, after its `submitted`
    "released": [("released", 1)],
    "lost, replacement excluding a cluster": [("routed", 1), ("attempt-created", 1), ("lost", 1), ("replacement", 2)],
    "preempted, replacement": [("routed", 1), ("attempt-created", 1), ("preemption-requested", 1), ("replacement", 2)],
    "stage ready, released": [("stage-ready", 1), ("released", 1)],
    "random": [],
}


@st.composite
def logs(draw: st.DrawFn, now: float) -> list[tuple[int, Event]]:
    """Finished workloads the router learns from (a whole life each, measured times drawn); a
    target workload in one of `SCENARIOS` (or none: a new id), its times close to `now`, with a
    few random events after it; other workloads (a preemptor, perhaps placed) with random runs of
    lifecycle events in any order (as tests/snapshot/histories). Interleaved, each in its order."""
    make = {**MAKERS, **EXTRA}
    runs: list[list[Event]] = []
    for i in range(draw(st.integers(0, 2))):
        n, w, t = draw(st.integers(1, 2)), draw(st.integers(0, len(WORKLOADS) - 1)), now - 20000.0
        run = []
        for k in LIFE:
            t += draw(st.sampled_from([5.0, 600.0, 7200.0]))
            run.append(make[k](f"done{i}-a", w, n, t))
        runs.append(run)
    scenario = draw(st.sampled_from(sorted(SCENARIOS)))
    target = draw(st.sampled_from(["w0-a", "p--s"]))
    steps = [("submitted", 1), *SCENARIOS[scenario], *draw(st.lists(st.tuples(st.sampled_from(KINDS), st.integers(1, 3)), max_size=3))]
    w = draw(st.integers(0, len(WORKLOADS) - 1))
    runs.append([make[k](target, w, n, now - 60 + 5 * j) for j, (k, n) in enumerate(steps)])
    for wid in draw(st.lists(st.sampled_from(["w1-a", "w2-a"]), unique=True)):
        more = [("submitted", 1), *draw(st.lists(st.tuples(st.sampled_from(KINDS), st.integers(1, 3)), max_size=5))]
        w = draw(st.integers(0, len(WORKLOADS) - 1))
        runs.append([make[k](wid, w, n, now - 100 + 10 * j) for j, (k, n) in enumerate(more)])
    order = draw(st.permutations([i for i, run in enumerate(runs) for _ in run]))
    cursors, out = [0] * len(runs), []
    for i in order:
        out.append((len(out) + 1, runs[i][cursors[i]]))
        cursors[i] += 1
    return out


@st.composite
def fleet(draw: st.DrawFn, now: float) -> list[tuple[str, ClusterSnapshot]]:
    out = []
    for c in draw(st.lists(st.sampled_from(CLUSTERS), min_size=1, max_size=2, unique=True)):
        free = draw(st.integers(0, 8))
        out.append((NAMES.inventory(c), make_snapshot(
            c, [make_node(f"{c}-0", free=free, product=draw(st.sampled_from([None, H100_80])) or "NVIDIA-A100-SXM4-80GB")],
            observed_at=now - draw(st.sampled_from([0.5, 30.0, 100.0, 400.0])), reachable=draw(st.booleans()) or free > 2,
            artifact_stores=draw(st.sampled_from([["scratch"], ["scratch", "prod"], ["scratch", "east-results"]])),
            bandwidth_mbps=draw(st.sampled_from([{}, {"east-results": 50.0}])),
        )))  # fmt: skip
    return out


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_the_dry_run_decides_as_the_router_over_generated_logs(data: st.DataObject) -> None:
    now = NOW + data.draw(st.sampled_from([0.0, 30.0, 600.0]))
    events = data.draw(logs(now))
    msgs = data.draw(fleet(now))
    known = sorted({e.workload_id for _, e in events})
    targets = [w for w in ("w0-a", "p--s") if w in known]  # (the scenario's workload, drawn more often)
    wid = data.draw(st.one_of(st.sampled_from(targets), st.sampled_from([*known, "new-0000000001"])))
    submitted = [e.workload for _, e in events if isinstance(e, ev.Submitted) and e.workload_id == wid]
    wl = submitted[0] if submitted else data.draw(st.sampled_from(WORKLOADS))  # the document of that id
    want = routers_decision(the_router(events, msgs), wl, wid, now)
    got = the_dry_run(events, msgs, wl, wid, now)
    assert not got.refused
    same(got.decision, want)


# --- the fast path's verdicts are the reference's, cluster by cluster -----------------------------


def siblings(wl: Workload) -> list[Workload]:
    """Workloads differing from `wl` in one field a cached part reads (one memo serves them all)."""
    r, spec = msgspec.structs.replace, wl.spec
    return [
        r(wl, spec=r(spec, checkpoint=r(spec.checkpoint, portable=not spec.checkpoint.portable))),
        r(wl, spec=r(spec, resources=r(spec.resources, same_node=not spec.resources.same_node))),
        r(wl, spec=r(spec, requirements=r(spec.requirements, tolerations=[] if spec.requirements.tolerations else [Toleration(operator="Exists")]))),
        r(wl, spec=r(spec, requirements=r(spec.requirements, node_selector={} if spec.requirements.node_selector else {"nvidia.com/gpu.count": "8"}))),
    ]  # fmt: skip


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), memo_size=st.sampled_from([4096, 2]))
def test_memoised_and_reference_verdicts_are_identical(data: st.DataObject, memo_size: int) -> None:
    """Each cluster's verdict through one memo (caches shared by every workload, time, exclusion
    and age drawn) equals the reference path's: `eligibility` (nothing cached), `evaluate`,
    `verdict` (`standing`, `ineligible_verdict`) on copies of the inputs."""
    w = data.draw(world())
    names = sorted(w)
    pool = [v for wl in data.draw(st.lists(workloads(names), min_size=1, max_size=3)) for v in (wl, *siblings(wl))]
    hists = [None, data.draw(histories(names))]
    ckpts = [None, data.draw(checkpoints(names)), data.draw(checkpoints(names))]
    memo = RoutingMemo(memo_size=memo_size, index_cache=max(memo_size, 2))
    now = NOW
    for _ in range(data.draw(st.integers(2, 10))):
        now += data.draw(st.sampled_from([0.0, 0.4, 1.0, 90.0, 300.0]))
        wl = data.draw(st.sampled_from(pool))
        exclude = data.draw(st.sampled_from([(), (names[0],)]))
        max_age = data.draw(st.sampled_from([120.0, 45.5, math.inf]))
        history, resume = data.draw(st.sampled_from(hists)), data.draw(st.sampled_from(ckpts))
        got = memo.route(wl, "w", w, now, history=history, exclude=exclude, max_snapshot_age=max_age, resume=resume)
        d = parse_demand(msgspec.json.decode(msgspec.json.encode(wl), type=Workload), history, resume)
        for v in got.verdicts:
            if (d.pin is not None and v.cluster != d.pin[0]) or v.cluster not in w:
                continue  # a pinned workload's other clusters: `pin_verdicts`, no checks of theirs
            idx = SnapshotIndex(msgspec.json.decode(msgspec.json.encode(w[v.cluster]), type=ClusterSnapshot))
            elig = ref.eligibility(idx, d)
            want, _ = ref.verdict(v.cluster, idx, ref.evaluate(idx, d, elig), now, v.cluster in exclude, max_age)
            assert msgspec.json.encode(v) == msgspec.json.encode(want), v.cluster
