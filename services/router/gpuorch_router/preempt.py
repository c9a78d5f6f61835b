"""Preemption only of checkpoint-safe work: who is preempted for whom (issue 13, item 6).

Pure: the waiting workload, its routing decision, the attempts holding GPUs and `now` in; a plan
with reasons out. No I/O, no clock (checked by tests/test_layering.py). See docs/pipelines.md,
"Preemption".

A higher-priority workload that waits for capacity may take the GPUs of lower-priority attempts
only if each of them is **interruptible** (`gpuorch_proto.workload.interruptible`): its workload
declares `spec.preemptible: true`, which validation accepts only with a checkpoint
(`spec.checkpoint.path`, DESIGN §7: interruptible work must declare checkpointing). Anything else is never preempted, whatever its priority. `plan` is
the one place that decides; it never names a victim that is not interruptible (a property test).

What happens to a victim is the existing machinery, nothing new: the router publishes
`preemption-requested` on the victim's subject; the dispatcher fences the attempt (`fence-requested`,
reason `preempted by <workload>`); the fencer moves the epoch by compare-and-set, deletes the Job
and confirms its pods gone (`cancel-confirmed`, then `replacement-allowed`); the dispatcher asks for
a replacement, which `choose_mode` makes a *resume* from the attempt's checkpoint. The router keeps
that replacement waiting while its preemptor has not been routed (`yields_to`), so the freed GPUs
go to the preemptor, not back to the victim. The victim is promoted once, like any workload.

Where: the clusters the waiting workload is eligible for except for free capacity (every failed
check of the verdict is capacity-only). On each, victims are taken lowest priority first, then the
most recently started (least work lost), until the cluster's free GPUs plus theirs cover what the
workload needs; the cluster needing the least (lowest top victim priority, fewest victims, fewest
GPUs) wins. GPUs already being freed for this workload count: it never preempts twice for one wait.
Counting is per cluster, not per node: a one-node gang may still wait for the node to drain
(its attempt is then queued at the destination, as any).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from gpuorch_proto import RoutingDecision, Workload, event_id
from gpuorch_proto import events as ev
from gpuorch_proto.inventory import ClusterSnapshot
from gpuorch_proto.workload import interruptible

#: How long a preempted workload's replacement waits for its preemptor to be routed before it is
#: routed anyway (the preemptor may have been placed elsewhere or cancelled in the meantime).
YIELD_FOR = 120.0

PREEMPTED_BY = "preempted by "  # the fence reason's prefix: the dispatcher's record of why


def gpus_of(wl: Workload) -> float:
    r = wl.spec.resources
    return r.gpus * r.workers


@dataclass(frozen=True)
class Holder:
    """A live attempt holding GPUs on a cluster, as the projection has it."""

    workload_id: str
    attempt_id: str
    epoch: int
    cluster: str
    gpus: float
    priority: int
    interruptible: bool
    started_at: float = 0.0
    preempted_for: str | None = None  # the workload it is already being preempted for


@dataclass(frozen=True)
class Plan:
    """Whose GPUs `workload_id` waits for and which of them are preempted for it (maybe none)."""

    workload_id: str
    priority: int
    cluster: str | None  # where the victims are (None: no preemption)
    victims: tuple[Holder, ...]
    waits: tuple[ev.PreemptionWait, ...]
    reason: str

    @property
    def signature(self) -> tuple[object, ...]:
        """What `explain` shows, without times: re-publish `preemption-planned` only on a change."""
        return signature(self.cluster, [h.attempt_id for h in self.victims], self.waits)

    def events(self, now: float, k: int = 1) -> list[ev.Base]:
        """`preemption-planned` (the k-th for this workload) and one `preemption-requested` per victim."""
        out: list[ev.Base] = [
            ev.PreemptionPlanned(
                event_id=event_id(self.workload_id, "preemption-planned", k),
                workload_id=self.workload_id,
                at=now,
                reason=self.reason,
                cluster=self.cluster,
                waits=list(self.waits),
                victims=[h.attempt_id for h in self.victims],
            )
        ]
        for h in self.victims:
            out.append(
                ev.PreemptionRequested(
                    event_id=f"{h.attempt_id}.preemption-requested",  # an attempt is preempted once
                    workload_id=h.workload_id,
                    at=now,
                    attempt_id=h.attempt_id,
                    epoch=h.epoch,
                    cluster=h.cluster,
                    preemptor=self.workload_id,
                    preemptor_priority=self.priority,
                    priority=h.priority,
                    reason=f"{PREEMPTED_BY}{self.workload_id} (priority {self.priority}) on {h.cluster}: "
                    f"interruptible, priority {h.priority}; it resumes from its checkpoint",
                )
            )
        return out


def signature(cluster: str | None, victims: Iterable[str], waits: Iterable[ev.PreemptionWait]) -> tuple[object, ...]:
    """A plan's signature: where, whom, and whose GPUs it waits for (each preempted or not), without
    times or messages. The same for a `Plan` (`Plan.signature`) and for the `preemption-planned` it
    published (`planned_signature`), so the router compares what it would publish now with what the
    log holds."""
    return (cluster, tuple(victims), tuple((w.attempt_id, w.preempt) for w in waits))


def planned_signature(e: ev.PreemptionPlanned) -> tuple[object, ...]:
    """The signature of a published plan (`signature`), as the router folds it from the log."""
    return signature(e.cluster, e.victims, e.waits)


def capacity_clusters(decision: RoutingDecision) -> list[str]:
    """Clusters a workload waiting in the router could use but for capacity now."""
    out: list[str] = []
    if decision.outcome != "waiting":
        return out
    for v in decision.verdicts:
        failed = [c for c in v.checks if not c.ok]
        if not v.eligible and failed and all(c.capacity_only for c in failed):
            out.append(v.cluster)
    return out


def _note(h: Holder, priority: int, victim: bool, planned: bool) -> str:
    head = f"waiting for GPUs held by {h.workload_id} (priority {h.priority}"
    if not h.interruptible:
        return head + ", not interruptible: never preempted)"
    if h.preempted_for is not None:
        return head + f", interruptible: being preempted for {h.preempted_for})"
    if victim:
        return head + ", interruptible: will be preempted)"
    if h.priority >= priority:
        return head + f", interruptible, but not below priority {priority}: not preempted)"
    if planned:
        return head + ", interruptible: not needed now)"
    return head + ", interruptible, but preempting it would not free enough)"


def _wait(h: Holder, priority: int, victim: bool, planned: bool) -> ev.PreemptionWait:
    return ev.PreemptionWait(
        workload_id=h.workload_id,
        attempt_id=h.attempt_id,
        cluster=h.cluster,
        priority=h.priority,
        gpus=h.gpus,
        interruptible=h.interruptible,
        preempt=victim or h.preempted_for is not None,
        message=_note(h, priority, victim, planned),
    )


def queued_on(view: object) -> str | None:
    """The cluster where a workload's current attempt is queued for capacity (its pods wait for
    free GPUs: `unschedulable`, not permanent), or None. (`view`: a `gpuorch.projection.WorkloadView`.)"""
    a = getattr(view, "latest_attempt", None)
    if a is None or a.fenced or a.status != "created" or not a.unschedulable:
        return None
    if "pending" not in a.times or "unschedulable" in a.times:  # capacity, not a placement that can never be
        return None
    return str(a.cluster)


def plan(
    workload_id: str,
    wl: Workload,
    where: Sequence[str],
    holders: Iterable[Holder],
    free_gpus: Mapping[str, float],
    in_flight: Sequence[str] = (),
) -> Plan:
    """Who is preempted for `workload_id`, a workload waiting for capacity on the clusters `where`
    (`capacity_clusters` of its waiting decision, or the one it is `queued_on`; see the module doc).

    `in_flight`: workloads already preempted for it whose GPUs may not show free yet (the
    snapshot lags the Job's deletion): while there are any, nothing more is preempted for it."""
    priority, need = wl.spec.priority, gpus_of(wl)
    where = list(where) if need > 0 else []
    on: dict[str, list[Holder]] = {c: [] for c in where}
    for h in holders:
        if h.cluster in on and h.workload_id != workload_id and h.gpus > 0:
            on[h.cluster].append(h)
    freeing = sorted(
        {*(h.workload_id for hs in on.values() for h in hs if h.preempted_for == workload_id), *in_flight}
    )
    best: tuple[tuple[int, int, float, str], str, list[Holder]] | None = None
    if not freeing:
        for cluster, hs in on.items():
            eligible = sorted(
                (h for h in hs if h.interruptible and h.priority < priority and h.preempted_for is None),
                key=lambda h: (h.priority, -h.started_at, -h.gpus, h.attempt_id),
            )
            have, taken = free_gpus.get(cluster, 0.0), []
            for h in eligible:
                if have >= need:
                    break
                taken.append(h)
                have += h.gpus
            if have >= need and taken:
                cost = (max(h.priority for h in taken), len(taken), sum(h.gpus for h in taken), cluster)
                if best is None or cost < best[0]:
                    best = (cost, cluster, taken)
    victims = tuple(best[2]) if best is not None else ()
    chosen = {h.attempt_id for h in victims}
    waits = tuple(
        _wait(h, priority, h.attempt_id in chosen, best is not None)
        for c in sorted(on)
        for h in sorted(on[c], key=lambda h: (-h.gpus, h.workload_id))
    )
    if best is not None:
        names = ", ".join(h.workload_id for h in victims)
        reason = f"preempting {names} on {best[1]} (interruptible, lower priority than {priority}): they resume from their checkpoints"
    elif freeing:
        reason = f"waiting for {', '.join(freeing)} to stop (preempted for it)"
    elif not where:
        reason = "no preemption: not waiting for capacity"
    else:
        reason = f"no preemption: no interruptible work below priority {priority} frees {need:g} GPUs on one cluster"
    return Plan(workload_id, priority, best[1] if best is not None else None, victims, waits, reason)


def holders_of(views: Iterable[object], preempted: Mapping[str, str]) -> list[Holder]:
    """Live, unfenced attempts holding GPUs, from the projection (`gpuorch.projection.WorkloadView`s);
    `preempted`: attempt id -> the workload it is already being preempted for."""
    out: list[Holder] = []
    for v in views:
        wl = getattr(v, "workload", None)
        if wl is None or getattr(v, "terminal", False):
            continue
        for a in getattr(v, "attempts", {}).values():
            if a.fenced or a.status not in ("admitted", "running"):  # placed: it holds its GPUs
                continue
            out.append(
                Holder(
                    workload_id=v.workload_id,  # type: ignore[attr-defined]
                    attempt_id=a.attempt_id,
                    epoch=a.epoch,
                    cluster=a.cluster,
                    gpus=gpus_of(wl),
                    priority=wl.spec.priority,
                    interruptible=interruptible(wl),
                    started_at=a.times.get("running", a.times.get("created", 0.0)),
                    preempted_for=preempted.get(a.attempt_id),
                )
            )
    return out


def free_gpus(snapshots: Iterable[ClusterSnapshot]) -> dict[str, float]:
    """Free GPUs per reachable cluster, as its last snapshot says."""
    return {s.cluster: float(sum(n.gpus_free for n in s.nodes if n.ready)) for s in snapshots if s.reachable}


def yields_to(
    preempted_for: str | None, preempted_at: float, preemptor_routed: bool, preemptor_done: bool, now: float
) -> str | None:
    """Must a preempted workload's replacement wait (the reason), or may it be routed (None)?

    It waits while its preemptor has not been routed, so the GPUs it gave up go to the preemptor;
    not once the preemptor is routed or finished, and not longer than `YIELD_FOR`."""
    if preempted_for is None or preemptor_routed or preemptor_done or now - preempted_at >= YIELD_FOR:
        return None
    return f"preempted by {preempted_for}: waiting until it is placed, then resumes from its checkpoint"


def check_victims(requests: Sequence[ev.PreemptionRequested], workloads: Mapping[str, Workload]) -> list[str]:
    """Every preemption named an interruptible victim of lower priority (the invariant's rule)."""
    bad = []
    for r in requests:
        wl = workloads.get(r.workload_id)
        if wl is None or not interruptible(wl):
            bad.append(
                f"{r.attempt_id} of {r.workload_id} preempted for {r.preemptor}, but it is not interruptible"
            )
        elif wl.spec.priority >= r.preemptor_priority:
            bad.append(
                f"{r.attempt_id} of {r.workload_id} (priority {wl.spec.priority}) preempted for lower or equal priority {r.preemptor_priority}"
            )
    return bad
