"""Snapshot building: the pure core of the inventory service (DESIGN §4).

Everything here is computation on plain data. The inputs are the dicts that the official
Kubernetes client produces with ``ApiClient().sanitize_for_serialization`` (camelCase keys,
quantities as strings, timestamps as ISO-8601 strings), the cluster's registry entry, the
datasets gpuorch staged there, and the times; the output is a ``ClusterSnapshot``. No I/O, no
clock, no logging: the shell (``service.py``) lists, calls in, and publishes.

Where each fact comes from and the queue-wait model are described in ``docs/inventory.md``;
the docstrings below are the precise rules.
"""

from __future__ import annotations

import heapq
import math
import operator
from bisect import bisect_left
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, TypeVar

import msgspec

from gpuorch_proto import ClusterRegistryEntry, ClusterSnapshot, NodeInfo, QueueInfo, Taint
from gpuorch_proto.inventory import Queueing, RequestShape, ShapeWait
from gpuorch_proto.k8s import (
    ANN_EXPECTED_DURATION,
    GPU_RESOURCE,
    KUEUE_QUEUE_LABEL,
    LABEL_ATTEMPT,
    LABEL_GPU_MEMORY,
    LABEL_GPU_PRODUCT,
    LABEL_POOL,
    LABEL_QUEUE,
    LABEL_WORKLOAD,
    TAINT_UNSCHEDULABLE,
)
from gpuorch_proto.kubesem import blocking_taints, node_affinity_matches, node_selector_matches
from gpuorch_proto.placement import sharing_from_labels
from gpuorch_proto.units import UnitError, parse_quantity

T = TypeVar("T")

__all__ = [
    "ANN_EXPECTED_DURATION",
    "DEFAULT_QUEUE",
    "GPU",
    "LABEL_GPU_MEMORY",
    "LABEL_GPU_PRODUCT",
    "LABEL_KUEUE_QUEUE",
    "LABEL_POOL",
    "LABEL_QUEUE",
    "Demand",
    "Hold",
    "Memo",
    "PodStart",
    "QueueHistory",
    "Slot",
    "WaitLayout",
    "build_snapshot",
    "earliest_start",
    "measure_queue_delays",
    "measured_bandwidth",
    "observe",
    "observe_pod_starts",
    "parse_staged_entry",
    "parse_staged_key",
    "published_waits",
    "queue_shape_waits",
    "request_shapes",
    "shape_waits",
    "snapshot_changed",
    "staged_refs",
    "unreachable_snapshot",
    "wait_layout",
]

GPU = GPU_RESOURCE
LABEL_KUEUE_QUEUE = KUEUE_QUEUE_LABEL  # fallback: Kueue's local-queue label
ENV_TRACEPARENT = "TRACEPARENT"  # the dispatcher hands the workload's trace context to its code
DEFAULT_QUEUE = "default"

# Defaults of the queue-wait model (see queue_shape_waits).
REFERENCE_GPUS = 1
UNKNOWN_WAIT_S = 3600.0
HISTORY_ALPHA = 0.3
WAIT_TOLERANCE = 0.1
MAX_AHEAD = 500
#: node sets a `WaitLayout` remembers (cleared when full)
_LAYOUT_MEMO = 1024
#: the priority of the request a wait is estimated for: the dispatcher gives gpuorch's Jobs no
#: priority class, so their pods have priority 0; pending pods of lower priority are behind them
REQUEST_PRIORITY = 0


# --------------------------------------------------------------------------- parsing helpers


def _get(obj: Any, *path: str) -> Any:
    for key in path:
        if not isinstance(obj, Mapping):
            return None
        obj = obj.get(key)
    return obj


def _str_map(value: Any) -> dict[str, str]:
    if not isinstance(value, Mapping):
        return {}
    return {str(k): str(v) for k, v in value.items() if v is not None}


def _qty(value: Any) -> float:
    """A Kubernetes quantity as a float; malformed or missing values count as 0."""
    if value is None or isinstance(value, bool):
        return 0.0
    try:
        return parse_quantity(value if isinstance(value, (int, float)) else str(value))
    except (UnitError, ValueError):
        return 0.0


def parse_time(value: Any) -> float | None:
    """Unix seconds from an RFC 3339 / ISO-8601 timestamp (``...Z`` or ``...+00:00``); naive = UTC."""
    if not isinstance(value, str) or not value:
        return None
    try:
        dt = datetime.fromisoformat(value)
    except ValueError:
        return None
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=UTC)
    return dt.timestamp()


def _positive_float(value: Any) -> float | None:
    try:
        out = float(value)
    except (TypeError, ValueError):
        return None
    return out if math.isfinite(out) and out >= 0 else None


# --------------------------------------------------------------------------- pods


@dataclass(frozen=True)
class _Pod:
    key: str  # uid, or namespace/name
    name: str
    node: str | None  # spec.nodeName: bound
    phase: str
    deleting: bool
    gpus: int
    cpu: float  # cores
    memory: float  # bytes
    queue: str | None  # raw label value; mapped onto known queues later
    job: str  # pods of one Job count as one pending job
    priority: int
    created: float | None
    started: float | None
    expected: float | None  # simulated seconds
    node_selector: dict[str, str]
    tolerations: list[dict[str, Any]]
    affinity_terms: list[Mapping[str, Any]]  # required nodeSelectorTerms (ORed); empty = none
    workload: str | None = None
    attempt: str | None = None
    traceparent: str | None = None
    #: its place in the line of pending pods: priority first, then age, then name and key
    order: tuple[int, float, str, str] = (0, math.inf, "", "")

    @property
    def terminated(self) -> bool:
        return self.phase in ("Succeeded", "Failed")

    @property
    def holds(self) -> bool:
        """Bound and not finished: it holds its node's resources (a deleting pod still does)."""
        return self.node is not None and not self.terminated

    @property
    def pending(self) -> bool:
        """Waiting for a node: not bound, not finished, not being deleted."""
        return self.node is None and self.phase in ("Pending", "") and not self.deleting


_ORDER = operator.attrgetter("order")


def _container_resources(c: Any) -> tuple[float, float, float]:
    limits = _get(c, "resources", "limits") or {}
    requests = _get(c, "resources", "requests") or {}
    # Extended resources: requests equal limits when both are set; either may be given.
    gpus = _qty(limits.get(GPU, requests.get(GPU)))
    # CPU/memory: requests, defaulting to limits as the API server does.
    cpu = _qty(requests.get("cpu", limits.get("cpu")))
    memory = _qty(requests.get("memory", limits.get("memory")))
    return gpus, cpu, memory


def _pod_resources(spec: Any) -> tuple[int, float, float]:
    """Effective pod resources as the scheduler counts them: max(sum of containers, largest init) + overhead."""
    total = [0.0, 0.0, 0.0]
    for c in _get(spec, "containers") or []:
        for i, v in enumerate(_container_resources(c)):
            total[i] += v
    for c in _get(spec, "initContainers") or []:
        for i, v in enumerate(_container_resources(c)):
            total[i] = max(total[i], v)
    overhead = _get(spec, "overhead") or {}
    total[1] += _qty(overhead.get("cpu"))
    total[2] += _qty(overhead.get("memory"))
    return round(total[0]), total[1], total[2]


def _job_key(meta: Any, labels: Mapping[str, str], fallback: str) -> str:
    for ref in _get(meta, "ownerReferences") or []:
        if isinstance(ref, Mapping) and ref.get("controller") and ref.get("uid"):
            return f"{ref.get('kind', '')}/{ref['uid']}"
    for label in ("batch.kubernetes.io/job-name", "job-name"):
        if labels.get(label):
            return f"Job/{_get(meta, 'namespace') or ''}/{labels[label]}"
    return fallback


