"""The routing decision record (DESIGN §5): every cluster's verdict with reasons."""

from __future__ import annotations

from typing import Literal

import msgspec

from .placement import Placement

# Stable reason codes. Never reuse or rename one; add new codes at the end.
ReasonCode = Literal[
    "CLUSTER_UNREACHABLE",
    "CLUSTER_NOT_ALLOWED",
    "GPU_MEMORY",
    "GPU_MODEL",
    "GPU_SHAPE",
    "GPU_CAPACITY",
    "CPU_MEMORY",
    "POOL",
    "NODE_SELECTOR",
    "TAINTS",
    "CONNECTIONS",
    "CREDENTIALS",
    "ARTIFACT_STORE",
    "INPUT_DATA",
    "CHECKPOINT",
    "QUEUE_ACCESS",
    "SHARING",
    "PINNED_ELSEWHERE",
    "GANG_SPLIT",
    "GPU_SHARED",  # whole GPUs asked for; the node's are time-sliced, MPS-shared or MIG slices
]

Outcome = Literal["routed", "waiting", "rejected"]


class Check(msgspec.Struct, frozen=True, kw_only=True):
    code: ReasonCode
    ok: bool
    message: str
    capacity_only: bool = False  # failing only for lack of free capacity now (could pass later)


class Estimate(msgspec.Struct, frozen=True, kw_only=True):
    """Estimated time to result, in (simulated) seconds, with each term kept."""

    queue_wait: float = 0.0
    image_staging: float = 0.0
    data_staging: float = 0.0
    staging_overlap: float = 0.0  # part of staging hidden behind the queue wait
    startup: float = 0.0
    run: float = 0.0
    output_transfer: float = 0.0
    total: float = 0.0
    cost: float = 0.0
    score: float = 0.0  # lower is better: time_weight*hours + cost_weight*cost
    resume_saved: float = 0.0  # run saved by resuming the latest checkpoint here (in `total`)
    # where `run` came from, in words ("p50 1h18m of 37 runs of class resnet-ft on NVIDIA-A100-SXM4-80GB
    # (weight 0.93); declared 2h", "declared 2h; no runs learnt"); "" from routers older than this field
    run_source: str = ""
    # the GPU model `run` is estimated for, when every suitable node here has it (the run can land
    # on no other: the router learns run times per model from it); "" = no GPU, several suitable
    # models (`run` is for the slowest, named in the summary), or an older router
    gpu_model: str = ""
    # what `queue_wait` is: which request shape's wait inventory published for the queue, or the
    # queue's single estimate, or the backlog; "" from routers older than this field
    queue_basis: str = ""


class ClusterVerdict(msgspec.Struct, frozen=True, kw_only=True):
    cluster: str
    eligible: bool
    checks: list[Check] = []
    estimate: Estimate | None = None
    snapshot_age: float = 0.0


class RoutingDecision(msgspec.Struct, frozen=True, kw_only=True):
    schema_version: int = 1
    workload_id: str
    decided_at: float
    outcome: Outcome
    cluster: str | None = None
    queue: str | None = None
    summary: str  # one line: why here (or why waiting / rejected)
    verdicts: list[ClusterVerdict] = []
    # routed: the node constraints the Job must carry on `cluster` (gpuorch_proto.placement), made
    # by the rule the eligibility checks used; None from routers older than this field
    placement: Placement | None = None
