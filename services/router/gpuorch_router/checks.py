"""Hard eligibility of one cluster (DESIGN §5.1): every check, with a reason code and its numbers.

Reference implementation, no memoisation. Three groups, in the order a verdict lists them:

* **node checks** (:func:`node_checks`): a filter chain over the index's node classes in
  ``condor_q -better-analyze`` style: POOL, NODE_SELECTOR, TAINTS, GPU_MODEL, GPU_MEMORY, SHARING,
  GPU_SHARED (:func:`node_filter`), CPU_MEMORY (:func:`cpu_memory_step`), then GPU_SHAPE, GANG_SPLIT and
  GPU_CAPACITY (:func:`shape_checks`). Each check sees the classes earlier checks left;
* **registry checks** (:func:`registry_checks`): CONNECTIONS, CREDENTIALS, ARTIFACT_STORE,
  INPUT_DATA (with the data staging of :func:`data_staging`), CHECKPOINT (writing checkpoints is
  required; resuming one is a preference, :mod:`gpuorch_proto.resume`), QUEUE_ACCESS;
* **freshness** (:func:`freshness`): CLUSTER_UNREACHABLE, from the snapshot's age at ``now``.

A failed check is *permanent* unless marked ``capacity_only`` (it may pass later without anyone
changing the workload: unreachable or stale, suitable nodes not Ready, excluded for now).
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Final

from gpuorch_proto.inventory import Taint
from gpuorch_proto.kubesem import untolerated_taints
from gpuorch_proto.placement import accelerator_matches, gpu_memory_floor_mib, sharing_ok
from gpuorch_proto.resume import ResumeVerdict, can_resume
from gpuorch_proto.routing import Check, ReasonCode
from gpuorch_proto.units import format_duration
from gpuorch_proto.workload import Workload

from .demand import Demand, parse_demand
from .index import VOLATILE_LABELS, NodeClass, SnapshotIndex, node_classes, plural

__all__ = [
    "EXCLUDED",
    "NODE_PARTS",
    "Chain",
    "NodePart",
    "NodeParts",
    "Staging",
    "cpu_memory_step",
    "data_staging",
    "eligible_nodes",
    "fail",
    "freshness",
    "node_checks",
    "node_filter",
    "node_prelude",
    "ok",
    "registry_checks",
    "resume_verdict",
    "shape_checks",
    "shared_as",
    "sharing_steps",
]


# ---- wording -------------------------------------------------------------------------------------


def gib(n_bytes: float) -> str:
    return f"{n_bytes / 2**30:.3g} GiB"


def listing(items: Iterable[str], empty: str = "none") -> str:
    out = ", ".join(items)
    return out or empty


def dur(seconds: float) -> str:
    return format_duration(seconds) if seconds > 0 else "0s"


def ok(code: ReasonCode, message: str) -> Check:
    return Check(code=code, ok=True, message=message)


def fail(code: ReasonCode, message: str, capacity_only: bool = False) -> Check:
    return Check(code=code, ok=False, message=message, capacity_only=capacity_only)


_NODE_COUNT: Final = operator.attrgetter("nodes")


def count_nodes(classes: Iterable[NodeClass]) -> int:
    return sum(map(_NODE_COUNT, classes))


def slots(cls: NodeClass, per_node: int, units: int, *, ready: bool) -> int:
    """Placements of `per_node` GPUs the class holds (all nodes, or its Ready ones)."""
    count = cls.ready if ready else cls.nodes
    if per_node <= 0:
        return count * units  # no GPU: GPUs do not limit placements
    return count * (cls.allocatable // per_node)


def free_slots(cls: NodeClass, per_node: int, units: int) -> int:
    """Placements of `per_node` GPUs free now on the class's Ready nodes."""
    if per_node <= 0:
        return cls.ready * units
    return sum(n * (free // per_node) for free, n in cls.free_hist)


# ---- node checks ---------------------------------------------------------------------------------


class Chain:
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
            self.checks.append(ok(code, ok_msg(passing, base)))
        else:
            self.checks.append(fail(code, fail_msg(base)))
        if self.left:
            self.left = passing
        return passing


def _summary_of(classes: Sequence[NodeClass], attr: Callable[[NodeClass], str]) -> str:
    counts: dict[str, int] = {}
    for c in classes:
        counts[attr(c)] = counts.get(attr(c), 0) + c.nodes
    return listing(f"{k} ({plural(v, 'node')})" for k, v in sorted(counts.items()))


def untolerated(d: Demand, c: NodeClass) -> list[Taint]:
    """The class's scheduling taints the workload does not tolerate (`gpuorch_proto.kubesem`)."""
    return untolerated_taints(d.tolerations, c.taints) if c.taints else []


def node_filter(chain: Chain, d: Demand) -> None:
    """POOL .. GPU_SHARED: the node checks that read the node classes and these demand fields only:
    pools, selector, tolerations, whether a GPU is wanted, accelerators, GPU memory, sharing."""
    if d.pools:
        pools = sorted(d.pools)
        chain.step(
            "POOL",
            lambda c: c.pool in d.pools,
            lambda p, b: f"{count_nodes(p)} of {count_nodes(b)} nodes in pools {listing(pools)}",
            lambda b: (
                f"no node in pools {listing(pools)}; pools here: " + _summary_of(b, lambda c: c.pool or "-")
            ),
        )
    else:
        chain.checks.append(ok("POOL", "any pool allowed"))
    if d.selector:
        sel = ", ".join(f"{k}={v}" for k, v in d.selector)
        chain.step(
            "NODE_SELECTOR",
            lambda c: all(c.labels.get(k) == v for k, v in d.selector if k not in VOLATILE_LABELS),
            lambda p, b: f"{count_nodes(p)} of {count_nodes(b)} nodes match {sel}",
            lambda b: f"none of {plural(count_nodes(b), 'node')} has labels {sel}",
        )
    else:
        chain.checks.append(ok("NODE_SELECTOR", "no node selector"))
    chain.step(
        "TAINTS",
        lambda c: not untolerated(d, c),
        lambda p, b: f"{count_nodes(p)} of {count_nodes(b)} nodes have no untolerated NoSchedule/NoExecute taint",
        lambda b: (
            "every node has an untolerated taint: "
            + _summary_of(
                b,
                lambda c: ", ".join(f"{t.key}={t.value or ''}:{t.effect}" for t in untolerated(d, c)),
            )
        ),
    )
    if d.per_worker == 0:
        chain.checks.append(ok("GPU_MODEL", "no GPU requested"))
        chain.checks.append(ok("GPU_MEMORY", "no GPU requested"))
    else:
        if d.accelerators:
            acc = listing(d.accelerators)
            chain.step(
                "GPU_MODEL",
                lambda c: (
                    c.allocatable > 0 and any(accelerator_matches(a, c.product) for a in d.accelerators)
                ),
                lambda p, b: f"{count_nodes(p)} of {count_nodes(b)} nodes have a GPU model in [{acc}]",
                lambda b: (
                    f"no node has a GPU model in [{acc}]; models here: "
                    + _summary_of(b, lambda c: c.product or "no GPU")
                ),
            )
        else:
            chain.checks.append(ok("GPU_MODEL", "any GPU model"))
        if d.gpu_memory_mib:
            need = d.gpu_memory_mib
            floor_mib = gpu_memory_floor_mib(need / 1024)  # the Job's `Gt` uses the same floor

            def largest(b: Sequence[NodeClass]) -> str:
                best = max(b, key=lambda c: (c.memory_mib, c.product or ""))
                return f"{best.memory_mib / 1024:.3g} GiB ({best.product or 'no GPU'}, {plural(best.nodes, 'node')})"

            chain.step(
                "GPU_MEMORY",
                lambda c: c.allocatable > 0 and c.memory_mib >= floor_mib,
                lambda p, b: f"{count_nodes(p)} of {count_nodes(b)} nodes have >= {need / 1024:.3g} GiB per GPU",
                lambda b: f"needs >= {need / 1024:.3g} GiB per GPU; largest here {largest(b)}",
            )
        else:
            chain.checks.append(ok("GPU_MEMORY", "no minimum GPU memory"))
    sharing_steps(chain, d)


def shared_as(c: NodeClass) -> str:
    """How a class's GPUs are shared, in words ("time-sliced", "MIG slices (1g.5gb)"); "" if not."""
    words = []
    if "mig" in c.sharing:
        profiles = sorted(s.split(":", 1)[1] for s in c.sharing if s.startswith("mig:"))
        words.append(f"MIG slices ({', '.join(profiles)})" if profiles else "MIG slices")
    if "mps" in c.sharing:
        words.append("shared by MPS")
    if "time-slicing" in c.sharing:
        words.append("time-sliced")
    return " and ".join(words)


def sharing_steps(chain: Chain, d: Demand) -> None:
    """SHARING (a workload naming a mechanism, or a fractional one) and GPU_SHARED (a workload
    asking for whole GPUs): one rule, :func:`gpuorch_proto.placement.sharing_ok`, which the Job's
    constraints state as labels. A shared GPU serves only a workload that names its sharing."""
    if d.per_worker == 0:
        chain.checks.append(ok("SHARING", "no GPU requested"))
        chain.checks.append(ok("GPU_SHARED", "no GPU requested"))
        return
    if d.sharing is not None:
        sharing = d.sharing
        what = f"{sharing.mechanism} ({sharing.profile})" if sharing.profile else sharing.mechanism
        chain.step(
            "SHARING",
            lambda c: sharing_ok(sharing, c.sharing),
            lambda p, b: f"{count_nodes(p)} of {count_nodes(b)} nodes offer {what} for {d.gpus:g} GPU per worker",
            lambda b: (
                f"{d.gpus:g} GPU per worker needs {what}; offered here: "
                + _summary_of(b, lambda c: "/".join(sorted(c.sharing)) or "no sharing")
            ),
        )
        chain.checks.append(ok("GPU_SHARED", f"shared GPUs wanted: the workload names {what}"))
        return
    if d.fractional:
        chain.step(  # no node serves it: leaves none
            "SHARING",
            lambda c: False,
            lambda p, b: "",
            lambda b: f"{d.gpus:g} GPUs per worker is not whole and names no sharing mechanism",
        )
        chain.checks.append(ok("GPU_SHARED", "not judged: a fraction of a GPU is not a whole GPU (see SHARING)"))
        return
    chain.checks.append(ok("SHARING", "whole GPUs: no sharing needed"))

    def shared_here(b: Sequence[NodeClass]) -> str:
        kinds = sorted({shared_as(c) or "/".join(sorted(c.sharing)) for c in b if c.sharing})
        return (
            f"{' / '.join(kinds)}, the workload asks for whole GPUs; shared here: "
            + _summary_of([c for c in b if c.sharing], lambda c: c.product or "no GPU")
        )

    chain.step(
        "GPU_SHARED",
        lambda c: sharing_ok(None, c.sharing),
        lambda p, b: f"{count_nodes(p)} of {count_nodes(b)} nodes have whole GPUs (not time-sliced, MPS or MIG)",
        shared_here,
    )


def cpu_memory_step(chain: Chain, d: Demand, cpu_reported: bool) -> None:
    """CPU_MEMORY: reads the classes left and the CPU/memory per node only."""
    if not cpu_reported:
        chain.checks.append(ok("CPU_MEMORY", "free CPU/memory not reported by inventory: not checked"))
        return
    cpu, mem = d.cpu_node, d.memory_node
    what = f"{cpu:g} cores / {gib(mem)}" + (" per node (whole gang)" if d.same_node else " per worker")
    chain.step(
        "CPU_MEMORY",
        # a class fits if some Ready node has it free now, or if no node of it is idle (busy
        # nodes free CPU when their pods end: that is queueing, not ineligibility)
        lambda c: (c.cpu_max >= cpu and c.memory_max >= mem) or not c.has_idle,
        lambda p, b: f"{count_nodes(p)} of {count_nodes(b)} nodes can host {what}",
        lambda b: (
            f"needs {what}; the most an idle suitable node has free is "
            f"{max(c.cpu_max for c in b):g} cores / {gib(max(c.memory_max for c in b))}"
        ),
    )


def shape_checks(chain: Chain, d: Demand, classes: Sequence[NodeClass], total: int) -> list[NodeClass]:
    """GPU_SHAPE, GANG_SPLIT and GPU_CAPACITY after the other node checks; returns the suitable
    classes. Reads the classes left so far and the gang's shape only."""
    if d.per_worker == 0:
        chain.checks.append(ok("GPU_SHAPE", "no GPU requested"))
    else:
        per_node = d.per_node
        shape = (
            f"{per_node} GPUs ({d.workers} workers x {d.per_worker}) on one node"
            if d.same_node and d.workers > 1
            else f"{plural(per_node, 'GPU')} on one node"
        )

        def biggest(b: Sequence[NodeClass]) -> str:
            best = max(b, key=lambda c: (c.allocatable, c.nodes))
            return f"{best.allocatable} ({plural(best.nodes, 'node')} x {plural(best.allocatable, 'GPU')})"

        chain.step(
            "GPU_SHAPE",
            lambda c: c.allocatable >= per_node,
            lambda p, b: f"{count_nodes(p)} of {count_nodes(b)} nodes can hold {shape}",
            lambda b: (
                f"needs {shape}; the largest suitable node has {biggest(b)}"
                + (f", {sum(c.allocatable * c.nodes for c in b)} GPUs in total" if len(b) > 0 else "")
            ),
        )
    suitable = chain.left
    if d.units > 1:
        base = suitable if suitable else [c for c in classes if c.allocatable >= d.per_node]
        n_slots = sum(slots(c, d.per_node, d.units, ready=False) for c in base)
        gang = f"gang of {d.workers} workers x {plural(d.per_worker, 'GPU')}"
        if n_slots >= d.units:
            chain.checks.append(ok("GANG_SPLIT", f"{gang} fits in this cluster ({n_slots} worker slots)"))
        else:
            chain.checks.append(
                fail(
                    "GANG_SPLIT",
                    f"{gang} needs {d.units} worker slots; this cluster has {n_slots} in total "
                    "(a gang never spans clusters)",
                )
            )
            suitable = []
    else:
        chain.checks.append(ok("GANG_SPLIT", "one placement: no gang to split"))
    if suitable:
        ready_slots = sum(slots(c, d.per_node, d.units, ready=True) for c in suitable)
        nodes = count_nodes(suitable)
        ready = sum(c.ready for c in suitable)
        if ready_slots >= d.units:
            chain.checks.append(
                ok(
                    "GPU_CAPACITY",
                    f"{ready} of {plural(nodes, 'suitable node')} Ready: "
                    f"{ready_slots} placement slots for {d.units} needed",
                )
            )
        else:
            chain.checks.append(
                fail(
                    "GPU_CAPACITY",
                    f"only {ready} of {plural(nodes, 'suitable node')} are Ready: "
                    f"{ready_slots} placement slots for {d.units} needed (the rest are lost, NotReady or have no allocatable GPUs)",
                    capacity_only=True,
                )
            )
            suitable = []
    else:
        chain.checks.append(
            fail("GPU_CAPACITY", f"no suitable node among {total}: see the failed node checks")
        )
    return suitable


def node_prelude(
    idx: SnapshotIndex, d: Demand
) -> tuple[Sequence[NodeClass], tuple[list[Check], list[NodeClass]] | None]:
    """The classes the node checks run over, or the whole answer when there is nothing to check.

    A selector on a volatile label (a hostname) regroups the matching nodes into their own
    classes (then ``classes is not idx.classes``); no nodes at all is one failed check.
    """
    classes: Sequence[NodeClass] = idx.classes
    if d.selector and any(k in VOLATILE_LABELS for k, _ in d.selector):
        wanted = {k: v for k, v in d.selector if k in VOLATILE_LABELS}
        classes = node_classes(
            n for c in idx.classes for n in c.members if all(n.labels.get(k) == v for k, v in wanted.items())
        )
    if idx.classes and not classes:
        sel = ", ".join(f"{k}={v}" for k, v in d.selector)
        return classes, ([fail("NODE_SELECTOR", f"none of {plural(idx.node_count, 'node')} has labels {sel}")], [])
    if not idx.classes:
        if not idx.reachable:
            return classes, (
                [
                    fail(
                        "GPU_CAPACITY",
                        f"no node facts: {idx.cluster} has not been observed (it may come back)",
                        capacity_only=True,
                    )
                ],
                [],
            )
        return classes, ([fail("GPU_CAPACITY", f"{idx.cluster} reports no nodes at all")], [])
    return classes, None


#: Checks and the classes they leave (or, after the shape checks, the suitable classes).
NodePart = tuple[tuple[Check, ...], tuple[NodeClass, ...]]


class NodeParts:
    """The two parts of the node checks that read few demand fields, each computed here.

    :func:`node_checks` composes them (with the prelude and CPU_MEMORY between): the one
    composition. The fast path subclasses this (``fastpath._Cached``) to look each part up by
    the fields it reads, so its node checks are this composition's, with cached parts.
    """

    __slots__ = ()

    def filtered(self, idx: SnapshotIndex, classes: Sequence[NodeClass], d: Demand) -> NodePart:
        """POOL .. GPU_SHARED over `classes` (:func:`node_filter`): the checks, the classes left."""
        chain = Chain(classes)
        node_filter(chain, d)
        return tuple(chain.checks), tuple(chain.left)

    def shaped(
        self, idx: SnapshotIndex, classes: Sequence[NodeClass], left: tuple[NodeClass, ...], d: Demand
    ) -> NodePart:
        """GPU_SHAPE, GANG_SPLIT, GPU_CAPACITY (:func:`shape_checks`) over the classes `left` by the
        earlier checks: these checks and the suitable classes."""
        chain = Chain(classes)
        chain.left = list(left)
        suitable = shape_checks(chain, d, classes, idx.node_count)
        return tuple(chain.checks), tuple(suitable)


#: The node parts computed afresh (the reference).
NODE_PARTS: Final = NodeParts()


def node_checks(
    idx: SnapshotIndex, d: Demand, parts: NodeParts = NODE_PARTS
) -> tuple[list[Check], list[NodeClass]]:
    """Node-level checks; returns the checks and the suitable classes (`parts`: where the two
    parts come from; the fast path passes its cached ones)."""
    classes, done = node_prelude(idx, d)
    if done is not None:
        return done
    checks, left = parts.filtered(idx, classes, d)
    chain = Chain(classes)
    chain.checks, chain.left = list(checks), list(left)
    cpu_memory_step(chain, d, idx.cpu_reported)
    tail, suitable = parts.shaped(idx, classes, tuple(chain.left), d)
    chain.checks.extend(tail)
    return chain.checks, list(suitable)


def eligible_nodes(workload: Workload, snapshot: SnapshotIndex) -> frozenset[str]:
    """The nodes the checks count as suitable for `workload` on this cluster (none when they fail).

    The set the Job's constraints (``RoutingDecision.placement``) must accept, and no other: the
    placement property test compares the two over random nodes and workloads.
    """
    _, suitable = node_checks(snapshot, parse_demand(workload, None, None))
    return frozenset(n.name for c in suitable for n in c.members)


# ---- registry checks -----------------------------------------------------------------------------


@dataclass(slots=True)
class Staging:
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


def data_staging(idx: SnapshotIndex, d: Demand) -> Staging:
    """Per input: cached at this version, local, or copied over the fastest link (or unreachable)."""
    seconds, notes, failures = 0.0, [], []
    for inp in d.inputs:
        if inp.ref in idx.datasets_cached:
            notes.append(f"{inp.ref} cached")
            continue
        other = [r for r in idx.datasets_by_name.get(inp.ref.split("@", 1)[0], ()) if r != inp.ref]
        mismatch = f" (cached {listing(other)} is another version)" if other else ""
        local = sorted(set(inp.locations) & idx.readable)
        if local:
            notes.append(f"{inp.ref} local at {local[0]}{mismatch}")
            continue
        links = sorted(
            ((idx.bandwidth[loc], loc) for loc in inp.locations if idx.bandwidth.get(loc, 0) > 0),
            key=lambda x: (-x[0], x[1]),
        )
        if not links:
            failures.append(
                f"{inp.ref}: no replica reachable (replicas at {listing(sorted(inp.locations))}; "
                f"this cluster reads {listing(sorted(idx.readable))} in place and has links from "
                f"{listing(sorted(idx.bandwidth))}){mismatch}"
            )
            continue
        mbps, loc = links[0]
        t = inp.size_gb * 1000.0 / mbps
        seconds += t
        measured = " measured" if loc in idx.bandwidth_measured else ""
        notes.append(f"{inp.ref} copy {inp.size_gb:g} GB from {loc} at {mbps:g} MB/s{measured} = {dur(t)}{mismatch}")
    return Staging(seconds, notes, failures)


def resume_verdict(idx: SnapshotIndex, d: Demand) -> ResumeVerdict | None:
    """Can this cluster resume the workload's latest checkpoint (None: there is none)?"""
    if d.resume is None:
        return None
    return can_resume(d.resume, portable=d.portable, cluster=idx.cluster, readable=idx.checkpoint_stores)


def registry_checks(
    idx: SnapshotIndex, d: Demand, staging: Staging, resume: ResumeVerdict | None
) -> tuple[list[Check], list[str]]:
    """The registry checks and the queues this owner may use ([""] = no admission queues)."""
    checks: list[Check] = []
    needs: tuple[tuple[ReasonCode, tuple[str, ...], frozenset[str], str], ...] = (
        ("CONNECTIONS", d.connections, idx.connections, "connections"),
        ("CREDENTIALS", d.credentials, idx.credentials, "credentials"),
    )
    for code, wanted, have, what in needs:
        if not wanted:
            checks.append(ok(code, f"no {what} required"))
            continue
        missing = [w for w in wanted if w not in have]
        if missing:
            checks.append(
                fail(code, f"missing {what} {listing(missing)} (this cluster has {listing(sorted(have))})")
            )
        else:
            checks.append(ok(code, f"has {what} {listing(wanted)}"))
    if d.output_store in idx.artifact_stores:
        checks.append(ok("ARTIFACT_STORE", f"reaches output store {d.output_store!r}"))
    else:
        checks.append(
            fail(
                "ARTIFACT_STORE",
                f"cannot reach output store {d.output_store!r} "
                f"(reaches {listing(sorted(idx.artifact_stores))})",
            )
        )
    if not d.inputs:
        checks.append(ok("INPUT_DATA", "no inputs"))
    elif staging.failures:
        checks.append(fail("INPUT_DATA", "; ".join(staging.failures)))
    else:
        checks.append(ok("INPUT_DATA", "; ".join(staging.notes)))
    checks.append(_checkpoint_check(idx, d, resume))
    queues, q_check = _queue_access(idx, d)
    checks.append(q_check)
    return checks, queues


def _checkpoint_check(idx: SnapshotIndex, d: Demand, resume: ResumeVerdict | None) -> Check:
    """Writing checkpoints is required (fails when the store is unreachable); resuming the latest
    one is a preference: the message says whether this cluster resumes or restarts from scratch."""
    parts: list[str] = []
    if d.checkpoint_store:
        if d.checkpoint_store not in idx.artifact_stores:
            return fail("CHECKPOINT", f"cannot write checkpoints to store {d.checkpoint_store!r}")
        parts.append(f"writes checkpoints to {d.checkpoint_store!r}")
    if resume is not None:
        parts.append(resume.reason if resume.ok else f"restarts from scratch: {resume.reason}")
    return ok("CHECKPOINT", "; ".join(parts) if parts else "no checkpoint to write or resume")


def _may_use(owners: Sequence[str], owner: str) -> bool:
    return "*" in owners or owner in owners


def _queue_access(idx: SnapshotIndex, d: Demand) -> tuple[list[str], Check]:
    """The queues this owner may use here ([""] = none needed) and the QUEUE_ACCESS check."""
    owners = idx.queue_owners
    known = listing(f"{q} [{','.join(o)}]" for q, o in sorted(owners.items()))
    if d.pin is not None:
        queue = d.pin[1]
        if queue not in owners:
            return [], fail("QUEUE_ACCESS", f"pinned queue {queue!r} does not exist here (queues: {known})")
        if not _may_use(owners[queue], d.owner):
            return [], fail(
                "QUEUE_ACCESS",
                f"queue {queue!r} is not open to owner {d.owner!r} (owners: {','.join(owners[queue])})",
            )
        return [queue], ok("QUEUE_ACCESS", f"pinned queue {queue!r} is open to {d.owner!r}")
    if not owners:
        return [""], ok("QUEUE_ACCESS", "no admission queues: submitted directly")
    allowed = sorted(q for q, o in owners.items() if _may_use(o, d.owner))
    if not allowed:
        return [], fail("QUEUE_ACCESS", f"no queue here is open to owner {d.owner!r} (queues: {known})")
    return allowed, ok("QUEUE_ACCESS", f"owner {d.owner!r} may use {listing(allowed)}")


def cluster_allowed(idx: SnapshotIndex, d: Demand) -> Check:
    """CLUSTER_NOT_ALLOWED: `requirements.clusters`, when the workload lists any."""
    if d.allowed and idx.cluster not in d.allowed:
        return fail("CLUSTER_NOT_ALLOWED", f"not in requirements.clusters ({listing(sorted(d.allowed))})")
    if d.allowed:
        return ok("CLUSTER_NOT_ALLOWED", "in requirements.clusters")
    return ok("CLUSTER_NOT_ALLOWED", "any cluster allowed")


# ---- freshness -----------------------------------------------------------------------------------


def freshness(idx: SnapshotIndex, shown: float, stale: bool, max_age: float) -> Check:
    """CLUSTER_UNREACHABLE at a shown age (whole seconds): unreachable, stale, or fresh."""
    if not idx.reachable:
        # the snapshot's error already says "unreachable: ..." (inventory's wording): say it once
        why = idx.error or "unreachable"
        why = why if why.startswith("unreachable") else f"unreachable: {why}"
        return fail("CLUSTER_UNREACHABLE", f"{why} (last observed {shown:.0f}s ago)", True)
    if stale:
        return fail(
            "CLUSTER_UNREACHABLE", f"snapshot is stale: observed {shown:.0f}s ago (max {max_age:g}s)", True
        )
    return ok("CLUSTER_UNREACHABLE", f"reachable, observed {shown:.0f}s ago (max {max_age:g}s)")


#: The CLUSTER_NOT_ALLOWED check of a cluster the caller excluded for now.
EXCLUDED: Final = Check(
    code="CLUSTER_NOT_ALLOWED",
    ok=False,
    message="excluded by the caller for now (e.g. an attempt was lost there)",
    capacity_only=True,
)
