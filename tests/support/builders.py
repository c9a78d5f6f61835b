"""Builders for workloads and capacity snapshots (after kueue's MakeWorkload and Armada's testfixtures).

Every builder returns a valid contract object with realistic defaults, so a test states only what
its case is about::

    wl = make_workload(gpus=4, same_node=True, gpu_memory_gib=80)
    snap = make_snapshot("primary", nodes=[make_node("p0", gpus=8, free=0)],
                         queues=[make_queue("training", wait="2h")])

Times are unix seconds around :data:`NOW`; pass ``now=NOW`` to the policy.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from gpuorch_proto.inventory import (
    ClusterRegistryEntry,
    ClusterSnapshot,
    NodeInfo,
    QueueInfo,
    QueueRegistry,
    Taint,
)
from gpuorch_proto.units import parse_duration
from gpuorch_proto.workload import (
    DatasetInput,
    Metadata,
    OutputPolicy,
    Requirements,
    Resources,
    Sharing,
    Toleration,
    Workload,
    WorkloadSpecBody,
)

NOW = 1_700_000_000.0
DIGEST = "sha256:" + "0123456789abcdef" * 4
IMAGE = f"example.org/train@{DIGEST}"
A100_80 = "NVIDIA-A100-SXM4-80GB"
A100_40 = "NVIDIA-A100-SXM4-40GB"
H100_80 = "NVIDIA-H100-80GB-HBM3"
GIB = 2**30


def make_input(ref: str, size_gb: float = 0.0, locations: Iterable[str] = ()) -> DatasetInput:
    """An immutable versioned input ``name@version`` with its size and replica locations."""
    return DatasetInput(ref=ref, size_gb=size_gb, locations=list(locations))


InputLike = DatasetInput | str | tuple[str, float] | tuple[str, float, Iterable[str]]


def _input(value: InputLike) -> DatasetInput:
    if isinstance(value, DatasetInput):
        return value
    if isinstance(value, str):
        return make_input(value)
    if len(value) == 2:
        return make_input(value[0], value[1])
    return make_input(value[0], value[1], value[2])


def make_workload(
    name: str = "train",
    gpus: float = 1,
    gpu_memory_gib: float | None = None,
    accelerators: Iterable[str] = (),
    workers: int = 1,
    same_node: bool = False,
    inputs: Iterable[InputLike] = (),
    queue: str | None = None,
    output_store: str = "scratch",
    connections: Iterable[str] = (),
    credentials: Iterable[str] = (),
    pools: Iterable[str] = (),
    expected_runtime: str | None = "1h",
    owner: str = "alice",
    sharing: Sharing | str | None = None,
    *,
    cpu: str = "4",
    memory: str = "16Gi",
    node_selector: Mapping[str, str] | None = None,
    tolerations: Iterable[Toleration] = (),
    clusters: Iterable[str] = (),
    workload_class: str | None = None,
    image: str = IMAGE,
    command: Sequence[str] = ("python", "train.py"),
    **spec_overrides: Any,
) -> Workload:
    """A valid workload; ``spec_overrides`` replace any other ``WorkloadSpecBody`` field.

    ``sharing`` may be a :class:`Sharing` or a mechanism name ("time-slicing", "mig:1g.10gb").
    """
    if isinstance(sharing, str):
        mech, _, profile = sharing.partition(":")
        sharing = Sharing(mechanism=mech, profile=profile or None)  # type: ignore[arg-type]
    resources = Resources(
        gpus=gpus,
        gpu_memory_gib=gpu_memory_gib,
        accelerators=list(accelerators),
        cpu=cpu,
        memory=memory,
        workers=workers,
        same_node=same_node,
        sharing=sharing,
    )
    requirements = Requirements(
        pools=list(pools),
        node_selector=dict(node_selector or {}),
        tolerations=list(tolerations),
        connections=list(connections),
        credentials=list(credentials),
        clusters=list(clusters),
    )
    spec_fields: dict[str, Any] = {
        "image": image,
        "command": list(command),
        "inputs": [_input(i) for i in inputs],
        "resources": resources,
        "requirements": requirements,
        "queue": queue,
        "expected_runtime": expected_runtime,
    }
    spec_fields.update(spec_overrides)
    if "output" not in spec_overrides:
        spec_fields["output"] = OutputPolicy(store=output_store)
    return Workload(
        metadata=Metadata(name=name, owner=owner, workload_class=workload_class),
        spec=WorkloadSpecBody(**spec_fields),
    )


def make_node(
    name: str,
    gpus: int = 8,
    free: int | None = None,
    product: str | None = A100_80,
    memory_mib: int = 81920,
    pool: str | None = "train",
    *,
    ready: bool = True,
    labels: Mapping[str, str] | None = None,
    taints: Iterable[Taint] = (),
    sharing: Iterable[str] = (),
    cpu_free: float = 64.0,
    memory_free: float = 512 * GIB,
) -> NodeInfo:
    """A node with GFD labels; ``free`` defaults to every GPU free."""
    gfd = {"kubernetes.io/hostname": name}
    if gpus:
        gfd |= {
            "nvidia.com/gpu.product": product or "",
            "nvidia.com/gpu.memory": str(memory_mib),
            "nvidia.com/gpu.count": str(gpus),
        }
    return NodeInfo(
        name=name,
        ready=ready,
        pool=pool,
        gpu_product=product if gpus else None,
        gpu_memory_mib=memory_mib if gpus else 0,
        gpus_allocatable=gpus,
        gpus_free=gpus if free is None else free,
        cpu_free=cpu_free,
        memory_free=memory_free,
        labels=gfd | dict(labels or {}),
        taints=list(taints),
        sharing=list(sharing),
    )


def make_nodes(prefix: str, count: int, **node_kw: Any) -> list[NodeInfo]:
    """`count` identical nodes named ``<prefix>-0`` ... (handy for "3 nodes with 8 free GPUs")."""
    return [make_node(f"{prefix}-{i}", **node_kw) for i in range(count)]


def make_queue(
    name: str = "training",
    wait: str | float = 0.0,
    pending_gpus: int = 0,
    pending_jobs: int = 0,
    owners: Iterable[str] = ("*",),
) -> QueueInfo:
    """An observed queue; ``wait`` is the measured estimated wait ("2h" or seconds)."""
    return QueueInfo(
        name=name,
        owners=list(owners),
        pending_jobs=pending_jobs,
        pending_gpus=pending_gpus,
        estimated_wait_seconds=parse_duration(wait),
    )


def make_registry(
    *,
    price_per_gpu_hour: float = 2.0,
    artifact_stores: Iterable[str] = ("scratch", "prod"),
    connections: Iterable[str] = (),
    credentials: Iterable[str] = (),
    datasets_cached: Iterable[str] = (),
    images_cached: Iterable[str] = (IMAGE,),
    bandwidth_mbps: Mapping[str, float] | None = None,
    data_locations: Iterable[str] = (),
    queues: Iterable[QueueRegistry | str] = (),
    startup_seconds: float = 60.0,
    checkpoint_stores: Iterable[str] = (),
    **extra: Any,
) -> ClusterRegistryEntry:
    """A registry entry; ``queues`` may be names (open to everyone) or ``QueueRegistry``."""
    return ClusterRegistryEntry(
        price_per_gpu_hour=price_per_gpu_hour,
        artifact_stores=list(artifact_stores),
        connections=list(connections),
        credentials=list(credentials),
        datasets_cached=list(datasets_cached),
        images_cached=list(images_cached),
        bandwidth_mbps=dict(bandwidth_mbps or {}),
        data_locations=list(data_locations),
        queues=[q if isinstance(q, QueueRegistry) else QueueRegistry(name=q) for q in queues],
        startup_seconds=startup_seconds,
        checkpoint_stores=list(checkpoint_stores),
        **extra,
    )


def make_snapshot(
    cluster: str,
    nodes: Iterable[NodeInfo] | None = None,
    registry: ClusterRegistryEntry | None = None,
    queues: Iterable[QueueInfo] = (),
    reachable: bool = True,
    observed_at: float = NOW,
    *,
    published_at: float | None = None,
    error: str | None = None,
    pending_gpus: int | None = None,
    **registry_kw: Any,
) -> ClusterSnapshot:
    """A snapshot; without ``nodes`` one idle 8x A100-80GB node. ``registry_kw`` builds the registry."""
    node_list = list(nodes) if nodes is not None else [make_node(f"{cluster}-0")]
    queue_list = list(queues)
    if registry is None:
        registry = make_registry(**registry_kw)
    elif registry_kw:
        raise TypeError("pass either registry= or registry keyword arguments, not both")
    running = sum(max(0, n.gpus_allocatable - n.gpus_free) for n in node_list if n.ready)
    return ClusterSnapshot(
        cluster=cluster,
        reachable=reachable,
        observed_at=observed_at,
        published_at=observed_at if published_at is None else published_at,
        error=error if error is not None else (None if reachable else "connection refused"),
        nodes=node_list,
        queues=queue_list,
        running_gpus=running,
        pending_gpus=sum(q.pending_gpus for q in queue_list) if pending_gpus is None else pending_gpus,
        registry=registry,
    )


def snapshots(*snaps: ClusterSnapshot) -> dict[str, ClusterSnapshot]:
    """``{cluster: snapshot}`` for the policy."""
    return {s.cluster: s for s in snaps}
