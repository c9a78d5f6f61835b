"""Routing-policy benchmark: decisions/s and latency at 100 clusters x 1,000 (and x 100) nodes.

The world is generated from a fixed seed: each cluster has nodes in a handful of classes (pool x
GPU model x size), random free GPUs and NotReady nodes, and a registry drawn from small sets of
stores, credentials, cached datasets, links and queues, so that some clusters are ineligible for
some workloads, as in production. Observation times carry fractional seconds. Scenarios:

* ``index build``: building a snapshot's index (node classes), once per published snapshot.
* ``steady``: a sweep's trials: distinct ``Workload`` objects sharing 5 shapes (same resources,
  requirements, inputs and workload class; other names and args), ``now`` advancing 1 ms per
  decision, and one cluster republishing a snapshot every 100 decisions (as 100 clusters
  republishing every second would at 10,000 decisions/s); the new index is built inside the timed
  decision that first sees it.
* ``new ages``: ``now`` advances 1 s per decision, so every cluster's snapshot age (and so every
  verdict record) changes every decision; checks and estimates still come from the memo.
* ``new estimate``: every decision declares a new run time: checks are memoised, every
  eligible cluster's estimate is computed.
* ``cold``: every decision a resource shape never seen before (a new CPU request): a new
  eligibility signature, so every cluster's checks are evaluated again. Sub-results keyed on fields
  the CPU request does not touch (node filters up to sharing, GPU shape, registry checks, queue
  placement) come from the index's memos; the CPU check and the verdicts are built anew.

Numbers are per decision over all clusters (``route`` evaluates every cluster every time). Every
scenario runs through the fast path (``RoutingMemo``, one per run, as the router owns one); the
steady case also runs through the reference (``decision.route``, nothing memoised), printed beside
it as the baseline, with the ratio.
"""

from __future__ import annotations

import gc
import random
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import msgspec

from gpuorch.dev.bench.rows import Row
from gpuorch_proto import k8s
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
from gpuorch_router.policy import RoutingMemo, SnapshotIndex, route

NOW = 1_700_000_000.0
IMAGE = "example.org/train@sha256:" + "0123456789abcdef" * 4
MODELS = [
    ("NVIDIA-A100-SXM4-80GB", 81920),
    ("NVIDIA-A100-SXM4-40GB", 40960),
    ("NVIDIA-H100-80GB-HBM3", 81559),
    ("NVIDIA-L4", 23034),
]




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
                    k8s.LABEL_GPU_PRODUCT: product,
                    k8s.LABEL_GPU_MEMORY: str(mem),
                    k8s.LABEL_GPU_COUNT: str(gpus),
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
            QueueInfo(
                name="training",
                pending_gpus=rng.randint(0, 64),
                estimated_wait_seconds=rng.choice([0.0, 1800.0, 7200.0]),
            ),
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
    (
        8,
        1,
        False,
        80.0,
        (DatasetInput(ref="imagenet@v3", size_gb=150, locations=["s3-east"]),),
        ("hf-token",),
        "prod",
    ),
    (4, 2, True, 40.0, (), ("hf-token",), "scratch"),
    (8, 4, False, 80.0, (DatasetInput(ref="c4@2024", size_gb=800, locations=["s3-east"]),), (), "prod"),
    (2, 1, False, None, (DatasetInput(ref="laion@1", size_gb=50, locations=["s3-east"]),), (), "scratch"),
]


def make_workload(shape: int, trial: int, runtime: str = "2h", cpu: str = "8") -> Workload:
    gpus, workers, same_node, mem, inputs, creds, store = SHAPES[shape % len(SHAPES)]
    return Workload(
        metadata=Metadata(name=f"trial-{trial}", owner="alice", workload_class=f"shape-{shape}"),
        spec=WorkloadSpecBody(
            image=IMAGE,
            command=["python", "train.py"],
            args=[f"--lr={0.001 * (trial % 17 + 1)}"],
            inputs=list(inputs),
            resources=Resources(
                gpus=gpus, workers=workers, same_node=same_node, gpu_memory_gib=mem, cpu=cpu, memory="64Gi"
            ),
            requirements=Requirements(credentials=list(creds), connections=["wandb"]),
            output=OutputPolicy(store=store),
            expected_runtime=runtime,
        ),
    )