def _traceparent(spec: Mapping[str, Any]) -> str | None:
    for c in spec.get("containers") or []:
        for e in _get(c, "env") or []:
            if isinstance(e, Mapping) and e.get("name") == ENV_TRACEPARENT and isinstance(e.get("value"), str):
                return str(e["value"])
    return None


def _parse_pod(obj: Mapping[str, Any]) -> _Pod:
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    status = obj.get("status") or {}
    labels = _str_map(meta.get("labels"))
    annotations = _str_map(meta.get("annotations"))
    name = str(meta.get("name") or "")
    key = str(meta.get("uid") or f"{meta.get('namespace') or ''}/{name}")
    gpus, cpu, memory = _pod_resources(spec)
    priority = spec.get("priority")
    priority = priority if isinstance(priority, int) and not isinstance(priority, bool) else 0
    created = parse_time(meta.get("creationTimestamp"))
    tolerations = [t for t in spec.get("tolerations") or [] if isinstance(t, Mapping)]
    return _Pod(
        key=key,
        name=name,
        node=str(spec["nodeName"]) if spec.get("nodeName") else None,
        phase=str(status.get("phase") or ""),
        deleting=bool(meta.get("deletionTimestamp")),
        gpus=gpus,
        cpu=cpu,
        memory=memory,
        queue=labels.get(LABEL_QUEUE) or labels.get(LABEL_KUEUE_QUEUE),
        job=_job_key(meta, labels, key),
        priority=priority,
        created=created,
        started=parse_time(status.get("startTime")),
        expected=_positive_float(annotations.get(ANN_EXPECTED_DURATION)),
        node_selector=_str_map(spec.get("nodeSelector")),
        tolerations=[dict(t) for t in tolerations],
        affinity_terms=[
            t
            for t in _get(
                spec, "affinity", "nodeAffinity", "requiredDuringSchedulingIgnoredDuringExecution", "nodeSelectorTerms"
            )
            or []
            if isinstance(t, Mapping)
        ],
        workload=labels.get(LABEL_WORKLOAD),
        attempt=labels.get(LABEL_ATTEMPT),
        traceparent=_traceparent(spec),
        order=(-priority, created if created is not None else math.inf, name, key),
    )


def _queue_of(pod: _Pod, known: Iterable[str]) -> str:
    """The registry queue a pod belongs to; unlabelled or unknown queues fold into "default"."""
    names = known if isinstance(known, (set, frozenset)) else set(known)
    return pod.queue if pod.queue is not None and pod.queue in names else DEFAULT_QUEUE


@dataclass
class Memo:
    """What the shell keeps for one cluster from one round to the next, so that what did not
    change is not worked out again: each pod and node parsed once per resourceVersion (by uid,
    or namespace/name: with it, a resourceVersion names one version of one object, the store's
    revision at its last write), and each pending pod's eligible nodes
    while the nodes' labels and taints stay the same. An optional argument of the functions
    below; their results are the same with or without it (tests/inventory/test_memo.py). Only
    objects with a resourceVersion are kept, and only while they are listed.
    """

    pods: dict[str, tuple[str, _Pod]] = field(default_factory=dict)
    nodes: dict[str, tuple[str, _Node]] = field(default_factory=dict)
    #: the schedulable nodes' (name, labels, taints) the eligibility below was worked out for
    placement: tuple[Any, ...] | None = None
    eligible: dict[str, tuple[_Pod, frozenset[str]]] = field(default_factory=dict)
    #: the last pod list parsed and its parse (a round passes one list to both functions below)
    round: tuple[Any, list[_Pod]] | None = None


def _version(obj: Mapping[str, Any]) -> tuple[str, str] | None:
    """(uid, or namespace/name; resourceVersion), None without a resourceVersion."""
    meta = obj.get("metadata")
    if not isinstance(meta, Mapping) or not meta.get("resourceVersion"):
        return None
    key = meta.get("uid") or f"{meta.get('namespace') or ''}/{meta.get('name') or ''}"
    return str(key), str(meta["resourceVersion"])


class PodSet:
    """One cluster's pods, parsed, kept up to date from a watch's changes (`update`): what the
    functions below take in place of the listed objects, so that a round parses only the pods
    that changed since the last one, not every pod listed (issue 12: with 10,000 pending, the
    walk over every object was a third of inventory's time). Keys are the watch's (namespace,
    name); an object's later version replaces its parse where it stands, as in the watch's
    cache, and a new one is added at the end."""

    def __init__(self) -> None:
        self.parsed: dict[Any, _Pod] = {}
        self._listed: list[_Pod] | None = None

    def reset(self, objs: Iterable[tuple[Any, Mapping[str, Any]]]) -> None:
        """Everything listed again (the first list, or a re-list): (key, object) pairs."""
        self.parsed = {key: _parse_pod(obj) for key, obj in objs}
        self._listed = None

    def update(self, changed: Iterable[tuple[Any, Mapping[str, Any] | None]]) -> None:
        """(key, the object as it is now; None: deleted) of each pod changed since the last call."""
        for key, obj in changed:
            self._listed = None
            if obj is None:
                self.parsed.pop(key, None)
            else:
                self.parsed[key] = _parse_pod(obj)

    @property
    def pods(self) -> list[_Pod]:
        if self._listed is None:
            self._listed = list(self.parsed.values())
        return self._listed

    def __len__(self) -> int:
        return len(self.parsed)


Pods = Iterable[Mapping[str, Any]] | PodSet  # the listed pod objects, or a PodSet kept from a watch


def _parse_pods(objs: Pods, memo: Memo | None) -> list[_Pod]:
    if isinstance(objs, PodSet):
        return objs.pods
    if memo is None:
        return [_parse_pod(o) for o in objs]
    if memo.round is not None and memo.round[0] is objs:
        return memo.round[1]  # the same list again in this round (pod starts, then the snapshot)
    out, memo.pods = _parse_versioned(objs, memo.pods, _parse_pod)
    memo.round = (objs, out)
    return out


# --------------------------------------------------------------------------- nodes


@dataclass(frozen=True)
class _Node:
    info: NodeInfo
    schedulable: bool  # Ready and not cordoned: new pods may land here
    gpus: int  # allocatable
    cpu: float
    memory: float


def _ready(status: Any) -> bool:
    for cond in _get(status, "conditions") or []:
        if isinstance(cond, Mapping) and cond.get("type") == "Ready":
            return cond.get("status") == "True"
    return False


def _int_label(value: str | None) -> int:
    try:
        return int(value) if value is not None else 0
    except ValueError:
        return 0


def _parse_node(obj: Mapping[str, Any]) -> _Node:
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    status = obj.get("status") or {}
    labels = _str_map(meta.get("labels"))
    allocatable = status.get("allocatable") or {}
    taints = [
        Taint(key=str(t.get("key") or ""), value=t.get("value") or None, effect=str(t.get("effect") or "NoSchedule"))
        for t in spec.get("taints") or []
        if isinstance(t, Mapping)
    ]
    cordoned = bool(spec.get("unschedulable"))
    if cordoned and not any(t.key == TAINT_UNSCHEDULABLE for t in taints):
        taints.append(Taint(key=TAINT_UNSCHEDULABLE, effect="NoSchedule"))
    ready = _ready(status)
    info = NodeInfo(
        name=str(meta.get("name") or ""),
        ready=ready,
        pool=labels.get(LABEL_POOL),
        gpu_product=labels.get(LABEL_GPU_PRODUCT),
        gpu_memory_mib=_int_label(labels.get(LABEL_GPU_MEMORY)),
        gpus_allocatable=round(_qty(allocatable.get(GPU))),
        labels=labels,
        taints=taints,
        sharing=sharing_from_labels(labels),
    )
    return _Node(
        info=info,
        schedulable=ready and not cordoned,
        gpus=info.gpus_allocatable,
        cpu=_qty(allocatable.get("cpu")),
        memory=_qty(allocatable.get("memory")),
    )


