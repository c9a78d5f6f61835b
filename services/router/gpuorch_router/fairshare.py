"""Fair share across all clusters: which owner's workload is released next (issue 13, item 5).

Pure: usage, capacity, candidates and `now` in; an order out. No I/O, no clock (checked by
tests/test_layering.py). See docs/pipelines.md, "Fair share".

Owners sharing a queue get its resources in proportion to their weights over a window, measured
across every cluster together by **dominant-resource share**, as Armada computes it within a pool:

    share(owner) = max over r in (GPU, CPU, memory) of  used_r / (capacity_r x window)
    weighted(owner) = share(owner) / weight(owner)

`used_r` is resource-seconds of the owner's work in the queue inside `(now - window, now]`, finished
and running, plus what running work is still committed to: a running workload counts at least
its expected run time (or the policy's `quantum` when it declares none), so that a job which has
just started is not free. `capacity_r` is every cluster's capacity added together: the window is
one pool, whatever cluster each workload ran on (Kueue's MultiKueue has no cross-cluster share).

The next workload released is the head of the owner with the lowest weighted share; releasing it
charges that owner its expected use at once, so one round of `admit` alternates between owners
instead of giving every free slot to whoever was lowest at the start of the round. Queue priority
still comes first (a higher-priority queue's work is taken before any fair share is looked at);
within one owner, the admission order is unchanged (workload priority, submit time, index).

`FairOrder` is the one ordering function: `pipeline.admit` iterates it, calls `charge` for each
workload it releases, and `reserve` for one it holds: the lowest-share owner's head that does not
fit keeps its room (a reservation), so small work of owners with more does not starve it. Without fair share (no usage given, or a queue without `fair_share`) it is
exactly `sorted(candidates, key=order_key)`.

**Units.** Uses are timed by the events' clock (`at`, seconds). The durations people write (a
workload's `expected_runtime`, the policy's `quantum` and `window`) are in the clusters' simulated
seconds, as leases and requeue limits are: `Usage.time_scale` (the registry's simulated seconds per
second, 1 in production, 600 on the local clusters) turns them into the events' seconds
(`clock_seconds`), so that a finished job's real use and a running one's commitment are counted
in one unit. (Unscaled, the commitments of running work outweighed every finished job 600 to 1,
and the share forgot all history: an owner who had every GPU first kept its lead.)
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from gpuorch_proto.inventory import ClusterSnapshot
from gpuorch_proto.policy import AdmissionPolicy, FairShare, QueuePolicy
from gpuorch_proto.units import parse_duration, parse_quantity
from gpuorch_proto.workload import Workload

_GIB = 1024.0**3


@dataclass(frozen=True)
class Vec:
    """An amount of each resource the share is taken over: GPUs, CPU cores, memory GiB."""

    gpus: float = 0.0
    cpu: float = 0.0
    memory_gib: float = 0.0

    def __add__(self, o: Vec) -> Vec:
        return Vec(self.gpus + o.gpus, self.cpu + o.cpu, self.memory_gib + o.memory_gib)

    def scale(self, k: float) -> Vec:
        return Vec(self.gpus * k, self.cpu * k, self.memory_gib * k)

    def items(self) -> tuple[tuple[str, float], ...]:
        return (("gpus", self.gpus), ("cpu", self.cpu), ("memory", self.memory_gib))


def demand_of(wl: Workload) -> Vec:
    """What a workload holds while it runs, over all its workers."""
    r = wl.spec.resources
    n = r.workers
    return Vec(r.gpus * n, parse_quantity(r.cpu) * n, parse_quantity(r.memory) * n / _GIB)


def capacity_of(snapshots: Iterable[ClusterSnapshot]) -> Vec:
    """Every reachable cluster's capacity added together: the one pool fair share is taken over.

    GPUs are each node's allocatable; for CPU and memory a snapshot carries what is free, so those
    are a lower bound (a resource with no capacity known is left out of the dominant share).
    """
    total = Vec()
    for s in snapshots:
        if not s.reachable:
            continue
        for n in s.nodes:
            if n.ready:
                total = total + Vec(float(n.gpus_allocatable), n.cpu_free, n.memory_free / _GIB)
    return total


NOT_STARTED = math.inf  # the start of a use released but not running: it counts its commitment only


@dataclass(frozen=True)
class Use:
    """One attempt's hold on resources, for fair share: finished (`end` set) or still running."""

    owner: str
    queue: str
    vec: Vec
    start: float
    end: float | None = None
    expected: float = 0.0  # expected run seconds (0: unknown; running work counts the quantum)