def _stats(case: str, timing: _Timing) -> list[Row]:
    lat = timing.latencies
    ordered = sorted(lat)
    p50 = ordered[len(ordered) // 2]
    p99 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]
    return [
        Row("routing", case, "decisions/s (CPU time)", len(lat) / timing.cpu, "1/s"),
        Row("routing", case, "decisions/s (wall)", len(lat) / sum(lat), "1/s"),
        Row("routing", case, "p50 latency", p50 * 1e6, "us"),
        Row("routing", case, "p99 latency", p99 * 1e6, "us"),
    ]


def _jittered(world: dict[str, ClusterSnapshot], seed: int) -> dict[str, ClusterSnapshot]:
    """Observation times with fractional seconds, as a real inventory publishes them."""
    rng = random.Random(seed)
    return {n: msgspec.structs.replace(s, observed_at=s.observed_at - rng.random()) for n, s in world.items()}


def _run(
    world: dict[str, ClusterSnapshot],
    workloads: Sequence[Workload],
    *,
    step: float,
    churn: int = 0,
    max_age: float = 120.0,
    decide: Callable[..., Any] = route,
) -> _Timing:
    """Route every workload once, `now` advancing by `step`; every `churn` decisions one cluster
    republishes (a new snapshot object, so a new index is built inside the timed decision)."""
    names = sorted(world)
    lat: list[float] = []
    clock = time.perf_counter
    gc.collect()
    cpu0 = time.process_time()
    for i, wl in enumerate(workloads):
        now = NOW + i * step
        if churn and i and i % churn == 0:
            name = names[(i // churn) % len(names)]
            world[name] = msgspec.structs.replace(world[name], observed_at=now - 0.25, published_at=now)
        t0 = clock()
        decide(wl, f"w{i}", world, now, max_snapshot_age=max_age)
        lat.append(clock() - t0)
    return _Timing(lat, time.process_time() - cpu0)


@dataclass(frozen=True)
class _Timing:
    latencies: list[float]  # wall seconds per decision
    cpu: float  # process CPU seconds for the whole run (robust to a busy machine)


@dataclass(frozen=True)
class Scenario:
    name: str
    make: Callable[[int], list[Workload]]  # repeat number -> the workloads to route
    warm_shapes: bool  # route each of the 5 shapes once before timing
    step: float  # seconds `now` advances per decision
    churn: int = 0  # one snapshot republished every `churn` decisions
    max_age: float = 120.0


def _scenarios(decisions: int, cold: int) -> list[Scenario]:
    def trials(n: int) -> Callable[[int], list[Workload]]:
        return lambda r: [make_workload(i % len(SHAPES), r * n + i) for i in range(n)]

    return [
        # sweep trials; one snapshot republished every 100 decisions (its index built inline)
        Scenario("steady", trials(decisions), warm_shapes=True, step=0.001, churn=100),
        # every decision at new snapshot ages: every verdict rebuilt, checks and estimates memoised
        Scenario("new ages", trials(decisions // 4), warm_shapes=True, step=1.001, max_age=1e12),
        # a new run time each decision: checks memoised, every eligible cluster's estimate computed
        Scenario(
            "new estimate",
            lambda r: [
                make_workload(i % len(SHAPES), i, runtime=f"{3600 + r * cold + i}s") for i in range(cold)
            ],
            warm_shapes=True,
            step=0.001,
        ),
        # a resource shape (CPU request) never seen before each decision: every cluster's checks
        # evaluated again (sub-results not reading the CPU request come from the index's memos)
        Scenario(
            "cold",
            lambda r: [make_workload(i % len(SHAPES), i, cpu=f"{4000 + r * cold + i}m") for i in range(cold)],
            warm_shapes=False,
            step=0.001,
        ),
    ]


def _once(base: dict[str, ClusterSnapshot], sc: Scenario, r: int, reference: bool = False) -> _Timing:
    """One timed run through a new fast path (or the reference), indexes built before timing."""
    world = _jittered(base, r)
    if reference:
        indexed: dict[str, Any] = {n: SnapshotIndex(s) for n, s in world.items()}  # as the service keeps them
        return _run(indexed, sc.make(r), step=sc.step, max_age=sc.max_age, decide=route)
    memo = RoutingMemo()
    memo.route(make_workload(0, -1), "warmup", world, NOW)
    if sc.warm_shapes:
        for shape in range(len(SHAPES)):
            memo.route(make_workload(shape, -1), "warmup", world, NOW)
    return _run(world, sc.make(r), step=sc.step, churn=sc.churn, max_age=sc.max_age, decide=memo.route)


def run(quick: bool = False) -> list[Row]:
    """The routing bench at 100 x 1,000 and 100 x 100 nodes; ratios show cost independent of nodes.

    Both world sizes run interleaved, repeat by repeat, so a busy machine disturbs both alike; each
    scenario reports its run of median CPU time.
    """
    n, n_cold, n_ref, repeats = (1000, 60, 10, 1) if quick else (20000, 300, 60, 3)
    sizes = (1000, 100)
    worlds = {size: make_world(100, size) for size in sizes}
    gc.collect()
    gc.freeze()  # the generated worlds are long-lived: keep full collections from rescanning them
    rows: list[Row] = []
    rates: dict[tuple[int, str], float] = {}
    try:
        builds: dict[int, float] = {}
        for size in sizes:
            base = worlds[size]
            times = []
            for snap in list(base.values())[:30]:
                t0 = time.perf_counter()
                SnapshotIndex(snap)
                times.append(time.perf_counter() - t0)
            builds[size] = statistics.median(times) * 1e3
            classes = statistics.mean(len(SnapshotIndex(s).classes) for s in base.values())
            rows.append(Row("routing", f"100x{size}", "index build / snapshot (p50)", builds[size], "ms"))
            rows.append(Row("routing", f"100x{size}", "node classes / cluster", classes, ""))
        for sc in _scenarios(n, n_cold):
            runs: dict[int, list[_Timing]] = {size: [] for size in sizes}
            for r in range(repeats):
                for size in sizes:
                    runs[size].append(_once(worlds[size], sc, r))
            for size in sizes:
                ordered = sorted(runs[size], key=lambda t: t.cpu)
                timing = ordered[len(ordered) // 2]
                rows += _stats(f"100x{size} {sc.name}", timing)
                rates[(size, sc.name)] = len(timing.latencies) / timing.cpu
        # the reference (no memoisation) in the steady case: the baseline the fast path is measured by
        steady = _scenarios(n_ref, 0)[0]
        for size in sizes:
            timing = _once(worlds[size], steady, 0, reference=True)
            rows += _stats(f"100x{size} steady (reference)", timing)
            ref_rate = len(timing.latencies) / timing.cpu
            ratio = rates[(size, "steady")] / ref_rate
            rows.append(Row("routing", f"100x{size}", "steady: fast path / reference (CPU)", ratio, "x"))
        cmp = "1000 vs 100 nodes"
        for sc in _scenarios(0, 0):
            ratio = rates[(1000, sc.name)] / rates[(100, sc.name)]
            rows.append(Row("routing", cmp, f"{sc.name} rate ratio (CPU)", ratio, "x"))
        rows.append(Row("routing", cmp, "index build ratio", builds[1000] / builds[100], "x"))
        decision = route(make_workload(0, 0), "w", worlds[1000], NOW)
        eligible = float(sum(1 for v in decision.verdicts if v.eligible))
        rows.append(Row("routing", "100x1000", "eligible clusters (shape 0)", eligible, ""))
    finally:
        gc.unfreeze()
    return rows
