"""What the router promises, the Job asks for, by one rule (issue 9, DESIGN §5.5).

Over random Kubernetes nodes and workloads: every node the router counts as eligible is one the
emitted Job's constraints accept, and no other. The nodes go the real way: Kubernetes Node objects
through inventory's snapshot builder, the router's policy, the routing decision's `placement`, the
dispatcher's `build_job`; the judge is the local clusters' scheduler filter (kube-scheduler's
NodeUnschedulable, TaintToleration, NodeAffinity and NodeResourcesFit), which shares no code with
the router's checks.

The nodes include shared GPUs as GPU Feature Discovery labels them (issue 27, defect 3):
time-slicing and MPS (`nvidia.com/gpu.sharing-strategy`, `nvidia.com/gpu.replicas`, optionally the
`-SHARED` product name), MIG under the `single` strategy (`nvidia.com/mig.strategy`, the product
renamed `<model>-MIG-<profile>`, slice memory and count) and under the `mixed` strategy (per-profile
`nvidia.com/mig-<profile>.*` labels beside the GPUs left whole). A shared GPU serves only a workload
that names its mechanism: :func:`gpu_sharing` reads that from the labels alone, sharing no code
with `gpuorch_proto.placement`, and every property checks it too.
"""

from __future__ import annotations

from fractions import Fraction
from typing import Any

import kubernetes_validate
import pytest
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
from gpuorch_proto.storage import StoreConfig
from gpuorch_proto.workload import Toleration
from gpuorch_router.explain import render_explain
from gpuorch_router.policy import eligible_nodes, route
from tests.inventory.builders import make_node
from tests.support.builders import make_workload

NOW = 1_800_000_000.0
REGISTRY = ClusterRegistryEntry(artifact_stores=["scratch"])
PRODUCTS = [None, "NVIDIA-H100-80GB-HBM3", "NVIDIA-L4", "NVIDIA-A100-SXM4-40GB", "NVIDIA-A100-SXM4-80GB", "Tesla-T4"]
#: MIG profiles GFD names per GPU model: (profile, MiB per slice, slices per GPU)
MIG_PROFILES = {
    "NVIDIA-A100-SXM4-40GB": [("1g.5gb", 4864, 7), ("3g.20gb", 19968, 2)],
    "NVIDIA-H100-80GB-HBM3": [("1g.10gb", 9856, 7), ("3g.40gb", 40192, 2)],
}
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
def node(draw: st.DrawFn, i: int, memory: tuple[int | None, ...] = tuple(MEMORY), plain: bool = False) -> dict[str, Any]:
    """A Node as GFD labels it; `plain`: no pool, taint or cordon (only the GPUs and their sharing)."""
    labels: dict[str, str] = {}
    zone = draw(st.sampled_from([None, "a", "b"]))
    if zone:
        labels["zone"] = zone
    product = draw(st.sampled_from(PRODUCTS))
    gpus = draw(st.sampled_from([0, 1, 2, 4, 8])) if product else 0
    memory_mib = draw(st.sampled_from(memory)) if product else None
    mig = draw(st.sampled_from([None, None, "none", "single", "single", "mixed"])) if product else None
    if mig:
        labels["nvidia.com/mig.strategy"] = mig
    sliced = mig == "single" and draw(st.booleans())
    if sliced:
        # GFD's single strategy: every nvidia.com/gpu is a MIG slice; the labels describe one slice
        product = draw(st.sampled_from(sorted(MIG_PROFILES)))
        profile, memory_mib, per_gpu = draw(st.sampled_from(MIG_PROFILES[product]))
        product = f"{product}-MIG-{profile}"
        gpus = draw(st.sampled_from([1, 2, 4, 8])) * per_gpu
        labels["nvidia.com/gpu.count"] = str(gpus)
    elif mig == "mixed" and product and product in MIG_PROFILES:
        # GFD's mixed strategy: MIG devices are nvidia.com/mig-<profile> resources with their own
        # labels; nvidia.com/gpu is the GPUs left whole, nvidia.com/gpu.count counts every GPU
        for profile, mib, per_gpu in draw(st.lists(st.sampled_from(MIG_PROFILES[product]), max_size=2, unique=True)):
            labels[f"nvidia.com/mig-{profile}.count"] = str(per_gpu)
            labels[f"nvidia.com/mig-{profile}.memory"] = str(mib)
        labels["nvidia.com/gpu.count"] = str(gpus + draw(st.sampled_from([0, 1, 2])))
    share = draw(st.sampled_from([None, None, None, "time-slicing"] if sliced else [None, None, "none", "time-slicing", "time-slicing", "mps"]))
    if share:
        labels["nvidia.com/gpu.sharing-strategy"] = share
    if share in ("time-slicing", "mps") and gpus:
        replicas = draw(st.sampled_from([2, 4]))
        labels["nvidia.com/gpu.replicas"] = str(replicas)
        labels.setdefault("nvidia.com/gpu.count", str(gpus))
        gpus *= replicas  # the device plugin advertises every replica
        if product and not sliced and draw(st.booleans()):
            product += "-SHARED"  # renameByDefault
    return make_node(
        f"n{i}",
        gpus=gpus,
        product=product,
        memory_mib=memory_mib,
        pool=None if plain else draw(st.sampled_from([None, "train", "short"])),
        unschedulable=not plain and draw(st.booleans()) and draw(st.booleans()),
        taints=draw(st.lists(st.sampled_from(TAINTS), max_size=2, unique_by=lambda t: t["key"])) if not plain and draw(st.booleans()) else [],
        labels=labels,
    )


