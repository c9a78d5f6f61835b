"""The dispatcher's pure decisions: the Job it emits, attempts, retry vs resume, cancellation."""

from __future__ import annotations

import math

import kubernetes_validate
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuorch import liveness
from gpuorch.projection import Projection
from gpuorch_dispatcher import core
from gpuorch_proto import ClusterRegistryEntry, RoutingDecision, Workload, workload_from_obj
from gpuorch_proto import events as ev
from gpuorch_proto.inventory import QueueRegistry
from gpuorch_proto.storage import StoreConfig
from gpuorch_proto.subjects import valid_token

DIGEST = "example.org/train@sha256:" + "ab" * 32
W = "train-0123456789"


def wl(**spec: object) -> Workload:
    base: dict[str, object] = {
        "image": DIGEST,
        "command": ["python", "-m", "gpuorch.workloads.train"],
        "resources": {"gpus": 8, "gpu_memory_gib": 80},
    }
    base.update(spec)
    return workload_from_obj({"metadata": {"name": "train", "owner": "alice"}, "spec": base})


def env(**registry: ClusterRegistryEntry) -> core.Environment:
    reg = registry or {
        "primary": ClusterRegistryEntry(artifact_stores=["prod", "scratch"], data_locations=["primary-nfs"])
    }
    return core.Environment(
        registry=reg,
        stores={"prod": StoreConfig(url="s3://bucket/prod"), "scratch": StoreConfig(url="s3://bucket/scratch"), "primary-nfs": StoreConfig(url="s3://lake/primary-nfs")},
        time_scale=600,
    )


def job(
    w: Workload, cluster: str = "primary", e: core.Environment | None = None, queue: str | None = None
) -> dict:
    return core.build_job(
        w,
        W,
        f"{W}-a1",
        1,
        cluster,
        queue,
        e or env(),
        resume_from=None,
    )


def validate(manifest: dict) -> None:
    kubernetes_validate.validate(manifest, "1.33.0", strict=True)


