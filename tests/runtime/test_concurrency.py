"""A consumer with `concurrency` > 1: other workloads go on while one waits; one workload's events stay in order."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from nats.js import JetStreamContext

from gpuorch.projection import Projection
from gpuorch.runtime.shell import Incoming, Publisher, submit_key
from gpuorch_proto import Base, Names
from gpuorch_proto import events as ev
from gpuorch_router.core import RouterState
from tests.runtime.helpers import consumer_settled, running_consumer, submit_json
from tests.support.wait import assert_eventually


def rr(wid: str, n: int) -> ev.RouteRequested:
    return ev.RouteRequested(event_id=f"{wid}.route-requested.{n}", workload_id=wid, at=float(n), attempt_number=n)


async def test_a_slow_workload_holds_only_its_own_events(js: JetStreamContext, names: Names) -> None:
    pub = Publisher(js, names)
    await pub.publish([rr("w-a", 1), rr("w-b", 1), rr("w-a", 2), rr("w-b", 2), rr("w-c", 1)])
    gate = asyncio.Event()
    seen: list[tuple[str, int]] = []

    async def handler(inc: Incoming) -> Sequence[Base]:
        e = inc.event
        assert isinstance(e, ev.RouteRequested)
        seen.append((e.workload_id, e.attempt_number))
        if (e.workload_id, e.attempt_number) == ("w-a", 1):
            await gate.wait()  # w-a's first event is slow
        return []

    durable = names.durable("test", "conc")
    async with running_consumer(js, names, handler, durable="conc", stream=names.stream_evt, filter_subject=names.evt_all, concurrency=8):
        await assert_eventually(lambda: {("w-b", 1), ("w-b", 2), ("w-c", 1)} <= set(seen))
        assert ("w-a", 2) not in seen, "w-a's second event waits for its first"
        gate.set()
        await assert_eventually(lambda: consumer_settled(js, names.stream_evt, durable))
    assert [n for w, n in seen if w == "w-a"] == [1, 2]
    assert [n for w, n in seen if w == "w-b"] == [1, 2]


def test_projection_dedups_per_workload_so_workloads_may_be_applied_out_of_global_order() -> None:
    p = Projection()
    p.apply(rr("w-b", 1), 11)  # w-b's event (seq 11) applied before w-a's (seq 10)
    v = p.apply(rr("w-a", 1), 10)
    assert v is not None and v.route_requested == {1}, "an earlier sequence of another workload still applies"
    p.apply(rr("w-a", 2), 12)
    p.apply(rr("w-a", 3), 12)  # a redelivery of seq 12 changes nothing
    assert p.workloads["w-a"].route_requested == {1, 2} and p.last_seq == 12


async def test_submits_with_different_idempotency_keys_go_on_while_one_waits(js: JetStreamContext, names: Names) -> None:
    """The router's submit consumer (`key=submit_key`): a slow submit holds only its own key's
    line (with the default key every submit shares the subject, and the fast ones would wait)."""
    pub = Publisher(js, names)
    for key in ("slow", "fast-1", "fast-2"):
        await pub.publish_raw(names.cmd_submit, submit_json(f"n-{key}"), msg_id=key)
    gate = asyncio.Event()
    seen: list[str] = []

    async def handler(inc: Incoming) -> Sequence[Base]:
        assert inc.msg_id is not None
        seen.append(inc.msg_id)
        if inc.msg_id == "slow":
            await gate.wait()
        return []

    durable = names.durable("test", "subconc")
    async with running_consumer(js, names, handler, durable="subconc", concurrency=8, key=submit_key):
        await assert_eventually(lambda: {"fast-1", "fast-2"} <= set(seen))
        gate.set()
        await assert_eventually(lambda: consumer_settled(js, names.stream_cmd, durable))
    assert sorted(seen) == ["fast-1", "fast-2", "slow"]


def test_router_state_dedups_per_workload() -> None:
    """Folded out of global order (a concurrent consumer), every workload's events still count once."""
    s = RouterState()
    s.apply(rr("w-b", 1), 11)
    s.apply(rr("w-a", 1), 10)  # earlier sequence, other workload: applies
    s.apply(rr("w-a", 2), 10)  # a redelivery of seq 10: nothing
    assert s.requests["w-a"].attempt_number == 1 and s.requests["w-b"].attempt_number == 1
    assert s.last_seq == 11
