"""Waits per request shape (docs/inventory.md, *Waits per request shape*): worked out by hand on
FIFO clusters, through the snapshot that inventory publishes from the objects the official client
lists; priority order; Kueue ClusterQueues sharing a line; which shapes are published."""

from __future__ import annotations

from typing import Any

import pytest

from gpuorch_inventory.core import (
    Demand,
    Hold,
    Slot,
    build_snapshot,
    request_shapes,
    shape_waits,
    snapshot_changed,
    wait_layout,
)
from gpuorch_proto import ClusterRegistryEntry, ClusterSnapshot, RequestShape
from gpuorch_proto.inventory import QueueRegistry

from .builders import A100_40, A100_80, T0, make_node, make_pod, make_registry

H = 3600.0


def snap(nodes: list[dict[str, Any]], pods: list[dict[str, Any]], queueing: str = "fifo", **registry: Any) -> ClusterSnapshot:
    reg = make_registry("training", queueing=queueing, **registry)
    return build_snapshot("lab", nodes, pods, reg, now=T0, observed_at=T0, time_scale=1.0)


def waits(s: ClusterSnapshot, queue: str = "training") -> dict[RequestShape, float]:
    (q,) = [q for q in s.queues if q.name == queue]
    return {w.shape: w.seconds for w in q.shape_waits}


def running(name: str, node: str, gpus: int, remaining: float) -> dict[str, Any]:
    """A pod on `node` that started 60 s ago and expects `remaining` more seconds."""
    return make_pod(name, node=node, gpus=gpus, started=T0 - 60, expected=remaining + 60)


def pending(name: str, gpus: int, seconds: float, age: float, **kw: Any) -> dict[str, Any]:
    return make_pod(name, gpus=gpus, expected=seconds, created=T0 - age, **kw)


# --------------------------------------------------------------------------- by hand, FIFO


def test_a_gang_of_8_behind_two_4_gpu_jobs_waits_for_a_whole_node_to_drain() -> None:
    """Two 8-GPU nodes. x runs 8 GPUs for 1 h more; y runs 4 GPUs for 2 h more. In line, in
    arrival order: j1 (4 GPUs, 3 h), then j2 (4 GPUs, 1 h).
    j1 fits on y now (0-3 h). j2 finds no 4 free until x drains at 1 h (1-2 h on x).
    A one-GPU request: strict FIFO, not before j2's start: at 1 h, x has 4 free -> 1 h.
    A gang of 8 on one node: at 2 h y's running pod and j2 end, x has 8 free -> 2 h.
    Both nodes whole (2 x 8): y keeps j1 until 3 h -> 3 h."""
    nodes = [make_node("x"), make_node("y")]
    pods = [
        running("rx", "x", 8, 1 * H),
        running("ry", "y", 4, 2 * H),
        pending("j1", 4, 3 * H, age=600),
        pending("j2", 4, 1 * H, age=300),
    ]
    got = waits(snap(nodes, pods))
    assert got[RequestShape(gpus=1)] == 1 * H
    assert got[RequestShape(gpus=8, gpu_product=A100_80, pool="train")] == 2 * H
    assert got[RequestShape(gpus=8, workers=2, gpu_product=A100_80, pool="train")] == 3 * H
    (q,) = [q for q in snap(nodes, pods).queues if q.name == "training"]
    assert q.estimated_wait_seconds == 1 * H  # the single wait is the one-GPU shape's


