"""The running system: a service stopped cleanly writes its snapshot, the restarted process starts
from it (and replays only what came after), and the work in flight completes exactly once."""

from __future__ import annotations

import json
import signal

import pytest

from gpuorch.client import Client
from gpuorch.system import System
from gpuorch_proto import type_tag
from tests.e2e.conftest import client, system  # noqa: F401 - the e2e fixtures
from tests.e2e.workloads import train
from tests.support.wait import assert_eventually

pytestmark = pytest.mark.e2e


def log_events(text: str, name: str) -> list[dict[str, object]]:
    out = []
    for line in text.splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if isinstance(rec, dict) and rec.get("event") == name:
            out.append(rec)
    return out


@pytest.mark.parametrize("service", ["router", "dispatcher", "fencer"])
async def test_a_clean_restart_starts_from_the_snapshot_and_the_work_completes_once(
    system: System, client: Client, service: str  # noqa: F811
) -> None:
    wid = await client.submit(train(f"snap-{service}", steps=30))

    async def in_flight() -> bool:
        v = await client.view(wid)
        return v is not None and bool(v.attempts)

    await assert_eventually(in_flight, timeout=60)
    old = system.procs[service]
    system.kill(service, signal.SIGTERM)  # a clean stop: the consumers drain, the last snapshot is written
    written = log_events(old.output(), "snapshot.written")
    assert written, f"{service} stopped without writing its snapshot"
    system.restart(service)
    new = system.procs[service]

    def loaded() -> dict[str, object]:
        hits = log_events(new.output(), "snapshot.loaded")
        assert hits, f"{service} did not start from its snapshot"
        return hits[0]

    rec = await assert_eventually(loaded, timeout=30)
    assert rec["seq"] == written[-1]["seq"], "the restart starts from the snapshot written at the stop"
    view = await client.wait(wid, timeout=120)
    assert view.status == "completed", view.reason
    order = [type_tag(e) for _, e in await client.events(wid)]
    assert order.count("promoted") == 1 and order.count("completed") == 1, order
