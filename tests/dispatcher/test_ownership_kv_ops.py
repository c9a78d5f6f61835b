"""Ownership costs KV operations per instance, not per owned workload (issue 12 item 2).

Two real `Dispatcher` shells against a real nats-server: `a` owns N routed workloads, `b` sees
the same N in its projection (it would take them over if `a` died). Their ownership loops (renew
and take-over) run for the same number of periods with N = 0 and N = 500; every operation on the
owners bucket is counted. Before this change `a` renewed one lease per owned workload per
owner_ttl/3 and `b` read every workload's lease per owner_ttl/2: ~500 operations per period each.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from nats.js import JetStreamContext

from gpuorch.config import Settings, Tuning
from gpuorch.projection import Projection
from gpuorch.runtime.shell import Publisher
from gpuorch_dispatcher import service
from gpuorch_dispatcher.service import Dispatcher
from gpuorch_proto import Names, RoutingDecision, workload_from_obj
from gpuorch_proto import events as ev
from tests.support.wait import assert_eventually

TTL = 1.5  # renew every 0.5 s, take-over every 0.75 s
OWNED = 500


class Counting:
    """The owners bucket, counting each operation a dispatcher performs on it."""

    def __init__(self, bucket: Any) -> None:
        self.bucket = bucket
        self.ops: Counter[str] = Counter()

    async def get(self, key: str) -> Any:
        self.ops["get"] += 1
        return await self.bucket.get(key)

    async def create(self, key: str, value: bytes) -> int:
        self.ops["create"] += 1
        return int(await self.bucket.create(key, value))

    async def update(self, key: str, value: bytes, last: int) -> int:
        self.ops["update"] += 1
        return int(await self.bucket.update(key, value, last=last))

    async def put(self, key: str, value: bytes) -> int:
        self.ops["put"] += 1
        return int(await self.bucket.put(key, value))


def routed_workloads(n: int, tag: str) -> Projection:
    p = Projection()
    seq = 0
    for i in range(n):
        wid = f"kvops-{tag}-{i}"
        wl = workload_from_obj({
            "metadata": {"name": f"w{i}", "owner": "alice"},
            "spec": {"image": "example.org/t@sha256:" + "ab" * 32, "command": ["true"], "resources": {"gpus": 1}},
        })
        d = RoutingDecision(workload_id=wid, decided_at=1.0, outcome="routed", cluster="alpha", summary="test")
        seq += 1
        p.apply(ev.Submitted(workload_id=wid, at=0.0, workload=wl), seq)
        seq += 1
        p.apply(ev.Routed(workload_id=wid, at=1.0, decision=d, attempt_number=1, event_id=f"{wid}.routed.1"), seq)
    return p


Ticks = Counter[tuple[str, str]]


def counting_every(ticks: Ticks) -> Callable[..., Awaitable[None]]:
    real = service.every

    async def every(stop: asyncio.Event, interval: float, tick: Callable[[], Awaitable[None]], *, name: str) -> None:
        async def counted() -> None:
            await tick()
            ticks[(asyncio.current_task().get_name(), name)] += 1  # type: ignore[union-attr]

        await real(stop, interval, counted, name=name)

    return every


async def dispatcher(
    js: JetStreamContext, names: Names, me: str, projection: Projection, ttl: float = TTL
) -> tuple[Dispatcher, Counting]:
    """A dispatcher shell `me` on the test's bucket (counted), with `projection`, its lease written."""
    d = Dispatcher(Settings(prefix=names.prefix, tuning=Tuning(dispatcher_id=me, owner_ttl=ttl)))
    counting = Counting(await js.key_value(names.kv_owners))
    d.kv_owners = counting
    d.publisher = Publisher(js, names)
    d.follower.projection = projection
    await d.start_ownership()
    return d, counting


async def window(js: JetStreamContext, names: Names, n: int, ticks: Ticks) -> dict[str, tuple[int, float]]:
    """(ownership KV operations, seconds) of `a` (owns n) and `b` (owns none, sees them) over
    six renew periods of `a` and four take-over periods of `b`."""
    tag = f"n{n}"
    a, ca = await dispatcher(js, names, f"a{n}", routed_workloads(n, tag))
    b, cb = await dispatcher(js, names, f"b{n}", routed_workloads(n, tag))
    for i, wid in enumerate(a.follower.projection.workloads):
        if i % 50 == 49:  # a claim is a round trip: on a loaded machine 500 of them outlast a lease
            await a.renew_once()
            await b.renew_once()
        assert await a.owns(wid)
        assert not await b.owns(wid)  # as when both see its `routed`: b learns who owns it
    assert len(a.owned) == n and not b.owned
    for c in (ca, cb):
        c.ops.clear()
    stop = asyncio.Event()
    t0 = time.monotonic()
    loops = [
        asyncio.create_task(a.renew(stop), name=f"a{n}.renew"),
        asyncio.create_task(a.take_over(stop), name=f"a{n}.take_over"),
        asyncio.create_task(b.renew(stop), name=f"b{n}.renew"),
        asyncio.create_task(b.take_over(stop), name=f"b{n}.take_over"),
    ]

    def periods_done() -> bool:
        return ticks[(f"a{n}.renew", "renew")] >= 6 and ticks[(f"b{n}.take_over", "take_over")] >= 4

    try:
        await assert_eventually(periods_done, timeout=60, interval=0.01)
    finally:
        stop.set()
        await asyncio.gather(*loops)
    dt = time.monotonic() - t0
    assert len(a.owned) == n, "a still owns all of them: nobody took any over"
    return {"a": (sum(ca.ops.values()), dt), "b": (sum(cb.ops.values()), dt)}


async def test_ownership_kv_operations_do_not_grow_with_owned_workloads(
    js: JetStreamContext, names: Names, monkeypatch: pytest.MonkeyPatch
) -> None:
    ticks: Ticks = Counter()
    monkeypatch.setattr(service, "every", counting_every(ticks))
    idle = await window(js, names, 0, ticks)
    busy = await window(js, names, OWNED, ticks)
    rates = {k: {who: f"{ops} ops in {dt:.2f}s = {ops / dt:.1f}/s" for who, (ops, dt) in w.items()} for k, w in (("0 owned", idle), (f"{OWNED} owned", busy))}
    print(f"ownership KV operations: {rates}")  # the figures in docs/operations.md (Dispatch ownership)
    for who in ("a", "b"):
        assert busy[who][0] <= idle[who][0] + 4, (who, idle, busy)  # per period, not per workload
        assert busy[who][0] < OWNED // 10, (who, busy)