def test_strict_fifo_gives_no_hole_that_backfilling_would() -> None:
    """Nodes a and b, 4 GPUs each. a runs 4 GPUs for 1 h; b runs 2 GPUs for 3 h. In line: p1, p2
    (4 GPUs, 2 h each). p1 takes a at 1 h (to 3 h); p2 waits for 3 h, when a and b both free,
    and takes a (best fit ties go to node order), to 5 h.
    FIFO: one GPU and one whole node start at 3 h (b), nothing earlier; 2 x 4 at 5 h.
    Best effort: b's 2 free GPUs are a hole the pending pods cannot use: one GPU starts now."""
    nodes = [make_node("a", gpus=4), make_node("b", gpus=4)]
    pods = [
        running("ra", "a", 4, 1 * H),
        running("rb", "b", 2, 3 * H),
        pending("p1", 4, 2 * H, age=600),
        pending("p2", 4, 2 * H, age=300),
    ]
    fifo = waits(snap(nodes, pods))
    assert fifo[RequestShape(gpus=1)] == 3 * H
    assert fifo[RequestShape(gpus=4, gpu_product=A100_80, pool="train")] == 3 * H
    assert fifo[RequestShape(gpus=4, workers=2, gpu_product=A100_80, pool="train")] == 5 * H
    best_effort = waits(snap(nodes, pods, queueing="best-effort"))
    assert best_effort[RequestShape(gpus=1)] == 0.0
    assert best_effort[RequestShape(gpus=4, workers=2, gpu_product=A100_80, pool="train")] == 5 * H


def gpu_memory_affinity(min_mib: int) -> dict[str, Any]:
    """What the dispatcher puts on a pod that needs at least `min_mib` per GPU."""
    expr = {"key": "nvidia.com/gpu.memory", "operator": "Gt", "values": [str(min_mib - 1)]}
    return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [{"matchExpressions": [expr]}]}}}


def mixed_cluster() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """big (8 x A100-80GB) and small-0, small-1 (8 x A100-40GB). big runs 8 GPUs for 1000 s more;
    small-0 runs 4 for 500 s more. In line: needs-80 (8 GPUs, 500 s, 80 GB floor), then plain
    (4 GPUs, 2000 s).
    needs-80 can only take big: at 1000 (to 1500). plain, not before 1000: small-0 and small-1
    are both whole then, small-0 comes first (to 3000)."""
    nodes = [make_node("big"), make_node("small-0", product=A100_40, memory_mib=40960),
             make_node("small-1", product=A100_40, memory_mib=40960)]
    needs_80 = pending("needs-80", 8, 500, age=600)
    needs_80["spec"]["affinity"] = gpu_memory_affinity(81920)
    pods = [running("r-big", "big", 8, 1000), running("r-small", "small-0", 4, 500), needs_80, pending("plain", 4, 2000, age=300)]
    return nodes, pods


def test_an_80gb_floor_on_a_mixed_cluster_waits_for_the_80gb_node() -> None:
    nodes, pods = mixed_cluster()
    got = waits(snap(nodes, pods))
    assert got == {
        RequestShape(gpus=1): 1000,  # anything, not before plain's start: small-1 is free
        RequestShape(gpus=1, gpu_product=A100_40, pool="train"): 1000,
        RequestShape(gpus=8, gpu_product=A100_40, pool="train"): 1000,
        RequestShape(gpus=8, workers=2, gpu_product=A100_40, pool="train"): 3000,  # small-0 frees at 3000
        RequestShape(gpus=1, gpu_product=A100_80, pool="train"): 1500,  # big, after needs-80
        RequestShape(gpus=8, gpu_product=A100_80, pool="train"): 1500,
        RequestShape(gpus=8, workers=3): 3000,  # the largest gang: every node
    }


# --------------------------------------------------------------------------- admission order


def priority_line() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """One 8-GPU node, busy for 100 s. Pending, oldest first: batch (priority -10, 5000 s),
    old (priority 0, 1000 s), urgent (priority 100, 50 s); all 8 GPUs."""
    pods = [
        running("busy", "n", 8, 100),
        pending("batch", 8, 5000, age=900, priority=-10),
        pending("old", 8, 1000, age=600),
        pending("urgent", 8, 50, age=10, priority=100),
    ]
    return [make_node("n")], pods


