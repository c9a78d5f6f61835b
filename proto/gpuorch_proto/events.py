"""Commands and lifecycle events: one tagged union, one envelope shape (DESIGN §2).

Every message on `gpuorch.cmd.*` and `gpuorch.evt.>` is one of these Structs,
tagged by its `type` field. Event ids are deterministic (workload, type and a
discriminator such as the attempt), so a redelivered input republishes the same
`Nats-Msg-Id` and JetStream drops the duplicate.
"""

from __future__ import annotations

import hashlib
import re
from typing import Literal

import msgspec

from .resume import CheckpointRef
from .routing import RoutingDecision
from .workload import ParamValue, Workload

AttemptMode = Literal["fresh", "retry", "resume"]


class Base(msgspec.Struct, frozen=True, kw_only=True, tag_field="type"):
    schema_version: int = 1
    event_id: str = ""
    workload_id: str
    at: float  # unix seconds when the emitting service decided this


# ---- commands (published by other systems) -------------------------------------------


class Submit(Base, frozen=True, kw_only=True, tag="submit"):
    """A new workload. `workload_id` may be empty: the router derives it from the idempotency key."""

    workload_id: str = ""
    at: float = 0.0
    workload: Workload
    idempotency_key: str | None = None


class Cancel(Base, frozen=True, kw_only=True, tag="cancel"):
    at: float = 0.0
    reason: str = "requested"


# ---- validation outcome ---------------------------------------------------------------


class FieldError(msgspec.Struct, frozen=True, kw_only=True):
    path: str  # e.g. "spec.resources.gpus"
    message: str  # the rule broken, with the offending value


class Rejected(Base, frozen=True, kw_only=True, tag="rejected"):
    """An input that could not be decoded, failed validation, or can never run anywhere.

    Two kinds, told apart by what they are about:

    * **a workload** (`decision` set): the router's verdict on a workload's own accepted submit:
      no cluster could ever run it. Published on the workload's subject; terminal for it.
    * **a message** (`workload_id = message_ref(source_stream, source_sequence)`, `msg-...`): an
      input that was undecodable, broke the contract, came on the wrong subject, or that a
      handler gave up on (dead letter). It is the record of that one message, published on
      `evt.<msg-ref>.rejected`; whatever workload the message named is only reported in
      `claimed_workload_id` and is never touched by it.
    """

    reason: str
    errors: list[FieldError] = []
    source_subject: str | None = None
    source_sequence: int | None = None
    idempotency_key: str | None = None  # the input's Nats-Msg-Id: how a client finds its rejection
    decision: RoutingDecision | None = None  # when rejected because no cluster could ever run it
    source_stream: str | None = None  # with source_sequence: the message this record is about
    claimed_workload_id: str | None = None  # the workload the message named (informational only)


# ---- lifecycle -------------------------------------------------------------------------


class Submitted(Base, frozen=True, kw_only=True, tag="submitted"):
    workload: Workload
    idempotency_key: str | None = None
    source_sequence: int | None = None


class Routed(Base, frozen=True, kw_only=True, tag="routed"):
    decision: RoutingDecision
    attempt_number: int = 1  # which attempt this decision is for


class Unroutable(Base, frozen=True, kw_only=True, tag="unroutable"):
    """Waiting: blocked only by capacity now; re-evaluated when inventory changes."""

    decision: RoutingDecision
    attempt_number: int = 1


class RouteRequested(Base, frozen=True, kw_only=True, tag="route-requested"):
    """The dispatcher asks the router for a (new) destination, e.g. for a replacement attempt."""

    attempt_number: int
    exclude: list[str] = []  # clusters not to use (lost, failed there)
    reason: str = ""
    # the workload's latest valid checkpoint (None: none): the router prefers a cluster that can
    # resume it (gpuorch_proto.resume.can_resume, the rule the dispatcher's choose_mode applies)
    checkpoint: CheckpointRef | None = None


class AttemptEvent(Base, frozen=True, kw_only=True):
    attempt_id: str
    epoch: int
    cluster: str


class AttemptCreated(AttemptEvent, frozen=True, kw_only=True, tag="attempt-created"):
    attempt_number: int
    queue: str | None = None
    namespace: str = "gpuorch"
    job_name: str
    output_path: str
    checkpoint_path: str
    mode: AttemptMode = "fresh"
    resume_from: str | None = None
    mode_reason: str = ""


