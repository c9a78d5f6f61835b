"""Capacity snapshots (DESIGN §4) and the cluster registry entry.

"24 free GPUs" is not a routing fact; "3 nodes with 8 free 80 GB GPUs in pool
`train`" is. So a snapshot is per node, per queue, with what is cached and what
the cluster can reach.
"""

from __future__ import annotations

from typing import Literal

import msgspec

Admission = Literal["none", "kueue", "kai", "volcano"]
#: The order a destination admits pending work in, as inventory's queue-wait model simulates it
#: (docs/inventory.md). "best-effort": highest priority first, then oldest, and work that fits may
#: start before older work that does not (kube-scheduler; Kueue's BestEffortFIFO, its default; KAI;
#: Volcano). "fifo": strictly in arrival order, priority ignored: nothing starts before older
#: pending work (the simulator's clusters; a Kueue StrictFIFO ClusterQueue whose workloads share one
#: priority). "priority": strictly by priority, then arrival (Kueue StrictFIFO with priorities).
Queueing = Literal["best-effort", "fifo", "priority"]
#: Where an estimated wait came from: "free" (fits now behind the demand ahead), "runtime" (the
#: simulation of running and pending work), "history" (measured delays), "default" (nothing known).
WaitSource = Literal["free", "runtime", "history", "default"]


class Taint(msgspec.Struct, frozen=True, kw_only=True):
    key: str
    value: str | None = None
    effect: str = "NoSchedule"