def clock_seconds(duration: str | float, time_scale: float = 1.0) -> float:
    """A duration people write (`"7d"`, or seconds: simulated seconds on the local clusters) in the
    events' seconds. `simulated_seconds` is its inverse; the router's budgets use both."""
    seconds = parse_duration(duration) if isinstance(duration, str) else duration
    return seconds / max(time_scale, 1e-9)


def simulated_seconds(clock: float, time_scale: float = 1.0) -> float:
    """Seconds of the events' clock in the clusters' simulated seconds (`clock_seconds`' inverse)."""
    return clock * max(time_scale, 1e-9)


def resource_seconds(u: Use, window: float, quantum: float, now: float) -> Vec:
    """Resource-seconds of `u` inside `(now - window, now]`, plus, while it runs, what it is still
    committed to (up to its expected run time, or the quantum when it declares none)."""
    lo = now - window
    end = now if u.end is None else min(u.end, now)
    inside = max(0.0, end - max(u.start, lo))
    ahead = 0.0
    if u.end is None:
        elapsed = max(0.0, now - u.start)
        ahead = max(0.0, (u.expected or quantum) - elapsed)
    return u.vec.scale(inside + ahead)


def dominant_share(used: Vec, capacity: Vec, window: float) -> float:
    """The largest of used / (capacity x window) over the resources with a known capacity."""
    share = 0.0
    for (_, u), (_, c) in zip(used.items(), capacity.items(), strict=True):
        if c > 0 and window > 0:
            share = max(share, u / (c * window))
    return share


def weight(fs: FairShare, owner: str) -> float:
    return fs.weights.get(owner, fs.default_weight)


@dataclass(frozen=True)
class Usage:
    """What fair share is computed from: every attempt's use (any cluster), all clusters'
    capacity, and each candidate's demand (default: its GPUs only)."""

    uses: Sequence[Use] = ()
    capacity: Vec = Vec()
    demand: Mapping[str, Vec] = field(default_factory=dict)  # workload id -> what it will hold
    time_scale: float = 1.0  # simulated seconds per second of the events' clock (`clock_seconds`)


def owner_usage(uses: Iterable[Use], queue: str, fs: FairShare, now: float, time_scale: float = 1.0) -> dict[str, Vec]:
    """Each owner's resource-seconds in the queue over the window (finished, running, committed)."""
    window, quantum = clock_seconds(fs.window, time_scale), clock_seconds(fs.quantum, time_scale)
    out: dict[str, Vec] = {}
    for u in uses:
        if u.queue == queue:
            out[u.owner] = out.get(u.owner, Vec()) + resource_seconds(u, window, quantum, now)
    return out


def weighted_shares(usage: Usage, q: QueuePolicy, now: float) -> dict[str, float]:
    """Each owner's weighted dominant share of the queue (explain and tests read it)."""
    fs = q.fair_share
    if fs is None:
        return {}
    window = clock_seconds(fs.window, usage.time_scale)
    return {
        o: dominant_share(v, usage.capacity, window) / weight(fs, o)
        for o, v in owner_usage(usage.uses, q.name, fs, now, usage.time_scale).items()
    }


class Candidate(Protocol):
    @property
    def workload_id(self) -> str: ...
    @property
    def owner(self) -> str: ...
    @property
    def queue(self) -> str | None: ...
    @property
    def gpus(self) -> float: ...
    @property
    def gpu_hours(self) -> float: ...


