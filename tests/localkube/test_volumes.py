"""Pods run as a kubelet runs them with respect to disks: volumes (emptyDir, persistentVolumeClaim,
secret; hostPath refused), a private root per container holding only what it mounts
(``$GPUORCH_POD_ROOT``), native sidecars (init containers with ``restartPolicy: Always``) and exec
startup probes. A workload that assumes a disk shared with something it did not mount fails here.
"""

from __future__ import annotations

import base64
import functools
import json
from pathlib import Path
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from gpuorch_proto.podpath import POD_ROOT

from .helpers import LK, TIMEOUT, K8s, job_finished, job_pods, node_group, wait_for

NS = "default"
ROOT_ENV = [{"name": "GPUORCH_POD_ROOT", "value": ""}]  # as gpuorch's Jobs say it (a real node's root)

# The sidecar: ready (a marker the startupProbe looks for) only after a while, so a main container
# that starts before the probe passed would see no marker; at SIGTERM it copies what the main
# container wrote into the claim, then exits 0.
SIDECAR = """
import os, pathlib, signal, sys, time
root = pathlib.Path(os.environ["GPUORCH_POD_ROOT"])
def term(*_):
    out = root / "gpuorch/out/result.txt"
    (root / "results/final.txt").write_text("sidecar saw: " + (out.read_text() if out.exists() else "<nothing>"))
    sys.exit(0)
signal.signal(signal.SIGTERM, term)
time.sleep(1.0)
(root / "gpuorch/.agent-ready").write_text("ready")
while True:
    time.sleep(0.05)
"""
PROBE = ["python", "-c", "import os, sys; sys.exit(0 if os.path.exists(os.environ['GPUORCH_POD_ROOT'] + '/gpuorch/.agent-ready') else 1)"]
# The main container: writes through the env path "$(GPUORCH_POD_ROOT)/gpuorch/out", then waits
# for the test's go (a file the test puts in the claim), with its own deadline.
MAIN = """
import os, pathlib, sys, time
root = pathlib.Path(os.environ["GPUORCH_POD_ROOT"])
ready = (root / "gpuorch/.agent-ready").exists()
out = pathlib.Path(os.environ["OUT"])
out.mkdir(parents=True, exist_ok=True)
(out / "result.txt").write_text(f"main ran, sidecar ready at start={ready}, out={os.environ['OUT']}")
deadline = time.monotonic() + 60
while not (root / "results/go").exists():
    if time.monotonic() > deadline:
        sys.exit(9)
    time.sleep(0.02)
sys.exit(int((root / "results/go").read_text() or 0))
"""


def _cluster(lk: LK) -> tuple[Any, K8s]:
    h = lk({"name": "c1", "nodes": [node_group("cpu", count=1, gpus=0)]})
    return h.clusters["c1"], h.client("c1")


def _sidecar_job(name: str, claim: str) -> dict[str, Any]:
    agent = {
        "name": "agent", "image": "agent", "restartPolicy": "Always",
        "command": ["python", "-c", SIDECAR], "env": ROOT_ENV,
        "startupProbe": {"exec": {"command": PROBE}, "periodSeconds": 1, "failureThreshold": 30},
        "volumeMounts": [{"name": "gpuorch-work", "mountPath": "/gpuorch"}, {"name": "results", "mountPath": "/results"}],
    }
    main = {
        "name": "main", "image": "user", "command": ["python", "-c", MAIN],
        "env": [*ROOT_ENV, {"name": "OUT", "value": "$(GPUORCH_POD_ROOT)/gpuorch/out"}],
        "volumeMounts": [{"name": "gpuorch-work", "mountPath": "/gpuorch"}, {"name": "results", "mountPath": "/results"}],
    }
    return {
        "apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name},
        "spec": {"backoffLimit": 0, "template": {"spec": {
            "restartPolicy": "Never", "terminationGracePeriodSeconds": 20,
            "volumes": [{"name": "gpuorch-work", "emptyDir": {}}, {"name": "results", "persistentVolumeClaim": {"claimName": claim}}],
            "initContainers": [agent], "containers": [main],
        }}},
    }  # fmt: skip


def _pod(name: str, containers: list[dict[str, Any]], volumes: list[dict[str, Any]], init: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"restartPolicy": "Never", "volumes": volumes, "containers": containers}
    if init:
        spec["initContainers"] = init
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}


