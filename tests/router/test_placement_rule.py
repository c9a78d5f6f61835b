"""What the router promises, the Job asks for, by one rule (issue 9, DESIGN §5.5).

Over random Kubernetes nodes and workloads: every node the router counts as eligible is one the
emitted Job's constraints accept, and no other. The nodes go the real way: Kubernetes Node objects
through inventory's snapshot builder, the router's policy, the routing decision's `placement`, the
dispatcher's `build_job`; the judge is the local clusters' scheduler filter (kube-scheduler's
NodeUnschedulable, TaintToleration, NodeAffinity and NodeResourcesFit), which shares no code with
the router's checks.
"""

from __future__ import annotations

from fractions import Fraction
from typing import Any

import kubernetes_validate
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpuorch_dispatcher import core as dispatch
from gpuorch_inventory.core import build_snapshot
from gpuorch_localkube.objects import pod_requests
from gpuorch_localkube.quantity import parse_quantity
from gpuorch_localkube.scheduler import NodeInfo as SchedNode
from gpuorch_localkube.scheduler import _filter
from gpuorch_proto import ClusterRegistryEntry, Workload
from gpuorch_proto.placement import Placement, accepts, gpu_memory_floor_mib, placement_for
from gpuorch_proto.workload import Toleration
from gpuorch_router.policy import eligible_nodes, route
from tests.inventory.builders import make_node
from tests.support.builders import make_workload

NOW = 1_800_000_000.0
REGISTRY = ClusterRegistryEntry(artifact_stores=["scratch"])
PRODUCTS = [None, "NVIDIA-H100-80GB-HBM3", "NVIDIA-L4", "NVIDIA-A100-SXM4-40GB", "NVIDIA-A100-SXM4-80GB", "Tesla-T4"]
MEMORY = [None, 23034, 40960, 81559, 81920]
TAINTS = [
    {"key": "dedicated", "value": "gpu", "effect": "NoSchedule"},
    {"key": "gpuorch.io/short-only", "effect": "NoSchedule"},
    {"key": "maintenance", "effect": "PreferNoSchedule"},
    {"key": "evict", "value": "x", "effect": "NoExecute"},
]
TOLERATIONS = [
    Toleration(key="dedicated", operator="Equal", value="gpu", effect="NoSchedule"),
    Toleration(key="gpuorch.io/short-only", operator="Exists"),
    Toleration(key="evict", operator="Equal", value="y"),
    Toleration(operator="Exists", effect="NoExecute"),
]


@st.composite
def node(draw: st.DrawFn, i: int, memory: tuple[int | None, ...] = tuple(MEMORY)) -> dict[str, Any]:
    labels: dict[str, str] = {}
    zone = draw(st.sampled_from([None, "a", "b"]))
    if zone:
        labels["zone"] = zone
    mig = draw(st.sampled_from([None, "none", "single"]))
    if mig:
        labels["nvidia.com/mig.strategy"] = mig
    share = draw(st.sampled_from([None, "none", "time-slicing", "mps"]))
    if share:
        labels["nvidia.com/gpu.sharing-strategy"] = share
    product = draw(st.sampled_from(PRODUCTS))
    return make_node(
        f"n{i}",
        gpus=draw(st.sampled_from([0, 1, 2, 4, 8])) if product else 0,
        product=product,
        memory_mib=draw(st.sampled_from(memory)) if product else None,
        pool=draw(st.sampled_from([None, "train", "short"])),
        unschedulable=draw(st.booleans()) and draw(st.booleans()),
        taints=draw(st.lists(st.sampled_from(TAINTS), max_size=2, unique_by=lambda t: t["key"])) if draw(st.booleans()) else [],
        labels=labels,
    )


@st.composite
def cluster_nodes(draw: st.DrawFn, gib: float | None = None) -> list[dict[str, Any]]:
    """Nodes; with `gib`, GPU memory labels also sit right at the workload's minimum and around it."""
    memory = tuple(MEMORY)
    if gib:
        floor = gpu_memory_floor_mib(gib)
        memory += (floor - 1, floor, floor + 1, int(gib * 1024) - 1, int(gib * 1024))
    n = draw(st.integers(min_value=1, max_value=8))
    return [draw(node(i, memory)) for i in range(n)]


@st.composite
def workload(draw: st.DrawFn) -> Workload:
    gpus = draw(st.sampled_from([0, 1, 2, 4, 8, 0.5]))
    sharing = draw(st.sampled_from(["time-slicing", "mig", "mps"])) if gpus == 0.5 else None
    selector = draw(st.sampled_from([{}, {}, {}, {"zone": "a"}, {"kubernetes.io/hostname": "n1"}, {"gpuorch.io/pool": "short"}]))
    workers = draw(st.sampled_from([1, 1, 2]))
    return make_workload(
        gpus=gpus,
        sharing=sharing,
        gpu_memory_gib=draw(st.sampled_from([None, 22.5, 40, 80])) if gpus else None,
        accelerators=draw(st.lists(st.sampled_from(["H100", "L4", "A100", "T4", "NVIDIA-L4", "A100-SXM4-80GB"]), max_size=2, unique=True)) if draw(st.booleans()) else [],
        pools=draw(st.lists(st.sampled_from(["train", "short"]), max_size=2, unique=True)) if draw(st.booleans()) else [],
        node_selector=selector,
        tolerations=draw(st.lists(st.sampled_from(TOLERATIONS), max_size=3, unique=True)),
        workers=workers,
        same_node=workers > 1 and draw(st.booleans()),
        cpu="1",
        memory="1Gi",
    )


