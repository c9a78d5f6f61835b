"""Jobs run real processes: completion, watch order, logs, indexes, failures, deadlines, suspend, deletes."""

from __future__ import annotations

import functools
import sys
from pathlib import Path

import pytest
from kubernetes.client.exceptions import ApiException

from .helpers import (
    LK,
    TIMEOUT,
    condition,
    job_body,
    job_finished,
    job_pods,
    new_watch,
    node_group,
    pid_alive,
    running_pid,
    wait_for,
)

WRITE_AND_PRINT = (
    "import os, pathlib; "
    "d = pathlib.Path(os.environ['GPUORCH_CLUSTER_DIR']); "
    "(d / ('out-' + os.environ['POD_NAME'])).write_text('written by ' + os.environ['POD_NAME']); "
    "print('hello from', os.environ['POD_NAME'], 'gpus', os.environ['CUDA_VISIBLE_DEVICES'], "
    "'scale', os.environ['GPUORCH_TIME_SCALE'], 'cluster', os.environ['GPUORCH_CLUSTER'], 'node', os.environ['GPUORCH_NODE'])"
)


def test_job_runs_real_command_to_completion_with_ordered_watch_events_and_logs(lk: LK, tmp_path: Path) -> None:
    h = lk({"name": "c1", "nodes": [node_group()]}, time_scale=250)
    c = h.client("c1")
    start_rv = c.batch.list_namespaced_job("default", _request_timeout=TIMEOUT).metadata.resource_version
    body = job_body(
        "hello",
        ["python", "-c", WRITE_AND_PRINT],
        gpus=2,
        container={"env": [{"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}]},
    )
    created = c.batch.create_namespaced_job("default", body, _request_timeout=TIMEOUT)
    assert created.metadata.uid and created.metadata.generation == 1
    assert created.metadata.creation_timestamp.tzinfo is not None
    assert created.spec.template.metadata.labels["batch.kubernetes.io/controller-uid"] == created.metadata.uid

    events = []
    w = new_watch()
    for ev in w.stream(
        c.batch.list_namespaced_job, "default", resource_version=start_rv, timeout_seconds=20, _request_timeout=(2, 30)
    ):
        events.append(ev)
        done = condition(ev["object"], "Complete")
        if done is not None and done.status == "True":
            w.stop()
    types = [e["type"] for e in events]
    assert types[0] == "ADDED" and set(types[1:]) == {"MODIFIED"}, types
    rvs = [int(e["object"].metadata.resource_version) for e in events]
    assert rvs == sorted(rvs) and len(set(rvs)) == len(rvs)
    final = events[-1]["object"]
    cond = condition(final, "Complete")
    assert cond.reason == "CompletionsReached" and cond.last_transition_time is not None
    assert final.status.succeeded == 1 and not final.status.active and final.status.completion_time is not None
    assert final.status.start_time is not None

    (pod,) = job_pods(c, "hello")
    assert pod.status.phase == "Succeeded"
    assert pod.metadata.owner_references[0].uid == created.metadata.uid and pod.metadata.owner_references[0].controller
    for label in ("job-name", "batch.kubernetes.io/job-name"):
        assert pod.metadata.labels[label] == "hello"
    assert pod.metadata.labels["controller-uid"] == created.metadata.uid
    assert pod.spec.node_name in h.clusters["c1"].nodes()
    assert condition(pod, "PodScheduled").status == "True"
    term = pod.status.container_statuses[0].state.terminated
    assert term.exit_code == 0 and term.reason == "Completed"
    log = c.core.read_namespaced_pod_log(pod.metadata.name, "default", _request_timeout=TIMEOUT)
    assert f"hello from {pod.metadata.name} gpus 0,1 scale 250 cluster c1 node {pod.spec.node_name}" in log
    shared = h.clusters["c1"].state_dir / "shared" / f"out-{pod.metadata.name}"
    assert shared.read_text() == f"written by {pod.metadata.name}"


def test_indexed_job_gets_distinct_completion_indexes_and_gpu_ids(lk: LK) -> None:
    h = lk({"name": "c1", "nodes": [node_group(count=1, gpus=4)]})
    c = h.client("c1")
    cmd = ["python", "-c", "import os; print('index', os.environ['JOB_COMPLETION_INDEX'], os.environ['NVIDIA_VISIBLE_DEVICES'])"]
    c.batch.create_namespaced_job(
        "default", job_body("idx", cmd, gpus=1, parallelism=4, completions=4, indexed=True), _request_timeout=TIMEOUT
    )
    job = wait_for(lambda: job_finished(c, "idx"), timeout=20, what="indexed job complete")
    assert job.status.completed_indexes == "0-3" and job.status.succeeded == 4
    indexes, devices = set(), set()
    for pod in job_pods(c, "idx"):
        idx = pod.metadata.annotations["batch.kubernetes.io/job-completion-index"]
        assert pod.metadata.labels["batch.kubernetes.io/job-completion-index"] == idx
        assert pod.spec.hostname == f"idx-{idx}"
        words = c.core.read_namespaced_pod_log(pod.metadata.name, "default", _request_timeout=TIMEOUT).split()
        assert words[:2] == ["index", idx]
        indexes.add(idx)
        devices.add(words[2])
    assert indexes == {"0", "1", "2", "3"}
    assert devices == {"0", "1", "2", "3"}  # all four ran at once on one 4-GPU node: unique ids


def test_backoff_limit_fails_the_job(lk: LK) -> None:
    h = lk({"name": "c1", "nodes": [node_group()]})
    c = h.client("c1")
    c.batch.create_namespaced_job("default", job_body("boom", ["sh", "-c", "echo failing; exit 3"], backoff=1), _request_timeout=TIMEOUT)
    job = wait_for(lambda: job_finished(c, "boom", "Failed"), timeout=15, what="job Failed")
    cond = condition(job, "Failed")
    assert cond.reason == "BackoffLimitExceeded"
    assert job.status.failed == 2 and not job.status.succeeded
    pods = job_pods(c, "boom")
    assert len(pods) == 2 and {p.status.phase for p in pods} == {"Failed"}
    assert {p.status.container_statuses[0].state.terminated.exit_code for p in pods} == {3}


def test_on_failure_restarts_the_container_in_place(lk: LK) -> None:
    h = lk({"name": "c1", "nodes": [node_group()]})
    c = h.client("c1")
    # fails the first time (cwd is the pod's working directory, kept across restarts), succeeds the second
    script = "import os, sys; first = not os.path.exists('seen'); open('seen', 'w').close(); print('first' if first else 'second'); sys.exit(1 if first else 0)"
    c.batch.create_namespaced_job("default", job_body("retry", ["python3", "-c", script], restart="OnFailure", backoff=3), _request_timeout=TIMEOUT)
    wait_for(lambda: job_finished(c, "retry"), timeout=15, what="job Complete")
    (pod,) = job_pods(c, "retry")
    st = pod.status.container_statuses[0]
    assert pod.status.phase == "Succeeded" and st.restart_count == 1
    assert st.last_state.terminated.exit_code == 1
    assert c.core.read_namespaced_pod_log(pod.metadata.name, "default", _request_timeout=TIMEOUT).split() == ["first", "second"]


def test_init_containers_run_before_the_main_container(lk: LK) -> None:
    h = lk({"name": "c1", "nodes": [node_group()]})
    c = h.client("c1")
    init = {"name": "fetch", "image": "local", "command": ["sh", "-c", "echo staged > data.txt"]}
    body = job_body("init", ["sh", "-c", "cat data.txt"], pod_spec={"initContainers": [init]})
    c.batch.create_namespaced_job("default", body, _request_timeout=TIMEOUT)
    wait_for(lambda: job_finished(c, "init"), timeout=15)
    (pod,) = job_pods(c, "init")
    assert pod.status.init_container_statuses[0].state.terminated.exit_code == 0
    assert c.core.read_namespaced_pod_log(pod.metadata.name, "default", _request_timeout=TIMEOUT).strip() == "staged"
    assert c.core.read_namespaced_pod_log(pod.metadata.name, "default", container="fetch", _request_timeout=TIMEOUT) == ""


def test_active_deadline_fails_the_job_and_kills_its_pods(lk: LK) -> None:
    # job_clock simulated: 50 simulated seconds at time_scale 100 is 0.5 s
    h = lk({"name": "c1", "nodes": [node_group()]}, time_scale=100)
    c = h.client("c1")
    c.batch.create_namespaced_job("default", job_body("slow", ["sleep", "60"], activeDeadlineSeconds=50), _request_timeout=TIMEOUT)
    pod_name = wait_for(lambda: job_pods(c, "slow"), what="pod created")[0].metadata.name
    pid = wait_for(lambda: running_pid(c, pod_name), what="pod running")
    job = wait_for(lambda: job_finished(c, "slow", "Failed"), timeout=10)
    assert condition(job, "Failed").reason == "DeadlineExceeded"
    wait_for(lambda: not job_pods(c, "slow"), what="pods gone")
    assert not pid_alive(pid)


def test_suspend_resume_and_suspend_again(lk: LK) -> None:
    h = lk({"name": "c1", "nodes": [node_group()]})
    c = h.client("c1")
    c.batch.create_namespaced_job("default", job_body("sus", ["sleep", "60"], suspend=True), _request_timeout=TIMEOUT)
    job = wait_for(lambda: condition(c.batch.read_namespaced_job("sus", "default", _request_timeout=TIMEOUT), "Suspended") and
                   c.batch.read_namespaced_job("sus", "default", _request_timeout=TIMEOUT))
    h.clusters["c1"].reconcile()
    assert not job_pods(c, "sus") and condition(job, "Suspended").status == "True" and job.status.start_time is None

    patched = c.batch.patch_namespaced_job("sus", "default", {"spec": {"suspend": False}}, _request_timeout=TIMEOUT)
    assert patched.metadata.generation == 2
    pod_name = wait_for(lambda: job_pods(c, "sus"))[0].metadata.name
    pid = wait_for(lambda: running_pid(c, pod_name))
    job = c.batch.read_namespaced_job("sus", "default", _request_timeout=TIMEOUT)
    assert condition(job, "Suspended").status == "False" and condition(job, "Suspended").reason == "JobResumed"

    c.batch.patch_namespaced_job("sus", "default", {"spec": {"suspend": True}}, _request_timeout=TIMEOUT)
    wait_for(lambda: not job_pods(c, "sus"), what="suspended job's pods deleted")
    assert not pid_alive(pid)
    job = c.batch.read_namespaced_job("sus", "default", _request_timeout=TIMEOUT)
    assert condition(job, "Suspended").status == "True" and not job.status.failed


@pytest.mark.parametrize("policy", ["Background", "Foreground"])
def test_delete_job_kills_processes_before_pods_are_gone(lk: LK, policy: str) -> None:
    h = lk({"name": "c1", "nodes": [node_group()]})
    c = h.client("c1")
    c.batch.create_namespaced_job("default", job_body("victim", ["sleep", "60"], parallelism=2), _request_timeout=TIMEOUT)
    pods = wait_for(lambda: len(job_pods(c, "victim")) == 2 and job_pods(c, "victim"))
    pids = [wait_for(functools.partial(running_pid, c, p.metadata.name)) for p in pods]
    assert all(pid_alive(p) for p in pids)
    w = new_watch()
    rv = c.core.list_namespaced_pod("default", _request_timeout=TIMEOUT).metadata.resource_version
    c.batch.delete_namespaced_job("victim", "default", propagation_policy=policy, _request_timeout=TIMEOUT)
    deleted = set()
    for ev in w.stream(c.core.list_namespaced_pod, "default", resource_version=rv, timeout_seconds=10, _request_timeout=(2, 20)):
        if ev["type"] == "DELETED":
            deleted.add(ev["object"].metadata.name)
            # "pods gone" means "processes gone"
            assert not pid_alive(pids[[p.metadata.name for p in pods].index(ev["object"].metadata.name)])
            if len(deleted) == 2:
                w.stop()
    assert deleted == {p.metadata.name for p in pods}
    wait_for(lambda: not c.batch.list_namespaced_job("default", _request_timeout=TIMEOUT).items, what="job gone")
    with pytest.raises(ApiException) as e:
        c.batch.read_namespaced_job("victim", "default", _request_timeout=TIMEOUT)
    assert e.value.status == 404


def test_orphan_delete_keeps_the_pod_and_grace_period_is_honoured(lk: LK) -> None:
    h = lk({"name": "c1", "nodes": [node_group()]})
    c = h.client("c1")
    # a process that ignores SIGTERM: only SIGKILL after the grace period stops it
    stubborn = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('up', flush=True); time.sleep(60)"
    body = job_body("orph", [sys.executable, "-c", stubborn], pod_spec={"terminationGracePeriodSeconds": 1})
    c.batch.create_namespaced_job("default", body, _request_timeout=TIMEOUT)
    pod_name = wait_for(lambda: job_pods(c, "orph"))[0].metadata.name
    pid = wait_for(lambda: running_pid(c, pod_name))
    wait_for(lambda: "up" in c.core.read_namespaced_pod_log(pod_name, "default", _request_timeout=TIMEOUT))
    c.batch.delete_namespaced_job("orph", "default", propagation_policy="Orphan", _request_timeout=TIMEOUT)
    wait_for(lambda: not c.batch.list_namespaced_job("default", _request_timeout=TIMEOUT).items)
    h.clusters["c1"].reconcile()
    pod = c.core.read_namespaced_pod(pod_name, "default", _request_timeout=TIMEOUT)
    assert pod.metadata.owner_references is None and pid_alive(pid)

    c.core.delete_namespaced_pod(pod_name, "default", _request_timeout=TIMEOUT)
    pod = c.core.read_namespaced_pod(pod_name, "default", _request_timeout=TIMEOUT)
    assert pod.metadata.deletion_timestamp is not None and pod.metadata.deletion_grace_period_seconds == 1
    assert pid_alive(pid)  # SIGTERM is ignored: still there within the grace period

    def gone() -> bool:
        try:
            c.core.read_namespaced_pod(pod_name, "default", _request_timeout=TIMEOUT)
        except ApiException as e:
            return bool(e.status == 404)
        return False

    wait_for(gone, timeout=10, what="pod 404")
    assert not pid_alive(pid)


def test_delete_with_grace_zero_overrides_the_pod_grace_period(lk: LK) -> None:
    h = lk({"name": "c1", "nodes": [node_group()]})
    c = h.client("c1")
    body = job_body("quick", ["sleep", "60"], pod_spec={"terminationGracePeriodSeconds": 300})
    c.batch.create_namespaced_job("default", body, _request_timeout=TIMEOUT)
    pod_name = wait_for(lambda: job_pods(c, "quick"))[0].metadata.name
    pid = wait_for(lambda: running_pid(c, pod_name))
    c.batch.delete_namespaced_job("quick", "default", propagation_policy="Orphan", _request_timeout=TIMEOUT)
    c.core.delete_namespaced_pod(pod_name, "default", grace_period_seconds=0, _request_timeout=TIMEOUT)
    wait_for(lambda: not c.core.list_namespaced_pod("default", _request_timeout=TIMEOUT).items, timeout=5)
    assert not pid_alive(pid)


def test_a_pod_name_taken_by_a_sibling_is_drawn_again(lk: LK, monkeypatch: pytest.MonkeyPatch) -> None:
    """Pods are named `<job>-<5 random characters>`: a collision (1,000 pods of one Job meet one
    about once in 30 Jobs) draws another name instead of failing the controllers' pass."""
    import gpuorch_localkube.jobcontroller as jobcontroller

    draws = iter(["aaaaa", "aaaaa", "aaaaa", "bbbbb"])
    monkeypatch.setattr(jobcontroller, "random_suffix", lambda: next(draws))
    h = lk({"name": "c1", "nodes": [node_group()]})
    c = h.client("c1")
    c.batch.create_namespaced_job("default", job_body("twins", ["sleep", "30"], parallelism=2, completions=2),
                                  _request_timeout=TIMEOUT)
    pods = wait_for(lambda: len(job_pods(c, "twins")) == 2 and job_pods(c, "twins"), what="both pods")
    assert sorted(p.metadata.name for p in pods) == ["twins-aaaaa", "twins-bbbbb"]
