"""Every Kubernetes name gpuorch writes or reads, in one place (labels, annotations, namespace, ids).

What the dispatcher writes on a Job and its pods, inventory and the fencer read back, so a name
spelled twice could drift (it did: the queue was written as an annotation and read as a label).
Node labels set by GPU Feature Discovery and gpuorch's pool label are here too; the rule that turns
a workload's requirements into node constraints is `gpuorch_proto.placement`.
"""

from __future__ import annotations

import re
from typing import Final

__all__ = [
    "ANN_EXPECTED_DURATION",
    "ANN_GANG",
    "ANN_QUEUE",
    "GPU_RESOURCE",
    "KUEUE_QUEUE_LABEL",
    "LABEL_ATTEMPT",
    "LABEL_EPOCH",
    "LABEL_GPU_COUNT",
    "LABEL_GPU_MEMORY",
    "LABEL_GPU_PRODUCT",
    "LABEL_MANAGED",
    "LABEL_MIG_STRATEGY",
    "LABEL_POOL",
    "LABEL_QUEUE",
    "LABEL_SHARING_STRATEGY",
    "LABEL_WORKLOAD",
    "MANAGED_SELECTOR",
    "NAMESPACE",
    "SCHEDULER_FOR",
    "TAINT_UNSCHEDULABLE",
    "attempt_id",
    "parse_attempt_id",
    "pod_name_regex",
]

#: Where every attempt's Job lives on a destination cluster.
NAMESPACE: Final = "gpuorch"

# ---- on every Job and pod the dispatcher creates ------------------------------------------------
LABEL_MANAGED: Final = "gpuorch.io/managed"  # "true": created by gpuorch (what orphan collection lists)
LABEL_WORKLOAD: Final = "gpuorch.io/workload"
LABEL_ATTEMPT: Final = "gpuorch.io/attempt"
LABEL_EPOCH: Final = "gpuorch.io/epoch"  # the fencing token at creation
LABEL_QUEUE: Final = "gpuorch.io/queue"  # the destination queue: inventory counts pending demand by it
ANN_QUEUE: Final = LABEL_QUEUE  # deprecated: written as an annotation before it was a label
ANN_GANG: Final = "gpuorch.io/gang"  # "true": bind every pod of the Job together or none
ANN_EXPECTED_DURATION: Final = "gpuorch.io/expected-duration-seconds"  # lets inventory estimate waits
MANAGED_SELECTOR: Final = f"{LABEL_MANAGED}=true"

# ---- admission integrations ---------------------------------------------------------------------
KUEUE_QUEUE_LABEL: Final = "kueue.x-k8s.io/queue-name"
SCHEDULER_FOR: Final = {"kai": "kai-scheduler", "volcano": "volcano"}

# ---- nodes: GPU Feature Discovery and gpuorch ----------------------------------------------------
LABEL_POOL: Final = "gpuorch.io/pool"
LABEL_GPU_PRODUCT: Final = "nvidia.com/gpu.product"
LABEL_GPU_MEMORY: Final = "nvidia.com/gpu.memory"  # MiB per GPU
LABEL_GPU_COUNT: Final = "nvidia.com/gpu.count"  # GPUs installed
LABEL_MIG_STRATEGY: Final = "nvidia.com/mig.strategy"  # "single" | "mixed" when MIG is configured
LABEL_SHARING_STRATEGY: Final = "nvidia.com/gpu.sharing-strategy"  # "time-slicing" | "mps" | "none"
GPU_RESOURCE: Final = "nvidia.com/gpu"
TAINT_UNSCHEDULABLE: Final = "node.kubernetes.io/unschedulable"  # what a cordon means to the scheduler

# ---- ids ----------------------------------------------------------------------------------------
_ATTEMPT = re.compile(r"^(?P<workload>.+)-a(?P<number>[1-9][0-9]*)$")


def attempt_id(workload_id: str, number: int) -> str:
    """The id (and Job name) of attempt `number` of a workload: ``<workload>-a<number>``."""
    return f"{workload_id}-a{number}"


def pod_name_regex(attempt_id: str) -> str:
    """An RE2/Python regular expression matching exactly the names of the pods of the attempt's
    Job (the Job controller's ``<job>-<5 chars>`` and ``<job>-<index>-<5 chars>``); dots of the id
    as ``[.]``, so the expression needs no backslash inside a PromQL string."""
    return attempt_id.replace(".", "[.]") + "-([0-9]+-)?[a-z0-9]{5}"


def parse_attempt_id(value: str) -> tuple[str, int] | None:
    """``(workload, number)`` of an attempt id, or None when `value` is not one."""
    m = _ATTEMPT.match(value)
    return (m.group("workload"), int(m.group("number"))) if m else None