def _parse_nodes(objs: Iterable[Mapping[str, Any]], memo: Memo | None) -> list[_Node]:
    if memo is None:
        return [_parse_node(o) for o in objs]
    out, memo.nodes = _parse_versioned(objs, memo.nodes, _parse_node)
    return out


def _parse_versioned(
    objs: Iterable[Mapping[str, Any]], old: Mapping[str, tuple[str, T]], parse: Callable[[Mapping[str, Any]], T]
) -> tuple[list[T], dict[str, tuple[str, T]]]:
    """Each object parsed, reusing `old`'s parse of the same version (`_version`); and the cache
    of what is listed now (objects without a resourceVersion are parsed, never kept)."""
    new: dict[str, tuple[str, T]] = {}
    out: list[T] = []
    for o in objs:
        meta = o.get("metadata")
        rv = meta.get("resourceVersion") if type(meta) is dict or isinstance(meta, Mapping) else None
        if not rv:
            out.append(parse(o))
            continue
        key = meta.get("uid") or f"{meta.get('namespace') or ''}/{meta.get('name') or ''}"  # type: ignore[union-attr]
        hit = old.get(key)
        parsed = hit[1] if hit is not None and hit[0] == rv else parse(o)
        new[key] = (rv, parsed)
        out.append(parsed)
    return out, new


def _fits_node(pod: _Pod, node: _Node) -> bool:
    """nodeSelector, required node affinity, and NoSchedule/NoExecute taints: Kubernetes'
    semantics as written once in `gpuorch_proto.kubesem` (the router and the local clusters use
    the same functions)."""
    labels = node.info.labels
    return (
        node_selector_matches(pod.node_selector, labels)
        and node_affinity_matches(pod.affinity_terms, labels, node.info.name)
        and not blocking_taints(pod.tolerations, node.info.taints)
    )


# --------------------------------------------------------------------------- queue-wait model


class _Timeline:
    """One node's GPUs in use over (simulated) time, as `earliest_start` books them: a step
    function over the sorted points 0, every booking's start and every finite end.

    `earliest(gpus, duration)` is the earliest t among 0 and the ends with `gpus` free over
    [t, t+duration), and the GPUs left free at t after taking them. One pass over the points
    finds it: a point whose use is over ``capacity - gpus`` rules out every candidate up to it
    whose window reaches it. The answer is kept per (gpus, duration), and after a booking the
    next ask goes on from it rather than from 0: a booking only adds use, so no time before the
    last answer can fit afterwards (had one, the last point over the limit before it ends at an
    end, a candidate whose window would have fitted before). `tests/inventory/reference.py` is
    the plain version (nested sums) it must equal.
    """

    __slots__ = ("_asked", "capacity", "ends", "times", "used")

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.times: list[float] = [0.0]  # sorted points
        self.used: list[int] = [0]  # GPUs in use from times[i] to times[i+1] (to the end, for the last)
        self.ends: set[float] = {0.0}  # the candidates: 0 and every finite end
        #: (gpus, duration) -> (the earliest fitting candidate, None: none; still the answer?)
        self._asked: dict[tuple[int, float], tuple[float | None, bool]] = {}

    def book(self, start: float, end: float, gpus: int) -> None:
        """`gpus` in use over [start, end) (end may be inf); 0 <= start < end, gpus > 0."""
        times, used = self.times, self.used
        i = bisect_left(times, start)
        if i == len(times) or times[i] != start:
            times.insert(i, start)
            used.insert(i, used[i - 1] if i > 0 else 0)
        j = len(times)
        if math.isfinite(end):
            j = bisect_left(times, end, i)
            if j == len(times) or times[j] != end:
                times.insert(j, end)
                used.insert(j, used[j - 1])
            self.ends.add(end)
        for k in range(i, j):
            used[k] += gpus
        for shape, (at, _) in self._asked.items():
            self._asked[shape] = (at, False)

    def _scan(self, i: int, limit: int, duration: float) -> float | None:
        """The first candidate at or after index i whose window [t, t+duration) fits."""
        times, used, ends = self.times, self.used, self.ends
        n = len(times)
        b = i  # the first point at or after i whose use is over the limit
        while i < n:
            t = times[i]
            if t not in ends:
                i += 1
                continue
            if b < i:
                b = i
            while b < n and used[b] <= limit:
                b += 1
            if b == n or times[b] >= t + duration:
                return t
            i = b + 1  # every candidate up to b has b in its window
        return None

    def free_for_good(self) -> list[tuple[float, int]]:
        """(t, GPUs free from t on for good), at each point where that grows, from 0: capacity
        minus the most in use at or after t. It grows only where something ends."""
        out: list[tuple[float, int]] = []
        most = 0
        for k in range(len(self.times) - 1, -1, -1):
            if self.used[k] > most:
                most = self.used[k]
            out.append((self.times[k], self.capacity - most))
        out.reverse()
        return [step for k, step in enumerate(out) if k == 0 or step[1] != out[k - 1][1]]

    def earliest(self, gpus: int, duration: float) -> tuple[float, int] | None:
        """Earliest t (0 or when something ends) with `gpus` free on this node over
        [t, t+duration), and how many GPUs are left free at t after taking them."""
        limit = self.capacity - gpus
        if limit < 0:
            return None
        shape = (gpus, duration)
        asked = self._asked.get(shape)
        if asked is None:
            at = self._scan(0, limit, duration)
        elif asked[1] or asked[0] is None:
            at = asked[0]
        else:
            at = self._scan(bisect_left(self.times, asked[0]), limit, duration)
        self._asked[shape] = (at, True)
        return None if at is None else (at, limit - self.used[bisect_left(self.times, at)])


class Hold(msgspec.Struct, frozen=True):
    """GPUs a running pod holds on a node for `remaining` simulated seconds (None = unknown).

    A frozen struct (not a dataclass): one is made per running pod per snapshot, and a replay
    makes millions; msgspec builds them in C."""

    node: str
    gpus: int
    remaining: float | None


class Demand(msgspec.Struct, frozen=True):
    """Pending work ahead in line: `workers` pods of `gpus` GPUs, each on one node among `nodes`
    (None = any), for `duration` (None = unknown). Under a strict order (`shape_waits`) its
    workers start together, as a gang; conservative backfilling places them one by one."""

    gpus: int
    duration: float | None
    nodes: frozenset[str] | None = None
    workers: int = 1


@dataclass(frozen=True)
class Slot:
    """A schedulable node with GPUs, as the queue-wait model sees it (in the cluster's node order)."""

    name: str
    gpus: int  # allocatable
    gpu_product: str | None = None
    pool: str | None = None


