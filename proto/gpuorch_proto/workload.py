"""The workload contract, v1 (DESIGN §3).

What a team hands to gpuorch: far more than a GPU count. Hard requirements
(``resources`` and ``requirements``) and soft ``preferences`` live in separate
sections; the router never trades a hard requirement for a preference.

Quantities and durations are Kubernetes-style strings on the wire ("128Gi",
"16", "500m", "4h", "90s") so that YAML stays readable; ``gpuorch_proto.units``
parses them and ``gpuorch_proto.validate`` checks every one, naming the field path.
"""

from __future__ import annotations

from typing import Literal

import msgspec

SCHEMA_VERSION = 1

FencingPolicy = Literal["strict", "fast"]
SharingMechanism = Literal["mig", "time-slicing", "mps"]


class Sharing(msgspec.Struct, frozen=True, kw_only=True):
    """A GPU sharing mechanism; required for fractional GPU requests."""

    mechanism: SharingMechanism
    profile: str | None = None  # e.g. MIG profile "1g.10gb"


class Resources(msgspec.Struct, frozen=True, kw_only=True):
    """Hard per-worker resources and the gang shape."""

    gpus: float = 0  # per worker; whole numbers unless `sharing` is set
    gpu_memory_gib: float | None = None  # minimum memory per GPU
    accelerators: list[str] = []  # acceptable GPU models (GFD product names); empty = any
    cpu: str = "1"
    memory: str = "1Gi"
    workers: int = 1
    same_node: bool = False  # all workers on one node (a one-node gang)
    sharing: Sharing | None = None


class Toleration(msgspec.Struct, frozen=True, kw_only=True):
    key: str | None = None
    operator: Literal["Equal", "Exists"] = "Equal"
    value: str | None = None
    effect: str | None = None


class Requirements(msgspec.Struct, frozen=True, kw_only=True):
    """Hard eligibility beyond resources: a cluster failing any of these is ineligible."""

    pools: list[str] = []  # node pools the workload may use; empty = any pool
    node_selector: dict[str, str] = {}
    tolerations: list[Toleration] = []
    connections: list[str] = []  # named connections (e.g. "wandb", "feature-store")
    credentials: list[str] = []  # named credentials, never the secret itself
    clusters: list[str] = []  # allow-list of clusters; empty = any


class Preferences(msgspec.Struct, frozen=True, kw_only=True):
    """Soft ranking inputs; never make a cluster eligible or ineligible."""

    clusters: list[str] = []
    pools: list[str] = []
    time_weight: float = 1.0  # weight of estimated time to result (per hour)
    cost_weight: float = 0.0  # weight of estimated cost (per currency unit)


class DatasetInput(msgspec.Struct, frozen=True, kw_only=True):
    """An immutable, versioned input: ``ref`` is ``name@version``."""

    ref: str
    size_gb: float = 0.0
    locations: list[str] = []  # data locations holding a replica (e.g. "primary-nfs")
    mount: str | None = None


class RetryPolicy(msgspec.Struct, frozen=True, kw_only=True):
    budget: int = 2  # replacement attempts after the first
    backoff: str = "30s"
    permanent_exit_codes: list[int] = msgspec.field(default_factory=lambda: [2])  # fail at once
    retryable_exit_codes: list[int] = []  # empty = any other non-zero exit is retryable


class CheckpointPolicy(msgspec.Struct, frozen=True, kw_only=True):
    path: str | None = None  # relative to the attempt's checkpoint root
    interval: str | None = None
    portable: bool = False  # readable from another cluster (shared store)
    store: str | None = None  # artifact store holding checkpoints


class OutputPolicy(msgspec.Struct, frozen=True, kw_only=True):
    store: str = "scratch"  # artifact store that must be reachable from the cluster
    promote: bool = True