def _read_pod(c: K8s, name: str) -> Any:
    return c.core.read_namespaced_pod(name, NS, _request_timeout=TIMEOUT)


def _phase(c: K8s, name: str, *phases: str) -> Any:
    pod = _read_pod(c, name)
    return pod if pod.status.phase in phases else None


def _log(c: K8s, pod: str, container: str | None = None) -> str:
    kw = {"container": container} if container else {}
    return str(c.core.read_namespaced_pod_log(pod, NS, _request_timeout=TIMEOUT, **kw))


def _pod_dir(cluster: Any, pod: Any) -> Path:
    return Path(cluster.state_dir, "pods", NS, f"{pod.metadata.name}-{pod.metadata.uid[:8]}")


def test_sidecar_gates_main_shares_its_emptydir_and_finishes_its_final_write_before_the_job_completes(lk: LK) -> None:
    cluster, c = _cluster(lk)
    claim = cluster.claim_dir(NS, "results")
    c.batch.create_namespaced_job(NS, _sidecar_job("with-agent", "results"), _request_timeout=TIMEOUT)

    def both_running() -> Any:
        pods = job_pods(c, "with-agent")
        if not pods or pods[0].status.phase != "Running":
            return None
        pod = pods[0]
        side, main = pod.status.init_container_statuses[0], pod.status.container_statuses[0]
        return pod if side.state.running and main.state.running else None

    pod = wait_for(both_running, timeout=30, what="sidecar and main running")
    side = pod.status.init_container_statuses[0]
    assert side.name == "agent" and side.started and side.ready and side.restart_count == 0
    assert pod.status.container_statuses[0].started
    assert {x.type: x.status for x in pod.status.conditions}["Initialized"] == "True"
    # the main container started only once the sidecar's startupProbe passed
    assert claim.is_dir()
    (claim / "go").write_text("0")

    job = wait_for(lambda: job_finished(c, "with-agent"), timeout=30, what="job Complete")
    assert job.status.succeeded == 1
    # the sidecar's SIGTERM work happened before the pod (and so the Job) finished
    final = (claim / "final.txt").read_text()
    assert final.startswith("sidecar saw: main ran, sidecar ready at start=True, out=")
    out_seen = final.split("out=", 1)[1]
    assert out_seen.endswith("/gpuorch/out") and not out_seen.startswith("/gpuorch"), "$(GPUORCH_POD_ROOT) expanded to the private root"
    (pod,) = job_pods(c, "with-agent")
    assert pod.status.phase == "Succeeded"
    side = pod.status.init_container_statuses[0]
    assert side.state.terminated.exit_code == 0 and side.restart_count == 0
    assert pod.status.container_statuses[0].state.terminated.exit_code == 0
    # emptyDir and the private roots went with the pod; the claim stays
    assert not (_pod_dir(cluster, pod) / "volumes").exists() and not (_pod_dir(cluster, pod) / "roots").exists()
    assert (claim / "final.txt").exists()


def test_a_failed_main_container_fails_the_pod_though_its_sidecar_exits_0(lk: LK) -> None:
    cluster, c = _cluster(lk)
    claim = cluster.claim_dir(NS, "results2")
    claim.mkdir(parents=True)
    (claim / "go").write_text("3")  # main exits 3 as soon as it has written its result
    c.batch.create_namespaced_job(NS, _sidecar_job("main-fails", "results2"), _request_timeout=TIMEOUT)
    wait_for(lambda: job_finished(c, "main-fails", "Failed"), timeout=30, what="job Failed")
    (pod,) = job_pods(c, "main-fails")
    assert pod.status.phase == "Failed"
    assert pod.status.container_statuses[0].state.terminated.exit_code == 3
    assert pod.status.init_container_statuses[0].state.terminated.exit_code == 0
    assert (claim / "final.txt").read_text().startswith("sidecar saw: main ran")