def _book_ahead(
    capacity: Mapping[str, int], holds: Sequence[Hold], ahead: Sequence[Demand], max_ahead: int
) -> dict[str, _Timeline]:
    """Conservative backfilling of the demand ahead: each node's timeline after running pods and
    every demand's pods took their GPUs (see `earliest_start`)."""
    usage = {n: _Timeline(c) for n, c in capacity.items()}
    for h in holds:
        if h.node in usage and h.gpus > 0:
            end = math.inf if h.remaining is None else max(0.0, h.remaining)
            if end > 0:
                usage[h.node].book(0.0, end, h.gpus)
    everywhere = sorted(capacity)
    in_order: dict[frozenset[str], list[str]] = {}  # each eligible set, sorted once

    def place(gpus: int, duration: float, nodes: Iterable[str]) -> tuple[float, str] | None:
        best: tuple[float, int, str] | None = None
        for n in nodes:
            if n not in capacity or capacity[n] < gpus:
                continue
            found = usage[n].earliest(gpus, duration)
            if found is not None and (best is None or (found[0], found[1], n) < best):
                best = (found[0], found[1], n)  # earliest, then best fit (fewest GPUs left), then name
        return None if best is None else (best[0], best[2])

    for d in ahead[:max_ahead]:
        if d.gpus <= 0:
            continue
        duration = math.inf if d.duration is None else max(0.0, d.duration)
        nodes = everywhere if d.nodes is None else in_order.get(d.nodes) or in_order.setdefault(d.nodes, sorted(d.nodes))
        for _ in range(max(1, d.workers)):
            spot = place(d.gpus, duration, nodes)
            if spot is not None and duration > 0:
                usage[spot[1]].book(spot[0], spot[0] + duration, d.gpus)
    return usage


def _gang_for_good(usage: Mapping[str, _Timeline], nodes: Iterable[str], gpus: int, workers: int) -> float | None:
    """The earliest time (0 or an end) from which `workers` placements of `gpus` GPUs stay free for
    good on `nodes`, several on one node where it has room; None: never within what is known."""
    steps: list[tuple[float, int]] = []  # (time, more placements from then on)
    for n in nodes:
        tl = usage.get(n)
        if tl is None or tl.capacity < gpus:
            continue
        had = 0
        for at, free in tl.free_for_good():
            have = max(0, free) // gpus
            if have > had:
                steps.append((at, have - had))
                had = have
    steps.sort()
    total = 0
    for at, more in steps:  # placements only ever increase: the first time there are enough
        total += more
        if total >= workers:
            return at
    return None


def earliest_start(
    capacity: Mapping[str, int],
    holds: Sequence[Hold],
    ahead: Sequence[Demand],
    request_gpus: int = REFERENCE_GPUS,
    *,
    max_ahead: int = MAX_AHEAD,
) -> float | None:
    """When (simulated seconds from now) `request_gpus` GPUs on one node are free for good.

    A small event simulation with conservative backfilling: running pods release their GPUs
    when their remaining time ends; each demand ahead, in order, reserves GPUs on the node and
    at the earliest time where they stay free for its whole duration (best fit among nodes);
    then the request takes the earliest time from which `request_gpus` stay free on some node.
    Unknown durations hold forever. Demands that can never fit (too big, no eligible node)
    are skipped, as a scheduler skips unschedulable pods; only the first `max_ahead` demands
    are simulated (bounded cost; beyond it the estimate is optimistic). Returns None when the request cannot
    be placed within what is known (unknown durations, or no node with that many GPUs).
    """
    usage = _book_ahead(capacity, holds, ahead, max_ahead)
    return _gang_for_good(usage, sorted(capacity), max(1, request_gpus), 1)


def request_shapes(slots: Sequence[Slot], reference_gpus: int = REFERENCE_GPUS) -> list[RequestShape]:
    """The shapes inventory publishes a wait for, in this order: `reference_gpus` GPUs on any node
    (the wait `estimated_wait_seconds` repeats); for each GPU model and pool of the nodes (in
    order of model, then pool): one GPU, one full node, and every node of it as one gang; then the
    largest gang of the cluster: one worker on each node with the most GPUs, that many GPUs each.
    A shape that repeats an earlier one's nodes and size is left out."""
    out: list[RequestShape] = []
    seen: set[tuple[frozenset[str], int, int]] = set()

    def add(shape: RequestShape) -> None:
        names = frozenset(s.name for s in slots if shape.counts(s.gpu_product, s.pool))
        key = (names, shape.gpus, shape.workers)
        if key not in seen:
            seen.add(key)
            out.append(shape)

    add(RequestShape(gpus=max(1, reference_gpus)))
    kinds = sorted({(s.gpu_product, s.pool) for s in slots if s.gpus > 0}, key=lambda k: (k[0] or "", k[1] or ""))
    for product, pool in kinds:
        sizes = [s.gpus for s in slots if RequestShape(gpus=1, gpu_product=product, pool=pool).counts(s.gpu_product, s.pool)]
        full = max(sizes)
        add(RequestShape(gpus=1, gpu_product=product, pool=pool))
        add(RequestShape(gpus=full, gpu_product=product, pool=pool))
        add(RequestShape(gpus=full, workers=sum(1 for g in sizes if g >= full), gpu_product=product, pool=pool))
    if slots:
        most = max(s.gpus for s in slots)
        if most > 0:
            add(RequestShape(gpus=most, workers=sum(1 for s in slots if s.gpus >= most)))
    return out


def _strict_start(
    free: list[int], counts: list[int], events: list[tuple[float, int, int]], t: float, nodes: Sequence[int] | None,
    member: frozenset[int] | None, gpus: int, workers: int, per_count: Sequence[int],
) -> float | None:
    """Advance the clock from `t` (releasing the GPUs of what ends) until `workers` placements of
    `gpus` GPUs are free on `nodes` (None: on every node); the time, None when nothing more ends
    first. `counts[v]`: how many nodes have `v` GPUs free (kept up to date with `free`);
    `per_count[v]`: placements on a node with `v` free (`v // gpus`)."""
    pop = heapq.heappop
    while events and events[0][0] <= t:
        _, i, g = pop(events)
        before = free[i]
        free[i] = before + g
        counts[before] -= 1
        counts[before + g] += 1
    if nodes is None:  # every node: from how many nodes have each free count
        have = sum(map(operator.mul, counts, per_count))
    else:
        have = 0
        for i in nodes:
            have += free[i] // gpus
    while have < workers:
        if not events:
            return None
        t = events[0][0]
        while events and events[0][0] <= t:
            _, i, g = pop(events)
            before = free[i]
            free[i] = before + g
            counts[before] -= 1
            counts[before + g] += 1
            if member is None or i in member:
                have += (before + g) // gpus - before // gpus
    return t