@st.composite
def cluster_nodes(draw: st.DrawFn, gib: float | None = None, plain: bool = False) -> list[dict[str, Any]]:
    """Nodes; with `gib`, GPU memory labels also sit right at the workload's minimum and around it."""
    memory = tuple(MEMORY)
    if gib:
        floor = gpu_memory_floor_mib(gib)
        memory += (floor - 1, floor, floor + 1, int(gib * 1024) - 1, int(gib * 1024))
    n = draw(st.integers(min_value=1, max_value=8))
    return [draw(node(i, memory, plain)) for i in range(n)]


SHARING = ["time-slicing", "mps", "mig", "mig:1g.5gb", "mig:3g.20gb", "mig:1g.10gb", None]


@st.composite
def gpu_workload(draw: st.DrawFn) -> Workload:
    """Only GPUs, their sharing, model and memory: the other node checks pass on `plain` nodes."""
    gpus = draw(st.sampled_from([1, 1, 2, 0.5]))
    return make_workload(
        gpus=gpus,
        sharing=draw(st.sampled_from(SHARING)) if gpus <= 1 else None,
        gpu_memory_gib=draw(st.sampled_from([None, None, 4.5, 19, 22.5])),
        accelerators=draw(st.lists(st.sampled_from(["H100", "L4", "A100", "A100-SXM4-40GB"]), max_size=2, unique=True)) if draw(st.booleans()) else [],
        cpu="1",
        memory="1Gi",
    )