def test_job_labels_whole_gpu_limits_and_env() -> None:
    m = job(wl(output={"store": "prod"}))
    validate(m)
    labels = m["metadata"]["labels"]
    assert (
        labels["gpuorch.io/workload"] == W
        and labels["gpuorch.io/attempt"] == f"{W}-a1"
        and labels["gpuorch.io/epoch"] == "1"
    )
    c = m["spec"]["template"]["spec"]["containers"][0]
    assert c["resources"]["limits"]["nvidia.com/gpu"] == "8"
    assert c["resources"]["limits"] == c["resources"]["requests"]
    envs = {e["name"]: e["value"] for e in c["env"]}
    assert envs["GPUORCH_ATTEMPT_ID"] == f"{W}-a1" and envs["GPUORCH_EPOCH"] == "1"
    # the program writes local directories of its pod; the URLs say where gpuorch's agent puts them
    assert envs["GPUORCH_OUTPUT_DIR"] == "$(GPUORCH_POD_ROOT)/gpuorch/out"
    assert envs["GPUORCH_CHECKPOINT_DIR"] == "$(GPUORCH_POD_ROOT)/gpuorch/checkpoints"
    assert envs["GPUORCH_OUTPUT_URL"] == f"s3://bucket/prod/{W}/attempts/{W}-a1"
    assert envs["GPUORCH_CHECKPOINT_URL"] == f"s3://bucket/prod/{W}/attempts/{W}-a1/checkpoints"
    (agent,) = m["spec"]["template"]["spec"]["initContainers"]
    assert agent["name"] == "agent" and agent["restartPolicy"] == "Always", "a native sidecar uploads them"
    assert agent["image"] != c["image"] and agent["args"][:5] == ["sync", "--store", "prod", "--prefix", f"{W}/attempts/{W}-a1"]
    assert {"name": "GPUORCH_STORE_PROD_URL", "value": "s3://bucket/prod"} in agent["env"]
    assert agent["securityContext"] == c["securityContext"]
    assert m["spec"]["backoffLimit"] == 0
    assert "schedulerName" not in m["spec"]["template"]["spec"]
    assert "kueue.x-k8s.io/queue-name" not in labels
    pod = m["spec"]["template"]["spec"]
    # what the restricted Pod Security Standard of the workload namespace enforces
    assert pod["automountServiceAccountToken"] is False and pod["securityContext"]["runAsNonRoot"] is True
    assert c["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
        "runAsNonRoot": True,
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def test_multi_worker_gang_is_indexed_and_marked() -> None:
    m = job(wl(resources={"gpus": 4, "workers": 3}))
    validate(m)
    assert m["spec"]["completionMode"] == "Indexed"
    assert m["spec"]["parallelism"] == m["spec"]["completions"] == 3
    assert m["spec"]["template"]["metadata"]["annotations"]["gpuorch.io/gang"] == "true"


def test_one_node_gang_is_one_pod_with_all_gpus() -> None:
    m = job(wl(resources={"gpus": 4, "workers": 2, "same_node": True}))
    validate(m)
    assert m["spec"]["parallelism"] == 1
    assert m["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "8"


def test_selectors_tolerations_and_memory_affinity() -> None:
    m = job(
        wl(
            requirements={
                "pools": ["train"],
                "node_selector": {"zone": "a"},
                "tolerations": [
                    {"key": "gpuorch.io/short-only", "operator": "Exists", "effect": "NoSchedule"}
                ],
            }
        )
    )
    validate(m)
    pod = m["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"zone": "a"}  # what the workload wrote, unchanged
    assert pod["tolerations"] == [
        {"key": "gpuorch.io/short-only", "operator": "Exists", "effect": "NoSchedule"}
    ]
    expr = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ][0]["matchExpressions"]
    assert {"key": "gpuorch.io/pool", "operator": "In", "values": ["train"]} in expr
    # 80 GiB within the router's 2 % tolerance: an H100 80GB node (label 81559 MiB) is accepted
    assert {"key": "nvidia.com/gpu.memory", "operator": "Gt", "values": ["80281"]} in expr


@pytest.mark.parametrize(
    ("admission", "scheduler", "kueue_label", "suspended"),
    [
        pytest.param("none", None, False, False, id="plain-cluster"),
        pytest.param("kueue", None, True, True, id="kueue-gets-queue-label-and-suspend"),
        pytest.param("kai", "kai-scheduler", False, False, id="kai-gets-schedulerName"),
        pytest.param("volcano", "volcano", False, False, id="volcano-gets-schedulerName"),
    ],
)
def test_admission_integration_only_where_the_cluster_has_it(
    admission: str, scheduler: str | None, kueue_label: bool, suspended: bool
) -> None:
    e = env(c=ClusterRegistryEntry(admission=admission, queues=[QueueRegistry(name="training")]))  # type: ignore[arg-type]
    m = job(wl(), cluster="c", e=e, queue="training")
    validate(m)
    assert m["spec"]["template"]["spec"].get("schedulerName") == scheduler
    assert ("kueue.x-k8s.io/queue-name" in m["metadata"]["labels"]) == kueue_label
    assert m["spec"].get("suspend", False) == suspended


def test_input_staged_into_the_cache_from_the_location_over_the_link_or_locally() -> None:
    w = wl(inputs=[{"ref": "imagenet@v3", "size_gb": 1350, "locations": ["primary-nfs"]}])
    e = env(
        primary=ClusterRegistryEntry(data_locations=["primary-nfs"]),
        spare=ClusterRegistryEntry(bandwidth_mbps={"primary-nfs": 125}),
    )
    local = job(w, "primary", e)
    validate(local)
    pod = local["spec"]["template"]["spec"]
    stage = pod["initContainers"][0]
    assert stage["name"] == "stage-0" and stage["command"][-1] == "gpuorch.workloads.agent"
    assert stage["args"][:5] == ["stage", "--store", "primary-nfs", "--dataset", "imagenet@v3"]
    assert "--bandwidth-mbps" not in stage["args"], "the cluster's own location: no link to simulate"
    assert {"name": "GPUORCH_STORE_PRIMARY_NFS_URL", "value": "s3://lake/primary-nfs"} in stage["env"]
    assert {"name": "GPUORCH_INPUT_IMAGENET", "value": "$(GPUORCH_POD_ROOT)/gpuorch-cache/imagenet@v3"} in pod["containers"][0]["env"]
    assert {"name": "gpuorch-cache", "persistentVolumeClaim": {"claimName": "gpuorch-cache"}} in pod["volumes"]
    assert {"name": "gpuorch-cache", "mountPath": "/gpuorch-cache", "readOnly": True} in pod["containers"][0]["volumeMounts"]
    remote = job(w, "spare", e)
    validate(remote)
    init = remote["spec"]["template"]["spec"]["initContainers"][0]
    assert init["name"] == "stage-0" and "imagenet@v3" in init["args"]
    assert init["args"][init["args"].index("--bandwidth-mbps") + 1] == "125"
    cached = job(w, "primary", env(primary=ClusterRegistryEntry(datasets_cached=["imagenet@v3"], cache_claim="fast-cache")))
    pod = cached["spec"]["template"]["spec"]
    # said to be cached: still checked by the agent (a hit reads one record; an emptied cache is refilled)
    assert [c["name"] for c in pod["initContainers"]] == ["stage-0", "agent"]
    assert {"name": "gpuorch-cache", "persistentVolumeClaim": {"claimName": "fast-cache"}} in pod["volumes"]


def routed(n: int, cluster: str = "primary") -> ev.Routed:
    d = RoutingDecision(workload_id=W, decided_at=1.0, outcome="routed", cluster=cluster, summary="because")
    return ev.Routed(workload_id=W, at=1.0, decision=d, attempt_number=n, event_id=f"{W}.routed.{n}")


def history(*events: ev.Base) -> Projection:
    p = Projection()
    p.apply(
        ev.Submitted(
            workload_id=W,
            at=0.0,
            workload=wl(checkpoint={"path": "ckpt", "portable": True}, output={"store": "prod"}),
        ),
        1,
    )
    for i, e in enumerate(events, start=2):
        p.apply(e, i)  # type: ignore[arg-type]
    return p


def test_routed_creates_exactly_one_attempt() -> None:
    p = history()
    acts = core.on_routed(p.workloads[W], routed(1), 2.0, env())
    assert len(acts) == 1 and isinstance(acts[0], core.CreateJob)
    created = acts[0].created
    assert created.attempt_id == f"{W}-a1" and created.epoch == 1 and created.mode == "fresh"
    assert created.output_path == f"s3://bucket/prod/{W}/attempts/{W}-a1"
    assert created.checkpoint_path == f"s3://bucket/prod/{W}/attempts/{W}-a1/checkpoints"
    p.apply(created, 3)
    assert (
        core.on_routed(p.workloads[W], routed(1), 3.0, env()) == []
    )  # redelivered decision: no second attempt


def _created(n: int, epoch: int, cluster: str = "primary") -> ev.AttemptCreated:
    return ev.AttemptCreated(
        workload_id=W,
        at=1.0,
        attempt_id=f"{W}-a{n}",
        epoch=epoch,
        cluster=cluster,
        attempt_number=n,
        job_name=f"{W}-a{n}",
        output_path="/o",
        checkpoint_path=f"/c{n}",
    )


def test_lost_attempt_is_fenced_and_strict_waits_for_confirmation() -> None:
    a1 = f"{W}-a1"
    p = history(
        routed(1),
        _created(1, 1),
        ev.Lost(workload_id=W, at=2.0, attempt_id=a1, epoch=1, cluster="primary", reason="partition"),
    )
    v = p.workloads[W]
    acts = core.reconcile(v, 2.0, env())
    assert [type(a.event) for a in acts if isinstance(a, core.Emit)] == [ev.FenceRequested]
    fence_req = next(a.event for a in acts if isinstance(a, core.Emit))
    assert isinstance(fence_req, ev.FenceRequested) and not fence_req.stopped  # its pods may still run
    assert fence_req.reason == "lost: partition"
    p.apply(fence_req, 49)  # the bus delivers it back: asked once
    fenced = ev.Fenced(workload_id=W, at=3.0, attempt_id=a1, epoch=1, cluster="primary", new_epoch=2)
    p.apply(fenced, 50)
    assert core.reconcile(v, 3.0, env()) == []  # the fencer decides when: not yet
    confirmed = ev.CancelConfirmed(
        workload_id=W, at=4.0, attempt_id=a1, epoch=1, cluster="primary", how="lease-expired"
    )
    p.apply(confirmed, 51)
    assert core.reconcile(v, 4.0, env()) == []
    allowed = ev.ReplacementAllowed(
        workload_id=W, at=4.0, attempt_id=a1, epoch=1, cluster="primary", how="lease-expired"
    )
    p.apply(allowed, 52)
    acts = core.reconcile(v, 4.0, env())
    assert len(acts) == 1 and isinstance(acts[0], core.Emit) and isinstance(acts[0].event, ev.RouteRequested)
    assert acts[0].event.attempt_number == 2 and acts[0].event.exclude == ["primary"]


def test_replacement_resumes_from_a_portable_checkpoint() -> None:
    a1 = f"{W}-a1"
    p = history(
        routed(1),
        _created(1, 1),
        ev.Lost(workload_id=W, at=2.0, attempt_id=a1, epoch=1, cluster="primary", reason="x"),
        ev.Fenced(workload_id=W, at=3.0, attempt_id=a1, epoch=1, cluster="primary", new_epoch=2),
    )
    e = env(
        primary=ClusterRegistryEntry(artifact_stores=["prod"]),
        spare=ClusterRegistryEntry(artifact_stores=["prod"]),
    )
    ck = f"s3://bucket/prod/{W}/attempts/{a1}/checkpoints/step-000040.npz"
    e = core.Environment(**{**e.__dict__, "checkpoints": {a1: ck}})
    acts = core.on_routed(p.workloads[W], routed(2, "spare"), 5.0, e)
    c = acts[0]
    assert isinstance(c, core.CreateJob)
    assert c.created.mode == "resume" and c.created.resume_from == ck and c.created.epoch == 2
    pod = c.manifest["spec"]["template"]["spec"]
    envs = {x["name"]: x["value"] for x in pod["containers"][0]["env"]}
    assert envs["GPUORCH_RESUME_FROM"] == "$(GPUORCH_POD_ROOT)/gpuorch/resume/step-000040.npz" and envs["GPUORCH_EPOCH"] == "2"
    fetch = next(x for x in pod["initContainers"] if x["name"] == "fetch")  # the agent reads it from the store
    assert fetch["args"] == ["fetch", "--store", "prod", "--key", f"{W}/attempts/{a1}/checkpoints/step-000040.npz",
                             "--to", "/gpuorch/resume/step-000040.npz"]  # fmt: skip


def test_no_resume_where_the_checkpoint_store_is_unreachable() -> None:
    a1 = f"{W}-a1"
    p = history(routed(1), _created(1, 1))
    e = env(
        primary=ClusterRegistryEntry(artifact_stores=["prod"]),
        short=ClusterRegistryEntry(artifact_stores=["scratch"]),
    )
    e = core.Environment(**{**e.__dict__, "checkpoints": {a1: "/c1/ckpt.npz"}})
    mode, path, why = core.choose_mode(p.workloads[W], "short", e)
    assert (mode, path) == ("retry", None) and "cannot read checkpoint store 'prod'" in why


def test_a_complete_job_whose_pods_are_not_seen_yet_was_admitted_and_ran() -> None:
    """The Job's watch may say Complete before the pods' watch says where its pod ran: the
    lifecycle still has admitted, running, succeeded (the report reads the admission)."""
    p = history(routed(1), _created(1, 1))
    v = p.workloads[W]
    obs = core.JobObservation(exists=True, scheduled=0, running=0, complete=True)
    emitted = [a.event for a in core.on_observation(v, v.attempts[f"{W}-a1"], obs, 3.0) if isinstance(a, core.Emit)]
    assert [type(e) for e in emitted] == [ev.Admitted, ev.Running, ev.Succeeded]
    for i, e in enumerate(emitted, start=10):
        p.apply(e, i)  # type: ignore[arg-type]
    # its promotion is `reconcile`'s to ask, once the `succeeded` is folded
    assert _kinds(core.reconcile(v, 3.5, env())) == [ev.PromoteRequested]


def test_permanent_exit_code_fails_the_workload() -> None:
    a1 = f"{W}-a1"
    p = history(routed(1), _created(1, 1))
    v = p.workloads[W]
    obs = core.JobObservation(exists=True, scheduled=1, running=0, failed=True, exit_code=2, reason="Failed")
    emitted = [a.event for a in core.on_observation(v, v.attempts[a1], obs, 3.0) if isinstance(a, core.Emit)]
    assert [type(e) for e in emitted] == [ev.Admitted, ev.Failed]
    failed = emitted[1]
    assert isinstance(failed, ev.Failed) and not failed.retryable
    p.apply(failed, 10)
    kinds = [type(a.event) for a in core.reconcile(v, 3.0, env()) if isinstance(a, core.Emit)]
    assert ev.WorkloadFailed in kinds and ev.FenceRequested in kinds


def _then(p: Projection, actions: list[core.Action], now: float) -> list[core.Action]:
    """What `reconcile` asks once these actions' events are folded (as the shell's event path)."""
    v = p.workloads[W]
    for i, e in enumerate(_emitted(actions), start=v.last_seq + 1):
        p.apply(e, i)  # type: ignore[arg-type]
    return core.reconcile(v, now, env())


def test_cancel_in_every_state() -> None:
    """The command puts the cancel on record; `reconcile` (once it is folded) fences what may
    still run, or ends the workload when nothing can."""
    waiting = history()
    acts = core.on_cancel(waiting.workloads[W], W, "user", 1.0)
    assert _kinds(acts) == [ev.CancelRequested] and acts[0].event.reason == "user"  # type: ignore[union-attr]
    (cancelled,) = _emitted(_then(waiting, acts, 1.5))
    assert isinstance(cancelled, ev.Cancelled) and cancelled.reason == "user", "its own reason: it stopped nothing"
    running = history(routed(1), _created(1, 1))
    acts = core.on_cancel(running.workloads[W], W, "user", 1.0)
    assert _kinds(acts) == [ev.CancelRequested]
    (fence,) = _emitted(_then(running, acts, 1.5))
    assert isinstance(fence, ev.FenceRequested) and fence.reason == "cancel: user"
    assert isinstance(core.on_cancel(None, "nope-1", "user", 1.0)[0], core.RefuseMessage)


# --- cancellation in every state -----------------------------------------------------------------

A1 = f"{W}-a1"


def _emitted(actions: list[core.Action]) -> list[ev.Base]:
    return [a.event for a in actions if isinstance(a, core.Emit)]


def _kinds(actions: list[core.Action]) -> list[type]:
    return [type(e) for e in _emitted(actions)]


def _lost(n: int = 1) -> ev.Lost:
    return ev.Lost(
        workload_id=W, at=2.0, attempt_id=f"{W}-a{n}", epoch=1, cluster="primary", reason="partition"
    )


def _fence_req(n: int = 1, at: float = 2.0) -> ev.FenceRequested:
    return ev.FenceRequested(
        workload_id=W,
        at=at,
        attempt_id=f"{W}-a{n}",
        epoch=1,
        cluster="primary",
        reason="x",
        lease_expires_at=at + 60,
    )


def _fenced(n: int = 1, new_epoch: int = 2, at: float = 3.0) -> ev.Fenced:
    return ev.Fenced(
        workload_id=W, at=at, attempt_id=f"{W}-a{n}", epoch=1, cluster="primary", new_epoch=new_epoch
    )


def _confirmed(n: int = 1, how: str = "deleted", at: float = 4.0) -> ev.CancelConfirmed:
    return ev.CancelConfirmed(
        workload_id=W, at=at, attempt_id=f"{W}-a{n}", epoch=1, cluster="primary", how=how
    )  # type: ignore[arg-type]


def _allowed(n: int = 1, how: str = "stopped", at: float = 3.0, epoch: int = 1) -> ev.ReplacementAllowed:
    """The fencer's verdict that a replacement of attempt `n` may start."""
    return ev.ReplacementAllowed(
        workload_id=W, at=at, attempt_id=f"{W}-a{n}", epoch=epoch, cluster="primary", how=how, reason=how
    )  # type: ignore[arg-type]


def _failed(n: int = 1, at: float = 100.0, code: int = 3) -> ev.Failed:
    return ev.Failed(
        workload_id=W,
        at=at,
        attempt_id=f"{W}-a{n}",
        epoch=n,
        cluster="primary",
        exit_code=code,
        reason="boom",
    )


def _cancel_requested() -> ev.CancelRequested:
    return ev.CancelRequested(workload_id=W, at=5.0, reason="user")


def test_cancel_of_a_lost_attempt_waits_for_its_confirmation_and_asks_no_second_fence() -> None:
    p = history(routed(1), _created(1, 1), _lost(), _fence_req(), _fenced())
    v = p.workloads[W]
    acts = core.on_cancel(v, W, "user", 5.0)
    assert _kinds(acts) == [ev.CancelRequested], (
        "already fenced and pursued: no new fence, and not cancelled yet"
    )
    p.apply(_cancel_requested(), 20)
    assert core.reconcile(v, 6.0, env()) == [], "nothing more to ask while the lost attempt is unconfirmed"
    confirmed = _confirmed(how="deleted")
    p.apply(confirmed, 21)
    emitted = _emitted(core.reconcile(v, 7.0, env()))
    assert [type(e) for e in emitted] == [ev.Cancelled]
    assert "route-requested" not in [k for _, k, _ in v.history], (
        "never a replacement for a cancelled workload"
    )


def test_cancel_while_pending_fences_the_attempt_and_ends_on_its_confirmation() -> None:
    p = history(routed(1), _created(1, 1))
    v = p.workloads[W]
    acts = core.on_cancel(v, W, "user", 5.0)
    assert _kinds(acts) == [ev.CancelRequested]
    fence = _then(p, acts, 5.5)
    assert _kinds(fence) == [ev.FenceRequested]
    _then(p, fence, 5.6)
    assert core.on_cancel(v, W, "again", 6.0) == [], "a second cancel asks nothing new"
    assert core.reconcile(v, 6.0, env()) == []
    p.apply(_fenced(), 30)
    assert core.reconcile(v, 7.0, env()) == [], "no replacement after a cancel's fence"
    p.apply(_confirmed(), 31)
    assert _kinds(core.reconcile(v, 8.0, env())) == [ev.Cancelled]


def test_cancel_after_success_but_before_promotion_fences_the_attempt_and_a_promotion_still_wins() -> None:
    succeeded = ev.Succeeded(
        workload_id=W, at=3.0, attempt_id=A1, epoch=1, cluster="primary", output_path="/o"
    )
    p = history(routed(1), _created(1, 1), succeeded)
    v = p.workloads[W]
    acts = core.on_cancel(v, W, "user", 5.0)
    assert _kinds(acts) == [ev.CancelRequested]
    # it could still publish: fenced, and its promotion still asked (the fencer decides by CAS)
    assert _kinds(_then(p, acts, 5.5)) == [ev.FenceRequested, ev.PromoteRequested]
    promoted = ev.Promoted(
        workload_id=W, at=6.0, attempt_id=A1, epoch=1, cluster="primary", output_path="/o", result_path="/r"
    )
    p.apply(promoted, 21)
    acts = core.reconcile(v, 6.0, env())
    assert _kinds(acts) == [ev.Completed]
    assert [j.reason for j in acts if isinstance(j, core.DeleteJob)] == ["completed and promoted"]
    p.apply(_emitted(acts)[0], 22)  # type: ignore[arg-type]
    # the fencer then deletes its Job: that confirmation must not add a second terminal event
    p.apply(_confirmed(), 23)
    assert core.reconcile(v, 7.0, env()) == []
    assert core.on_cancel(v, W, "late", 8.0) == []


def test_attempt_created_after_a_cancel_is_fenced_at_once() -> None:
    p = history(routed(1))
    v = p.workloads[W]
    _then(p, _then(p, core.on_cancel(v, W, "user", 2.0), 2.0), 2.0)  # the cancel, then its end
    assert v.status == "cancelled"
    created = _created(1, 1)
    p.apply(created, 20)  # the Job was being created while the cancel was decided
    emitted = _emitted(core.reconcile(v, 3.0, env()))
    assert [type(e) for e in emitted] == [ev.FenceRequested] and emitted[0].attempt_id == A1  # type: ignore[attr-defined]


@pytest.mark.parametrize("workload_id", ["nope-1", "Not A Workload!"])
def test_cancel_of_an_unknown_id_is_refused_as_a_message(workload_id: str) -> None:
    (act,) = core.on_cancel(None, workload_id, "user", 1.0)
    # refused as a message: nothing is published under the id it names
    assert isinstance(act, core.RefuseMessage)
    assert "unknown workload" in act.reason and workload_id in act.reason
    assert act.claimed_workload_id == (workload_id if valid_token(workload_id) else None)


def test_cancel_of_a_finished_workload_does_nothing() -> None:
    completed = ev.Completed(workload_id=W, at=9.0, attempt_id=A1, result_path="/r")
    failed = ev.WorkloadFailed(workload_id=W, at=9.0, reason="permanent")
    for terminal in (completed, failed):
        p = history(routed(1), _created(1, 1), terminal)
        assert core.on_cancel(p.workloads[W], W, "user", 10.0) == []


# --- retry backoff -------------------------------------------------------------------------------


def backoff_history(*events: ev.Base, backoff: str = "30s", budget: int = 5) -> Projection:
    p = Projection()
    w = wl(retry={"backoff": backoff, "budget": budget})
    p.apply(ev.Submitted(workload_id=W, at=0.0, workload=w), 1)
    for i, e in enumerate(events, start=2):
        p.apply(e, i)  # type: ignore[arg-type]
    return p


def test_retry_backoff_doubles_per_failed_attempt_and_is_capped() -> None:
    w = wl(retry={"backoff": "30s"})
    assert [core.retry_backoff(w, n) for n in range(5)] == [0.0, 30.0, 60.0, 120.0, 240.0]
    assert core.retry_backoff(w, 100) == core.BACKOFF_CAP
    assert core.retry_backoff(wl(retry={"backoff": "2h"}), 3) == 7200.0, (
        "a backoff longer than the cap is the cap"
    )
    assert core.retry_backoff(wl(retry={"backoff": "0s"}), 3) == 0.0


def test_replacement_after_a_failure_waits_for_the_backoff_then_reconcile_requests_it() -> None:
    e = env()  # time scale 600: 30 simulated seconds are 0.05 real ones; use 1h to see it
    p = backoff_history(
        routed(1), _created(1, 1), _failed(1, at=100.0), _fence_req(1, at=100.1), backoff="1h"
    )
    v = p.workloads[W]
    not_before = core.replacement_not_before(v, v.attempts[A1], e.time_scale)
    assert not_before == pytest.approx(100.0 + 3600 / 600)
    p.apply(_fenced(1, at=100.2), 20)
    assert core.reconcile(v, not_before, e) == [], "not before the fencer's verdict"
    allowed = _allowed(1, at=100.2)
    p.apply(allowed, 22)
    assert core.reconcile(v, 100.2, e) == [], "not before failed.at + backoff"
    assert core.reconcile(v, not_before - 0.01, e) == []
    emitted = _emitted(core.reconcile(v, not_before, e))
    assert [type(x) for x in emitted] == [ev.RouteRequested]
    rr = emitted[0]
    assert (
        isinstance(rr, ev.RouteRequested)
        and rr.attempt_number == 2
        and rr.exclude == []
        and "backoff of 1h" in rr.reason
    )
    # the same request, whoever asks (the event path after the backoff, or a second reconcile)
    assert _emitted(core.reconcile(v, not_before + 1, e))[0].event_id == rr.event_id
    p.apply(rr, 23)
    assert core.reconcile(v, not_before + 5, e) == [], "asked once"


def two_failures() -> list[ev.Base]:
    """Attempt 1 failed and replaced, attempt 2 failed: its replacement is allowed, backoff due."""
    return [
        routed(1),
        _created(1, 1),
        _failed(1, at=100.0),
        _fence_req(1),
        _fenced(1),
        _allowed(1),
        ev.RouteRequested(workload_id=W, at=101.0, attempt_number=2),
        routed(2),
        _created(2, 2),
        _failed(2, at=200.0),
        _fence_req(2, at=200.0),
        _fenced(2, new_epoch=3, at=200.1),
        _allowed(2, at=200.1, epoch=2),
    ]


def test_second_failure_backs_off_twice_as_long() -> None:
    e = env()
    p = backoff_history(
        *two_failures(),
        backoff="10m",
    )
    v = p.workloads[W]
    assert core.replacement_not_before(v, v.attempts[A1], e.time_scale) == pytest.approx(100.0 + 600 / 600)
    assert core.replacement_not_before(v, v.attempts[f"{W}-a2"], e.time_scale) == pytest.approx(
        200.0 + 2 * 600 / 600
    )
    assert core.reconcile(v, 201.9, e) == []
    emitted = _emitted(core.reconcile(v, 202.0, e))
    assert [type(x) for x in emitted] == [ev.RouteRequested] and emitted[0].attempt_number == 3  # type: ignore[attr-defined]


def test_a_lost_attempt_is_replaced_without_backoff() -> None:
    p = backoff_history(routed(1), _created(1, 1), _lost(), _fence_req(), backoff="10h")
    v = p.workloads[W]
    assert core.replacement_not_before(v, v.attempts[A1], 600) == 0.0
    p.apply(_fenced(), 20)
    p.apply(_confirmed(how="lease-expired"), 21)
    p.apply(_allowed(how="lease-expired"), 22)
    assert _kinds(core.reconcile(v, 3.0, env())) == [ev.RouteRequested]


def failed_and_gone() -> list[ev.Base]:
    """Attempt 1 failed, fenced and confirmed gone: its replacement waits for the backoff."""
    return [routed(1), _created(1, 1), _failed(1, at=100.0), _fence_req(1), _fenced(1), _confirmed(1, at=100.5)]


def test_cancel_during_backoff_requests_no_replacement() -> None:
    p = backoff_history(*failed_and_gone(), backoff="1h")
    v = p.workloads[W]
    acts = core.on_cancel(v, W, "user", 101.0)
    assert _kinds(acts) == [ev.CancelRequested]
    ended = _then(p, acts, 101.5)
    assert _kinds(ended) == [ev.Cancelled], "the failed attempt is already confirmed gone"
    assert _then(p, ended, 1000.0) == []


def test_reconcile_fails_the_workload_when_the_budget_is_spent() -> None:
    # e.g. the owner died between publishing `failed` and acting on it
    p = backoff_history(routed(1), _created(1, 1), _failed(1), _fence_req(1), _fenced(1), budget=0)
    emitted = _emitted(core.reconcile(p.workloads[W], 200.0, env()))
    assert [type(x) for x in emitted] == [ev.WorkloadFailed] and "budget" in emitted[0].reason  # type: ignore[attr-defined]


# ---- issue 9: placement the cluster refuses (defect 3), stale success under strict (defect 5) ----

NO_NODE = "0/3 nodes are available: 3 node(s) didn't match Pod's node affinity/selector."


@pytest.mark.parametrize(
    ("message", "impossible"),
    [
        pytest.param(NO_NODE, True, id="selector-matches-no-node"),
        pytest.param(
            "0/2 nodes are available: 1 node(s) had untolerated taint {dedicated: gpu}, 1 node(s) didn't match Pod's node affinity/selector. preemption: 0/2 nodes are available: 2 Preemption is not helpful for scheduling.",
            True,
            id="taint-and-affinity-with-preemption-tail",
        ),
        pytest.param("0/3 nodes are available: 3 Insufficient nvidia.com/gpu.", False, id="busy-gpus-queue"),
        pytest.param(
            "0/3 nodes are available: 1 Insufficient cpu, 2 node(s) didn't match Pod's node affinity/selector.",
            False,
            id="one-node-only-busy",
        ),
        pytest.param(
            "0/2 nodes are available: 2 Insufficient nvidia.com/gpu. gang gpuorch/x: 1/2 pods fit, the gang is bound all together or not at all.",
            False,
            id="gang-waits-for-capacity",
        ),
        pytest.param("no nodes available to schedule pods", True, id="cluster-without-nodes"),
        pytest.param("something else", False, id="unreadable-is-not-permanent"),
    ],
)
def test_placement_impossible_reads_the_schedulers_reasons(message: str, impossible: bool) -> None:
    assert core.placement_impossible(message) is impossible


def test_unplaceable_pods_are_recorded_then_fail_the_attempt_after_the_grace_and_reroute_elsewhere() -> None:
    a1 = f"{W}-a1"
    p = history(routed(1), _created(1, 1))
    v = p.workloads[W]
    assert v.status == "dispatched"  # a created Job is not running
    obs = core.JobObservation(exists=True, scheduled=0, unschedulable=NO_NODE)
    first = [
        a.event
        for a in core.on_observation(v, v.attempts[a1], obs, 10.0, unschedulable_grace=30)
        if isinstance(a, core.Emit)
    ]
    assert [type(e) for e in first] == [ev.Unschedulable] and first[0].permanent  # type: ignore[attr-defined]
    p.apply(first[0], 20)  # type: ignore[arg-type]
    assert v.status == "dispatched" and "cannot be placed on primary" in v.reason and NO_NODE in v.reason
    assert core.on_observation(v, v.attempts[a1], obs, 39.0, unschedulable_grace=30) == []  # within the grace
    late = [
        a.event
        for a in core.on_observation(v, v.attempts[a1], obs, 41.0, unschedulable_grace=30)
        if isinstance(a, core.Emit)
    ]
    assert len(late) == 1 and isinstance(late[0], ev.Failed)
    failed = late[0]
    assert failed.placement and failed.retryable and NO_NODE in failed.reason
    p.apply(failed, 21)
    assert v.status == "retrying"
    acts = core.reconcile(v, 41.0, env())
    assert [type(a.event) for a in acts if isinstance(a, core.Emit)] == [ev.FenceRequested]
    fence_req = next(a.event for a in acts if isinstance(a, core.Emit))
    assert isinstance(fence_req, ev.FenceRequested) and fence_req.stopped  # the failed Job runs nothing
    p.apply(fence_req, 22)
    p.apply(ev.Fenced(workload_id=W, at=42.0, attempt_id=a1, epoch=1, cluster="primary", new_epoch=2), 23)
    allowed = _allowed(1, at=42.0)
    p.apply(allowed, 24)
    e = core.Environment(**{**env().__dict__, "time_scale": 1e9})  # no backoff to wait out here
    route = [a.event for a in core.reconcile(v, 42.0, e) if isinstance(a, core.Emit)]
    assert len(route) == 1 and isinstance(route[0], ev.RouteRequested)
    assert route[0].exclude == ["primary"]  # not back to the cluster that refused it


def test_pods_waiting_for_capacity_are_recorded_but_never_failed() -> None:
    a1 = f"{W}-a1"
    p = history(routed(1), _created(1, 1))
    v = p.workloads[W]
    obs = core.JobObservation(
        exists=True, scheduled=0, unschedulable="0/3 nodes are available: 3 Insufficient nvidia.com/gpu."
    )
    first = [
        a.event
        for a in core.on_observation(v, v.attempts[a1], obs, 10.0, unschedulable_grace=1)
        if isinstance(a, core.Emit)
    ]
    assert [type(e) for e in first] == [ev.Unschedulable] and not first[0].permanent  # type: ignore[attr-defined]
    p.apply(first[0], 20)  # type: ignore[arg-type]
    assert "queued on primary" in v.reason
    assert (
        core.on_observation(v, v.attempts[a1], obs, 10_000.0, unschedulable_grace=1) == []
    )  # no requeue rule given


def _queued(estimate: float | None, cluster: str = "primary") -> Projection:
    """Routed to `cluster` with the router's queue-wait estimate (simulated seconds), created at t=1, queued."""
    from gpuorch_proto.routing import ClusterVerdict, Estimate

    verdicts = (
        [ClusterVerdict(cluster=cluster, eligible=True, estimate=Estimate(queue_wait=estimate))]
        if estimate is not None
        else []
    )
    d = RoutingDecision(
        workload_id=W, decided_at=1.0, outcome="routed", cluster=cluster, summary="because", verdicts=verdicts
    )
    r = ev.Routed(workload_id=W, at=1.0, decision=d, attempt_number=1, event_id=f"{W}.routed.1")
    pending = ev.Unschedulable(
        workload_id=W, at=2.0, attempt_id=f"{W}-a1", epoch=1, cluster=cluster, message=BUSY, permanent=False
    )
    return history(r, _created(1, 1, cluster), pending)


BUSY = "0/3 nodes are available: 3 Insufficient nvidia.com/gpu."
RQ = core.Requeue(factor=4.0, floor=300.0, most=3600.0)


@pytest.mark.parametrize(
    ("estimate", "limit"),
    [
        pytest.param(100.0 * 600, 400.0, id="4x-a-100s-estimate-at-time-scale-600"),
        pytest.param(0.0, 300.0, id="starts-now-estimate-waits-the-floor"),
        pytest.param(None, 300.0, id="no-estimate-waits-the-floor"),
        pytest.param(10 * 3600.0 * 600, 3600.0, id="huge-estimate-capped"),
    ],
)
def test_queued_attempt_is_requeued_after_k_times_the_routers_estimate(
    estimate: float | None, limit: float
) -> None:
    p = _queued(estimate)
    v = p.workloads[W]
    a = v.attempts[f"{W}-a1"]
    assert core.requeue_limit(v, a, RQ, 600) == pytest.approx(limit)
    obs = core.JobObservation(exists=True, scheduled=0, unschedulable=BUSY)
    created = a.times["created"]
    assert core.on_observation(v, a, obs, created + limit - 1, requeue=RQ, time_scale=600) == []
    late = [
        x.event
        for x in core.on_observation(v, a, obs, created + limit, requeue=RQ, time_scale=600)
        if isinstance(x, core.Emit)
    ]
    assert len(late) == 1 and isinstance(late[0], ev.Failed)
    f = late[0]
    assert f.placement and f.retryable and f.exit_code is None
    assert (
        f.reason.startswith("requeued: 0/1 pods placed on primary")
        and BUSY in f.reason
        and f"limit {limit:.0f}s" in f.reason
    )


def test_a_requeue_spends_no_retry_budget_and_reroutes_elsewhere_at_once() -> None:
    p = _queued(0.0)
    v = p.workloads[W]
    a1 = f"{W}-a1"
    obs = core.JobObservation(exists=True, scheduled=0, unschedulable=BUSY)
    (act,) = core.on_observation(v, v.attempts[a1], obs, 1000.0, requeue=RQ, time_scale=600)
    assert isinstance(act, core.Emit) and isinstance(act.event, ev.Failed)
    p.apply(act.event, 30)
    assert core.failed_attempts(v) == 0  # not a failure of the workload
    acts = [x.event for x in core.reconcile(v, 1000.0, env()) if isinstance(x, core.Emit)]
    assert [type(e) for e in acts] == [ev.FenceRequested]  # fenced per the usual rules, never WorkloadFailed
    p.apply(acts[0], 31)  # type: ignore[arg-type]
    p.apply(ev.Fenced(workload_id=W, at=1001.0, attempt_id=a1, epoch=1, cluster="primary", new_epoch=2), 32)
    allowed = _allowed(1, at=1001.0)
    p.apply(allowed, 33)
    assert core.replacement_not_before(v, v.attempts[a1], 600) == 0.0  # no backoff: the code never ran
    route = [x.event for x in core.reconcile(v, 1001.0, env()) if isinstance(x, core.Emit)]
    assert len(route) == 1 and isinstance(route[0], ev.RouteRequested)
    assert route[0].exclude == ["primary"] and "backoff" not in route[0].reason


@pytest.mark.parametrize(
    "obs",
    [
        pytest.param(core.JobObservation(exists=True, scheduled=1, running=1), id="placed-and-running"),
        pytest.param(
            core.JobObservation(exists=True, workers=2, scheduled=1, unschedulable=BUSY),
            id="gang-half-placed-still-waits",
        ),
    ],
)
def test_requeue_only_while_unplaced_and_never_admitted(obs: core.JobObservation) -> None:
    p = _queued(0.0)
    v = p.workloads[W]
    a = v.attempts[f"{W}-a1"]
    acts = core.on_observation(v, a, obs, 1000.0, requeue=RQ, time_scale=600)
    if obs.scheduled >= obs.workers:
        assert not any(isinstance(x, core.Emit) and isinstance(x.event, ev.Failed) for x in acts)
    else:
        assert any(
            isinstance(x, core.Emit) and isinstance(x.event, ev.Failed) and x.event.placement for x in acts
        )
    # once admitted, a later wait is not a queue wait (pods lost mid-run fail the Job instead)
    p.apply(ev.Admitted(workload_id=W, at=3.0, attempt_id=a.attempt_id, epoch=1, cluster="primary"), 40)
    assert (
        core.on_observation(
            v,
            a,
            core.JobObservation(exists=True, scheduled=0, unschedulable=BUSY),
            5000.0,
            requeue=RQ,
            time_scale=600,
        )
        == []
    )


def test_suspended_job_the_clusters_admission_never_admits_is_requeued() -> None:
    p = _queued(0.0)
    v = p.workloads[W]
    a = v.attempts[f"{W}-a1"]
    held = core.JobObservation(
        exists=True, scheduled=0
    )  # a suspended Kueue Job: no pods, no scheduler message
    assert core.on_observation(v, a, held, 200.0, requeue=RQ, time_scale=600) == []
    (act,) = core.on_observation(v, a, held, 400.0, requeue=RQ, time_scale=600)
    assert (
        isinstance(act, core.Emit)
        and isinstance(act.event, ev.Failed)
        and "not admitted by the cluster" in act.event.reason
    )


def test_status_follows_the_attempt_dispatched_admitted_running() -> None:
    a1 = f"{W}-a1"
    p = history(routed(1), _created(1, 1))
    v = p.workloads[W]
    assert v.status == "dispatched"
    p.apply(ev.Admitted(workload_id=W, at=2.0, attempt_id=a1, epoch=1, cluster="primary"), 10)
    assert v.status == "admitted"
    p.apply(ev.Running(workload_id=W, at=3.0, attempt_id=a1, epoch=1, cluster="primary"), 11)
    assert v.status == "running"


def _lost_then_succeeded_after_the_fence() -> Projection:
    a1 = f"{W}-a1"
    base = {"workload_id": W, "attempt_id": a1, "epoch": 1, "cluster": "primary"}
    return history(
        routed(1),
        _created(1, 1),
        ev.Lost(at=2.0, reason="partition", **base),  # type: ignore[arg-type]
        ev.FenceRequested(at=2.0, reason="lost", policy="strict", lease_expires_at=100.0, **base),  # type: ignore[arg-type]
        ev.Fenced(at=3.0, new_epoch=2, **base),  # type: ignore[arg-type]
        ev.Running(at=4.0, **base),  # type: ignore[arg-type]  # the partition heals: the Job had finished
        ev.Succeeded(at=4.0, output_path="/o", **base),  # type: ignore[arg-type]
        ev.PromoteRequested(at=4.0, output_path="/o", **base),  # type: ignore[arg-type]
        ev.PromotionRejected(at=5.0, current_epoch=2, reason="stale epoch 1 < 2", **base),  # type: ignore[arg-type]
    )


def test_strict_attempt_that_succeeds_after_its_fence_is_replaced() -> None:
    """Defect 5: the stale success was rejected, and then no replacement was ever requested."""
    a1 = f"{W}-a1"
    p = _lost_then_succeeded_after_the_fence()
    v = p.workloads[W]
    assert core.reconcile(v, 5.5, env()) == [], "strict: the fencer has not said it may start"
    # the fencer confirms the old Job gone (strict), and says so
    p.apply(
        ev.CancelConfirmed(workload_id=W, at=6.0, attempt_id=a1, epoch=1, cluster="primary", how="deleted"),
        40,
    )
    allowed = _allowed(1, how="confirmed", at=6.0)
    p.apply(allowed, 41)
    acts = [a.event for a in core.reconcile(v, 6.0, env()) if isinstance(a, core.Emit)]
    assert len(acts) == 1 and isinstance(acts[0], ev.RouteRequested) and acts[0].attempt_number == 2
    assert acts[0].exclude == []  # its cluster answered again
    # and the level-triggered path asks the same (same event id), whatever was missed
    again = [a.event for a in core.reconcile(v, 6.5, env()) if isinstance(a, core.Emit)]
    assert [x.event_id for x in again if isinstance(x, ev.RouteRequested)] == [acts[0].event_id]


# ---- issue 10: lost detection in the core ----------------------------------------------------------


def test_one_failed_call_after_a_quiet_period_is_not_a_loss() -> None:
    """The bug: the last answer was refreshed only while a cluster had live attempts, so after an
    hour without any, the first failed call made its new attempts lost at once."""
    c = liveness.contact(None, True, 0.0)  # answered, then nothing to ask for an hour
    c = liveness.contact(c, False, 3600.0)
    assert liveness.silence(c, 3600.0, lost_after=3.0) is None
    c = liveness.contact(c, False, 3602.0)
    assert liveness.silence(c, 3602.0, lost_after=3.0) is None
    c = liveness.contact(c, False, 3603.5)
    why = liveness.silence(c, 3603.5, lost_after=3.0)
    assert why is not None and "3.5s" in why and "last answer 3603.5s ago" in why
    c = liveness.contact(c, True, 3604.0)  # it answers again: the count starts over
    assert liveness.silence(liveness.contact(c, False, 3610.0), 3610.0, lost_after=3.0) is None


def test_silence_needs_a_failed_call_now_not_only_time_since_the_first() -> None:
    """Issue 27: time alone proves nothing. A cluster that failed at 0.0 and whose next call is
    not due until 3.4 (a retry backing off) may have healed at 1.5: no loss until a call made at
    least LOST_AFTER after the first failure fails too."""
    c = liveness.contact(liveness.contact(None, True, -1.0), False, 0.0)
    assert liveness.silence(c, 3.4, lost_after=3.0) is None, "no call failed since 0.0: no evidence"
    c = liveness.contact(c, False, 1.0)
    assert liveness.silence(c, 5.0, lost_after=3.0) is None
    c = liveness.contact(c, False, 3.0)
    why = liveness.silence(c, 3.1, lost_after=3.0)
    assert why == "has not answered for 3.0s; last answer 4.1s ago", why


def test_facts_out_of_order_never_make_a_run_of_failures_longer() -> None:
    """The informers' threads and the probe report on their own: a failure dated before the last
    answer says nothing of now; an answer ends only the failures made before it."""
    c = liveness.contact(None, True, 10.0)
    assert liveness.contact(c, False, 9.0) == c, "made before the answer at 10.0"
    run = liveness.contact(liveness.contact(c, False, 11.0), False, 14.5)
    assert liveness.silence(run, 14.5, lost_after=3.0) is not None
    late = liveness.contact(run, True, 12.0)  # an answer at 12.0, reported after the failure at 14.5
    assert (late.failing_since, late.last_failed) == (14.5, 14.5)
    assert liveness.silence(late, 14.5, lost_after=3.0) is None


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.floats(0, 20, allow_nan=False)), max_size=30), st.floats(0.5, 5))
def test_silence_always_rests_on_failures_spanning_lost_after_with_no_answer_between(
    facts: list[tuple[bool, float]], lost_after: float
) -> None:
    c: liveness.Contact | None = None
    for answered, at in facts:
        c = liveness.contact(c, answered, at)
    if c is None or liveness.silence(c, 20.0, lost_after) is None:
        return
    assert c.failing_since is not None and c.last_failed is not None
    failed = [at for ok, at in facts if not ok]
    answers = [at for ok, at in facts if ok]
    assert c.failing_since in failed and c.last_failed in failed
    assert c.last_failed - c.failing_since >= lost_after
    assert not any(c.failing_since <= at <= c.last_failed for at in answers), (facts, c)