class WaitLayout:
    """A cluster's node layout and request shapes prepared for `shape_waits` (`wait_layout`).

    Node indices and capacities, each shape's nodes and whether it can ever fit, and the node
    sets of the demands seen so far (bounded). A caller that computes the waits of one layout
    often makes it once and passes it (inventory for each queue line of a snapshot, the trace
    replay for each snapshot of a cluster): the waits are the same as without it, since
    everything here is a function of the slots and shapes alone.
    """

    __slots__ = ("_nodes", "cap", "everywhere", "index", "lines", "most", "per_count", "shapes", "slots")

    def __init__(self, slots: Sequence[Slot], shapes: Sequence[RequestShape]) -> None:
        self.slots = slots
        self.shapes = shapes
        self.index = {s.name: i for i, s in enumerate(slots)}
        self.cap = [s.gpus for s in slots]
        self.everywhere = tuple(range(len(slots)))
        cap = self.cap
        lines: list[tuple[int, int, tuple[int, ...] | None, frozenset[int] | None, bool]] = []
        for shape in shapes:
            on = tuple(i for i in self.everywhere if shape.counts(slots[i].gpu_product, slots[i].pool))
            fits = sum(cap[i] // shape.gpus for i in on) >= shape.workers
            every = on == self.everywhere
            lines.append((shape.gpus, shape.workers, None if every else on, None if every else frozenset(on), fits))
        #: per shape: GPUs per worker, workers, its nodes in node order and as a set (None: every
        #: node), whether it can ever fit
        self.lines = lines
        #: a demand's node set (None: every node) -> its nodes as a tuple and a set; (node set, GPUs
        #: per worker) -> placements an idle cluster has
        self.most: dict[tuple[frozenset[str] | None, int], int] = {}
        self._nodes: dict[frozenset[str], tuple[tuple[int, ...], frozenset[int]]] = {}
        #: per GPUs per worker g (1 .. the most a node has): placements on a node with v free, v // g
        most = max(cap, default=0)
        self.per_count = [()] + [tuple(v // g for v in range(most + 1)) for g in range(1, most + 1)]

    def nodes_of(self, names: frozenset[str] | None) -> tuple[tuple[int, ...] | None, frozenset[int] | None]:
        """A demand's nodes, in node order and as a set (None, None: every node)."""
        if names is None:
            return None, None
        got = self._nodes.get(names)
        if got is None:
            on = tuple(i for i in self.everywhere if self.slots[i].name in names)
            if len(self._nodes) >= _LAYOUT_MEMO:
                self._nodes.clear()
            got = self._nodes[names] = (on, frozenset(on))
        return got

    def room(self, names: frozenset[str] | None, nodes: tuple[int, ...] | None, gpus: int) -> int:
        """Placements of `gpus` GPUs an idle cluster has on `nodes` (None: every node)."""
        room = self.most.get((names, gpus))
        if room is None:
            cap = self.cap
            room = sum(cap[i] // gpus for i in (self.everywhere if nodes is None else nodes))
            if len(self.most) >= _LAYOUT_MEMO:
                self.most.clear()
            self.most[(names, gpus)] = room
        return room


def wait_layout(slots: Sequence[Slot], shapes: Sequence[RequestShape]) -> WaitLayout:
    """`slots` and `shapes` prepared for `shape_waits` (pass the same sequences with it)."""
    return WaitLayout(slots, shapes)


def _strict_waits(layout: WaitLayout, holds: Sequence[Hold], ahead: Sequence[Demand], max_ahead: int) -> list[float | None]:
    """`shape_waits` for a strict order: each demand ahead starts, all its workers at once, no
    earlier than the one before it, at the first time its gang fits on its nodes (each worker on
    the node with the fewest free GPUs that fit, then in node order); the request likewise after
    the last one. Free GPUs only grow after the line's last start, so that is exact: it is
    `gpuorch.simulate`'s strict-FIFO cluster (`ClusterModel.plan`) run on the expected times."""
    index = layout.index
    free = list(layout.cap)  # never below 0: a node's running pods hold at most what it has
    events: list[tuple[float, int, int]] = []  # (end, node, GPUs released)
    for h in holds:
        i = index.get(h.node)
        remaining = h.remaining
        if i is None or h.gpus <= 0 or (remaining is not None and remaining <= 0):
            continue
        g = h.gpus
        if g > free[i]:
            g = free[i]
        free[i] -= g
        if remaining is not None and g > 0:
            events.append((remaining, i, g))
    heapq.heapify(events)
    counts = list(map(free.count, range(len(layout.per_count))))  # nodes with v GPUs free, v = 0 .. the most a node has
    per_count = layout.per_count
    push = heapq.heappush
    t = 0.0
    for d in ahead[:max_ahead]:
        gpus, workers = d.gpus, d.workers
        if gpus <= 0 or workers <= 0:
            continue
        nodes, member = layout.nodes_of(d.nodes)
        if layout.room(d.nodes, nodes, gpus) < workers:
            continue  # it can never fit: skipped, as a scheduler skips an unschedulable pod
        start = _strict_start(free, counts, events, t, nodes, member, gpus, workers, per_count[gpus])
        if start is None:
            return [None] * len(layout.shapes)  # the line is stuck behind work of unknown duration
        t = start
        for _ in range(workers):
            # the node with the fewest free GPUs that fit, then the first (nodes are in node order)
            if nodes is None:
                least = gpus
                while not counts[least]:
                    least += 1
                best = free.index(least)
            else:
                best, least = -1, 0
                for j in nodes:
                    f = free[j]
                    if f >= gpus and (best < 0 or f < least):
                        best, least = j, f
            free[best] = least - gpus
            counts[least] -= 1
            counts[least - gpus] += 1
            if d.duration is not None:
                push(events, (t + max(0.0, d.duration), best, gpus))
    while events and events[0][0] <= t:
        _, i, g = heapq.heappop(events)
        before = free[i]
        free[i] = before + g
        counts[before] -= 1
        counts[before + g] += 1
    rest: list[tuple[float, int, int]] | None = None
    out: list[float | None] = []
    for gpus, workers, on, counted, fits in layout.lines:
        if not fits:
            out.append(None)
            continue
        if on is None:
            have = sum(map(operator.mul, counts, per_count[gpus]))
        else:
            have = 0
            for i in on:
                have += free[i] // gpus
        at: float | None = t
        if have < workers:
            at = None
            if rest is None:
                rest = sorted(events)
            probe = list(free)
            for end, i, g in rest:
                if counted is None or i in counted:
                    before = probe[i]
                    probe[i] = before + g
                    have += (before + g) // gpus - before // gpus
                    if have >= workers:
                        at = end
                        break
        out.append(at)
    return out


def shape_waits(
    slots: Sequence[Slot],
    holds: Sequence[Hold],
    ahead: Sequence[Demand],
    shapes: Sequence[RequestShape],
    queueing: Queueing = "best-effort",
    *,
    max_ahead: int = MAX_AHEAD,
    layout: WaitLayout | None = None,
) -> list[float | None]:
    """When (simulated seconds from now) a new request of each shape could start, with `ahead` the
    demand before it in the destination's admission order; None: not within what is known.

    `queueing` "fifo" and "priority" are strict: nothing starts before the work ahead of it
    (`_strict_waits`, exact when the durations are). "best-effort" is conservative backfilling
    (`earliest_start`): the demand ahead reserves GPUs pod by pod, and the request takes the
    earliest time from which its gang stays free on the shape's nodes. Running pods (`holds`) free
    their GPUs when their remaining time ends (None: never). Only the first `max_ahead` demands
    are simulated; beyond them the estimate is optimistic. `layout`: `wait_layout(slots, shapes)`
    of these very sequences, made once by a caller that asks often (else made here).
    """
    if queueing == "best-effort":
        usage = _book_ahead({s.name: s.gpus for s in slots}, holds, ahead, max_ahead)
        return [
            _gang_for_good(usage, [s.name for s in slots if shape.counts(s.gpu_product, s.pool)], shape.gpus, shape.workers)
            for shape in shapes
        ]
    if layout is None or layout.slots is not slots or layout.shapes is not shapes:
        layout = WaitLayout(slots, shapes)
    return _strict_waits(layout, holds, ahead, max_ahead)


@dataclass(frozen=True)
class QueueHistory:
    """Measured queue delays (simulated seconds) per (cluster, queue): an EWMA and a count."""

    alpha: float = HISTORY_ALPHA
    delays: Mapping[tuple[str, str], tuple[float, int]] = field(default_factory=dict)

    def ewma(self, cluster: str, queue: str) -> float | None:
        entry = self.delays.get((cluster, queue))
        return None if entry is None else entry[0]

    def count(self, cluster: str, queue: str) -> int:
        entry = self.delays.get((cluster, queue))
        return 0 if entry is None else entry[1]


def observe(history: QueueHistory, cluster: str, queue: str, delay_s: float) -> QueueHistory:
    """A new history with one more measured delay; the first measurement seeds the EWMA."""
    delay = max(0.0, float(delay_s))
    old = history.delays.get((cluster, queue))
    value = delay if old is None else history.alpha * delay + (1.0 - history.alpha) * old[0]
    delays = dict(history.delays)
    delays[(cluster, queue)] = (value, 1 if old is None else old[1] + 1)
    return QueueHistory(alpha=history.alpha, delays=delays)


@dataclass(frozen=True)
class PodStart:
    """A pod seen started for the first time: how long it waited on the cluster."""

    key: str
    name: str
    queue: str
    gpus: int
    created: float  # unix seconds
    started: float  # unix seconds
    delay_s: float  # simulated seconds: (started - created) x time_scale
    workload: str | None = None  # gpuorch's pods: the workload and attempt labels
    attempt: str | None = None
    traceparent: str | None = None  # the workload's trace context, from the pod's env


def observe_pod_starts(
    pods: Pods,
    registry: ClusterRegistryEntry,
    *,
    time_scale: float,
    seen: frozenset[str] = frozenset(),
    memo: Memo | None = None,
) -> tuple[list[PodStart], frozenset[str]]:
    """Pods with a ``status.startTime`` that are not in `seen`, and the new `seen`.

    The returned set keeps only the keys of pods still listed (a pod that is gone never comes
    back), so it does not grow without bound. In order of start (then key): whatever order the
    pods are listed in, the queue history learns the same.
    """
    known = set(_queue_names(registry))
    out: list[PodStart] = []
    now_seen: set[str] = set()
    for pod in _parse_pods(pods, memo):
        if pod.started is None or pod.created is None:
            continue
        now_seen.add(pod.key)
        if pod.key in seen:
            continue
        out.append(
            PodStart(
                key=pod.key,
                name=pod.name,
                queue=_queue_of(pod, known),
                gpus=pod.gpus,
                created=pod.created,
                started=pod.started,
                delay_s=max(0.0, pod.started - pod.created) * time_scale,
                workload=pod.workload,
                attempt=pod.attempt,
                traceparent=pod.traceparent,
            )
        )
    out.sort(key=lambda s: (s.started, s.key))
    return out, frozenset(now_seen)


def measure_queue_delays(
    pods: Pods,
    registry: ClusterRegistryEntry,
    *,
    time_scale: float,
    seen: frozenset[str] = frozenset(),
) -> tuple[list[tuple[str, float]], frozenset[str]]:
    """(queue, delay) of the GPU pods that started since the last call (``observe_pod_starts``).

    delay = (status.startTime - metadata.creationTimestamp) x time_scale, simulated seconds.
    Pods without GPUs do not wait for GPUs: they would drag a GPU queue's history towards 0.
    """
    starts, now_seen = observe_pod_starts(pods, registry, time_scale=time_scale, seen=seen)
    return [(p.queue, p.delay_s) for p in starts if p.gpus > 0], now_seen


def _queue_names(registry: ClusterRegistryEntry) -> list[str]:
    names = [q.name for q in registry.queues]
    return names if DEFAULT_QUEUE in names else [*names, DEFAULT_QUEUE]


def _remaining(pod: _Pod, now: float, time_scale: float) -> float | None:
    if pod.expected is None:
        return None
    elapsed = 0.0 if pod.started is None else max(0.0, now - pod.started) * time_scale
    return max(0.0, pod.expected - elapsed)


def queue_shape_waits(
    cluster: str,
    nodes: Sequence[Mapping[str, Any]],
    pods: Pods,
    registry: ClusterRegistryEntry,
    *,
    now: float,
    time_scale: float,
    history: QueueHistory | None = None,
    reference_gpus: int = REFERENCE_GPUS,
    unknown_wait_s: float = UNKNOWN_WAIT_S,
    memo: Memo | None = None,
) -> dict[str, list[ShapeWait]]:
    """Estimated wait (simulated seconds) of a new request of each shape (`request_shapes`) in
    each queue, the first shape being `reference_gpus` GPUs on any node.

    1. Runtime model (``shape_waits``): capacity = allocatable GPUs of schedulable nodes, in their
       layout; running pods hold theirs for expected duration (annotation, simulated s) minus
       elapsed (real seconds since status.startTime x time_scale), at least 0; ahead of the
       request are the pending pods of its line, in the destination's admission order
       (`registry.queueing`: by arrival, or by priority then age; pods of lower priority than the
       request's are behind it): the whole cluster's when it has no admission system, else the
       queue's own, or its ClusterQueue's (Kueue/KAI/Volcano give queues their own quota).
       0 = "free": it fits now behind the demand ahead.
    2. If the model cannot tell (a relevant pod has no expected duration), the EWMA of measured
       delays for (cluster, queue): "history".
    3. Otherwise `unknown_wait_s`: "default".
    """
    return _waits(
        cluster, _parse_nodes(nodes, memo), _parse_pods(pods, memo), registry, now=now, time_scale=time_scale,
        history=history, reference_gpus=reference_gpus, unknown_wait_s=unknown_wait_s, memo=memo,
    )  # fmt: skip


def _eligibility(schedulable: Sequence[_Node], memo: Memo | None) -> Callable[[_Pod], frozenset[str]]:
    """Each pending pod's eligible nodes among `schedulable` (remembered in `memo` while the
    nodes' names, labels and taints, all that `_fits_node` reads, stay the same)."""

    def work_out(p: _Pod) -> frozenset[str]:
        return frozenset(n.info.name for n in schedulable if _fits_node(p, n))

    if memo is None:
        return work_out
    placement = tuple((n.info.name, tuple(n.info.labels.items()), tuple(n.info.taints)) for n in schedulable)
    if placement != memo.placement:
        memo.placement, memo.eligible = placement, {}
    old = memo.eligible
    new: dict[str, tuple[_Pod, frozenset[str]]] = {}
    memo.eligible = new

    def remembered(p: _Pod) -> frozenset[str]:
        hit = old.get(p.key) or new.get(p.key)
        if hit is not None and hit[0] is p:  # the same parsed version (`Memo.pods` keeps it alive)
            new[p.key] = hit
            return hit[1]
        found = work_out(p)
        new[p.key] = (p, found)
        return found

    return remembered


def _line_key(registry: ClusterRegistryEntry) -> Callable[[str], str]:
    """Which line of pending work each queue's requests join: the whole cluster's (one line) when
    it has no admission system; with one, the queue's own, or its Kueue ClusterQueue's when the
    registry names one (queues feeding one ClusterQueue share its line)."""
    if registry.admission == "none":
        return lambda queue: ""
    shared = {q.name: f"cq:{q.cluster_queue}" for q in registry.queues if q.cluster_queue}
    return lambda queue: shared.get(queue, f"q:{queue}")


def _ahead(line: Sequence[_Pod], queueing: Queueing, eligible: Callable[[_Pod], frozenset[str]]) -> list[Demand]:
    """The demand a line's pods (already in admission order) put ahead of a new request. A strict
    order admits a Job whole: its pending pods of one size are one gang, in its first pod's place."""
    if queueing == "best-effort":
        return [Demand(gpus=p.gpus, duration=p.expected, nodes=eligible(p)) for p in line]
    gangs: dict[tuple[str, int], list[_Pod]] = {}
    for p in line:
        gangs.setdefault((p.job, p.gpus), []).append(p)
    return [
        Demand(gpus=pods[0].gpus, duration=pods[0].expected, nodes=eligible(pods[0]), workers=len(pods))
        for pods in gangs.values()
    ]


def _admission_order(queueing: Queueing) -> Callable[[_Pod], tuple[Any, ...]]:
    """The order a line's pending pods are admitted in: by arrival under "fifo" (priority ignored),
    else highest priority first, then oldest (`_Pod.order`)."""
    if queueing == "fifo":
        return lambda p: p.order[1:]
    return _ORDER


def _waits(
    cluster: str,
    parsed_nodes: Sequence[_Node],
    parsed: Sequence[_Pod],
    registry: ClusterRegistryEntry,
    *,
    now: float,
    time_scale: float,
    history: QueueHistory | None,
    reference_gpus: int,
    unknown_wait_s: float,
    memo: Memo | None,
) -> dict[str, list[ShapeWait]]:
    schedulable = [n for n in parsed_nodes if n.schedulable and n.gpus > 0]
    slots = [Slot(n.info.name, n.gpus, n.info.gpu_product, n.info.pool) for n in schedulable]
    shapes = request_shapes(slots, reference_gpus)
    layout = wait_layout(slots, shapes)
    holds = [Hold(p.node, p.gpus, _remaining(p, now, time_scale)) for p in parsed if p.holds and p.node]
    known = _queue_names(registry)
    known_set = set(known)
    queueing = registry.queueing
    # ahead of a new request: every pending pod under "fifo"; else those of its priority or higher
    pending = sorted(
        (p for p in parsed if p.pending and p.gpus > 0 and (queueing == "fifo" or p.priority >= REQUEST_PRIORITY)),
        key=_admission_order(queueing),
    )
    eligible = _eligibility(schedulable, memo)
    line_of = _line_key(registry)
    lines: dict[str, list[_Pod]] = {}  # (only the first MAX_AHEAD of each line count)
    for p in pending:
        line = lines.setdefault(line_of(_queue_of(p, known_set)), [])
        if len(line) < MAX_AHEAD:
            line.append(p)

    out: dict[str, list[ShapeWait]] = {}
    starts: dict[str, list[float | None]] = {}  # queues in the same line share a result
    for queue in known:
        key = line_of(queue)
        if key not in starts:
            ahead = _ahead(lines.get(key, []), queueing, eligible)
            starts[key] = shape_waits(slots, holds, ahead, shapes, queueing, layout=layout)
        measured = None if history is None else history.ewma(cluster, queue)
        out[queue] = published_waits(shapes, starts[key], measured, unknown_wait_s)
    return out


def published_waits(
    shapes: Sequence[RequestShape], starts: Sequence[float | None], measured: float | None, unknown_wait_s: float = UNKNOWN_WAIT_S
) -> list[ShapeWait]:
    """Each shape's wait as a snapshot carries it: the model's start ("free" at 0, else "runtime");
    where the model cannot tell, the queue's measured delays ("history"), else `unknown_wait_s`."""
    out: list[ShapeWait] = []
    for shape, start in zip(shapes, starts, strict=True):
        if start is not None:
            out.append(ShapeWait(shape=shape, seconds=start, source="free" if start == 0 else "runtime"))
        elif measured is not None:
            out.append(ShapeWait(shape=shape, seconds=measured, source="history"))
        else:
            out.append(ShapeWait(shape=shape, seconds=unknown_wait_s, source="default"))
    return out


# --------------------------------------------------------------------------- snapshots


def parse_staged_key(key: str) -> tuple[str, str] | None:
    """(cluster, "name@version") from a key spelled ``<cluster>.<name>@<version>``.

    NATS clients validate KV keys against ``[-/_=.a-zA-Z0-9]+`` by default, which excludes
    ``@``, so ``<cluster>.<name>=<version>`` is accepted too. A key that names no dataset (the
    dispatcher's hashed keys, say) gives None: then the value must say (``parse_staged_entry``).
    """
    cluster, dot, rest = key.partition(".")
    if not dot or not cluster or not rest:
        return None
    sep = "@" if "@" in rest else "="
    name, at, version = rest.rpartition(sep)
    if not at or not name or not version:
        return None
    return cluster, f"{name}@{version}"


def parse_staged_entry(key: str, value: bytes) -> tuple[str, str] | None:
    """(cluster, ref) from one entry of the `kv_staged` bucket.

    The value, when it is a JSON object with string ``cluster`` and ``ref`` (what the dispatcher
    writes), is authoritative; otherwise the key is parsed. Anything else: None (ignored).
    """
    try:
        doc = msgspec.json.decode(value) if value else None
    except msgspec.DecodeError:
        doc = None
    if isinstance(doc, dict):
        cluster, ref = doc.get("cluster"), doc.get("ref")
        if isinstance(cluster, str) and isinstance(ref, str) and cluster and "@" in ref:
            return cluster, ref
    return parse_staged_key(key)


def staged_refs(entries: Mapping[str, bytes], cluster: str) -> set[str]:
    """Datasets staged on `cluster`, from the current entries (key -> value) of `kv_staged`."""
    out: set[str] = set()
    for key, value in entries.items():
        parsed = parse_staged_entry(key, value)
        if parsed is not None and parsed[0] == cluster:
            out.add(parsed[1])
    return out


#: a staging measurement is believed up to this throughput (MB/s; anything faster is an error)
MAX_MEASURED_MBPS = 1e7


def staging_measurement(value: bytes) -> tuple[str, str, float] | None:
    """(cluster, location, MB/s) of one `kv_staged` value that carries a measurement (the
    dispatcher's, from a stage container's record: ``location``, ``size_gb``,
    ``simulated_seconds``): the throughput of the simulated link, size_gb x 1000 / seconds, the
    unit the router's copy-time estimate is in. Anything else: None."""
    try:
        doc = msgspec.json.decode(value) if value else None
    except msgspec.DecodeError:
        return None
    if not isinstance(doc, dict):
        return None
    cluster, location = doc.get("cluster"), doc.get("location")
    size_gb, seconds = doc.get("size_gb"), doc.get("simulated_seconds")
    if not isinstance(cluster, str) or not isinstance(location, str) or not cluster or not location:
        return None
    if isinstance(size_gb, bool) or isinstance(seconds, bool):
        return None
    if not isinstance(size_gb, (int, float)) or not isinstance(seconds, (int, float)):
        return None
    size, secs = float(size_gb), float(seconds)
    if not (math.isfinite(size) and math.isfinite(secs) and size > 0 and secs > 0):
        return None
    mbps = size * 1000.0 / secs
    return (cluster, location, mbps) if math.isfinite(mbps) and 0 < mbps <= MAX_MEASURED_MBPS else None


def measured_bandwidth(entries: Mapping[str, bytes], cluster: str) -> dict[str, float]:
    """Location -> MB/s measured staging into `cluster`: the median of the measurements in the
    current `kv_staged` entries (one per (cluster, dataset), the latest staging of each)."""
    by_location: dict[str, list[float]] = {}
    for value in entries.values():
        m = staging_measurement(value)
        if m is not None and m[0] == cluster:
            by_location.setdefault(m[1], []).append(m[2])
    out: dict[str, float] = {}
    for location, xs in sorted(by_location.items()):
        xs.sort()
        mid = len(xs) // 2
        out[location] = xs[mid] if len(xs) % 2 else (xs[mid - 1] + xs[mid]) / 2
    return out


def _with_cache(
    registry: ClusterRegistryEntry, staged: Iterable[str], measured: Mapping[str, float] | None = None
) -> ClusterRegistryEntry:
    """The registry entry as the snapshot carries it: the datasets gpuorch staged added to
    `datasets_cached`; and for each link the registry names (a `bandwidth_mbps` location that is
    not one of the cluster's own), the measured throughput in place of the registry's figure,
    once there is one (`bandwidth_measured` says which). A location the registry names no link
    for gets none: a measurement never turns a store read in place into a copy."""
    merged = list(dict.fromkeys([*registry.datasets_cached, *sorted(set(staged))]))
    links = {loc: mbps for loc, mbps in (measured or {}).items() if loc in registry.bandwidth_mbps and loc not in registry.data_locations}
    if merged == registry.datasets_cached and links == registry.bandwidth_measured:
        return registry
    return msgspec.structs.replace(
        registry,
        datasets_cached=merged,
        bandwidth_mbps={**registry.bandwidth_mbps, **links},
        bandwidth_measured=links,
    )


def build_snapshot(
    cluster: str,
    nodes: list[dict[str, Any]],
    pods: Pods,
    registry: ClusterRegistryEntry,
    *,
    now: float,
    observed_at: float,
    time_scale: float,
    staged: Iterable[str] = (),
    measured: Mapping[str, float] | None = None,
    history: QueueHistory | None = None,
    reference_gpus: int = REFERENCE_GPUS,
    unknown_wait_s: float = UNKNOWN_WAIT_S,
    memo: Memo | None = None,
) -> ClusterSnapshot:
    """One cluster's snapshot from listed nodes and pods (see the module and docs/inventory.md).

    Free GPUs/CPU/memory of a node = allocatable minus what its bound, non-terminated pods
    hold (GPU limits, CPU/memory requests); a node that is not Ready or is cordoned has none
    free. Pending = not bound, not finished, not deleting. `memo`: see `Memo`.
    """
    parsed_nodes = _parse_nodes(nodes, memo)
    parsed_pods = _parse_pods(pods, memo)
    used: dict[str, list[float]] = {}
    for p in parsed_pods:
        if p.holds and p.node is not None:
            u = used.setdefault(p.node, [0.0, 0.0, 0.0])
            u[0] += p.gpus
            u[1] += p.cpu
            u[2] += p.memory
    infos: list[NodeInfo] = []
    for n in sorted(parsed_nodes, key=lambda n: n.info.name):
        u = used.get(n.info.name, [0.0, 0.0, 0.0])
        free = n.schedulable
        infos.append(
            msgspec.structs.replace(
                n.info,
                gpus_free=max(0, n.gpus - round(u[0])) if free else 0,
                cpu_free=max(0.0, n.cpu - u[1]) if free else 0.0,
                memory_free=max(0.0, n.memory - u[2]) if free else 0.0,
            )
        )
    known = _queue_names(registry)
    known_set = set(known)
    owners = {q.name: list(q.owners) for q in registry.queues}
    waits = _waits(
        cluster,
        parsed_nodes,
        parsed_pods,
        registry,
        now=now,
        time_scale=time_scale,
        history=history,
        reference_gpus=reference_gpus,
        unknown_wait_s=unknown_wait_s,
        memo=memo,
    )
    pending = [p for p in parsed_pods if p.pending]
    by_queue: dict[str, list[_Pod]] = {q: [] for q in known}
    for p in pending:
        by_queue[_queue_of(p, known_set)].append(p)
    queues: list[QueueInfo] = []
    for q in known:
        mine = by_queue[q]
        queues.append(
            QueueInfo(
                name=q,
                owners=owners.get(q, ["*"]),
                pending_jobs=len({p.job for p in mine}),
                pending_gpus=sum(p.gpus for p in mine),
                estimated_wait_seconds=waits[q][0].seconds,
                shape_waits=waits[q],
            )
        )
    return ClusterSnapshot(
        cluster=cluster,
        reachable=True,
        observed_at=observed_at,
        published_at=now,
        nodes=infos,
        queues=queues,
        running_gpus=sum(p.gpus for p in parsed_pods if p.holds),
        pending_gpus=sum(p.gpus for p in pending),
        registry=_with_cache(registry, staged, measured),
        time_scale=time_scale,
    )


def unreachable_snapshot(
    previous: ClusterSnapshot | None,
    cluster: str,
    registry: ClusterRegistryEntry,
    now: float,
    error: str,
    *,
    time_scale: float | None = None,
) -> ClusterSnapshot:
    """The cluster did not answer: reachable=False, `error` says why.

    observed_at stays at the last successful observation (0.0 = never observed), so the
    snapshot's age grows; nodes and queues are the last ones seen, labelled by that age.
    Datasets known to be staged there are kept.
    """
    scale = time_scale if time_scale is not None else (previous.time_scale if previous else 1.0)
    if previous is None:
        return ClusterSnapshot(
            cluster=cluster,
            reachable=False,
            observed_at=0.0,
            published_at=now,
            error=error,
            registry=registry,
            time_scale=scale,
        )
    return msgspec.structs.replace(
        previous,
        reachable=False,
        published_at=now,
        error=error,
        registry=_with_cache(registry, previous.registry.datasets_cached, previous.registry.bandwidth_measured),
        time_scale=scale,
    )


def _wait_news(old: float, new: float, elapsed_sim: float, tolerance: float) -> bool:
    """A wait is news unless it is the old value aged by the simulated time that passed, within
    `tolerance` (relative): how estimates from running pods' remaining time move by themselves.
    Estimates from history or the default do not move with time: those are news when they differ
    at all (the EWMA changes only when a delay was measured)."""
    aged = max(0.0, old - elapsed_sim)
    return old != new and abs(aged - new) > tolerance * max(aged, new)


def snapshot_changed(old: ClusterSnapshot | None, new: ClusterSnapshot, *, wait_tolerance: float = WAIT_TOLERANCE) -> bool:
    """Whether `new` says something `old` did not, ignoring timestamps and the error text.

    Estimated waits shrink as time passes without anything happening; a consumer can age them
    itself (``wait - age x time_scale``) until the next snapshot. So a wait counts as changed
    when it departs from that aged value (a job ended early, a new wave started, a pod was
    added ahead), not when it merely drifts (``_wait_news``). The heartbeat republishes anyway.
    """
    if old is None:
        return True

    def norm(s: ClusterSnapshot) -> ClusterSnapshot:
        return msgspec.structs.replace(
            s,
            observed_at=0.0,
            published_at=0.0,
            error=None,
            queues=[
                msgspec.structs.replace(
                    q,
                    estimated_wait_seconds=0.0,
                    # a wait that ages to 0 turns "free": drift too, not news
                    shape_waits=[ShapeWait(shape=w.shape, seconds=0.0, source="runtime" if w.source == "free" else w.source)
                                 for w in q.shape_waits],
                )
                for q in s.queues
            ],
        )

    if norm(old) != norm(new):
        return True
    elapsed_sim = max(0.0, new.observed_at - old.observed_at) * new.time_scale
    return any(
        _wait_news(a, b, elapsed_sim, wait_tolerance)
        for qa, qb in zip(old.queues, new.queues, strict=True)
        for a, b in zip(
            [qa.estimated_wait_seconds, *(w.seconds for w in qa.shape_waits)],
            [qb.estimated_wait_seconds, *(w.seconds for w in qb.shape_waits)],
            strict=True,
        )
    )
