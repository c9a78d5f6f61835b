"""Hypothesis properties of the routing policy over generated worlds and workloads.

* it never routes to an ineligible cluster, and the outcome follows from the verdicts;
* adding an ineligible cluster never changes the decision;
* the same inputs give the same decision (fresh objects, reordered mapping, prebuilt index).
"""

from __future__ import annotations

from typing import Any

import msgspec
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpuorch_proto.inventory import ClusterSnapshot, NodeInfo, QueueRegistry, Taint
from gpuorch_proto.routing import ClusterVerdict, RoutingDecision
from gpuorch_proto.workload import Preferences, Workload
from gpuorch_router.policy import RoutingMemo, SnapshotIndex, build_index, route
from tests.support.builders import (
    A100_40,
    A100_80,
    H100_80,
    NOW,
    make_input,
    make_node,
    make_queue,
    make_registry,
    make_snapshot,
    make_workload,
)

NAMES = ["alpha", "bravo", "charlie", "delta", "echo", "foxtrot"]
MODELS = [(A100_80, 81920), (A100_40, 40960), (H100_80, 81559), ("NVIDIA-L4", 23034)]


@st.composite
def nodes(draw: st.DrawFn, prefix: str) -> list[NodeInfo]:
    out: list[NodeInfo] = []
    for k in range(draw(st.sampled_from([0, 1, 1, 2, 2, 3, 3]))):  # node classes
        product, mem = draw(st.sampled_from(MODELS))
        gpus = draw(st.sampled_from([1, 2, 4, 8]))
        pool = draw(st.sampled_from(["train", "inference"]))
        taints = draw(st.sampled_from([[], [], [], [Taint(key="team", value="vision")]]))
        sharing = draw(st.sampled_from([[], ["time-slicing"]]))
        for i in range(draw(st.integers(1, 4))):
            out.append(
                make_node(
                    f"{prefix}-{k}-{i}",
                    gpus=gpus,
                    free=draw(st.integers(0, gpus)),
                    product=product,
                    memory_mib=mem,
                    pool=pool,
                    ready=draw(st.sampled_from([True, True, True, False])),
                    taints=taints,
                    sharing=sharing,
                    cpu_free=draw(st.sampled_from([8.0, 64.0])),
                )
            )
    return out


@st.composite
def cluster(draw: st.DrawFn, name: str) -> ClusterSnapshot:
    queues = draw(
        st.sampled_from(
            [[], [QueueRegistry(name="training")], [QueueRegistry(name="training", owners=["alice"])]]
        )
    )
    registry = make_registry(
        price_per_gpu_hour=draw(st.sampled_from([1.0, 2.0, 4.0])),
        artifact_stores=draw(st.sampled_from([["scratch"], ["scratch", "prod"], ["scratch", "prod"]])),
        credentials=draw(st.sampled_from([[], ["hf"], ["hf"]])),
        datasets_cached=draw(st.sampled_from([[], ["ds@1"], ["ds@2"]])),
        bandwidth_mbps=draw(st.sampled_from([{}, {"s3": 100.0}, {"s3": 1000.0}, {"s3": 1000.0}])),
        data_locations=draw(st.sampled_from([[], ["nfs"]])),
        queues=queues,
    )
    infos = [make_queue("training", wait=draw(st.sampled_from([0.0, 1800.0, 7200.0])))] if queues else []
    return make_snapshot(
        name,
        nodes=draw(nodes(name)),
        registry=registry,
        queues=infos,
        reachable=draw(st.sampled_from([True, True, True, False])),
        observed_at=NOW - draw(st.sampled_from([0.0, 30.0, 30.0, 300.0])),
    )


@st.composite
def world(draw: st.DrawFn, min_size: int = 0) -> dict[str, ClusterSnapshot]:
    names = draw(st.lists(st.sampled_from(NAMES[:-1]), min_size=min_size, max_size=4, unique=True))
    return {n: draw(cluster(n)) for n in names}