def test_a_create_the_cluster_never_answers_becomes_lost_after_the_redeliveries() -> None:
    p = history()
    (c,) = core.on_routed(p.workloads[W], routed(1), 2.0, env())
    assert isinstance(c, core.CreateJob)
    assert core.create_unanswered(c, 3.0, "timed out", unreachable=True, delivered=1) is None
    assert (
        core.create_unanswered(c, 3.0, "409? no: 500", unreachable=False, delivered=10) is None
    )  # it answered: retry
    evs = core.create_unanswered(c, 9.0, "timed out", unreachable=True, delivered=core.CREATE_DELIVERIES)
    assert evs is not None and [type(e) for e in evs] == [ev.AttemptCreated, ev.Lost]
    assert evs[1].attempt_id == c.created.attempt_id and "did not answer the create" in evs[1].reason  # type: ignore[attr-defined]


def test_a_lost_attempt_seen_running_again_after_its_fence_is_still_replaced() -> None:
    """Found by the deterministic simulation (seed 7): the heal made the fenced attempt `running`
    again, its Job was deleted (strict), and nothing asked for a replacement."""
    a1 = f"{W}-a1"
    base = {"workload_id": W, "attempt_id": a1, "epoch": 1, "cluster": "primary"}
    p = history(
        routed(1),
        _created(1, 1),
        ev.Lost(at=2.0, reason="partition", **base),  # type: ignore[arg-type]
        ev.FenceRequested(at=2.0, reason="lost", policy="strict", lease_expires_at=100.0, **base),  # type: ignore[arg-type]
        ev.Fenced(at=3.0, new_epoch=2, **base),  # type: ignore[arg-type]
        ev.Running(at=4.0, **base),  # type: ignore[arg-type]  # the partition heals: it still runs
        ev.CancelConfirmed(at=5.0, how="deleted", **base),  # type: ignore[arg-type]
    )
    v = p.workloads[W]
    assert v.attempts[a1].status == "running" and v.attempts[a1].fenced
    allowed = _allowed(1, how="confirmed", at=5.0)
    p.apply(allowed, 40)
    acts = [a.event for a in core.reconcile(v, 5.0, env()) if isinstance(a, core.Emit)]
    assert [type(x) for x in acts] == [ev.RouteRequested]


