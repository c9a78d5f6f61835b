"""The dispatcher's pure decisions: attempts, Jobs, retry vs resume, cancellation, completion.

(state, event, now) -> actions. No I/O here: the service shell executes `CreateJob`
and `DeleteJob` through the Kubernetes client and publishes `Emit`ted events.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Container, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

import msgspec

from gpuorch.projection import AttemptView, WorkloadView
from gpuorch_proto import ClusterRegistryEntry, InstanceLease, OwnerRecord, Workload, event_id, podpath
from gpuorch_proto import events as ev
from gpuorch_proto.credentials import secret_env
from gpuorch_proto.jobenv import job_env  # a pipeline child's parameters and inputs (docs/pipelines.md)
from gpuorch_proto.k8s import (
    ANN_EXPECTED_DURATION,
    ANN_GANG,
    GPU_RESOURCE,
    KUEUE_QUEUE_LABEL,
    LABEL_ATTEMPT,
    LABEL_EPOCH,
    LABEL_MANAGED,
    LABEL_QUEUE,
    LABEL_WORKLOAD,
    NAMESPACE,
    SCHEDULER_FOR,
    attempt_id,
)
from gpuorch_proto.placement import Placement, placement_for
from gpuorch_proto.resume import CheckpointRef, can_resume, readable_stores
from gpuorch_proto.storage import (
    StoreConfig,
    StoreError,
    attempt_prefix,
    checkpoints_prefix,
    manifest_key,
    parse_url,
    pod_store_env,
)
from gpuorch_proto.subjects import valid_token
from gpuorch_proto.units import format_duration, parse_duration, parse_quantity
from gpuorch_proto.workload import interruptible

#: Every container of an attempt: what the `restricted` Pod Security Standard asks of it.
CONTAINER_SECURITY: Final = {
    "allowPrivilegeEscalation": False,
    "capabilities": {"drop": ["ALL"]},
    "runAsNonRoot": True,
    "seccompProfile": {"type": "RuntimeDefault"},
}
UNSCHEDULABLE_GRACE = 60.0  # real seconds a pod may stay unplaceable before its attempt fails
BACKOFF_CAP = 3600.0  # simulated seconds: the longest wait between a failed attempt and its replacement
REQUEUE_FACTOR = 4.0  # an attempt queued at its destination waits this many times the router's estimate,
REQUEUE_FLOOR = 300.0  # never less than this many real seconds (GPUORCH_REQUEUE_AFTER)
REQUEUE_MAX = 86400.0  # and never more (GPUORCH_REQUEUE_MAX): a safety net for an estimate wildly too large


#: Event types the dispatcher decides nothing from (the gate's admissions and holds, preemption
#: plans, the admission leader's term markers): its durable and its replay leave them out
#: (`READS`); `released` is one per workload.
IGNORES = frozenset({"released", "held", "preemption-planned", "admission-term"})
#: The event types the dispatcher reads (every other one of the contract's).
READS = tuple(
    t for t in (ev.type_tag(c) for c in ev.EVENT_TYPES if c not in (ev.Submit, ev.Cancel)) if t not in IGNORES
)


@dataclass(frozen=True)
class Requeue:
    """How long an attempt may wait unplaced at its destination before it is requeued elsewhere.

    ``min(max(factor x the router's queue-wait estimate for that cluster, floor), most)``, in real
    seconds (the estimate is in the cluster's simulated seconds, divided by `time_scale`), as
    Kueue's waitForPodsReady timeout with requeueing. The wait counts from the attempt's creation
    while its pods are not all bound and it was never admitted: queued for capacity, or held by the
    cluster's own admission (a suspended Kueue Job). `most` bounds the trust in an estimate that
    was wrong the other way (a default mean job length, capacity lost since): a requeued attempt
    never ran, so asking the router again costs only its place in that cluster's queue. It is a
    day by default, far above normal queues, so a long but true estimate is waited out; the
    simulation, whose jobs run seconds, sets it to two minutes.
    """

    factor: float = REQUEUE_FACTOR
    floor: float = REQUEUE_FLOOR
    most: float = REQUEUE_MAX


@dataclass(frozen=True)
class Emit:
    event: ev.Base


@dataclass(frozen=True)
class CreateJob:
    cluster: str
    namespace: str
    manifest: dict[str, Any]
    created: ev.AttemptCreated  # published once the Job exists (or already existed)


@dataclass(frozen=True)
class DeleteJob:
    cluster: str
    namespace: str
    job_name: str
    reason: str


@dataclass(frozen=True)
class RefuseMessage:
    """The command itself is refused: the shell records it against the message (stream and
    sequence, `evt.msg-<stream>-<seq>.rejected`), never on a workload's subject."""

    reason: str
    claimed_workload_id: str | None = None


Action = Emit | CreateJob | DeleteJob | RefuseMessage


#: The cache claim a cluster's pods stage datasets into when its registry entry names none.
CACHE_CLAIM: Final = "gpuorch-cache"


@dataclass(frozen=True)
class Environment:
    """What the dispatcher knows about where things live (filled in by the shell)."""

    registry: dict[str, ClusterRegistryEntry]
    stores: dict[str, StoreConfig]  # every store and data location by name (`gpuorch.stores.store_configs`)
    time_scale: float = 1.0
    python: str = "python"
    agent_image: str = podpath.AGENT_IMAGE
    checkpoints: dict[str, str] = field(default_factory=dict)  # attempt id -> URL of its latest complete checkpoint

    def store_url(self, name: str) -> str:
        """A store's root URL; a store the registry does not name cannot be written."""
        config = self.stores.get(name)
        if config is None:
            raise StoreError(f"store {name!r} is not in the registry: no attempt can write to it")
        return parse_url(config.url, f"stores.{name}.url").join("")


@dataclass(frozen=True)
class JobObservation:
    """What the cluster says about one attempt's Job (None = the cluster did not answer)."""

    exists: bool
    workers: int = 1
    scheduled: int = 0  # pods bound to a node
    running: int = 0  # pods running
    complete: bool = False
    failed: bool = False
    exit_code: int | None = None
    reason: str = ""
    unschedulable: str = ""  # the scheduler's message while some pod cannot be placed ("" = none)


#: Node reasons in a kube-scheduler "0/N nodes are available: ..." message that free capacity
#: could remove (the pod queues); any other reason (selector, affinity, taint, cordon) is a property
#: of the node that no amount of waiting changes.
CAPACITY_REASONS: Final = ("Insufficient ", "Too many pods", "node(s) didn't have free ports")


def placement_impossible(message: str) -> bool:
    """Does the scheduler say no node of the cluster could ever take the pod?

    True when every node was refused for what it *is* (its labels, taints, cordon), none for what
    it has free now: ``0/3 nodes are available: 3 node(s) didn't match Pod's node affinity/selector.``
    False for queueing (``2 Insufficient nvidia.com/gpu``) and for messages it cannot read.
    """
    text = message.split(". preemption:", 1)[0]
    if text.startswith("no nodes available"):
        return True
    _, sep, body = text.partition(" nodes are available: ")
    if not sep:
        return False
    body = body.split(". ", 1)[0].rstrip(".").strip()
    reasons = [re.sub(r"^\d+\s+", "", r.strip()) for r in body.split(", ") if r.strip()]
    return bool(reasons) and not any(r.startswith(CAPACITY_REASONS) for r in reasons)


def _input_env_name(ref: str) -> str:
    name = ref.split("@", 1)[0].rsplit("/", 1)[-1]
    return "GPUORCH_INPUT_" + "".join(c if c.isalnum() else "_" for c in name).upper()


def latest_checkpoint(view: WorkloadView, env: Environment) -> CheckpointRef | None:
    """The workload's latest valid checkpoint: the newest complete file the shell found
    (`env.checkpoints`) of its latest attempt that has one, with the run it holds.

    The run held is the attempt's compute time (from its first step, else from running, to its
    end: finished, lost or fenced), in simulated seconds, less one checkpoint interval (the work
    since the last checkpoint is lost); 0 when not known. The router's estimate counts it as run
    saved where the checkpoint can be resumed (`gpuorch_proto.resume`).
    """
    wl = view.workload
    if wl is None:
        return None
    store = wl.spec.checkpoint.store or wl.spec.output.store
    for a in sorted(view.attempts.values(), key=lambda a: a.number, reverse=True):
        path = env.checkpoints.get(a.attempt_id)
        if path is None:
            continue
        start = a.times.get("compute-started", a.times.get("running"))
        end = next((a.times[k] for k in ("finished", "lost", "fence-requested") if k in a.times), None)
        held = 0.0
        if start is not None and end is not None and end > start:
            interval = parse_duration(wl.spec.checkpoint.interval) if wl.spec.checkpoint.interval else 0.0
            held = max(0.0, (end - start) * env.time_scale - interval)
        return CheckpointRef(
            attempt_id=a.attempt_id, cluster=a.cluster, store=store, path=path, run_seconds=held
        )
    return None


def needs_checkpoints(actions: list[Action]) -> bool:
    """Do these actions read `env.checkpoints` (a Job to create, a replacement's route request)?
    The shell finds checkpoint files (file I/O) only then, and decides again with them."""
    return any(
        isinstance(a, CreateJob) or (isinstance(a, Emit) and isinstance(a.event, ev.RouteRequested))
        for a in actions
    )


def choose_mode(view: WorkloadView, cluster: str, env: Environment) -> tuple[str, str | None, str]:
    """Retry is not resume: resume only from a checkpoint the new cluster can read.

    The rule is `gpuorch_proto.resume.can_resume`, the one the router's estimate applies to the
    same checkpoint (its `route-requested` carried it), so "resumes here" means the same to both.
    """
    wl = view.workload
    assert wl is not None
    if not view.attempts:
        return "fresh", None, "first attempt"
    ckpt = latest_checkpoint(view, env)
    if ckpt is None:
        return "retry", None, "no valid checkpoint from earlier attempts"
    entry = env.registry.get(cluster, ClusterRegistryEntry())
    verdict = can_resume(
        ckpt, portable=wl.spec.checkpoint.portable, cluster=cluster, readable=readable_stores(entry)
    )
    # same data version and image: both are immutable in the workload spec of this workload
    return ("resume", ckpt.path, verdict.reason) if verdict.ok else ("retry", None, verdict.reason)


def build_job(
    wl: Workload,
    workload_id: str,
    att_id: str,
    epoch: int,
    cluster: str,
    queue: str | None,
    env: Environment,
    *,
    resume_from: str | None,
    traceparent: str | None = None,
    placement: Placement | None = None,
    parameters: Mapping[str, Any] | None = None,
    stage_inputs: Sequence[ev.StageInput] = (),
) -> dict[str, Any]:
    """The batch/v1 Job for one attempt (DESIGN §6), as a plain JSON-able dict.

    The pod shares no disk with the control plane (docs/storage.md): it writes into its own
    emptyDir, and gpuorch's agent (its own image) moves bytes between the pod and the stores:
    init containers stage datasets into the cluster's cache claim, fetch the checkpoint resumed
    from and a pipeline stage's inputs (by their manifests); a native sidecar uploads checkpoints
    as they appear and the outputs, with their upload record last, when the program is done.
    Stores reach the pod by URL; credentials by the name of the cluster's Secret only.

    `parameters`/`stage_inputs`: a pipeline's child gets its parameters and its inputs by version
    (`gpuorch_proto.jobenv.job_env`, docs/pipelines.md). `resume_from`: the URL of the
    checkpoint to resume from (in the workload's checkpoint store)."""
    spec = wl.spec
    res = spec.resources
    entry = env.registry.get(cluster, ClusterRegistryEntry())
    labels = {
        LABEL_MANAGED: "true",
        LABEL_WORKLOAD: workload_id,
        LABEL_ATTEMPT: att_id,
        LABEL_EPOCH: str(epoch),
    }
    if queue:
        labels[LABEL_QUEUE] = queue  # inventory counts pending demand per queue by this label
    if entry.admission == "kueue" and queue:
        labels[KUEUE_QUEUE_LABEL] = queue
    gpus = int(res.gpus) if res.gpus == int(res.gpus) else 1
    cpu = parse_quantity(res.cpu)
    limits = {"cpu": res.cpu, "memory": res.memory}
    if res.same_node and res.workers > 1:
        # one pod holding the whole gang's GPUs on one node
        limits = {"cpu": _fmt_cpu(cpu * res.workers), "memory": res.memory}
    pod_gpus = gpus * (res.workers if res.same_node and res.workers > 1 else 1)
    if pod_gpus:
        limits[GPU_RESOURCE] = str(pod_gpus)
    pods = 1 if res.same_node else res.workers
    out_store, ck_store = _stores_of(wl)
    out_url, ck_url = attempt_urls(env, wl, workload_id, att_id)
    used: set[str] = {out_store, ck_store}
    fetch_inputs = {i.stage: podpath.INPUTS + "/" + _path_token(i.stage) for i in stage_inputs}
    envs: dict[str, str] = dict(spec.env)
    envs.update(
        {
            "GPUORCH_WORKLOAD_ID": workload_id,
            "GPUORCH_ATTEMPT_ID": att_id,
            "GPUORCH_EPOCH": str(epoch),
            "GPUORCH_OUTPUT_DIR": podpath.in_pod(podpath.OUT),
            "GPUORCH_CHECKPOINT_DIR": podpath.in_pod(podpath.CHECKPOINTS),
            "GPUORCH_OUTPUT_URL": out_url,
            "GPUORCH_CHECKPOINT_URL": ck_url,
            "GPUORCH_WORKERS": str(res.workers),
        }
    )
    envs.update(job_env(parameters or {}, stage_inputs, {k: podpath.in_pod(v) for k, v in fetch_inputs.items()}))
    if traceparent:
        envs["TRACEPARENT"] = traceparent
    ids = {"GPUORCH_WORKLOAD_ID": workload_id, "GPUORCH_ATTEMPT_ID": att_id}
    init: list[dict[str, Any]] = []
    cache = bool(spec.inputs)
    for inp in spec.inputs:
        envs[_input_env_name(inp.ref)] = podpath.in_pod(f"{podpath.CACHE}/{inp.ref}")
        # staged even where the registry (or a past staging) says the cache holds it: on a hit the
        # agent only reads the `.complete` record, and a cache emptied since is filled again
        local = next((loc for loc in inp.locations if loc in entry.data_locations), None)
        source = local or max(inp.locations, key=lambda loc: entry.bandwidth_mbps.get(loc, 0.0), default="")
        used.add(source)
        args = [
            "stage", "--store", source, "--dataset", inp.ref, "--cache", podpath.CACHE,
            "--size-gb", f"{inp.size_gb:g}", "--time-scale", f"{env.time_scale:g}",
        ]  # fmt: skip
        if local is None:  # over a link: the registry's bandwidth (the cluster's own location has none)
            args += ["--bandwidth-mbps", f"{entry.bandwidth_mbps.get(source, 0.0):g}"]
        stage = _agent_container(env, f"stage-{len(init)}", args, ids, [source], entry, cache=True)
        stage["resources"] = {"limits": {"cpu": "1", "memory": "1Gi"}, "requests": {"cpu": "1", "memory": "1Gi"}}
        init.append(stage)
    if resume_from:
        ck_root = env.store_url(ck_store).rstrip("/") + "/"
        if resume_from.startswith(ck_root):
            name = resume_from.rsplit("/", 1)[-1]
            to = f"{podpath.RESUME}/{name}"
            args = ["fetch", "--store", ck_store, "--key", resume_from[len(ck_root) :], "--to", to]
            init.append(_agent_container(env, "fetch", args, ids, [ck_store], entry))
            envs["GPUORCH_RESUME_FROM"] = podpath.in_pod(to)
    for n, i in enumerate(stage_inputs):
        used.add(i.store)
        args = ["fetch-result", "--store", i.store, "--key", manifest_key(i.workload_id), "--to", fetch_inputs[i.stage]]
        init.append(_agent_container(env, f"input-{n}", args, ids, [i.store], entry))
    sync = ["sync", "--store", out_store, "--prefix", attempt_prefix(workload_id, att_id), "--interval", "1"]
    if ck_store != out_store:
        sync += ["--checkpoint-store", ck_store]
    sidecar = _agent_container(env, "agent", sync, ids, sorted({out_store, ck_store}), entry)
    sidecar["restartPolicy"] = "Always"  # a native sidecar: runs beside the program, stopped after it
    sidecar["startupProbe"] = {
        # a shell test, not `agent ready`: a probe per second per pod must not start a Python
        "exec": {"command": ["sh", "-c", f'test -f "$GPUORCH_POD_ROOT{podpath.AGENT_READY}"']},
        "periodSeconds": 1,
        "failureThreshold": 120,
    }
    init.append(sidecar)
    main_mounts: list[dict[str, Any]] = [{"name": podpath.WORK_VOLUME, "mountPath": podpath.WORK}]
    if cache:
        main_mounts.append({"name": podpath.CACHE_VOLUME, "mountPath": podpath.CACHE, "readOnly": True})
    volumes: list[dict[str, Any]] = [{"name": podpath.WORK_VOLUME, "emptyDir": {}}]
    if cache:
        claim = entry.cache_claim or CACHE_CLAIM
        volumes.append({"name": podpath.CACHE_VOLUME, "persistentVolumeClaim": {"claimName": claim}})
    # the node constraints the router's checks accepted, as it recorded them (one rule: placement_for)
    if placement is None:
        placement = placement_for(res, spec.requirements)
    node_selector = dict(placement.node_selector)
    match_exprs = [msgspec.to_builtins(r) for r in placement.match_expressions]
    # named credentials: a reference to the cluster's Secret, never the value (gpuorch_proto.credentials)
    secrets = secret_env(spec.requirements.credentials, entry)
    secret_names = {e["name"] for e in secrets}
    pod_spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "terminationGracePeriodSeconds": 5,
        "containers": [
            {
                "name": "main",
                "image": spec.image,
                "command": [
                    env.python if c in ("python", "python3") and i == 0 else c
                    for i, c in enumerate(spec.command)
                ],
                "args": list(spec.args),
                # the pod root first: the paths after it name it ($(GPUORCH_POD_ROOT), podpath)
                "env": [{"name": podpath.POD_ROOT, "value": ""}]
                + [{"name": k, "value": v} for k, v in sorted(envs.items()) if k not in secret_names]
                + secrets,
                "resources": {"limits": limits, "requests": dict(limits)},
                "volumeMounts": main_mounts,
                "securityContext": dict(CONTAINER_SECURITY),
            }
        ],
        "volumes": volumes,
        # the `restricted` Pod Security Standard the workload namespace enforces (deploy/, docs/security.md)
        "automountServiceAccountToken": False,
        "securityContext": {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}},
    }
    pod_spec["initContainers"] = init
    if node_selector:
        pod_spec["nodeSelector"] = node_selector
    if match_exprs:
        pod_spec["affinity"] = {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [{"matchExpressions": match_exprs}]
                }
            }
        }
    if spec.requirements.tolerations:
        pod_spec["tolerations"] = [
            {
                k: v
                for k, v in (
                    ("key", t.key),
                    ("operator", t.operator),
                    ("value", t.value),
                    ("effect", t.effect),
                )
                if v
            }
            for t in spec.requirements.tolerations
        ]
    if entry.admission in SCHEDULER_FOR:
        pod_spec["schedulerName"] = SCHEDULER_FOR[entry.admission]
    annotations = {ANN_GANG: "true"} if pods > 1 else {}
    if spec.expected_runtime:  # lets inventory estimate when these GPUs free up (simulated seconds)
        annotations[ANN_EXPECTED_DURATION] = f"{parse_duration(spec.expected_runtime):g}"
    job_spec: dict[str, Any] = {
        "parallelism": pods,
        "completions": pods,
        "backoffLimit": 0,  # gpuorch owns retries: a failed pod fails the attempt
        "template": {
            "metadata": {"labels": dict(labels), "annotations": dict(annotations)},
            "spec": pod_spec,
        },
    }
    if pods > 1:
        job_spec["completionMode"] = "Indexed"
    if spec.timeout:
        # in the cluster's own job clock: simulated seconds on a local cluster, real ones elsewhere
        job_spec["activeDeadlineSeconds"] = max(1, math.ceil(parse_duration(spec.timeout)))
    if entry.admission == "kueue":
        job_spec["suspend"] = True  # Kueue admits by unsuspending
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": att_id, "namespace": NAMESPACE, "labels": labels, "annotations": annotations},
        "spec": job_spec,
    }


