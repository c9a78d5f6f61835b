"""A workload's state as the fold leaves it: `WorkloadView` and its `AttemptView`s (pure data).

`gpuorch.projection` folds the event log into these; `gpuorch.compaction` holds the services'
compact form of the same views (packed times, shared parts, retired records) and installs, on
import, the descriptors that read a compact view's packed fields as plain values. Readers import
the views from `gpuorch.projection`, which re-exports them.
"""

from __future__ import annotations

from collections.abc import MutableMapping
from dataclasses import dataclass, field
from typing import Any

from gpuorch_proto import RoutingDecision, Workload, k8s
from gpuorch_proto import events as ev

LIVE_ATTEMPT = frozenset({"created", "admitted", "running", "lost"})
TERMINAL = ev.TERMINAL_STATUSES


@dataclass(slots=True)
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
    reason: str = ""  # why it failed or was lost; while live, why it is preempted (`preemption-requested`)
    fenced: bool = False  # its epoch is stale
    cancel_confirmed: str | None = None  # how ("deleted", "already-gone", "lease-expired")
    promoted: bool = False
    promotion_rejected: bool = False
    orphan_deleted: bool = False
    unschedulable: str = ""  # the scheduler's message while its pods cannot be placed ("" once placed)
    placement_failed: bool = False  # failed because the cluster could not place its pods
    times: MutableMapping[str, float] = field(default_factory=dict)  # a dict; compact: `Times`
    retryable: bool = True  # its `failed` said the workload may try again (`gpuorch_dispatcher.core.workload_failure`)
    replacement_reason: str = ""  # the fencer's verdict that its replacement may start (`replacement-allowed`)

    @property
    def live(self) -> bool:
        """May still be running somewhere: not known to be stopped."""
        return self.status in LIVE_ATTEMPT and self.cancel_confirmed is None

    @property
    def gone(self) -> bool:
        return self.cancel_confirmed is not None or self.orphan_deleted


@dataclass(slots=True)
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
    attempts: MutableMapping[str, AttemptView] = field(default_factory=dict)  # a dict; compact: `Attempts`
    epoch: int = 1
    promoted_attempt: str | None = None
    result_path: str | None = None
    cancel_requested: bool = False
    cancel_reason: str = ""  # the first `cancel-requested`'s reason (its fences and its end say it)
    idempotency_key: str | None = None
    times: MutableMapping[str, float] = field(default_factory=dict)  # a dict; compact: `Times`
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
    # rebuilt from a `Retired` record: `workload` is a stand-in (`RetiredDoc.workload`), `digest`
    # the whole document's (`same_document`)
    retired: bool = False
    digest: bytes = b""

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


def job_reason(a: AttemptView) -> str:
    """A workload's reason once its attempt's Job is created (the fold's, and a compact view's derived one)."""
    return f"Job {a.job_name} created on {a.cluster}; waiting for the cluster to place its pods"