def test_named_credentials_become_secret_key_refs_never_values() -> None:
    from gpuorch_proto.inventory import SecretKeyRef

    e = env(primary=ClusterRegistryEntry(
        artifact_stores=["prod", "scratch"], credentials=["wandb", "s3-prod", "hf"],
        credential_refs={"wandb": SecretKeyRef(secret="wandb-key", key="token", env="WANDB_API_KEY"), "s3-prod": SecretKeyRef(secret="s3", key="secret-access-key")},
    ))  # fmt: skip
    m = job(wl(requirements={"credentials": ["wandb", "s3-prod", "hf"]}, env={"WANDB_API_KEY": ""}), e=e)
    validate(m)
    c = m["spec"]["template"]["spec"]["containers"][0]
    refs = [x for x in c["env"] if "valueFrom" in x]
    assert refs == [
        {"name": "WANDB_API_KEY", "valueFrom": {"secretKeyRef": {"name": "wandb-key", "key": "token"}}},
        {
            "name": "GPUORCH_CREDENTIAL_S3_PROD",
            "valueFrom": {"secretKeyRef": {"name": "s3", "key": "secret-access-key"}},
        },
    ]
    # a literal entry of the same name never shadows the reference; "hf" has no ref here: supplied otherwise
    assert [x["name"] for x in c["env"]].count("WANDB_API_KEY") == 1
    assert not any("HF" in x["name"] for x in c["env"] if x["name"].startswith("GPUORCH_CREDENTIAL_"))
    # the same workload on a cluster without refs: no secret at all
    assert not any(
        "valueFrom" in x
        for x in job(wl(requirements={"credentials": ["wandb"]}))["spec"]["template"]["spec"]["containers"][
            0
        ]["env"]
    )