def _fmt_cpu(cores: float) -> str:
    return str(int(cores)) if cores == int(cores) else f"{int(cores * 1000)}m"


def _stores_of(wl: Workload) -> tuple[str, str]:
    """(output store, checkpoint store) of a workload."""
    return wl.spec.output.store, wl.spec.checkpoint.store or wl.spec.output.store


def attempt_urls(env: Environment, wl: Workload, workload_id: str, att_id: str) -> tuple[str, str]:
    """The URLs of an attempt's prefix (its outputs) and of its checkpoints (docs/storage.md)."""
    out_store, ck_store = _stores_of(wl)
    return (
        f"{env.store_url(out_store).rstrip('/')}/{attempt_prefix(workload_id, att_id)}",
        f"{env.store_url(ck_store).rstrip('/')}/{checkpoints_prefix(workload_id, att_id)}",
    )


def _path_token(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name) or "_"


def _agent_container(
    env: Environment,
    name: str,
    args: list[str],
    ids: Mapping[str, str],
    stores: Iterable[str],
    entry: ClusterRegistryEntry,
    *,
    cache: bool = False,
) -> dict[str, Any]:
    """One of gpuorch's agent containers: its image, the stores it reaches (URLs, and the
    cluster's Secret for each by name) and the pod's work volume (and the cache claim)."""
    store_env: list[dict[str, Any]] = []
    for s in sorted(set(stores)):
        if s in env.stores:
            store_env.extend(pod_store_env(s, env.stores[s], entry.store_credentials.get(s)))
    mounts = [{"name": podpath.WORK_VOLUME, "mountPath": podpath.WORK}]
    if cache:
        mounts.append({"name": podpath.CACHE_VOLUME, "mountPath": podpath.CACHE})
    return {
        "name": name,
        "image": env.agent_image,
        "command": [env.python, "-m", "gpuorch.workloads.agent"],
        "args": args,
        "env": [{"name": podpath.POD_ROOT, "value": ""}, *({"name": k, "value": v} for k, v in sorted(ids.items())), *store_env],
        "volumeMounts": mounts,
        "securityContext": dict(CONTAINER_SECURITY),
    }


