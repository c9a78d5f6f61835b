"""The fast path (`RoutingMemo`) gives exactly the reference's decision records.

Random worlds (clusters, node classes, snapshots of various ages, reachability, registries with
checkpoint stores, links to artifact stores), workloads (shapes, inputs, a pipeline stage's promoted
inputs in artifact stores, pins, tolerations, checkpoint policies), routing
history and the checkpoint a replacement could resume; a stream of decisions through ONE memo
(so caches are reused across workloads, times, exclusions and histories), with snapshots replaced
in the same mapping between decisions (as the service does when inventory publishes), and memos
small enough to be cleared mid-stream. Every decision is compared, whole and as encoded bytes,
with the reference (`decision.route`) on copies of the inputs: verdicts, every check and reason,
estimates, chosen cluster and queue, summary and placement.
"""

from __future__ import annotations

from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpuorch_proto import events as ev
from gpuorch_proto.inventory import ClusterSnapshot
from gpuorch_proto.resume import CheckpointRef
from gpuorch_proto.routing import RoutingDecision
from gpuorch_proto.workload import CheckpointPolicy, Toleration, Workload
from gpuorch_router.decision import route
from gpuorch_router.fastpath import RoutingMemo
from gpuorch_router.history import MeasuredTimeline, RoutingHistory, update_history
from gpuorch_router.index import SnapshotIndex
from gpuorch_router.pipeline import with_stage_inputs
from gpuorch_router.policy import build_index
from tests.router.test_properties import MODELS, NAMES, cluster, workload
from tests.support.builders import NOW, make_snapshot, make_workload

STORES = ["scratch", "prod", "ckpt"]


@st.composite
def snapshot(draw: st.DrawFn, name: str) -> ClusterSnapshot:
    s = draw(cluster(name))
    links = draw(st.sampled_from([{}, {}, {"prod": 10.0}, {"scratch": 250.0, "prod": 40.0}]))  # stores over a link
    reg = msgspec.structs.replace(
        s.registry,
        checkpoint_stores=draw(st.sampled_from([[], ["ckpt"]])),
        bandwidth_mbps={**s.registry.bandwidth_mbps, **links},
    )
    age = draw(st.sampled_from([0.0, 0.4, 7.3, 30.0, 119.5, 121.0, 600.0]))
    return msgspec.structs.replace(s, registry=reg, observed_at=NOW - age)


@st.composite
def world(draw: st.DrawFn) -> dict[str, ClusterSnapshot]:
    names = draw(st.lists(st.sampled_from(NAMES), min_size=1, max_size=5, unique=True))
    return {n: draw(snapshot(n)) for n in names}


@st.composite
def workloads(draw: st.DrawFn, names: list[str]) -> Workload:
    wl = draw(workload(names))
    r = msgspec.structs.replace
    ck = draw(
        st.sampled_from(
            [
                CheckpointPolicy(),
                CheckpointPolicy(path="ckpt", store="ckpt", portable=True),
                CheckpointPolicy(path="ckpt", store="scratch", portable=False),
                CheckpointPolicy(portable=True),
            ]
        )
    )
    tols = draw(st.sampled_from([[], [], [Toleration(key="team", value="vision")], [Toleration(operator="Exists")]]))
    req = r(wl.spec.requirements, tolerations=tols)
    name = draw(st.sampled_from(["train", "train", "eval"]))
    cls = draw(st.sampled_from([name, name, None]))  # runs learnt under the class (histories' keys), or a signature
    wl = r(wl, metadata=r(wl.metadata, name=name, workload_class=cls), spec=r(wl.spec, checkpoint=ck, requirements=req))
    stage_inputs = [  # a pipeline stage: its dependencies' promoted results, as the router adds them
        ev.StageInput(
            stage=f"dep{i}",
            workload_id=f"p--dep{i}",
            attempt_id=f"p--dep{i}-a1",
            result_path=f"{store}/p--dep{i}/result",
            store=store,
            size_bytes=draw(st.sampled_from([0, 10**6, 50 * 10**9])),
        )
        for i, store in enumerate(draw(st.lists(st.sampled_from(STORES), max_size=2)))
    ]
    return with_stage_inputs(wl, stage_inputs)