class FairOrder:
    """Candidates in release order: queue priority, then (within a queue with fair share) the owner
    with the lowest weighted dominant share, then `key` (the admission order) within an owner.

    Iterate it; call `charge(c)` for each candidate released, and the owner's share grows by the
    candidate's expected use before the next is chosen. A candidate not charged (held) costs
    nothing. Every candidate is yielded exactly once.
    """

    def __init__(
        self,
        policy: AdmissionPolicy,
        candidates: Iterable[Any],
        usage: Usage | None,
        now: float,
        key: Callable[[Any], tuple[Any, ...]],
    ) -> None:
        self.policy, self.usage, self.now, self.key = policy, usage, now, key
        self._groups: dict[tuple[str, str], list[Any]] = {}  # (queue, owner) -> candidates, in key order
        self._used: dict[tuple[str, str], Vec] = {}
        self._queues: dict[str, QueuePolicy | None] = {}
        self._reserved: set[str] = set()  # queues whose room is kept for a held head this round
        for c in sorted(candidates, key=key):
            q = policy.queue(c.queue)
            qname = q.name if q is not None else f"?{c.queue}"
            self._queues[qname] = q
            fair = q is not None and q.fair_share is not None and usage is not None
            g = (qname, c.owner if fair else "")
            self._groups.setdefault(g, []).append(c)
        for qname, q in self._queues.items():
            if q is not None and q.fair_share is not None and usage is not None:
                for owner, v in owner_usage(usage.uses, qname, q.fair_share, now, usage.time_scale).items():
                    self._used[(qname, owner)] = v

    def share(self, queue: str, owner: str) -> float:
        q = self._queues.get(queue)
        if q is None or q.fair_share is None or self.usage is None:
            return 0.0
        used = self._used.get((queue, owner), Vec())
        window = clock_seconds(q.fair_share.window, self.usage.time_scale)
        return dominant_share(used, self.usage.capacity, window) / weight(q.fair_share, owner)

    def _pick(self) -> tuple[str, str] | None:
        best: tuple[tuple[Any, ...], tuple[str, str]] | None = None
        for g, items in self._groups.items():
            if not items:
                continue
            head = self.key(items[0])
            # the key leads with queue priority: keep it first, then the share, then the rest
            k = (head[0], self.share(*g), *head[1:])
            if best is None or k < best[0]:
                best = (k, g)
        return best[1] if best is not None else None

    def __iter__(self) -> Iterator[Any]:
        while (g := self._pick()) is not None:
            yield self._groups[g].pop(0)

    def reserve(self, c: Any, holds: Iterable[Any]) -> bool:
        """`c` was held: should its room be kept for it (True), so that nobody after it in this
        round takes what it waits for? Once per queue with fair share and per round, for the
        lowest-share owner's head (the one `c` is, when it comes first), and only when what holds
        it is room at organisation or queue level (not its own pipeline's limit, not a budget):
        otherwise a large job of the owner with the lowest share would wait for ever behind the
        small ones of an owner with more (reservation, as Armada and Slurm's backfill keep it)."""
        q = self.policy.queue(c.queue)
        if q is None or q.fair_share is None or self.usage is None or q.name in self._reserved:
            return False
        if any(h.scope == "pipeline" or h.kind == "budget" for h in holds):
            return False
        self._reserved.add(q.name)
        return True

    def charge(self, c: Any) -> None:
        """`c` was released: its owner is charged its expected use (its expected run time, or the
        quantum) from now on, so the next choice sees it."""
        q = self.policy.queue(c.queue)
        if q is None or q.fair_share is None or self.usage is None:
            return
        fs = q.fair_share
        vec = self.usage.demand.get(c.workload_id, Vec(gpus=c.gpus))
        seconds = (
            c.gpu_hours * 3600.0 / c.gpus if c.gpus > 0 and c.gpu_hours > 0 else parse_duration(fs.quantum)
        ) / max(self.usage.time_scale, 1e-9)
        k = (q.name, c.owner)
        self._used[k] = self._used.get(k, Vec()) + vec.scale(seconds)


