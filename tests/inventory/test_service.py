"""The inventory service against a real nats-server and a local cluster."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from nats.js import JetStreamContext

from gpuorch.config import Registry, Settings
from gpuorch.kube import make_clients
from gpuorch_inventory.service import Inventory
from gpuorch_localkube import LocalClusters
from gpuorch_proto import ClusterSnapshot, Names, decode_snapshot

from ..support.wait import assert_eventually
from .builders import make_registry

SCALE = 600.0
CONFIG = {
    "time_scale": SCALE,
    "clusters": [
        {
            "name": "edge",
            "nodes": [{"name": "gpu", "count": 1, "pool": "train", "gpu": {"model": "NVIDIA-A100-SXM4-40GB", "memory_mib": 40960, "count": 4}}],
            "registry": {"artifact_stores": ["scratch"], "datasets_cached": ["mnist@v1"], "queues": [{"name": "research"}]},
        }
    ],
}


@pytest.fixture(scope="module")
def edge(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LocalClusters, Path, Path]]:
    state = tmp_path_factory.mktemp("edge")
    registry = state / "clusters.yaml"
    registry.write_text(yaml.safe_dump(CONFIG))
    with LocalClusters(CONFIG, state / "lk") as clusters:
        yield clusters, clusters.write_kubeconfig(state / "kubeconfig"), registry


async def last_snapshot(js: JetStreamContext, names: Names, cluster: str) -> ClusterSnapshot | None:
    try:
        msg = await js.get_last_msg(names.stream_inventory, names.inventory(cluster))
    except Exception:
        return None
    return decode_snapshot(msg.data)


async def test_publishes_snapshots_staged_datasets_heartbeats_and_reachability(edge, nats_url, nats_auth, names, js):
    clusters, kubeconfig, _ = edge
    kv = await js.key_value(names.kv_staged)
    # as the dispatcher writes it (hashed key, the ref in the value), and a key that names the ref
    await kv.put("edge.5b0c0e3a1f2d4c6e", json.dumps({"cluster": "edge", "ref": "imagenet@v3", "at": 1.0}).encode())
    await kv.put("other.5b0c0e3a1f2d4c6e", json.dumps({"cluster": "other", "ref": "coco@2017", "at": 1.0}).encode())

    creds = nats_auth.register(names, clusters=["edge"]).creds("inventory")  # inventory's own identity
    settings = Settings(nats_url=nats_url, prefix=names.prefix, nats_creds=creds)
    registry = Registry(clusters={"edge": make_registry("research", datasets=["mnist@v1"])}, time_scale=SCALE)
    inv = Inventory(settings, interval=0.05, heartbeat=0.3, clients=make_clients(kubeconfig), registry=registry)
    stop = asyncio.Event()
    task = asyncio.create_task(inv.run(stop))
    try:

        async def fresh() -> ClusterSnapshot:
            s = await last_snapshot(js, names, "edge")
            assert s is not None and s.reachable
            return s

        first = await assert_eventually(fresh, timeout=10)
        assert [n.name for n in first.nodes] == ["gpu-0"] and first.nodes[0].gpus_free == 4
        assert first.registry.datasets_cached == ["mnist@v1", "imagenet@v3"]
        assert [q.name for q in first.queues] == ["research", "default"]
        assert first.time_scale == SCALE

        # a dataset staged while running shows up; a deleted entry goes away
        await kv.put("edge.0f9e8d7c6b5a4938", json.dumps({"cluster": "edge", "ref": "coco@2017", "at": 2.0}).encode())

        async def has_coco() -> bool:
            s = await fresh()
            return "coco@2017" in s.registry.datasets_cached

        await assert_eventually(has_coco, timeout=10)
        await kv.delete("edge.0f9e8d7c6b5a4938")

        async def no_coco() -> bool:
            s = await fresh()
            return "coco@2017" not in s.registry.datasets_cached

        await assert_eventually(no_coco, timeout=10)

        # nothing changes: the heartbeat still republishes
        before = await fresh()

        async def heartbeat() -> bool:
            s = await fresh()
            return s.published_at > before.published_at

        await assert_eventually(heartbeat, timeout=5)

        # the cluster stops answering: unreachable, observed_at frozen at the last observation
        clusters["edge"].partition()

        async def gone() -> ClusterSnapshot:
            s = await last_snapshot(js, names, "edge")
            assert s is not None and not s.reachable, s
            return s

        lost = await assert_eventually(gone, timeout=10)
        assert lost.error is not None and lost.error.startswith("unreachable: ")
        assert lost.observed_at < lost.published_at
        assert [n.name for n in lost.nodes] == ["gpu-0"]  # last known, with its age

        async def aged() -> bool:  # heartbeats keep coming; the age grows, observed_at does not move
            s = await gone()
            return s.observed_at == lost.observed_at and s.age(s.published_at) > lost.age(lost.published_at)

        await assert_eventually(aged, timeout=5)

        clusters["edge"].heal()
        back = await assert_eventually(fresh, timeout=10)
        assert back.observed_at > lost.observed_at and back.error is None
    finally:
        clusters["edge"].heal()
        stop.set()
        await asyncio.wait_for(task, timeout=10)


def test_python_m_gpuorch_inventory_runs_and_exits_cleanly_on_sigterm(edge, nats_url, nats_auth, names, js):
    _, kubeconfig, registry = edge
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("GPUORCH_")},
        **Settings(nats_url=nats_url, prefix=names.prefix, kubeconfig=kubeconfig, registry=registry,
                   nats_creds=nats_auth.register(names, clusters=["edge"]).creds("inventory")).to_env(),
        "GPUORCH_INVENTORY_INTERVAL": "0.2",
    }
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpuorch_inventory"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    lines: list[str] = []
    watchdog = threading.Timer(30, proc.kill)  # the read below blocks: never longer than this
    watchdog.start()
    try:
        assert proc.stderr is not None
        for line in proc.stderr:  # JSON lines; returns as soon as the service says it is ready
            lines.append(line)
            if '"inventory.ready"' in line:
                break
        assert any('"inventory.ready"' in x for x in lines), "".join(lines)
        ready = json.loads(next(x for x in lines if '"inventory.ready"' in x))
        assert ready["clusters"] == ["edge"] and ready["time_scale"] == SCALE and ready["interval"] == 0.2
        proc.send_signal(signal.SIGTERM)
        _, rest = proc.communicate(timeout=15)
    finally:
        watchdog.cancel()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, "".join(lines) + rest
    assert '"service.stopped"' in rest


def test_a_bad_interval_is_refused_before_starting(tmp_path: Path):
    env = {**os.environ, "GPUORCH_INVENTORY_INTERVAL": "soon"}
    proc = subprocess.run([sys.executable, "-m", "gpuorch_inventory"], env=env, capture_output=True, text=True, timeout=30)
    assert proc.returncode != 0 and "GPUORCH_INVENTORY_INTERVAL" in proc.stderr
