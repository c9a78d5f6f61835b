"""The router's pure routing policy (DESIGN §5): eligibility with reasons, then time to result.

Functional core: no I/O, no clock, no logging. ``route`` takes the workload, the latest snapshot of
every cluster and ``now`` and returns a :class:`~gpuorch_proto.routing.RoutingDecision` that records
every cluster's verdict, every check with a message that names its numbers, and every estimate term.
The same inputs always give the same decision (ties are broken by cluster name).

Three steps, documented in full in ``docs/routing.md``:

1. **Hard eligibility.** Every cluster, every check. A failed check is either *permanent* (the
   cluster's nature or configuration: no node of that model or memory, no such store, connection,
   credential or data path, queue not open to the owner, no sharing mechanism, shape larger than
   any node, gang larger than the cluster) or *capacity-only* (it may pass later without anyone
   changing the workload: the cluster is unreachable or its snapshot stale, suitable nodes exist
   but are not Ready, the caller excluded it for now). Busy GPUs never make a cluster ineligible:
   work queues at the destination and that shows in the queue-wait estimate.
2. **Estimate** per eligible cluster (simulated seconds, the snapshot's clock): queue wait, image
   and data staging (partly hidden behind the queue wait by a measured overlap fraction), startup,
   run time scaled by GPU model, output transfer; then cost, and a score weighted by the
   workload's preferences.
3. **Outcome.** ``routed`` to the lowest score; else ``waiting`` when some cluster fails only
   capacity-only checks; else ``rejected`` with every cluster's permanent reasons. A pinned target
   (``spec.queue = "<cluster>/<queue>"``) is the only candidate: never a silent fallback.

Performance: a :class:`SnapshotIndex` groups a snapshot's nodes into *classes* of identical nodes
(pool, model, memory, allocatable GPUs, labels, taints, sharing) with counts and a histogram of free
GPUs, so checks cost O(classes), not O(nodes). Indexes are memoised by snapshot identity, and each
index memoises its evaluation per workload *signature* (the fields that matter to routing), so a
stream of similar workloads (a sweep's trials) costs a dictionary lookup per cluster. Below that,
each index memoises parts of the checks by the demand fields they read (node filters, GPU shape,
registry checks and staging, queue placement), so a new signature recomputes only what it changes;
an ineligible cluster's verdict is shared by every signature with the same checks, and a new
snapshot age rebuilds only the verdict record. A signature decided again at another `now` gets a
*plan* (per world, exclusion and max age): the verdicts with everything but the age prebuilt, the
eligible clusters and, when routed, the decision itself, valid while no cluster's staleness changes;
a decision at new ages then only fills in ages and shared freshness checks. Memoisation does not
change results: each memo is keyed on everything its evaluation reads.
"""

from __future__ import annotations

import bisect
import itertools
import math
import operator
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Final

import msgspec

from gpuorch_proto.inventory import ClusterSnapshot, NodeInfo, QueueInfo, Taint
from gpuorch_proto.placement import (
    GPU_MEMORY_TOLERANCE,
    LABEL_GPU_COUNT,
    Placement,
    accelerator_matches,
    gpu_memory_floor_mib,
    placement_for,
)
from gpuorch_proto.routing import Check, ClusterVerdict, Estimate, ReasonCode, RoutingDecision
from gpuorch_proto.units import format_duration, parse_duration, parse_quantity
from gpuorch_proto.workload import DatasetInput, Requirements, Resources, Sharing, Toleration, Workload

from .history import MeasuredTimeline, RoutingHistory, update_history

__all__ = [
    "DEFAULT_IMAGE_PULL_SECONDS",
    "DEFAULT_OUTPUT_TRANSFER_SECONDS",
    "DEFAULT_RUN_SECONDS",
    "GPU_MEMORY_TOLERANCE",
    "MEAN_JOB_SECONDS",
    "PREFERRED_CLUSTER_FACTOR",
    "PREFERRED_POOL_FACTOR",
    "RELATIVE_SPEED",
    "MeasuredTimeline",
    "NodeClass",
    "RoutingHistory",
    "SnapshotIndex",
    "build_index",
    "eligible_nodes",
    "relative_speed",
    "route",
    "update_history",
]

# ---- documented constants (docs/routing.md) ---------------------------------------------------

#: Throughput relative to an A100 (= 1.0), by GPU family token in the GFD product name. Coarse
#: figures for mixed-precision training; a workload class's measured history overrides them.
RELATIVE_SPEED: Final[Mapping[str, float]] = {
    "B200": 4.0,
    "GH200": 2.4,
    "H200": 2.4,
    "H100": 2.0,
    "H800": 2.0,
    "MI300X": 2.0,
    "A100": 1.0,
    "A800": 1.0,
    "MI250X": 0.9,
    "L40S": 0.9,
    "L40": 0.7,
    "A40": 0.6,
    "A6000": 0.6,
    "V100": 0.5,
    "A10G": 0.45,
    "A10": 0.45,
    "L4": 0.35,
    "T4": 0.15,
}
#: Run time assumed when neither the workload nor history says (seconds on a speed-1.0 GPU).
DEFAULT_RUN_SECONDS: Final = 3600.0
#: Image pull when the image digest is not in the cluster's ``images_cached``.
DEFAULT_IMAGE_PULL_SECONDS: Final = 120.0
#: Output transfer (finished → promoted) when history has no measurement for the cluster.
DEFAULT_OUTPUT_TRANSFER_SECONDS: Final = 60.0
#: Mean GPU job length used to turn a GPU backlog into a wait when the queue has no measured estimate.
MEAN_JOB_SECONDS: Final = 3600.0
#: Score multipliers for soft preferences (lower score wins): a small nudge, never a hard rule.
PREFERRED_CLUSTER_FACTOR: Final = 0.95
PREFERRED_POOL_FACTOR: Final = 0.98
#: Labels unique per node: left out of node classes (else every node is its own class).
VOLATILE_LABELS: Final = frozenset({"kubernetes.io/hostname"})
_SCHEDULING_EFFECTS: Final = frozenset({"NoSchedule", "NoExecute"})
_INDEX_CACHE_SIZE: Final = 512
_MEMO_SIZE: Final = 4096


# ---- small pure helpers -------------------------------------------------------------------------


def _tokens(text: str) -> tuple[str, ...]:
    return tuple(t for t in text.upper().replace("_", "-").replace(" ", "-").split("-") if t)


@lru_cache(maxsize=1024)
def relative_speed(product: str | None) -> float:
    """Throughput of `product` relative to an A100; unknown models (and CPU) are 1.0."""
    if not product:
        return 1.0
    for token in _tokens(product):
        speed = RELATIVE_SPEED.get(token)
        if speed is not None:
            return speed
    return 1.0


def tolerates(tolerations: Iterable[Toleration], taint: Taint) -> bool:
    """Kubernetes toleration semantics for one taint."""
    for tol in tolerations:
        if tol.effect and tol.effect != taint.effect:
            continue
        if not tol.key:
            if tol.operator == "Exists":
                return True
            continue
        if tol.key != taint.key:
            continue
        if tol.operator == "Exists" or (tol.value or "") == (taint.value or ""):
            return True
    return False


def _gib(n_bytes: float) -> str:
    return f"{n_bytes / 2**30:.3g} GiB"


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def _listing(items: Iterable[str], empty: str = "none") -> str:
    out = ", ".join(items)
    return out or empty


def _dur(seconds: float) -> str:
    return format_duration(seconds) if seconds > 0 else "0s"


# ---- the snapshot index -------------------------------------------------------------------------


@dataclass(slots=True, eq=False)
class NodeClass:
    """Identical nodes of one snapshot, with counts and a histogram of free GPUs on Ready nodes."""

    pool: str | None
    product: str | None
    memory_mib: int
    allocatable: int  # GPUs per node
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
    free_slots: dict[int, int] = field(default_factory=dict)  # GPUs per placement -> free placements

    def describe(self) -> str:
        gpu = f"{self.allocatable}x {self.product}" if self.allocatable else "no GPU"
        return f"{gpu} in pool {self.pool or '-'} ({_plural(self.nodes, 'node')}, {self.ready} Ready)"


GFD_COUNT: Final = LABEL_GPU_COUNT


def installed_gpus(node: NodeInfo) -> int:
    """GPUs the node has (GPU Feature Discovery's count), even while fewer are allocatable.

    The shape a cluster can ever hold is judged on installed GPUs; a node whose device plugin
    currently reports none (maintenance, a failing GPU) is lost capacity, not a smaller node.
    """
    try:
        return max(node.gpus_allocatable, int(node.labels.get(GFD_COUNT, "0")))
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