# --- the rules the shell follows before it decides (moved from the shell) ----------------------


def test_a_cancel_waits_while_a_job_is_created_or_the_view_is_behind() -> None:
    assert core.cancel_wait(None, creating=True, in_log=False, delivered=9) == core.Wait(
        0.5, "an attempt of this workload is being created"
    )
    w = core.cancel_wait(None, creating=False, in_log=True, delivered=9)
    assert w is not None and "behind the event log" in w.reason
    unknown = [core.cancel_wait(None, creating=False, in_log=False, delivered=n) for n in (1, 2, 3)]
    assert [x is not None for x in unknown] == [True, True, False]  # then on_cancel refuses it


def test_watched_attempts_are_the_owned_live_or_lost_and_not_gone() -> None:
    from dataclasses import dataclass as _dc

    @_dc
    class A:
        attempt_id: str
        cluster: str
        live: bool
        status: str
        gone: bool

    @_dc
    class V:
        workload_id: str
        attempts: dict[str, A]

    views = [
        V(
            "w1",
            {
                "a": A("a", "alpha", True, "running", False),
                "b": A("b", "alpha", False, "lost", False),
                "c": A("c", "beta", False, "lost", True),
                "d": A("d", "beta", False, "failed", False),
            },
        ),
        V("w2", {"e": A("e", "alpha", True, "running", False)}),
    ]
    got = core.watched(views, {"w1"})  # type: ignore[arg-type]
    assert {c: [a.attempt_id for _v, a in items] for c, items in got.items()} == {"alpha": ["a", "b"]}


