"""The router takes inventory's wait for the workload's shape (docs/routing.md, *Queue wait*): the
smallest published shape that covers the gang on nodes it may use; the queue's single estimate
when a snapshot has none; and `explain` says which."""

from __future__ import annotations

import msgspec
import pytest

from gpuorch_inventory.core import build_snapshot
from gpuorch_proto import ClusterSnapshot, QueueInfo, RequestShape, ShapeWait
from gpuorch_proto.routing import Estimate, RoutingDecision
from gpuorch_router.explain import render_explain
from gpuorch_router.policy import route
from tests.inventory import builders as k8s
from tests.support.builders import (
    A100_40,
    A100_80,
    NOW,
    make_node,
    make_registry,
    make_snapshot,
    make_workload,
)

H = 3600.0
V100 = "Tesla-V100-SXM2-32GB"


def shape(gpus: int, workers: int = 1, product: str | None = None, pool: str | None = None) -> RequestShape:
    return RequestShape(gpus=gpus, workers=workers, gpu_product=product, pool=pool)


def lab(waits: dict[RequestShape, float] | None, single: float = 0.5 * H, name: str = "lab") -> ClusterSnapshot:
    """Two 8 x A100-80GB nodes in pool train, three 8 x V100 in pool dev, every GPU busy, 16 GPUs
    pending; `waits` the published waits per shape (None: an inventory older than them)."""
    nodes = [make_node(f"a{i}", free=0, product=A100_80, pool="train") for i in range(2)]
    nodes += [make_node(f"v{i}", free=0, product=V100, memory_mib=32768, pool="dev") for i in range(3)]
    shaped = [ShapeWait(shape=s, seconds=w) for s, w in (waits or {}).items()]
    queue = QueueInfo(name="default", pending_jobs=2, pending_gpus=16, estimated_wait_seconds=single, shape_waits=shaped)
    return make_snapshot(name, nodes, registry=make_registry(queues=["default"]), queues=[queue])


LAB_WAITS = {
    shape(1): 0.5 * H,
    shape(1, product=A100_80, pool="train"): 2 * H,
    shape(8, product=A100_80, pool="train"): 3 * H,
    shape(8, 2, A100_80, "train"): 6 * H,
    shape(1, product=V100, pool="dev"): 1 * H,
    shape(8, product=V100, pool="dev"): 4 * H,
    shape(8, 3, V100, "dev"): 8 * H,
    shape(8, 5): 9 * H,
}


def estimate_of(d: RoutingDecision, cluster: str = "lab") -> Estimate:
    (v,) = [v for v in d.verdicts if v.cluster == cluster]
    assert v.estimate is not None, v.checks
    return v.estimate


@pytest.mark.parametrize(
    ("workload", "wait", "basis"),
    [
        (make_workload(gpus=1), 0.5 * H, "1 GPU on any node"),
        # an 80 GiB floor: only the A100 nodes; the A100-only one-GPU shape
        (make_workload(gpus=1, gpu_memory_gib=80), 2 * H, f"1 GPU on {A100_80} in pool train"),
        # 4 GPUs: the smallest covering shapes are the full nodes; it takes whichever frees first
        (make_workload(gpus=4), 3 * H, f"8 GPUs on {A100_80} in pool train"),
        (make_workload(gpus=8, pools=["dev"]), 4 * H, f"8 GPUs on {V100} in pool dev"),
        # a gang of 2 x 8: the A100 pool's whole-pool gang (16 GPUs) is the smallest that covers it
        (make_workload(gpus=8, workers=2), 6 * H, f"2 x 8 GPUs on {A100_80} in pool train"),
        (make_workload(gpus=8, workers=4), 9 * H, "5 x 8 GPUs on any node"),
        # bigger than any shape on its nodes (the dev pool's 3 nodes): the largest, said so
        (make_workload(gpus=8, workers=3, pools=["dev"]), 8 * H, f"3 x 8 GPUs on {V100} in pool dev"),
    ],
    ids=["one-gpu", "80gb-floor", "half-node", "full-dev-node", "gang-of-2-nodes", "gang-of-4", "the-dev-pool"],
)
def test_the_wait_of_the_nearest_covering_shape_on_nodes_it_may_use(workload, wait: float, basis: str) -> None:
    est = estimate_of(route(workload, "wl-1", {"lab": lab(LAB_WAITS)}, NOW))
    assert est.queue_wait == wait
    assert basis in est.queue_basis and "queue default" in est.queue_basis