def _classes(nodes: Iterable[NodeInfo]) -> tuple[NodeClass, ...]:
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
                taints=tuple(t for t in node.taints if t.effect in _SCHEDULING_EFFECTS),
                sharing=frozenset(node.sharing),
            )
            entry = groups[key] = (cls, {}, [])
        cls, hist, members = entry
        members.append(node)
        if node.ready and (node.gpus_allocatable > 0 or cls.allocatable == 0):
            alloc = node.gpus_allocatable
            free = node.gpus_free
            if free > alloc:
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

    Built once per snapshot (:func:`build_index`); ``route`` accepts it in place of the snapshot.
    ``memo`` caches per-workload-signature evaluations and belongs to this snapshot only.
    """

    __slots__ = (
        "artifact_stores",
        "bandwidth",
        "checkpoint_stores",
        "classes",
        "cluster",
        "connections",
        "cpu_reported",
        "credentials",
        "data_locations",
        "datasets_by_name",
        "datasets_cached",
        "elig_memo",
        "error",
        "images_cached",
        "memo",
        "node_count",
        "node_memo",
        "observed_at",
        "pending_gpus",
        "place_memo",
        "price",
        "published_at",
        "queue_info",
        "queue_owners",
        "reachable",
        "reg_memo",
        "shape_memo",
        "snapshot",
        "startup",
    )

    def __init__(self, snapshot: ClusterSnapshot) -> None:
        reg = snapshot.registry
        self.snapshot = snapshot
        self.cluster = snapshot.cluster
        self.reachable = snapshot.reachable
        self.observed_at = snapshot.observed_at
        self.published_at = snapshot.published_at
        self.error = snapshot.error
        self.classes = _classes(snapshot.nodes)
        self.node_count = len(snapshot.nodes)
        # Inventory that does not report free CPU/memory leaves every node at 0/0: then not checked.
        self.cpu_reported = any(n.cpu_free > 0 or n.memory_free > 0 for n in snapshot.nodes)
        self.artifact_stores = frozenset(reg.artifact_stores)
        self.checkpoint_stores = frozenset(reg.checkpoint_stores) | self.artifact_stores
        self.connections = frozenset(reg.connections)
        self.credentials = frozenset(reg.credentials)
        self.datasets_cached = frozenset(reg.datasets_cached)
        by_name: dict[str, list[str]] = {}
        for ref in sorted(reg.datasets_cached):
            by_name.setdefault(ref.split("@", 1)[0], []).append(ref)
        self.datasets_by_name = by_name
        self.images_cached = frozenset(reg.images_cached)
        self.bandwidth = dict(reg.bandwidth_mbps)
        self.data_locations = frozenset(reg.data_locations)
        self.startup = max(0.0, reg.startup_seconds)
        self.price = max(0.0, reg.price_per_gpu_hour)
        # The registry is the authority on which queues exist and who may use them; a snapshot's
        # observed queues stand in only when the registry names none.
        owners: dict[str, tuple[str, ...]] = {}
        if reg.queues:
            for q in reg.queues:
                owners[q.name] = tuple(q.owners)
        else:
            for qi in snapshot.queues:
                owners[qi.name] = tuple(qi.owners)
        self.queue_owners = owners
        self.queue_info: dict[str, QueueInfo] = {q.name: q for q in snapshot.queues}
        self.pending_gpus = snapshot.pending_gpus
        self.memo: dict[int, _Eval] = {}
        self.elig_memo: dict[int, _Elig] = {}
        self.node_memo: dict[tuple[object, ...], tuple[tuple[Check, ...], tuple[NodeClass, ...]]] = {}
        self.shape_memo: dict[tuple[object, ...], tuple[tuple[Check, ...], tuple[NodeClass, ...]]] = {}
        self.place_memo: dict[tuple[object, ...], tuple[float, str, str | None, frozenset[str]]] = {}
        self.reg_memo: dict[tuple[object, ...], tuple[_Staging, tuple[Check, ...], tuple[str, ...]]] = {}


_INDEXES: dict[int, tuple[ClusterSnapshot, SnapshotIndex]] = {}


def build_index(snapshot: ClusterSnapshot) -> SnapshotIndex:
    """The index of `snapshot`, memoised by identity (a new snapshot object gets a new index)."""
    entry = _INDEXES.get(id(snapshot))
    if entry is not None and entry[0] is snapshot:
        return entry[1]
    index = SnapshotIndex(snapshot)
    if len(_INDEXES) >= _INDEX_CACHE_SIZE:
        del _INDEXES[next(iter(_INDEXES))]
    _INDEXES[id(snapshot)] = (snapshot, index)
    return index


# ---- the workload's demand, parsed once per decision --------------------------------------------


@dataclass(slots=True, eq=False)
class _Demand:
    gpus: float
    workers: int
    same_node: bool
    fractional: bool
    per_worker: int  # whole devices per worker (a shared slice occupies one device)
    per_node: int  # devices one node must offer: per_worker, or the whole gang when same_node
    units: int  # placements needed: workers, or 1 when same_node
    cpu_node: float
    memory_node: float
    gpu_memory_mib: float | None
    accelerators: tuple[str, ...]
    sharing: Sharing | None
    pools: frozenset[str]
    selector: tuple[tuple[str, str], ...]
    tolerations: tuple[Toleration, ...]
    connections: tuple[str, ...]
    credentials: tuple[str, ...]
    allowed: frozenset[str]
    output_store: str
    checkpoint_store: str | None
    checkpoint_location: str | None
    inputs: tuple[DatasetInput, ...]
    image: str
    declared_run: float | None
    reference: str | None
    key: str
    owner: str
    pin: tuple[str, str] | None
    prefer_clusters: frozenset[str]
    prefer_pools: frozenset[str]
    time_weight: float
    cost_weight: float
    history: RoutingHistory | None
    resources: Resources  # as written: the Job's constraints are built from them (placement_for)
    requirements: Requirements
    sig: int = 0  # full signature id (memo of the evaluation with its estimate)
    elig_sig: int = 0  # eligibility signature id (memo of the checks)
    node_key: tuple[object, ...] = ()  # what the node-filter prefix reads (pool .. sharing)
    reg_key: tuple[object, ...] = ()  # what the registry checks and data staging read


_SIG_IDS = itertools.count(1)
_ENC = msgspec.msgpack.Encoder()
# (eligibility bytes, estimate bytes, history, checkpoint location) -> demand; equal keys, equal demand
_BY_SIG: dict[tuple[bytes, bytes, RoutingHistory | None, str | None], _Demand] = {}
_ELIG_IDS: dict[tuple[bytes, str | None], int] = {}
_BY_ID: dict[int, tuple[Workload, RoutingHistory | None, str | None, _Demand]] = {}


def _demand(wl: Workload, history: RoutingHistory | None, checkpoint_location: str | None) -> _Demand:
    """The workload's demand, shared by every workload with the same routing-relevant fields.

    Two signatures key the memos: the *eligibility* signature (everything the checks read) and
    the full one (plus what only the estimate reads: image, run time, class, preferences, history).
    """
    cached = _BY_ID.get(id(wl))
    if cached is not None and cached[0] is wl and cached[1] is history and cached[2] == checkpoint_location:
        return cached[3]
    spec, meta = wl.spec, wl.metadata
    ckpt_store = spec.checkpoint.store if (spec.checkpoint.store and spec.checkpoint.path) else None
    elig = _ENC.encode(
        (
            spec.resources,
            spec.requirements,
            spec.inputs,
            spec.output.store,
            ckpt_store,
            spec.queue,
            meta.owner,
        )
    )
    est = _ENC.encode(
        (
            spec.image,
            spec.expected_runtime,
            spec.reference_accelerator,
            meta.workload_class or meta.name,
            spec.preferences,
        )
    )
    key = (elig, est, history, checkpoint_location)
    d = _BY_SIG.get(key)
    if d is None:
        d = _parse(wl, history, checkpoint_location, ckpt_store)
        if len(_BY_SIG) >= 16384:
            _BY_SIG.clear()  # ids keep counting, so an old id never names another signature
            _ELIG_IDS.clear()
        elig_key = (elig, checkpoint_location)
        elig_id = _ELIG_IDS.get(elig_key)
        if elig_id is None:
            elig_id = _ELIG_IDS[elig_key] = next(_SIG_IDS)
        d.elig_sig = elig_id
        d.sig = next(_SIG_IDS)
        _BY_SIG[key] = d
    if len(_BY_ID) >= 1024:
        del _BY_ID[next(iter(_BY_ID))]
    _BY_ID[id(wl)] = (wl, history, checkpoint_location, d)
    return d


def _parse(
    wl: Workload, history: RoutingHistory | None, checkpoint_location: str | None, ckpt_store: str | None
) -> _Demand:
    spec = wl.spec
    res, req, prefs = spec.resources, spec.requirements, spec.preferences
    gpus = float(res.gpus)
    workers = max(1, res.workers)
    per_worker = math.ceil(gpus) if gpus > 0 else 0
    cpu = parse_quantity(res.cpu)
    memory = parse_quantity(res.memory)
    pin: tuple[str, str] | None = None
    if spec.queue:
        agent, _, queue = spec.queue.partition("/")
        pin = (agent, queue)
    d = _Demand(
        gpus=gpus,
        workers=workers,
        same_node=res.same_node,
        fractional=gpus != int(gpus),
        per_worker=per_worker,
        per_node=per_worker * workers if res.same_node else per_worker,
        units=1 if res.same_node else workers,
        cpu_node=cpu * workers if res.same_node else cpu,
        memory_node=memory * workers if res.same_node else memory,
        gpu_memory_mib=res.gpu_memory_gib * 1024 if res.gpu_memory_gib else None,
        accelerators=tuple(res.accelerators),
        sharing=res.sharing,
        pools=frozenset(req.pools),
        selector=tuple(sorted(req.node_selector.items())),
        tolerations=tuple(req.tolerations),
        connections=tuple(sorted(set(req.connections))),
        credentials=tuple(sorted(set(req.credentials))),
        allowed=frozenset(req.clusters),
        output_store=spec.output.store,
        checkpoint_store=ckpt_store,
        checkpoint_location=checkpoint_location,
        inputs=tuple(spec.inputs),
        image=spec.image,
        declared_run=parse_duration(spec.expected_runtime) if spec.expected_runtime else None,
        reference=spec.reference_accelerator,
        key=wl.metadata.workload_class or wl.metadata.name,
        owner=wl.metadata.owner,
        pin=pin,
        prefer_clusters=frozenset(prefs.clusters),
        prefer_pools=frozenset(prefs.pools),
        time_weight=prefs.time_weight,
        cost_weight=prefs.cost_weight,
        history=history,
        resources=res,
        requirements=req,
    )
    d.node_key = (
        d.pools,
        d.selector,
        d.tolerations,
        d.per_worker == 0,
        d.accelerators,
        d.gpu_memory_mib,
        d.sharing,
        d.fractional,
        d.gpus if (d.sharing is not None or d.fractional) else None,
    )
    d.reg_key = (
        d.connections,
        d.credentials,
        d.output_store,
        _ENC.encode(d.inputs) if d.inputs else b"",
        d.checkpoint_store,
        d.checkpoint_location,
        d.pin,
        d.owner,
    )
    return d


# ---- per-cluster evaluation (memoised per index and signature) ----------------------------------


@dataclass(slots=True, eq=False)
class _Elig:
    """The checks of one (snapshot, eligibility signature), with what the estimate needs."""

    checks: list[Check]
    ok: bool
    staging: _Staging
    queue_wait: float = 0.0
    queue: str = ""  # "" = the cluster has no admission queues
    product: str | None = None  # GPU model the run time is scaled to
    pools: frozenset[str] = frozenset()  # pools of the suitable nodes (for the pool preference)
    placement: Placement | None = None  # the Job's node constraints here, when eligible
    # the last ineligible verdict built from these checks (it has no estimate, so every full
    # signature sharing these checks shares it)
    verdict_key: tuple[str, float, bool, bool, float] | None = None
    verdict: ClusterVerdict | None = None
    ineligible: _Eval | None = None  # the evaluation of every full signature, when not ok
    # the last freshness check and the verdict check list it heads: shared by the eligible
    # verdicts of every full signature (estimate) with these checks
    listed: tuple[Check, list[Check]] | None = None


@dataclass(slots=True, eq=False)
class _Eval:
    """One (snapshot, full signature): the checks, the estimate, and the last verdict built."""

    elig: _Elig
    estimate: Estimate | None = None
    score: float = 0.0  # estimate.score
    queue: str | None = None
    terms: str = ""  # the estimate in a few words, built the first time it is summarised
    verdict_key: tuple[str, float, bool, bool, float] | None = None
    verdict: ClusterVerdict | None = None


def _ok(code: ReasonCode, message: str) -> Check:
    return Check(code=code, ok=True, message=message)


def _fail(code: ReasonCode, message: str, capacity_only: bool = False) -> Check:
    return Check(code=code, ok=False, message=message, capacity_only=capacity_only)


_CONST: dict[tuple[ReasonCode, str], Check] = {}


def _const(code: ReasonCode, message: str) -> Check:
    """A shared passing check (frozen structs are safe to share between decisions)."""
    check = _CONST.get((code, message))
    if check is None:
        check = _CONST[(code, message)] = _ok(code, message)
    return check


_NODE_COUNT: Final = operator.attrgetter("nodes")


def _nodes(classes: Iterable[NodeClass]) -> int:
    return sum(map(_NODE_COUNT, classes))


def _slots(cls: NodeClass, per_node: int, units: int, *, ready: bool) -> int:
    count = cls.ready if ready else cls.nodes
    if per_node <= 0:
        return count * units  # no GPU: GPUs do not limit placements
    return count * (cls.allocatable // per_node)


def _free_slots(cls: NodeClass, per_node: int, units: int) -> int:
    if per_node <= 0:
        return cls.ready * units
    slots = cls.free_slots.get(per_node)
    if slots is None:
        slots = cls.free_slots[per_node] = sum(n * (free // per_node) for free, n in cls.free_hist)
    return slots


class _Chain:
    """Node checks as a filter chain over classes, in `condor_q -better-analyze` style.

    Each check sees the classes that passed the earlier checks; once a check fails (nothing left),
    later checks are judged against every class so each still reports something meaningful.
    """

    def __init__(self, classes: Sequence[NodeClass]) -> None:
        self.all = classes
        self.left: list[NodeClass] = list(classes)
        self.checks: list[Check] = []

    def step(
        self,
        code: ReasonCode,
        pred: Callable[[NodeClass], bool],
        ok_msg: Callable[[list[NodeClass], Sequence[NodeClass]], str],
        fail_msg: Callable[[Sequence[NodeClass]], str],
    ) -> list[NodeClass]:
        base: Sequence[NodeClass] = self.left if self.left else self.all
        passing = [c for c in base if pred(c)]
        if passing:
            self.checks.append(_ok(code, ok_msg(passing, base)))
        else:
            self.checks.append(_fail(code, fail_msg(base)))
        if self.left:
            self.left = passing
        return passing


def _summary_of(classes: Sequence[NodeClass], attr: Callable[[NodeClass], str]) -> str:
    counts: dict[str, int] = {}
    for c in classes:
        counts[attr(c)] = counts.get(attr(c), 0) + c.nodes
    return _listing(f"{k} ({_plural(v, 'node')})" for k, v in sorted(counts.items()))


def _node_filter(chain: _Chain, d: _Demand) -> None:
    """The node checks that depend on the node classes and the demand's `node_key` only."""
    if d.pools:
        pools = sorted(d.pools)
        chain.step(
            "POOL",
            lambda c: c.pool in d.pools,
            lambda p, b: f"{_nodes(p)} of {_nodes(b)} nodes in pools {_listing(pools)}",
            lambda b: (
                f"no node in pools {_listing(pools)}; pools here: " + _summary_of(b, lambda c: c.pool or "-")
            ),
        )
    else:
        chain.checks.append(_const("POOL", "any pool allowed"))
    if d.selector:
        sel = ", ".join(f"{k}={v}" for k, v in d.selector)
        chain.step(
            "NODE_SELECTOR",
            lambda c: all(c.labels.get(k) == v for k, v in d.selector if k not in VOLATILE_LABELS),
            lambda p, b: f"{_nodes(p)} of {_nodes(b)} nodes match {sel}",
            lambda b: f"none of {_plural(_nodes(b), 'node')} has labels {sel}",
        )
    else:
        chain.checks.append(_const("NODE_SELECTOR", "no node selector"))

    def untolerated(c: NodeClass) -> list[Taint]:
        return [t for t in c.taints if not tolerates(d.tolerations, t)]

    chain.step(
        "TAINTS",
        lambda c: not c.taints or not untolerated(c),
        lambda p, b: f"{_nodes(p)} of {_nodes(b)} nodes have no untolerated NoSchedule/NoExecute taint",
        lambda b: (
            "every node has an untolerated taint: "
            + _summary_of(
                b,
                lambda c: ", ".join(f"{t.key}={t.value or ''}:{t.effect}" for t in untolerated(c)),
            )
        ),
    )
    if d.per_worker == 0:
        chain.checks.append(_const("GPU_MODEL", "no GPU requested"))
        chain.checks.append(_const("GPU_MEMORY", "no GPU requested"))
    else:
        if d.accelerators:
            acc = _listing(d.accelerators)
            chain.step(
                "GPU_MODEL",
                lambda c: (
                    c.allocatable > 0 and any(accelerator_matches(a, c.product) for a in d.accelerators)
                ),
                lambda p, b: f"{_nodes(p)} of {_nodes(b)} nodes have a GPU model in [{acc}]",
                lambda b: (
                    f"no node has a GPU model in [{acc}]; models here: "
                    + _summary_of(b, lambda c: c.product or "no GPU")
                ),
            )
        else:
            chain.checks.append(_const("GPU_MODEL", "any GPU model"))
        if d.gpu_memory_mib:
            need = d.gpu_memory_mib
            floor_mib = gpu_memory_floor_mib(need / 1024)  # the Job's `Gt` uses the same floor

            def largest(b: Sequence[NodeClass]) -> str:
                best = max(b, key=lambda c: (c.memory_mib, c.product or ""))
                return f"{best.memory_mib / 1024:.3g} GiB ({best.product or 'no GPU'}, {_plural(best.nodes, 'node')})"

            chain.step(
                "GPU_MEMORY",
                lambda c: c.allocatable > 0 and c.memory_mib >= floor_mib,
                lambda p, b: f"{_nodes(p)} of {_nodes(b)} nodes have >= {need / 1024:.3g} GiB per GPU",
                lambda b: f"needs >= {need / 1024:.3g} GiB per GPU; largest here {largest(b)}",
            )
        else:
            chain.checks.append(_const("GPU_MEMORY", "no minimum GPU memory"))
    if d.sharing is not None:
        mech = d.sharing.mechanism
        profile = d.sharing.profile
        names = {mech} | ({f"{mech}:{profile}"} if profile else set())
        what = f"{mech} ({profile})" if profile else mech

        def offers(c: NodeClass) -> bool:
            if not (c.sharing & names):
                return False
            # a node that lists profiles for this mechanism must list the wanted one
            specific = [s for s in c.sharing if s.startswith(mech + ":")]
            return not (profile and specific and f"{mech}:{profile}" not in c.sharing)

        chain.step(
            "SHARING",
            offers,
            lambda p, b: f"{_nodes(p)} of {_nodes(b)} nodes offer {what} for {d.gpus:g} GPU per worker",
            lambda b: (
                f"{d.gpus:g} GPU per worker needs {what}; offered here: "
                + _summary_of(b, lambda c: "/".join(sorted(c.sharing)) or "no sharing")
            ),
        )
    elif d.fractional:
        chain.checks.append(
            _fail("SHARING", f"{d.gpus:g} GPUs per worker is not whole and names no sharing mechanism")
        )
    else:
        chain.checks.append(_const("SHARING", "whole GPUs: no sharing needed"))