def test_reconcile_due_is_when_the_clock_alone_can_change_reconciles_answer() -> None:
    """The dispatcher's upkeep skips a workload whose state asked for nothing until
    `reconcile_due`: so at every prefix of these histories, an empty answer stays empty at every
    time before it, and a finite due time is when the answer changes."""
    e = env()
    histories = [
        [
            routed(1),
            _created(1, 1),
            _failed(1, at=100.0),
            _fence_req(1, at=100.1),
            _fenced(1, at=100.2),
            _allowed(1, at=100.2),
        ],
        [
            routed(1),
            _created(1, 1),
            _lost(),
            _fence_req(),
            _fenced(),
            _confirmed(how="lease-expired"),
            _allowed(how="lease-expired"),
        ],
        two_failures(),
        [*failed_and_gone(), _cancel_requested()],
    ]
    finite = 0
    for events in histories:
        for n in range(len(events) + 1):
            v = backoff_history(*events[:n], backoff="1h").workloads[W]
            for t in (0.0, 50.0, 100.3, 103.0, 105.9, 200.2, 210.0, 1e6):
                if core.reconcile(v, t, e):
                    continue
                due = core.reconcile_due(v, e)
                for later in (t, t + 0.5, (t + due) / 2 if due < math.inf else t + 1e5, due - 1e-6):
                    if t <= later < due:
                        assert core.reconcile(v, later, e) == [], (n, t, later, due)
                if due < math.inf:
                    finite += 1
                    assert core.reconcile(v, max(due, t), e), (
                        f"due at {due} but nothing to do then (prefix {n})"
                    )
    assert finite > 0, "a history with a retry backoff has a finite due time"


