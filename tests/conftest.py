"""Shared fixtures: one real NATS (JetStream) per session, a fresh subject prefix per test.

- `nats_url` (session): a nats-server with JetStream; a testcontainers container when Docker
  answers, else the embedded binary (`gpuorch.runtime.natsembed.nats_for_tests`).
- `names`: `Names(prefix="t<hex>")`, unique per test, so tests never see each other's messages.
- `nc`: a connection for the test; closed (not drained) at teardown.
- `js`: a JetStream context on `nc` with the topology of `names` ensured; the test's streams and
  KV buckets are deleted at teardown.

Wait with `tests.support.wait.assert_eventually`, never with a fixed sleep.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from nats.aio.client import Client
from nats.js import JetStreamContext

from gpuorch.runtime.bus import connect, delete_topology, ensure_topology
from gpuorch.runtime.natsembed import nats_for_tests
from gpuorch_proto import Names


@pytest.fixture(scope="session")
def nats_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    handle = nats_for_tests(Path(tmp_path_factory.mktemp("nats")))
    try:
        yield handle.url
    finally:
        handle.stop()


@pytest.fixture
def names() -> Names:
    return Names(prefix=f"t{uuid.uuid4().hex[:12]}")


@pytest.fixture
async def nc(nats_url: str) -> AsyncIterator[Client]:
    client = await connect(nats_url, "pytest", initial_timeout=10.0)
    try:
        yield client
    finally:
        # close(), not drain(): drain can hang ~30 s after a timed-out pull fetch (nats-py)
        await client.close()


@pytest.fixture
async def js(nc: Client, names: Names) -> AsyncIterator[JetStreamContext]:
    context = nc.jetstream()
    await ensure_topology(context, names)
    yield context
    if nc.is_connected:
        with contextlib.suppress(Exception):
            await delete_topology(context, names)
