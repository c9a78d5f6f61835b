"""The event log folded into per-workload state (pure: no I/O, no clock).

The event stream is the record: any workload's full history, and so its state,
is rebuilt by folding its events in stream order. Every service keeps one
`Projection` in memory (rebuilt at start-up by replaying the stream), the CLI
builds one to answer `get`/`list`, and the invariant checker reads the same fold.

`apply` is idempotent by stream sequence: replaying an event that was already
applied changes nothing, so a service may replay the log and then resume a
durable consumer that redelivers the tail.

Three modules: the views the fold fills (`gpuorch.views`), the fold itself (here: `Projection`,
`_fold`, `rejection_binds`, the snapshot's bytes), and what the services do to save memory
(`gpuorch.compaction`: compact views, and finished workloads retired to `Retired` records once
`settled`). The names of all three are importable from here.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

import msgspec

from gpuorch.compaction import (
    NO_TIMES,
    Attempts,
    Retired,
    RetiredAttempt,
    RetiredDoc,
    Times,
    compact_after,
    compact_attempt,
    compact_decision,
    compact_view,
    compact_workload,
    document_digest,
    new_compact_view,
    plain_containers,
    retired_doc,
    retired_record,
    same_document,
    settled,
    share_ids,
    share_retired_docs,
)
from gpuorch.views import LIVE_ATTEMPT, TERMINAL, AttemptView, WorkloadView, job_reason
from gpuorch_proto import Event, k8s
from gpuorch_proto import events as ev

__all__ = [
    "LIVE_ATTEMPT",
    "TERMINAL",
    "AttemptView",
    "Attempts",
    "Projection",
    "Retired",
    "RetiredAttempt",
    "RetiredDoc",
    "Times",
    "WorkloadView",
    "compact_attempt",
    "compact_decision",
    "compact_view",
    "compact_workload",
    "document_digest",
    "dump_projection",
    "load_projection",
    "rejection_binds",
    "retired_doc",
    "retired_record",
    "same_document",
    "settled",
]


@dataclass
class Projection:
    workloads: dict[str, WorkloadView] = field(default_factory=dict)
    last_seq: int = 0
    retire: bool = False  # keep settled finished workloads as `Retired` records (the services)
    retired: dict[str, Retired] = field(default_factory=dict)
    compact: bool = False  # live views in the services' compact form (see the module doc)

    @classmethod
    def of(cls, events: Iterable[tuple[int, Event]]) -> Projection:
        """The fold of `(stream sequence, event)` pairs."""
        p = cls()
        for seq, e in events:
            p.apply(e, seq)
        return p

    def get(self, workload_id: str) -> WorkloadView | None:
        """The workload's view (a retired one's rebuilt from its record: a copy, see the module doc)."""
        view = self.workloads.get(workload_id)
        if view is None and (r := self.retired.get(workload_id)) is not None:
            return r.view(workload_id)
        return view

    def __contains__(self, workload_id: str) -> bool:
        return workload_id in self.workloads or workload_id in self.retired

    def __len__(self) -> int:
        """Workloads known, retired included."""
        return len(self.workloads) + len(self.retired)

    def _view(self, workload_id: str) -> WorkloadView:
        """The live view to fold into: a retired one is taken back whole from its record."""
        view = self.workloads.get(workload_id)
        if view is None:
            r = self.retired.pop(workload_id, None)
            if r is not None:
                view = r.view(workload_id)
                if self.compact:
                    compact_view(view)
            elif self.compact:
                view = new_compact_view(workload_id)
            else:
                view = WorkloadView(workload_id)
            self.workloads[view.workload_id] = view
        return view

    def apply(self, evt: Event, seq: int) -> WorkloadView | None:
        """Fold one event; returns the workload's view (None for events about no workload).

        Idempotent by stream sequence *per workload*: an event at or below the last sequence
        applied to its workload changes nothing. A workload's events are in stream order, so a
        consumer may apply different workloads' events concurrently (out of global order).

        With `retire`, the view returned for the event that settles a workload is its whole view
        (what the caller decides on), though the projection keeps its `Retired` record from then on.
        """
        if seq:
            self.last_seq = max(self.last_seq, seq)
        if not evt.workload_id or isinstance(evt, ev.AdmissionTerm):  # (the admission leader's marker)
            return None
        wid = evt.workload_id
        if seq and (r := self.retired.get(wid)) is not None and seq <= r.last_seq:
            return r.view(wid)
        view = self.workloads.get(wid)
        if view is None:
            view = self._view(wid)
        elif seq and seq <= view.last_seq:
            return view
        if seq:
            view.last_seq = seq
        if isinstance(evt, ev.PipelineExpanded):
            for c in evt.children:  # each child knows where it came from (the router's own record)
                child = self._view(c.workload_id)
                child.pipeline, child.stage, child.parameters = evt.workload_id, c.stage, dict(c.parameters)
                if child.status == "submitted":
                    child.reason = "waiting for its dependencies" if c.depends_on else "waiting for the pipeline's admission"
                self._maybe_retire(child)
        if self.compact:
            share_ids(view, evt)
        _fold(view, evt)
        if self.compact:
            compact_after(view, evt)
        else:
            view.history.append((seq, ev.type_tag(evt), evt.at))
        self._maybe_retire(view)
        return view

    def compact_all(self) -> None:
        """Every live view in the compact form (a projection restored from a snapshot, whose
        views were decoded whole); sets `compact`."""
        self.compact = True
        for wid, v in self.workloads.items():
            v.workload_id = wid  # (the key's string, which the services' tables take from the events)
            compact_view(v)

    def _maybe_retire(self, view: WorkloadView) -> None:
        if self.retire and settled(view):
            del self.workloads[view.workload_id]
            self.retired[view.workload_id] = retired_record(view)

    def retire_settled(self) -> int:
        """Retire every settled view now (a projection folded without `retire`, or restored
        from an older snapshot); returns how many."""
        done = [v for v in self.workloads.values() if settled(v)]
        for v in done:
            del self.workloads[v.workload_id]
            self.retired[v.workload_id] = retired_record(v)
        return len(done)


_PROJECTION_ENCODER = msgspec.msgpack.Encoder(enc_hook=plain_containers)
_PROJECTION_DECODER = msgspec.msgpack.Decoder(Projection)


def dump_projection(p: Projection) -> bytes:
    """The projection as bytes (msgpack of every field), for a state snapshot
    (`gpuorch.runtime.snapshot`). `load_projection(dump_projection(p)) == p`."""
    return _PROJECTION_ENCODER.encode(p)


def load_projection(data: bytes) -> Projection:
    """A projection back from `dump_projection` (fields a newer release added take their defaults,
    unknown ones are skipped; raises `msgspec.DecodeError` / `ValidationError` on bad bytes).
    Equal retired documents are shared again, as the fold shares them."""
    p = _PROJECTION_DECODER.decode(data)
    share_retired_docs(p.retired)
    return p


def _current(view: WorkloadView, a: AttemptView) -> bool:
    """Is `a` the attempt the workload's status follows (its latest, while the workload goes on)?"""
    return not view.terminal and not view.cancel_requested and view.latest_attempt is a


