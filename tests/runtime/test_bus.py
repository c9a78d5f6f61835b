"""Connecting and the JetStream topology."""

from __future__ import annotations

import asyncio
import time
import uuid
from pathlib import Path

import pytest
from nats.js import JetStreamContext

from gpuorch.runtime.bus import connect, delete_topology, ensure_topology
from gpuorch_proto import Names, kv_buckets, streams


async def test_ensure_topology_is_idempotent_and_matches_the_contract(
    js: JetStreamContext, names: Names
) -> None:
    await ensure_topology(js, names)  # again, after the fixture did it
    await asyncio.gather(*(ensure_topology(js, names) for _ in range(3)))
    for spec in streams(names):
        info = await js.stream_info(spec.name)
        assert info.config.subjects == spec.subjects
        assert info.config.duplicate_window == pytest.approx(spec.duplicate_window_s)
        assert info.config.max_msgs_per_subject == spec.max_msgs_per_subject
    for bucket in kv_buckets(names):
        kv = await js.key_value(bucket)
        rev = await kv.create("w-1", b"epoch-1")
        assert (await kv.get("w-1")).revision == rev


async def test_four_services_starting_at_once_and_restarting(nats_url: str, admin_creds: Path) -> None:
    names = Names(prefix=f"t{uuid.uuid4().hex[:12]}")
    clients = [await connect(nats_url, f"svc-{i}", creds=admin_creds) for i in range(4)]
    try:
        await asyncio.gather(*(ensure_topology(c.jetstream(), names) for c in clients))
        js = clients[0].jetstream()
        await js.publish(names.evt("w-1", "submitted"), b"{}")
        # a restart runs it again: nothing is lost or recreated
        await asyncio.gather(*(ensure_topology(c.jetstream(), names) for c in clients))
        assert (await js.stream_info(names.stream_evt)).state.messages == 1
    finally:
        await delete_topology(clients[0].jetstream(), names)
        for c in clients:
            await c.close()


async def test_a_stream_with_an_old_config_is_brought_up_to_date(js: JetStreamContext, names: Names) -> None:
    info = await js.stream_info(names.stream_evt)
    await js.update_stream(info.config, duplicate_window=5.0)
    assert (await js.stream_info(names.stream_evt)).config.duplicate_window == pytest.approx(5.0)
    await ensure_topology(js, names)
    spec = next(s for s in streams(names) if s.name == names.stream_evt)
    assert (await js.stream_info(names.stream_evt)).config.duplicate_window == pytest.approx(
        spec.duplicate_window_s
    )


async def test_connect_to_nothing_fails_within_its_deadline() -> None:
    started = time.monotonic()
    with pytest.raises(TimeoutError, match="could not connect"):
        await connect("nats://127.0.0.1:1", "nobody", initial_timeout=1.0, connect_timeout=0.2)
    assert time.monotonic() - started < 3.0
