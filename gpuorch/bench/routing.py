"""Routing-policy benchmark: decisions/s and latency at 100 clusters x 1,000 (and x 100) nodes.

The world is generated from a fixed seed: each cluster has nodes in a handful of classes (pool x
GPU model x size), random free GPUs and NotReady nodes, and a registry drawn from small sets of
stores, credentials, cached datasets, links and queues, so that some clusters are ineligible for
some workloads, as in production. Three ways of routing are measured:

* ``warm``: a sweep's trials: many distinct ``Workload`` objects sharing a few shapes (same
  resources, requirements, inputs and workload class, different names and args). Per-cluster
  evaluations are memoised per snapshot index and shape; ``now`` advances every decision.
* ``cold``: every decision a workload shape never seen before (a different declared run time), so
  every cluster is evaluated from its node classes: the worst case.
* ``index``: building the snapshot index (node classes) from a snapshot, once per published
  snapshot.

Numbers are per decision over all clusters (``route`` evaluates every cluster every time).
"""

from __future__ import annotations

import gc
import random
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from gpuorch_proto.inventory import (
    ClusterRegistryEntry,
    ClusterSnapshot,
    NodeInfo,
    QueueInfo,
    QueueRegistry,
    Taint,
)
from gpuorch_proto.workload import (
    DatasetInput,
    Metadata,
    OutputPolicy,
    Requirements,
    Resources,
    Workload,
    WorkloadSpecBody,
)
from gpuorch_router.policy import SnapshotIndex, build_index, route

NOW = 1_700_000_000.0
IMAGE = "example.org/train@sha256:" + "0123456789abcdef" * 4
MODELS = [
    ("NVIDIA-A100-SXM4-80GB", 81920),
    ("NVIDIA-A100-SXM4-40GB", 40960),
    ("NVIDIA-H100-80GB-HBM3", 81559),
    ("NVIDIA-L4", 23034),
]


@dataclass(frozen=True)
class Row:
    """One line of the bench table."""

    bench: str
    case: str
    metric: str
    value: float
    unit: str


def make_cluster(rng: random.Random, name: str, n_nodes: int) -> ClusterSnapshot:
    classes = []
    for _ in range(rng.randint(2, 5)):
        product, mem = rng.choice(MODELS)
        classes.append(
            (
                product,
                mem,
                rng.choice([4, 8, 8]),
                rng.choice(["train", "train", "inference"]),
                [Taint(key="team", value="vision")] if rng.random() < 0.1 else [],
                ["time-slicing"] if rng.random() < 0.2 else [],
            )
        )
    nodes = []
    for i in range(n_nodes):
        product, mem, gpus, pool, taints, sharing = classes[i % len(classes)]
        nodes.append(
            NodeInfo(
                name=f"{name}-n{i}",
                ready=rng.random() > 0.02,
                pool=pool,
                gpu_product=product,
                gpu_memory_mib=mem,
                gpus_allocatable=gpus,
                gpus_free=rng.choice([0, 0, 0, 1, 2, gpus]),
                cpu_free=float(rng.choice([4, 16, 64])),
                memory_free=float(rng.choice([32, 256]) * 2**30),
                labels={
                    "kubernetes.io/hostname": f"{name}-n{i}",
                    "nvidia.com/gpu.product": product,
                    "nvidia.com/gpu.memory": str(mem),
                    "nvidia.com/gpu.count": str(gpus),
                    "topology.kubernetes.io/zone": f"z{i % 3}",
                },
                taints=taints,
                sharing=sharing,
            )
        )
    registry = ClusterRegistryEntry(
        price_per_gpu_hour=rng.choice([1.0, 2.0, 3.5]),
        artifact_stores=["scratch", "prod"] if rng.random() < 0.7 else ["scratch"],
        connections=["wandb"] if rng.random() < 0.8 else [],
        credentials=["hf-token"] if rng.random() < 0.8 else [],
        datasets_cached=rng.sample(["imagenet@v2", "imagenet@v3", "c4@2024", "laion@1"], rng.randint(0, 2)),
        images_cached=[IMAGE] if rng.random() < 0.5 else [],
        bandwidth_mbps={"s3-east": rng.choice([100.0, 400.0, 1000.0])} if rng.random() < 0.8 else {},
        data_locations=["nfs-" + name] if rng.random() < 0.1 else [],
        queues=[QueueRegistry(name="training"), QueueRegistry(name="batch", owners=["alice"])],
        startup_seconds=rng.choice([30.0, 60.0, 120.0]),
    )
    return ClusterSnapshot(
        cluster=name,
        reachable=rng.random() > 0.03,
        observed_at=NOW - rng.choice([5.0, 20.0, 60.0]),
        published_at=NOW,
        nodes=nodes,
        queues=[
            QueueInfo(name="training", pending_gpus=rng.randint(0, 64), estimated_wait_seconds=rng.choice([0.0, 1800.0, 7200.0])),
            QueueInfo(name="batch", pending_gpus=0),
        ],
        registry=registry,
    )


def make_world(n_clusters: int, n_nodes: int, seed: int = 7) -> dict[str, ClusterSnapshot]:
    rng = random.Random(seed)
    return {f"c{i:03d}": make_cluster(rng, f"c{i:03d}", n_nodes) for i in range(n_clusters)}


