"""Snapshot index: node classes, histograms, memoisation; cost does not grow with node count."""

from __future__ import annotations

import msgspec

from gpuorch_proto.inventory import ClusterSnapshot
from gpuorch_router.policy import RoutingMemo, SnapshotIndex, build_index, route
from tests.support.builders import (
    A100_40,
    NOW,
    make_node,
    make_nodes,
    make_snapshot,
    make_workload,
    snapshots,
)


def test_a_thousand_identical_nodes_are_one_class_with_a_free_gpu_histogram() -> None:
    nodes = [make_node(f"n{i}", free=i % 3, cpu_free=float(i % 50)) for i in range(1000)]
    idx = build_index(make_snapshot("big", nodes=nodes))
    assert len(idx.classes) == 1  # hostnames differ, nothing else does
    cls = idx.classes[0]
    assert (cls.nodes, cls.ready, cls.allocatable) == (1000, 1000, 8)
    assert dict(cls.free_hist) == {0: 334, 1: 333, 2: 333}
    assert cls.cpu_max == 49.0 and not cls.has_idle


def test_classes_split_on_pool_model_readiness_does_not_split() -> None:
    nodes = [
        *make_nodes("a", 3, pool="train"),
        *make_nodes("b", 2, pool="inference"),
        *make_nodes("c", 2, product=A100_40, memory_mib=40960),
        make_node("d", ready=False),
    ]
    idx = build_index(make_snapshot("c", nodes=nodes))
    counts = sorted((c.pool or "", c.memory_mib, c.nodes, c.ready) for c in idx.classes)
    assert counts == [("inference", 81920, 2, 2), ("train", 40960, 2, 2), ("train", 81920, 4, 3)]


def test_the_fast_path_keeps_indexes_by_snapshot_identity() -> None:
    memo = RoutingMemo()
    snap = make_snapshot("c")
    assert memo.index(snap) is memo.index(snap)
    copy = msgspec.json.decode(msgspec.json.encode(snap), type=ClusterSnapshot)
    assert copy == snap and memo.index(copy) is not memo.index(snap)
    assert RoutingMemo().index(snap) is not memo.index(snap)  # each owner has its own


def test_route_accepts_an_index_and_decides_the_same() -> None:
    snap = make_snapshot("c", nodes=make_nodes("n", 3, free=0))
    wl = make_workload(gpus=4)
    assert route(wl, "w", {"c": snap}, NOW) == route(wl, "w", {"c": SnapshotIndex(snap)}, NOW)


def test_memo_never_leaks_between_workloads_on_one_index() -> None:
    world = snapshots(make_snapshot("small", nodes=make_nodes("s", 2, product=A100_40, memory_mib=40960)))
    loose, strict = make_workload(), make_workload(gpu_memory_gib=80)
    assert route(loose, "w", world, NOW).outcome == "routed"
    assert route(strict, "w", world, NOW).outcome == "rejected"
    assert route(loose, "w", world, NOW).outcome == "routed"


def test_same_workload_new_time_updates_freshness() -> None:
    world = snapshots(make_snapshot("c"))
    wl = make_workload()
    assert route(wl, "w", world, NOW + 10).outcome == "routed"
    late = route(wl, "w", world, NOW + 500)
    assert late.outcome == "waiting" and late.verdicts[0].snapshot_age == 500
    assert route(wl, "w", world, NOW + 10).outcome == "routed"


def test_number_of_classes_not_nodes_drives_the_work() -> None:
    small = build_index(make_snapshot("s", nodes=[make_node(f"n{i}", free=i % 9) for i in range(100)]))
    large = build_index(make_snapshot("l", nodes=[make_node(f"n{i}", free=i % 9) for i in range(10_000)]))
    assert len(small.classes) == len(large.classes) == 1
    assert len(small.classes[0].free_hist) == len(large.classes[0].free_hist) == 9
