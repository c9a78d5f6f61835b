"""The lifecycle timeline of every attempt, from its events (pure: no I/O, no clock).

Marks, in the order they happen (DESIGN §6, the seeds' "measure the complete path"):

| mark | from | meaning |
|---|---|---|
| `ready` | `submitted` (attempt 1), `route-requested` (a replacement) | the work could be routed |
| `routed` | `routed` for this attempt number | it left the orchestration queue |
| `created` | `attempt-created` | its Job exists on the destination |
| `admitted` | `admitted` | the cluster placed every pod (admission and scheduling done) |
| `running` | `running` | all workers run (staging init containers done) |
| `compute-started` | `compute-started` | the program reported its first useful step |
| `finished` | `succeeded` / `failed` | the Job ended |
| `promoted` | `promoted` | its outputs became the result |

and the gaps between them, each named for what delays work there:

| gap | from -> to | whose delay |
|---|---|---|
| `policy delay` | ready -> routed | gpuorch's routing (waiting for an eligible cluster) |
| `dispatch` | routed -> created | creating the Job |
| `admission` | created -> admitted | the destination's queue, quota and scheduler |
| `staging` | admitted -> running | input staging (init containers) and container start |
| `startup` | running -> compute-started | the program's own start-up (loading, building) |
| `run` | compute-started -> finished | useful computation |
| `output` | finished -> promoted | validating and publishing the outputs |

A mark that is missing (a program that reports nothing, an attempt that was lost) leaves its
gap out (a mark seen before the previous one, as observation lags, gives a gap of zero); the next gap then starts from the latest mark before it, so the gaps never overlap and
always add up to the attempt's span.

An attempt also ends in an `outcome`: `promoted`, `succeeded` (not promoted, e.g. still
promoting), `promotion-rejected`, `failed`, `lost`, `cancelled`, `fenced` or `live`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from gpuorch.projection import AttemptView, Projection, WorkloadView
from gpuorch_proto import Event
from gpuorch_proto import events as ev

MARKS = ("ready", "routed", "created", "admitted", "running", "compute-started", "finished", "promoted")
GAPS: tuple[tuple[str, str], ...] = (
    ("policy delay", "routed"),
    ("dispatch", "created"),
    ("admission", "admitted"),
    ("staging", "running"),
    ("startup", "compute-started"),
    ("run", "finished"),
    ("output", "promoted"),
)


@dataclass(frozen=True)
class Gap:
    name: str
    start: float
    end: float

    @property
    def seconds(self) -> float:
        return self.end - self.start


@dataclass
class AttemptTimeline:
    attempt_id: str
    number: int
    cluster: str
    outcome: str
    gpus: float  # GPUs the attempt holds while its pods are placed
    marks: dict[str, float]  # MARKS that happened, with their times
    gaps: list[Gap]
    held: tuple[float, float] | None  # (from, to) of GPU use: placed -> ended (or confirmed gone)
    gone_at: float | None = None  # cancel-confirmed / orphan-deleted: cleanup done
    fenced_at: float | None = None
    lost_at: float | None = None
    orphaned: bool = False  # its Job was collected as an orphan (`orphan-deleted`)

    def gpu_seconds(self) -> float:
        return self.gpus * (self.held[1] - self.held[0]) if self.held else 0.0


@dataclass
class WorkloadTimeline:
    workload_id: str
    status: str
    submitted: float | None
    ended: float | None  # completed / cancelled / workload-failed / rejected
    attempts: list[AttemptTimeline] = field(default_factory=list)

    @property
    def promoted(self) -> AttemptTimeline | None:
        return next((a for a in self.attempts if a.outcome == "promoted"), None)


def outcome(view: WorkloadView, a: AttemptView) -> str:
    if a.promoted:
        return "promoted"
    if a.promotion_rejected:
        return "promotion-rejected"
    if a.status == "failed":
        return "failed"
    if a.status == "succeeded":
        return "succeeded"
    if "lost" in a.times:
        return "lost"
    if a.cancel_confirmed is not None or a.orphan_deleted:
        return "cancelled" if view.cancel_requested else "fenced"
    if a.fenced:
        return "fenced"
    return "live"


def gpus_of(view: WorkloadView) -> float:
    if view.workload is None:
        return 0.0
    r = view.workload.spec.resources
    return float(r.gpus) * max(int(r.workers), 1)


def attempt_timeline(
    view: WorkloadView, a: AttemptView, ready: float | None, routed: float | None, now: float | None = None
) -> AttemptTimeline:
    t = a.times
    marks: dict[str, float] = {}
    for name, value in (
        ("ready", ready), ("routed", routed), ("created", t.get("created")), ("admitted", t.get("admitted")),
        ("running", t.get("running")), ("compute-started", t.get("compute-started")),
        ("finished", t.get("finished")), ("promoted", t.get("promoted")),
    ):  # fmt: skip
        if value is not None:
            marks[name] = value
    gaps: list[Gap] = []
    prev = marks.get("ready")
    for name, mark in GAPS:
        if mark not in marks:
            continue
        if prev is not None:
            # a mark observed a little late (the dispatcher sees `running` on its next look, the
            # program's own clock says when it started computing) gives a gap of zero, never < 0
            gaps.append(Gap(name, prev, max(prev, marks[mark])))
        prev = marks[mark] if prev is None else max(prev, marks[mark])
    gone = min([x for x in (t.get("cancel-confirmed"), t.get("orphan-deleted")) if x is not None], default=None)
    start = t.get("admitted", t.get("running"))
    end = t.get("finished")
    if end is None:
        end = gone if gone is not None else (now if a.live or a.status == "lost" else t.get("fenced", t.get("lost")))
    held = (start, end) if start is not None and end is not None and end >= start else None
    return AttemptTimeline(
        attempt_id=a.attempt_id, number=a.number, cluster=a.cluster, outcome=outcome(view, a),
        gpus=gpus_of(view), marks=marks, gaps=gaps, held=held, gone_at=gone, fenced_at=t.get("fenced"),
        lost_at=t.get("lost"), orphaned=a.orphan_deleted,
    )  # fmt: skip


def workload_timeline(view: WorkloadView, events: Iterable[Event], now: float | None = None) -> WorkloadTimeline:
    """The timeline of one workload from its view and its own events (in stream order)."""
    ready: dict[int, float] = {}
    routed: dict[int, float] = {}
    for e in events:
        if e.workload_id != view.workload_id:
            continue
        if isinstance(e, ev.Submitted):
            ready.setdefault(1, e.at)
        elif isinstance(e, ev.RouteRequested):
            ready.setdefault(e.attempt_number, e.at)
        elif isinstance(e, ev.Routed):
            routed.setdefault(e.attempt_number, e.at)
    end = None
    for kind in ("completed", "cancelled", "workload-failed", "rejected"):
        if kind in view.times and view.terminal:
            end = view.times[kind]
            break
    attempts = [
        attempt_timeline(view, a, ready.get(a.number), routed.get(a.number), now)
        for a in sorted(view.attempts.values(), key=lambda x: x.number)
    ]
    return WorkloadTimeline(view.workload_id, view.status, view.times.get("submitted"), end, attempts)


def timelines(events: Sequence[tuple[int, Event]], now: float | None = None) -> dict[str, WorkloadTimeline]:
    """Every workload's timeline from `(stream sequence, event)` pairs in stream order."""
    p = Projection()
    by_workload: dict[str, list[Event]] = {}
    for seq, e in events:
        p.apply(e, seq)
        by_workload.setdefault(e.workload_id, []).append(e)
    return {wid: workload_timeline(v, by_workload.get(wid, []), now) for wid, v in p.workloads.items()}