def test_a_claim_outlives_its_pods_an_emptydir_does_not(lk: LK) -> None:
    cluster, c = _cluster(lk)
    volumes = [{"name": "cache", "persistentVolumeClaim": {"claimName": "cache"}}, {"name": "scratch", "emptyDir": {}}]
    mounts = [{"name": "cache", "mountPath": "/gpuorch-cache"}, {"name": "scratch", "mountPath": "/scratch"}]
    write = (
        "import os, pathlib; r = pathlib.Path(os.environ['GPUORCH_POD_ROOT']); "
        "(r / 'gpuorch-cache/ds').mkdir(); (r / 'gpuorch-cache/ds/part-0').write_text('cached bytes'); "
        "(r / 'scratch/tmp').write_text('scratch bytes')"
    )
    read = (
        "import os, pathlib; r = pathlib.Path(os.environ['GPUORCH_POD_ROOT']); "
        "print('cache:', (r / 'gpuorch-cache/ds/part-0').read_text()); print('scratch:', sorted(os.listdir(r / 'scratch')))"
    )
    for name, script in (("writer", write), ("reader", read)):
        body = _pod(name, [{"name": "main", "image": "x", "command": ["python", "-c", script], "env": ROOT_ENV, "volumeMounts": mounts}], volumes)
        c.core.create_namespaced_pod(NS, body, _request_timeout=TIMEOUT)
        pod = wait_for(functools.partial(_phase, c, name, "Succeeded", "Failed"), timeout=30, what=f"{name} finished")
        assert pod.status.phase == "Succeeded", _log(c, name)
    assert "cache: cached bytes" in _log(c, "reader") and "scratch: []" in _log(c, "reader")
    assert (cluster.claim_dir(NS, "cache") / "ds" / "part-0").read_text() == "cached bytes"
    assert not str(cluster.claim_dir(NS, "cache")).startswith(str(cluster.core.cluster_dir)), "claims are not in the shared dir"


def test_a_secret_volume_holds_the_decoded_keys_and_a_missing_secret_keeps_the_pod_from_starting(lk: LK) -> None:
    _, c = _cluster(lk)
    script = (
        "import os, pathlib; d = pathlib.Path(os.environ['GPUORCH_POD_ROOT'] + '/etc/creds'); "
        "print(sorted(p.name for p in d.iterdir())); print('key=' + (d / 'access-key').read_text()); "
        "print('renamed=' + (d / 'sub/secret').read_text())"
    )
    vol = {"name": "creds", "secret": {"secretName": "store-creds", "items": [
        {"key": "access-key", "path": "access-key"}, {"key": "secret-key", "path": "sub/secret"}]}}  # fmt: skip
    body = _pod("uses-secret", [{"name": "main", "image": "x", "command": ["python", "-c", script],
                                 "volumeMounts": [{"name": "creds", "mountPath": "/etc/creds", "readOnly": True}]}], [vol])  # fmt: skip
    c.core.create_namespaced_pod(NS, body, _request_timeout=TIMEOUT)

    def mount_failed() -> str:
        st = _read_pod(c, "uses-secret").status.container_statuses or []
        w = st[0].state.waiting if st and st[0].state else None
        return f"{w.reason}: {w.message}" if w and w.message else ""

    msg = wait_for(mount_failed, timeout=30, what="the mount failure in the container status")
    assert msg == 'ContainerCreating: MountVolume.SetUp failed for volume "creds" : secret "store-creds" not found'
    events = c.core.list_namespaced_event(NS, field_selector="involvedObject.name=uses-secret", _request_timeout=TIMEOUT).items
    assert any(e.reason == "FailedMount" and "store-creds" in e.message for e in events)
    assert _read_pod(c, "uses-secret").status.phase == "Pending"
    # the Secret appears: the kubelet's next try mounts it and the pod runs
    c.core.create_namespaced_secret(NS, {"metadata": {"name": "store-creds"}, "data": {
        "access-key": base64.b64encode(b"AKIA-local").decode(), "secret-key": base64.b64encode(b"s3cr3t").decode()}},
        _request_timeout=TIMEOUT)  # fmt: skip
    pod = wait_for(lambda: _phase(c, "uses-secret", "Succeeded", "Failed"), timeout=30, what="pod finished")
    log = _log(c, "uses-secret")
    assert pod.status.phase == "Succeeded", log
    assert "['access-key', 'sub']" in log and "key=AKIA-local" in log and "renamed=s3cr3t" in log


def _invalid(call: Any) -> list[dict[str, Any]]:
    with pytest.raises(ApiException) as err:
        call()
    assert err.value.status == 422, err.value.body
    body = json.loads(str(err.value.body))
    assert body["reason"] == "Invalid"
    return list(body["details"]["causes"])


