"""Scheduling: gangs, taints and tolerations, nodeSelector, priority order, background load."""

from __future__ import annotations

import functools
from typing import Any

from kubernetes.client.exceptions import ApiException

from .helpers import (
    LK,
    TIMEOUT,
    K8s,
    condition,
    job_body,
    job_finished,
    job_pods,
    new_watch,
    node_group,
    running_pid,
    wait_for,
)


def _no_pods(c: K8s, job: str) -> bool:
    return not job_pods(c, job)


GANG = {"gpuorch.io/gang": "true"}


def _unschedulable(c: K8s, job: str, n: int) -> list[Any]:
    pods = job_pods(c, job)
    if len(pods) != n:
        return []
    for p in pods:
        cond = condition(p, "PodScheduled")
        if cond is None or cond.status != "False" or cond.reason != "Unschedulable":
            return []
    return pods


def test_gang_that_does_not_fit_stays_wholly_pending(lk: LK) -> None:
    h = lk({"name": "c1", "nodes": [node_group(count=2, gpus=4)]})
    c = h.client("c1")
    # 3 x 4 GPUs on 2 x 4 GPUs: two members would fit, the gang does not
    body = job_body("gang3", ["sleep", "30"], gpus=4, parallelism=3, completions=3, indexed=True, annotations=GANG)
    c.batch.create_namespaced_job("default", body, _request_timeout=TIMEOUT)
    pods = wait_for(lambda: _unschedulable(c, "gang3", 3), what="3 unschedulable gang pods")
    h.clusters["c1"].reconcile()  # one more scheduling pass: still nothing bound
    pods = job_pods(c, "gang3")
    assert [p.spec.node_name for p in pods] == [None, None, None]
    assert {p.status.phase for p in pods} == {"Pending"}
    assert all(p.metadata.annotations["gpuorch.io/gang"] == "true" for p in pods)
    msg = condition(pods[0], "PodScheduled").message
    assert msg.startswith("0/2 nodes are available: 2 Insufficient nvidia.com/gpu.") and "2/3 pods fit" in msg
    assert not h.clusters["c1"].pids()


def test_gang_binds_all_members_in_one_step_once_it_fits(lk: LK) -> None:
    h = lk({"name": "c1", "nodes": [node_group(count=2, gpus=4)]})
    c = h.client("c1")
    # a single 4-GPU pod holds one node: a 2 x 4 GPU gang has room for only one member
    c.batch.create_namespaced_job("default", job_body("blocker", ["sleep", "30"], gpus=4), _request_timeout=TIMEOUT)
    blocker = wait_for(lambda: job_pods(c, "blocker"))[0].metadata.name
    wait_for(lambda: running_pid(c, blocker))
    rv = c.core.list_namespaced_pod("default", _request_timeout=TIMEOUT).metadata.resource_version
    body = job_body("gang2", ["sleep", "30"], gpus=4, parallelism=2, completions=2, indexed=True, annotations=GANG)
    c.batch.create_namespaced_job("default", body, _request_timeout=TIMEOUT)
    pods = wait_for(lambda: _unschedulable(c, "gang2", 2))
    assert "1/2 pods fit" in condition(pods[0], "PodScheduled").message
    h.clusters["c1"].reconcile()
    assert all(p.spec.node_name is None for p in job_pods(c, "gang2"))

    c.batch.delete_namespaced_job("blocker", "default", propagation_policy="Background", _request_timeout=TIMEOUT)
    pods = wait_for(lambda: all(p.spec.node_name for p in job_pods(c, "gang2")) and job_pods(c, "gang2"), what="gang bound")
    assert sorted(p.spec.node_name for p in pods) == ["gpu-0", "gpu-1"]
    # the bindings were committed back to back: no other pod event between the two

    binds: list[tuple[int, str]] = []
    for ev in new_watch().stream(c.core.list_namespaced_pod, "default", resource_version=rv, timeout_seconds=1,
                                   _request_timeout=(2, 10)):
        o = ev["object"]
        if o.metadata.labels.get("job-name") == "gang2" and o.spec.node_name and o.metadata.name not in [b[1] for b in binds]:
            binds.append((int(o.metadata.resource_version), o.metadata.name))
    assert len(binds) == 2 and binds[1][0] == binds[0][0] + 1
    for p in pods:
        wait_for(functools.partial(running_pid, c, p.metadata.name))