def as_dict(t: WorkloadTimeline) -> dict[str, object]:
    """JSON-able (for `get -o json`, the web view and the report)."""
    return {
        "workload_id": t.workload_id, "status": t.status, "submitted": t.submitted, "ended": t.ended,
        "attempts": [
            {"attempt_id": a.attempt_id, "number": a.number, "cluster": a.cluster, "outcome": a.outcome,
             "gpus": a.gpus, "marks": a.marks, "gpu_hours": a.gpu_seconds() / 3600.0,
             "gaps": [{"name": g.name, "start": g.start, "end": g.end, "seconds": g.seconds} for g in a.gaps]}
            for a in t.attempts
        ],
    }  # fmt: skip


def render(t: WorkloadTimeline, time_scale: float = 1.0) -> str:
    """The timeline as `gpuorch get` prints it: each attempt's marks (time since the submit) and
    its named gaps, in the clusters' own time (`time_scale` simulated seconds per real second)."""
    from gpuorch_proto.units import format_duration

    t0 = t.submitted if t.submitted is not None else min((a.marks.get("ready", 0.0) for a in t.attempts), default=0.0)
    lines = [f"timeline (simulated time, x{time_scale:g}; t=0 at the submit):"]
    if not t.attempts:
        lines.append("  no attempt yet")
    for a in t.attempts:
        lines.append(f"  {a.attempt_id} on {a.cluster}: {a.outcome}, {a.gpus:g} GPUs, {a.gpu_seconds() * time_scale / 3600:.2f} GPU-hours")
        lines.append("    " + "  ".join(f"{m} +{format_duration((a.marks[m] - t0) * time_scale)}" for m in MARKS if m in a.marks))
        lines.append("    " + "  ".join(f"{g.name} {format_duration(g.seconds * time_scale)}" for g in a.gaps))
    return "\n".join(lines)
