"""`gpuorch queues`: who is using each queue, what is held and why, and what each cluster's own
queues hold (issue 32). Pure: the router's state, the snapshots and `now` in; a report out.

Nothing here decides anything again. Every figure is read from the state the router keeps, or
computed by the function that makes that decision:

| figure | from |
|---|---|
| released work and what it holds against each limit | the gate's tally (`pipeline.Gate.tally`), against `AdmissionPolicy` limits |
| a budget's spend over its window | `pipeline.spent_gpu_hours` over the gate's GPU spans (`Gate.gpu_spans`) |
| held work and why | the gate's waiting work and the latest `held` of each (`Gate.held`: scope, name, kind of every hold) |
| fair-share standing | `fairshare.usage_of`, `fairshare.weighted_shares` |
| who is served next | `fairshare.FairOrder` with `pipeline.order_key`: the order `pipeline.admit` takes |
| oldest waiting | the gate's waiting candidates (`pipeline.Candidate.submitted_at`) |
| a cluster queue's pending demand and estimated wait | the inventory's latest snapshot, as published |

`fold` rebuilds the gate and the projection from the event log the way the router folds them, so
`gpuorch queues` shows what the router's admission sees (docs/pipelines.md, "Seeing the queues").
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from types import MappingProxyType
from typing import Any, Final

import msgspec

from gpuorch.projection import Projection
from gpuorch_proto import ClusterSnapshot, Event
from gpuorch_proto.policy import AdmissionPolicy, QueuePolicy
from gpuorch_proto.units import format_duration, parse_duration
from gpuorch_proto.workload import Limits

from . import fairshare
from . import pipeline as pl

#: How a hold's kind reads in the report.
KIND_WORDS: Final[Mapping[str, str]] = MappingProxyType(
    {"running": "running workloads", "gpus": "GPUs", "budget": "GPU-hour budget"}
)


class LimitUse(msgspec.Struct, frozen=True, kw_only=True):
    """One limit of a scope and what released, unfinished work holds of it."""

    scope: str  # organisation | queue
    name: str  # the queue ("" for the organisation)
    kind: str  # running (workloads) | gpus
    used: float
    limit: float | None = None  # None: no limit of this kind


class BudgetUse(msgspec.Struct, frozen=True, kw_only=True):
    """A queue's GPU-hour budget and what its work spent inside the window (GPU-hours of the
    workload's own clock, as the budget is written: docs/pipelines.md, "Budget")."""

    gpu_hours: float
    window: str
    spent: float
    left: float


class HeldReason(msgspec.Struct, frozen=True, kw_only=True):
    """Held workloads counted by one limit that holds them (a workload held by two counts twice)."""

    scope: str  # organisation | queue | pipeline
    name: str
    kind: str  # running | gpus | budget
    workloads: int
    reason: str  # "queue research: GPUs"


class Oldest(msgspec.Struct, frozen=True, kw_only=True):
    """The waiting (not released) workload submitted first."""

    workload_id: str
    submitted_at: float
    waiting_seconds: float  # the events' clock


class FairStanding(msgspec.Struct, frozen=True, kw_only=True):
    """An owner's standing in a queue with fair share."""

    weight: float
    share: float | None  # weighted dominant share over the window; None: capacity unknown (no snapshot)
    next: int | None = None  # 1 = the owner whose work admission takes first; None: nothing waiting


class OwnerUse(msgspec.Struct, frozen=True, kw_only=True):
    owner: str
    released: int  # released, unfinished: what counts against the limits
    running: int  # of those, running on a cluster now
    gpus: float  # GPUs the released work holds
    waiting: int  # not released yet (held or not decided yet)
    held: int
    held_reasons: list[HeldReason] = []
    oldest_waiting: Oldest | None = None
    fair_share: FairStanding | None = None  # None: the queue has no fair share