@st.composite
def workload(draw: st.DrawFn) -> Workload:
    gpus = draw(st.sampled_from([0, 1, 1, 2, 4, 8, 0.5, 0.5]))
    shared = gpus == 0.5 or (gpus == 1 and draw(st.booleans()))
    sharing = draw(st.sampled_from(SHARING)) if shared else None
    selector = draw(st.sampled_from([{}, {}, {}, {"zone": "a"}, {"kubernetes.io/hostname": "n1"}, {"gpuorch.io/pool": "short"}]))
    workers = draw(st.sampled_from([1, 1, 2]))
    return make_workload(
        gpus=gpus,
        sharing=sharing,
        gpu_memory_gib=draw(st.sampled_from([None, 4.5, 22.5, 40, 80])) if gpus else None,
        accelerators=draw(st.lists(st.sampled_from(["H100", "L4", "A100", "T4", "NVIDIA-L4", "A100-SXM4-80GB", "A100-SXM4-40GB"]), max_size=2, unique=True)) if draw(st.booleans()) else [],
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


def gpu_sharing(labels: dict[str, str]) -> tuple[frozenset[str], str | None]:
    """What shares the GPUs a pod asking for `nvidia.com/gpu` gets on a node, read from GFD's
    labels as its documentation states them: the mechanisms and the MIG profile, if any.

    `single`: every nvidia.com/gpu is a MIG slice, the product renamed `<model>-MIG-<profile>`;
    `mixed`: nvidia.com/gpu is the GPUs left whole (slices are other resources); time-slicing and
    MPS: `nvidia.com/gpu.sharing-strategy`.
    """
    mechanisms = set()
    profile = None
    if labels.get("nvidia.com/mig.strategy") == "single":
        mechanisms.add("mig")
        product = labels.get("nvidia.com/gpu.product", "")
        if "-MIG-" in product:
            profile = product.rsplit("-MIG-", 1)[1]
    if labels.get("nvidia.com/gpu.sharing-strategy") in ("time-slicing", "mps"):
        mechanisms.add(labels["nvidia.com/gpu.sharing-strategy"])
    return frozenset(mechanisms), profile


def assert_sharing_rule(wl: Workload, nodes: list[dict[str, Any]], chosen: frozenset[str]) -> None:
    """Issue 27, defect 3: a shared GPU serves only a workload that names that mechanism (and a
    MIG request only slices of its profile); whole GPUs go to nodes nobody shares."""
    res = wl.spec.resources
    if not res.gpus:
        return
    labels = {n["metadata"]["name"]: n["metadata"]["labels"] for n in nodes}
    for name in chosen:
        mechanisms, profile = gpu_sharing(labels[name])
        if res.sharing is None:
            assert not mechanisms, f"{name}: whole GPUs asked for, the node's are shared by {sorted(mechanisms)}"
        else:
            assert mechanisms == {res.sharing.mechanism}, f"{name}: {res.sharing} asked for, shared by {sorted(mechanisms)}"
            if res.sharing.mechanism == "mig" and res.sharing.profile:
                assert profile == res.sharing.profile, f"{name}: MIG {res.sharing.profile} asked for, slices {profile}"


ENV = dispatch.Environment(registry={"c": REGISTRY}, stores={"scratch": StoreConfig(url="s3://bucket/scratch")})


def job_for(wl: Workload, placement: Placement | None, queue: str | None = None) -> dict[str, Any]:
    """The dispatcher's Job for attempt 1 on cluster `c`, with the router's placement."""
    return dispatch.build_job(
        wl, "w-1", "w-1-a1", 1, "c", queue, ENV, resume_from=None, placement=placement,
    )


def assert_router_and_job_agree(wl: Workload, nodes: list[dict[str, Any]]) -> None:
    snap = build_snapshot("c", nodes, [], REGISTRY, now=NOW, observed_at=NOW, time_scale=1.0)
    decision = route(wl, "w-1", {"c": snap}, NOW)
    promised = eligible_nodes(wl, snap)
    assert_sharing_rule(wl, nodes, promised)
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
            assert_sharing_rule(wl, nodes, accepted)
            gang = wl.spec.resources.workers > 1
            assert gang or not accepted, decision.summary


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_every_node_the_router_counts_the_job_accepts_and_no_other(data: st.DataObject) -> None:
    wl = data.draw(workload(), label="workload")
    assert_router_and_job_agree(wl, data.draw(cluster_nodes(wl.spec.resources.gpu_memory_gib), label="nodes"))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_shared_and_whole_gpus_the_router_counts_the_job_accepts_and_no_other(data: st.DataObject) -> None:
    """The same over nodes and workloads that differ only in their GPUs (issue 27, defect 3): whole
    requests, time-slicing, MPS and MIG requests with and without a profile, on whole, time-sliced,
    MPS and MIG (single and mixed) nodes, so that most examples reach the sharing checks."""
    wl = data.draw(gpu_workload(), label="workload")
    assert_router_and_job_agree(wl, data.draw(cluster_nodes(wl.spec.resources.gpu_memory_gib, plain=True), label="nodes"))


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


# ---- issue 27, defect 3: whole-GPU requests on shared GPUs -----------------------------------------

L4_TIME_SLICED = make_node(
    "ts0", gpus=16, product="NVIDIA-L4", memory_mib=23034,
    labels={"nvidia.com/gpu.sharing-strategy": "time-slicing", "nvidia.com/gpu.replicas": "4", "nvidia.com/gpu.count": "4"},
)
A100_MIG_1G = make_node(
    "mig0", gpus=28, product="NVIDIA-A100-SXM4-40GB-MIG-1g.5gb", memory_mib=4864,
    labels={"nvidia.com/mig.strategy": "single", "nvidia.com/gpu.count": "28"},
)
A100_MIG_3G = make_node(
    "mig1", gpus=8, product="NVIDIA-A100-SXM4-40GB-MIG-3g.20gb", memory_mib=19968,
    labels={"nvidia.com/mig.strategy": "single", "nvidia.com/gpu.count": "8"},
)
A100_WHOLE = make_node("a0", gpus=4, product="NVIDIA-A100-SXM4-40GB", memory_mib=40960)
L4_WHOLE = make_node("l0", gpus=4, product="NVIDIA-L4", memory_mib=23034)


def _routed_nodes(wl: Workload, nodes: list[dict[str, Any]]) -> tuple[str, frozenset[str], frozenset[str]]:
    """The outcome, the nodes the router counts, and the nodes the emitted Job accepts."""
    snap = build_snapshot("c", nodes, [], REGISTRY, now=NOW, observed_at=NOW, time_scale=1.0)
    decision = route(wl, "w-1", {"c": snap}, NOW)
    placement = decision.placement or placement_for(
        wl.spec.resources, wl.spec.requirements, (n["metadata"]["labels"].get("nvidia.com/gpu.product") for n in nodes)
    )
    manifest = job_for(wl, placement, decision.queue)
    if decision.outcome == "routed":
        kubernetes_validate.validate(manifest, "1.33.0", strict=True)
    return decision.outcome, eligible_nodes(wl, snap), job_accepts(manifest, nodes)


@pytest.mark.parametrize(
    ("wl", "nodes", "outcome", "nodes_taken"),
    [
        pytest.param(make_workload(gpus=1, accelerators=["NVIDIA-L4"]), [L4_TIME_SLICED], "rejected", set(),
                     id="the issue: 1 whole NVIDIA-L4 is not a quarter of a time-sliced L4"),
        pytest.param(make_workload(gpus=1, accelerators=["NVIDIA-L4"]), [L4_TIME_SLICED, L4_WHOLE], "routed", {"l0"},
                     id="whole L4s beside time-sliced ones: only the whole ones"),
        pytest.param(make_workload(gpus=1, accelerators=["A100-SXM4-40GB"]), [A100_MIG_1G], "rejected", set(),
                     id="the issue: an A100-SXM4-40GB is not a 1g.5gb MIG slice of one"),
        pytest.param(make_workload(gpus=1, accelerators=["A100-SXM4-40GB"]), [A100_MIG_1G, A100_WHOLE], "routed", {"a0"},
                     id="whole A100s beside MIG slices: only the whole ones"),
        pytest.param(make_workload(gpus=1, sharing="mig:1g.5gb"), [A100_MIG_1G, A100_MIG_3G, A100_WHOLE], "routed", {"mig0"},
                     id="a MIG 1g.5gb request: only slices of that profile"),
        pytest.param(make_workload(gpus=1, sharing="mig:3g.20gb", accelerators=["A100-SXM4-40GB"]), [A100_MIG_1G, A100_MIG_3G, A100_WHOLE], "routed", {"mig1"},
                     id="a MIG 3g.20gb request naming the model: slices of that profile of that model"),
        pytest.param(make_workload(gpus=1, sharing="mig:2g.10gb"), [A100_MIG_1G, A100_MIG_3G], "rejected", set(),
                     id="a MIG profile no node has: nowhere"),
        pytest.param(make_workload(gpus=0.5, sharing="time-slicing"), [L4_TIME_SLICED, L4_WHOLE, A100_MIG_1G], "routed", {"ts0"},
                     id="a time-slicing request: time-sliced GPUs only"),
        pytest.param(make_workload(gpus=1, sharing="mps"), [L4_TIME_SLICED, L4_WHOLE], "rejected", set(),
                     id="an MPS request: not time-sliced GPUs"),
    ],
)
def test_shared_gpus_serve_only_workloads_that_name_their_sharing(
    wl: Workload, nodes: list[dict[str, Any]], outcome: str, nodes_taken: set[str]
) -> None:
    got, promised, accepted = _routed_nodes(wl, nodes)
    assert (got, promised, accepted) == (outcome, nodes_taken, nodes_taken)


def test_mig_mixed_strategy_whole_gpus_are_whole_and_slices_are_not_requested() -> None:
    """`mixed`: `nvidia.com/gpu` is the GPUs left whole (2 of 4 here), the slices are
    `nvidia.com/mig-1g.5gb` resources a Job of gpuorch does not ask for."""
    mixed = make_node(
        "mx0", gpus=2, product="NVIDIA-A100-SXM4-40GB", memory_mib=40960,
        labels={"nvidia.com/mig.strategy": "mixed", "nvidia.com/gpu.count": "4", "nvidia.com/mig-1g.5gb.count": "14", "nvidia.com/mig-1g.5gb.memory": "4864"},
    )
    assert _routed_nodes(make_workload(gpus=2), [mixed])[:2] == ("routed", {"mx0"})
    assert _routed_nodes(make_workload(gpus=4), [mixed]) == ("rejected", set(), set())  # 2 whole GPUs, not 4
    assert _routed_nodes(make_workload(gpus=1, sharing="mig:1g.5gb"), [mixed]) == ("rejected", set(), set())


def test_explain_says_the_gpus_are_shared_and_what_to_do() -> None:
    world = {
        "ts": build_snapshot("ts", [L4_TIME_SLICED], [], REGISTRY, now=NOW, observed_at=NOW, time_scale=1.0),
        "mig": build_snapshot("mig", [A100_MIG_1G], [], REGISTRY, now=NOW, observed_at=NOW, time_scale=1.0),
        "mps": build_snapshot("mps", [make_node("p0", gpus=8, product="NVIDIA-L4", memory_mib=23034, labels={"nvidia.com/gpu.sharing-strategy": "mps"})], [], REGISTRY, now=NOW, observed_at=NOW, time_scale=1.0),
    }
    decision = route(make_workload(gpus=1), "w-1", world, NOW)
    assert decision.outcome == "rejected"
    text = render_explain(decision)
    assert "GPU_SHARED: time-sliced, the workload asks for whole GPUs" in text, text
    assert "GPU_SHARED: MIG slices (1g.5gb), the workload asks for whole GPUs" in text, text
    assert "GPU_SHARED: shared by MPS, the workload asks for whole GPUs" in text, text
    assert "-> name the sharing mechanism in resources.sharing" in text, text