def _shape_checks(chain: _Chain, d: _Demand, classes: Sequence[NodeClass], total: int) -> list[NodeClass]:
    """GPU_SHAPE, GANG_SPLIT and GPU_CAPACITY after the other node checks; returns the suitable classes."""
    if d.per_worker == 0:
        chain.checks.append(_const("GPU_SHAPE", "no GPU requested"))
    else:
        per_node = d.per_node
        shape = (
            f"{per_node} GPUs ({d.workers} workers x {d.per_worker}) on one node"
            if d.same_node and d.workers > 1
            else f"{_plural(per_node, 'GPU')} on one node"
        )

        def biggest(b: Sequence[NodeClass]) -> str:
            best = max(b, key=lambda c: (c.allocatable, c.nodes))
            return f"{best.allocatable} ({_plural(best.nodes, 'node')} x {_plural(best.allocatable, 'GPU')})"

        chain.step(
            "GPU_SHAPE",
            lambda c: c.allocatable >= per_node,
            lambda p, b: f"{_nodes(p)} of {_nodes(b)} nodes can hold {shape}",
            lambda b: (
                f"needs {shape}; the largest suitable node has {biggest(b)}"
                + (f", {sum(c.allocatable * c.nodes for c in b)} GPUs in total" if len(b) > 0 else "")
            ),
        )
    suitable = chain.left
    if d.units > 1:
        base = suitable if suitable else [c for c in classes if c.allocatable >= d.per_node]
        slots = sum(_slots(c, d.per_node, d.units, ready=False) for c in base)
        gang = f"gang of {d.workers} workers x {_plural(d.per_worker, 'GPU')}"
        if slots >= d.units:
            chain.checks.append(_ok("GANG_SPLIT", f"{gang} fits in this cluster ({slots} worker slots)"))
        else:
            chain.checks.append(
                _fail(
                    "GANG_SPLIT",
                    f"{gang} needs {d.units} worker slots; this cluster has {slots} in total "
                    "(a gang never spans clusters)",
                )
            )
            suitable = []
    else:
        chain.checks.append(_const("GANG_SPLIT", "one placement: no gang to split"))
    if suitable:
        ready_slots = sum(_slots(c, d.per_node, d.units, ready=True) for c in suitable)
        nodes = _nodes(suitable)
        ready = sum(c.ready for c in suitable)
        if ready_slots >= d.units:
            chain.checks.append(
                _ok(
                    "GPU_CAPACITY",
                    f"{ready} of {_plural(nodes, 'suitable node')} Ready: "
                    f"{ready_slots} placement slots for {d.units} needed",
                )
            )
        else:
            chain.checks.append(
                _fail(
                    "GPU_CAPACITY",
                    f"only {ready} of {_plural(nodes, 'suitable node')} are Ready: "
                    f"{ready_slots} placement slots for {d.units} needed (the rest are lost, NotReady or have no allocatable GPUs)",
                    capacity_only=True,
                )
            )
            suitable = []
    else:
        chain.checks.append(
            _fail("GPU_CAPACITY", f"no suitable node among {total}: see the failed node checks")
        )
    return suitable