class Admitted(AttemptEvent, frozen=True, kw_only=True, tag="admitted"):
    pass


class Running(AttemptEvent, frozen=True, kw_only=True, tag="running"):
    workers_running: int = 1


class Unschedulable(AttemptEvent, frozen=True, kw_only=True, tag="unschedulable"):
    """The cluster's scheduler cannot place the attempt's pods now (its own message, verbatim).

    `permanent`: no node of the cluster could ever take them (every node refused by selector,
    affinity, taint or cordon, none for lack of free resources): the router promised a placement
    the cluster refuses. The dispatcher fails such an attempt after a grace period and re-routes
    it; a capacity-only message (``Insufficient nvidia.com/gpu``) is queueing, recorded so that
    status says why the attempt waits.
    """

    message: str
    permanent: bool = False


class Succeeded(AttemptEvent, frozen=True, kw_only=True, tag="succeeded"):
    output_path: str


class Failed(AttemptEvent, frozen=True, kw_only=True, tag="failed"):
    exit_code: int | None = None
    reason: str
    retryable: bool = True
    placement: bool = False  # failed because the cluster could not place its pods (not the code's fault)


class Lost(AttemptEvent, frozen=True, kw_only=True, tag="lost"):
    reason: str


class FenceRequested(AttemptEvent, frozen=True, kw_only=True, tag="fence-requested"):
    reason: str
    policy: Literal["strict", "fast"] = "strict"
    lease_expires_at: float = 0.0
    stopped: bool = False  # the cluster reported the attempt's pods ended (failed, finished): nothing of it runs


class Fenced(AttemptEvent, frozen=True, kw_only=True, tag="fenced"):
    """The epoch moved past `epoch`: the attempt's token is stale from now on."""

    new_epoch: int


class CancelConfirmed(AttemptEvent, frozen=True, kw_only=True, tag="cancel-confirmed"):
    how: Literal["deleted", "already-gone", "lease-expired"] = "deleted"


class ReplacementAllowed(AttemptEvent, frozen=True, kw_only=True, tag="replacement-allowed"):
    """The fencer's verdict: a replacement of this (fenced) attempt may start now (DESIGN §7.4).

    `how`: ``stopped`` (its pods had ended), ``fast`` (fast fencing: the epoch moved, it can never
    publish), ``confirmed`` (strict: its Job is deleted and its pods gone) or ``lease-expired``
    (strict: unreachable past its lease). The dispatcher asks for a replacement only after this.
    """

    how: Literal["stopped", "fast", "confirmed", "lease-expired"]
    reason: str = ""


class PromoteRequested(AttemptEvent, frozen=True, kw_only=True, tag="promote-requested"):
    output_path: str


class Promoted(AttemptEvent, frozen=True, kw_only=True, tag="promoted"):
    output_path: str
    result_path: str
    result_bytes: int = 0  # the published outputs' size, measured by the fencer (0: not measured)


class PromotionRejected(AttemptEvent, frozen=True, kw_only=True, tag="promotion-rejected"):
    current_epoch: int
    reason: str


class OrphanDeleted(AttemptEvent, frozen=True, kw_only=True, tag="orphan-deleted"):
    job_name: str
    reason: str


class ComputeStarted(AttemptEvent, frozen=True, kw_only=True, tag="compute-started"):
    """The running code reported its first useful step (DESIGN §6: "useful compute started").

    The program writes an attempt-scoped progress marker (``gpuorch.workloads.progress``); the
    dispatcher, which watches the attempt, publishes this once it sees it. `started_at` is the
    program's own clock at its first step, `step` the first step it completed (> 1 when resumed), so
    "running" -> `started_at` is the application's start-up and `started_at` -> finished its run.
    """

    started_at: float
    step: int = 0


class Completed(Base, frozen=True, kw_only=True, tag="completed"):
    attempt_id: str
    result_path: str


class CancelRequested(Base, frozen=True, kw_only=True, tag="cancel-requested"):
    reason: str = "requested"


class Cancelled(Base, frozen=True, kw_only=True, tag="cancelled"):
    reason: str = "requested"


class WorkloadFailed(Base, frozen=True, kw_only=True, tag="workload-failed"):
    """Terminal failure: retry budget spent or a permanent error."""

    reason: str
    attempts: int = 0