@st.composite
def workload(draw: st.DrawFn, pin_to: list[str]) -> Workload:
    gpus, sharing = draw(
        st.sampled_from([(0, None), (1, None), (2, None), (4, None), (8, None), (0.5, "time-slicing")])
    )
    pin = draw(st.sampled_from([None] * 6 + pin_to)) if pin_to else None
    return make_workload(
        gpus=gpus,
        sharing=sharing,
        workers=draw(st.sampled_from([1, 1, 1, 2, 3])),
        same_node=draw(st.sampled_from([False, False, True])),
        gpu_memory_gib=draw(st.sampled_from([None, None, 40, 80])),
        accelerators=draw(st.sampled_from([(), (), (), ("H100",), ("A100",)])),
        inputs=draw(
            st.sampled_from(
                [(), (), (), (make_input("ds@2", 360, ["s3"]),), (make_input("ds@1", 10, ["nfs"]),)]
            )
        ),
        output_store=draw(st.sampled_from(["scratch", "scratch", "prod"])),
        credentials=draw(st.sampled_from([(), (), ("hf",)])),
        pools=draw(st.sampled_from([(), (), ("train",)])),
        owner=draw(st.sampled_from(["alice", "alice", "bob"])),
        queue=f"{pin}/training" if pin else None,
        cpu=draw(st.sampled_from(["4", "4", "32"])),
        preferences=Preferences(
            cost_weight=draw(st.sampled_from([0.0, 1.0])),
            clusters=draw(st.sampled_from([[], ["bravo"]])),
        ),
    )


def _new_index(s: ClusterSnapshot) -> SnapshotIndex:
    """A never-used index of a copy of `s` (an equal snapshot would find the memoised world)."""
    return SnapshotIndex(msgspec.json.decode(msgspec.json.encode(s), type=ClusterSnapshot))


SETTINGS = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _key(d: RoutingDecision) -> tuple[str, str | None, str | None]:
    return d.outcome, d.cluster, d.queue


def _capacity_only(v: ClusterVerdict) -> bool:
    return not v.eligible and all(c.ok or c.capacity_only for c in v.checks)


@SETTINGS
@given(data=st.data())
def test_never_routes_to_an_ineligible_cluster(data: Any) -> None:
    w = data.draw(world())
    wl = data.draw(workload(sorted(w)))
    d = route(wl, "w", w, NOW)
    verdicts = {v.cluster: v for v in d.verdicts}
    eligible = [v for v in d.verdicts if v.eligible]
    for v in d.verdicts:
        assert v.eligible == all(c.ok for c in v.checks)
    if d.outcome == "routed":
        chosen = verdicts[d.cluster]  # type: ignore[index]
        assert chosen.eligible and chosen.estimate is not None
        best = min(eligible, key=lambda v: (v.estimate.score, v.cluster))  # type: ignore[union-attr]
        assert best.cluster == d.cluster
    else:
        assert not eligible and d.cluster is None
        blocked = [v for v in d.verdicts if _capacity_only(v) and v.checks[0].code != "PINNED_ELSEWHERE"]
        assert (d.outcome == "waiting") == bool(blocked)


@SETTINGS
@given(data=st.data())
def test_adding_an_ineligible_cluster_never_changes_the_decision(data: Any) -> None:
    w = data.draw(world())
    wl = data.draw(workload(sorted(w)))
    extra = data.draw(cluster(NAMES[-1]))
    before = route(wl, "w", w, NOW)
    after = route(wl, "w", {**w, extra.cluster: extra}, NOW)
    added = next(v for v in after.verdicts if v.cluster == extra.cluster)
    if added.eligible:
        return
    if _capacity_only(added) and before.outcome == "rejected":
        assert after.outcome == "waiting"  # a cluster that may come back is worth waiting for
        return
    assert _key(after) == _key(before)
    assert [v for v in after.verdicts if v.cluster != extra.cluster] == before.verdicts


@SETTINGS
@given(data=st.data())
def test_unchanged_inventory_gives_the_same_decision(data: Any) -> None:
    w = data.draw(world(min_size=1))
    wl = data.draw(workload(sorted(w)))
    other = data.draw(workload(sorted(w)))
    memo = RoutingMemo()
    first = memo.route(wl, "w", w, NOW)
    memo.route(other, "w", w, NOW)  # another workload through the same memoised indexes in between
    assert memo.route(wl, "w", w, NOW) == first
    fresh = {
        n: msgspec.json.decode(msgspec.json.encode(s), type=ClusterSnapshot) for n, s in reversed(w.items())
    }
    copy = msgspec.json.decode(msgspec.json.encode(wl), type=Workload)
    assert route(copy, "w", fresh, NOW) == first  # new objects, new indexes, other mapping order
    assert route(wl, "w", {n: build_index(s) for n, s in w.items()}, NOW) == first