def _node_checks(idx: SnapshotIndex, d: _Demand) -> tuple[list[Check], list[NodeClass]]:
    """Node-level checks; returns the checks and the suitable classes."""
    classes: Sequence[NodeClass] = idx.classes
    if d.selector and any(k in VOLATILE_LABELS for k, _ in d.selector):
        wanted = {k: v for k, v in d.selector if k in VOLATILE_LABELS}
        classes = _classes(
            n for c in idx.classes for n in c.members if all(n.labels.get(k) == v for k, v in wanted.items())
        )
    if idx.classes and not classes:
        sel = ", ".join(f"{k}={v}" for k, v in d.selector)
        return [_fail("NODE_SELECTOR", f"none of {_plural(idx.node_count, 'node')} has labels {sel}")], []
    if not idx.classes:
        if not idx.reachable:
            return [
                _fail(
                    "GPU_CAPACITY",
                    f"no node facts: {idx.cluster} has not been observed (it may come back)",
                    capacity_only=True,
                )
            ], []
        return [_fail("GPU_CAPACITY", f"{idx.cluster} reports no nodes at all")], []
    total = idx.node_count
    if classes is idx.classes:
        # the node-filter prefix (pool .. sharing) reads only these demand fields: memoised per
        # index on them, so a new CPU request, GPU count or registry need reuses it
        prefix = idx.node_memo.get(d.node_key)
        if prefix is None:
            chain = _Chain(classes)
            _node_filter(chain, d)
            prefix = (tuple(chain.checks), tuple(chain.left))
            if len(idx.node_memo) >= _MEMO_SIZE:
                idx.node_memo.clear()
            idx.node_memo[d.node_key] = prefix
        chain = _Chain(classes)
        chain.checks = list(prefix[0])
        chain.left = list(prefix[1])
    else:
        chain = _Chain(classes)
        _node_filter(chain, d)
    if idx.cpu_reported:
        cpu, mem = d.cpu_node, d.memory_node
        what = f"{cpu:g} cores / {_gib(mem)}" + (" per node (whole gang)" if d.same_node else " per worker")
        chain.step(
            "CPU_MEMORY",
            # a class fits if some Ready node has it free now, or if no node of it is idle (busy
            # nodes free CPU when their pods end: that is queueing, not ineligibility)
            lambda c: (c.cpu_max >= cpu and c.memory_max >= mem) or not c.has_idle,
            lambda p, b: f"{_nodes(p)} of {_nodes(b)} nodes can host {what}",
            lambda b: (
                f"needs {what}; the most an idle suitable node has free is "
                f"{max(c.cpu_max for c in b):g} cores / {_gib(max(c.memory_max for c in b))}"
            ),
        )
    else:
        chain.checks.append(_const("CPU_MEMORY", "free CPU/memory not reported by inventory: not checked"))
    if classes is idx.classes:
        # the rest reads the classes left so far and the gang's shape only
        shape_key = (tuple(chain.left), d.per_worker, d.per_node, d.units, d.workers, d.same_node)
        tail = idx.shape_memo.get(shape_key)
        if tail is None:
            n0 = len(chain.checks)
            suitable = _shape_checks(chain, d, classes, total)
            tail = (tuple(chain.checks[n0:]), tuple(suitable))
            if len(idx.shape_memo) >= _MEMO_SIZE:
                idx.shape_memo.clear()
            idx.shape_memo[shape_key] = tail
        else:
            chain.checks.extend(tail[0])
            suitable = list(tail[1])
    else:
        suitable = _shape_checks(chain, d, classes, total)
    return chain.checks, suitable


def eligible_nodes(workload: Workload, snapshot: ClusterSnapshot | SnapshotIndex) -> frozenset[str]:
    """The nodes the checks count as suitable for `workload` on this cluster (none when they fail).

    The set the Job's constraints (``RoutingDecision.placement``) must accept, and no other: the
    placement property test compares the two over random nodes and workloads.
    """
    idx = snapshot if isinstance(snapshot, SnapshotIndex) else build_index(snapshot)
    _, suitable = _node_checks(idx, _demand(workload, None, None))
    return frozenset(n.name for c in suitable for n in c.members)