def test_taints_tolerations_and_node_selector(lk: LK) -> None:
    h = lk({
        "name": "c1",
        "nodes": [
            node_group("train", count=1, gpus=4, pool="train"),
            node_group("infer", count=1, gpus=4, pool="infer", taints=[{"key": "dedicated", "value": "infer", "effect": "NoSchedule"}]),
        ],
    })
    c = h.client("c1")
    infer = {"nodeSelector": {"gpuorch.io/pool": "infer"}}
    c.batch.create_namespaced_job("default", job_body("no-tol", ["true"], gpus=1, pod_spec=infer), _request_timeout=TIMEOUT)
    tol_equal = {**infer, "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "infer", "effect": "NoSchedule"}]}
    c.batch.create_namespaced_job("default", job_body("tol-eq", ["true"], gpus=1, pod_spec=tol_equal), _request_timeout=TIMEOUT)
    tol_exists = {**infer, "tolerations": [{"key": "dedicated", "operator": "Exists"}]}
    c.batch.create_namespaced_job("default", job_body("tol-ex", ["true"], gpus=1, pod_spec=tol_exists), _request_timeout=TIMEOUT)
    wrong_value = {**infer, "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "train"}]}
    c.batch.create_namespaced_job("default", job_body("tol-bad", ["true"], gpus=1, pod_spec=wrong_value), _request_timeout=TIMEOUT)
    c.batch.create_namespaced_job("default", job_body("plain", ["true"], gpus=1), _request_timeout=TIMEOUT)
    for name in ("tol-eq", "tol-ex", "plain"):
        wait_for(functools.partial(job_finished, c, name), timeout=15)
    assert {job_pods(c, n)[0].spec.node_name for n in ("tol-eq", "tol-ex")} == {"infer-0"}
    assert job_pods(c, "plain")[0].spec.node_name == "train-0"
    for name in ("no-tol", "tol-bad"):
        (pod,) = wait_for(functools.partial(_unschedulable, c, name, 1))
        assert condition(pod, "PodScheduled").message == (
            "0/2 nodes are available: 1 node(s) didn't match Pod's node affinity/selector, "
            "1 node(s) had untolerated taint {dedicated: infer}."
        )


def test_pending_pods_are_placed_by_priority_then_age(lk: LK) -> None:
    h = lk({"name": "c1", "nodes": [node_group(count=1, gpus=1)], "priority_classes": {"high": 1000}})
    c = h.client("c1")
    c.batch.create_namespaced_job("default", job_body("first", ["sleep", "30"], gpus=1), _request_timeout=TIMEOUT)
    wait_for(lambda: bool(pods := job_pods(c, "first")) and running_pid(c, pods[0].metadata.name))  # the pod may not exist yet
    c.batch.create_namespaced_job("default", job_body("older-low", ["sleep", "30"], gpus=1), _request_timeout=TIMEOUT)
    c.batch.create_namespaced_job("default", job_body("newer-low", ["sleep", "30"], gpus=1), _request_timeout=TIMEOUT)
    c.batch.create_namespaced_job("default", job_body("newer-high", ["sleep", "30"], gpus=1,
                                  pod_spec={"priorityClassName": "high"}), _request_timeout=TIMEOUT)
    for name in ("older-low", "newer-low", "newer-high"):
        wait_for(functools.partial(_unschedulable, c, name, 1))
    order: list[str] = []
    names = ("first", "older-low", "newer-low", "newer-high")
    for _ in range(3):
        bound = [n for n in names if n not in order and job_pods(c, n) and job_pods(c, n)[0].spec.node_name]
        assert len(bound) == 1, bound  # one GPU: one pod at a time
        order.append(bound[0])
        wait_for(functools.partial(running_pid, c, job_pods(c, bound[0])[0].metadata.name))
        c.batch.delete_namespaced_job(bound[0], "default", propagation_policy="Background", _request_timeout=TIMEOUT)
        wait_for(functools.partial(_no_pods, c, bound[0]))
        h.clusters["c1"].reconcile()  # one scheduling pass: the next pod is bound now
    assert order == ["first", "newer-high", "older-low"]
    assert job_pods(c, "newer-low")[0].spec.node_name is not None


def test_background_load_keeps_gpus_busy_and_is_resubmitted(lk: LK) -> None:
    h = lk({
        "name": "c1",
        "nodes": [node_group(count=1, gpus=4, pool="train")],
        "background": [{"name": "tenant", "gpus_per_job": 4, "jobs": 2, "duration": "1h", "node_selector": {"gpuorch.io/pool": "train"}}],
    }, time_scale=100)
    c = h.client("c1")
    bg = wait_for(lambda: len(c.batch.list_namespaced_job("tenants", _request_timeout=TIMEOUT).items) == 2
                  and c.batch.list_namespaced_job("tenants", _request_timeout=TIMEOUT).items)
    assert all(j.metadata.annotations["gpuorch.io/expected-duration-seconds"] == "3600" for j in bg)
    assert all(j.spec.template.spec.containers[0].command == ["sleep", "36.000"] for j in bg)  # 1 h at time_scale 100
    wait_for(lambda: any(p.status.phase == "Running" for p in c.core.list_namespaced_pod("tenants", _request_timeout=TIMEOUT).items))
    c.batch.create_namespaced_job("default", job_body("mine", ["true"], gpus=1), _request_timeout=TIMEOUT)
    (pod,) = wait_for(lambda: _unschedulable(c, "mine", 1))
    assert "Insufficient nvidia.com/gpu" in condition(pod, "PodScheduled").message
    h.clusters["c1"].reconcile()
    assert job_pods(c, "mine")[0].spec.node_name is None, [
        (p.metadata.name, p.status.phase, p.spec.node_name) for p in c.core.list_pod_for_all_namespaces(_request_timeout=TIMEOUT).items]

    # the cluster keeps the queue as configured: jobs that go away are resubmitted
    h.clusters["c1"].set_background([{"name": "tenant", "gpus_per_job": 4, "jobs": 1, "duration": "5s"}])
    for j in bg:  # (the queued one may already be withdrawn: fewer jobs are configured now)
        try:
            c.batch.delete_namespaced_job(j.metadata.name, "tenants", propagation_policy="Background", _request_timeout=TIMEOUT)
        except ApiException as e:
            assert e.status == 404
    seen: set[str] = {j.metadata.name for j in bg}

    def resubmitted() -> bool:
        seen.update(j.metadata.name for j in c.batch.list_namespaced_job("tenants", _request_timeout=TIMEOUT).items)
        return len(seen) >= 5

    wait_for(resubmitted, timeout=15, what="background jobs resubmitted")
    h.clusters["c1"].set_background([])  # removing the load withdraws what is queued
    wait_for(lambda: job_finished(c, "mine"), timeout=15, what="my job runs once the load is gone")
    wait_for(lambda: not c.batch.list_namespaced_job("tenants", _request_timeout=TIMEOUT).items, timeout=15)


def test_node_selector_on_missing_label_reports_affinity(lk: LK) -> None:
    h = lk({"name": "c1", "nodes": [node_group(count=1)]})
    c = h.client("c1")
    c.batch.create_namespaced_job("default", job_body("nowhere", ["true"], pod_spec={"nodeSelector": {"gpuorch.io/pool": "nope"}}),
                                  _request_timeout=TIMEOUT)
    (pod,) = wait_for(lambda: _unschedulable(c, "nowhere", 1))
    assert condition(pod, "PodScheduled").message == "0/1 nodes are available: 1 node(s) didn't match Pod's node affinity/selector."
    try:
        c.core.read_namespaced_pod_log(pod.metadata.name, "default", _request_timeout=TIMEOUT)
    except ApiException as e:
        assert e.status == 400 and "waiting to start" in str(e.body)
    else:
        raise AssertionError("log of a pod that never started")
