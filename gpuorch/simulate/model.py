"""One cluster as the simulator runs it: nodes, a strict-FIFO admission queue, data caches.

Admission (docs/simulation.md, "Cluster model"): whole GPUs; a worker's GPUs on one node; a gang
starts all its workers at once inside one cluster; jobs start in arrival order (Kueue's
`StrictFIFO`: a job never starts before one that arrived earlier on the same cluster), each worker
on the suitable node with the fewest free GPUs that fit (best fit, then node order). A job holds
its GPUs for image pull + data staging + startup + run: staging is an init container, as the
dispatcher runs it, so GPU-hours include it. Outputs are promoted `output_seconds` after the end.

Because admission is strict FIFO and the true run times are known to the simulator, a job's start
is fixed the moment it is enqueued: nothing that arrives later can delay it. `plan` computes it
(the clairvoyant bound calls it without committing), `commit` books it. What inventory can observe
(free GPUs per node, pending and running work, staged datasets) follows from those bookings as the
clock passes their start and end times (`apply_start` / `apply_end`); `snapshot` turns that into a
`ClusterSnapshot` as inventory would publish it, with inventory's own waits per request shape
(`gpuorch_inventory.core.shape_waits`, under the registry's `queueing`: `fifo` here).

Pure: no I/O, no clock; time is an argument.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import msgspec

from gpuorch_inventory.core import (
    Demand,
    Hold,
    Slot,
    published_waits,
    request_shapes,
    shape_waits,
    wait_layout,
)
from gpuorch_proto.inventory import ClusterRegistryEntry, ClusterSnapshot, NodeInfo, QueueInfo, ShapeWait
from gpuorch_proto.placement import accelerator_matches, gpu_memory_ok, sharing_ok
from gpuorch_proto.workload import Sharing
from gpuorch_router.policy import DEFAULT_IMAGE_PULL_SECONDS, DEFAULT_OUTPUT_TRANSFER_SECONDS, relative_speed

from .world import ClusterSpec, Dataset, NodeSpec

LABEL_POOL = "gpuorch.io/pool"


def node_info(n: NodeSpec, free: int) -> NodeInfo:
    """The node as inventory reports it, `free` GPUs free (CPU and memory: its capacity, where known)."""
    return NodeInfo(name=n.name, ready=True, pool=n.pool, gpu_product=n.product, gpu_memory_mib=n.memory_mib,
                    gpus_allocatable=n.gpus, gpus_free=free, labels={LABEL_POOL: n.pool} if n.pool else {},
                    sharing=list(n.sharing), cpu_free=n.cpu or 0.0, memory_free=n.memory or 0.0)


@dataclass(eq=False)
class Work:
    """A job booked on a cluster (a trace job or background load)."""

    key: int  # unique in one run
    workers: int
    per_worker: int
    suitable: tuple[int, ...]  # node indices it may use
    submit: float
    expected_run: float  # declared run time on this cluster's slowest suitable GPU (what inventory assumes)
    trace_index: int = -1  # >= 0 for trace jobs
    start: float = math.nan
    end: float = math.nan  # GPUs released
    nodes: tuple[int, ...] = ()  # one entry per worker
    image_s: float = 0.0
    data_s: float = 0.0
    data_gb: float = 0.0
    run_s: float = 0.0
    startup_s: float = 0.0
    # what inventory's waits read of it, made once (`ClusterModel.shape_waits`): pending, its
    # demand; running, its nodes' names and its expected end
    demand: Demand | None = None
    held: tuple[tuple[str, ...], float] | None = None

    @property
    def gpus(self) -> int:
        return self.workers * self.per_worker

    @property
    def hold(self) -> float:
        return self.end - self.start


@dataclass
class Plan:
    start: float
    nodes: tuple[int, ...]


@dataclass
class ClusterModel:
    spec: ClusterSpec
    output_seconds: float = DEFAULT_OUTPUT_TRANSFER_SECONDS
    # booked future: per node, (end, gpus) of every job that started or will start by `tail`
    intervals: list[list[tuple[float, int]]] = field(default_factory=list)
    tail: float = 0.0  # start of the last booked job (strict FIFO: nothing starts earlier)
    cache_ready: dict[str, float] = field(default_factory=dict)  # dataset ref -> staged by then
    # observed now (what inventory would see)
    free: list[int] = field(default_factory=list)
    pending: dict[int, Work] = field(default_factory=dict)
    running: dict[int, Work] = field(default_factory=dict)
    version: int = 0  # bumped at every observable change
    pending_gpus: int = 0  # GPUs of `pending` and of `running`, kept with them
    running_gpus: int = 0
    _suitable: dict[tuple[object, ...], tuple[int, ...]] = field(default_factory=dict)
    _info: dict[tuple[int, int], NodeInfo] = field(default_factory=dict)
    # what the last snapshot published, kept while it holds: the node list (until a start or an
    # end changes free GPUs) and the registry with the datasets staged by then
    _nodes: list[NodeInfo] | None = None
    _staged: tuple[tuple[str, ...], ClusterRegistryEntry] | None = None

    def __post_init__(self) -> None:
        n = len(self.spec.nodes)
        self.intervals = [[] for _ in range(n)]
        self.free = [node.gpus for node in self.spec.nodes]
        self.speed = [relative_speed(node.product) for node in self.spec.nodes]
        self.cap = [node.gpus for node in self.spec.nodes]
        reg = self.spec.registry
        self.local = frozenset(reg.data_locations)
        self.cached = frozenset(reg.datasets_cached)
        self.images = frozenset(reg.images_cached)
        # the node layout and request shapes inventory's waits are for (they never change here)
        self.slots = [Slot(n.name, n.gpus, n.product, n.pool) for n in self.spec.nodes if n.gpus > 0]
        self.shapes = request_shapes(self.slots)
        self.layout = wait_layout(self.slots, self.shapes)

    @property
    def name(self) -> str:
        return self.spec.name

    # ---- matching: the same predicates the router's checks and the Job's constraints use ----
    def suitable(self, memory_gib: float, accelerators: tuple[str, ...], per_worker: int, sharing: Sharing | None = None,
                 cpu: float = 0.0, memory: float = 0.0) -> tuple[int, ...]:
        """Nodes that may take a worker: GPUs, memory floor, model list, sharing (the router's
        `sharing_ok`: a share only on GPUs shared that way, whole GPUs never there) and, where
        the node list gives them, its CPU and memory (capacity: their use is not booked)."""
        k = (memory_gib, accelerators, per_worker, sharing, cpu, memory)
        got = self._suitable.get(k)
        if got is None:
            got = tuple(
                i for i, n in enumerate(self.spec.nodes)
                if n.gpus >= per_worker
                and (not memory_gib or gpu_memory_ok(n.memory_mib, memory_gib))
                and (not accelerators or any(accelerator_matches(a, n.product) for a in accelerators))
                and sharing_ok(sharing, n.sharing)
                and (n.cpu is None or n.cpu >= cpu) and (n.memory is None or n.memory >= memory)
            )
            self._suitable[k] = got
        return got

    def slowest_speed(self, nodes: Sequence[int]) -> float:
        return min((self.speed[i] for i in nodes), default=1.0)

    # ---- the booked future ---------------------------------------------------------------
    def plan(self, w: Work, now: float) -> Plan | None:
        """When `w` would start if enqueued at `now`, and on which nodes (None: it never fits)."""
        t0 = max(now, self.tail)
        free: dict[int, int] = {}
        events: list[tuple[float, int, int]] = []
        for i in w.suitable:
            ivs = self.intervals[i]
            if ivs and min(e for e, _ in ivs) <= t0:
                ivs = self.intervals[i] = [(e, g) for e, g in ivs if e > t0]
            free[i] = self.cap[i] - sum(g for _, g in ivs)
            events.extend((e, i, g) for e, g in ivs)
        pw = w.per_worker
        slots = sum(f // pw for f in free.values())
        t = t0
        if slots < w.workers:
            events.sort()
            k, n = 0, len(events)
            while slots < w.workers and k < n:
                t = events[k][0]
                while k < n and events[k][0] == t:
                    _, i, g = events[k]
                    slots += (free[i] + g) // pw - free[i] // pw
                    free[i] += g
                    k += 1
            if slots < w.workers:
                return None
        chosen: list[int] = []
        for _ in range(w.workers):
            best = min((f, i) for i, f in free.items() if f >= pw)[1]
            free[best] -= pw
            chosen.append(best)
        return Plan(start=t, nodes=tuple(chosen))

    def staging(self, dataset: Dataset | None, image: str | None, start: float) -> tuple[float, float, float]:
        """(image pull s, data staging s, GB moved) for a job that starts at `start`."""
        image_s = 0.0 if image is None or image in self.images else DEFAULT_IMAGE_PULL_SECONDS
        if dataset is None or dataset.ref in self.cached or self.local.intersection(dataset.locations):
            return image_s, 0.0, 0.0
        bw = max((self.spec.registry.bandwidth_mbps.get(loc, 0.0) for loc in dataset.locations), default=0.0)
        if bw <= 0:
            return image_s, math.inf, dataset.size_gb
        full = dataset.size_gb * 1000.0 / bw
        ready = self.cache_ready.get(dataset.ref, math.inf)
        if ready <= start:
            return image_s, 0.0, 0.0
        if ready < start + full:  # another job is staging it: wait for that copy
            return image_s, ready - start, 0.0
        return image_s, full, dataset.size_gb

    def commit(self, w: Work, plan: Plan, hold: float) -> None:
        w.start, w.nodes, w.end = plan.start, plan.nodes, plan.start + hold
        self.tail = plan.start
        for i in plan.nodes:
            self.intervals[i].append((w.end, w.per_worker))
        self.pending[w.key] = w
        self.pending_gpus += w.gpus
        self.version += 1

    def note_staged(self, ref: str, ready: float) -> None:
        if ready < self.cache_ready.get(ref, math.inf):
            self.cache_ready[ref] = ready

    # ---- the observed present --------------------------------------------------------------
    def apply_start(self, w: Work) -> None:
        del self.pending[w.key]
        self.running[w.key] = w
        self.pending_gpus -= w.gpus
        self.running_gpus += w.gpus
        for i in w.nodes:
            self.free[i] -= w.per_worker
        self.version += 1
        self._nodes = None

    def apply_end(self, w: Work) -> None:
        del self.running[w.key]
        self.running_gpus -= w.gpus
        for i in w.nodes:
            self.free[i] += w.per_worker
        self.version += 1
        self._nodes = None

    def free_gpus(self) -> int:
        return sum(self.free)

    def _node(self, i: int) -> NodeInfo:
        f = self.free[i]
        info = self._info.get((i, f))
        if info is None:
            n = self.spec.nodes[i]
            info = node_info(n, f)
            self._info[(i, f)] = info
        return info

    def _node_list(self) -> list[NodeInfo]:
        """Every node as inventory reports it now (one list while free GPUs stay the same: never mutated)."""
        if self._nodes is None:
            self._nodes = [self._node(i) for i in range(len(self.spec.nodes))]
        return self._nodes

    def shape_waits(self, now: float) -> list[ShapeWait]:
        """What inventory publishes for this cluster's queue: the waits per request shape of
        `gpuorch_inventory.core.shape_waits`, in the registry's admission order (`fifo`, the
        simulator's). Running work holds its GPUs for its expected remaining time; pending work is
        ahead in arrival order, each job a gang for its declared run time plus startup (staging is
        not known before it starts)."""
        nodes = self.spec.nodes
        holds: list[Hold] = []
        for w in self.running.values():
            held = w.held
            if held is None:
                held = w.held = (tuple(nodes[i].name for i in w.nodes), w.start + w.expected_run + w.image_s + w.data_s + w.startup_s)
            remaining = max(0.0, held[1] - now)
            names = held[0]
            if len(names) == 1:
                holds.append(Hold(names[0], w.per_worker, remaining))
            else:
                holds.extend([Hold(name, w.per_worker, remaining) for name in names])
        ahead: list[Demand] = []
        for w in self.pending.values():
            d = w.demand
            if d is None:
                d = w.demand = Demand(gpus=w.per_worker, duration=w.expected_run + self.spec.registry.startup_seconds,
                                      workers=w.workers,
                                      nodes=None if len(w.suitable) == len(nodes) else frozenset(nodes[i].name for i in w.suitable))
            ahead.append(d)
        starts = shape_waits(self.slots, holds, ahead, self.shapes, self.spec.registry.queueing, layout=self.layout)
        return published_waits(self.shapes, starts, None)

    def pooled_wait(self, now: float) -> float:
        """A single wait (the replay's default before waits per shape; kept to compare): one pool of all GPUs, running work
        releasing its GPUs at its expected end, pending work ahead started in arrival order when
        enough GPUs are free, for its expected duration; then the one-GPU request. O(n log n)."""
        releases = [w.start + w.expected_run + w.image_s + w.data_s + w.startup_s for w in self.running.values()
                    for _ in range(w.gpus)]
        heap = [max(now, t) for t in releases]
        free = sum(self.cap) - len(heap)
        heapq.heapify(heap)
        t = now
        startup = self.spec.registry.startup_seconds
        for w in self.pending.values():
            need = w.gpus
            while free < need and heap:
                t = max(t, heapq.heappop(heap))
                free += 1
            if free < need:
                break
            free -= need
            for _ in range(need):
                heapq.heappush(heap, t + w.expected_run + startup)
        while free < 1 and heap:
            t = max(t, heapq.heappop(heap))
            free += 1
        return max(0.0, t - now)

    def oracle_wait(self, now: float) -> float:
        """The true wait of a one-GPU request enqueued now (an experiment, not what inventory can know:
        it uses the true run times of everything booked)."""
        probe = Work(key=-1, workers=1, per_worker=1, suitable=self.suitable(0.0, (), 1), submit=now, expected_run=0.0)
        plan = self.plan(probe, now)
        return math.inf if plan is None else plan.start - now

    def snapshot(self, now: float, *, queue_model: str = "inventory") -> ClusterSnapshot:
        """What inventory would publish now: per node free GPUs, the queue, staged datasets."""
        reg = self.spec.registry
        staged = tuple(sorted(ref for ref, t in self.cache_ready.items() if t <= now and ref not in self.cached))
        if staged:
            if self._staged is None or self._staged[0] != staged:
                self._staged = (staged, msgspec.structs.replace(reg, datasets_cached=[*reg.datasets_cached, *staged]))
            reg = self._staged[1]
        pending_gpus = self.pending_gpus
        busy = bool(self.pending) or not any(self.free)  # else a one-GPU request fits now: 0
        wait, shaped = 0.0, []
        if queue_model == "inventory":
            shaped = self.shape_waits(now)
            wait = shaped[0].seconds
        elif busy:
            wait = self.oracle_wait(now) if queue_model == "oracle" else self.pooled_wait(now)
        queue = QueueInfo(name="default", pending_jobs=len(self.pending), pending_gpus=pending_gpus,
                          estimated_wait_seconds=wait, shape_waits=shaped)
        return ClusterSnapshot(
            cluster=self.name, reachable=True, observed_at=now, published_at=now,
            nodes=self._node_list(), queues=[queue],
            running_gpus=self.running_gpus, pending_gpus=pending_gpus, registry=reg,
        )