@dataclass(slots=True)
class _Staging:
    seconds: float
    notes: list[str]
    failures: list[str]

    @property
    def idle(self) -> str:
        """How inputs that need no copy are available: for the summary."""
        if all(n.endswith(" cached") for n in self.notes):
            return "data cached"
        if all(" local at " in n for n in self.notes):
            return "data local"
        return "data cached/local"


def _data(idx: SnapshotIndex, d: _Demand) -> _Staging:
    seconds, notes, failures = 0.0, [], []
    for inp in d.inputs:
        if inp.ref in idx.datasets_cached:
            notes.append(f"{inp.ref} cached")
            continue
        other = [r for r in idx.datasets_by_name.get(inp.ref.split("@", 1)[0], ()) if r != inp.ref]
        mismatch = f" (cached {_listing(other)} is another version)" if other else ""
        local = sorted(set(inp.locations) & idx.data_locations)
        if local:
            notes.append(f"{inp.ref} local at {local[0]}{mismatch}")
            continue
        links = sorted(
            ((idx.bandwidth[loc], loc) for loc in inp.locations if idx.bandwidth.get(loc, 0) > 0),
            key=lambda x: (-x[0], x[1]),
        )
        if not links:
            failures.append(
                f"{inp.ref}: no replica reachable (replicas at {_listing(sorted(inp.locations))}; "
                f"this cluster has local {_listing(sorted(idx.data_locations))} and links from "
                f"{_listing(sorted(idx.bandwidth))}){mismatch}"
            )
            continue
        mbps, loc = links[0]
        t = inp.size_gb * 1000.0 / mbps
        seconds += t
        notes.append(f"{inp.ref} copy {inp.size_gb:g} GB from {loc} at {mbps:g} MB/s = {_dur(t)}{mismatch}")
    return _Staging(seconds, notes, failures)


def _registry_checks(idx: SnapshotIndex, d: _Demand, staging: _Staging) -> tuple[list[Check], list[str]]:
    checks: list[Check] = []
    needs: tuple[tuple[ReasonCode, tuple[str, ...], frozenset[str], str], ...] = (
        ("CONNECTIONS", d.connections, idx.connections, "connections"),
        ("CREDENTIALS", d.credentials, idx.credentials, "credentials"),
    )
    for code, wanted, have, what in needs:
        if not wanted:
            checks.append(_const(code, f"no {what} required"))
            continue
        missing = [w for w in wanted if w not in have]
        if missing:
            checks.append(
                _fail(code, f"missing {what} {_listing(missing)} (this cluster has {_listing(sorted(have))})")
            )
        else:
            checks.append(_ok(code, f"has {what} {_listing(wanted)}"))
    if d.output_store in idx.artifact_stores:
        checks.append(_ok("ARTIFACT_STORE", f"reaches output store {d.output_store!r}"))
    else:
        checks.append(
            _fail(
                "ARTIFACT_STORE",
                f"cannot reach output store {d.output_store!r} "
                f"(reaches {_listing(sorted(idx.artifact_stores))})",
            )
        )
    if not d.inputs:
        checks.append(_const("INPUT_DATA", "no inputs"))
    elif staging.failures:
        checks.append(_fail("INPUT_DATA", "; ".join(staging.failures)))
    else:
        checks.append(_ok("INPUT_DATA", "; ".join(staging.notes)))
    ck_fail: list[str] = []
    ck_ok: list[str] = []
    stores = idx.checkpoint_stores
    if d.checkpoint_store:
        if d.checkpoint_store in idx.artifact_stores:
            ck_ok.append(f"writes checkpoints to {d.checkpoint_store!r}")
        else:
            ck_fail.append(f"cannot write checkpoints to store {d.checkpoint_store!r}")
    if d.checkpoint_location:
        loc = d.checkpoint_location
        readable = sorted(s for s in stores if loc == s or loc.startswith(s.rstrip("/") + "/"))
        if readable:
            ck_ok.append(f"reads the resume checkpoint {loc!r} via {readable[0]!r}")
        else:
            ck_fail.append(f"cannot read the resume checkpoint {loc!r} (reads {_listing(sorted(stores))})")
    if ck_fail:
        checks.append(_fail("CHECKPOINT", "; ".join(ck_fail)))
    elif ck_ok:
        checks.append(_ok("CHECKPOINT", "; ".join(ck_ok)))
    else:
        checks.append(_const("CHECKPOINT", "no checkpoint to write or resume"))
    queues, q_check = _queue_access(idx, d)
    checks.append(q_check)
    return checks, queues


def _may_use(owners: Sequence[str], owner: str) -> bool:
    return "*" in owners or owner in owners


def _queue_access(idx: SnapshotIndex, d: _Demand) -> tuple[list[str], Check]:
    """The queues this owner may use here ([""] = none needed) and the QUEUE_ACCESS check."""
    owners = idx.queue_owners
    known = _listing(f"{q} [{','.join(o)}]" for q, o in sorted(owners.items()))
    if d.pin is not None:
        queue = d.pin[1]
        if queue not in owners:
            return [], _fail("QUEUE_ACCESS", f"pinned queue {queue!r} does not exist here (queues: {known})")
        if not _may_use(owners[queue], d.owner):
            return [], _fail(
                "QUEUE_ACCESS",
                f"queue {queue!r} is not open to owner {d.owner!r} (owners: {','.join(owners[queue])})",
            )
        return [queue], _ok("QUEUE_ACCESS", f"pinned queue {queue!r} is open to {d.owner!r}")
    if not owners:
        return [""], _const("QUEUE_ACCESS", "no admission queues: submitted directly")
    allowed = sorted(q for q, o in owners.items() if _may_use(o, d.owner))
    if not allowed:
        return [], _fail("QUEUE_ACCESS", f"no queue here is open to owner {d.owner!r} (queues: {known})")
    return allowed, _ok("QUEUE_ACCESS", f"owner {d.owner!r} may use {_listing(allowed)}")


def _queue_wait(
    idx: SnapshotIndex, d: _Demand, suitable: Sequence[NodeClass], queue: str
) -> tuple[float, str]:
    """(seconds, why) until the gang could start here, for one queue."""
    free_slots = sum(_free_slots(c, d.per_node, d.units) for c in suitable)
    fits_now = free_slots >= d.units
    info = idx.queue_info.get(queue) if queue else None
    ahead = info.pending_gpus if info is not None else idx.pending_gpus
    if fits_now and ahead <= 0:
        return 0.0, "fits now"
    if info is not None and info.estimated_wait_seconds > 0:
        return info.estimated_wait_seconds, f"queue {queue} estimate"
    if d.per_node <= 0:
        return 0.0, "no GPU"
    capacity = sum(c.ready * c.allocatable for c in suitable)
    free = sum(f * n for c in suitable for f, n in c.free_hist)
    need = d.per_worker * d.workers
    backlog = float(ahead + need - free)
    if not fits_now:
        backlog = max(backlog, float(d.per_node))  # fragmented: a node must drain first
    if backlog <= 0 or capacity <= 0:
        return 0.0, "fits now"
    return MEAN_JOB_SECONDS * backlog / capacity, f"{backlog:g} GPUs backlog on {capacity} suitable GPUs"


def _run_seconds(d: _Demand, product: str | None) -> tuple[float, str]:
    target = relative_speed(product)
    if d.history is not None:
        per_model = d.history.run_seconds.get(d.key)
        if per_model:
            if product is not None and product in per_model:
                return per_model[product], f"measured on {product}"
            src = sorted(per_model)[0]
            return per_model[src] * relative_speed(
                src
            ) / target, f"measured on {src or 'unknown GPU'}, scaled"
    if d.declared_run is not None:
        ref = relative_speed(d.reference)
        return d.declared_run * ref / target, "declared"
    return DEFAULT_RUN_SECONDS / target, "default"


def _placement(
    idx: SnapshotIndex, d: _Demand, suitable: Sequence[NodeClass], queues: Sequence[str]
) -> tuple[float, str, str | None]:
    """(queue wait, queue, GPU model assumed) for an eligible cluster; depends on the checks only."""
    queue_wait, queue = math.inf, ""
    for q in queues:
        wait, _ = _queue_wait(idx, d, suitable, q)
        if (wait, q) < (queue_wait, queue):
            queue_wait, queue = wait, q
    # the destination places the gang: assume the slowest suitable model (routing is not placement)
    products = sorted({c.product for c in suitable if c.allocatable > 0 and c.product}, key=relative_speed)
    product = products[0] if (products and d.per_worker > 0) else None
    return queue_wait, queue, product


