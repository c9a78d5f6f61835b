"""Faults: partition/heal, node loss, capacity, slow API; the CLI serve/fault/shutdown cycle."""

from __future__ import annotations

import functools
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import urllib3
import yaml

from .helpers import (
    LK,
    TIMEOUT,
    condition,
    job_body,
    job_finished,
    job_pods,
    k8s,
    new_watch,
    node_group,
    pid_alive,
    running_pid,
    wait_for,
)

WAIT_FOR_GO = "import os, time, pathlib\np = pathlib.Path(os.environ['GPUORCH_CLUSTER_DIR'], 'go')\nwhile not p.exists(): time.sleep(0.01)\nprint('finished')"


def test_partition_is_unreachable_not_gone_and_heal_shows_the_advanced_state(lk: LK) -> None:
    h = lk({"name": "c1", "nodes": [node_group()]})
    cl = h.clusters["c1"]
    c = h.client("c1")
    c.batch.create_namespaced_job("default", job_body("part", ["python", "-c", WAIT_FOR_GO]), _request_timeout=TIMEOUT)
    pod_name = wait_for(lambda: job_pods(c, "part"))[0].metadata.name
    pid = wait_for(lambda: running_pid(c, pod_name))
    assert cl.pod_pids("default", pod_name) == {"main": pid}
    url = cl.url

    cl.partition()
    assert cl.partitioned
    with pytest.raises(urllib3.exceptions.HTTPError):  # connection refused: not an ApiException 404
        c.batch.read_namespaced_job("part", "default", _request_timeout=(1, 2))
    with pytest.raises(urllib3.exceptions.HTTPError):
        c.core.list_namespaced_pod("default", _request_timeout=(1, 2))
    assert pid_alive(pid)  # the process keeps running during the partition

    (cl.state_dir / "shared" / "go").touch()  # let it finish while nobody can see
    wait_for(lambda: not pid_alive(pid), what="process exit during partition")
    wait_for(lambda: (cl.core.store.get("pods", "default", pod_name) or {})["status"]["phase"] == "Succeeded",
             what="kubelet updates the phase during the partition")

    cl.heal()
    assert cl.url == url and not cl.partitioned
    job = wait_for(lambda: job_finished(c, "part"))
    assert job.status.succeeded == 1
    pod = c.core.read_namespaced_pod(pod_name, "default", _request_timeout=TIMEOUT)
    assert pod.status.phase == "Succeeded"
    assert c.core.read_namespaced_pod_log(pod_name, "default", _request_timeout=TIMEOUT).strip() == "finished"


def test_partition_cuts_open_watches(lk: LK) -> None:
    h = lk({"name": "c1", "nodes": [node_group()]})
    cl = h.clusters["c1"]
    c = h.client("c1")
    stream = new_watch().stream(c.core.list_node, timeout_seconds=30, _request_timeout=(2, 40))
    assert next(stream)["type"] == "ADDED"
    assert next(stream)["type"] == "ADDED"
    cl.partition()
    with pytest.raises(urllib3.exceptions.HTTPError):
        next(stream)
    cl.heal()
    assert len(c.core.list_node(_request_timeout=TIMEOUT).items) == 2


def test_lose_node_kills_its_processes_and_fails_its_pods(lk: LK) -> None:
    h = lk({"name": "c1", "nodes": [node_group(count=2, gpus=4)]})
    cl = h.clusters["c1"]
    c = h.client("c1")
    body = job_body("pair", ["sleep", "60"], gpus=4, parallelism=2, completions=2, indexed=True, backoff=5)
    c.batch.create_namespaced_job("default", body, _request_timeout=TIMEOUT)
    pods = wait_for(lambda: len(job_pods(c, "pair")) == 2 and job_pods(c, "pair"))
    for p in pods:
        wait_for(functools.partial(running_pid, c, p.metadata.name))
    pods = job_pods(c, "pair")
    by_node = {p.spec.node_name: p for p in pods}
    pids = {n: int(p.metadata.annotations["gpuorch.io/pid"]) for n, p in by_node.items()}
    assert set(pids) == {"gpu-0", "gpu-1"}
    rv = c.core.list_namespaced_pod("default", _request_timeout=TIMEOUT).metadata.resource_version
    node_rv = c.core.list_node(_request_timeout=TIMEOUT).metadata.resource_version

    lost = cl.lose_node("gpu-0")
    assert lost == [f"default/{by_node['gpu-0'].metadata.name}"]
    assert not pid_alive(pids["gpu-0"]) and pid_alive(pids["gpu-1"])
    assert [n.metadata.name for n in c.core.list_node(_request_timeout=TIMEOUT).items] == ["gpu-1"]
    node_events = [(e["type"], e["object"].metadata.name) for e in new_watch().stream(
        c.core.list_node, resource_version=node_rv, timeout_seconds=1, _request_timeout=(2, 10))]
    assert node_events == [("DELETED", "gpu-0")]

    victim = by_node["gpu-0"].metadata.name
    seen = []
    w = new_watch()
    for ev in w.stream(c.core.list_namespaced_pod, "default", resource_version=rv, timeout_seconds=10, _request_timeout=(2, 20)):
        o = ev["object"]
        if o.metadata.name == victim:
            seen.append((ev["type"], o.status.phase, o.status.reason))
            if ev["type"] == "DELETED":
                w.stop()
    assert ("MODIFIED", "Failed", "NodeLost") in seen and seen[-1][0] == "DELETED"
    # the replacement for index 0 has nowhere to go: the only node left is busy
    def replacement() -> Any:
        pods = [p for p in job_pods(c, "pair") if p.metadata.name != victim and p.spec.node_name is None]
        return pods and condition(pods[0], "PodScheduled") and pods[0]
    pod = wait_for(replacement)
    assert pod.metadata.annotations["batch.kubernetes.io/job-completion-index"] == "0"
    job = c.batch.read_namespaced_job("pair", "default", _request_timeout=TIMEOUT)
    assert job.status.failed == 1

    cl.add_node("gpu-0")
    wait_for(lambda: running_pid(c, pod.metadata.name), what="replacement runs on the re-added node")