def test_a_request_larger_than_every_shape_on_its_nodes_takes_the_largest_and_says_so() -> None:
    waits = {s: w for s, w in LAB_WAITS.items() if s != shape(8, 2, A100_80, "train")}
    est = estimate_of(route(make_workload(gpus=8, workers=2, gpu_memory_gib=80), "wl-1", {"lab": lab(waits)}, NOW))
    assert est.queue_wait == 3 * H  # one A100 node is all that is published for those nodes
    assert "the largest shape published on its nodes: it asks for more" in est.queue_basis


def test_a_snapshot_without_waits_per_shape_gives_the_single_estimate() -> None:
    for wl in (make_workload(gpus=1), make_workload(gpus=8, workers=2)):
        est = estimate_of(route(wl, "wl-1", {"lab": lab(None)}, NOW))
        assert est.queue_wait == 0.5 * H
        assert est.queue_basis == "queue default: inventory's single estimate (one GPU)"


def test_a_gang_goes_where_its_own_shape_waits_least_not_where_one_gpu_does() -> None:
    """"quick" starts a GPU in 10 min but a whole node only in 6 h; "steady" in 1 h for both. The
    8-GPU job goes to steady; with only the single wait (older inventories) it went to quick."""
    def one_class(name: str, one: float, node: float) -> ClusterSnapshot:
        waits = {shape(1): one, shape(8, product=A100_80, pool="train"): node, shape(8, 2, A100_80, "train"): node}
        queue = QueueInfo(name="default", pending_gpus=8, estimated_wait_seconds=one,
                          shape_waits=[ShapeWait(shape=s, seconds=w) for s, w in waits.items()])
        nodes = [make_node(f"{name}-{i}", free=2) for i in range(2)]
        return make_snapshot(name, nodes, registry=make_registry(queues=["default"]), queues=[queue])

    quick, steady = one_class("quick", 600, 6 * H), one_class("steady", 1 * H, 1 * H)
    job = make_workload(gpus=8)
    assert route(job, "wl-1", {"quick": quick, "steady": steady}, NOW).cluster == "steady"
    old = {s.cluster: msgspec.structs.replace(s, queues=[msgspec.structs.replace(s.queues[0], shape_waits=[])])
           for s in (quick, steady)}
    assert route(job, "wl-1", old, NOW).cluster == "quick"


def test_inventorys_snapshot_of_a_mixed_cluster_gives_an_80gb_job_the_80gb_wait() -> None:
    """inventory's own snapshot of tests/inventory/test_shape_waits.py's mixed cluster (FIFO): a
    new one-GPU request waits 1000 s anywhere, but 1500 s for the 80 GB node."""
    nodes = [k8s.make_node("big"), k8s.make_node("small-0", product=k8s.A100_40, memory_mib=40960),
             k8s.make_node("small-1", product=k8s.A100_40, memory_mib=40960)]
    needs_80 = k8s.make_pod("needs-80", gpus=8, expected=500, created=k8s.T0 - 600)
    expr = {"key": "nvidia.com/gpu.memory", "operator": "Gt", "values": ["81919"]}
    needs_80["spec"]["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": [expr]}]}}}
    pods = [k8s.make_pod("r-big", node="big", gpus=8, started=k8s.T0 - 60, expected=1060),
            k8s.make_pod("r-small", node="small-0", gpus=4, started=k8s.T0 - 60, expected=560),
            needs_80, k8s.make_pod("plain", gpus=4, expected=2000, created=k8s.T0 - 300)]
    registry = k8s.make_registry("default", queueing="fifo", artifact_stores=["scratch", "prod"],
                                 images_cached=[make_workload().spec.image])
    snap = build_snapshot("mixed", nodes, pods, registry, now=k8s.T0, observed_at=k8s.T0, time_scale=1.0)
    plain = estimate_of(route(make_workload(gpus=1), "wl-1", {"mixed": snap}, k8s.T0), "mixed")
    big = estimate_of(route(make_workload(gpus=1, gpu_memory_gib=80), "wl-1", {"mixed": snap}, k8s.T0), "mixed")
    assert (plain.queue_wait, big.queue_wait) == (1000, 1500)
    assert f"1 GPU on {A100_80} in pool train (runtime)" in big.queue_basis
    assert A100_40 not in big.queue_basis


def test_explain_says_which_shapes_wait_each_cluster_used() -> None:
    d = route(make_workload(gpus=1, gpu_memory_gib=80), "wl-1", {"lab": lab(LAB_WAITS), "old": lab(None, name="old")}, NOW)
    text = render_explain(d)
    assert "Queue waits used" in text
    assert f"  lab: queue default: inventory's wait for 1 GPU on {A100_80} in pool train (runtime)" in text
    assert "  old: queue default: inventory's single estimate (one GPU)" in text
