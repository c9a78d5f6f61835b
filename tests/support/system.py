"""The embedded system for tests: `running` starts one (over a clusters file, or a registry
built with `registry` and `one_node`) and stops it on the way out; the fixtures over it (each
module's or directory's `system`): a client of the bus as the `client` identity, and the official
Kubernetes client per cluster."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpuorch.client import Client
from gpuorch.kube import make_clients
from gpuorch.system import System

A100 = {"model": "NVIDIA-A100-SXM4-80GB", "memory_mib": 81920}


def one_node(name: str, gpus: int, *, cpu: str = "64", memory: str = "512Gi", stores: tuple[str, ...] = ("prod",),
             **registry: Any) -> dict[str, Any]:  # fmt: skip
    """A cluster of one A100 node with `gpus` GPUs (`<name>-gpu`, pool `train`), its registry
    entry open to every owner on a `default` queue; `registry` adds to (or replaces) its entry."""
    return {
        "name": name,
        "nodes": [{"name": f"{name}-gpu", "count": 1, "pool": "train", "cpu": cpu, "memory": memory, "gpu": {**A100, "count": gpus}}],
        "registry": {
            "price_per_gpu_hour": 3.0, "artifact_stores": list(stores),
            "queues": [{"name": "default", "owners": ["*"]}], "startup_seconds": 30, **registry,
        },
    }  # fmt: skip


def registry(*clusters: Mapping[str, Any], time_scale: float = 600, admission_policy: str | None = None,
             **more: Any) -> dict[str, Any]:  # fmt: skip
    """A clusters file's document: the clusters, at `time_scale` simulated seconds per real
    second on the jobs' simulated clock; `admission_policy`: the policy file beside it."""
    doc: dict[str, Any] = {"time_scale": time_scale, "job_clock": "simulated"}
    if admission_policy:
        doc["admission_policy"] = admission_policy
    return {**doc, "clusters": [dict(c) for c in clusters], **more}


@contextlib.contextmanager
def running(
    state: Path,
    clusters_file: Path | None = None,
    *,
    clusters: Mapping[str, Any] | None = None,
    policy: Mapping[str, Any] | None = None,
    **system: Any,
) -> Iterator[System]:
    """A started system in `state` over `clusters_file`, or over the document `clusters` (written
    as `state/clusters.yaml`, with `policy` as the `policy.yaml` it may name); stopped (every
    process) on the way out. `system`: `System`'s other settings (env_extra, clients, replicas)."""
    if clusters is not None:
        clusters_file = state / "clusters.yaml"
        clusters_file.write_text(yaml.safe_dump(dict(clusters)))
    if policy is not None:
        (state / "policy.yaml").write_text(yaml.safe_dump(dict(policy)))
    assert clusters_file is not None, "a clusters file or a clusters document"
    s = System(state_dir=state, clusters_file=clusters_file, **system)
    s.start()
    try:
        yield s
    finally:
        s.stop()


@pytest.fixture
async def client(system: System) -> AsyncIterator[Client]:
    s = system.settings
    async with Client(s.nats_url, s.names, creds=s.nats_creds) as c:
        yield c


@pytest.fixture(scope="module")
def kube(system: System) -> dict:
    return make_clients(system.kubeconfig)


def stores_of_system(system: System) -> Any:
    """The system's stores (`gpuorch.objectstore.Stores`), as its control plane reaches them."""
    from gpuorch.config import load_registry
    from gpuorch.stores import stores_of

    st = system.settings
    return stores_of(st, load_registry(st.registry) if st.registry else None)


async def manifests_of(system: System, workload_id: str) -> dict[str, Any]:
    """Every result manifest of `workload_id` in any of the system's stores: store -> Manifest."""
    from gpuorch_fencer.publish import read_manifest

    stores = stores_of_system(system)
    out = {}
    for name in sorted(stores.configs):
        m = await read_manifest(stores[name], workload_id)
        if m is not None:
            out[name] = m
    return out


async def result_object(system: System, result_path: str | None, key: str) -> bytes:
    """One object of a workload's promoted result, read as every reader reads it (the CLI, a
    pipeline's next stage): through its manifest in the store (issue 28)."""
    from gpuorch_fencer.publish import read_object, resolve_result

    stores = stores_of_system(system)
    assert result_path, "the workload has no result"
    m = await resolve_result(stores, result_path)
    return await read_object(stores, m, key)


async def keys_at(system: System, url: str) -> list[str]:
    """The keys of the objects under `url` (an attempt's prefix, its checkpoints), listed through
    the store that holds it: what the dispatcher sees, not a path on this machine."""
    stores = stores_of_system(system)
    where = stores.locate(url)
    assert where is not None, f"{url!r} is in none of the system's stores"
    name, key = where
    return [o.key for o in await stores[name].list(key)]