def uses_of(views: Iterable[Any], policy: AdmissionPolicy, time_scale: float = 1.0) -> list[Use]:
    """Every attempt's use from the projection (`gpuorch.projection.WorkloadView`s): from
    `running` to its end (`finished`, or confirmed gone), on any cluster.

    And released work that is not running (yet, or again after a failure): it holds its slot and
    is committed to its expected use (a use `NOT_STARTED` counts that and nothing more, however
    long it waits), as `FairOrder.charge` counts it in the round that releases it. Without it, work between
    its release and its pods' start (routing, Job creation, image pulls) would cost its owner
    nothing in the next round, and the owner with the most work in flight would get the next slot.
    """
    out: list[Use] = []
    for v in views:
        wl = v.workload
        if wl is None:
            continue
        q = policy.queue(wl.spec.policy_queue)
        queue = q.name if q is not None else (wl.spec.policy_queue or policy.default_queue)
        vec = demand_of(wl)
        expected = clock_seconds(wl.spec.expected_runtime, time_scale) if wl.spec.expected_runtime else 0.0
        holding = False
        for a in v.attempts.values():
            start = a.times.get("running")
            holding = holding or a.status == "succeeded" or a.promoted  # ran: its result is being promoted
            if start is None:
                continue
            ends = [a.times[k] for k in ("finished", "cancel-confirmed", "orphan-deleted") if k in a.times]
            out.append(Use(wl.metadata.owner, queue, vec, start, min(ends) if ends else None, expected))
            holding = holding or not ends
        if "released" in v.times and not (holding or v.terminal or v.cancel_requested or v.children):
            out.append(Use(wl.metadata.owner, queue, vec, NOT_STARTED, None, expected))  # committed, not running
    return out


def retired_uses(records: Iterable[Any], policy: AdmissionPolicy, time_scale: float = 1.0) -> list[Use]:
    """`uses_of` for finished workloads a service keeps as retired records
    (`gpuorch.projection.Retired`: the document's owner, queue, demand and expected run time, the
    attempts' times): the same uses their whole views give."""
    out: list[Use] = []
    facts: dict[Any, tuple[str, Vec, float]] = {}  # per (shared) retired document
    for r in records:
        d = r.doc
        if d is None:
            continue
        got = facts.get(d)
        if got is None:
            q = policy.queue(d.policy_queue)
            queue = q.name if q is not None else (d.policy_queue or policy.default_queue)
            n = d.workers
            vec = Vec(d.gpus * n, parse_quantity(d.cpu) * n, parse_quantity(d.memory) * n / _GIB)
            expected = clock_seconds(d.expected_runtime, time_scale) if d.expected_runtime else 0.0
            got = facts[d] = (queue, vec, expected)
        queue, vec, expected = got
        for a in r.attempts:
            start = a.times.get("running")
            if start is None:
                continue
            ends = [a.times[k] for k in ("finished", "cancel-confirmed", "orphan-deleted") if k in a.times]
            out.append(Use(d.owner, queue, vec, start, min(ends) if ends else None, expected))
    return out


class _Demands(Mapping[str, Vec]):
    """Each workload's demand (`demand_of`), read from the views only when asked for."""

    def __init__(self, views: Mapping[str, Any]) -> None:
        self._views = views

    def __getitem__(self, key: str) -> Vec:
        v = self._views[key]
        if v.workload is None:
            raise KeyError(key)
        return demand_of(v.workload)

    def __iter__(self) -> Iterator[str]:
        return iter(self._views)

    def __len__(self) -> int:
        return len(self._views)


def usage_of(
    views: Mapping[str, Any],
    policy: AdmissionPolicy,
    snapshots: Iterable[ClusterSnapshot],
    retired: Iterable[Any] = (),
    time_scale: float = 1.0,
) -> Usage | None:
    """What the router's admission needs for fair share (None: no queue has fair share): every
    attempt's use on any cluster (`uses_of`, `retired_uses`), all clusters' capacity (`capacity_of`)
    and each candidate's demand in GPUs, CPU and memory. `views`: the projection's workloads by id;
    `retired`: its retired records; `time_scale`: the registry's simulated seconds per second."""
    if not any(q.fair_share is not None for q in policy.queues):
        return None
    uses = uses_of(views.values(), policy, time_scale) + retired_uses(retired, policy, time_scale)
    return Usage(uses, capacity_of(snapshots), _Demands(views), time_scale)