def test_capacity_change_and_slow_api(lk: LK) -> None:
    h = lk({"name": "c1", "nodes": [node_group(count=1, gpus=4)]})
    cl = h.clusters["c1"]
    c = h.client("c1")
    cl.set_node_gpus("gpu-0", 1)
    node = c.core.read_node("gpu-0", _request_timeout=TIMEOUT)
    assert node.status.allocatable["nvidia.com/gpu"] == "1"
    c.batch.create_namespaced_job("default", job_body("two", ["true"], gpus=2), _request_timeout=TIMEOUT)
    pod = wait_for(lambda: job_pods(c, "two") and condition(job_pods(c, "two")[0], "PodScheduled") and job_pods(c, "two")[0])
    assert condition(pod, "PodScheduled").message == "0/1 nodes are available: 1 Insufficient nvidia.com/gpu."
    cl.set_node_gpus("gpu-0", 8)
    wait_for(lambda: job_finished(c, "two"))
    with pytest.raises(KeyError):
        cl.lose_node("nope")

    cl.slow_api(0.6)
    t0 = time.monotonic()
    c.core.list_node(_request_timeout=(2, 5))
    assert time.monotonic() - t0 >= 0.6
    with pytest.raises(urllib3.exceptions.HTTPError):  # a read timeout, not an answer
        c.core.list_node(_request_timeout=(1, 0.2))
    cl.slow_api(0)
    t0 = time.monotonic()
    c.core.list_node(_request_timeout=(2, 5))
    assert time.monotonic() - t0 < 0.5


def test_cli_serve_fault_and_clean_shutdown(tmp_path: Path) -> None:
    config = {
        "time_scale": 100,
        "clusters": [{
            "name": "alpha",
            "nodes": [node_group(count=1, gpus=2)],
            "background": [{"name": "other", "gpus_per_job": 1, "jobs": 2, "duration": "1h"}],
            "registry": {"price_per_gpu_hour": 1.0},
        }],
    }
    cfg_path = tmp_path / "clusters.yaml"
    cfg_path.write_text(yaml.safe_dump(config))
    state, kubeconfig = tmp_path / "state", tmp_path / "kc.yaml"
    out = (tmp_path / "serve.log").open("w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpuorch_localkube", "serve", "--config", str(cfg_path), "--state-dir", str(state),
         "--kubeconfig", str(kubeconfig), "--grace", "1"],
        stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
    )
    try:
        wait_for(lambda: "localkube ready" in (tmp_path / "serve.log").read_text(), timeout=20, what="localkube ready")
        admin = json.loads((state / "admin.json").read_text())
        assert admin["pid"] == proc.pid and admin["admin_port"] > 0
        c = k8s(kubeconfig, "alpha")
        pods = wait_for(lambda: [p for p in c.core.list_namespaced_pod("tenants", _request_timeout=TIMEOUT).items if p.status.phase == "Running"
                                 and len(c.core.list_namespaced_pod("tenants", _request_timeout=TIMEOUT).items) == 2])
        pids = [int(p.metadata.annotations["gpuorch.io/pid"]) for p in pods]
        assert len(pids) == 2 and all(pid_alive(p) for p in pids)

        def fault(*args: str) -> dict[str, Any]:
            r = subprocess.run([sys.executable, "-m", "gpuorch_localkube", "fault", "--state-dir", str(state), "alpha", *args],
                               capture_output=True, text=True, timeout=30)
            assert r.returncode == 0, r.stderr + r.stdout
            out: dict[str, Any] = json.loads(r.stdout)
            return out

        assert fault("partition")["result"]["partitioned"] is True
        with pytest.raises(urllib3.exceptions.HTTPError):
            c.core.list_node(_request_timeout=(1, 2))
        assert fault("heal")["ok"]
        assert len(c.core.list_node(_request_timeout=TIMEOUT).items) == 1
        fault("capacity", "gpu-0", "3")
        assert c.core.read_node("gpu-0", _request_timeout=TIMEOUT).status.allocatable["nvidia.com/gpu"] == "3"
        bad = subprocess.run([sys.executable, "-m", "gpuorch_localkube", "fault", "--state-dir", str(state), "alpha", "lose-node", "nope"],
                             capture_output=True, text=True, timeout=30)
        assert bad.returncode == 1 and "nope" in bad.stdout

        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 0
        assert not [p for p in pids if pid_alive(p)], "pod processes survived shutdown"
        assert not (state / "admin.json").exists()
        assert "localkube stopped" in (tmp_path / "serve.log").read_text()
        with pytest.raises(urllib3.exceptions.HTTPError):
            c.core.list_node(_request_timeout=(1, 2))
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        out.close()
