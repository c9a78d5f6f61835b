"""Table-driven routing cases: the seed's scenarios and every eligibility check.

Each case states the whole expected verdict: the outcome, the chosen cluster and queue, and for
every ineligible cluster exactly which checks fail and whether each is capacity-only. A cluster a
case does not list under ``failed`` must be eligible.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest

from gpuorch_proto.inventory import ClusterSnapshot, QueueRegistry, Taint
from gpuorch_proto.resume import CheckpointRef
from gpuorch_proto.routing import RoutingDecision
from gpuorch_proto.validate import validate_workload
from gpuorch_proto.workload import CheckpointPolicy, Preferences, Toleration, Workload
from gpuorch_router.policy import route
from tests.support.builders import (
    A100_40,
    A100_80,
    H100_80,
    NOW,
    make_input,
    make_node,
    make_nodes,
    make_queue,
    make_registry,
    make_snapshot,
    make_workload,
    snapshots,
)

H = 3600.0
IMAGENET_V3 = make_input("imagenet@v3", size_gb=1080, locations=["s3-east"])  # 3 h at 100 MB/s


@dataclass
class Case:
    id: str
    workload: Workload
    clusters: list[ClusterSnapshot]
    outcome: str
    cluster: str | None = None
    queue: str | None = None
    failed: dict[str, dict[str, bool]] = field(default_factory=dict)  # cluster -> {code: capacity_only}
    messages: dict[str, list[str]] = field(default_factory=dict)  # cluster -> substrings of failed messages
    summary: list[str] = field(default_factory=list)
    kwargs: dict[str, Any] = field(default_factory=dict)
    extra: Callable[[RoutingDecision], None] | None = None


def _estimate(decision: RoutingDecision, cluster: str) -> Any:
    verdict = next(v for v in decision.verdicts if v.cluster == cluster)
    assert verdict.estimate is not None, f"{cluster} has no estimate"
    return verdict.estimate


def _seed_times(d: RoutingDecision) -> None:
    primary, spare = _estimate(d, "primary"), _estimate(d, "spare")
    assert primary.queue_wait == 2 * H and primary.data_staging == 0 and primary.run == 1 * H
    assert spare.queue_wait == 0 and spare.data_staging == pytest.approx(3 * H) and spare.run == 1 * H
    assert primary.total < spare.total
    assert spare.total - primary.total == pytest.approx(1 * H)


def _scattered_queues(d: RoutingDecision) -> None:
    assert _estimate(d, "fragmented").queue_wait > 0  # 4 free GPUs exist, but not on one node


def _half_free_gang_queues(d: RoutingDecision) -> None:
    est = _estimate(d, "half")
    assert est.queue_wait == pytest.approx(3600.0 * 8 / 16)  # 8 GPUs backlog on 16 suitable GPUs


def _version_mismatch(d: RoutingDecision) -> None:
    stale_cache = _estimate(d, "has-v2")
    assert stale_cache.data_staging == pytest.approx(3 * H)  # v2 cached is not a hit for v3


def _h100_faster(d: RoutingDecision) -> None:
    assert _estimate(d, "hopper").run == pytest.approx(1 * H)  # 2 h on A100 / speed 2.0
    assert _estimate(d, "ampere").run == pytest.approx(2 * H)


def _pinned_others(d: RoutingDecision) -> None:
    other = next(v for v in d.verdicts if v.cluster == "spare")
    assert [c.code for c in other.checks] == ["PINNED_ELSEWHERE"]


def _rejected_names_all(d: RoutingDecision) -> None:
    for name in ("a-small", "b-short", "c-nocreds"):
        assert f"{name}: " in d.summary
    assert "GPU_CAPACITY" not in d.summary  # it only echoes a-small's GPU_MEMORY failure


def primary_and_spare() -> list[ClusterSnapshot]:
    return [
        make_snapshot(
            "primary",
            nodes=make_nodes("p", 4, free=0),
            queues=[make_queue("training", wait="2h", pending_gpus=16)],
            datasets_cached=["imagenet@v3"],
        ),
        make_snapshot("spare", nodes=make_nodes("s", 4), bandwidth_mbps={"s3-east": 100}),
    ]


CASES = [
    # ---- the seed ----------------------------------------------------------------------------
    Case(
        id="seed: primary 2h queue + 1h run with the dataset cached beats an idle spare needing a 3h copy",
        workload=make_workload(inputs=[IMAGENET_V3]),
        clusters=primary_and_spare(),
        outcome="routed",
        cluster="primary",
        queue="training",
        summary=["primary: 3h2m to result", "queue 2h", "data cached", "vs spare 4h2m", "copy 3h"],
        extra=_seed_times,
    ),
    Case(
        id="seed: an 80 GB requirement excludes an idle cluster of 40 GB GPUs",
        workload=make_workload(gpu_memory_gib=80),
        clusters=[
            make_snapshot("small", nodes=make_nodes("s", 8, product=A100_40, memory_mib=40960)),
            make_snapshot(
                "big", nodes=make_nodes("b", 2, free=0), queues=[make_queue("training", wait="1h")]
            ),
        ],
        outcome="routed",
        cluster="big",
        queue="training",
        failed={"small": {"GPU_MEMORY": False, "GPU_CAPACITY": False}},
        messages={"small": ["needs >= 80 GiB per GPU", "largest here 40 GiB"]},
    ),
    Case(
        id="seed: 4 free GPUs on 4 one-GPU nodes do not fit a 4-GPU one-node shape",
        workload=make_workload(gpus=4),
        clusters=[
            make_snapshot("scattered", nodes=make_nodes("s", 4, gpus=1)),
            make_snapshot(
                "busy", nodes=make_nodes("b", 2, free=0), queues=[make_queue("training", wait="3h")]
            ),
        ],
        outcome="routed",
        cluster="busy",
        failed={"scattered": {"GPU_SHAPE": False, "GPU_CAPACITY": False}},
        messages={"scattered": ["needs 4 GPUs on one node", "largest suitable node has 1"]},
    ),
    Case(
        id="seed: 4 free GPUs scattered over busy 8-GPU nodes queue; a node with 4 free wins",
        workload=make_workload(gpus=4, expected_runtime="1h"),
        clusters=[
            make_snapshot("fragmented", nodes=make_nodes("f", 4, free=1)),
            make_snapshot("whole", nodes=[make_node("w0", free=4), make_node("w1", free=0)]),
        ],
        outcome="routed",
        cluster="whole",
        extra=_scattered_queues,
    ),
    Case(
        id="a gang of 2 x 8 GPUs with one idle and one busy node cannot start now: it queues",
        workload=make_workload(gpus=8, workers=2),
        clusters=[make_snapshot("half", nodes=[make_node("h0"), make_node("h1", free=0)])],
        outcome="routed",
        cluster="half",
        extra=_half_free_gang_queues,
    ),
    Case(
        id="seed: missing credentials make a cluster ineligible",
        workload=make_workload(credentials=["hf-token"]),
        clusters=[
            make_snapshot("nocreds", credentials=[]),
            make_snapshot("creds", credentials=["hf-token"], nodes=make_nodes("c", 1, free=0)),
        ],
        outcome="routed",
        cluster="creds",
        failed={"nocreds": {"CREDENTIALS": False}},
        messages={"nocreds": ["missing credentials hf-token"]},
    ),
    Case(
        id="seed: the short-experiment cluster cannot reach the prod artifact store",
        workload=make_workload(output_store="prod"),
        clusters=[
            make_snapshot("short", artifact_stores=["scratch"]),
            make_snapshot("primary", artifact_stores=["scratch", "prod"], nodes=make_nodes("p", 1, free=0)),
        ],
        outcome="routed",
        cluster="primary",
        failed={"short": {"ARTIFACT_STORE": False}},
        messages={"short": ["cannot reach output store 'prod'", "reaches scratch"]},
    ),
    Case(
        id="seed: imagenet v2 cached is not a hit for v3: staging is counted and the v3 cache wins",
        workload=make_workload(inputs=[IMAGENET_V3]),
        clusters=[
            make_snapshot("has-v2", datasets_cached=["imagenet@v2"], bandwidth_mbps={"s3-east": 100}),
            make_snapshot(
                "has-v3",
                datasets_cached=["imagenet@v3"],
                nodes=make_nodes("h", 1, free=0),
                queues=[make_queue("training", wait="1h")],
            ),
        ],
        outcome="routed",
        cluster="has-v3",
        extra=_version_mismatch,
    ),
    Case(
        id="seed: v2 cached and no path to a v3 replica: input data unreachable, not a cache hit",
        workload=make_workload(inputs=[IMAGENET_V3]),
        clusters=[make_snapshot("has-v2", datasets_cached=["imagenet@v2"])],
        outcome="rejected",
        failed={"has-v2": {"INPUT_DATA": False}},
        messages={"has-v2": ["imagenet@v3: no replica reachable", "cached imagenet@v2 is another version"]},
    ),
    Case(
        id="seed: a pinned target that is ineligible is rejected with its reasons, never a fallback",
        workload=make_workload(queue="short/training", output_store="prod"),
        clusters=[
            make_snapshot("short", registry=make_registry(artifact_stores=["scratch"], queues=["training"])),
            make_snapshot("spare"),
        ],
        outcome="rejected",
        failed={"short": {"ARTIFACT_STORE": False}, "spare": {"PINNED_ELSEWHERE": False}},
        summary=["pinned target short/training is ineligible", "ARTIFACT_STORE"],
        extra=_pinned_others,
    ),
    Case(
        id="seed: half a GPU by time-slicing needs a cluster offering time-slicing",
        workload=make_workload(gpus=0.5, sharing="time-slicing"),
        clusters=[
            make_snapshot("plain"),
            make_snapshot("shared", nodes=[make_node("s0", free=0, sharing=["time-slicing"])]),
        ],
        outcome="routed",
        cluster="shared",
        failed={"plain": {"SHARING": False, "GPU_CAPACITY": False}},
        messages={"plain": ["0.5 GPU per worker needs time-slicing", "no sharing"]},
    ),
    Case(
        id="seed: a MIG slice needs the named profile",
        workload=make_workload(gpus=0.5, sharing="mig:1g.10gb"),
        clusters=[
            make_snapshot("mig-other", nodes=[make_node("m0", sharing=["mig", "mig:3g.40gb"])]),
            make_snapshot("mig-right", nodes=[make_node("m1", sharing=["mig", "mig:1g.10gb"])]),
        ],
        outcome="routed",
        cluster="mig-right",
        failed={"mig-other": {"SHARING": False, "GPU_CAPACITY": False}},
    ),
    Case(
        id="seed: the only suitable cluster is unreachable: wait, do not reject",
        workload=make_workload(gpu_memory_gib=80),
        clusters=[
            make_snapshot("primary", reachable=False, error="connection refused", observed_at=NOW - 600),
            make_snapshot("small", nodes=make_nodes("s", 2, product=A100_40, memory_mib=40960)),
        ],
        outcome="waiting",
        failed={
            "primary": {"CLUSTER_UNREACHABLE": True},
            "small": {"GPU_MEMORY": False, "GPU_CAPACITY": False},
        },
        messages={"primary": ["unreachable: connection refused"]},
        summary=["waiting: primary: CLUSTER_UNREACHABLE", "1 more permanently ineligible"],
    ),
    Case(
        id="seed: every cluster permanently ineligible: rejected with every cluster's reasons",
        workload=make_workload(gpu_memory_gib=80, output_store="prod", credentials=["hf-token"]),
        clusters=[
            make_snapshot(
                "a-small",
                nodes=make_nodes("a", 2, product=A100_40, memory_mib=40960),
                credentials=["hf-token"],
            ),
            make_snapshot("b-short", artifact_stores=["scratch"], credentials=["hf-token"]),
            make_snapshot("c-nocreds"),
        ],
        outcome="rejected",
        failed={
            "a-small": {"GPU_MEMORY": False, "GPU_CAPACITY": False},
            "b-short": {"ARTIFACT_STORE": False},
            "c-nocreds": {"CREDENTIALS": False},
        },
        summary=["rejected: no cluster can run this", "GPU_MEMORY", "ARTIFACT_STORE", "CREDENTIALS"],
        extra=_rejected_names_all,
    ),
    # ---- freshness, allow-list, exclusion ----------------------------------------------------
    Case(
        id="a stale snapshot is capacity-only: waiting",
        workload=make_workload(),
        clusters=[make_snapshot("old", observed_at=NOW - 300)],
        outcome="waiting",
        failed={"old": {"CLUSTER_UNREACHABLE": True}},
        messages={"old": ["stale: observed 300s ago (max 120s)"]},
    ),
    Case(
        id="a never-observed unreachable cluster has no node facts: capacity-only",
        workload=make_workload(),
        clusters=[make_snapshot("new", nodes=[], reachable=False)],
        outcome="waiting",
        failed={"new": {"CLUSTER_UNREACHABLE": True, "GPU_CAPACITY": True}},
    ),
    Case(
        id="an unreachable cluster that also lacks credentials is rejected, not waited for",
        workload=make_workload(credentials=["hf-token"]),
        clusters=[make_snapshot("down", reachable=False)],
        outcome="rejected",
        failed={"down": {"CLUSTER_UNREACHABLE": True, "CREDENTIALS": False}},
    ),
    Case(
        id="requirements.clusters allow-list rules the others out permanently",
        workload=make_workload(clusters=["spare"]),
        clusters=[make_snapshot("primary"), make_snapshot("spare", nodes=make_nodes("s", 1, free=0))],
        outcome="routed",
        cluster="spare",
        failed={"primary": {"CLUSTER_NOT_ALLOWED": False}},
    ),
    Case(
        id="a cluster the caller excludes (lost attempt) is capacity-only; the other is used",
        workload=make_workload(),
        clusters=[make_snapshot("lost"), make_snapshot("other", nodes=make_nodes("o", 1, free=0))],
        kwargs={"exclude": ["lost"]},
        outcome="routed",
        cluster="other",
        failed={"lost": {"CLUSTER_NOT_ALLOWED": True}},
    ),
    Case(
        id="every cluster excluded: waiting",
        workload=make_workload(),
        clusters=[make_snapshot("lost")],
        kwargs={"exclude": {"lost"}},
        outcome="waiting",
        failed={"lost": {"CLUSTER_NOT_ALLOWED": True}},
    ),
    # ---- node checks ---------------------------------------------------------------------------
    Case(
        id="GPU model: an H100-only workload skips the A100 cluster; family name matches the GFD product",
        workload=make_workload(accelerators=["H100"]),
        clusters=[
            make_snapshot("ampere"),
            make_snapshot("hopper", nodes=make_nodes("h", 1, product=H100_80)),
        ],
        outcome="routed",
        cluster="hopper",
        failed={"ampere": {"GPU_MODEL": False, "GPU_CAPACITY": False}},
        messages={"ampere": ["no node has a GPU model in [H100]", A100_80]},
    ),
    Case(
        id="GPU memory: an 80GB H100 reporting 81559 MiB passes an 80 GiB minimum",
        workload=make_workload(gpu_memory_gib=80),
        clusters=[make_snapshot("hopper", nodes=make_nodes("h", 1, product=H100_80, memory_mib=81559))],
        outcome="routed",
        cluster="hopper",
    ),
    Case(
        id="pools: nodes outside requirements.pools do not count",
        workload=make_workload(pools=["train"]),
        clusters=[
            make_snapshot("infer-only", nodes=make_nodes("i", 2, pool="inference")),
            make_snapshot(
                "mixed", nodes=[make_node("m0", pool="inference"), make_node("m1", pool="train", free=0)]
            ),
        ],
        outcome="routed",
        cluster="mixed",
        failed={"infer-only": {"POOL": False, "GPU_CAPACITY": False}},
        messages={"infer-only": ["no node in pools train", "inference (2 nodes)"]},
    ),
    Case(
        id="node selector: labels must all match on one node",
        workload=make_workload(node_selector={"fabric": "infiniband"}),
        clusters=[
            make_snapshot("ethernet", nodes=make_nodes("e", 2, labels={"fabric": "ethernet"})),
            make_snapshot("ib", nodes=make_nodes("i", 2, labels={"fabric": "infiniband"}, free=0)),
        ],
        outcome="routed",
        cluster="ib",
        failed={"ethernet": {"NODE_SELECTOR": False, "GPU_CAPACITY": False}},
    ),
    Case(
        id="node selector on the hostname label picks that node's class",
        workload=make_workload(gpus=8, node_selector={"kubernetes.io/hostname": "n-1"}),
        clusters=[make_snapshot("c", nodes=[make_node("n-0"), make_node("n-1", gpus=4)])],
        outcome="rejected",
        failed={"c": {"GPU_SHAPE": False, "GPU_CAPACITY": False}},
    ),
    Case(
        id="taints: an untolerated NoSchedule taint rules a node out; PreferNoSchedule does not",
        workload=make_workload(),
        clusters=[
            make_snapshot("reserved", nodes=make_nodes("r", 2, taints=[Taint(key="team", value="vision")])),
            make_snapshot(
                "soft",
                nodes=make_nodes("s", 1, free=0, taints=[Taint(key="x", effect="PreferNoSchedule")]),
            ),
        ],
        outcome="routed",
        cluster="soft",
        failed={"reserved": {"TAINTS": False, "GPU_CAPACITY": False}},
        messages={"reserved": ["team=vision:NoSchedule"]},
    ),
    Case(
        id="taints: a matching toleration makes the tainted cluster eligible",
        workload=make_workload(tolerations=[Toleration(key="team", operator="Equal", value="vision")]),
        clusters=[
            make_snapshot("reserved", nodes=make_nodes("r", 2, taints=[Taint(key="team", value="vision")]))
        ],
        outcome="routed",
        cluster="reserved",
    ),
    Case(
        id="taints: a toleration for another value of the key does not tolerate",
        workload=make_workload(tolerations=[Toleration(key="team", operator="Equal", value="speech")]),
        clusters=[
            make_snapshot("reserved", nodes=make_nodes("r", 2, taints=[Taint(key="team", value="vision")]))
        ],
        outcome="rejected",
        failed={"reserved": {"TAINTS": False, "GPU_CAPACITY": False}},
    ),
    Case(
        id="taints: an Exists toleration with no key tolerates everything",
        workload=make_workload(tolerations=[Toleration(operator="Exists")]),
        clusters=[
            make_snapshot("reserved", nodes=make_nodes("r", 2, taints=[Taint(key="team", value="vision")]))
        ],
        outcome="routed",
        cluster="reserved",
    ),
    Case(
        id="same_node gang: 2 workers x 4 GPUs need 8 GPUs on one node",
        workload=make_workload(gpus=4, workers=2, same_node=True),
        clusters=[
            make_snapshot("four-gpu-nodes", nodes=make_nodes("f", 4, gpus=4)),
            make_snapshot("eight", nodes=make_nodes("e", 1, free=0)),
        ],
        outcome="routed",
        cluster="eight",
        failed={"four-gpu-nodes": {"GPU_SHAPE": False, "GPU_CAPACITY": False}},
        messages={"four-gpu-nodes": ["needs 8 GPUs (2 workers x 4) on one node"]},
    ),
    Case(
        id="a gang never spans clusters: 3 workers x 8 GPUs do not fit two 2-node clusters",
        workload=make_workload(gpus=8, workers=3),
        clusters=[make_snapshot("a", nodes=make_nodes("a", 2)), make_snapshot("b", nodes=make_nodes("b", 2))],
        outcome="rejected",
        failed={
            "a": {"GANG_SPLIT": False, "GPU_CAPACITY": False},
            "b": {"GANG_SPLIT": False, "GPU_CAPACITY": False},
        },
        messages={"a": ["needs 3 worker slots; this cluster has 2 in total"]},
    ),
    Case(
        id="suitable nodes exist but are NotReady: capacity-only, waiting",
        workload=make_workload(gpus=8, workers=2),
        clusters=[make_snapshot("degraded", nodes=[make_node("d0"), make_node("d1", ready=False)])],
        outcome="waiting",
        failed={"degraded": {"GPU_CAPACITY": True}},
        messages={"degraded": ["only 1 of 2 suitable nodes are Ready"]},
    ),
    Case(
        id="CPU: idle nodes with 16 free cores cannot host a 32-core worker (permanent)",
        workload=make_workload(cpu="32"),
        clusters=[make_snapshot("thin", nodes=make_nodes("t", 2, cpu_free=16))],
        outcome="rejected",
        failed={"thin": {"CPU_MEMORY": False, "GPU_CAPACITY": False}},
    ),
    Case(
        id="CPU: busy nodes with little free CPU are queueing, not ineligible",
        workload=make_workload(cpu="32"),
        clusters=[make_snapshot("busy", nodes=make_nodes("b", 2, free=0, cpu_free=2))],
        outcome="routed",
        cluster="busy",
    ),
    # ---- registry checks -------------------------------------------------------------------------
    Case(
        id="connections: a missing named connection is permanent",
        workload=make_workload(connections=["wandb", "feature-store"]),
        clusters=[
            make_snapshot("a", connections=["wandb"]),
            make_snapshot("b", connections=["wandb", "feature-store"]),
        ],
        outcome="routed",
        cluster="b",
        failed={"a": {"CONNECTIONS": False}},
        messages={"a": ["missing connections feature-store"]},
    ),
    Case(
        id="input data local to a cluster costs no staging",
        workload=make_workload(inputs=[make_input("ds@1", 5000, ["nfs-a"])]),
        clusters=[make_snapshot("a", data_locations=["nfs-a"])],
        outcome="routed",
        cluster="a",
        summary=["data local"],
    ),
    Case(
        id="resume: the checkpoint store must be readable from the cluster",
        workload=make_workload(
            checkpoint=CheckpointPolicy(path="ckpt", store="ckpt-east", interval="10m", portable=True)
        ),
        clusters=[
            make_snapshot("east", artifact_stores=["scratch", "ckpt-east"]),
            make_snapshot("west", artifact_stores=["scratch"]),
        ],
        kwargs={
            "resume": CheckpointRef(
                attempt_id="w1-a1", cluster="east", store="ckpt-east", path="ckpt-east/w1/attempts/a1/ckpt.npz", step=900
            )
        },
        outcome="routed",
        cluster="east",
        failed={"west": {"CHECKPOINT": False}},
        messages={"west": ["cannot write checkpoints to store 'ckpt-east'"]},
        summary=["resumes from step 900 of w1-a1"],
    ),
    Case(
        id="queues: no queue open to the owner is permanent",
        workload=make_workload(owner="bob"),
        clusters=[
            make_snapshot(
                "team-only", registry=make_registry(queues=[QueueRegistry(name="vision", owners=["alice"])])
            ),
            make_snapshot(
                "open", registry=make_registry(queues=["training"]), nodes=make_nodes("o", 1, free=0)
            ),
        ],
        outcome="routed",
        cluster="open",
        queue="training",
        failed={"team-only": {"QUEUE_ACCESS": False}},
        messages={"team-only": ["no queue here is open to owner 'bob'"]},
    ),
    # ---- explicit routing --------------------------------------------------------------------------
    Case(
        id="pinned: an eligible pinned target is used even though another cluster is faster",
        workload=make_workload(queue="onprem-gpu/training"),
        clusters=[
            make_snapshot(
                "onprem-gpu",
                registry=make_registry(queues=["training", "batch"]),
                nodes=make_nodes("o", 1, free=0),
                queues=[make_queue("training", wait="5h")],
            ),
            make_snapshot("spare"),
        ],
        outcome="routed",
        cluster="onprem-gpu",
        queue="training",
        failed={"spare": {"PINNED_ELSEWHERE": False}},
        summary=["pinned to onprem-gpu/training"],
    ),
    Case(
        id="pinned: an unreachable pinned target waits; it does not fall back",
        workload=make_workload(queue="onprem-gpu/training"),
        clusters=[
            make_snapshot("onprem-gpu", registry=make_registry(queues=["training"]), reachable=False),
            make_snapshot("spare"),
        ],
        outcome="waiting",
        failed={"onprem-gpu": {"CLUSTER_UNREACHABLE": True}, "spare": {"PINNED_ELSEWHERE": False}},
    ),
    Case(
        id="pinned: a queue that does not exist on the agent is rejected",
        workload=make_workload(queue="onprem-gpu/nope"),
        clusters=[make_snapshot("onprem-gpu", registry=make_registry(queues=["training"]))],
        outcome="rejected",
        failed={"onprem-gpu": {"QUEUE_ACCESS": False}},
        messages={"onprem-gpu": ["pinned queue 'nope' does not exist here"]},
    ),
    Case(
        id="pinned: a queue not open to the owner is rejected",
        workload=make_workload(queue="onprem-gpu/vision", owner="bob"),
        clusters=[
            make_snapshot(
                "onprem-gpu", registry=make_registry(queues=[QueueRegistry(name="vision", owners=["alice"])])
            )
        ],
        outcome="rejected",
        failed={"onprem-gpu": {"QUEUE_ACCESS": False}},
    ),
    Case(
        id="pinned: a cluster inventory never published waits, saying so",
        workload=make_workload(queue="ghost/training"),
        clusters=[make_snapshot("spare")],
        outcome="waiting",
        failed={"ghost": {"CLUSTER_UNREACHABLE": True}, "spare": {"PINNED_ELSEWHERE": False}},
        messages={"ghost": ["no snapshot of pinned cluster 'ghost'"]},
    ),
    # ---- ranking -----------------------------------------------------------------------------------
    Case(
        id="speed: 2h on an A100 is 1h on an H100; same queue, the H100 cluster wins",
        workload=make_workload(expected_runtime="2h", reference_accelerator=A100_80),
        clusters=[
            make_snapshot("ampere", nodes=make_nodes("a", 1)),
            make_snapshot("hopper", nodes=make_nodes("h", 1, product=H100_80)),
        ],
        outcome="routed",
        cluster="hopper",
        extra=_h100_faster,
    ),
    Case(
        id="cost: with cost weighted, a cheaper cluster wins despite a longer queue",
        workload=make_workload(gpus=8, preferences=Preferences(time_weight=1.0, cost_weight=1.0)),
        clusters=[
            make_snapshot("dear", price_per_gpu_hour=10.0),
            make_snapshot(
                "cheap",
                price_per_gpu_hour=1.0,
                nodes=make_nodes("c", 1, free=0),
                queues=[make_queue(wait="2h")],
            ),
        ],
        outcome="routed",
        cluster="cheap",
    ),
    Case(
        id="preference: a preferred cluster wins a near-tie",
        workload=make_workload(preferences=Preferences(clusters=["zeta"])),
        clusters=[make_snapshot("alpha"), make_snapshot("zeta")],
        outcome="routed",
        cluster="zeta",
    ),
    Case(
        id="ties are broken by cluster name",
        workload=make_workload(),
        clusters=[make_snapshot("zeta"), make_snapshot("alpha")],
        outcome="routed",
        cluster="alpha",
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_route(case: Case) -> None:
    assert validate_workload(case.workload) == []
    d = route(case.workload, "wl-1", snapshots(*case.clusters), NOW, **case.kwargs)
    assert d.outcome == case.outcome, d.summary
    assert d.cluster == case.cluster, d.summary
    if case.queue is not None or case.outcome != "routed":
        assert d.queue == case.queue
    by_name = {v.cluster: v for v in d.verdicts}
    assert [v.cluster for v in d.verdicts] == sorted(by_name)
    for name, verdict in by_name.items():
        failed = {c.code: c.capacity_only for c in verdict.checks if not c.ok}
        assert failed == case.failed.get(name, {}), f"{name}: {[c for c in verdict.checks if not c.ok]}"
        assert verdict.eligible == (not failed)
        assert (verdict.estimate is not None) == verdict.eligible
        text = " | ".join(c.message for c in verdict.checks if not c.ok)
        for fragment in case.messages.get(name, []):
            assert fragment in text, f"{fragment!r} not in {name}'s failures: {text}"
    for fragment in case.summary:
        assert fragment in d.summary, f"{fragment!r} not in summary: {d.summary}"
    if d.outcome == "routed":
        assert by_name[d.cluster].eligible  # type: ignore[index]
    if case.extra is not None:
        case.extra(d)


def test_gpus_installed_but_not_allocatable_is_waiting_not_rejected() -> None:
    """A node whose device plugin reports 0 GPUs (GFD still says 8) is lost capacity: wait for it."""
    from gpuorch_router.policy import route

    wl = make_workload(gpus=2)
    degraded = make_snapshot("a", nodes=[make_node("n1", gpus=0, free=0, labels={"nvidia.com/gpu.count": "8"})])
    d = route(wl, "w-degraded", {"a": degraded}, NOW)
    assert d.outcome == "waiting", d.summary
    no_gpus = make_snapshot("a", nodes=[make_node("n1", gpus=0, free=0)])
    assert route(wl, "w-cpu-only", {"a": no_gpus}, NOW).outcome == "rejected"
