"""One dispatch owner: two dispatcher processes never both act on a workload; a survivor takes over."""

from __future__ import annotations

import asyncio

import pytest

from gpuorch.client import Client
from gpuorch.system import System
from gpuorch_proto import decode_owner, type_tag
from tests.e2e.workloads import train
from tests.support.wait import assert_eventually

pytestmark = pytest.mark.e2e


async def test_two_dispatchers_one_owner_each_and_takeover_when_the_owner_dies(system: System, client: Client, admin: Client) -> None:
    system.start_service("dispatcher", instance="1")
    system.wait_service_ready("dispatcher-1")
    try:
        wids = [await client.submit(train(f"owners-{i}", steps=30)) for i in range(4)]
        kv = await admin.js.key_value(system.settings.names.kv_owners)  # internal state: admin only

        async def owners() -> dict[str, str]:
            out = {}
            for wid in wids:
                try:
                    out[wid] = decode_owner((await kv.get(wid)).value).owner
                except Exception as exc:
                    raise AssertionError(f"{wid} has no owner yet ({type(exc).__name__}); have {out}") from exc
            return out

        owned = await assert_eventually(owners, timeout=120, interval=0.2)
        # kill the owner of the first workload while it is in flight; the other must take over
        victim = owned[wids[0]]
        proc = "dispatcher" if victim == "0" else f"dispatcher-{victim}"
        system.kill(proc)
        try:
            views = await asyncio.gather(*(client.wait(w, timeout=180) for w in wids))
        finally:
            system.restart(proc)
        for v in views:
            assert v.status == "completed", (v.workload_id, v.reason)
            kinds = [type_tag(e) for _, e in await client.events(v.workload_id)]
            # one owner at a time: never a second attempt, never a second promotion
            assert kinds.count("attempt-created") == 1 and kinds.count("promoted") == 1, kinds
        assert decode_owner((await kv.get(wids[0])).value).owner != victim, "the survivor took the workload over"
    finally:
        if "dispatcher-1" in system.procs:
            system.kill("dispatcher-1")
            del system.procs["dispatcher-1"]