# --- when an observation that asked for nothing may ask for something: core.observation_due ------

_OBS_TIMES = [0.0, 5.0, 10.0, 19.0, 21.0, 49.0, 50.0, 51.0, 299.0, 300.0, 301.0, 400.0, 1000.0, 3601.0, 10_000.0]


def _due_histories() -> list[tuple[str, Projection]]:
    a1 = f"{W}-a1"
    base = {"workload_id": W, "attempt_id": a1, "epoch": 1, "cluster": "primary"}
    unplaceable = ev.Unschedulable(at=20.0, message=NO_NODE, permanent=True, **base)  # type: ignore[arg-type]
    return [
        ("created", history(routed(1), _created(1, 1))),
        ("unplaceable-recorded", history(routed(1), _created(1, 1), unplaceable)),
        ("queued-with-estimate", _queued(100.0 * 600)),
        ("queued-no-estimate", _queued(None)),
        ("admitted", history(routed(1), _created(1, 1), ev.Admitted(at=3.0, **base))),  # type: ignore[arg-type]
        ("running", history(routed(1), _created(1, 1), ev.Admitted(at=3.0, **base), ev.Running(at=4.0, **base))),  # type: ignore[arg-type]
        ("fenced", history(routed(1), _created(1, 1), unplaceable,
                           ev.FenceRequested(at=30.0, reason="x", policy="strict", lease_expires_at=90.0, **base))),  # type: ignore[arg-type]
    ]  # fmt: skip