def on_routed(
    view: WorkloadView, e: ev.Routed, now: float, env: Environment, traceparent: str | None = None
) -> list[Action]:
    """A destination was chosen: create the attempt's Job (exactly once per attempt number)."""
    wl = view.workload
    if wl is None or view.terminal or view.cancel_requested or e.decision.cluster is None:
        return []
    if any(a.number == e.attempt_number for a in view.attempts.values()):
        return []
    if view.live_attempts and not all(a.fenced for a in view.live_attempts):
        return []  # an unfenced attempt still owns this workload: never two current attempts
    cluster = e.decision.cluster
    att = attempt_id(view.workload_id, e.attempt_number)
    out, ckpt = attempt_urls(env, wl, view.workload_id, att)
    mode, resume_from, why = choose_mode(view, cluster, env)
    manifest = build_job(
        wl,
        view.workload_id,
        att,
        view.epoch,
        cluster,
        e.decision.queue,
        env,
        resume_from=resume_from,
        traceparent=traceparent,
        placement=e.decision.placement,
        parameters=view.parameters,
        stage_inputs=view.stage_inputs,
    )
    created = ev.AttemptCreated(
        event_id=event_id(view.workload_id, "attempt-created", e.attempt_number),
        workload_id=view.workload_id,
        at=now,
        attempt_id=att,
        epoch=view.epoch,
        cluster=cluster,
        attempt_number=e.attempt_number,
        queue=e.decision.queue,
        namespace=NAMESPACE,
        job_name=att,
        output_path=out,
        checkpoint_path=ckpt,
        mode=mode,  # type: ignore[arg-type]
        resume_from=resume_from,
        mode_reason=why,
    )
    return [CreateJob(cluster, NAMESPACE, manifest, created)]