SHAPES = [
    # (gpus, workers, same_node, gpu_memory_gib, inputs, credentials, output store)
    (1, 1, False, None, (), (), "scratch"),
    (8, 1, False, 80.0, (DatasetInput(ref="imagenet@v3", size_gb=150, locations=["s3-east"]),), ("hf-token",), "prod"),
    (4, 2, True, 40.0, (), ("hf-token",), "scratch"),
    (8, 4, False, 80.0, (DatasetInput(ref="c4@2024", size_gb=800, locations=["s3-east"]),), (), "prod"),
    (2, 1, False, None, (DatasetInput(ref="laion@1", size_gb=50, locations=["s3-east"]),), (), "scratch"),
]


def make_workload(shape: int, trial: int, runtime: str = "2h") -> Workload:
    gpus, workers, same_node, mem, inputs, creds, store = SHAPES[shape % len(SHAPES)]
    return Workload(
        metadata=Metadata(name=f"trial-{trial}", owner="alice", workload_class=f"shape-{shape}"),
        spec=WorkloadSpecBody(
            image=IMAGE,
            command=["python", "train.py"],
            args=[f"--lr={0.001 * (trial % 17 + 1)}"],
            inputs=list(inputs),
            resources=Resources(gpus=gpus, workers=workers, same_node=same_node, gpu_memory_gib=mem, cpu="8", memory="64Gi"),
            requirements=Requirements(credentials=list(creds), connections=["wandb"]),
            output=OutputPolicy(store=store),
            expected_runtime=runtime,
        ),
    )


def _timed(fn: Callable[[int], object], n: int) -> list[float]:
    lat = []
    clock = time.perf_counter
    for i in range(n):
        t0 = clock()
        fn(i)
        lat.append(clock() - t0)
    return lat


def _stats(bench: str, case: str, lat: Sequence[float]) -> list[Row]:
    ordered = sorted(lat)
    p50 = ordered[len(ordered) // 2]
    p99 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]
    return [
        Row(bench, case, "decisions/s", len(lat) / sum(lat), "1/s"),
        Row(bench, case, "p50 latency", p50 * 1e6, "us"),
        Row(bench, case, "p99 latency", p99 * 1e6, "us"),
    ]


def bench_world(n_clusters: int, n_nodes: int, decisions: int, cold_decisions: int) -> tuple[list[Row], dict[str, float]]:
    case = f"{n_clusters}x{n_nodes}"
    world = make_world(n_clusters, n_nodes)
    rows: list[Row] = []
    # index build, once per published snapshot
    t0 = time.perf_counter()
    indexes: dict[str, ClusterSnapshot | SnapshotIndex] = {n: SnapshotIndex(s) for n, s in world.items()}
    build = (time.perf_counter() - t0) / n_clusters
    classes = sum(len(i.classes) for i in indexes.values() if isinstance(i, SnapshotIndex)) / n_clusters
    rows.append(Row("routing", case, "index build / snapshot", build * 1e3, "ms"))
    rows.append(Row("routing", case, "node classes / cluster", classes, ""))
    for name, snap in world.items():  # warm the identity cache the way the service does
        build_index(snap)
    del indexes

    workloads = [make_workload(i % len(SHAPES), i) for i in range(decisions)]
    for s in range(len(SHAPES)):  # first sight of each shape is a cold decision: not measured here
        route(make_workload(s, -1), "warmup", world, NOW)
    gc.collect()
    gc.disable()
    try:
        warm = _timed(lambda i: route(workloads[i], f"w{i}", world, NOW + i * 0.001), decisions)
        cold_wls = [make_workload(i % len(SHAPES), i, runtime=f"{3600 + i}s") for i in range(cold_decisions)]
        cold = _timed(lambda i: route(cold_wls[i], f"c{i}", world, NOW + i * 0.001), cold_decisions)
    finally:
        gc.enable()
    rows += _stats("routing", f"{case} warm", warm)
    rows += _stats("routing", f"{case} cold", cold)
    outcome = route(workloads[0], "w", world, NOW)
    facts = {
        "warm_rate": len(warm) / sum(warm),
        "cold_rate": len(cold) / sum(cold),
        "build_ms": build * 1e3,
        "eligible": float(sum(1 for v in outcome.verdicts if v.eligible)),
    }
    return rows, facts


def run(quick: bool = False) -> list[Row]:
    """The routing bench: 100 x 1,000 and 100 x 100 nodes; ratios show cost independent of nodes."""
    n_warm, n_cold = (500, 50) if quick else (5000, 300)
    rows_big, big = bench_world(100, 1000, n_warm, n_cold)
    rows_small, small = bench_world(100, 100, n_warm, n_cold)
    rows = rows_big + rows_small
    rows.append(Row("routing", "1000 vs 100 nodes", "warm rate ratio", big["warm_rate"] / small["warm_rate"], "x"))
    rows.append(Row("routing", "1000 vs 100 nodes", "cold rate ratio", big["cold_rate"] / small["cold_rate"], "x"))
    rows.append(Row("routing", "1000 vs 100 nodes", "index build ratio", big["build_ms"] / small["build_ms"], "x"))
    rows.append(Row("routing", "100x1000", "eligible clusters (shape 0)", big["eligible"], ""))
    return rows


def median(values: Sequence[float]) -> float:
    return statistics.median(values)