_DUE_OBSERVATIONS = [
    core.JobObservation(exists=False),
    core.JobObservation(exists=True, scheduled=0),
    core.JobObservation(exists=True, scheduled=0, unschedulable=BUSY),
    core.JobObservation(exists=True, scheduled=0, unschedulable=NO_NODE),
    core.JobObservation(exists=True, workers=2, scheduled=1, unschedulable=BUSY),
    core.JobObservation(exists=True, scheduled=1),
    core.JobObservation(exists=True, scheduled=1, running=1),
    core.JobObservation(exists=True, scheduled=1, running=1, complete=True),
    core.JobObservation(exists=True, scheduled=1, failed=True, exit_code=3),
]


@pytest.mark.parametrize("requeue", [RQ, None], ids=["requeue", "no-requeue"])
@pytest.mark.parametrize(("name", "p"), _due_histories(), ids=[n for n, _ in _due_histories()])
def test_an_observation_that_asks_nothing_asks_nothing_until_it_is_due(name: str, p: Projection, requeue: core.Requeue | None) -> None:
    """The contract the dispatcher's watch relies on to skip unchanged attempts: if the answer is
    empty now, it stays empty at every later time before `observation_due`, and (the clocks being
    exact) is not empty at it."""
    v = p.workloads[W]
    a = v.attempts[f"{W}-a1"]
    kw = {"unschedulable_grace": 30.0, "requeue": requeue, "time_scale": 600.0}
    checked = fired = 0
    for obs in _DUE_OBSERVATIONS:
        due = core.observation_due(v, a, obs, **kw)  # type: ignore[arg-type]
        for now in _OBS_TIMES:
            if core.on_observation(v, a, obs, now, **kw):  # type: ignore[arg-type]
                continue
            checked += 1
            for later in [t for t in _OBS_TIMES if t > now] + ([due] if due is not None else []):
                if due is not None and later >= due:
                    break
                assert core.on_observation(v, a, obs, later, **kw) == [], (obs, now, later, due)  # type: ignore[arg-type]
            if due is not None and due > now:
                assert core.on_observation(v, a, obs, due, **kw), (obs, due)  # type: ignore[arg-type]
                fired += 1
    assert checked > 0
    if name in ("unplaceable-recorded", "queued-with-estimate") and requeue is not None:
        assert fired > 0, "a clock that fires is among the cases"


def test_store_credentials_reach_gpuorchs_agent_by_secret_name_and_never_the_program() -> None:
    e = env(primary=ClusterRegistryEntry(artifact_stores=["prod"], store_credentials={"prod": "prod-s3"}))
    m = job(wl(output={"store": "prod"}), "primary", e)
    validate(m)
    pod = m["spec"]["template"]["spec"]
    (agent,) = pod["initContainers"]
    refs = {x["name"]: x["valueFrom"]["secretKeyRef"] for x in agent["env"] if "valueFrom" in x}
    assert refs and {r["name"] for r in refs.values()} == {"prod-s3"}, refs
    assert refs["GPUORCH_STORE_PROD_SECRET_ACCESS_KEY"]["key"] == "secret_access_key"  # the Secret's key, never its value
    main_env = {x["name"] for x in pod["containers"][0]["env"]}
    assert not any(n.startswith("GPUORCH_STORE_") for n in main_env), main_env
