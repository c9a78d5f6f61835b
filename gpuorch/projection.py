"""The event log folded into per-workload state (pure: no I/O, no clock).

The event stream is the record: any workload's full history, and so its state,
is rebuilt by folding its events in stream order. Every service keeps one
`Projection` in memory (rebuilt at start-up by replaying the stream), the CLI
builds one to answer `get`/`list`, and the invariant checker reads the same fold.

`apply` is idempotent by stream sequence: replaying an event that was already
applied changes nothing, so a service may replay the log and then resume a
durable consumer that redelivers the tail.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import msgspec

from gpuorch_proto import Event, RoutingDecision, Workload, k8s
from gpuorch_proto import events as ev

LIVE_ATTEMPT = frozenset({"created", "admitted", "running", "lost"})
TERMINAL = ev.TERMINAL_STATUSES


@dataclass
class AttemptView:
    attempt_id: str
    number: int
    epoch: int
    cluster: str
    job_name: str = ""
    namespace: str = k8s.NAMESPACE
    queue: str | None = None
    output_path: str = ""
    checkpoint_path: str = ""
    mode: str = "fresh"
    mode_reason: str = ""
    resume_from: str | None = None
    status: str = "created"  # created admitted running succeeded failed lost
    exit_code: int | None = None
    reason: str = ""
    fenced: bool = False  # its epoch is stale
    cancel_confirmed: str | None = None  # how ("deleted", "already-gone", "lease-expired")
    promoted: bool = False
    promotion_rejected: bool = False
    orphan_deleted: bool = False
    unschedulable: str = ""  # the scheduler's message while its pods cannot be placed ("" once placed)
    placement_failed: bool = False  # failed because the cluster could not place its pods
    times: dict[str, float] = field(default_factory=dict)

    @property
    def live(self) -> bool:
        """May still be running somewhere: not known to be stopped."""
        return self.status in LIVE_ATTEMPT and self.cancel_confirmed is None

    @property
    def gone(self) -> bool:
        return self.cancel_confirmed is not None or self.orphan_deleted


@dataclass
class WorkloadView:
    workload_id: str
    workload: Workload | None = None
    # submitted waiting routed dispatched admitted running promoting lost retrying
    # | completed cancelled failed rejected (terminal)
    status: str = "submitted"
    reason: str = ""
    decision: RoutingDecision | None = None
    routed_attempts: set[int] = field(default_factory=set)
    route_requested: set[int] = field(default_factory=set)
    attempts: dict[str, AttemptView] = field(default_factory=dict)
    epoch: int = 1
    promoted_attempt: str | None = None
    result_path: str | None = None
    cancel_requested: bool = False
    idempotency_key: str | None = None
    times: dict[str, float] = field(default_factory=dict)
    preemption: ev.PreemptionPlanned | None = None  # the latest: whose GPUs it waits for (explain)
    # pipelines (docs/pipelines.md): a child knows its pipeline, stage, parameters and inputs;
    # a pipeline its children (in declared order) and, once every child finished, its outcome
    pipeline: str | None = None
    stage: str | None = None
    parameters: dict[str, Any] = field(default_factory=dict)
    stage_inputs: list[ev.StageInput] = field(default_factory=list)
    children: list[ev.PipelineChild] = field(default_factory=list)
    held: ev.Held | None = None  # the latest `held` (explain shows its numbers)
    history: list[tuple[int, str, float]] = field(default_factory=list)  # (seq, type, at)
    last_seq: int = 0  # the stream sequence of the last event folded in

    @property
    def terminal(self) -> bool:
        return self.status in TERMINAL

    @property
    def live_attempts(self) -> list[AttemptView]:
        return [a for a in self.attempts.values() if a.live]

    @property
    def latest_attempt(self) -> AttemptView | None:
        if not self.attempts:
            return None
        return max(self.attempts.values(), key=lambda a: a.number)

    @property
    def next_attempt_number(self) -> int:
        return max([0, *self.routed_attempts, *(a.number for a in self.attempts.values())]) + 1


@dataclass
class Projection:
    workloads: dict[str, WorkloadView] = field(default_factory=dict)
    last_seq: int = 0

    @classmethod
    def of(cls, events: Iterable[tuple[int, Event]]) -> Projection:
        """The fold of `(stream sequence, event)` pairs."""
        p = cls()
        for seq, e in events:
            p.apply(e, seq)
        return p

    def get(self, workload_id: str) -> WorkloadView | None:
        return self.workloads.get(workload_id)

    def apply(self, evt: Event, seq: int) -> WorkloadView | None:
        """Fold one event; returns the workload's view (None for events about no workload).

        Idempotent by stream sequence *per workload*: an event at or below the last sequence
        applied to its workload changes nothing. A workload's events are in stream order, so a
        consumer may apply different workloads' events concurrently (out of global order).
        """
        if seq:
            self.last_seq = max(self.last_seq, seq)
        if not evt.workload_id:
            return None
        view = self.workloads.get(evt.workload_id)
        if view is None:
            view = self.workloads[evt.workload_id] = WorkloadView(evt.workload_id)
        elif seq and seq <= view.last_seq:
            return view
        if seq:
            view.last_seq = seq
        if isinstance(evt, ev.PipelineExpanded):
            for c in evt.children:  # each child knows where it came from (the router's own record)
                child = self.workloads.get(c.workload_id)
                if child is None:
                    child = self.workloads[c.workload_id] = WorkloadView(c.workload_id)
                child.pipeline, child.stage, child.parameters = evt.workload_id, c.stage, dict(c.parameters)
                if child.status == "submitted":
                    child.reason = "waiting for its dependencies" if c.depends_on else "waiting for the pipeline's admission"
        _fold(view, evt)
        view.history.append((seq, ev.type_tag(evt), evt.at))
        return view


_PROJECTION_ENCODER = msgspec.msgpack.Encoder()
_PROJECTION_DECODER = msgspec.msgpack.Decoder(Projection)


def dump_projection(p: Projection) -> bytes:
    """The projection as bytes (msgpack of every field), for a state snapshot
    (`gpuorch.runtime.snapshot`). `load_projection(dump_projection(p)) == p`."""
    return _PROJECTION_ENCODER.encode(p)


def load_projection(data: bytes) -> Projection:
    """A projection back from `dump_projection` (fields a newer release added take their defaults,
    unknown ones are skipped; raises `msgspec.DecodeError` / `ValidationError` on bad bytes)."""
    return _PROJECTION_DECODER.decode(data)


def _current(view: WorkloadView, a: AttemptView) -> bool:
    """Is `a` the attempt the workload's status follows (its latest, while the workload goes on)?"""
    return not view.terminal and not view.cancel_requested and view.latest_attempt is a