def _eid(a: AttemptView, kind: str) -> str:
    return f"{a.attempt_id}.{kind}"


def _about(view: WorkloadView, a: AttemptView, now: float) -> dict[str, Any]:
    """The fields every event about attempt `a` carries (`events.AttemptEvent`)."""
    return {"workload_id": view.workload_id, "at": now, "attempt_id": a.attempt_id, "epoch": a.epoch, "cluster": a.cluster}


def estimated_queue_wait(view: WorkloadView, a: AttemptView) -> float | None:
    """The router's queue-wait estimate (simulated seconds) for `a`'s cluster when it chose it.

    From the latest routing decision, if it chose `a`'s cluster (None: no such estimate)."""
    d = view.decision
    if d is None or d.cluster != a.cluster:
        return None
    return next(
        (v.estimate.queue_wait for v in d.verdicts if v.cluster == a.cluster and v.estimate is not None), None
    )


def requeue_limit(view: WorkloadView, a: AttemptView, requeue: Requeue, time_scale: float) -> float:
    """Real seconds `a` may wait unplaced at its destination (see :class:`Requeue`)."""
    estimate = estimated_queue_wait(view, a) or 0.0
    return min(
        max(requeue.factor * estimate / max(time_scale, 1e-9), requeue.floor),
        max(requeue.most, requeue.floor),
    )


def _requeue_due(view: WorkloadView, a: AttemptView, requeue: Requeue | None, time_scale: float) -> float | None:
    """When a queued `a` is requeued if nothing changes first (None: it is not requeued)."""
    since = a.times.get("created")
    if requeue is None or since is None or "admitted" in a.times or a.status != "created" or a.fenced or view.cancel_requested:
        return None
    return since + requeue_limit(view, a, requeue, time_scale)


def _requeue(
    view: WorkloadView, a: AttemptView, obs: JobObservation, now: float, requeue: Requeue, time_scale: float
) -> Emit | None:
    """Requeue `a` (a placement failure: no retry budget spent) once it waited past its limit."""
    due = _requeue_due(view, a, requeue, time_scale)
    if due is None or now < due:
        return None
    since = a.times["created"]
    waited, limit = now - since, due - since
    estimate = estimated_queue_wait(view, a)
    told = (
        f"the router estimated {format_duration(estimate)} of queue wait"
        if estimate is not None
        else "no queue-wait estimate"
    )
    what = f"pods waiting: {obs.unschedulable}" if obs.unschedulable else "not admitted by the cluster"
    why = (
        f"requeued: {obs.scheduled}/{obs.workers} pods placed on {a.cluster} after {waited:.0f}s ({what}); "
        f"{told}, limit {limit:.0f}s ({requeue.factor:g} x estimate within {requeue.floor:g}s..{requeue.most:g}s)"
    )
    return Emit(ev.Failed(event_id=_eid(a, "failed"), exit_code=None, reason=why, retryable=True, placement=True, **_about(view, a, now)))


def on_observation(
    view: WorkloadView,
    a: AttemptView,
    obs: JobObservation,
    now: float,
    *,
    unschedulable_grace: float = 60.0,
    requeue: Requeue | None = None,
    time_scale: float = 1.0,
) -> list[Action]:
    """Translate what the cluster says about an attempt's Job into lifecycle events.

    Pods the scheduler cannot place are recorded (`unschedulable`, with its message); when no
    node could ever take them (:func:`placement_impossible`) for `unschedulable_grace` real
    seconds, the attempt fails with the scheduler's reason (``placement=True``) and is re-routed
    elsewhere, as Kueue's waitForPodsReady requeues: the router promised a placement the cluster
    refuses, and waiting would never end. Pods that only queue (for capacity, or for the cluster's
    admission) are requeued the same way once they waited past :func:`requeue_limit` (`requeue`;
    None: never): the router's estimate was wrong there (a node lost, say), and another cluster may
    run it now.
    """
    if a.status in ("succeeded", "failed") or a.gone or view.workload is None:
        return []
    base = _about(view, a, now)
    out: list[Action] = []
    if not obs.exists:
        if a.fenced or view.cancel_requested:
            return []
        return [
            Emit(
                ev.Failed(
                    event_id=_eid(a, "failed"),
                    exit_code=None,
                    reason="job disappeared from the cluster",
                    retryable=True,
                    **base,
                )
            )
        ]
    if obs.unschedulable and obs.scheduled < obs.workers and not (obs.complete or obs.failed):
        permanent = placement_impossible(obs.unschedulable)
        kind = "unschedulable" if permanent else "pending"
        if kind not in a.times:
            out.append(
                Emit(
                    ev.Unschedulable(
                        event_id=_eid(a, kind), message=obs.unschedulable, permanent=permanent, **base
                    )
                )
            )
        elif (
            permanent
            and not a.fenced
            and not view.cancel_requested
            and now - a.times[kind] >= unschedulable_grace
        ):
            why = f"pods unschedulable on {a.cluster} for {now - a.times[kind]:.0f}s: {obs.unschedulable}"
            out.append(
                Emit(
                    ev.Failed(
                        event_id=_eid(a, "failed"),
                        exit_code=None,
                        reason=why,
                        retryable=True,
                        placement=True,
                        **base,
                    )
                )
            )
        elif (
            not permanent
            and requeue is not None
            and (late := _requeue(view, a, obs, now, requeue, time_scale))
        ):
            out.append(late)
        return out
    if obs.scheduled < obs.workers and not (obs.complete or obs.failed) and requeue is not None:
        late = _requeue(view, a, obs, now, requeue, time_scale)
        return [late] if late else []
    # a Job that completed was admitted and ran, even when its pods are not (or no longer) seen:
    # the Job and its pods come by separate watches, and the Job's may be the first to say so
    if (obs.scheduled >= obs.workers or obs.complete) and "admitted" not in a.times:
        out.append(Emit(ev.Admitted(event_id=_eid(a, "admitted"), **base)))
    if (obs.running >= obs.workers or obs.complete) and "running" not in a.times:
        out.append(Emit(ev.Running(event_id=_eid(a, "running"), workers_running=obs.workers, **base)))
    if obs.complete:
        # its promotion is asked by `reconcile` once this `succeeded` is folded (`promote_request`)
        out.append(Emit(ev.Succeeded(event_id=_eid(a, "succeeded"), output_path=a.output_path, **base)))
    elif obs.failed:
        code = obs.exit_code
        out.append(
            Emit(
                ev.Failed(
                    event_id=_eid(a, "failed"),
                    exit_code=code,
                    reason=obs.reason or "job failed",
                    retryable=retryable(view.workload, code),
                    **base,
                )
            )
        )
    return out


