"""The dispatcher shell's ownership against a real nats-server: takeover once the owner's
instance lease ran out, the old owner coming back, and a restart under the same identity."""

from __future__ import annotations

import time

from nats.js import JetStreamContext

from gpuorch_proto import Names, decode_instance_lease, decode_owner, instance_key
from tests.dispatcher.test_ownership_kv_ops import dispatcher, routed_workloads
from tests.support.wait import assert_eventually

N = 3


async def owner_of(js: JetStreamContext, names: Names, wid: str) -> tuple[str, int]:
    r = decode_owner((await (await js.key_value(names.kv_owners)).get(wid)).value)
    return r.owner, r.generation


async def test_a_survivor_takes_over_only_once_the_owners_lease_ran_out_and_the_owner_then_steps_back(
    js: JetStreamContext, names: Names
) -> None:
    a, _ = await dispatcher(js, names, "a", routed_workloads(N, "t"), ttl=1.0)
    b, cb = await dispatcher(js, names, "b", routed_workloads(N, "t"), ttl=1.0)
    wids = sorted(a.follower.projection.workloads)
    for wid in wids:
        assert await a.owns(wid) and not await b.owns(wid)
    cb.ops.clear()
    await b.take_over_once()  # a's lease runs: nothing taken, and one read for a's lease, none per workload
    assert not b.owned and [await owner_of(js, names, w) for w in wids] == [("a", 1)] * N
    assert cb.ops == {"get": 1}, cb.ops

    # a stops renewing (it died, or its process stalled); b takes over once a's lease has run out
    async def taken() -> bool:
        await b.renew_once()  # b lives on
        await b.take_over_once()
        return len(b.owned) == N

    await assert_eventually(taken, timeout=10, interval=0.1)
    assert [await owner_of(js, names, w) for w in wids] == [("b", 1)] * N
    ended = decode_instance_lease((await (await js.key_value(names.kv_owners)).get(instance_key("a"))).value)
    assert ended.ended and ended.generation == 1

    # a comes back: it may not act on what it owned (its lease ran out), and its renewal finds the
    # lease ended: the next generation, owning nothing, claiming nothing b holds
    assert not a.owned
    await a.renew_once()
    assert a.generation == 2 and not a.owned and not a._owned
    for wid in wids:
        assert not await a.owns(wid)
    assert [await owner_of(js, names, w) for w in wids] == [("b", 1)] * N


async def test_a_restart_under_the_same_identity_picks_its_workloads_up_again_without_a_write(
    js: JetStreamContext, names: Names
) -> None:
    a, _ = await dispatcher(js, names, "a", routed_workloads(N, "r"))
    for wid in a.follower.projection.workloads:
        assert await a.owns(wid)
    again, counting = await dispatcher(js, names, "a", routed_workloads(N, "r"))  # the restarted process
    assert again.generation == 1  # nobody ended its lease: the same generation goes on
    counting.ops.clear()
    for wid in again.follower.projection.workloads:
        assert await again._claim(wid) == "a"  # the start-up pass
    assert len(again.owned) == N and counting.ops == {"get": N}, counting.ops


async def test_a_restart_after_its_lease_was_ended_claims_its_workloads_again_by_compare_and_set(
    js: JetStreamContext, names: Names
) -> None:
    a, _ = await dispatcher(js, names, "a", routed_workloads(N, "e"), ttl=1.0)
    b, _ = await dispatcher(js, names, "b", routed_workloads(N, "e"), ttl=1.0)
    wids = sorted(a.follower.projection.workloads)
    for wid in wids:
        assert await a.owns(wid) and not await b.owns(wid)

    async def a_ended() -> bool:  # b sees a's lease run out and ends it, but has claimed nothing yet
        await b.renew_once()
        await b._check_instance("a", 1, time.time())
        lease = b.leases.get("a")
        return lease is not None and lease.ended

    await assert_eventually(a_ended, timeout=10, interval=0.1)
    again, counting = await dispatcher(js, names, "a", routed_workloads(N, "e"), ttl=1.0)
    assert again.generation == 2
    counting.ops.clear()
    for wid in wids:
        assert await again._claim(wid) == "a"
    assert counting.ops == {"get": N, "update": N}, counting.ops
    assert [await owner_of(js, names, w) for w in wids] == [("a", 2)] * N
    # b's knowledge of a (generation 1, ended) does not make generation 2 claimable
    await b.renew_once()
    for wid in wids:
        assert not await b.owns(wid)
