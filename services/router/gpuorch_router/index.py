"""The snapshot index: one cluster's snapshot prepared for routing (reference, no memoisation).

A :class:`SnapshotIndex` groups a snapshot's nodes into *classes* of identical nodes (pool, GPU
model, memory, installed GPUs, labels, scheduling taints, sharing) with counts and a histogram of
free GPUs on Ready nodes, so the checks cost O(classes), not O(nodes); registry facts become sets
and queues are looked up by name. Built once per published snapshot; immutable once built (the
fast path's caches live in :class:`gpuorch_router.fastpath.RoutingMemo`, never here). Built
with the cluster's previous index, it takes from it the parts whose inputs are equal (the node
classes when every node is, the registry's sets when the registry is): inventory republishes a
cluster every few seconds, mostly with nothing but its age and queue waits changed.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Final

from gpuorch_proto.inventory import ClusterSnapshot, NodeInfo, QueueInfo, Taint
from gpuorch_proto.kubesem import BLOCKING_EFFECTS
from gpuorch_proto.placement import LABEL_GPU_COUNT, LABEL_MIG_STRATEGY

__all__ = ["REGISTRY_FACTS", "VOLATILE_LABELS", "NodeClass", "SnapshotIndex", "installed_gpus", "node_classes", "plural"]

#: Labels unique per node: left out of node classes (else every node is its own class).
VOLATILE_LABELS: Final = frozenset({"kubernetes.io/hostname"})


def plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


@dataclass(slots=True, eq=False)
class NodeClass:
    """Identical nodes of one snapshot, with counts and a histogram of free GPUs on Ready nodes."""

    pool: str | None
    product: str | None
    memory_mib: int
    allocatable: int  # GPUs per node (installed)
    labels: Mapping[str, str]
    taints: tuple[Taint, ...]  # NoSchedule / NoExecute only
    sharing: frozenset[str]
    nodes: int = 0
    ready: int = 0
    free_hist: tuple[tuple[int, int], ...] = ()  # (free GPUs, Ready nodes with that many free)
    cpu_max: float = 0.0  # most CPU cores free on one Ready node
    memory_max: float = 0.0  # most memory bytes free on one Ready node
    has_idle: bool = False  # a Ready node with every GPU free: its free CPU/memory is its capacity
    members: tuple[NodeInfo, ...] = ()

    def describe(self) -> str:
        gpu = f"{self.allocatable}x {self.product}" if self.allocatable else "no GPU"
        return f"{gpu} in pool {self.pool or '-'} ({plural(self.nodes, 'node')}, {self.ready} Ready)"


def installed_gpus(node: NodeInfo) -> int:
    """GPUs the node has (GPU Feature Discovery's count), even while fewer are allocatable.

    The shape a cluster can ever hold is judged on installed GPUs; a node whose device plugin
    currently reports none (maintenance, a failing GPU) is lost capacity, not a smaller node.
    Under the ``mixed`` MIG strategy the count includes the GPUs split into MIG slices, which are
    not ``nvidia.com/gpu``: there the allocatable whole GPUs are what the node has.
    """
    if node.labels.get(LABEL_MIG_STRATEGY) == "mixed":
        return node.gpus_allocatable
    try:
        return max(node.gpus_allocatable, int(node.labels.get(LABEL_GPU_COUNT, "0")))
    except ValueError:
        return node.gpus_allocatable


def _class_key(node: NodeInfo) -> tuple[object, ...]:
    """Nodes with equal keys are interchangeable for routing (volatile labels left out)."""
    labels = node.labels
    if labels:
        labels = labels.copy()
        for key in VOLATILE_LABELS:
            labels.pop(key, None)
    return (
        node.pool,
        node.gpu_product,
        node.gpu_memory_mib,
        installed_gpus(node),
        frozenset(labels.items()) if labels else None,
        tuple(node.taints) if node.taints else None,  # order only ever splits a class, never merges
        tuple(node.sharing) if node.sharing else None,
    )


def node_classes(nodes: Iterable[NodeInfo]) -> tuple[NodeClass, ...]:
    """The nodes grouped into classes of interchangeable nodes, in a deterministic order."""
    groups: dict[tuple[object, ...], tuple[NodeClass, dict[int, int], list[NodeInfo]]] = {}
    for node in nodes:
        key = _class_key(node)
        entry = groups.get(key)
        if entry is None:
            cls = NodeClass(
                pool=node.pool,
                product=node.gpu_product,
                memory_mib=node.gpu_memory_mib,
                allocatable=installed_gpus(node),
                labels={k: v for k, v in node.labels.items() if k not in VOLATILE_LABELS},
                taints=tuple(t for t in node.taints if t.effect in BLOCKING_EFFECTS),
                sharing=frozenset(node.sharing),
            )
            entry = groups[key] = (cls, {}, [])
        cls, hist, members = entry
        members.append(node)
        if node.ready and (node.gpus_allocatable > 0 or cls.allocatable == 0):
            alloc = node.gpus_allocatable
            free = node.gpus_free
            if free > alloc:  # comparisons, not min/max: this loop runs once per node
                free = alloc
            elif free < 0:
                free = 0
            hist[free] = hist.get(free, 0) + 1
            if node.cpu_free > cls.cpu_max:
                cls.cpu_max = node.cpu_free
            if node.memory_free > cls.memory_max:
                cls.memory_max = node.memory_free
            if free >= alloc:
                cls.has_idle = True
    out = []
    for cls, hist, members in groups.values():
        cls.nodes = len(members)
        cls.ready = sum(hist.values())
        cls.free_hist = tuple(sorted(hist.items(), reverse=True))
        cls.members = tuple(members)
        out.append(cls)
    out.sort(key=lambda c: (c.pool or "", c.product or "", c.memory_mib, c.allocatable, c.nodes))
    return tuple(out)


class SnapshotIndex:
    """A snapshot prepared for routing: node classes, registry facts as sets, queues by name.

    ``route`` (reference) and :class:`~gpuorch_router.fastpath.RoutingMemo` accept it in place
    of the snapshot. Holds no cache: equal snapshots give equal indexes.
    """

    __slots__ = (
        "artifact_stores",
        "bandwidth",
        "bandwidth_measured",
        "checkpoint_stores",
        "classes",
        "cluster",
        "connections",
        "cpu_reported",
        "credentials",
        "data_locations",
        "datasets_by_name",
        "datasets_cached",
        "error",
        "images_cached",
        "node_count",
        "observed_at",
        "pending_gpus",
        "price",
        "published_at",
        "queue_info",
        "queue_owners",
        "reachable",
        "readable",
        "registry_facts",
        "snapshot",
        "startup",
    )

    classes: tuple[NodeClass, ...]
    node_count: int
    cpu_reported: bool
    registry_facts: tuple[object, ...]

    def __init__(self, snapshot: ClusterSnapshot, previous: SnapshotIndex | None = None) -> None:
        """`previous`: the same cluster's last index, or None; the index is the same either way
        (equal nodes give equal classes; the previous index's are shared, never changed)."""
        reg = snapshot.registry
        self.snapshot = snapshot
        self.cluster = snapshot.cluster
        self.reachable = snapshot.reachable
        self.observed_at = snapshot.observed_at
        self.published_at = snapshot.published_at
        self.error = snapshot.error
        before = previous.snapshot if previous is not None and previous.cluster == snapshot.cluster else None
        if before is not None and (before.nodes is snapshot.nodes or before.nodes == snapshot.nodes):
            assert previous is not None
            self.classes, self.node_count, self.cpu_reported = previous.classes, previous.node_count, previous.cpu_reported
        else:
            self.classes = node_classes(snapshot.nodes)
            self.node_count = len(snapshot.nodes)
            # Inventory that does not report free CPU/memory leaves every node at 0/0: then not checked.
            self.cpu_reported = any(n.cpu_free > 0 or n.memory_free > 0 for n in snapshot.nodes)
        if before is not None and (before.registry is reg or before.registry == reg):
            assert previous is not None
            self._registry_from(previous)
        else:
            self._registry_sets(snapshot)
        # The registry is the authority on which queues exist and who may use them; a snapshot's
        # observed queues stand in only when the registry names none.
        owners: dict[str, tuple[str, ...]] = {}
        if reg.queues:
            for q in reg.queues:
                owners[q.name] = tuple(q.owners)
        else:
            for qi in snapshot.queues:
                owners[qi.name] = tuple(qi.owners)
        self.queue_owners: Mapping[str, tuple[str, ...]] = owners
        self.queue_info: Mapping[str, QueueInfo] = {q.name: q for q in snapshot.queues}
        self.pending_gpus = snapshot.pending_gpus

    def _registry_from(self, previous: SnapshotIndex) -> None:
        for name, value in zip(REGISTRY_FACTS, previous.registry_facts, strict=True):
            setattr(self, name, value)
        self.registry_facts = previous.registry_facts

    def _registry_sets(self, snapshot: ClusterSnapshot) -> None:
        reg = snapshot.registry
        self.artifact_stores = frozenset(reg.artifact_stores)
        self.checkpoint_stores = frozenset(reg.checkpoint_stores) | self.artifact_stores
        self.connections = frozenset(reg.connections)
        self.credentials = frozenset(reg.credentials)
        self.datasets_cached = frozenset(reg.datasets_cached)
        by_name: dict[str, list[str]] = {}
        for ref in sorted(reg.datasets_cached):
            by_name.setdefault(ref.split("@", 1)[0], []).append(ref)
        self.datasets_by_name: Mapping[str, list[str]] = by_name
        self.images_cached = frozenset(reg.images_cached)
        self.bandwidth: Mapping[str, float] = dict(reg.bandwidth_mbps)
        # the links whose figure is measured staging throughput (inventory), not the registry's
        self.bandwidth_measured = frozenset(loc for loc in reg.bandwidth_measured if loc in self.bandwidth)
        self.data_locations = frozenset(reg.data_locations)
        # Where an input is read in place: its local data locations, and the artifact stores it
        # reaches for which the registry names no link (a store with a `bandwidth_mbps` entry is
        # copied over that link, like any remote data location). A pipeline stage's inputs are
        # replicas in the stores its dependencies were promoted to (`pipeline.input_dataset`).
        self.readable = self.data_locations | frozenset(s for s in reg.artifact_stores if s not in self.bandwidth)
        self.startup = max(0.0, reg.startup_seconds)
        self.price = max(0.0, reg.price_per_gpu_hour)
        #: every attribute of `REGISTRY_FACTS`, in that order: one object for indexes that share them
        self.registry_facts = tuple(getattr(self, name) for name in REGISTRY_FACTS)


#: the index's attributes made from the registry alone (`SnapshotIndex._registry_sets`)
REGISTRY_FACTS: Final = (
    "artifact_stores",
    "checkpoint_stores",
    "connections",
    "credentials",
    "datasets_cached",
    "datasets_by_name",
    "images_cached",
    "bandwidth",
    "bandwidth_measured",
    "data_locations",
    "readable",
    "startup",
    "price",
)