def observation_due(
    view: WorkloadView,
    a: AttemptView,
    obs: JobObservation,
    *,
    unschedulable_grace: float = 60.0,
    requeue: Requeue | None = None,
    time_scale: float = 1.0,
) -> float | None:
    """The earliest time at which :func:`on_observation` of the same view, attempt and
    observation may answer otherwise than it does now; None: only a change of them can make
    it (a new event, the Job or its pods changing). The two clocks: an unplaceable pod's
    `unschedulable_grace`, and a queued attempt's requeue limit. A shell that observed nothing
    new need not look again before then (the dispatcher's watch, as client-go's work queue
    `AddAfter`)."""
    if a.status in ("succeeded", "failed") or a.gone or view.workload is None or not obs.exists:
        return None
    waiting = obs.scheduled < obs.workers and not (obs.complete or obs.failed)
    if obs.unschedulable and waiting:
        permanent = placement_impossible(obs.unschedulable)
        kind = "unschedulable" if permanent else "pending"
        if kind not in a.times:
            return None  # recorded now; its event changes the view
        if permanent:
            return None if a.fenced or view.cancel_requested else a.times[kind] + unschedulable_grace
        return _requeue_due(view, a, requeue, time_scale)
    return _requeue_due(view, a, requeue, time_scale) if waiting else None


def retryable(wl: Workload, code: int | None) -> bool:
    """May a failure with this exit code be retried (spec.retry's exit code lists)?"""
    permanent = code is not None and code in wl.spec.retry.permanent_exit_codes
    listed = not wl.spec.retry.retryable_exit_codes or (code in wl.spec.retry.retryable_exit_codes)
    return not permanent and listed


#: Seconds between two processes' clocks that `absent_for_sure` allows for (attempt-created's `at`
#: is the creating dispatcher's clock; the cache's completeness time is ours).
CLOCK_MARGIN: Final = 1.0


def absent_for_sure(
    a: AttemptView,
    *,
    created_rv: int | None,
    cache_rv: int | None,
    complete_at: float | None,
    margin: float = CLOCK_MARGIN,
) -> bool:
    """May a Job missing from the informer's cache be called missing (`on_observation` of a Job
    that does not exist: disappeared)? One this process created (`created_rv`: the
    resourceVersion its create returned): once the cache's resourceVersion (`cache_rv`) covers
    the create. Another dispatcher's (a take-over): once the cache was complete (`complete_at`)
    at a time past the attempt's `attempt-created` plus `margin` (two processes' clocks)."""
    if created_rv is not None:
        return cache_rv is not None and cache_rv >= created_rv
    made = a.times.get("created")
    return complete_at is not None and (made is None or complete_at > made + margin)


#: Deliveries of a `routed` whose Job create the cluster never answered before the attempt is `lost`.
CREATE_DELIVERIES: Final = 4


def create_unanswered(
    c: CreateJob, now: float, error: str, *, unreachable: bool, delivered: int
) -> list[ev.Base] | None:
    """A Job create failed. None: try again later (the routed event is redelivered). Else the
    events to publish: after `CREATE_DELIVERIES` tries that the cluster never answered, the Job
    may or may not exist, so the attempt is recorded and declared lost (then fenced, like any)."""
    if not unreachable or delivered < CREATE_DELIVERIES:
        return None
    a = c.created
    return [
        a,
        ev.Lost(
            event_id=f"{a.attempt_id}.lost",
            workload_id=a.workload_id,
            at=now,
            attempt_id=a.attempt_id,
            epoch=a.epoch,
            cluster=c.cluster,
            reason=f"cluster did not answer the create: {error}",
        ),
    ]


def lost(view: WorkloadView, a: AttemptView, now: float, reason: str) -> list[Action]:
    if not a.live or a.status == "lost":
        return []
    return [
        Emit(
            ev.Lost(
                event_id=_eid(a, "lost"),
                workload_id=view.workload_id,
                at=now,
                attempt_id=a.attempt_id,
                epoch=a.epoch,
                cluster=a.cluster,
                reason=reason,
            )
        )
    ]


def _fence(view: WorkloadView, a: AttemptView, now: float, reason: str, time_scale: float) -> Emit:
    assert view.workload is not None
    lease = parse_duration(view.workload.spec.lease) / max(time_scale, 1e-9)
    return Emit(
        ev.FenceRequested(
            event_id=_eid(a, "fence-requested"),
            workload_id=view.workload_id,
            at=now,
            attempt_id=a.attempt_id,
            epoch=a.epoch,
            cluster=a.cluster,
            reason=reason,
            policy=view.workload.spec.fencing,
            lease_expires_at=now + lease,
            stopped=a.status in ("failed", "succeeded"),  # the cluster said its pods ended
        )
    )


def failed_attempts(view: WorkloadView, up_to: int | None = None) -> int:
    """Failed attempts (with a number <= `up_to`, if given) that count against the retry budget.

    A placement failure (pods the cluster never placed: unschedulable, or requeued after waiting
    past the estimate) is not the workload's failure: it spends no budget and backs off nothing.
    """
    return sum(
        1
        for a in view.attempts.values()
        if a.status == "failed" and not a.placement_failed and (up_to is None or a.number <= up_to)
    )


def retry_backoff(wl: Workload, failures: int) -> float:
    """Simulated seconds between the `failures`-th failed attempt and its replacement.

    `spec.retry.backoff` doubles per failed attempt (backoff x 2^(n-1)), capped at
    `BACKOFF_CAP` (or at the backoff itself, if that is longer).
    """
    base = parse_duration(wl.spec.retry.backoff)
    if failures <= 0 or base <= 0:
        return 0.0
    return min(base * 2.0 ** min(failures - 1, 32), max(base, BACKOFF_CAP))


def replacement_not_before(view: WorkloadView, a: AttemptView, time_scale: float) -> float:
    """Unix time before which no replacement of `a` may be requested (0.0: at once).

    Only a *failed* attempt backs off (from when it failed); a lost one is replaced as soon as
    fencing allows: losing a cluster says nothing about the workload.
    """
    if a.status != "failed" or a.placement_failed or view.workload is None:
        return 0.0
    delay = retry_backoff(view.workload, failed_attempts(view, up_to=a.number))
    return a.times.get("finished", 0.0) + delay / max(time_scale, 1e-9)


def stale_success(a: AttemptView) -> bool:
    """Finished, but can never be the result: its epoch moved on (fenced) or its promotion was refused.

    A lost attempt whose cluster comes back may be observed ``succeeded`` after the fencer bumped
    the epoch: it is replaced like a lost one (its pods are done, so ``strict`` has nothing to wait for).
    """
    return a.status == "succeeded" and not a.promoted and (a.fenced or a.promotion_rejected)