class Stage(msgspec.Struct, frozen=True, kw_only=True):
    """One node of a DAG; each stage carries its own resources (a CPU stage holds no GPU).

    A stage becomes a child workload of its pipeline (docs/pipelines.md). Its `resources` are its
    own (the default is one CPU and no GPU: never the pipeline's). The fields added with issue 13
    default to the pipeline's (`None` / empty = inherit `spec.*`): `command` empty runs
    `spec.command`, `image` None runs `spec.image`, `env` is merged over `spec.env`, `inputs` are
    added to `spec.inputs` (and to the promoted results of the stages it depends on).
    """

    name: str
    depends_on: list[str] = []
    command: list[str] = []
    args: list[str] = []
    resources: Resources = Resources()
    timeout: str | None = None
    # issue 13: each stage routed on its own; None = the pipeline's spec.<field>
    image: str | None = None
    env: dict[str, str] = {}
    inputs: list[DatasetInput] = []
    requirements: Requirements | None = None
    preferences: Preferences | None = None
    queue: str | None = None  # "<agent>/<queue>" pins this stage's cluster and queue
    expected_runtime: str | None = None  # declared run time of this stage (never the pipeline's)


ParamValue = str | int | float | bool


class Sweep(msgspec.Struct, frozen=True, kw_only=True):
    """A search: the workload becomes one trial per parameter set, all of one pipeline (issue 13).

    Exactly one of `grid` (every combination, the last parameter varying fastest) or `trials` (an
    explicit list, in order). A trial sees its parameters as ``{{name}}`` in `command`, `args` and
    `env` values, and as environment variables ``GPUORCH_PARAM_<NAME>``.
    """

    grid: dict[str, list[ParamValue]] = {}
    trials: list[dict[str, ParamValue]] = []


class Limits(msgspec.Struct, frozen=True, kw_only=True):
    """Concurrency that is not capacity: at most this much released at once (None = no limit).

    Counted over released work that has not finished: workloads, and GPUs (per worker x workers;
    a CPU stage holds none). Used by `spec.limits` (the pipeline's children) and the admission
    policy (organisation and queue level, `gpuorch_proto.policy`).
    """

    max_running: int | None = None
    max_gpus: float | None = None


class Metadata(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    owner: str = "anonymous"
    labels: dict[str, str] = {}
    workload_class: str | None = None  # groups runs whose run time is learnt together


class WorkloadSpecBody(msgspec.Struct, frozen=True, kw_only=True):
    image: str  # container image pinned by digest: repo@sha256:<64 hex>
    command: list[str] = []
    args: list[str] = []
    env: dict[str, str] = {}
    inputs: list[DatasetInput] = []
    resources: Resources = Resources()
    requirements: Requirements = Requirements()
    preferences: Preferences = Preferences()
    stages: list[Stage] = []
    queue: str | None = None  # "<agent>/<queue>" pins the cluster and its queue
    priority: int = 0
    timeout: str | None = None
    expected_runtime: str | None = None  # declared run time on the reference GPU
    reference_accelerator: str | None = None  # GPU model `expected_runtime` was measured on
    retry: RetryPolicy = RetryPolicy()
    checkpoint: CheckpointPolicy = CheckpointPolicy()
    output: OutputPolicy = OutputPolicy()
    fencing: FencingPolicy = "strict"
    preemptible: bool = False
    lease: str = "10m"  # how long an unreachable attempt may be presumed alive
    # issue 13: pipelines and queues (docs/pipelines.md)
    sweep: Sweep | None = None  # fan-out: one trial workload per parameter set
    limits: Limits = Limits()  # pipeline-level concurrency of this workload's stages or trials
    policy_queue: str | None = None  # the organisation's queue (priority, limits, budget); None = default


class Workload(msgspec.Struct, frozen=True, kw_only=True):
    """The user-facing document (YAML or JSON): apiVersion/kind/metadata/spec."""

    api_version: str = msgspec.field(default="gpuorch/v1", name="apiVersion")
    kind: Literal["Workload"] = "Workload"
    metadata: Metadata
    spec: WorkloadSpecBody


def interruptible(wl: Workload) -> bool:
    """May this workload be interrupted (preempted)? Only if it declares `spec.preemptible` and
    checkpoints (`spec.checkpoint.path`): interruptible work must declare checkpointing (DESIGN §7),
    so that it resumes instead of starting over. The one definition: validation refuses a
    preemptible workload that is not interruptible, the router's preemption plan
    (`gpuorch_router.preempt`) names only interruptible victims, the dispatcher fences only
    interruptible work on a preemption request, and the invariant checker holds them to it."""
    return wl.spec.preemptible and bool(wl.spec.checkpoint.path)