# ---- pipelines and queues (issue 13; docs/pipelines.md) --------------------------------
# Decided by the router's pipeline core (`gpuorch_router.pipeline`), before any routing.


class PipelineChild(msgspec.Struct, frozen=True, kw_only=True):
    """One child workload of a pipeline: a stage, or a trial of a sweep."""

    workload_id: str  # derived from the pipeline's id and the stage name / trial index
    stage: str  # the stage name; a sweep's trials are "t0000", "t0001", ...
    depends_on: list[str] = []  # stage names
    trial: int | None = None  # the trial's index in the sweep's order
    parameters: dict[str, ParamValue] = {}  # the trial's parameters


class PipelineExpanded(Base, frozen=True, kw_only=True, tag="pipeline-expanded"):
    """A workload with stages or a sweep became child workloads (each then has its `submitted`)."""

    children: list[PipelineChild]


class StageInput(msgspec.Struct, frozen=True, kw_only=True):
    """A dependency's promoted output, by version: its promoted attempt is the version."""

    stage: str
    workload_id: str
    attempt_id: str
    result_path: str
    store: str = ""
    size_bytes: int = 0  # the promoted result's size (`promoted.result_bytes`; 0: not measured)


class StageReady(Base, frozen=True, kw_only=True, tag="stage-ready"):
    """Every stage this one depends on is promoted; `inputs` are their results, by version."""

    pipeline: str
    stage: str
    inputs: list[StageInput] = []
    reason: str = ""


HoldScope = Literal["organisation", "queue", "pipeline"]
HoldKind = Literal["running", "gpus", "budget"]


class Hold(msgspec.Struct, frozen=True, kw_only=True):
    """One limit that holds a workload back: `used` of `limit` in its unit, and what it `needs`."""

    scope: HoldScope
    name: str  # the queue or pipeline ("" for the organisation)
    kind: HoldKind  # running workloads, GPUs, or GPU-hours of the budget's window
    used: float
    limit: float
    needs: float = 0.0
    message: str = ""  # e.g. "queue research at 16 of 16 GPUs"


class Held(Base, frozen=True, kw_only=True, tag="held"):
    """Not released yet: a concurrency limit or budget that is not capacity (`reason` says which)."""

    reason: str  # "held: queue research at 16 of 16 GPUs"
    holds: list[Hold] = []
    queue: str = ""
    pipeline: str | None = None


class Released(Base, frozen=True, kw_only=True, tag="released"):
    """Released to routing: from now on it counts against its limits until it finishes."""

    reason: str = ""
    queue: str = ""
    pipeline: str | None = None
    gpus: float = 0.0  # GPUs it holds while it runs (per worker x workers)


class StageBlocked(Base, frozen=True, kw_only=True, tag="stage-blocked"):
    """A stage will never run: a stage it depends on (`failed_stage`) ended without a result."""

    pipeline: str
    stage: str
    failed_stage: str
    reason: str


class PipelineFinished(Base, frozen=True, kw_only=True, tag="pipeline-finished"):
    """Every child of the pipeline is finished: its outcome, and each stage's final status."""

    outcome: Literal["completed", "failed", "cancelled"]
    reason: str = ""
    stages: dict[str, str] = {}  # stage -> completed / failed / cancelled / blocked


#: The `workload_id` (a subject token) of an `admission-term`: about no workload. No workload id
#: can be it: a submit's id ends in its key's digest (`workload_id_for`), a stage's contains `--`.
ADMISSION_REF = "admission"


class AdmissionTerm(Base, frozen=True, kw_only=True, tag="admission-term"):
    """A router took the admission lease (docs/operations.md *Admission leadership*): from this
    message on, only releases published expecting it as the last `admission-term` are stored
    (`Nats-Expected-Last-Subject-Sequence`), so an earlier leader's late ones are refused by the
    stream. `workload_id` is `ADMISSION_REF`; every workload's fold ignores it."""

    term: int
    instance: str


# ---- preemption of checkpoint-safe work (issue 13; docs/pipelines.md) -----------------
# Decided by the router's preemption core (`gpuorch_router.preempt.plan`).