def _estimate(idx: SnapshotIndex, d: _Demand, elig: _Elig) -> Estimate:
    queue_wait, product, staging = elig.queue_wait, elig.product, elig.staging
    image = 0.0 if d.image in idx.images_cached else DEFAULT_IMAGE_PULL_SECONDS
    data = staging.seconds
    overlap, _ = d.history.overlap_for(idx.cluster) if d.history is not None else (0.0, False)
    hidden = min(queue_wait, max(0.0, min(1.0, overlap)) * (image + data))
    run, _ = _run_seconds(d, product)
    output = DEFAULT_OUTPUT_TRANSFER_SECONDS
    if d.history is not None:
        output = d.history.output_seconds.get(idx.cluster, output)
    startup = idx.startup
    total = queue_wait + image + data - hidden + startup + run + output
    cost = d.gpus * d.workers * (startup + run) / 3600.0 * idx.price
    score = d.time_weight * total / 3600.0 + d.cost_weight * cost
    if idx.cluster in d.prefer_clusters:
        score *= PREFERRED_CLUSTER_FACTOR
    if d.prefer_pools and not d.prefer_pools.isdisjoint(elig.pools):
        score *= PREFERRED_POOL_FACTOR
    est = Estimate(
        queue_wait=queue_wait,
        image_staging=image,
        data_staging=data,
        staging_overlap=hidden,
        startup=startup,
        run=run,
        output_transfer=output,
        total=total,
        cost=cost,
        score=score,
    )
    return est


def _terms(ev: _Eval, d: _Demand) -> str:
    """The estimate in a few words, for the summary (built only for the winner and runner-up)."""
    if not ev.terms:
        ev.terms = _build_terms(ev, d)
    return ev.terms


def _build_terms(ev: _Eval, d: _Demand) -> str:
    est, elig = ev.estimate, ev.elig
    assert est is not None
    terms = [f"queue {_dur(est.queue_wait)}" if est.queue_wait > 0 else "starts now"]
    if d.inputs:
        terms.append(f"copy {_dur(est.data_staging)}" if est.data_staging > 0 else elig.staging.idle)
    if est.image_staging > 0:
        terms.append(f"image pull {_dur(est.image_staging)}")
    if est.staging_overlap > 0:
        terms.append(f"{_dur(est.staging_overlap)} staging hidden in queue")
    terms.append(f"run {_dur(est.run)}" + (f" on {elig.product}" if elig.product else ""))
    return ", ".join(terms)


def _eligibility(idx: SnapshotIndex, d: _Demand) -> _Elig:
    checks: list[Check] = []
    if d.allowed and idx.cluster not in d.allowed:
        checks.append(
            _fail("CLUSTER_NOT_ALLOWED", f"not in requirements.clusters ({_listing(sorted(d.allowed))})")
        )
    elif d.allowed:
        checks.append(_ok("CLUSTER_NOT_ALLOWED", "in requirements.clusters"))
    else:
        checks.append(_const("CLUSTER_NOT_ALLOWED", "any cluster allowed"))
    node_checks, suitable = _node_checks(idx, d)
    checks.extend(node_checks)
    reg = idx.reg_memo.get(d.reg_key)
    if reg is None:
        staging = _data(idx, d)
        reg_list, queue_list = _registry_checks(idx, d, staging)
        reg = (staging, tuple(reg_list), tuple(queue_list))
        if len(idx.reg_memo) >= _MEMO_SIZE:
            idx.reg_memo.clear()
        idx.reg_memo[d.reg_key] = reg
    staging, reg_checks, queues = reg
    checks.extend(reg_checks)
    elig = _Elig(checks=checks, ok=all(map(_CHECK_OK, checks)), staging=staging)
    if elig.ok:
        key = (tuple(suitable), queues, d.per_node, d.units, d.per_worker, d.workers)
        placed = idx.place_memo.get(key)
        if placed is None:
            queue_wait, queue, product = _placement(idx, d, suitable, queues)
            placed = (queue_wait, queue, product, frozenset(c.pool for c in suitable if c.pool))
            if len(idx.place_memo) >= _MEMO_SIZE:
                idx.place_memo.clear()
            idx.place_memo[key] = placed
        elig.queue_wait, elig.queue, elig.product, elig.pools = placed
        # what the checks accepted, as the Job's constraints: the products are this cluster's own
        elig.placement = placement_for(d.resources, d.requirements, (c.product for c in idx.classes))
    return elig


_CHECK_OK: Final = operator.attrgetter("ok")


def _evaluate(idx: SnapshotIndex, d: _Demand) -> _Eval:
    elig = idx.elig_memo.get(d.elig_sig)
    if elig is None:
        elig = _eligibility(idx, d)
        if len(idx.elig_memo) >= _MEMO_SIZE:
            idx.elig_memo.clear()
        idx.elig_memo[d.elig_sig] = elig
    if elig.ok:
        ev = _Eval(elig=elig)
        ev.estimate = _estimate(idx, d, elig)
        ev.score = ev.estimate.score
        ev.queue = elig.queue or None
    else:  # no estimate: one evaluation serves every full signature with these checks
        ev = elig.ineligible or _Eval(elig=elig)
        elig.ineligible = ev
    if len(idx.memo) >= _MEMO_SIZE:
        idx.memo.clear()
    idx.memo[d.sig] = ev
    return ev


def _freshness(idx: SnapshotIndex, shown: float, stale: bool, max_age: float) -> Check:
    if not idx.reachable:
        # the snapshot's error already says "unreachable: ..." (inventory's wording): say it once
        why = idx.error or "unreachable"
        why = why if why.startswith("unreachable") else f"unreachable: {why}"
        return _fail("CLUSTER_UNREACHABLE", f"{why} (last observed {shown:.0f}s ago)", True)
    if stale:
        return _fail(
            "CLUSTER_UNREACHABLE", f"snapshot is stale: observed {shown:.0f}s ago (max {max_age:g}s)", True
        )
    return _ok("CLUSTER_UNREACHABLE", f"reachable, observed {shown:.0f}s ago (max {max_age:g}s)")


_EXCLUDED: Final = Check(
    code="CLUSTER_NOT_ALLOWED",
    ok=False,
    message="excluded by the caller for now (e.g. an attempt was lost there)",
    capacity_only=True,
)


# freshness checks by (reachable, error, shown age, stale, max age): shared between clusters
_FRESH: dict[tuple[bool, str | None, float, bool, float], Check] = {}


def _fresh_check(idx: SnapshotIndex, shown: float, stale: bool, max_age: float) -> Check:
    """The CLUSTER_UNREACHABLE check, memoised in `_FRESH` (clusters of equal age share it)."""
    fresh = _freshness(idx, shown, stale, max_age)
    if len(_FRESH) >= _MEMO_SIZE:
        _FRESH.clear()
    _FRESH[(idx.reachable, idx.error, shown, stale, max_age)] = fresh
    return fresh


def _reasons(v: ClusterVerdict, *, permanent_only: bool = False) -> str:
    """Failed checks as one line, leaving out GPU_CAPACITY when it only echoes an earlier failure."""
    failed = [c for c in v.checks if not c.ok and not (permanent_only and c.capacity_only)]
    if len(failed) > 1:
        failed = [c for c in failed if not (c.code == "GPU_CAPACITY" and not c.capacity_only)] or failed
    return ", ".join(f"{c.code}: {c.message}" for c in failed)


@dataclass(slots=True, eq=False)
class _Result:
    """A decision for one signature in one world, valid while `now` is in (lo, hi]."""

    lo: float
    hi: float
    exclude: frozenset[str]
    max_age: float
    decision: RoutingDecision


@dataclass(slots=True, eq=False)
class _World:
    """The clusters of one snapshots mapping, resolved to indexes and sorted by name."""

    names: tuple[str, ...]  # the mapping's keys and values, in its order (to recognise it)
    values: tuple[ClusterSnapshot | SnapshotIndex, ...]
    entries: list[tuple[str, SnapshotIndex]]
    # per cluster, by name: (name, index, its memo, observed_at, reachable, error)
    rows: list[tuple[str, SnapshotIndex, dict[int, _Eval], float, bool, str | None]]
    results: dict[int, _Result] = field(default_factory=dict)
    plans: dict[int, _Plan] = field(default_factory=dict)


# freshness checks by (reachable, error, stale, max age), then whole seconds shown: a plan's
# clusters hold their family; an entry is (the age shown, [the check]) (the list is never mutated:
# a verdict's checks are that list + the rest)
_FAMILIES: dict[tuple[bool, str | None, bool, float], dict[int, tuple[float, list[Check]]]] = {}