@SETTINGS
@given(
    data=st.data(),
    times=st.lists(st.floats(min_value=-5.0, max_value=400.0, allow_nan=False), min_size=1, max_size=12),
    jitter=st.lists(st.floats(min_value=0.0, max_value=2.0, allow_nan=False), min_size=6, max_size=6),
)
def test_memoised_decisions_match_fresh_ones_at_any_time(
    data: Any, times: list[float], jitter: list[float]
) -> None:
    """Decisions reused across calls (same world, same shape) equal decisions computed from scratch."""
    w = data.draw(world(min_size=1))
    w = {
        n: msgspec.structs.replace(s, observed_at=s.observed_at - jitter[i])
        for i, (n, s) in enumerate(sorted(w.items()))
    }
    wl = data.draw(workload(sorted(w)))
    exclude = data.draw(st.sampled_from([(), tuple(sorted(w))[:1]]))
    memo = RoutingMemo()
    for t in sorted(times) + times:
        got = memo.route(wl, "w", w, NOW + t, exclude=exclude)
        fresh = {n: _new_index(s) for n, s in w.items()}
        copy = msgspec.json.decode(msgspec.json.encode(wl), type=Workload)
        assert got == route(copy, "w", fresh, NOW + t, exclude=exclude)


@SETTINGS
@given(data=st.data())
def test_workloads_sharing_memoised_parts_decide_as_if_alone(data: Any) -> None:
    """Each index memoises parts of its checks by the fields they read (node filters, shape,
    registry checks, placement, verdicts of ineligible clusters); a stream of workloads sharing
    some fields decides exactly as each would on never-used indexes."""
    w = data.draw(world(min_size=1))
    stream = data.draw(st.lists(workload(sorted(w)), min_size=2, max_size=6))
    ages = data.draw(
        st.lists(st.sampled_from([0.0, 0.5, 1.0, 200.0]), min_size=len(stream), max_size=len(stream))
    )
    memo = RoutingMemo()
    for wl, dt in zip(stream, ages, strict=True):
        got = memo.route(wl, "w", w, NOW + dt)
        fresh = {n: _new_index(s) for n, s in w.items()}
        copy = msgspec.json.decode(msgspec.json.encode(wl), type=Workload)
        assert got == route(copy, "w", fresh, NOW + dt)


def test_one_field_changes_through_shared_indexes_match_fresh_decisions() -> None:
    """Deterministic companion: workloads differing in one field each, through the same indexes."""
    from gpuorch.dev.bench.routing import NOW as BNOW
    from gpuorch.dev.bench.routing import make_workload as bench_workload
    from gpuorch.dev.bench.routing import make_world

    w = make_world(8, 40, seed=3)
    r = msgspec.structs.replace
    stream: list[Workload] = []
    for shape in range(5):
        base = bench_workload(shape, 0)
        res, req = base.spec.resources, base.spec.requirements
        stream += [
            base,
            r(base, spec=r(base.spec, resources=r(res, accelerators=["H100"]))),
            r(base, spec=r(base.spec, resources=r(res, accelerators=["A100"]))),
            r(base, spec=r(base.spec, resources=r(res, cpu="70"))),
            r(base, spec=r(base.spec, resources=r(res, gpus=4))),
            r(base, spec=r(base.spec, resources=r(res, gpu_memory_gib=80.0))),
            r(base, spec=r(base.spec, requirements=r(req, pools=["inference"]))),
            r(base, spec=r(base.spec, requirements=r(req, credentials=[]))),
            r(base, spec=r(base.spec, expected_runtime="9h")),
            r(base, metadata=r(base.metadata, owner="bob")),
        ]
    memo = RoutingMemo()
    for i, wl in enumerate(stream):
        got = memo.route(wl, "w", w, BNOW + i)
        fresh = {n: _new_index(s) for n, s in w.items()}
        copy = msgspec.json.decode(msgspec.json.encode(wl), type=Workload)
        assert got == route(copy, "w", fresh, BNOW + i), i
