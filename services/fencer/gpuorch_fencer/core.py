"""The fencer's pure rules: epochs, promotion, cancellation confirmation, orphans (DESIGN §7).

Each function takes the workload's current `FenceRecord` (None = none yet) and
returns the record to write (None = no write) plus the events to publish after
the write succeeded. The shell writes with compare-and-set on the KV revision it
read; on a conflict it re-reads and calls the same function again.

Invariants these rules keep: the epoch only grows; exactly one attempt is ever
promoted; an attempt whose epoch is not the current one never is.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Container, Iterable
from dataclasses import dataclass
from dataclasses import replace as _dc_replace
from typing import Any, Literal

from msgspec.structs import replace

from gpuorch.projection import WorkloadView
from gpuorch_proto import FenceRecord, event_id
from gpuorch_proto import events as ev
from gpuorch_proto.k8s import LABEL_ATTEMPT, LABEL_EPOCH, LABEL_WORKLOAD, NAMESPACE
from gpuorch_proto.storage import Manifest, StoreError, attempt_prefix, manifest_key, parse_url
from gpuorch_proto.subjects import valid_token
from gpuorch_proto.units import parse_duration

# How long a managed Job without a known attempt may exist before it is collected (real seconds).
# A Job of a workload the event log knows may be an attempt whose `attempt-created` is still on
# its way (the dispatcher creates the Job, then publishes; a crash in between is re-driven by
# redelivery or takeover within tens of seconds): it gets the long grace. A Job of a workload the
# log has never seen cannot be: every Job gpuorch creates follows its workload's `routed` event.
# It only gets a short grace, so that a Job is never judged in the instant it appears.
ORPHAN_GRACE = 30.0
ORPHAN_GRACE_UNKNOWN = 5.0
TERMINAL = ev.TERMINAL_STATUSES

#: Event types the fencer decides nothing from (routing, the gate, placement and progress of
#: attempts, preemption plans): its durable and its replay leave them out (`READS`), so it reads
#: about half of a workload's events. What it reads: a workload's document and end, each
#: attempt's creation, success or failure, and everything about fencing and promotion.
IGNORES = frozenset({
    "released", "held", "routed", "unroutable", "route-requested", "unschedulable", "admitted",
    "running", "compute-started", "stage-ready", "stage-blocked", "pipeline-expanded",
    "preemption-planned", "preemption-requested", "admission-term",
})  # fmt: skip
#: The event types the fencer reads (every other one of the contract's; commands are not events).
READS = tuple(
    t for t in (ev.type_tag(c) for c in ev.EVENT_TYPES if c not in (ev.Submit, ev.Cancel)) if t not in IGNORES
)


ConfirmHow = Literal["deleted", "already-gone", "lease-expired"]


@dataclass(frozen=True)
class Publish:
    """What the shell writes once the compare-and-set made the attempt the promoted one: its
    manifest, create-only, at `result_path` (the store's own compare-and-set: never overwritten).
    `manifest` None: the record already names this attempt promoted and its outputs could not be
    read again (a redelivery): the shell only reads back the manifest the store holds."""

    result_path: str  # the manifest's URL
    manifest: Manifest | None


@dataclass(frozen=True)
class Decision:
    record: FenceRecord | None  # the record to write by compare-and-set; None = leave as is
    events: list[ev.Base]
    promote: Publish | None = None  # the manifest to publish after the write
    delete_job: bool = False  # the attempt's Job must be deleted and confirmed gone


def _base(e: ev.AttemptEvent, now: float) -> dict[str, Any]:
    return {"workload_id": e.workload_id, "at": now, "attempt_id": e.attempt_id, "epoch": e.epoch, "cluster": e.cluster}


def _fenced(e: ev.AttemptEvent, new_epoch: int, now: float) -> ev.Fenced:
    return ev.Fenced(event_id=f"{e.attempt_id}.fenced", new_epoch=new_epoch, **_base(e, now))


def on_attempt_created(rec: FenceRecord | None, e: ev.AttemptCreated, now: float) -> Decision:
    """Register the attempt as current for its epoch; an attempt born stale is fenced at once."""
    if rec is None:
        return Decision(FenceRecord(epoch=e.epoch, current_attempt=e.attempt_id), [])
    if e.epoch < rec.epoch:
        return Decision(None, [_fenced(e, rec.epoch, now)], delete_job=True)
    if e.epoch > rec.epoch:  # cannot happen with one dispatcher writer; accept the newer epoch
        return Decision(replace(rec, epoch=e.epoch, current_attempt=e.attempt_id), [])
    if rec.current_attempt is None:
        return Decision(replace(rec, current_attempt=e.attempt_id), [])
    if rec.current_attempt == e.attempt_id:
        return Decision(None, [])
    # a second attempt at the same epoch: the first one stays current, this one is stale
    return Decision(None, [_fenced(e, rec.epoch, now)], delete_job=True)


ReplacementHow = Literal["stopped", "fast", "confirmed", "lease-expired"]


def replacement_allowed(e: ev.AttemptEvent, now: float, how: ReplacementHow) -> ev.ReplacementAllowed:
    why = {
        "stopped": "its pods had ended; the epoch moved, so it can never publish",
        "fast": "fast fencing: the epoch moved, so it can never publish (its pods may still run)",
        "confirmed": "strict fencing: its Job is deleted and its pods are gone",
        "lease-expired": "strict fencing: its cluster stayed unreachable past the attempt's lease",
    }[how]
    return ev.ReplacementAllowed(event_id=f"{e.attempt_id}.replacement-allowed", how=how, reason=why, **_base(e, now))


def replacement_now(e: ev.FenceRequested) -> ReplacementHow | None:
    """May a replacement start as soon as the epoch moved? (None: strict, wait for confirmation.)

    The one place this is decided (DESIGN §1: the fencer decides when a replacement may start):
    an attempt whose pods had ended cannot run on; under `fast` a running one may, but it can
    never publish; under `strict` the replacement waits for `cancel-confirmed` (see `confirm`).
    """
    if e.stopped:
        return "stopped"
    if e.policy == "fast":
        return "fast"
    return None


def on_fence_requested(rec: FenceRecord | None, e: ev.FenceRequested, now: float) -> Decision:
    """Bump the epoch past the attempt's, so its token is stale from now on; then pursue cancellation.

    With the bump, the verdict on its replacement when that needs no confirmation
    (`replacement_now`); otherwise `confirm` gives it once the attempt is confirmed gone.
    """
    current = rec or FenceRecord(epoch=e.epoch, current_attempt=e.attempt_id)
    if current.promoted_attempt == e.attempt_id:
        # already published: nothing to fence, only clean up its Job
        return Decision(None, [], delete_job=True)
    how = replacement_now(e)
    allowed = [replacement_allowed(e, now, how)] if how is not None else []
    if current.epoch > e.epoch:
        return Decision(None, [_fenced(e, current.epoch, now), *allowed], delete_job=True)
    new = replace(current, epoch=e.epoch + 1, current_attempt=None)
    return Decision(new, [_fenced(e, new.epoch, now), *allowed], delete_job=True)


def confirm(e: ev.AttemptEvent, now: float, how: ConfirmHow, *, replacement_pending: bool) -> list[ev.Base]:
    """The attempt is confirmed gone (or presumed, past its lease): `cancel-confirmed`, and the
    strict verdict on its replacement if none was given at the bump."""
    out: list[ev.Base] = [cancel_confirmed(e, now, how)]
    if replacement_pending:
        out.append(replacement_allowed(e, now, "lease-expired" if how == "lease-expired" else "confirmed"))
    return out


@dataclass(frozen=True)
class AttemptFacts:
    """What the fencer's own records say about an attempt (its projection of the log)."""

    created_epoch: int | None  # the epoch of its `attempt-created` (None: never created by the dispatcher)
    succeeded: bool  # its `succeeded` is on record


def attempt_facts(view: WorkloadView | None, attempt_id: str) -> AttemptFacts:
    """What the fencer's projection of the log says about an attempt (`AttemptFacts`)."""
    a = view.attempts.get(attempt_id) if view is not None else None
    return AttemptFacts(
        created_epoch=a.epoch if a is not None and "created" in a.times else None,
        succeeded=a is not None and a.status == "succeeded",
    )


def attempt_url(store_url: str, workload_id: str, attempt_id: str) -> str | None:
    """`<store URL>/<workload>/attempts/<attempt>`: the only prefix an attempt may publish from
    (`gpuorch_proto.storage.attempt_prefix` in the store's root URL). None when an id is not a
    single safe token (no `/`, `.` or `..` can come through) or the store's URL is not one."""
    try:
        return parse_url(store_url).join(attempt_prefix(workload_id, attempt_id))
    except StoreError:
        return None


def result_url(store_url: str, workload_id: str) -> str | None:
    """`<store URL>/<workload>/result/manifest.json`: where the workload's result manifest goes."""
    try:
        return parse_url(store_url).join(manifest_key(workload_id))
    except StoreError:
        return None


def promotion_problem(e: ev.PromoteRequested, facts: AttemptFacts, expected_url: str | None) -> str | None:
    """Why this promotion may not happen on the fencer's own records (None: it may): the attempt
    was created by the dispatcher at this epoch, it succeeded, and the output path it names is
    exactly its attempt prefix, built from the registry's store URL and the ids.

    `facts.created_epoch is None` is not a problem of its own: the dispatcher may publish an
    attempt's `attempt-created` after its first lifecycle events (a crash between creating the
    Job and publishing is re-driven), so the shell defers the promotion until it is on record."""
    if facts.created_epoch is None:
        return f"attempt {e.attempt_id} has no attempt-created on record: the dispatcher never created it"
    if facts.created_epoch != e.epoch:
        return f"attempt {e.attempt_id} was created at epoch {facts.created_epoch}, not {e.epoch}"
    if not facts.succeeded:
        return f"attempt {e.attempt_id} has not succeeded"
    if expected_url is None:
        return "the workload's output store is not in the registry: no attempt prefix to publish from"
    if e.output_path.rstrip("/") != expected_url:
        return f"output path {e.output_path[:200]!r} is not the attempt's prefix {expected_url!r}"
    return None


def promotion_source(
    view: WorkloadView | None,
    e: ev.PromoteRequested,
    store_url: Callable[[str], str],
    known_stores: Container[str] | None,
) -> tuple[str | None, str | None]:
    """(store, problem) of a promotion, from the fencer's own records only: the attempt as its
    projection has it (`attempt_facts`), the workload's output store, which must be one of
    `known_stores` (the registry's; None: no registry to check against), and the attempt's prefix
    in it (`attempt_url` of the store's root URL, `store_url`: never a path the event carries;
    the event's `output_path` must be exactly that prefix, `promotion_problem`)."""
    facts = attempt_facts(view, e.attempt_id)
    store = view.workload.spec.output.store if view is not None and view.workload is not None else None
    if store is None or (known_stores is not None and store not in known_stores):
        return None, promotion_problem(e, facts, None)
    return store, promotion_problem(e, facts, attempt_url(store_url(store), e.workload_id, e.attempt_id))


PromotionGate = Literal["promote", "defer", "refuse"]


def promotion_gate(view: WorkloadView | None, e: ev.PromoteRequested, store: str | None, problem: str | None) -> PromotionGate:
    """What becomes of a promotion request before the compare-and-set, given its `promotion_source`:
    `promote` when nothing on the fencer's records is against it; `defer` while its attempt's
    `attempt-created` is not on record yet (the dispatcher may publish it after the attempt's first
    events: `deferred_promotion` brings the request back once it is); else `refuse` it as a
    message, with the problem (the attempt is left untouched)."""
    if problem is None and store is not None:
        return "promote"
    if problem is not None and attempt_facts(view, e.attempt_id).created_epoch is None:
        return "defer"
    return "refuse"


def registered(rec: FenceRecord | None, e: ev.PromoteRequested, created_epoch: int | None) -> FenceRecord | None:
    """The fence record a promotion is decided on. The bucket's; or, when it has none but the
    attempt's `attempt-created` is on the fencer's record (`created_epoch`: its registration by
    `on_attempt_created` is still on its way, redelivered after a crash), the record that
    registration writes (`on_attempt_created` on no record: its epoch, it current). Without
    either, none (`on_promote_requested` refuses, with the reason)."""
    if rec is None and created_epoch is not None:
        return FenceRecord(epoch=created_epoch, current_attempt=e.attempt_id)
    return rec


def decide_promotion(
    rec: FenceRecord | None,
    e: ev.PromoteRequested,
    now: float,
    result_path: str,
    outputs: Manifest | str,
    *,
    created_epoch: int | None,
) -> Decision:
    """The compare-and-set's decision on a promotion: `on_promote_requested` on the record as
    `registered` makes it (the shell and the simulation call this, once per read of the record)."""
    return on_promote_requested(registered(rec, e, created_epoch), e, now, result_path, outputs)


def _promoted(e: ev.PromoteRequested, now: float, result_path: str, manifest: Manifest | None) -> ev.Promoted:
    size = manifest.total_bytes if manifest is not None else 0
    return ev.Promoted(event_id=f"{e.attempt_id}.promoted", output_path=e.output_path, result_path=result_path, result_bytes=size, **_base(e, now))


def promotion_rejected(e: ev.PromoteRequested, current_epoch: int, reason: str, now: float) -> ev.PromotionRejected:
    return ev.PromotionRejected(event_id=f"{e.attempt_id}.promotion-rejected", current_epoch=current_epoch, reason=reason, **_base(e, now))


def on_promote_requested(rec: FenceRecord | None, e: ev.PromoteRequested, now: float, result_path: str, outputs: Manifest | str) -> Decision:
    """Promotion is the only way to publish: current epoch, first and only promotion, by CAS.

    The shell calls it only once `promotion_problem` found nothing against the request on the
    fencer's own records, with what the store holds of the attempt: `outputs` is its manifest
    (`gpuorch_proto.storage.manifest_for`) or why there is none (an upload cut in the middle, an
    object deleted since). `result_path` is the manifest's URL. A workload without a fence record
    is refused with a reason (the fencer registers every attempt it sees created, so there is no
    record only if none was).

    The current attempt whose outputs are not all there can never publish: it is fenced (the
    epoch moves past it, as `on_fence_requested` would for a stopped attempt) with the reason,
    and its replacement may start at once (its pods have ended)."""
    if rec is None:
        reason = f"workload {e.workload_id} has no fence record: no attempt of it was ever registered"
        return Decision(None, [promotion_rejected(e, 0, reason, now)], delete_job=True)
    if rec.promoted_attempt == e.attempt_id:  # a retried promotion: the same result again
        path = rec.result_path or result_path
        manifest = outputs if isinstance(outputs, Manifest) else None
        return Decision(None, [_promoted(e, now, path, manifest)], promote=Publish(path, manifest))
    if rec.promoted_attempt is not None:
        reason = f"workload already promoted attempt {rec.promoted_attempt}"
        return Decision(None, [promotion_rejected(e, rec.epoch, reason, now)], delete_job=True)
    if e.epoch != rec.epoch:
        reason = f"stale epoch {e.epoch}: the workload's epoch is {rec.epoch}"
        return Decision(None, [promotion_rejected(e, rec.epoch, reason, now)], delete_job=True)
    if rec.current_attempt not in (None, e.attempt_id):
        reason = f"attempt {rec.current_attempt} is current at epoch {rec.epoch}"
        return Decision(None, [promotion_rejected(e, rec.epoch, reason, now)], delete_job=True)
    if isinstance(outputs, str):
        new = replace(rec, epoch=rec.epoch + 1, current_attempt=None)
        events: list[ev.Base] = [
            promotion_rejected(e, new.epoch, f"outputs not published: {outputs}", now),
            _fenced(e, new.epoch, now),
            replacement_allowed(e, now, "stopped"),
        ]
        return Decision(new, events, delete_job=True)
    new = replace(rec, current_attempt=e.attempt_id, promoted_attempt=e.attempt_id, promoted_epoch=e.epoch, result_path=result_path)
    return Decision(new, [_promoted(e, now, result_path, outputs)], promote=Publish(result_path, outputs))


def manifest_conflict(e: ev.PromoteRequested, current_epoch: int, reason: str, now: float) -> ev.PromotionRejected:
    """The record made this attempt the promoted one, but the store holds another manifest at
    the result's key (written by hand, or by something that bypassed the fence): it is never
    overwritten, and the conflict is recorded with its reason for the operators. The record keeps
    the promotion (no other attempt may ever publish); the workload gets no `promoted`."""
    return promotion_rejected(e, current_epoch, f"result manifest conflict: {reason}", now)


def confirm_how(*, deleted: bool, pods_left: int, job_exists: bool | None, cluster_known: bool = True) -> ConfirmHow | None:
    """What a pursuit's calls mean: is the Job confirmed gone, and how? Only once no pod of it is
    left (terminating pods may still write) and the Job itself is not found: `deleted` when a
    delete of ours was accepted, `already-gone` when it was never there for us. None: not yet
    (pods left, the Job still there, or not read: `job_exists` None). A Job on a cluster the
    fencer has no client for (not in its kubeconfig) is `already-gone`: nothing of gpuorch's
    can run there."""
    if not cluster_known:
        return "already-gone"
    if pods_left or job_exists is None or job_exists:
        return None
    return "deleted" if deleted else "already-gone"


def cancel_confirmed(e: ev.AttemptEvent, now: float, how: ConfirmHow) -> ev.CancelConfirmed:
    return ev.CancelConfirmed(event_id=f"{e.attempt_id}.cancel-confirmed", how=how, **_base(e, now))


def orphan_workload_id(label: str, cluster: str, namespace: str, job_name: str) -> str:
    """The workload id to record an orphan under: its label if that is a valid id, else one derived
    from where the Job was (events go on a subject per workload id)."""
    if valid_token(label):
        return label
    return "orphan-" + hashlib.sha256(f"{cluster}/{namespace}/{job_name}".encode()).hexdigest()[:16]


def orphan_deleted(workload_id: str, attempt_id: str, epoch: int, cluster: str, job_name: str, reason: str, now: float) -> ev.OrphanDeleted:
    return ev.OrphanDeleted(
        event_id=event_id(workload_id, "orphan-deleted", attempt_id),
        workload_id=workload_id, at=now, attempt_id=attempt_id, epoch=epoch, cluster=cluster, job_name=job_name, reason=reason,
    )


def is_orphan(rec: FenceRecord | None, attempt_id: str, epoch: int, known_attempt: bool) -> str | None:
    """Why a Job found on a cluster must go (None = it may stay)."""
    if not known_attempt:
        return f"unknown attempt {attempt_id}"
    if rec is None:
        return None
    if rec.promoted_attempt is not None and rec.promoted_attempt != attempt_id:
        return f"workload already promoted {rec.promoted_attempt}"
    if epoch < rec.epoch:
        return f"stale epoch {epoch} < {rec.epoch}"
    return None


def orphan_reason(
    rec: FenceRecord | None,
    attempt_id: str,
    epoch: int,
    *,
    known_attempt: bool,
    known_workload: bool,
    age: float,
    workload_status: str | None = None,
    grace: float = ORPHAN_GRACE,
    grace_unknown: float = ORPHAN_GRACE_UNKNOWN,
) -> str | None:
    """Why a managed Job found on a cluster must go now (None = leave it, for now or for good).

    `known_attempt`: our projection has its attempt; `known_workload`: the event log has its
    workload; `age`: real seconds since the Job was created; `workload_status`: the workload's
    status in our projection (a terminal workload keeps no Job).
    """
    if not known_attempt:
        if age < (grace if known_workload else grace_unknown):
            return None  # its attempt-created may still be on its way
        if not known_workload:
            return f"unknown workload: no event of it in the log (attempt {attempt_id}, {age:.0f}s old)"
        return f"unknown attempt {attempt_id} ({age:.0f}s old)"
    reason = is_orphan(rec, attempt_id, epoch, True)
    if reason is None and workload_status in TERMINAL:
        return f"workload {workload_status}"  # its result (if any) is published: the Job has no use left
    return reason


def lease_expires_at(fence_requested_at: float, lease: str, time_scale: float) -> float:
    """When an unreachable attempt fenced at `fence_requested_at` may be presumed dead (as the
    dispatcher computes it for `fence-requested`; `lease` is simulated time)."""
    return fence_requested_at + parse_duration(lease) / max(time_scale, 1e-9)


def cancellation_due(lease_expires_at: float, now: float) -> bool:
    """Unreachable cluster: presume the attempt dead only once its lease has run out."""
    return now >= lease_expires_at


# --- cancellation pursuit: the rules the shell (and the simulation) follow ----------------------


@dataclass
class Pursuit:
    """A Job to delete and confirm gone. The shell performs the calls; these rules say what the
    answers mean (`pursuit_confirmed`, `pursuit_unreachable`) and what to pursue after a restart
    (`pursuits_to_resume`)."""

    workload_id: str
    attempt_id: str
    epoch: int
    cluster: str
    namespace: str
    job_name: str
    lease_expires_at: float
    orphan_reason: str | None = None  # set: confirm with orphan-deleted instead of cancel-confirmed
    deleted: bool = False  # a delete of an existing Job was accepted (pods may still be terminating)
    replacement_pending: bool = False  # strict: the verdict on its replacement waits for this confirmation

    def attempt_event(self) -> ev.AttemptEvent:
        """The attempt's identity as the event builders take it."""
        return ev.Admitted(workload_id=self.workload_id, at=0.0, attempt_id=self.attempt_id, epoch=self.epoch, cluster=self.cluster)


def pursuit_of(
    view: WorkloadView | None,
    e: ev.AttemptEvent,
    lease_expires_at: float,
    orphan_reason: str | None = None,
    *,
    replacement_pending: bool = False,
) -> Pursuit:
    """The pursuit of an attempt's Job: its name and namespace as the fencer's projection has
    them (an attempt it has not seen created: the attempt id, in gpuorch's namespace)."""
    a = view.attempts.get(e.attempt_id) if view is not None else None
    job = a.job_name if a is not None and a.job_name else e.attempt_id
    ns = a.namespace if a is not None else NAMESPACE
    return Pursuit(e.workload_id, e.attempt_id, e.epoch, e.cluster, ns, job, lease_expires_at, orphan_reason, replacement_pending=replacement_pending)


REJECTED_ORPHAN = "promotion rejected: "  # an orphan's reason, after a refused promotion


def pursuit_after(view: WorkloadView | None, e: ev.AttemptEvent, d: Decision, now: float) -> Pursuit | None:
    """What a decision that deletes the attempt's Job (`Decision.delete_job`) pursues (None:
    nothing). A fence: the attempt, presumed dead at the lease `fence-requested` names, its strict
    verdict pending unless the bump gave it (`replacement_now`). A refused promotion: the Job as an
    orphan, with the refusal's reasons. An attempt born stale: its Job, at once."""
    if not d.delete_job:
        return None
    if isinstance(e, ev.FenceRequested):
        allowed = any(isinstance(x, ev.ReplacementAllowed) for x in d.events)
        return pursuit_of(view, e, e.lease_expires_at, replacement_pending=not allowed)
    if isinstance(e, ev.PromoteRequested):
        why = "; ".join(x.reason for x in d.events if isinstance(x, ev.PromotionRejected))
        return pursuit_of(view, e, now, REJECTED_ORPHAN + why)
    return pursuit_of(view, e, now)


LEASE_EXPIRED_ORPHAN = "lease expired while unreachable"


def pursuit_confirmed(p: Pursuit, how: ConfirmHow, now: float) -> list[ev.Base]:
    """The Job is confirmed gone (`how`): what goes on record. An orphan's end is `orphan-deleted`
    (and, if a strict replacement waited for it, its `replacement-allowed`); an attempt's is its
    cancellation confirmation (`confirm`)."""
    if p.orphan_reason:
        out: list[ev.Base] = [orphan_deleted(p.workload_id, p.attempt_id, p.epoch, p.cluster, p.job_name, p.orphan_reason, now)]
        if p.replacement_pending:
            out.append(replacement_allowed(p.attempt_event(), now, "confirmed"))
        return out
    return confirm(p.attempt_event(), now, how, replacement_pending=p.replacement_pending)


def pursuit_unreachable(p: Pursuit, cancel_confirmed: bool | None, now: float) -> tuple[list[ev.Base], Pursuit]:
    """The cluster did not answer. Once the attempt's lease has expired (and nothing confirmed its
    end yet) it is presumed dead: `lease-expired` goes on record, and the Job is still pursued as
    an orphan, deleted when the cluster answers again. `cancel_confirmed`: None when the attempt
    is not (or no longer) in the log's view, else whether its end is on record."""
    if p.orphan_reason is not None or cancel_confirmed is None or cancel_confirmed or not cancellation_due(p.lease_expires_at, now):
        return [], p
    expired = confirm(p.attempt_event(), now, "lease-expired", replacement_pending=p.replacement_pending)
    return list(expired), _dc_replace(p, orphan_reason=LEASE_EXPIRED_ORPHAN, replacement_pending=False)


def pursuits_to_resume(workloads: Iterable[WorkloadView], time_scale: float) -> list[Pursuit]:
    """After a restart: every fenced (or promotion-rejected) attempt not yet confirmed gone is
    pursued again. The lease runs from the fence request, as the dispatcher computed it, never
    from the restart."""
    out: list[Pursuit] = []
    for view in workloads:
        for a in view.attempts.values():
            if a.gone:
                continue
            if a.promotion_rejected:
                pending = a.fenced and "replacement-allowed" not in a.times
                out.append(Pursuit(view.workload_id, a.attempt_id, a.epoch, a.cluster, a.namespace, a.job_name, 0.0,
                                   "promotion rejected", replacement_pending=pending))
            elif a.fenced:
                asked = a.times.get("fence-requested", a.times.get("fenced", 0.0))
                lease = lease_expires_at(asked, view.workload.spec.lease, time_scale) if view.workload else asked
                out.append(Pursuit(view.workload_id, a.attempt_id, a.epoch, a.cluster, a.namespace, a.job_name, lease,
                                   replacement_pending="replacement-allowed" not in a.times))
    return out


@dataclass(frozen=True)
class FoundJob:
    """A managed Job seen on a cluster, read from its labels (the orphan collector's input)."""

    workload_id: str
    attempt_id: str
    epoch: int


def found_job(labels: dict[str, str], cluster: str, namespace: str, job_name: str) -> FoundJob:
    """Which workload, attempt and epoch a managed Job claims (unparseable epoch: 0, the stalest)."""
    aid = labels.get(LABEL_ATTEMPT) or job_name
    wid = orphan_workload_id(labels.get(LABEL_WORKLOAD, ""), cluster, namespace, job_name)
    try:
        epoch = int(labels.get(LABEL_EPOCH) or 0)
    except ValueError:
        epoch = 0
    return FoundJob(wid, aid, epoch)


def deferred_promotion(view: WorkloadView | None, e: ev.AttemptCreated) -> ev.PromoteRequested | None:
    """The promotion request of this attempt that arrived before its `attempt-created` (the fencer
    promotes only attempts whose creation is on record: it waited; now it is due), else None."""
    a = view.attempts.get(e.attempt_id) if view is not None else None
    if a is None or "promote-requested" not in a.times or a.promoted or a.promotion_rejected:
        return None
    return ev.PromoteRequested(
        event_id=f"{e.attempt_id}.promote-requested", workload_id=e.workload_id, at=a.times["promote-requested"],
        attempt_id=e.attempt_id, epoch=e.epoch, cluster=e.cluster, output_path=e.output_path,
    )  # fmt: skip