class QueueUse(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    in_policy: bool  # False: work names a queue the policy shown does not have
    priority: int = 0
    may_submit: list[str] = []  # the queue's owners ("*" = everyone)
    limits: list[LimitUse] = []
    budget: BudgetUse | None = None
    fair_share: bool = False
    released: int = 0
    running: int = 0
    gpus: float = 0.0
    waiting: int = 0
    held: int = 0
    held_reasons: list[HeldReason] = []
    oldest_waiting: Oldest | None = None
    owners: list[OwnerUse] = []


class ClusterQueue(msgspec.Struct, frozen=True, kw_only=True):
    """One queue of one cluster, as the inventory's latest snapshot publishes it."""

    cluster: str
    queue: str | None  # None: the snapshot publishes no queue
    reachable: bool
    snapshot_age_seconds: float
    pending_jobs: int = 0
    pending_gpus: int = 0
    estimated_wait_seconds: float | None = None  # the cluster's clock (simulated at time_scale > 1)
    time_scale: float = 1.0
    error: str | None = None


class QueuesReport(msgspec.Struct, frozen=True, kw_only=True):
    at: float
    policy: str  # where the admission policy came from
    time_scale: float
    organisation: list[LimitUse]
    queues: list[QueueUse]
    clusters: list[ClusterQueue]
    notes: list[str] = []  # what is missing (no snapshot yet, no policy)


def fold(events: Iterable[tuple[int, Event]]) -> tuple[pl.Gate, Projection]:
    """The gate and the projection from the log, folded as the router folds them (by stream sequence)."""
    gate, projection = pl.Gate(), Projection()
    for seq, e in events:
        projection.apply(e, seq)
        gate.apply(e, seq)
    return gate, projection


def _queue_name(policy: AdmissionPolicy, name: str | None) -> str:
    q = policy.queue(name)
    return q.name if q is not None else (name or policy.default_queue)


def _limits(scope: str, name: str, limits: Limits, tally: pl.Tally) -> list[LimitUse]:
    key = (scope, name)
    return [
        LimitUse(scope=scope, name=name, kind="running", used=tally.running.get(key, 0),
                 limit=limits.max_running),
        LimitUse(scope=scope, name=name, kind="gpus", used=tally.gpus.get(key, 0.0), limit=limits.max_gpus),
    ]  # fmt: skip


def _reasons(counts: Counter[tuple[str, str, str]]) -> list[HeldReason]:
    return [
        HeldReason(scope=s, name=n, kind=k, workloads=c, reason=f"{pl._label(s, n)}: {KIND_WORDS.get(k, k)}")
        for (s, n, k), c in sorted(counts.items(), key=lambda x: (-x[1], x[0]))
    ]


class _Counts:
    """One queue's or one owner's counts while the report is built."""

    def __init__(self) -> None:
        self.released = self.running = self.waiting = self.held = 0
        self.gpus = 0.0
        self.reasons: Counter[tuple[str, str, str]] = Counter()
        self.oldest: pl.Candidate | None = None

    def wait(self, c: pl.Candidate, holds: tuple[tuple[str, str, str], ...] | None) -> None:
        self.waiting += 1
        if holds is not None:
            self.held += 1
            self.reasons.update(holds)
        if self.oldest is None or (c.submitted_at, c.workload_id) < (self.oldest.submitted_at, self.oldest.workload_id):
            self.oldest = c

    def oldest_waiting(self, now: float) -> Oldest | None:
        c = self.oldest
        if c is None:
            return None
        return Oldest(workload_id=c.workload_id, submitted_at=c.submitted_at, waiting_seconds=max(0.0, now - c.submitted_at))


def queues_report(
    policy: AdmissionPolicy,
    gate: pl.Gate,
    projection: Projection,
    snapshots: Mapping[str, ClusterSnapshot],
    now: float,
    *,
    time_scale: float = 1.0,
    policy_source: str = "",
) -> QueuesReport:
    """Per queue and owner: limits and budgets with their use, released and running work, held work
    with its reasons counted, fair-share standing, the oldest waiting; per cluster queue the
    pending demand and estimated wait of the latest snapshot. `time_scale`: the registry's (budgets
    and fair share count the workloads' own clock, as the router does)."""
    notes: list[str] = []
    views = projection.workloads
    tally = gate.tally()

    def owner_of(wid: str) -> str:
        wl = gate.workloads.get(wid)
        v = views.get(wid)
        if wl is None and v is not None:
            wl = v.workload
        return wl.metadata.owner if wl is not None else "unknown"

    queues: dict[str, _Counts] = {q.name: _Counts() for q in policy.queues}
    owners: dict[tuple[str, str], _Counts] = {}

    def at(queue: str, owner: str) -> tuple[_Counts, _Counts]:
        return queues.setdefault(queue, _Counts()), owners.setdefault((queue, owner), _Counts())

    for r in gate.running.values():
        v = views.get(r.workload_id)
        for t in at(r.queue, owner_of(r.workload_id)):
            t.released += 1
            t.gpus += r.gpus
            t.running += v is not None and v.status == "running"
    for c in gate.waiting.values():
        held = gate.held.get(c.workload_id)
        for t in at(_queue_name(policy, c.queue), c.owner):
            t.wait(c, held[0] if held is not None else None)

    # fair share: the router's usage and shares; who is served next: the order admission takes
    usage = fairshare.usage_of(views, policy, snapshots.values(), projection.retired.values(), time_scale)
    known_capacity = usage is not None and any(x > 0 for _, x in usage.capacity.items())
    if usage is not None and not known_capacity:
        notes.append("no capacity snapshot yet: fair-share shares unknown")
    order = fairshare.FairOrder(policy, gate.waiting.values(), usage, now, key=lambda c: pl.order_key(policy, c))
    nxt: dict[tuple[str, str], int] = {}
    per_queue: Counter[str] = Counter()
    for c in order:
        k = (_queue_name(policy, c.queue), c.owner)
        if k not in nxt:
            per_queue[k[0]] += 1
            nxt[k] = per_queue[k[0]]
    shares: dict[str, dict[str, float]] = {}
    if usage is not None:
        for q in policy.queues:
            if q.fair_share is not None:
                shares[q.name] = fairshare.weighted_shares(usage, q, now)
                for o in shares[q.name]:
                    at(q.name, o)

    spans = gate.gpu_spans(policy, now, time_scale) if pl.has_budget(policy) else []
    out: list[QueueUse] = []
    named: dict[str, QueuePolicy] = {q.name: q for q in policy.queues}
    for name in [*named, *sorted(set(queues) - set(named))]:
        qp = named.get(name)
        t = queues[name]
        fs = qp.fair_share if qp is not None else None
        rows = []
        for (qn, o), ot in sorted(owners.items()):
            if qn != name:
                continue
            standing = None
            if fs is not None:
                share = shares.get(name, {}).get(o, 0.0) if known_capacity else None
                standing = FairStanding(weight=fairshare.weight(fs, o), share=share, next=nxt.get((name, o)))
            rows.append(OwnerUse(
                owner=o, released=ot.released, running=ot.running, gpus=ot.gpus, waiting=ot.waiting, held=ot.held,
                held_reasons=_reasons(ot.reasons), oldest_waiting=ot.oldest_waiting(now), fair_share=standing,
            ))  # fmt: skip
        budget = None
        if qp is not None and qp.budget is not None:
            b = qp.budget
            spent = pl.spent_gpu_hours(spans, name, parse_duration(b.window), now, time_scale)
            budget = BudgetUse(gpu_hours=b.gpu_hours, window=b.window, spent=spent, left=max(0.0, b.gpu_hours - spent))
        if qp is None:
            notes.append(f"queue {name}: work names it, the admission policy shown has no such queue")
        out.append(QueueUse(
            name=name, in_policy=qp is not None, priority=qp.priority if qp else 0,
            may_submit=list(qp.owners) if qp else [], limits=_limits("queue", name, qp.limits if qp else Limits(), tally),
            budget=budget, fair_share=fs is not None, released=t.released, running=t.running, gpus=t.gpus,
            waiting=t.waiting, held=t.held, held_reasons=_reasons(t.reasons), oldest_waiting=t.oldest_waiting(now),
            owners=rows,
        ))  # fmt: skip

    clusters: list[ClusterQueue] = []
    if not snapshots:
        notes.append("no capacity snapshot yet: no cluster queues (is the inventory service running?)")
    for cname, sn in sorted(snapshots.items()):
        common: dict[str, Any] = {
            "cluster": cname, "reachable": sn.reachable, "snapshot_age_seconds": sn.age(now),
            "time_scale": sn.time_scale, "error": sn.error,
        }  # fmt: skip
        if not sn.queues:
            clusters.append(ClusterQueue(queue=None, **common))
        for cq in sn.queues:
            clusters.append(ClusterQueue(
                queue=cq.name, pending_jobs=cq.pending_jobs, pending_gpus=cq.pending_gpus,
                estimated_wait_seconds=cq.estimated_wait_seconds, **common,
            ))  # fmt: skip
    return QueuesReport(
        at=now, policy=policy_source, time_scale=time_scale,
        organisation=_limits("organisation", "", policy.organisation, tally),
        queues=out, clusters=clusters, notes=notes,
    )  # fmt: skip


# ---- the table ----------------------------------------------------------------------------


def _n(x: float) -> str:
    return f"{round(x, 2):g}"


def _limit_text(limits: Iterable[LimitUse]) -> str:
    parts = []
    for u in limits:
        what = "running" if u.kind == "running" else "GPUs"
        parts.append(f"{what} {_n(u.used)} of {_n(u.limit)}" if u.limit is not None else f"{what} {_n(u.used)} (no limit)")
    return ", ".join(parts)


def _oldest_text(o: Oldest | None) -> str:
    return f"{o.workload_id} ({format_duration(o.waiting_seconds)})" if o is not None else "-"


def _table(rows: list[list[str]], head: list[str], indent: str = "") -> list[str]:
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
    return [indent + "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in [head, *rows]]


def render(report: QueuesReport) -> str:
    """The report as `gpuorch queues` prints it."""
    scale = f" (time scale {report.time_scale:g}: GPU-hours and waits on the clusters' clock)" if report.time_scale != 1 else ""
    lines = [f"admission policy: {report.policy or '-'}{scale}", f"organisation: {_limit_text(report.organisation)}"]
    for q in report.queues:
        lines.append("")
        extra = [f"priority {q.priority}", f"may submit: {', '.join(q.may_submit) or '-'}"]
        if q.fair_share:
            extra.append("fair share")
        if not q.in_policy:
            extra = ["NOT IN THE POLICY SHOWN"]
        lines.append(f"queue {q.name} ({'; '.join(extra)})")
        lines.append(f"  limits:  {_limit_text(q.limits)}")
        if q.budget is not None:
            b = q.budget
            lines.append(
                f"  budget:  {_n(b.spent)} of {_n(b.gpu_hours)} GPU-hours spent in the last {format_duration(parse_duration(b.window))}"
                f" ({_n(b.left)} left)"
            )
        lines.append(
            f"  work:    {q.released} released ({q.running} running, {_n(q.gpus)} GPUs), {q.waiting} waiting"
            f" ({q.held} held); oldest waiting: {_oldest_text(q.oldest_waiting)}"
        )
        for r in q.held_reasons:
            lines.append(f"  held:    {r.workloads} x {r.reason}")
        if q.owners:
            head = ["OWNER", "RELEASED", "RUNNING", "GPUS", "WAITING", "HELD", "HELD BY", "OLDEST WAITING"]
            if q.fair_share:
                head += ["WEIGHT", "SHARE", "NEXT"]
            rows = []
            for o in q.owners:
                row = [o.owner, str(o.released), str(o.running), _n(o.gpus), str(o.waiting), str(o.held),
                       "; ".join(f"{r.workloads} {r.reason}" for r in o.held_reasons) or "-", _oldest_text(o.oldest_waiting)]  # fmt: skip
                if o.fair_share is not None:
                    fs = o.fair_share
                    row += [_n(fs.weight), f"{fs.share:.4f}" if fs.share is not None else "unknown",
                            str(fs.next) if fs.next is not None else "-"]  # fmt: skip
                rows.append(row)
            lines += _table(rows, head, "  ")
    lines.append("")
    if report.clusters:
        lines.append("cluster queues (the inventory's latest snapshots):")
        rows = []
        for c in report.clusters:
            wait = "-" if c.estimated_wait_seconds is None else format_duration(c.estimated_wait_seconds)
            rows.append([c.cluster, c.queue or "(none published)", "yes" if c.reachable else f"NO: {c.error or 'unreachable'}",
                         format_duration(c.snapshot_age_seconds), str(c.pending_jobs), str(c.pending_gpus), wait])  # fmt: skip
        lines += _table(rows, ["CLUSTER", "QUEUE", "REACHABLE", "SNAPSHOT AGE", "PENDING JOBS", "PENDING GPUS", "EST. WAIT"], "  ")
    for n in report.notes:
        lines.append(f"note: {n}")
    return "\n".join(lines)