def _attempt(view: WorkloadView, e: ev.AttemptEvent) -> AttemptView:
    a = view.attempts.get(e.attempt_id)
    if a is None:
        parsed = k8s.parse_attempt_id(e.attempt_id)
        number = parsed[1] if parsed is not None else 0
        a = view.attempts[e.attempt_id] = AttemptView(e.attempt_id, number, e.epoch, e.cluster)
    return a


def rejection_binds(view: WorkloadView, e: ev.Rejected) -> bool:
    """Does this `rejected` event decide the state of the workload it is filed under?

    Terminal for an accepted workload only when it is the router's verdict on that workload's
    own submit (`decision` set: no cluster could ever run it). Any other rejection is about a
    message, not a workload: the shell files those under the message (`msg-<stream>-<seq>`), but
    one that names an accepted workload (an older release's record of a bad message, a dead
    letter) never changes that workload. A rejection under an id that has no accepted submit is
    that id's whole record (status `rejected`), until a submit is accepted under it.
    """
    return e.decision is not None or view.workload is None


def _fold(view: WorkloadView, e: Event) -> None:
    kind = ev.type_tag(e)
    if isinstance(e, ev.Rejected) and not rejection_binds(view, e):
        return  # stays in the history (Projection.apply), changes nothing of the workload
    view.times.setdefault(kind, e.at)
    match e:
        case ev.Submitted():
            if view.workload is None and view.status == "rejected" and view.decision is None:
                # the id's earlier record was a refused message (e.g. a cancel that came first),
                # not a verdict on this workload: the accepted submit starts its life
                view.status = "submitted"
                view.times.pop("rejected", None)
            view.workload = e.workload
            view.idempotency_key = e.idempotency_key
            if view.status == "submitted" and view.pipeline is None:
                view.reason = "submitted; waiting for a routing decision"
        case ev.Rejected():
            view.status = "rejected"
            view.reason = e.reason + (
                ": " + "; ".join(f"{x.path}: {x.message}" for x in e.errors) if e.errors else ""
            )
            if e.decision is not None:
                view.decision = e.decision
        case ev.Routed():
            view.decision = e.decision
            view.routed_attempts.add(e.attempt_number)
            if not view.terminal and not view.cancel_requested:
                view.status = "routed"
                view.reason = e.decision.summary
        case ev.Unroutable():
            view.decision = e.decision
            if not view.terminal and not view.cancel_requested:
                view.status = "waiting"
                view.reason = e.decision.summary
        case ev.RouteRequested():
            view.route_requested.add(e.attempt_number)
        case ev.AttemptCreated():
            a = _attempt(view, e)
            a.number, a.epoch, a.cluster = e.attempt_number, e.epoch, e.cluster
            a.job_name, a.namespace, a.queue = e.job_name, e.namespace, e.queue
            a.output_path, a.checkpoint_path = e.output_path, e.checkpoint_path
            a.mode, a.mode_reason, a.resume_from = e.mode, e.mode_reason, e.resume_from
            a.times["created"] = e.at
            if not view.terminal and not view.cancel_requested:
                # the Job exists; nothing runs until the cluster admits it and places its pods
                view.status = "dispatched"
                view.reason = f"Job {e.job_name} created on {e.cluster}; waiting for the cluster to place its pods"
        case ev.Unschedulable():
            a = _attempt(view, e)
            a.unschedulable = e.message
            a.times.setdefault("unschedulable" if e.permanent else "pending", e.at)
            if _current(view, a) and a.status == "created":
                what = "cannot be placed" if e.permanent else "queued"
                view.reason = f"attempt {a.attempt_id} {what} on {a.cluster}: {e.message}"
        case ev.Admitted():
            a = _attempt(view, e)
            a.times.setdefault("admitted", e.at)
            a.unschedulable = ""
            if a.status == "created":
                a.status = "admitted"
            if _current(view, a) and not a.fenced and view.status in ("dispatched", "lost"):
                view.status = "admitted"
                view.reason = f"attempt {a.attempt_id} admitted on {a.cluster}: every pod placed, starting"
        case ev.Running():
            a = _attempt(view, e)
            a.times.setdefault("running", e.at)
            a.unschedulable = ""
            if a.status in ("created", "admitted", "lost"):
                a.status = "running"
            if _current(view, a) and not a.fenced and view.status in ("dispatched", "admitted", "lost"):
                view.status = "running"
                view.reason = f"attempt {a.attempt_id} running on {a.cluster}"
        case ev.Succeeded():
            a = _attempt(view, e)
            a.status, a.output_path = "succeeded", e.output_path
            if _current(view, a) and not a.fenced:
                view.status = "promoting"
                view.reason = f"attempt {a.attempt_id} succeeded on {a.cluster}; promoting its outputs"
            a.times.setdefault("finished", e.at)
        case ev.Failed():
            a = _attempt(view, e)
            a.status, a.exit_code, a.reason = "failed", e.exit_code, e.reason
            a.placement_failed = e.placement
            if _current(view, a):
                view.status = "retrying"
                view.reason = f"attempt {a.attempt_id} failed on {a.cluster}: {e.reason}"
            a.times.setdefault("finished", e.at)
        case ev.Lost():
            a = _attempt(view, e)
            if a.status in LIVE_ATTEMPT:
                a.status = "lost"
                a.reason = e.reason
                a.times.setdefault("lost", e.at)
                if not view.terminal:
                    view.status = "lost"
                    view.reason = f"attempt {a.attempt_id} lost on {a.cluster}: {e.reason}"
        case ev.FenceRequested():
            _attempt(view, e).times.setdefault("fence-requested", e.at)
        case ev.Fenced():
            a = _attempt(view, e)
            a.fenced = True
            a.times.setdefault("fenced", e.at)
            view.epoch = max(view.epoch, e.new_epoch)
        case ev.ReplacementAllowed():
            _attempt(view, e).times.setdefault("replacement-allowed", e.at)
        case ev.ComputeStarted():
            # the program's own clock at its first step (the event's `at` is when it was seen)
            _attempt(view, e).times.setdefault("compute-started", e.started_at or e.at)
        case ev.CancelConfirmed():
            a = _attempt(view, e)
            a.cancel_confirmed = e.how
            a.times.setdefault("cancel-confirmed", e.at)
        case ev.PromoteRequested():
            _attempt(view, e).times.setdefault("promote-requested", e.at)
        case ev.Promoted():
            a = _attempt(view, e)
            a.promoted = True
            a.times.setdefault("promoted", e.at)
            view.promoted_attempt = e.attempt_id
            view.result_path = e.result_path
        case ev.PromotionRejected():
            a = _attempt(view, e)
            a.promotion_rejected = True
            a.times.setdefault("promotion-rejected", e.at)
        case ev.OrphanDeleted():
            a = _attempt(view, e)
            a.orphan_deleted = True
            a.times.setdefault("orphan-deleted", e.at)
        case ev.Completed():
            view.status = "completed"
            view.result_path = e.result_path
            view.reason = f"attempt {e.attempt_id} promoted to {e.result_path}"
        case ev.CancelRequested():
            view.cancel_requested = True
            if not view.terminal:
                view.reason = f"cancelling: {e.reason}"
        case ev.Cancelled():
            view.status = "cancelled"
            view.reason = e.reason
        case ev.WorkloadFailed():
            view.status = "failed"
            view.reason = e.reason
        case ev.PipelineExpanded():
            view.children = list(e.children)
            if not view.terminal:
                view.status = "running"
                view.reason = f"pipeline of {len(e.children)} stages"
        case ev.StageReady():
            view.stage_inputs = list(e.inputs)
            view.pipeline, view.stage = view.pipeline or e.pipeline, view.stage or e.stage
            if view.status == "submitted":
                view.status, view.reason = "ready", e.reason
        case ev.Held():
            view.held = e
            if view.status in ("submitted", "ready", "held"):
                view.status, view.reason = "held", e.reason
        case ev.Released():
            if view.status in ("submitted", "ready", "held"):
                view.status, view.reason = "released", e.reason
        case ev.StageBlocked():
            if not view.terminal:
                view.status, view.reason = "blocked", e.reason
        case ev.PipelineFinished():
            if not view.terminal:
                view.status = e.outcome if e.outcome != "completed" else "completed"
            view.reason = e.reason
        case ev.PreemptionPlanned():
            view.preemption = e
        case _:
            pass