@st.composite
def histories(draw: st.DrawFn, names: list[str]) -> RoutingHistory | None:
    h: RoutingHistory | None = None
    for i in range(draw(st.integers(0, 6))):
        product = draw(st.sampled_from([m for m, _ in MODELS] + [None]))
        t0 = 1000.0 + 10 * i
        h = update_history(
            h,
            MeasuredTimeline(
                cluster=draw(st.sampled_from(names)),
                workload_key=draw(st.sampled_from(["train", "eval"])),
                gpu_product=product,
                routed_at=t0,
                admitted_at=t0 + draw(st.sampled_from([10.0, 600.0])),
                staging_started_at=t0 + 10,
                staging_finished_at=t0 + draw(st.sampled_from([20.0, 300.0])),
                compute_started_at=t0 + 700,
                finished_at=t0 + 700 + draw(st.sampled_from([60.0, 3600.0])),
                promoted_at=t0 + 4400,
                workload_id=f"h{i}",
                declared_seconds=draw(st.sampled_from([None, 60.0, 3600.0])),
            ),
        )
    return h


@st.composite
def checkpoints(draw: st.DrawFn, names: list[str]) -> CheckpointRef | None:
    if draw(st.booleans()):
        return None
    return CheckpointRef(
        attempt_id="w-a1",
        cluster=draw(st.sampled_from([*names, "elsewhere"])),
        store=draw(st.sampled_from(STORES)),
        path="ckpt/w/attempts/w-a1/checkpoints/ckpt.npz",
        step=draw(st.sampled_from([None, 900])),
        run_seconds=draw(st.sampled_from([0.0, 600.0, 1e6])),
    )


def _copy(x: Any, t: type[Any]) -> Any:
    return msgspec.json.decode(msgspec.json.encode(x), type=t)


def _reference(wl: Workload, w: dict[str, ClusterSnapshot], now: float, **kw: Any) -> RoutingDecision:
    """The reference on copies (new objects: nothing it could share with the memo's inputs)."""
    fresh = {n: _copy(s, ClusterSnapshot) for n, s in reversed(w.items())}
    resume = kw.pop("resume")
    return route(
        _copy(wl, Workload), "w", fresh, now, resume=_copy(resume, CheckpointRef) if resume else None, **kw
    )


def _same(got: RoutingDecision, want: RoutingDecision) -> None:
    assert got == want
    assert msgspec.json.encode(got) == msgspec.json.encode(want)


SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@SETTINGS
@given(data=st.data(), memo_size=st.sampled_from([4096, 4096, 2]))
def test_fast_path_and_reference_give_identical_records(data: Any, memo_size: int) -> None:
    w = data.draw(world())
    names = sorted(w)
    pool = data.draw(st.lists(workloads(names), min_size=1, max_size=4))
    hists = [None, data.draw(histories(names))]
    ckpts = [None, data.draw(checkpoints(names)), data.draw(checkpoints(names))]
    memo = RoutingMemo(memo_size=memo_size, index_cache=max(memo_size, 2), worlds=2 if memo_size < 10 else 4)
    now = NOW
    for _ in range(data.draw(st.integers(4, 16))):
        step = data.draw(st.sampled_from(["decide", "decide", "decide", "replace", "tick"]))
        if step == "replace":  # inventory publishes: a new snapshot object in the same mapping
            name = data.draw(st.sampled_from(names))
            w[name] = data.draw(st.one_of(st.just(msgspec.structs.replace(w[name], observed_at=now)), snapshot(name)))
            continue
        if step == "tick":
            now += data.draw(st.sampled_from([0.0005, 0.3, 1.0, 1.001, 59.0, 200.0]))
        wl = data.draw(st.sampled_from(pool))
        kw: dict[str, Any] = {
            "history": data.draw(st.sampled_from(hists)),
            "exclude": data.draw(st.sampled_from([(), (names[0],)])),
            "max_snapshot_age": data.draw(st.sampled_from([120.0, 120.0, 45.5])),
            "resume": data.draw(st.sampled_from(ckpts)),
        }
        got = memo.route(wl, "w", w, now, **kw)
        _same(got, _reference(wl, w, now, **kw))


@SETTINGS
@given(data=st.data())
def test_fast_path_over_new_ages_matches_the_reference(data: Any) -> None:
    """One workload decided again and again as `now` moves (the plan path): ages, staleness."""
    w = data.draw(world())
    wl = data.draw(workloads(sorted(w)))
    memo = RoutingMemo()
    times = data.draw(st.lists(st.floats(min_value=-5.0, max_value=400.0, allow_nan=False), min_size=3, max_size=20))
    for t in sorted(times) + times:
        _same(memo.route(wl, "w", w, NOW + t), _reference(wl, w, NOW + t, resume=None))


