"""Builders for the plain dicts the official client's sanitize_for_serialization produces."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from gpuorch_proto import ClusterRegistryEntry
from gpuorch_proto.inventory import QueueRegistry

A100_80 = "NVIDIA-A100-SXM4-80GB"
A100_40 = "NVIDIA-A100-SXM4-40GB"
T0 = 1_800_000_000.0  # a fixed "now" for the tests


def iso(ts: float) -> str:
    """As sanitize_for_serialization renders an aware datetime."""
    return datetime.fromtimestamp(ts, UTC).isoformat()


def make_node(
    name: str,
    *,
    gpus: int = 8,
    product: str | None = A100_80,
    memory_mib: int | None = 81920,
    pool: str | None = "train",
    ready: bool = True,
    unschedulable: bool = False,
    taints: list[dict[str, str]] | None = None,
    labels: dict[str, str] | None = None,
    cpu: str = "64",
    memory: str = "512Gi",
) -> dict[str, Any]:
    lab: dict[str, str] = {"kubernetes.io/hostname": name}
    if pool is not None:
        lab["gpuorch.io/pool"] = pool
    if product is not None:
        lab["nvidia.com/gpu.product"] = product
    if memory_mib is not None:
        lab["nvidia.com/gpu.memory"] = str(memory_mib)
        lab["nvidia.com/gpu.count"] = str(gpus)
    lab.update(labels or {})
    allocatable = {"cpu": cpu, "memory": memory, "pods": "110"}
    if gpus:
        allocatable["nvidia.com/gpu"] = str(gpus)
    spec: dict[str, Any] = {}
    if taints:
        spec["taints"] = taints
    if unschedulable:
        spec["unschedulable"] = True
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": lab, "resourceVersion": "1"},
        "spec": spec,
        "status": {
            "allocatable": allocatable,
            "capacity": dict(allocatable),
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
        },
    }


def make_pod(
    name: str,
    *,
    node: str | None = None,
    gpus: int = 0,
    cpu: str = "1",
    memory: str = "1Gi",
    phase: str | None = None,
    queue: str | None = None,
    created: float | None = None,
    started: float | None = None,
    expected: float | None = None,
    priority: int = 0,
    job: str | None = None,
    node_selector: dict[str, str] | None = None,
    tolerations: list[dict[str, str]] | None = None,
    init_gpus: int = 0,
    deleting: bool = False,
) -> dict[str, Any]:
    labels: dict[str, str] = {}
    if queue is not None:
        labels["gpuorch.io/queue"] = queue
    if job is not None:
        labels["batch.kubernetes.io/job-name"] = job
    limits: dict[str, str] = {"cpu": cpu, "memory": memory}
    if gpus:
        limits["nvidia.com/gpu"] = str(gpus)
    spec: dict[str, Any] = {
        "containers": [{"name": "main", "image": "x", "resources": {"limits": limits, "requests": dict(limits)}}],
        "priority": priority,
    }
    if init_gpus:
        spec["initContainers"] = [
            {"name": "stage", "image": "x", "resources": {"limits": {"nvidia.com/gpu": str(init_gpus)}}}
        ]
    if node is not None:
        spec["nodeName"] = node
    if node_selector:
        spec["nodeSelector"] = node_selector
    if tolerations:
        spec["tolerations"] = tolerations
    meta: dict[str, Any] = {
        "name": name,
        "namespace": "default",
        "uid": f"uid-{name}",
        "labels": labels,
        "creationTimestamp": iso(created if created is not None else T0 - 600),
    }
    if expected is not None:
        meta["annotations"] = {"gpuorch.io/expected-duration-seconds": str(expected)}
    if deleting:
        meta["deletionTimestamp"] = iso(T0)
    status: dict[str, Any] = {"phase": phase or ("Running" if node else "Pending")}
    if started is not None:
        status["startTime"] = iso(started)
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec, "status": status}


def make_registry(
    *queues: str, admission: str = "none", datasets: list[str] | None = None, **kw: Any
) -> ClusterRegistryEntry:
    return ClusterRegistryEntry(
        queues=[QueueRegistry(name=q) for q in queues],
        admission=admission,  # type: ignore[arg-type]
        datasets_cached=datasets or [],
        **kw,
    )