def needs_replacement(a: AttemptView) -> bool:
    """Will this attempt never give the workload its result (so, if it is the latest, another must)?

    Failed or lost; or fenced and not promoted, whatever it did since (a lost attempt seen
    running again after the heal is still fenced: it can never publish).
    """
    return a.status in ("failed", "lost") or stale_success(a) or (a.fenced and not a.promoted)


def _replacement_due(view: WorkloadView, a: AttemptView) -> bool:
    latest = view.latest_attempt
    return (
        view.workload is not None
        and not view.terminal
        and not view.cancel_requested
        and view.promoted_attempt is None
        and latest is not None
        and latest.attempt_id == a.attempt_id
        and needs_replacement(a)
        and view.next_attempt_number not in view.route_requested
    )


def _request_route(view: WorkloadView, a: AttemptView, now: float, why: str, env: Environment) -> ev.RouteRequested:
    """Ask the router for a replacement's destination, telling it the latest valid checkpoint."""
    n = view.next_attempt_number
    # lost: that cluster is not answering; placement failed: its scheduler refuses what the router
    # counted (a replacement must not go back to it on the same promise)
    exclude = [a.cluster] if a.status == "lost" or a.placement_failed else []
    if a.status == "failed" and not a.placement_failed and view.workload is not None:
        n_failed = failed_attempts(view, up_to=a.number)
        wait = retry_backoff(view.workload, n_failed)
        if wait > 0:
            why += f"; after a backoff of {format_duration(wait)} (failed attempt {n_failed})"
    return ev.RouteRequested(
        event_id=event_id(view.workload_id, "route-requested", n),
        workload_id=view.workload_id,
        at=now,
        attempt_number=n,
        exclude=exclude,
        reason=why,
        checkpoint=latest_checkpoint(view, env),
    )


# --- the workload's next step: each rule once, all of them asked by `reconcile` ------------------


def workload_failure(view: WorkloadView, now: float) -> ev.WorkloadFailed | None:
    """Does the workload fail for good? Its latest attempt failed, and that failure is permanent
    (its `failed` said not retryable: `retryable` of the exit code, as `on_observation` decided
    it) or the failed attempts that count (`failed_attempts`) exceed the retry budget. Never for
    a workload that ended or whose cancel is under way (the cancel ends it). Asked by `reconcile`
    (after a `failed` is folded, and whenever it looks): the same view, the same answer, one event id."""
    wl, a = view.workload, view.latest_attempt
    if wl is None or view.terminal or view.cancel_requested or a is None or a.status != "failed":
        return None
    if not a.retryable:
        why = f"permanent failure (exit code {a.exit_code})"
    elif failed_attempts(view) > wl.spec.retry.budget:
        why = f"retry budget of {wl.spec.retry.budget} spent"
    else:
        return None
    return ev.WorkloadFailed(
        event_id=event_id(view.workload_id, "workload-failed"),
        workload_id=view.workload_id,
        at=now,
        reason=f"{why} in {a.attempt_id}: {a.reason}",
        attempts=len(view.attempts),
    )


def replacement_request(view: WorkloadView, now: float, env: Environment) -> ev.RouteRequested | None:
    """Ask the router for the destination of a replacement of the latest attempt: once the
    fencer allowed it (`replacement-allowed` on record: strict / fast, DESIGN §7.4), after the
    retry backoff of a failed one (`replacement_not_before`), never for a workload that fails
    (`workload_failure`) and only once (`_replacement_due`). The fencer's reason (folded as
    `replacement_reason`) goes on the record."""
    latest = view.latest_attempt
    if latest is None or not _replacement_due(view, latest) or "replacement-allowed" not in latest.times:
        return None
    if workload_failure(view, now) is not None or now < replacement_not_before(view, latest, env.time_scale):
        return None  # in its retry backoff: `reconcile` requests it once due (`reconcile_due`)
    why = latest.replacement_reason or "allowed by the fencer"
    return _request_route(view, latest, now, f"replacing {latest.attempt_id} ({latest.status}): {why}", env)


def promote_request(view: WorkloadView, a: AttemptView, now: float) -> ev.PromoteRequested | None:
    """Ask the fencer to promote `a`'s outputs: once (none on record yet), for an attempt whose
    `succeeded` is folded. A stale attempt is asked too: the fencer refuses it and puts
    `promotion-rejected` on record (DESIGN §7.5), so who may publish stays the fencer's decision."""
    if a.status != "succeeded" or view.workload is None or a.promoted or "promote-requested" in a.times:
        return None
    return ev.PromoteRequested(event_id=_eid(a, "promote-requested"), output_path=a.output_path, **_about(view, a, now))


def completed(view: WorkloadView, now: float) -> ev.Completed | None:
    """The workload completes once an attempt is promoted, with the result the fencer recorded;
    never after another terminal event (a cancel or failure that ended it first keeps it)."""
    a = view.attempts.get(view.promoted_attempt) if view.promoted_attempt is not None else None
    if a is None or view.terminal or not view.result_path:
        return None
    return ev.Completed(
        event_id=event_id(view.workload_id, "completed"),
        workload_id=view.workload_id,
        at=now,
        attempt_id=a.attempt_id,
        result_path=view.result_path,
    )


def unknown_cancel(workload_id: str) -> RefuseMessage:
    """A cancel for an id no workload has: refused, bound to the cancel message itself.

    Filed under the message, not under the id it names: a cancel must not be able to mark an id
    (one that a submit may still claim) as anything.
    """
    if valid_token(workload_id):
        return RefuseMessage(f"cancel: unknown workload {workload_id}", claimed_workload_id=workload_id)
    return RefuseMessage(f"cancel: unknown workload {workload_id!r} (not a workload id)")


def to_stop(view: WorkloadView) -> list[AttemptView]:
    """Attempts a cancel must see confirmed gone before the workload is `cancelled`.

    Any that may still run (live, lost included), any failed one whose Job is not yet deleted,
    and any that succeeded but could still publish (not promoted, not fenced). Each of these is
    pursued by the fencer with a lease, so each is confirmed gone eventually, even on a cluster
    that never answers again. (A stale attempt is collected as an orphan, without a lease: a
    cancel does not wait for it.)
    """
    return [a for a in view.attempts.values() if _must_stop(a)]


def _must_stop(a: AttemptView) -> bool:
    """May `a` still run or publish, so that a cancel waits for it (`to_stop`)?"""
    return not a.gone and (
        a.live
        or a.status == "failed"
        or (a.status == "succeeded" and not a.promoted and not a.promotion_rejected and not a.fenced)
    )


def _cancel_complete(view: WorkloadView) -> bool:
    """Cancelled only once nothing can run or publish any more; a promoted result wins over a cancel."""
    return view.cancel_requested and not view.terminal and view.promoted_attempt is None and not to_stop(view)


def _cancelled(view: WorkloadView, now: float, reason: str) -> Emit:
    return Emit(
        ev.Cancelled(
            event_id=event_id(view.workload_id, "cancelled"),
            workload_id=view.workload_id,
            at=now,
            reason=reason,
        )
    )