@pytest.mark.parametrize(
    "field",
    ["portable", "checkpoint store", "resume store", "resume cluster", "resume run", "tolerations"],
)
def test_workloads_differing_in_one_input_through_one_memo(field: str) -> None:
    """Deterministic companion: pairs differing in one input the memo keys must hold."""
    w = {
        "east": make_snapshot("east", artifact_stores=["scratch", "ckpt"]),
        "west": make_snapshot("west", artifact_stores=["scratch"], checkpoint_stores=["ckpt"]),
    }
    ck = CheckpointRef(attempt_id="w-a1", cluster="east", store="ckpt", path="/c/ckpt.npz", run_seconds=600.0)
    a = make_workload(checkpoint=CheckpointPolicy(path="c", store="scratch", portable=True))
    b, rb = a, ck
    r = msgspec.structs.replace
    if field == "portable":
        b = r(a, spec=r(a.spec, checkpoint=r(a.spec.checkpoint, portable=False)))
    elif field == "checkpoint store":
        b = r(a, spec=r(a.spec, checkpoint=r(a.spec.checkpoint, store="ckpt")))
    elif field == "resume store":
        rb = r(ck, store="scratch-2")
    elif field == "resume cluster":
        rb = r(ck, cluster="west")
    elif field == "resume run":
        rb = r(ck, run_seconds=0.0)
    else:
        b = r(a, spec=r(a.spec, requirements=r(a.spec.requirements, tolerations=[Toleration(operator="Exists")])))
    memo = RoutingMemo()
    for wl, resume in ((a, ck), (b, rb), (a, ck), (b, rb)):
        _same(memo.route(wl, "w", w, NOW, resume=resume), _reference(wl, w, NOW, resume=resume))


def _republished(draw: st.DrawFn, old: ClusterSnapshot, now: float) -> ClusterSnapshot:
    """What inventory publishes next for a cluster: mostly the same nodes and registry with a new
    age and new queue waits; sometimes one node's free GPUs, the registry, or everything changed."""
    r = msgspec.structs.replace
    change = draw(st.sampled_from(["waits", "waits", "waits", "node", "registry", "equal copy", "new"]))
    if change == "new":
        return draw(snapshot(old.cluster))
    waits = [r(q, estimated_wait_seconds=draw(st.sampled_from([0.0, 60.0, 1800.0, 7200.0]))) for q in old.queues]
    new = r(old, observed_at=now - draw(st.sampled_from([0.0, 3.0, 30.0])), queues=waits)
    if change == "node" and new.nodes:
        k = draw(st.integers(0, len(new.nodes) - 1))
        n = new.nodes[k]
        nodes = list(new.nodes)
        nodes[k] = r(n, gpus_free=draw(st.integers(0, max(0, n.gpus_allocatable))))
        new = r(new, nodes=nodes)
    elif change == "registry":
        reg = new.registry
        new = r(new, registry=r(reg, datasets_cached=[*reg.datasets_cached, f"ds@{draw(st.integers(3, 5))}"]))
    elif change == "equal copy":  # equal nodes and registry, but new objects (as decoded from the wire)
        new = _copy(new, ClusterSnapshot)
    return new


def _index_fields(idx: SnapshotIndex) -> dict[str, Any]:
    out = {name: getattr(idx, name) for name in SnapshotIndex.__slots__ if name not in ("classes", "snapshot")}
    out["classes"] = [
        (c.pool, c.product, c.memory_mib, c.allocatable, dict(c.labels), c.taints, c.sharing, c.nodes, c.ready,
         c.free_hist, c.cpu_max, c.memory_max, c.has_idle, c.members)
        for c in idx.classes
    ]  # fmt: skip
    return out


@SETTINGS
@given(data=st.data())
def test_indexes_built_from_the_previous_one_route_as_the_reference(data: Any) -> None:
    """The replay's and the router service's path: each republished snapshot is indexed with the
    cluster's previous index (sharing its node classes and registry sets when equal) and routed
    through one memo (which then shares its node, registry and check memos): every index equals
    one built afresh, and every decision the reference's."""
    w = data.draw(world())
    names = sorted(w)
    pool = data.draw(st.lists(workloads(names), min_size=1, max_size=3))
    hist = data.draw(st.sampled_from([None, data.draw(histories(names))]))
    memo = RoutingMemo()
    now = NOW
    indexes = {n: build_index(s) for n, s in w.items()}
    for _ in range(data.draw(st.integers(4, 14))):
        if data.draw(st.booleans()):
            now += data.draw(st.sampled_from([0.3, 1.0, 5.0, 60.0]))
            name = data.draw(st.sampled_from(names))
            w[name] = _republished(data.draw, w[name], now)
            indexes[name] = build_index(w[name], indexes[name])
            assert _index_fields(indexes[name]) == _index_fields(SnapshotIndex(w[name]))
        wl = data.draw(st.sampled_from(pool))
        got = memo.route(wl, "w", indexes, now, history=hist)
        _same(got, _reference(wl, w, now, history=hist, resume=None))