@dataclass(slots=True, eq=False)
class _Plan:
    """One signature in one world, exclusion and max age, prepared for decisions at new `now`.

    Valid while every snapshot age stays positive and no cluster's staleness changes: then every
    verdict differs from the plan's only in its shown age and freshness check, and the eligible
    clusters, their ranking and (when routed) the whole decision but its ages stay the same.
    Per cluster, in name order: observed_at, a verdict with a placeholder age and check list, the
    checks after freshness, the freshness family, the index and whether it is stale.
    """

    exclude: frozenset[str]
    max_age: float
    floor: float  # the youngest snapshot's observed_at: valid only for `now` above it
    # observed_at of the oldest reachable fresh snapshot and of the youngest reachable stale one:
    # staleness is monotonic in observed_at, so these two tell whether any cluster's flipped
    fresh_oldest: float | None
    stale_youngest: float | None
    limits: list[float]  # sorted observed_at + max age of every cluster (the memo interval)
    bases: list[float]
    templates: list[ClusterVerdict]
    tails: list[list[Check]]
    families: list[dict[int, tuple[float, list[Check]]]]
    indexes: list[SnapshotIndex]
    stale: list[bool]
    eligible: list[tuple[float, str, _Eval]]
    routed: RoutingDecision | None  # the decision when routed (its summary does not show ages)
    last: tuple[list[int], list[ClusterVerdict]] | None = None  # whole seconds and verdicts last built


def _plan(d: _Demand, world: _World, now: float, ex: frozenset[str], max_age: float) -> _Plan:
    """The plan of `d` in `world` with the staleness each cluster has at `now` (ages positive)."""
    plan = _Plan(
        exclude=ex,
        max_age=max_age,
        floor=max((row[3] for row in world.rows), default=-math.inf),
        fresh_oldest=None,
        stale_youngest=None,
        limits=sorted(row[3] + max_age for row in world.rows),
        bases=[],
        templates=[],
        tails=[],
        families=[],
        indexes=[],
        stale=[],
        eligible=[],
        routed=None,
    )
    sig = d.sig
    for name, idx, memo, base, reachable, error in world.rows:
        ev = memo.get(sig)
        if ev is None:
            ev = _evaluate(idx, d)
        stale = not reachable or now - base > max_age
        if reachable:
            if stale:
                old = plan.stale_youngest
                plan.stale_youngest = base if old is None else max(old, base)
            else:
                old = plan.fresh_oldest
                plan.fresh_oldest = base if old is None else min(old, base)
        excluded = name in ex if ex else False
        fam_key = (reachable, error, stale, max_age)
        fam = _FAMILIES.get(fam_key)
        if fam is None:
            if len(_FAMILIES) >= _MEMO_SIZE:
                _FAMILIES.clear()
            fam = _FAMILIES[fam_key] = {}
        tail = list(ev.elig.checks)
        if ev.elig.ok and not stale and not excluded:
            verdict = ClusterVerdict(cluster=name, eligible=True, estimate=ev.estimate)
            plan.eligible.append((ev.score, name, ev))
        else:
            if excluded:
                tail[0] = _EXCLUDED  # CLUSTER_NOT_ALLOWED comes right after freshness
            verdict = ClusterVerdict(cluster=name, eligible=False)
        plan.bases.append(base)
        plan.templates.append(verdict)
        plan.tails.append(tail)
        plan.families.append(fam)
        plan.indexes.append(idx)
        plan.stale.append(stale)
    return plan


def _planned(
    d: _Demand, plan: _Plan, workload_id: str, now: float
) -> tuple[RoutingDecision, list[ClusterVerdict], float, float]:
    """The decision at `now` from a valid plan, its verdicts, and the interval (lo, hi] of `now`
    over which it stays the same (as `_sweep` computes it). Loops run in C where they can."""
    bases = plan.bases
    # whole seconds, rounded up (every age is positive here)
    whole = list(map(math.ceil, map(operator.sub, itertools.repeat(now, len(bases)), bases)))
    try:
        fresh = list(map(operator.getitem, plan.families, whole))
    except KeyError:  # a new age: build the missing checks (usually a few clusters)
        families = plan.families
        missing = list(
            itertools.compress(range(len(bases)), map(operator.not_, map(operator.contains, families, whole)))
        )
        full = [families[i] for i in missing if len(families[i]) >= _MEMO_SIZE]
        if full:  # bounded: cleared, then every cluster of those families is missing too
            for fam in full:
                fam.clear()
            missing = list(
                itertools.compress(
                    range(len(bases)), map(operator.not_, map(operator.contains, families, whole))
                )
            )
        for i in missing:
            fam, n = families[i], whole[i]
            if n not in fam:
                shown = float(n)
                fam[n] = (shown, [_freshness(plan.indexes[i], shown, plan.stale[i], plan.max_age)])
        fresh = list(map(operator.getitem, families, whole))
    replace = msgspec.structs.replace
    last = plan.last
    if last is not None and any(map(operator.eq, whole, last[0])):
        # clusters still showing the age of the plan's last decision keep its verdict record
        verdicts = [
            old if n == m else replace(tmpl, checks=head + tail, snapshot_age=shown)
            for tmpl, tail, (shown, head), n, m, old in zip(
                plan.templates, plan.tails, fresh, whole, last[0], last[1], strict=True
            )
        ]
    else:
        verdicts = [
            replace(tmpl, checks=head + tail, snapshot_age=shown)
            for tmpl, tail, (shown, head) in zip(plan.templates, plan.tails, fresh, strict=True)
        ]
    plan.last = (whole, verdicts)
    # the interval, as `_sweep` computes it: float + int adds exactly as float + float(int)
    ticks = list(map(operator.add, bases, whole))
    lo = max(ticks) - 1 + _EPS
    hi = min(ticks) - _EPS
    limits = plan.limits
    i = bisect.bisect_left(limits, now)  # limits[i:] >= now: fresh side; limits[:i] < now: stale
    if i < len(limits) and limits[i] < hi:
        hi = limits[i]
    if i and limits[i - 1] + _EPS > lo:
        lo = limits[i - 1] + _EPS
    routed = plan.routed
    if routed is not None:
        decision = replace(routed, workload_id=workload_id, decided_at=now, verdicts=verdicts)
    else:
        decision = _decide(d, workload_id, now, verdicts, plan.eligible)
        if decision.outcome == "routed":  # the summary names estimates and counts, not ages
            plan.routed = decision
    return decision, verdicts, lo, hi


_WORLDS: list[_World] = []
_NO_EXCLUDE: Final[frozenset[str]] = frozenset()
_EPS: Final = 1e-6


def _world(snapshots: Mapping[str, ClusterSnapshot | SnapshotIndex]) -> _World:
    """The last few worlds are remembered by item identity (the service re-sends the same objects)."""
    values = tuple(snapshots.values())
    names = tuple(snapshots)
    for world in _WORLDS:
        # tuple equality tries identity first: snapshots are not compared field by field
        if world.values == values and world.names == names:
            return world
    entries = [
        (n, i if isinstance(i, SnapshotIndex) else build_index(i)) for n, i in zip(names, values, strict=True)
    ]
    entries.sort(key=lambda e: e[0])
    rows = [(n, i, i.memo, i.observed_at, i.reachable, i.error) for n, i in entries]
    world = _World(names=names, values=values, entries=entries, rows=rows)
    _WORLDS.insert(0, world)
    del _WORLDS[4:]
    return world


def _sweep(
    d: _Demand,
    rows: Iterable[tuple[str, SnapshotIndex, dict[int, _Eval], float, bool, str | None]],
    now: float,
    ex: frozenset[str],
    max_age: float,
) -> tuple[list[ClusterVerdict], list[tuple[float, str, _Eval]], float, float]:
    """Every cluster's verdict at `now`, the eligible ones, and the interval (lo, hi] of `now` over
    which every verdict stays the same.

    The hot loop of a decision that is not memoised as a whole: checks and estimates come from the
    per-index memos, so what is left per cluster is the snapshot age and the verdict record (built
    again only when its age, staleness or exclusion changed; an ineligible verdict is shared by
    every workload with the same checks).
    """
    verdicts: list[ClusterVerdict] = []
    eligible: list[tuple[float, str, _Eval]] = []
    lo, hi = -math.inf, math.inf
    sig = d.sig
    ceil = math.ceil
    append = verdicts.append
    fresh_get = _FRESH.get
    for name, idx, memo, base, reachable, error in rows:
        ev = memo.get(sig)
        if ev is None:
            ev = _evaluate(idx, d)
        age = now - base
        # the record shows whole seconds, rounded up so that a shown age within the limit is fresh
        if age > 0:
            shown = float(ceil(age))
            t = base + shown - 1 + _EPS
            if t > lo:
                lo = t
            t = base + shown - _EPS
            if t < hi:
                hi = t
        else:
            shown = 0.0
            if base < hi:
                hi = base
        limit = base + max_age
        if now <= limit:
            if limit < hi:
                hi = limit
        else:
            t = limit + _EPS
            if t > lo:
                lo = t
        stale = not reachable or age > max_age
        excluded = name in ex if ex else False
        key = (name, shown, stale, excluded, max_age)
        elig = ev.elig
        if elig.ok and not stale and not excluded:  # eligible: the verdict carries the estimate
            verdict = ev.verdict
            if verdict is None or ev.verdict_key != key:
                fresh = fresh_get((reachable, error, shown, False, max_age))
                if fresh is None:
                    fresh = _fresh_check(idx, shown, False, max_age)
                listed = elig.listed
                if listed is None or listed[0] is not fresh:
                    listed = elig.listed = (fresh, [fresh, *elig.checks])
                verdict = ev.verdict = ClusterVerdict(
                    cluster=name,
                    eligible=True,
                    checks=listed[1],
                    estimate=ev.estimate,
                    snapshot_age=shown,
                )
                ev.verdict_key = key
            append(verdict)
            eligible.append((ev.score, name, ev))
        else:  # ineligible: no estimate, so the verdict depends on the checks only
            verdict = elig.verdict
            if verdict is None or elig.verdict_key != key:
                fresh = fresh_get((reachable, error, shown, stale, max_age))
                if fresh is None:
                    fresh = _fresh_check(idx, shown, stale, max_age)
                checks = [fresh, *elig.checks]
                if excluded:
                    checks[1] = _EXCLUDED  # CLUSTER_NOT_ALLOWED comes right after freshness
                verdict = elig.verdict = ClusterVerdict(
                    cluster=name, eligible=False, checks=checks, snapshot_age=shown
                )
                elig.verdict_key = key
            append(verdict)
    return verdicts, eligible, lo, hi