@pytest.mark.parametrize(
    ("queueing", "wait"),
    [
        # urgent 100-150, old 150-1150; batch is of lower priority than the request: behind it
        ("priority", 1150),
        # arrival order, priority ignored: batch 100-5100, old 5100-6100, urgent 6100-6150
        ("fifo", 6150),
        # the same order as "priority" (nothing here can start early: every pod takes the node)
        ("best-effort", 1150),
    ],
)
def test_the_destinations_admission_order_decides_who_is_ahead(queueing: str, wait: float) -> None:
    nodes, pods = priority_line()
    assert waits(snap(nodes, pods, queueing=queueing))[RequestShape(gpus=1)] == wait


def test_queues_feeding_one_kueue_clusterqueue_share_its_line() -> None:
    nodes = [make_node("n")]
    pods = [running("busy", "n", 8, 100), pending("research-job", 8, 1000, age=60, queue="research")]
    own = make_registry("training", "research", admission="kueue", queueing="fifo")
    s = build_snapshot("lab", nodes, pods, own, now=T0, observed_at=T0, time_scale=1.0)
    assert waits(s)[RequestShape(gpus=1)] == 100  # its own line: research's job is not ahead
    shared = ClusterRegistryEntry(admission="kueue", queueing="fifo", queues=[
        QueueRegistry(name="training", cluster_queue="gpu"), QueueRegistry(name="research", cluster_queue="gpu")])
    s = build_snapshot("lab", nodes, pods, shared, now=T0, observed_at=T0, time_scale=1.0)
    assert waits(s)[RequestShape(gpus=1)] == 1100
    assert waits(s, "research")[RequestShape(gpus=1)] == 1100


def test_a_strict_line_stuck_behind_an_unknown_duration_falls_back_to_the_default() -> None:
    pods = [running("busy", "n", 8, 100), make_pod("unknown", gpus=8, created=T0 - 60)]
    (q,) = [q for q in snap([make_node("n")], pods).queues if q.name == "training"]
    assert {(w.seconds, w.source) for w in q.shape_waits} == {(3600.0, "default")}


def test_a_jobs_pending_pods_are_one_gang_under_a_strict_order() -> None:
    """Two 8-GPU nodes, x busy for 1 h. A Job of two 8-GPU pods (1 h) is ahead: as a gang it
    needs both nodes, at 1 h (to 2 h); a one-GPU request after it waits 2 h. Pod by pod (best
    effort), one pod starts on y now and the request waits for the other's end on x, at 2 h too,
    but an 8-GPU request would find y free at 1 h."""
    nodes = [make_node("x"), make_node("y")]
    gang = [pending(f"g-{k}", 8, H, age=60, job="gang") for k in range(2)]
    pods = [running("busy", "x", 8, H), *gang]
    assert waits(snap(nodes, pods))[RequestShape(gpus=1)] == 2 * H
    assert waits(snap(nodes, pods))[RequestShape(gpus=8, gpu_product=A100_80, pool="train")] == 2 * H
    assert waits(snap(nodes, pods, queueing="best-effort"))[RequestShape(gpus=8, gpu_product=A100_80, pool="train")] == 1 * H


# --------------------------------------------------------------------------- the pure function


def test_shape_waits_on_plain_data() -> None:
    slots = [Slot("x", 8, A100_80, "train"), Slot("y", 8, A100_80, "train")]
    holds = [Hold("x", 8, 3600.0), Hold("y", 4, 7200.0)]
    ahead = [Demand(4, 3 * H), Demand(4, 1 * H)]
    shapes = [RequestShape(gpus=1), RequestShape(gpus=8), RequestShape(gpus=8, workers=2), RequestShape(gpus=16)]
    assert shape_waits(slots, holds, ahead, shapes, "fifo") == [1 * H, 2 * H, 3 * H, None]  # no node has 16


def test_a_tie_in_best_fit_goes_to_the_first_node_in_node_order() -> None:
    """Two idle 8-GPU nodes of different models: the 8-GPU job ahead takes the first (as
    `ClusterModel.plan` and the scheduler's best fit then node order do), so the second model's
    node is the one free now."""
    slots = [Slot("a", 8, A100_80), Slot("v", 8, "Tesla-V100-SXM2-32GB")]
    shapes = [RequestShape(gpus=8, gpu_product=A100_80), RequestShape(gpus=8, gpu_product="Tesla-V100-SXM2-32GB")]
    assert shape_waits(slots, [], [Demand(8, 1 * H)], shapes, "fifo") == [1 * H, 0.0]
    slots.reverse()  # node order decides, not the model
    assert shape_waits(slots, [], [Demand(8, 1 * H)], shapes, "fifo") == [0.0, 1 * H]