def _attempt(view: WorkloadView, e: ev.AttemptEvent) -> AttemptView:
    a = view.attempts.get(e.attempt_id)
    if a is None:
        parsed = k8s.parse_attempt_id(e.attempt_id)
        number = parsed[1] if parsed is not None else 0
        a = AttemptView(e.attempt_id, number, e.epoch, e.cluster)
        if isinstance(view.attempts, Attempts):  # a compact view's
            a.times = NO_TIMES
        view.attempts[e.attempt_id] = a
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
            view.retired, view.digest = False, b""  # the whole document again, not a stand-in
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
            view.routed_attempts = {*view.routed_attempts, e.attempt_number}
            if not view.terminal and not view.cancel_requested:
                view.status = "routed"
                view.reason = e.decision.summary
        case ev.Unroutable():
            view.decision = e.decision
            if not view.terminal and not view.cancel_requested:
                view.status = "waiting"
                view.reason = e.decision.summary
        case ev.RouteRequested():
            view.route_requested = {*view.route_requested, e.attempt_number}
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
                view.reason = job_reason(a)
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
            a.placement_failed, a.retryable = e.placement, e.retryable
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
            a = _attempt(view, e)
            if "replacement-allowed" not in a.times:
                a.times["replacement-allowed"] = e.at
                a.replacement_reason = e.reason
        case ev.PreemptionRequested():
            # the router's plan gives this attempt's GPUs away: recorded on the attempt while it may
            # still run (the dispatcher's `reconcile` fences it), with the router's reason
            victim = view.attempts.get(e.attempt_id)
            if victim is not None and victim.live and victim.status != "lost" and "preemption-requested" not in victim.times:
                victim.times["preemption-requested"] = e.at
                victim.reason = e.reason
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
            if not view.cancel_requested:
                view.cancel_reason = e.reason
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
