"""Queues as policy: the admission configuration (issue 13; docs/pipelines.md).

What a platform team writes once (YAML, strict like a workload document): the organisation's
limits and its queues. A queue here is a *policy* queue, named by a workload's
`spec.policy_queue`: priority between queues, who may submit to it, its own concurrency limits and
a GPU-hour budget over a sliding window. It is not `spec.queue` (`<agent>/<queue>`), which pins a
cluster and that cluster's admission queue.

`gpuorch_router.pipeline.admission` reads it; `gpuorch_proto.validate.validate_policy` checks it;
`gpuorch_proto.codec.load_policy_yaml` / `policy_from_obj` read a document (strict, every field path).
"""

from __future__ import annotations

import msgspec

from .events import FieldError
from .workload import Limits, Requirements, Workload

DEFAULT_QUEUE = "default"


class Budget(msgspec.Struct, frozen=True, kw_only=True):
    """A cost cap: at most `gpu_hours` GPU-hours of the queue's work inside any `window`."""

    gpu_hours: float
    window: str = "7d"


class FairShare(msgspec.Struct, frozen=True, kw_only=True):
    """Owners sharing a queue get its resources in proportion to their weights (issue 13).

    Measured across every cluster together, by dominant-resource share over `window`: GPU, CPU
    and memory seconds used (finished and running work), each divided by all clusters' capacity
    times the window, the largest of them divided by the owner's weight. Running work counts at
    least `quantum` (or its expected run time) so one round does not give one owner every slot.
    `gpuorch_router.fairshare` computes it.
    """

    weights: dict[str, float] = {}  # owner -> weight; an owner not named gets `default_weight`
    default_weight: float = 1.0
    window: str = "7d"
    quantum: str = "1h"  # the least a started workload is charged before its real use is known


class QueuePolicy(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    priority: int = 0  # between queues: higher first
    owners: list[str] = msgspec.field(default_factory=lambda: ["*"])  # who may submit; "*" = everyone
    limits: Limits = Limits()
    budget: Budget | None = None
    fair_share: FairShare | None = None  # None: first come, first served within a priority
    # node eligibility its workloads may ask for (issue 11; `node_constraint_errors`): the taint keys
    # they may tolerate and the label keys their node_selector may name; "*" = any (the default,
    # as for `owners`); [] = none
    allowed_taints: list[str] = msgspec.field(default_factory=lambda: ["*"])
    allowed_node_labels: list[str] = msgspec.field(default_factory=lambda: ["*"])


class AdmissionPolicy(msgspec.Struct, frozen=True, kw_only=True):
    """The whole admission configuration: organisation limits and the queues."""

    organisation: Limits = Limits()
    queues: list[QueuePolicy] = msgspec.field(default_factory=lambda: [QueuePolicy(name=DEFAULT_QUEUE)])
    default_queue: str = DEFAULT_QUEUE  # for workloads that name no spec.policy_queue

    def queue(self, name: str | None) -> QueuePolicy | None:
        wanted = name or self.default_queue
        for q in self.queues:
            if q.name == wanted:
                return q
        return None


class PolicyError(ValueError):
    def __init__(self, errors: list[FieldError]) -> None:
        self.errors = errors
        super().__init__("invalid admission policy: " + "; ".join(f"{e.path}: {e.message}" for e in errors))


def node_constraint_errors(policy: AdmissionPolicy, wl: Workload) -> list[FieldError]:
    """Tolerations and node selectors the workload's queue does not allow, each with its path.

    `spec.requirements` and every stage's own `requirements` are read against the queue named
    by `spec.policy_queue` (its `allowed_taints`, `allowed_node_labels`). A toleration names the
    taint key it tolerates; one without a key (``operator: Exists``) tolerates every taint, so only
    a queue that allows "*" accepts it. An unknown queue gives no errors here (the submit is
    refused for that, with the queue names). The router refuses such a submit (docs/security.md).
    """
    q = policy.queue(wl.spec.policy_queue)
    if q is None:
        return []
    errors: list[FieldError] = []
    _requirements(q, wl.spec.requirements, "spec.requirements", errors)
    for i, st in enumerate(wl.spec.stages):
        if st.requirements is not None:
            _requirements(q, st.requirements, f"spec.stages[{i}].requirements", errors)
    return errors


def _requirements(q: QueuePolicy, r: Requirements, at: str, errors: list[FieldError]) -> None:
    taints, labels = set(q.allowed_taints), set(q.allowed_node_labels)
    if "*" not in taints:
        allowed = ", ".join(f'"{k}"' for k in q.allowed_taints) or "none"
        for i, t in enumerate(r.tolerations):
            if t.key is None:
                errors.append(FieldError(
                    path=f"{at}.tolerations[{i}]",
                    message=f"queue {q.name} does not allow a toleration of every taint (no key); it allows taint keys: {allowed}",
                ))
            elif t.key not in taints:
                errors.append(FieldError(
                    path=f"{at}.tolerations[{i}]",
                    message=f'queue {q.name} does not allow toleration for taint key "{t.key}" (it allows: {allowed})',
                ))
    if "*" not in labels:
        allowed = ", ".join(f'"{k}"' for k in q.allowed_node_labels) or "none"
        for key in r.node_selector:
            if key not in labels:
                errors.append(FieldError(
                    path=f"{at}.node_selector.{key}",
                    message=f'queue {q.name} does not allow node selector key "{key}" (it allows: {allowed})',
                ))
