"""Issue 27, defect 1: a short partition is not a loss.

Reported on c375eb9: a cluster partitioned for 1.5 s and healed had both its attempts declared
`lost` 3.4 s after the cut (1.9 s after the heal), fenced and replaced elsewhere: the informers'
retries had backed off past the heal and the loss was counted on time alone. Here the same blip,
with the same `LOST_AFTER` (3 s), on a cluster running a real training workload: the attempt runs
on and completes, and no `lost` is ever published. (The sweep over every blip length, in virtual
time, is tests/dst/test_liveness.py.)
"""

from __future__ import annotations

import asyncio
import time

import pytest

from gpuorch.client import Client
from gpuorch.dev.chaos import inject
from gpuorch.invariants import check
from gpuorch.system import System
from gpuorch_proto import type_tag
from tests.e2e.workloads import train
from tests.support.wait import assert_eventually

pytestmark = pytest.mark.e2e

E2E_ENV = {"GPUORCH_LOST_AFTER": "3"}
BLIP = 1.5  # seconds: half of LOST_AFTER, as reported


async def test_a_blip_shorter_than_lost_after_loses_nothing(system: System, client: Client) -> None:
    wid = await client.submit(train("blip", steps=150))  # 15 real seconds

    async def running() -> str | None:
        v = await client.view(wid)
        a = v.latest_attempt if v is not None else None
        return a.cluster if a is not None and a.status == "running" else None

    home = await assert_eventually(running, timeout=60)
    cut, _ = await asyncio.to_thread(inject, system, home, "partition")
    try:
        # the blip's length is the stimulus, not a wait for a condition
        await asyncio.sleep(max(0.0, cut + BLIP - time.time()))
    finally:
        _, healed = await asyncio.to_thread(inject, system, home, "heal")
    assert healed - cut < 3.0 - 0.5, f"the blip itself lasted {healed - cut:.2f}s: too close to LOST_AFTER to say anything"
    view = await client.wait(wid, timeout=120)
    events = [e for _, e in await client.events(wid)]
    trail = " ".join(f"{type_tag(e)}@{e.at - cut:+.2f}" for e in events)
    assert [type_tag(e) for e in events].count("lost") == 0, f"a {healed - cut:.2f}s blip was a loss: {trail}"
    assert view.status == "completed", f"{view.status}: {view.reason}; {trail}"
    assert len(view.attempts) == 1, trail
    assert check(await client.events(wid)) == []