def test_hostpath_and_what_a_local_cluster_cannot_give_are_refused_at_creation(lk: LK) -> None:
    _, c = _cluster(lk)
    host = [{"name": "data", "hostPath": {"path": "/data"}}]
    mount = [{"name": "data", "mountPath": "/data"}]
    ctr = {"name": "main", "image": "x", "command": ["true"], "volumeMounts": mount}
    causes = _invalid(lambda: c.core.create_namespaced_pod(NS, _pod("hp", [ctr], host), _request_timeout=TIMEOUT))
    assert causes[0]["field"] == "spec.volumes[0].hostPath"
    assert "hostPath volumes are not allowed on gpuorch local clusters" in causes[0]["message"]
    job = {"metadata": {"name": "hp"}, "spec": {"template": {"spec": {"restartPolicy": "Never", "volumes": host, "containers": [ctr]}}}}
    causes = _invalid(lambda: c.batch.create_namespaced_job(NS, job, _request_timeout=TIMEOUT))
    assert causes[0]["field"] == "spec.template.spec.volumes[0].hostPath" and "not allowed" in causes[0]["message"]
    assert not c.batch.list_namespaced_job(NS, _request_timeout=TIMEOUT).items

    nfs = [{"name": "data", "nfs": {"server": "x", "path": "/"}}]
    causes = _invalid(lambda: c.core.create_namespaced_pod(NS, _pod("nfs", [ctr], nfs), _request_timeout=TIMEOUT))
    assert causes[0]["field"] == "spec.volumes[0].nfs" and '"emptyDir", "persistentVolumeClaim", "secret"' in causes[0]["message"]

    undeclared = {**ctr, "volumeMounts": [{"name": "nope", "mountPath": "/x"}]}
    causes = _invalid(lambda: c.core.create_namespaced_pod(NS, _pod("undeclared", [undeclared], []), _request_timeout=TIMEOUT))
    assert causes[0]["field"] == "spec.containers[0].volumeMounts[0].name"

    probe = {"exec": {"command": ["true"]}}
    init = {"name": "setup", "image": "x", "command": ["true"], "startupProbe": probe}
    causes = _invalid(lambda: c.core.create_namespaced_pod(NS, _pod("probe", [ctr | {"volumeMounts": []}], [], [init]), _request_timeout=TIMEOUT))
    assert causes[0]["field"] == "spec.initContainers[0].startupProbe" and "restartPolicy=Always" in causes[0]["message"]
    http = {**ctr, "volumeMounts": [], "startupProbe": {"httpGet": {"port": 80}}}
    causes = _invalid(lambda: c.core.create_namespaced_pod(NS, _pod("http", [http], []), _request_timeout=TIMEOUT))
    assert causes[0]["field"] == "spec.containers[0].startupProbe.httpGet"


def test_a_container_sees_only_what_it_mounts(lk: LK) -> None:
    cluster, c = _cluster(lk)
    work = [{"name": "gpuorch-work", "emptyDir": {}}]
    mount = [{"name": "gpuorch-work", "mountPath": "/gpuorch"}]
    writer = "import os; os.makedirs(os.environ['OUT']); open(os.environ['OUT'] + '/secret.txt', 'w').write('x'); print('root', os.environ['GPUORCH_POD_ROOT'])"
    peeker = (
        "import os; out = os.environ['OUT']; print('root', os.environ['GPUORCH_POD_ROOT']); "
        "print('sees secret:', os.path.exists(out + '/secret.txt')); "
        "os.makedirs(out); open(out + '/leak.txt', 'w').write('y')"
    )
    reader = "import os; print('root', os.environ['GPUORCH_POD_ROOT']); print('listing:', sorted(os.listdir(os.environ['OUT'])))"
    env = [*ROOT_ENV, {"name": "OUT", "value": "$(GPUORCH_POD_ROOT)/gpuorch/out"}]

    def ctr(name: str, script: str, mounts: list[dict[str, Any]]) -> dict[str, Any]:
        return {"name": name, "image": "x", "command": ["python", "-c", script], "env": env, "volumeMounts": mounts}

    body = _pod("private", [ctr("reader", reader, mount)], work, [ctr("writer", writer, mount), ctr("peeker", peeker, [])])
    c.core.create_namespaced_pod(NS, body, _request_timeout=TIMEOUT)
    pod = wait_for(lambda: _phase(c, "private", "Succeeded", "Failed"), timeout=30, what="pod finished")
    logs = {n: _log(c, "private", n) for n in ("writer", "peeker", "reader")}
    assert pod.status.phase == "Succeeded", logs
    assert "sees secret: False" in logs["peeker"]
    assert "listing: ['secret.txt']" in logs["reader"], "what peeker wrote without the mount stayed in its own root"
    roots = {n: logs[n].split("root ", 1)[1].split()[0] for n in logs}
    assert len(set(roots.values())) == 3 and all(r.startswith(str(_pod_dir(cluster, pod))) for r in roots.values())
    assert POD_ROOT == "GPUORCH_POD_ROOT"