class NodeInfo(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    ready: bool = True
    pool: str | None = None
    gpu_product: str | None = None  # nvidia.com/gpu.product
    gpu_memory_mib: int = 0  # nvidia.com/gpu.memory
    gpus_allocatable: int = 0
    gpus_free: int = 0
    cpu_free: float = 0.0  # cores
    memory_free: float = 0.0  # bytes
    labels: dict[str, str] = {}
    taints: list[Taint] = []
    sharing: list[str] = []  # sharing mechanisms this node offers ("mig", "time-slicing")


class RequestShape(msgspec.Struct, frozen=True, kw_only=True):
    """The shape of a request a queue wait is estimated for: `workers` workers of `gpus` GPUs,
    each worker on one node, all started together (a gang), on the nodes that `counts`."""

    gpus: int  # GPUs per worker (whole)
    workers: int = 1
    gpu_product: str | None = None  # only nodes of this GPU model (nvidia.com/gpu.product); None: any
    pool: str | None = None  # only nodes of this pool (gpuorch.io/pool); None: any

    def counts(self, gpu_product: str | None, pool: str | None) -> bool:
        """Whether a node of this model and pool is one of the nodes the shape may use (the one
        rule for inventory, which simulates on those nodes, and the router, which matches them)."""
        return (self.gpu_product is None or self.gpu_product == gpu_product) and (self.pool is None or self.pool == pool)

    def describe(self) -> str:
        size = f"{self.gpus} GPU" if self.gpus == 1 else f"{self.gpus} GPUs"
        if self.workers > 1:
            size = f"{self.workers} x {size}"
        where = [w for w in (self.gpu_product and f"on {self.gpu_product}", self.pool and f"in pool {self.pool}") if w]
        return " ".join([size, *where]) if where else f"{size} on any node"


class ShapeWait(msgspec.Struct, frozen=True, kw_only=True):
    """Inventory's estimated wait (simulated seconds) of a new request of `shape` in one queue."""

    shape: RequestShape
    seconds: float
    source: WaitSource = "runtime"


class QueueInfo(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    owners: list[str] = msgspec.field(default_factory=lambda: ["*"])  # who may submit; "*" = everyone
    pending_jobs: int = 0
    pending_gpus: int = 0
    # a new one-GPU request's wait: from running work's remaining time and measured history
    estimated_wait_seconds: float = 0.0
    # waits per request shape (one GPU; a full node, and all nodes, of each GPU model and pool; the
    # largest gang), under the destination's admission order (`ClusterRegistryEntry.queueing`).
    # Empty from inventories older than this field: readers then use `estimated_wait_seconds`.
    shape_waits: list[ShapeWait] = []


class QueueRegistry(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    owners: list[str] = msgspec.field(default_factory=lambda: ["*"])
    # with an admission system (Kueue): the ClusterQueue this queue feeds. Queues naming the same
    # one share its line of pending work; None: the queue is a line of its own
    cluster_queue: str | None = None


class SecretKeyRef(msgspec.Struct, frozen=True, kw_only=True):
    """Where a named credential lives on one cluster: a key of a Secret in the workload namespace
    (`gpuorch_proto.credentials`). Names only: the value never leaves the cluster."""

    secret: str  # the Secret's name
    key: str  # the key in its data
    env: str | None = None  # the variable the Job sees it as; None: GPUORCH_CREDENTIAL_<NAME>


class ExporterRef(msgspec.Struct, frozen=True, kw_only=True):
    """NVIDIA's dcgm-exporter as the Kubernetes API's service proxy reaches it (the GPU
    Operator's names by default): ``/api/v1/namespaces/<namespace>/services/<service>:<port>/proxy/metrics``."""

    namespace: str = "gpu-operator"
    service: str = "nvidia-dcgm-exporter"
    port: str = "gpu-metrics"  # the Service port's name or number


class MetricsSource(msgspec.Struct, frozen=True, kw_only=True):
    """Where a cluster's GPU metrics are read (docs/activity.md): a Prometheus HTTP API that
    scrapes its dcgm-exporter (history: any attempt's window), or the exporter itself through the
    API server (the present values only). `selector`: label matchers that pick this cluster's
    series when one Prometheus scrapes several (e.g. ``{cluster: east}``)."""

    prometheus: str | None = None  # base URL; gpuorch asks <url>/api/v1/query
    selector: dict[str, str] = {}
    exporter: ExporterRef | None = None


class ClusterRegistryEntry(msgspec.Struct, frozen=True, kw_only=True):
    """What Kubernetes does not hold about a cluster: one entry per kubeconfig context."""

    price_per_gpu_hour: float = 0.0
    artifact_stores: list[str] = []
    connections: list[str] = []
    credentials: list[str] = []
    datasets_cached: list[str] = []  # "name@version"
    images_cached: list[str] = []
    bandwidth_mbps: dict[str, float] = {}  # data location -> MB/s into this cluster
    data_locations: list[str] = []  # data locations that are local to this cluster
    admission: Admission = "none"
    queues: list[QueueRegistry] = []
    startup_seconds: float = 60.0
    checkpoint_stores: list[str] = []  # stores whose checkpoints this cluster can read
    cache_path: str | None = None  # where datasets staged by gpuorch live, as seen from pods
    credential_refs: dict[str, SecretKeyRef] = {}  # credential name -> its Secret key here (issue 11)
    # store or data location -> the Secret (in the workload namespace) holding this cluster's
    # credentials for it (gpuorch_proto.storage.SECRET_KEYS); the name only, never the secret
    store_credentials: dict[str, str] = {}
    cache_claim: str | None = None  # the PVC gpuorch stages datasets into (mounted at /gpuorch-cache)
    # data location -> MB/s measured staging into this cluster (inventory, from gpuorch's own
    # stagings): where present, `bandwidth_mbps` holds this figure instead of the registry's
    bandwidth_measured: dict[str, float] = {}
    metrics: MetricsSource | None = None  # where its GPU metrics are read (None: nowhere, "unknown")
    queueing: Queueing = "best-effort"  # the order its admission follows (inventory's waits per shape)


class ClusterSnapshot(msgspec.Struct, frozen=True, kw_only=True):
    """One cluster's capacity and reach, as inventory last observed it."""

    schema_version: int = 1
    cluster: str
    reachable: bool
    observed_at: float  # unix seconds of the last successful observation
    published_at: float  # unix seconds this snapshot was published
    error: str | None = None  # why the cluster is unreachable
    nodes: list[NodeInfo] = []
    queues: list[QueueInfo] = []
    running_gpus: int = 0
    pending_gpus: int = 0
    registry: ClusterRegistryEntry = ClusterRegistryEntry()
    time_scale: float = 1.0  # simulated seconds per real second (local clusters)

    def age(self, now: float) -> float:
        return max(0.0, now - self.observed_at)
