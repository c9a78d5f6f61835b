"""Termination messages as the kubelet reports them: what a container wrote to its
``terminationMessagePath`` (default ``/dev/termination-log``, created fresh in its private root
before each start) is its terminated state's ``message``, at most 4096 bytes, kept in
``lastState`` across a restart; ``FallbackToLogsOnError`` gives a failed container that wrote none
its log's tail. Read back through the official client, as the dispatcher reads a stage
container's record (issue 28: measured staging throughput)."""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

from gpuorch_proto import podpath
from gpuorch_proto.storage import StoreConfig, pod_store_env

from .helpers import LK, TIMEOUT, K8s, node_group, wait_for

NS = "default"
ROOT_ENV = [{"name": "GPUORCH_POD_ROOT", "value": ""}]  # as gpuorch's Jobs say it (a real node's root)


def _cluster(lk: LK) -> K8s:
    return lk({"name": "c1", "nodes": [node_group("cpu", count=1, gpus=0)]}).client("c1")


def _pod(name: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": {"restartPolicy": "Never", **spec}}


def _finished(c: K8s, name: str) -> Any:
    pod = c.core.read_namespaced_pod(name, NS, _request_timeout=TIMEOUT)
    return pod if pod.status.phase in ("Succeeded", "Failed") else None


def test_a_stage_containers_record_is_its_termination_message(lk: LK, tmp_path: Path) -> None:
    c = _cluster(lk)
    location = tmp_path / "location"
    (location / "mnist@v2").mkdir(parents=True)
    (location / "mnist@v2" / "part-0").write_bytes(b"x" * 70_000)
    env = [*ROOT_ENV, *pod_store_env("eu-data", StoreConfig(url=location.resolve().as_uri()), None)]
    stage = {
        "name": "stage-0", "image": podpath.AGENT_IMAGE, "env": env,
        "command": ["python", "-m", "gpuorch.workloads.agent", "stage", "--store", "eu-data", "--dataset", "mnist@v2",
                    "--size-gb", "0.07", "--bandwidth-mbps", "700", "--time-scale", "100"],
        "volumeMounts": [{"name": podpath.CACHE_VOLUME, "mountPath": podpath.CACHE}],
    }  # fmt: skip
    main = {"name": "main", "image": "user", "command": ["python", "-c", "print('trained')"]}
    volumes = [{"name": podpath.CACHE_VOLUME, "persistentVolumeClaim": {"claimName": "cache"}}]
    c.core.create_namespaced_pod(NS, _pod("stager", {"initContainers": [stage], "containers": [main], "volumes": volumes}), _request_timeout=TIMEOUT)

    pod = wait_for(functools.partial(_finished, c, "stager"), timeout=60, what="the pod finished")
    st = pod.status.init_container_statuses[0]
    assert pod.status.phase == "Succeeded", st
    assert st.name == "stage-0" and st.state.terminated.exit_code == 0
    record = json.loads(st.state.terminated.message)
    assert record["store"] == "eu-data" and record["dataset"] == "mnist@v2" and record["cache_hit"] is False
    assert record["bytes"] == 70_000 and record["size_gb"] == 0.07 and record["simulated_seconds"] >= 0.1
    assert "objects" not in record
    # the main container wrote none: no message
    assert pod.status.container_statuses[0].state.terminated.message is None


def test_a_message_is_capped_kept_in_last_state_and_fresh_for_each_start(lk: LK) -> None:
    c = _cluster(lk)
    # first run: 5000 bytes of message, exit 3; the restart (OnFailure) writes none and exits 0
    script = (
        "import os, pathlib, sys; r = pathlib.Path(os.environ['GPUORCH_POD_ROOT']); ran = r / 'scratch/ran'\n"
        "if ran.exists(): sys.exit(0)\n"
        "ran.write_text('1'); (r / 'dev/termination-log').write_text('m' * 5000); sys.exit(3)\n"
    )
    main = {"name": "main", "image": "x", "command": ["python", "-c", script], "env": ROOT_ENV,
            "volumeMounts": [{"name": "scratch", "mountPath": "/scratch"}]}  # fmt: skip
    spec = {"restartPolicy": "OnFailure", "containers": [main], "volumes": [{"name": "scratch", "emptyDir": {}}]}
    c.core.create_namespaced_pod(NS, _pod("capped", spec), _request_timeout=TIMEOUT)
    pod = wait_for(functools.partial(_finished, c, "capped"), timeout=60, what="the pod finished")
    st = pod.status.container_statuses[0]
    assert pod.status.phase == "Succeeded" and st.restart_count == 1
    assert st.last_state.terminated.exit_code == 3 and st.last_state.terminated.message == "m" * 4096
    assert st.state.terminated.exit_code == 0 and st.state.terminated.message is None


def test_fallback_to_logs_on_error_and_a_path_of_its_own(lk: LK) -> None:
    c = _cluster(lk)
    fails = {"name": "fails", "image": "x", "terminationMessagePolicy": "FallbackToLogsOnError",
             "command": ["python", "-c", "import sys; print('line one'); print('it broke'); sys.exit(4)"]}  # fmt: skip
    writes = {
        "name": "writes", "image": "x", "env": ROOT_ENV, "terminationMessagePath": "/scratch/why",
        "command": ["python", "-c", "import os; open(os.environ['GPUORCH_POD_ROOT'] + '/scratch/why', 'w').write('my own')"],
        "volumeMounts": [{"name": "scratch", "mountPath": "/scratch"}],
    }  # fmt: skip
    spec = {"containers": [fails, writes], "volumes": [{"name": "scratch", "emptyDir": {}}]}
    c.core.create_namespaced_pod(NS, _pod("fallback", spec), _request_timeout=TIMEOUT)
    pod = wait_for(functools.partial(_finished, c, "fallback"), timeout=60, what="the pod finished")
    by_name = {s.name: s.state.terminated for s in pod.status.container_statuses}
    assert by_name["fails"].exit_code == 4 and by_name["fails"].message == "line one\nit broke\n"
    assert by_name["writes"].exit_code == 0 and by_name["writes"].message == "my own"
