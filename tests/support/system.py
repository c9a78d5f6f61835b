"""Fixtures over a running embedded system (each directory's conftest provides `system`):
a client of the bus as the `client` identity, and the official Kubernetes client per cluster."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from gpuorch.client import Client
from gpuorch.kube import make_clients
from gpuorch.system import System


@pytest.fixture
async def client(system: System) -> AsyncIterator[Client]:
    s = system.settings
    async with Client(s.nats_url, s.names, creds=s.nats_creds) as c:
        yield c


@pytest.fixture(scope="module")
def kube(system: System) -> dict:
    return make_clients(system.kubeconfig)