def _scheduler_node(obj: dict[str, Any]) -> SchedNode:
    alloc = {k: Fraction(parse_quantity(v)) for k, v in obj["status"]["allocatable"].items()}
    return SchedNode(
        name=obj["metadata"]["name"],
        labels=obj["metadata"]["labels"],
        taints=list(obj["spec"].get("taints") or []),
        unschedulable=bool(obj["spec"].get("unschedulable")),
        allocatable=alloc,
    )


def job_accepts(manifest: dict[str, Any], nodes: list[dict[str, Any]]) -> frozenset[str]:
    """The nodes on which the scheduler would place one of the Job's pods, on an empty cluster."""
    pod = {"metadata": {}, "spec": manifest["spec"]["template"]["spec"]}
    req = pod_requests(pod)
    return frozenset(n["metadata"]["name"] for n in nodes if not _filter(pod, req, _scheduler_node(n)))


ENV = dispatch.Environment(registry={"c": REGISTRY}, store_roots={}, data_roots={}, cache_roots={})


def job_for(wl: Workload, placement: Placement | None, queue: str | None = None) -> dict[str, Any]:
    """The dispatcher's Job for attempt 1 on cluster `c`, with the router's placement."""
    return dispatch.build_job(
        wl, "w-1", "w-1-a1", 1, "c", queue, ENV, output_path="/o", checkpoint_path="/c", resume_from=None, placement=placement,
    )


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_every_node_the_router_counts_the_job_accepts_and_no_other(data: st.DataObject) -> None:
    wl = data.draw(workload(), label="workload")
    nodes = data.draw(cluster_nodes(wl.spec.resources.gpu_memory_gib), label="nodes")
    snap = build_snapshot("c", nodes, [], REGISTRY, now=NOW, observed_at=NOW, time_scale=1.0)
    decision = route(wl, "w-1", {"c": snap}, NOW)
    promised = eligible_nodes(wl, snap)
    if decision.outcome == "routed":
        assert decision.placement is not None
        manifest = job_for(wl, decision.placement, decision.queue)
        kubernetes_validate.validate(manifest, "1.33.0", strict=True)
        assert job_accepts(manifest, nodes) == promised, decision.summary
        assert promised  # routed: at least one node can take a pod
    else:
        # the same rule for a cluster it did not choose: the Job would accept exactly the nodes the
        # router counts (none, when its node checks fail)
        placement = placement_for(wl.spec.resources, wl.spec.requirements, (n["metadata"]["labels"].get("nvidia.com/gpu.product") for n in nodes))
        manifest = job_for(wl, placement)
        accepted = job_accepts(manifest, nodes)
        if promised:  # node checks passed; the cluster failed on the gang's size or another check
            assert accepted == promised
        elif wl.spec.resources.gpus == int(wl.spec.resources.gpus) or wl.spec.resources.sharing:
            # every node refused by a node check: the Job fits no node either (unless only the gang
            # did not fit, which leaves per-pod fits the router does not count as a placement)
            gang = wl.spec.resources.workers > 1
            assert gang or not accepted, decision.summary


def test_80_gib_workload_on_h100_80gb_nodes_is_routed_and_schedulable() -> None:
    """Defect 1: the router accepted 81559 MiB for 80 GiB, the Job asked for > 81919 MiB."""
    nodes = [make_node("h0", gpus=8, product="NVIDIA-H100-80GB-HBM3", memory_mib=81559)]
    wl = make_workload(gpus=8, gpu_memory_gib=80)
    snap = build_snapshot("c", nodes, [], REGISTRY, now=NOW, observed_at=NOW, time_scale=1.0)
    decision = route(wl, "w-1", {"c": snap}, NOW)
    assert decision.outcome == "routed" and decision.placement is not None
    manifest = job_for(wl, decision.placement)
    assert job_accepts(manifest, nodes) == {"h0"}
    assert gpu_memory_floor_mib(80) <= 81559 < 80 * 1024


def test_accelerator_token_is_resolved_to_the_product_the_nodes_carry() -> None:
    """Defect 2: `accelerators: [L4]` matched NVIDIA-L4 in the router but went verbatim to the Job."""
    nodes = [make_node("l0", gpus=4, product="NVIDIA-L4", memory_mib=23034), make_node("t0", gpus=4, product="Tesla-T4", memory_mib=15360)]
    wl = make_workload(gpus=1, accelerators=["L4"])
    snap = build_snapshot("c", nodes, [], REGISTRY, now=NOW, observed_at=NOW, time_scale=1.0)
    decision = route(wl, "w-1", {"c": snap}, NOW)
    assert decision.outcome == "routed" and decision.placement is not None
    manifest = job_for(wl, decision.placement)
    exprs = manifest["spec"]["template"]["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"][0]["matchExpressions"]
    assert {"key": "nvidia.com/gpu.product", "operator": "In", "values": ["NVIDIA-L4"]} in exprs
    assert job_accepts(manifest, nodes) == {"l0"}
    assert accepts(decision.placement, nodes[0]["metadata"]["labels"])
    assert not accepts(decision.placement, nodes[1]["metadata"]["labels"])
