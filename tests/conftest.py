"""Shared fixtures: one real NATS (JetStream) per session, a fresh subject prefix per test.

- `nats_url` (session): a nats-server with JetStream; a testcontainers container when Docker
  answers, else the embedded binary (`gpuorch.runtime.natsembed.nats_for_tests`). It runs the
  production permission model: nobody connects without an identity.
- `nats_auth` (session): its `TestAuth`; `admin_creds` (session): the session admin's seed (the
  test harness plays the admin: it creates each test's topology); `identities`: the admin, the
  four services and a `client` of the test's own prefix (`gpuorch.security.Bundle`), trusted by
  the server (config reload) when the fixture returns.
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
from gpuorch.runtime.natsembed import TestNats, nats_for_tests
from gpuorch.security import Bundle
from gpuorch.security.testing import TestAuth
from gpuorch_proto import Names


@pytest.fixture(scope="session")
def nats_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestNats]:
    handle = nats_for_tests(Path(tmp_path_factory.mktemp("nats")))
    try:
        yield handle
    finally:
        handle.stop()


@pytest.fixture(scope="session")
def nats_url(nats_server: TestNats) -> str:
    return nats_server.url


@pytest.fixture(scope="session")
def nats_auth(nats_server: TestNats) -> TestAuth:
    return nats_server.auth


@pytest.fixture(scope="session")
def admin_creds(nats_auth: TestAuth) -> Path:
    return nats_auth.admin_creds


@pytest.fixture
def identities(nats_auth: TestAuth, names: Names) -> Bundle:
    return nats_auth.register(names)


@pytest.fixture
def names() -> Names:
    return Names(prefix=f"t{uuid.uuid4().hex[:12]}")


@pytest.fixture
async def nc(nats_url: str, admin_creds: Path) -> AsyncIterator[Client]:
    client = await connect(nats_url, "pytest", creds=admin_creds, initial_timeout=10.0)
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