def on_cancel(view: WorkloadView | None, workload_id: str, reason: str, now: float) -> list[Action]:
    """`gpuorch cancel` in any state: the cancel goes on record (`cancel-requested`, with its
    reason); what it needs then is `reconcile`'s to decide once that is folded: a fence for every
    attempt that may still run or publish (`to_stop`), `cancelled` once all are confirmed gone.

    Unknown id: `rejected`. Finished workload (or one whose result is already promoted): nothing.
    Idempotent: a cancel already on record asks nothing again (`reconcile` pursues it).
    """
    if view is None or (view.workload is None and not view.terminal):
        return [unknown_cancel(workload_id)]
    if view.terminal or view.promoted_attempt is not None or view.cancel_requested:
        return []
    return [
        Emit(
            ev.CancelRequested(
                event_id=event_id(workload_id, "cancel-requested"), workload_id=workload_id, at=now, reason=reason
            )
        )
    ]


def fence_reason(view: WorkloadView, a: AttemptView) -> str | None:
    """Why `a` must be fenced now (None: it need not be, or its fence is already asked: the fencer
    pursues it). Each case once, whichever event made it so:

    - it failed, or was lost (whatever the workload's state: a late one too);
    - the workload ended, or its cancel is under way, and `a` may still run or publish (`to_stop`;
      one created while the cancel was being decided, say);
    - the router's plan preempts it (`preemption-requested` on record, the router's reason) and it
      is still interruptible (declared preemptible, with a checkpoint: refused here too otherwise);
    - it is the latest attempt, fenced by the fencer itself (a second attempt at one epoch) and not
      promoted: its replacement needs the fencer's verdict, which a fence request asks for.
    """
    wl = view.workload
    if wl is None or a.gone or "fence-requested" in a.times:
        return None
    if a.status == "failed":
        return f"attempt failed: {a.reason}"
    if a.status == "lost":
        return f"lost: {a.reason}"
    if view.terminal:
        return f"cancel: attempt created after the workload was {view.status}" if a.live else None
    if view.cancel_requested:
        if not _must_stop(a):
            return None
        after = a.times.get("created", 0.0) > view.times.get("cancel-requested", math.inf)
        return "cancel: attempt created after a cancel was requested" if after else f"cancel: {view.cancel_reason}"
    if "preemption-requested" in a.times and a.live and not a.fenced:
        return a.reason if interruptible(wl) else None
    latest = view.latest_attempt
    if latest is a and needs_replacement(a) and a.status != "succeeded":
        return f"the fencer fenced it while {a.status}: its replacement needs the fencer's verdict"
    return None


def _promoted_job(view: WorkloadView, why: str) -> list[Action]:
    """Delete the promoted attempt's Job: its outputs are published, nothing of it is needed. A Job
    that is gone already is a no-op to delete, so asking again is harmless."""
    a = view.attempts.get(view.promoted_attempt) if view.promoted_attempt is not None else None
    return [DeleteJob(a.cluster, a.namespace, a.job_name, why)] if a is not None else []


def reconcile(
    view: WorkloadView, now: float, env: Environment, traceparent: str | None = None
) -> list[Action]:
    """Level-triggered: what the workload's state still needs, whatever events were missed. The
    one decision function for a workload's next steps: the dispatcher folds each event and then
    calls this (the event path), calls it periodically for what is due by time alone (a
    replacement after its retry backoff), and on taking a workload over (its owner died).

    Fences (`fence_reason`), promotion requests (`promote_request`), `completed` and the promoted
    attempt's Job deletion (`_promoted_job`), the cancel's end (`cancelled` once every attempt is
    confirmed gone), the routed attempt's Job (`on_routed`), `workload-failed`
    (`workload_failure`) and the replacement's route request (`replacement_request`).

    Every action carries its deterministic event id, and nothing the state already shows is
    asked again, so calling it any number of times changes nothing once the workload is where it
    should be; an effect published but not folded back yet is asked again with the same id,
    which the bus drops as a duplicate (`Nats-Msg-Id`).
    """
    wl = view.workload
    if wl is None:
        return []
    out: list[Action] = [
        _fence(view, a, now, why, env.time_scale)
        for a in view.attempts.values()
        if (why := fence_reason(view, a)) is not None
    ]
    if view.terminal:  # a promotion that came after the workload ended otherwise: only its Job goes
        late = view.status != "completed" and view.promoted_attempt is not None
        return out + (_promoted_job(view, f"promoted after the workload was {view.status}") if late else [])
    out.extend(Emit(p) for a in view.attempts.values() if (p := promote_request(view, a, now)) is not None)
    if (done := completed(view, now)) is not None:
        out.extend([Emit(done), *_promoted_job(view, "completed and promoted")])
    if view.cancel_requested:
        if _cancel_complete(view):
            # the cancel's own reason when it stopped nothing (as the workload's final reason)
            why = "cancelled; every attempt confirmed gone" if view.attempts else view.cancel_reason or "cancelled"
            out.append(_cancelled(view, now, why))
        return out
    latest = view.latest_attempt
    wanted = max(view.routed_attempts | {0})
    if (
        wanted
        and (latest is None or latest.number < wanted)
        and view.decision is not None
        and view.decision.cluster
    ):
        routed = ev.Routed(
            event_id=event_id(view.workload_id, "routed", wanted),
            workload_id=view.workload_id,
            at=now,
            decision=view.decision,
            attempt_number=wanted,
        )
        out.extend(on_routed(view, routed, now, env, traceparent))
    elif latest is not None and needs_replacement(latest):
        step = workload_failure(view, now) or replacement_request(view, now, env)
        if step is not None:
            out.append(Emit(step))
    return out


def reconcile_due(view: WorkloadView, env: Environment) -> float:
    """When `reconcile`'s answer for this state can next change by the clock alone (Unix time;
    `math.inf`: only a new event can change it). Its one clock rule is the retry backoff before a
    replacement is requested; a caller that got nothing from `reconcile` need not ask again for
    the same state before then (the dispatcher's upkeep skips such workloads)."""
    latest = view.latest_attempt
    if (
        view.workload is None
        or view.terminal
        or view.cancel_requested
        or latest is None
        or "replacement-allowed" not in latest.times
        or not _replacement_due(view, latest)
    ):
        return math.inf
    return replacement_not_before(view, latest, env.time_scale)


# --- one dispatch owner per workload: an owner record per workload, a lease per instance
#
# The owners bucket holds, per workload, the `OwnerRecord` naming the instance (and its lease
# generation) that claimed it, written once by compare-and-set; and per dispatcher instance one
# `InstanceLease`, renewed by that instance. A workload changes owner only once the generation
# its record names is over: superseded, or marked ended by someone who saw its lease run out
# (a compare-and-set on the lease key, so that it races with the owner's own renewal and
# exactly one of the two wins). Both are facts that stay true, so a stale read of them is safe.


def needs_owner(view: WorkloadView) -> bool:
    """Must a dispatcher own this workload (claim it at start-up, take it over from a dead owner)?
    One that goes on and has something for the dispatcher: routed (its attempts are the owner's
    to create and follow), or a cancel under way (its fences and its end are the owner's)."""
    return not view.terminal and view.workload is not None and bool(view.routed_attempts or view.cancel_requested)


def instance_alive(lease: InstanceLease | None, now: float) -> bool:
    """Is this instance lease live: written, not marked ended, not run out by `now`?"""
    return lease is not None and not lease.ended and lease.expires_at > now


def generation_over(lease: InstanceLease | None, generation: int) -> bool:
    """Has generation `generation` of the instance whose lease (as last read) is `lease` ended
    for good, so that the workloads it claimed may be claimed by anyone?

    Yes when its lease moved on to a later generation, when it is that generation marked ended,
    and for a record with no generation (0: from before instance leases). No for a lease that has
    only run out (`end_lapsed` first marks it, racing with a late renewal) and for one not read
    (None): a False may be stale and only delays a takeover; a True never becomes false."""
    if generation <= 0:
        return True
    return lease is not None and (
        lease.generation > generation or (lease.generation == generation and lease.ended)
    )