def _pinned(
    d: _Demand,
    world: _World,
    snapshots: Mapping[str, ClusterSnapshot | SnapshotIndex],
    now: float,
    ex: frozenset[str],
    max_age: float,
) -> tuple[list[ClusterVerdict], list[tuple[float, str, _Eval]], float, float]:
    """`_sweep` for a pinned workload: the pinned cluster is the only candidate."""
    assert d.pin is not None
    pinned = d.pin[0]
    pin_check = _fail("PINNED_ELSEWHERE", f"spec.queue pins {d.pin[0]}/{d.pin[1]}")
    verdicts: list[ClusterVerdict] = []
    eligible: list[tuple[float, str, _Eval]] = []
    lo, hi = -math.inf, math.inf
    names = [name for name, _ in world.entries]
    if pinned not in snapshots:
        names = sorted([*names, pinned])
    rows = {row[0]: row for row in world.rows}
    for name in names:
        if name != pinned:
            verdicts.append(ClusterVerdict(cluster=name, eligible=False, checks=[pin_check]))
            continue
        row = rows.get(name)
        if row is None:  # a pinned cluster inventory has never published
            known = _listing(sorted(snapshots))
            verdicts.append(
                ClusterVerdict(
                    cluster=name,
                    eligible=False,
                    checks=[
                        _fail(
                            "CLUSTER_UNREACHABLE",
                            f"no snapshot of pinned cluster {name!r} (clusters known: {known})",
                            capacity_only=True,
                        )
                    ],
                )
            )
            continue
        (verdict,), eligible, lo, hi = _sweep(d, (row,), now, ex, max_age)
        verdicts.append(verdict)
    return verdicts, eligible, lo, hi


def route(
    workload: Workload,
    workload_id: str,
    snapshots: Mapping[str, ClusterSnapshot | SnapshotIndex],
    now: float,
    *,
    history: RoutingHistory | None = None,
    exclude: Collection[str] = (),
    max_snapshot_age: float = 120.0,
    checkpoint_location: str | None = None,
) -> RoutingDecision:
    """Decide where `workload` runs, from each cluster's latest snapshot (or its index), at `now`.

    `exclude` names clusters the caller rules out for now (e.g. where an attempt was just lost);
    that is capacity-only. `checkpoint_location` (``"<store>"`` or ``"<store>/<path>"``) is the
    checkpoint a resume must read. Expects a workload that passed ``validate_workload``.

    Decisions share their immutable parts (checks, estimates, verdicts) with other decisions:
    treat a decision as read-only.
    """
    d = _demand(workload, history, checkpoint_location)
    world = _world(snapshots)
    ex = frozenset(exclude) if exclude else _NO_EXCLUDE
    res = world.results.get(d.sig)
    if res is not None and res.lo < now <= res.hi and res.exclude == ex and res.max_age == max_snapshot_age:
        return msgspec.structs.replace(
            res.decision, workload_id=workload_id, decided_at=now, verdicts=list(res.decision.verdicts)
        )
    if d.pin is not None:
        verdicts, eligible, lo, hi = _pinned(d, world, snapshots, now, ex, max_snapshot_age)
        decision = _decide(d, workload_id, now, verdicts, eligible)
    else:
        plan = world.plans.get(d.sig)
        if (
            plan is not None
            and plan.exclude == ex
            and plan.max_age == max_snapshot_age
            and now > plan.floor
            and (plan.fresh_oldest is None or now - plan.fresh_oldest <= max_snapshot_age)
            and (plan.stale_youngest is None or now - plan.stale_youngest > max_snapshot_age)
        ):
            decision, verdicts, lo, hi = _planned(d, plan, workload_id, now)
        else:
            verdicts, eligible, lo, hi = _sweep(d, world.rows, now, ex, max_snapshot_age)
            decision = _decide(d, workload_id, now, verdicts, eligible)
            if res is not None and now >= res.hi + 1 and now > max(r[3] for r in world.rows):
                # decided again a second or more after the last decision's ages changed, so every
                # cluster shows a new age (no verdict record to reuse): prepare for more such
                if len(world.plans) >= _MEMO_SIZE:
                    world.plans.clear()
                world.plans[d.sig] = _plan(d, world, now, ex, max_snapshot_age)
    if lo < now <= hi:
        if len(world.results) >= _MEMO_SIZE:
            world.results.clear()
        world.results[d.sig] = _Result(lo=lo, hi=hi, exclude=ex, max_age=max_snapshot_age, decision=decision)
    return msgspec.structs.replace(decision, verdicts=list(verdicts))


def _best_two(
    eligible: list[tuple[float, str, _Eval]],
) -> tuple[tuple[float, str, _Eval], tuple[float, str, _Eval] | None]:
    """The smallest and second smallest (score, name) entries; names are unique."""
    scores = [e[0] for e in eligible]
    total = sum(scores)
    if total != total:  # a NaN score: compare exactly as tuples do
        first = min(eligible)
        rest = [e for e in eligible if e is not first]
        return first, (min(rest) if rest else None)
    low = min(scores)
    if scores.count(low) > 1:  # rare: equal scores, the name breaks the tie
        tied = sorted((e for e in eligible if e[0] == low), key=lambda e: e[1])
        return tied[0], tied[1]
    i = scores.index(low)
    first = eligible[i]
    if len(eligible) == 1:
        return first, None
    scores[i] = math.inf
    low2 = min(scores)
    if scores.count(low2) > 1:
        return first, min((e for e in eligible if e[0] == low2 and e is not first), key=lambda e: e[1])
    return first, eligible[scores.index(low2)]


def _decide(
    d: _Demand,
    workload_id: str,
    now: float,
    verdicts: list[ClusterVerdict],
    eligible: list[tuple[float, str, _Eval]],
) -> RoutingDecision:
    if eligible:
        first, runner_up = _best_two(eligible)  # by (score, name): ties break by name
        _, best, ev = first
        assert ev.estimate is not None
        summary = f"{best}: {_dur(ev.estimate.total)} to result ({_terms(ev, d)})"
        if d.pin is not None:
            summary = f"pinned to {d.pin[0]}/{d.pin[1]}; {summary}"
        if runner_up is not None:
            _, second, ev2 = runner_up
            assert ev2.estimate is not None
            summary += f" vs {second} {_dur(ev2.estimate.total)} ({_terms(ev2, d)})"
            if len(eligible) > 2:
                summary += f" and {len(eligible) - 2} more"
        ineligible = len(verdicts) - len(eligible)
        if ineligible:
            summary += f"; {ineligible} ineligible"
        return RoutingDecision(
            workload_id=workload_id,
            decided_at=now,
            outcome="routed",
            cluster=best,
            queue=ev.queue,
            summary=summary,
            verdicts=verdicts,
            placement=ev.elig.placement,
        )
    candidates = [v for v in verdicts if not any(c.code == "PINNED_ELSEWHERE" for c in v.checks)]
    waiting = [v for v in candidates if all(c.ok or c.capacity_only for c in v.checks)]
    if waiting:
        permanent = len(candidates) - len(waiting)
        pin = f"pinned to {d.pin[0]}/{d.pin[1]}; " if d.pin is not None else ""
        summary = f"waiting: {pin}" + "; ".join(f"{v.cluster}: {_reasons(v)}" for v in waiting)
        if permanent:
            summary += f"; {permanent} more permanently ineligible"
        return RoutingDecision(
            workload_id=workload_id,
            decided_at=now,
            outcome="waiting",
            summary=summary,
            verdicts=verdicts,
        )

    if d.pin is not None:
        head = f"rejected: pinned target {d.pin[0]}/{d.pin[1]} is ineligible: "
    elif candidates:
        head = "rejected: no cluster can run this: "
    else:
        head = "rejected: no clusters known"
    return RoutingDecision(
        workload_id=workload_id,
        decided_at=now,
        outcome="rejected",
        summary=head + "; ".join(f"{v.cluster}: {_reasons(v, permanent_only=True)}" for v in candidates),
        verdicts=verdicts,
    )
