"""The whole system as processes: NATS, local clusters and the four services."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from gpuorch.client import Client
from gpuorch.system import System
from tests.support.system import client, kube, running  # noqa: F401 (fixtures for the tests here)

HERE = Path(__file__).parent


@pytest.fixture(scope="module")
def system(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[System]:
    """One system per test module; a module may add service settings in `E2E_ENV`."""
    state = tmp_path_factory.mktemp("e2e")
    with running(state, HERE / "clusters.yaml", env_extra={
        "GPUORCH_TRACE_FILE": str(state / "spans.jsonl"), "GPUORCH_LOST_AFTER": "2",
        **getattr(request.module, "E2E_ENV", {}),
    }) as s:  # fmt: skip
        yield s


@pytest.fixture
async def admin(system: System) -> AsyncIterator[Client]:
    """A connection as the admin identity: for tests that inspect internal state (KV buckets)
    that no client may read."""
    s = system.settings_as("admin")
    async with Client(s.nats_url, s.names, creds=s.nats_creds) as c:
        yield c