def end_lapsed(
    lease: InstanceLease | None, instance: str, generation: int, now: float
) -> InstanceLease | None:
    """The write that ends an instance's lease that ran out (or is missing while records name
    its `generation`), to be made by compare-and-set on the revision read; None when the lease
    is live or already over. Once it is written, its workloads may be claimed."""
    if lease is None:
        return (
            InstanceLease(instance=instance, generation=generation, expires_at=now, ended=True)
            if generation > 0
            else None
        )
    if lease.ended or instance_alive(lease, now):
        return None
    return msgspec.structs.replace(lease, ended=True)


def renewed(lease: InstanceLease | None, me: str, now: float, ttl: float) -> InstanceLease:
    """This instance's next lease, from its lease as it is in the bucket: the same generation
    renewed for `ttl` (even if it ran out: nobody ended it, so nobody took anything over); the next
    generation when it was ended; the first when there is none."""
    if lease is None:
        return InstanceLease(instance=me, generation=1, expires_at=now + ttl)
    generation = lease.generation + 1 if lease.ended else lease.generation
    return InstanceLease(instance=me, generation=generation, expires_at=now + ttl)


def claim(
    current: OwnerRecord | None, me: str, generation: int, over: Callable[[str, int], bool]
) -> OwnerRecord | None:
    """One dispatch owner per workload: the record that makes it ours, or None (another instance
    whose generation is not over owns it). `current` itself when it already names us at our
    `generation` (nothing to write); else a new record, to be written by compare-and-set, when
    there is no record or the generation it names is `over(instance, generation)`."""
    if current is not None and current.owner == me and current.generation == generation:
        return current
    if current is None or over(current.owner, current.generation):
        return OwnerRecord(owner=me, generation=generation)
    return None


# --- what the shell watches, and when a cancel must wait: rules the shell and the simulation follow


def watched(
    workloads: Iterable[WorkloadView], owned: Container[str]
) -> dict[str, list[tuple[WorkloadView, AttemptView]]]:
    """The attempts to observe, per cluster: those of workloads this dispatcher owns that are
    live, or lost and not yet confirmed gone (a lost attempt may come back: it is fenced, and
    its pods seen again are reported)."""
    out: dict[str, list[tuple[WorkloadView, AttemptView]]] = {}
    for view in workloads:
        if view.workload_id not in owned:
            continue
        for a in view.attempts.values():
            if a.live or (a.status == "lost" and not a.gone):
                out.setdefault(a.cluster, []).append((view, a))
    return out


UNKNOWN_CANCEL_RETRIES = 3  # deliveries of a cancel for an id nobody knows before it is refused


@dataclass(frozen=True)
class Wait:
    """Not now: hand the message back for redelivery after `delay` seconds."""

    delay: float
    reason: str


def cancel_wait(
    view: WorkloadView | None,
    *,
    creating: bool,
    in_log: bool,
    delivered: int,
    unknown_retries: int = UNKNOWN_CANCEL_RETRIES,
) -> Wait | None:
    """Whether a cancel must wait before `on_cancel` decides it. `creating`: a Job of this
    workload is being created, or was created and its `attempt-created` is not in our view yet
    (decide once the attempt is known, or its Job would be missed). `in_log`: the log holds the
    workload's `submitted` though our view has not applied it. An id nobody knows is given
    `unknown_retries` deliveries (its submit may still be on its way), then `on_cancel` refuses it."""
    if creating:
        return Wait(0.5, "an attempt of this workload is being created")
    if view is None or view.workload is None:
        if in_log:
            return Wait(0.5, "our projection is behind the event log")
        if delivered < unknown_retries:
            return Wait(1.0, "unknown workload: its submit may still be on its way")
    return None


# --- staging measurements (issue 28: the estimate's bandwidth from measured staging) -------------

#: A stage container's record is its termination message (`gpuorch.workloads.agent.stage_message`):
#: written by a pod, so not trusted. Bounds on what is believed.
STAGE_RECORD_LIMIT: Final = podpath.TERMINATION_MESSAGE_LIMIT  # bytes (what Kubernetes keeps)
MAX_STAGE_BYTES: Final = 1 << 50  # 1 PiB
MAX_STAGE_SIZE_GB: Final = 1e6
MAX_STAGE_SECONDS: Final = 1e8  # simulated seconds (three years)
_LOCATION_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,127}")


@dataclass(frozen=True, slots=True)
class StageMeasurement:
    """One staging of a dataset over a link into a cluster's cache: from which location (the
    store name), how much, and how long the simulated link took (what the router's copy-time
    estimate is in)."""

    location: str
    bytes: int
    size_gb: float
    simulated_seconds: float

    def doc(self) -> dict[str, Any]:
        return {"location": self.location, "bytes": self.bytes, "size_gb": self.size_gb, "simulated_seconds": self.simulated_seconds}


def _number(v: object, *, low: float, high: float, positive: bool) -> float | None:
    """A finite int/float (never a bool) in [low, high] (> low when `positive`), or None."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    x = float(v)
    if not math.isfinite(x) or x < low or x > high or (positive and x <= low):
        return None
    return x


def parse_stage_record(message: object, ref: str) -> StageMeasurement | None:
    """The measurement in a stage container's termination message, for dataset `ref`; None for
    anything else: not a string, over the limit, not a JSON object, a cache hit, another
    dataset, a location name that is not one, sizes or times that are not finite, are negative
    or zero (seconds, size) or out of bounds."""
    if not isinstance(message, str) or len(message.encode("utf-8", errors="replace")) > STAGE_RECORD_LIMIT:
        return None
    try:
        doc = msgspec.json.decode(message)
    except msgspec.DecodeError:
        return None
    if not isinstance(doc, dict) or doc.get("cache_hit") is not False or doc.get("dataset") != ref:
        return None
    location = doc.get("store")
    if not isinstance(location, str) or not _LOCATION_NAME.fullmatch(location):
        return None
    size = doc.get("bytes")
    if isinstance(size, bool) or not isinstance(size, int) or not 0 <= size <= MAX_STAGE_BYTES:
        return None
    size_gb = _number(doc.get("size_gb"), low=0.0, high=MAX_STAGE_SIZE_GB, positive=True)
    seconds = _number(doc.get("simulated_seconds"), low=0.0, high=MAX_STAGE_SECONDS, positive=True)
    if size_gb is None or seconds is None:
        return None
    return StageMeasurement(location, size, size_gb, seconds)


def stage_measurements(pods: Iterable[Mapping[str, Any]], refs: Sequence[str]) -> dict[str, StageMeasurement]:
    """ref -> a measurement of its staging, from the attempt's pods: init container ``stage-N``
    (the Job stages input N there) that terminated with exit 0 and whose message parses
    (`parse_stage_record`). Of several pods (workers), the first that copied."""
    out: dict[str, StageMeasurement] = {}
    for pod in pods:
        for cs in (pod.get("status") or {}).get("initContainerStatuses") or []:
            if not isinstance(cs, Mapping):
                continue
            name = cs.get("name")
            if not isinstance(name, str) or not name.startswith("stage-") or not name[6:].isdigit():
                continue
            n = int(name[6:])
            if n >= len(refs) or refs[n] in out:
                continue
            term = (cs.get("state") or {}).get("terminated") or {}
            if not isinstance(term, Mapping) or term.get("exitCode") != 0:
                continue
            m = parse_stage_record(term.get("message"), refs[n])
            if m is not None:
                out[refs[n]] = m
    return out
