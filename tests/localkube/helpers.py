"""Helpers for localkube tests: polling with a deadline, clients built from the kubeconfig."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import kubernetes
import kubernetes.watch
import urllib3
from kubernetes.client.exceptions import ApiException

from gpuorch_localkube import LocalClusters

TIMEOUT = (2, 10)  # (connect, read) for every client call

GPU = "nvidia.com/gpu"


def wait_for(predicate: Callable[[], Any], timeout: float = 10.0, interval: float = 0.02, what: str = "") -> Any:
    """Poll `predicate` until it returns something truthy; fail after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while True:
        try:
            last = predicate()
        except ApiException as e:  # a transient answer (e.g. 404 before creation) is just "not yet"
            last = e
        else:
            if last:
                return last
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what or predicate}: last={last!r}")
        time.sleep(interval)


def pid_alive(pid: int | None) -> bool:
    if pid is None:
        raise AssertionError("no pid")
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def reason_of(e: ApiException) -> str:
    return str(json.loads(str(e.body))["reason"])


@dataclass
class K8s:
    # typed as Any: the models make every field Optional, which only adds noise to assertions
    api: Any
    core: Any
    batch: Any


def k8s(kubeconfig: Path, context: str) -> K8s:
    """The official client, from the kubeconfig context, with bounded retries (see the API notes)."""
    cfg = kubernetes.client.Configuration()
    cfg.retries = urllib3.Retry(total=2, connect=2, read=0, status=0, backoff_factor=0)
    api = kubernetes.config.new_client_from_config(  # type: ignore[no-untyped-call]
        config_file=str(kubeconfig), context=context, client_configuration=cfg
    )
    return K8s(api, kubernetes.client.CoreV1Api(api), kubernetes.client.BatchV1Api(api))


@dataclass
class Harness:
    clusters: LocalClusters
    kubeconfig: Path

    def client(self, name: str) -> K8s:
        return k8s(self.kubeconfig, name)


def node_group(name: str = "gpu", count: int = 2, gpus: int = 4, **extra: Any) -> dict[str, Any]:
    return {
        "name": name,
        "count": count,
        "gpu": {"model": "NVIDIA-A100-SXM4-80GB", "memory_mib": 81920, "count": gpus},
        "cpu": "16",
        "memory": "64Gi",
        **extra,
    }


def job_body(
    name: str,
    command: list[str],
    *,
    gpus: int = 0,
    parallelism: int | None = None,
    completions: int | None = None,
    indexed: bool = False,
    annotations: dict[str, str] | None = None,
    restart: str = "Never",
    backoff: int = 0,
    pod_spec: dict[str, Any] | None = None,
    container: dict[str, Any] | None = None,
    **spec: Any,
) -> dict[str, Any]:
    c: dict[str, Any] = {"name": "main", "image": "local", "command": command}
    if gpus:
        c["resources"] = {"limits": {GPU: str(gpus)}}
    c.update(container or {})
    body: dict[str, Any] = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, **({"annotations": annotations} if annotations else {})},
        "spec": {
            "backoffLimit": backoff,
            "template": {"spec": {"restartPolicy": restart, "containers": [c], **(pod_spec or {})}},
            **spec,
        },
    }
    if parallelism is not None:
        body["spec"]["parallelism"] = parallelism
    if completions is not None:
        body["spec"]["completions"] = completions
    if indexed:
        body["spec"]["completionMode"] = "Indexed"
    return body


def job_pods(c: K8s, job: str, namespace: str = "default") -> list[Any]:
    return list(c.core.list_namespaced_pod(namespace, label_selector=f"job-name={job}", _request_timeout=TIMEOUT).items)


def condition(obj: Any, ctype: str) -> Any:
    for cond in obj.status.conditions or []:
        if cond.type == ctype:
            return cond
    return None


def job_finished(c: K8s, name: str, ctype: str = "Complete", namespace: str = "default") -> Any:
    job = c.batch.read_namespaced_job(name, namespace, _request_timeout=TIMEOUT)
    cond = condition(job, ctype)
    return job if cond is not None and cond.status == "True" else None


def running_pid(c: K8s, pod_name: str, namespace: str = "default") -> int | None:
    pod = c.core.read_namespaced_pod(pod_name, namespace, _request_timeout=TIMEOUT)
    if pod.status.phase != "Running":
        return None
    pid = (pod.metadata.annotations or {}).get("gpuorch.io/pid")
    return int(pid) if pid else None


def raw_call(c: K8s, method: str, path: str, body: Any = None) -> Any:
    """A request the typed API would refuse to send (the client validates bodies): returns the decoded
    JSON answer, or raises ApiException for an error status, as the typed calls do."""
    headers = {"Content-Type": "application/json", "Accept": "application/json"}
    params = c.api.param_serialize(method=method, resource_path=path, header_params=headers, body=body)
    resp = c.api.call_api(*params, _request_timeout=TIMEOUT)
    resp.read()
    return c.api.response_deserialize(resp, {"2XX": "object"}).data


def new_watch() -> Any:
    """kubernetes.watch.Watch (untyped in the client)."""
    return kubernetes.watch.Watch()  # type: ignore[no-untyped-call]


LK = Callable[..., Harness]
