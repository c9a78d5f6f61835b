"""One code path for a local cluster and a real one: LocalClusters in-process, the official client,
the same listing the service does, the pure core."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuorch.kube import ClusterClient, make_clients, unreachable
from gpuorch_inventory.core import build_snapshot, queue_shape_waits
from gpuorch_inventory.service import describe_failure, list_cluster
from gpuorch_localkube import LocalClusters
from gpuorch_proto import ClusterSnapshot, Taint

from ..support.wait import assert_eventually
from .builders import make_registry

SCALE = 600.0
CONFIG = {
    "time_scale": SCALE,
    "clusters": [
        {
            "name": "lab",
            "nodes": [
                {"name": "a100", "count": 2, "pool": "train", "gpu": {"model": "NVIDIA-A100-SXM4-80GB", "memory_mib": 81920, "count": 8}},
                {
                    "name": "l4",
                    "count": 1,
                    "pool": "short",
                    "gpu": {"model": "NVIDIA-L4", "memory_mib": 23034, "count": 4},
                    "taints": [{"key": "gpuorch.io/short-only", "value": "true", "effect": "NoSchedule"}],
                },
                {"name": "cpu", "count": 1},
            ],
            # 3 jobs x 8 GPUs x 2 h on the two A100 nodes: two run, one waits
            "background": [
                {"name": "tenant", "gpus_per_job": 8, "jobs": 3, "duration": "2h", "node_selector": {"gpuorch.io/pool": "train"}}
            ],
        }
    ],
}


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LocalClusters, ClusterClient]]:
    state = tmp_path_factory.mktemp("localkube")
    with LocalClusters(CONFIG, state) as clusters:
        kubeconfig = clusters.write_kubeconfig(state / "kubeconfig")
        yield clusters, make_clients(Path(kubeconfig))["lab"]


def observe(cc: ClusterClient) -> tuple[ClusterSnapshot, list[dict], list[dict]]:
    nodes, pods = list_cluster(cc)
    now = time.time()
    snap = build_snapshot("lab", nodes, pods, make_registry("training"), now=now, observed_at=now, time_scale=SCALE)
    return snap, nodes, pods


async def test_snapshot_of_a_local_cluster_through_the_official_client(lab):
    _, cc = lab

    def loaded() -> ClusterSnapshot:
        snap, _, _ = observe(cc)
        assert (snap.running_gpus, snap.pending_gpus) == (16, 8), (snap.running_gpus, snap.pending_gpus)
        return snap

    snap = await assert_eventually(loaded, timeout=15)
    by_name = {n.name: n for n in snap.nodes}
    assert sorted(by_name) == ["a100-0", "a100-1", "cpu-0", "l4-0"]
    a100, l4, cpu = by_name["a100-0"], by_name["l4-0"], by_name["cpu-0"]
    assert (a100.pool, a100.gpu_product, a100.gpu_memory_mib, a100.gpus_allocatable, a100.gpus_free) == (
        "train", "NVIDIA-A100-SXM4-80GB", 81920, 8, 0,
    )
    assert (l4.gpus_free, l4.gpu_memory_mib) == (4, 23034)
    assert Taint(key="gpuorch.io/short-only", value="true", effect="NoSchedule") in l4.taints
    assert (cpu.gpus_allocatable, cpu.gpu_product) == (0, None)
    assert all(n.ready for n in snap.nodes)
    default = next(q for q in snap.queues if q.name == "default")  # tenants' pods carry no queue label
    assert (default.pending_jobs, default.pending_gpus) == (1, 8)


async def test_queue_wait_of_a_local_cluster_comes_from_the_background_jobs_remaining_time(lab):
    _, cc = lab

    def waits():
        _, nodes, pods = observe(cc)
        # only the A100 nodes: the free L4 would let a 1-GPU request start at once
        a100 = [n for n in nodes if n["metadata"]["name"].startswith("a100")]
        w = queue_shape_waits("lab", a100, pods, make_registry(), now=time.time(), time_scale=SCALE)["default"][0]
        assert w.source == "runtime", w
        return w

    w = await assert_eventually(waits, timeout=15)
    # both running jobs end within their 2 h; the waiting one takes the first freed node,
    # so a new request gets the second one when its job ends
    assert 0 < w.seconds <= 7200


async def test_a_partitioned_local_cluster_is_unreachable_not_an_api_error(lab):
    clusters, cc = lab
    clusters["lab"].partition()
    try:
        with pytest.raises(Exception) as exc:
            list_cluster(cc)
        assert unreachable(exc.value)
        assert describe_failure(exc.value).startswith("unreachable: ")
        assert "0x" not in describe_failure(exc.value)  # no object addresses: stable across rounds
    finally:
        clusters["lab"].heal()
    snap, _, _ = observe(cc)
    assert snap.reachable and len(snap.nodes) == 4