def test_a_layout_made_once_gives_the_same_waits_and_one_of_other_slots_is_not_used() -> None:
    slots = [Slot("x", 8, A100_80, "train"), Slot("y", 4, A100_40, "dev")]
    shapes = request_shapes(slots)
    layout = wait_layout(slots, shapes)
    cases = [
        ([Hold("x", 8, 600.0)], [Demand(4, 1 * H), Demand(8, 2 * H, workers=1)]),
        ([Hold("y", 2, 60.0), Hold("gone", 8, 60.0)], [Demand(2, H, nodes=frozenset({"y"})), Demand(4, H, workers=2)]),
        ([], [Demand(16, H)]),  # never fits: skipped
    ]
    for holds, ahead in cases:  # one layout over several snapshots, as the replay and inventory use it
        assert shape_waits(slots, holds, ahead, shapes, "fifo", layout=layout) == shape_waits(slots, holds, ahead, shapes, "fifo")
    other = [Slot("z", 2, A100_80)]
    assert shape_waits(other, [], [Demand(2, H)], request_shapes(other), "fifo", layout=layout) == [H, H]


def test_published_shapes_of_a_homogeneous_and_a_mixed_cluster() -> None:
    same = [Slot(f"n{i}", 8, A100_80, "train") for i in range(3)]
    assert request_shapes(same) == [
        RequestShape(gpus=1),
        RequestShape(gpus=8, gpu_product=A100_80, pool="train"),
        RequestShape(gpus=8, workers=3, gpu_product=A100_80, pool="train"),
    ]
    mixed = [Slot("a", 8, A100_80, "train"), Slot("v0", 8, "Tesla-V100", "dev"), Slot("v1", 8, "Tesla-V100", "dev"), Slot("l", 4, "L4", "dev")]
    assert request_shapes(mixed) == [
        RequestShape(gpus=1),
        RequestShape(gpus=1, gpu_product="L4", pool="dev"),
        RequestShape(gpus=4, gpu_product="L4", pool="dev"),
        RequestShape(gpus=1, gpu_product=A100_80, pool="train"),
        RequestShape(gpus=8, gpu_product=A100_80, pool="train"),
        RequestShape(gpus=1, gpu_product="Tesla-V100", pool="dev"),
        RequestShape(gpus=8, gpu_product="Tesla-V100", pool="dev"),
        RequestShape(gpus=8, workers=2, gpu_product="Tesla-V100", pool="dev"),
        RequestShape(gpus=8, workers=3),
    ]
    assert request_shapes([]) == [RequestShape(gpus=1)]


def test_waits_per_shape_that_only_age_are_no_news_but_a_departure_is() -> None:
    nodes = [make_node("x"), make_node("y")]
    pods = [running("rx", "x", 8, 1 * H), running("ry", "y", 4, 2 * H), pending("j1", 4, 3 * H, age=600)]
    reg = make_registry("training", queueing="fifo")
    old = build_snapshot("lab", nodes, pods, reg, now=T0, observed_at=T0, time_scale=1.0)
    later = build_snapshot("lab", nodes, pods, reg, now=T0 + 600, observed_at=T0 + 600, time_scale=1.0)
    assert waits(later) != waits(old) and not snapshot_changed(old, later)
    # y's pod ends early: the 8-GPU shape's wait moves by more than its ageing
    early = [running("rx", "x", 8, 1 * H), pending("j1", 4, 3 * H, age=600)]
    moved = build_snapshot("lab", nodes, early, reg, now=T0 + 600, observed_at=T0 + 600, time_scale=1.0)
    assert snapshot_changed(old, moved)
