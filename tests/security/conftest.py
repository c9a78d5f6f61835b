"""The embedded system under the generated permissions, and identities to attack it with."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import nats
import pytest
from nats.aio.client import Client as NatsClient

from gpuorch.runtime import bus
from gpuorch.system import System
from tests.support.system import client, kube, running  # noqa: F401 (fixtures for the tests here)

E2E = Path(__file__).parent.parent / "e2e"


@pytest.fixture(scope="module")
def system(tmp_path_factory: pytest.TempPathFactory) -> Iterator[System]:
    with running(tmp_path_factory.mktemp("attacked"), E2E / "clusters.yaml", clients={"mallory": ["team-x"]},
                 env_extra={"GPUORCH_LOST_AFTER": "2"}) as s:  # fmt: skip
        yield s


@dataclass
class Actor:
    """One identity's connection; `errors` collects what the server refused (its -ERR lines)."""

    identity: str
    nc: NatsClient
    errors: list[str] = field(default_factory=list)

    @property
    def js(self) -> Any:
        return self.nc.jetstream(timeout=2.0)

    def refusals(self, since: int = 0) -> list[str]:
        return [e for e in self.errors[since:] if "permissions violation" in e.lower()]


async def connect_as(system: System, identity: str) -> Actor:
    errors: list[str] = []

    async def on_error(exc: Exception) -> None:
        errors.append(str(exc))

    nc = await nats.connect(system.nats_url, name=f"attacker-{identity}", error_cb=on_error,
                            max_reconnect_attempts=0, **bus.auth_options(system.creds(identity)))  # fmt: skip
    return Actor(identity, nc, errors)


@pytest.fixture
async def actors(system: System) -> AsyncIterator[dict[str, Actor]]:
    out = {i: await connect_as(system, i) for i in ("client", "mallory", "router", "dispatcher", "fencer", "inventory", "admin")}
    try:
        yield out
    finally:
        for a in out.values():
            await a.nc.close()