def test_a_sidecar_failing_its_startup_probe_is_restarted_and_the_main_container_waits(lk: LK) -> None:
    _, c = _cluster(lk)
    side = {"name": "agent", "image": "x", "restartPolicy": "Always", "command": ["sleep", "60"],
            "startupProbe": {"exec": {"command": ["python", "-c", "import sys; print('not ready yet'); sys.exit(1)"]},
                             "periodSeconds": 1, "failureThreshold": 1}}  # fmt: skip
    main = {"name": "main", "image": "x", "command": ["true"]}
    c.core.create_namespaced_pod(NS, _pod("never-ready", [main], [], [side]), _request_timeout=TIMEOUT)

    def restarted() -> Any:
        pod = _read_pod(c, "never-ready")
        st = (pod.status.init_container_statuses or [None])[0]
        return pod if st is not None and st.restart_count >= 1 else None

    pod = wait_for(restarted, timeout=30, what="sidecar restarted after its startup probe failed")
    st = pod.status.init_container_statuses[0]
    assert "startup probe failed 1 times" in st.last_state.terminated.message and "not ready yet" in st.last_state.terminated.message
    assert not st.ready
    assert pod.status.phase == "Pending" and pod.status.container_statuses[0].state.waiting.reason == "PodInitializing"
    events = c.core.list_namespaced_event(NS, field_selector="involvedObject.name=never-ready", _request_timeout=TIMEOUT).items
    assert any(e.reason == "Unhealthy" and "Startup probe failed" in e.message for e in events)
    c.core.delete_namespaced_pod("never-ready", NS, grace_period_seconds=0, _request_timeout=TIMEOUT)


def test_a_sidecar_that_exits_while_main_runs_is_restarted(lk: LK) -> None:
    _, c = _cluster(lk)
    flaky = (
        "import os, pathlib, signal, sys, time; w = pathlib.Path(os.environ['GPUORCH_POD_ROOT'] + '/w'); "
        "n = len(list(w.glob('run-*'))); (w / f'run-{n}').write_text('x'); "
        "signal.signal(signal.SIGTERM, lambda *_: sys.exit(0)); "
        "sys.exit(1) if n == 0 else (w / 'ok').write_text('second run'); "
        "time.sleep(60)"
    )
    waiter = (
        "import os, pathlib, sys, time; w = pathlib.Path(os.environ['GPUORCH_POD_ROOT'] + '/w'); d = time.monotonic() + 30\n"
        "while not (w / 'ok').exists():\n"
        "    if time.monotonic() > d: sys.exit(9)\n"
        "    time.sleep(0.02)\n"
        "print((w / 'ok').read_text())"
    )
    mount = [{"name": "w", "mountPath": "/w"}]
    side = {"name": "agent", "image": "x", "restartPolicy": "Always", "command": ["python", "-c", flaky], "volumeMounts": mount}
    main = {"name": "main", "image": "x", "command": ["python", "-c", waiter], "volumeMounts": mount}
    c.core.create_namespaced_pod(NS, _pod("flaky-agent", [main], [{"name": "w", "emptyDir": {}}], [side]), _request_timeout=TIMEOUT)
    pod = wait_for(lambda: _phase(c, "flaky-agent", "Succeeded", "Failed"), timeout=30, what="pod finished")
    assert pod.status.phase == "Succeeded", _log(c, "flaky-agent", "main")
    st = pod.status.init_container_statuses[0]
    assert st.restart_count >= 1 and st.last_state.terminated.exit_code == 1 and st.state.terminated.exit_code == 0
    assert "second run" in _log(c, "flaky-agent", "main")
