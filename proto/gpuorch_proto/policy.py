"""Queues as policy: the admission configuration (issue 13; docs/pipelines.md).

What a platform team writes once (YAML, strict like a workload document): the organisation's
limits and its queues. A queue here is a *policy* queue, named by a workload's
`spec.policy_queue`: priority between queues, who may submit to it, its own concurrency limits and
a GPU-hour budget over a sliding window. It is not `spec.queue` (`<agent>/<queue>`), which pins a
cluster and that cluster's admission queue.

`gpuorch_router.pipeline.admission` reads it; `gpuorch_proto.validate.validate_policy` checks it.
"""

from __future__ import annotations

from typing import Any

import msgspec
import msgspec.inspect
import yaml

from .events import FieldError
from .workload import Limits

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


_POLICY_INFO = msgspec.inspect.type_info(AdmissionPolicy)


def policy_from_obj(obj: Any) -> AdmissionPolicy:
    """Decode and validate a policy document (a mapping); `PolicyError` names every field path.

    Strict, as for anything people write: an unknown field is an error, not a no-op.
    """
    from .codec import _field_error, unknown_fields
    from .validate import validate_policy

    if not isinstance(obj, dict):
        raise PolicyError([FieldError(path="$", message="expected a mapping")])
    extra = unknown_fields(obj, _POLICY_INFO)
    if extra:
        raise PolicyError(extra)
    try:
        policy = msgspec.convert(obj, AdmissionPolicy)
    except msgspec.ValidationError as exc:
        raise PolicyError([_field_error(exc)]) from exc
    errors = validate_policy(policy)
    if errors:
        raise PolicyError(errors)
    return policy


def load_policy_yaml(text: str) -> AdmissionPolicy:
    return policy_from_obj(yaml.safe_load(text) or {})