class PreemptionWait(msgspec.Struct, frozen=True, kw_only=True):
    """One attempt whose GPUs a waiting workload waits for, and whether it is preempted for it."""

    workload_id: str
    attempt_id: str
    cluster: str
    priority: int
    gpus: float
    interruptible: bool  # declared preemptible, with a checkpoint
    preempt: bool = False  # preempted (or being preempted) for the waiting workload
    message: str = ""  # "waiting for GPUs held by X (priority 10, not interruptible: never preempted)"


class PreemptionPlanned(Base, frozen=True, kw_only=True, tag="preemption-planned"):
    """On the waiting workload's subject: whose GPUs it waits for, and which are preempted for it."""

    reason: str
    cluster: str | None = None  # where its victims run (None: nothing preempted)
    waits: list[PreemptionWait] = []
    victims: list[str] = []  # attempt ids


class PreemptionRequested(AttemptEvent, frozen=True, kw_only=True, tag="preemption-requested"):
    """On the victim's subject: its attempt gives its GPUs to `preemptor`. The dispatcher fences it;
    it resumes later from its checkpoint. Only ever for interruptible work of lower priority."""

    preemptor: str
    preemptor_priority: int
    priority: int  # the victim's
    reason: str


Command = Submit | Cancel

Event = (
    Submit
    | Cancel
    | Rejected
    | Submitted
    | Routed
    | Unroutable
    | RouteRequested
    | AttemptCreated
    | Admitted
    | Running
    | Succeeded
    | Failed
    | Lost
    | FenceRequested
    | Fenced
    | CancelConfirmed
    | PromoteRequested
    | Promoted
    | PromotionRejected
    | OrphanDeleted
    | Completed
    | CancelRequested
    | Cancelled
    | WorkloadFailed
    | Unschedulable
    | ReplacementAllowed
    | ComputeStarted
    | PipelineExpanded
    | StageReady
    | Held
    | Released
    | StageBlocked
    | PipelineFinished
    | PreemptionPlanned
    | PreemptionRequested
    | AdmissionTerm
)

EVENT_TYPES: tuple[type[Base], ...] = Event.__args__  # type: ignore[attr-defined, unused-ignore]

TERMINAL_TYPES = frozenset({"completed", "cancelled", "workload-failed", "rejected"})
#: A workload's terminal statuses (as `gpuorch.projection` names them): nothing happens after one.
TERMINAL_STATUSES = frozenset({"completed", "cancelled", "failed", "rejected"})


#: Between a pipeline's id and a stage's name in the stage's workload id, `<pipeline>--<stage>`
#: (the router's `pipeline.child_id`). Only the router's expansion of a pipeline makes such ids (it
#: refuses a submit whose id would contain it), so a workload whose id contains it is a stage.
STAGE_SEP = "--"


def is_stage_id(workload_id: str) -> bool:
    """Is this the id of a pipeline's stage (`STAGE_SEP`)? What the router may cancel (docs/security.md)."""
    return STAGE_SEP in workload_id


MESSAGE_REF_PREFIX = "msg-"
_REF_TOKEN = re.compile(r"^[a-z0-9][a-z0-9-]{0,62}$")


def message_ref(stream: str, seq: int) -> str:
    """The id of the record of one message: `msg-<stream>-<seq>` (a subject token).

    Rejections and dead letters of a message are published on `evt.<message_ref>.rejected`, so
    they are bound to the message (stream and sequence, which the publisher has from its PubAck),
    never to a workload the message names. E.g. `message_ref("GPUORCH_CMD", 17)` is
    `msg-gpuorch-cmd-17`.
    """
    token = f"{MESSAGE_REF_PREFIX}{re.sub(r'[^a-z0-9]+', '-', stream.lower()).strip('-')}-{seq}"
    if _REF_TOKEN.match(token):
        return token
    return f"{MESSAGE_REF_PREFIX}{hashlib.sha256(stream.encode()).hexdigest()[:16]}-{seq}"


def type_tag(cls_or_obj: type[Base] | Base) -> str:
    cls = cls_or_obj if isinstance(cls_or_obj, type) else type(cls_or_obj)
    tag = cls.__struct_config__.tag
    assert isinstance(tag, str)
    return tag


def event_id(workload_id: str, kind: str, discriminator: str | int = "") -> str:
    """Deterministic id: the same input and output kind always give the same id."""
    return f"{workload_id}.{kind}" + (f".{discriminator}" if discriminator != "" else "")
