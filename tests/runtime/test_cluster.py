"""Beyond one machine: a 3-server JetStream cluster with replicated streams survives losing a server."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from gpuorch.runtime.bus import connect, ensure_topology
from gpuorch.runtime.natsembed import EmbeddedNats
from gpuorch.runtime.shell import replay
from gpuorch.security import generate
from gpuorch_proto import Names, encode
from gpuorch_proto import events as ev
from tests.support.wait import assert_eventually


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def test_replicated_topology_survives_the_loss_of_one_server(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ports = [_free_port() for _ in range(3)]
    routes = ",".join(f"nats://127.0.0.1:{p}" for p in ports)
    auth = generate(tmp_path / "auth", Names("cluster"))  # one set of identities for the three servers
    servers = [
        EmbeddedNats(tmp_path / f"s{i}", server_name=f"s{i}", config=auth.config, extra_args=["--cluster_name", "gpuorch", "--cluster", f"nats://127.0.0.1:{p}", "--routes", routes])
        for i, p in enumerate(ports)
    ]
    monkeypatch.setenv("GPUORCH_REPLICAS", "3")
    names = Names("cluster")
    try:
        for s in servers:
            s.start()
        nc = await connect(",".join(s.url for s in servers), "pytest-cluster", creds=auth.creds("admin"))
        try:
            js = nc.jetstream()

            async def topology() -> bool:
                try:
                    await ensure_topology(js, names)  # waits for the cluster to elect its leaders
                except Exception:
                    return False
                return True

            await assert_eventually(topology, timeout=60, interval=0.5)
            info = await js.stream_info(names.stream_evt)
            assert info.config.num_replicas == 3
            await js.publish(names.evt("w-1", "cancelled"), encode(ev.Cancelled(workload_id="w-1", at=1.0)), headers={"Nats-Msg-Id": "w-1.cancelled"})
            servers[0].kill()

            async def publish_after_loss() -> bool:
                try:
                    await js.publish(names.evt("w-2", "cancelled"), encode(ev.Cancelled(workload_id="w-2", at=2.0)), headers={"Nats-Msg-Id": "w-2.cancelled"})
                except Exception:
                    return False
                return True

            await assert_eventually(publish_after_loss, timeout=30, interval=0.5)
            async def both_kept() -> list[str]:
                try:
                    seen = [r.event.workload_id async for r in replay(js, names.stream_evt) if r.event is not None]
                except Exception as exc:  # a new stream leader is being elected
                    raise AssertionError(f"replay failed: {exc!r}") from exc
                assert seen == ["w-1", "w-2"], seen
                return seen

            await assert_eventually(both_kept, timeout=30, interval=0.5)
        finally:
            await nc.close()
    finally:
        for s in servers:
            s.stop()
