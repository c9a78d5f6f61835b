"""State snapshots on a real nats-server, under the production permission model."""

from __future__ import annotations

import contextlib
import os
from collections.abc import AsyncIterator
from pathlib import Path

import nats
import nats.errors
import pytest
from nats.js import JetStreamContext

from gpuorch.follow import Follower
from gpuorch.projection import load_projection
from gpuorch.runtime import bus
from gpuorch.runtime.shell import Publisher, bind_consumer
from gpuorch.runtime.snapshot import (
    Snapshots,
    SnapshotStore,
    Unusable,
    decode_body,
    follower_body,
    restore_follower,
    retention_floor,
)
from gpuorch.security import Bundle
from gpuorch_proto import Names
from gpuorch_proto import events as ev
from tests.snapshot.histories import MAKERS
from tests.support.wait import assert_eventually


async def store(js: JetStreamContext, names: Names, owner: str = "router", chunk: int = 1000) -> SnapshotStore:
    return SnapshotStore(await js.key_value(names.kv_snapshots), owner, chunk=chunk)


async def test_a_snapshot_in_chunks_round_trips_and_alternates_slots(js: JetStreamContext, names: Names) -> None:
    s = await store(js, names)
    assert await s.load() is None, "no snapshot yet"
    big = os.urandom(5000)  # incompressible: 5 chunks of 1000 bytes
    h1 = await s.save(big, 10)
    assert h1.slot == "a" and h1.chunks >= 5 and h1.seq == 10
    loaded = await s.load()
    assert loaded is not None and loaded[1] == big and loaded[0].seq == 10
    h2 = await s.save(b"small", 20)
    assert h2.slot == "b" and h2.chunks == 1
    loaded = await s.load()
    assert loaded is not None and loaded[1] == b"small" and loaded[0].seq == 20
    h3 = await s.save(b"tiny", 30)  # back to slot a: its leftover chunks from the big one are purged
    assert h3.slot == "a" and h3.counts == {"a": 1, "b": 1}
    kv = await js.key_value(names.kv_snapshots)
    with pytest.raises(Exception):  # noqa: B017 - KeyNotFoundError (deleted/purged marker)
        await kv.get("router.a.3")


async def test_a_torn_snapshot_is_refused_not_half_used(js: JetStreamContext, names: Names) -> None:
    s = await store(js, names)
    head = await s.save(os.urandom(3000), 10)
    kv = await js.key_value(names.kv_snapshots)
    await kv.put(f"router.{head.slot}.1", b"garbage")  # a chunk overwritten under its head
    with pytest.raises(Unusable, match="does not match"):
        await s.load()


async def test_a_snapshot_beyond_the_stream_is_another_history(js: JetStreamContext, names: Names) -> None:
    """The stream was recreated: its snapshot covers sequences it has not reached, so it is not used."""
    pub = Publisher(js, names)
    await pub.publish([MAKERS["submitted"]("w0-a", 0, 1, 1.0)])
    await (await store(js, names)).save(follower_body(Follower().projection, {}), 500)
    snaps = Snapshots(js, names, "router", names.durable("router", "events"), lambda: b"")
    assert await snaps.restore() is None


async def test_restore_then_replay_the_rest_equals_a_full_replay(js: JetStreamContext, names: Names) -> None:
    """The whole path on a real stream: a durable acks the first events, a snapshot is taken at its
    ack floor, more events come; a new follower restores and replays only from the floor."""
    pub = Publisher(js, names)
    wl = [f"w{i}-a" for i in range(4)]
    first = [MAKERS["submitted"](w, 0, 1, 1.0) for w in wl] + [MAKERS["route-requested"](w, 0, 2, 2.0) for w in wl]
    later = [MAKERS["attempt-created"](w, 0, 2, 3.0) for w in wl] + [MAKERS["running"](w, 0, 2, 4.0) for w in wl]
    await pub.publish(first)
    durable = names.durable("router", "events")
    sub = await bind_consumer(js, stream=names.stream_evt, durable=durable, filter_subject=names.evt_all, ack_wait=30, max_deliver=5)
    live = Follower()
    for msg in await sub.fetch(len(first), timeout=5):
        e = ev_decode(msg.data)
        live.projection.apply(e, msg.metadata.sequence.stream)
        await msg.ack_sync()
    snaps = Snapshots(js, names, "router", durable, lambda: follower_body(live.projection, live.traceparents))
    head = await snaps.take()
    assert head is not None and head.seq == len(first)
    assert await snaps.take() is None, "nothing acked since: no new snapshot"
    await pub.publish(later)

    restarted = Follower()
    start, _ = await restore_follower(Snapshots(js, names, "router", durable, lambda: b""), restarted)
    assert start == len(first) + 1
    replayed = await restarted.catch_up(js, names.stream_evt, names.evt_all, start_seq=start)
    assert replayed == len(later), "only what came after the snapshot is replayed"

    everything = Follower()
    assert await everything.catch_up(js, names.stream_evt, names.evt_all) == len(first) + len(later)
    assert restarted.projection == everything.projection
    assert all(v.status == "running" for v in restarted.projection.workloads.values())
    await sub.unsubscribe()


def ev_decode(data: bytes) -> ev.Event:
    from gpuorch_proto.codec import decode_event

    return decode_event(data)


# -- who may write which snapshot -------------------------------------------------------------


@contextlib.asynccontextmanager
async def connected(url: str, creds: Path) -> AsyncIterator[tuple[nats.NATS, list[str]]]:
    errors: list[str] = []

    async def on_error(exc: Exception) -> None:
        errors.append(str(exc))

    nc = await nats.connect(url, error_cb=on_error, max_reconnect_attempts=0, **bus.auth_options(creds))
    try:
        yield nc, errors
    finally:
        await nc.close()


@pytest.mark.parametrize("service", ["router", "dispatcher", "fencer"])
async def test_each_service_writes_its_own_snapshot_and_no_other(
    js: JetStreamContext, names: Names, identities: Bundle, nats_url: str, service: str
) -> None:
    async with connected(nats_url, identities.creds(service)) as (nc, errors):
        own = await store(nc.jetstream(timeout=2.0), names, owner=service)
        await own.save(b"mine", 1)
        loaded = await own.load()
        assert loaded is not None and loaded[1] == b"mine"
        for other in {"router", "dispatcher", "fencer", "inventory"} - {service}:
            forged = await store(nc.jetstream(timeout=2.0), names, owner=other)
            with pytest.raises((nats.errors.TimeoutError, nats.errors.NoRespondersError)):
                await forged.save(b"forged", 1)
            subject = f"$KV.{names.kv_snapshots}.{other}."
            await assert_eventually(lambda s=subject: any("permissions violation" in e.lower() and s.lower() in e.lower() for e in errors), timeout=5)
    assert await (await store(js, names, owner="inventory")).load() is None


async def test_inventory_and_clients_write_no_snapshot(js: JetStreamContext, names: Names, identities: Bundle, nats_url: str) -> None:
    for who in ("inventory", "client"):
        async with connected(nats_url, identities.creds(who)) as (nc, errors):
            with pytest.raises((nats.errors.TimeoutError, nats.errors.NoRespondersError)):
                await nc.jetstream(timeout=2.0).publish(f"$KV.{names.kv_snapshots}.{who}.head", b"x", timeout=2.0)
            await assert_eventually(lambda: any("permissions violation" in e.lower() for e in errors), timeout=5)


def test_the_body_format_is_checked() -> None:
    with pytest.raises(Unusable):
        decode_body(b"\x00not msgpack")
    assert load_projection(decode_body(follower_body(Follower().projection, {})).projection).workloads == {}


async def test_the_retention_floor_is_what_every_owner_s_snapshot_covers(js: JetStreamContext, names: Names) -> None:
    owners = ["router", "dispatcher.0", "fencer"]
    assert await retention_floor(js, names, owners) == 0, "no snapshot: nothing may be dropped"
    for owner, seq in zip(owners, (30, 10, 20), strict=True):
        await (await store(js, names, owner=owner)).save(b"x", seq)
    assert await retention_floor(js, names, owners) == 10
    assert await retention_floor(js, names, [*owners, "dispatcher.1"]) == 0, "an owner without one holds it at 0"


async def test_a_due_snapshot_waits_for_a_lull_and_a_costly_one_comes_less_often(
    js: JetStreamContext, names: Names, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`Snapshots.run`: while the durable has more than BUSY messages waiting, the due snapshot
    waits (at most MAX_DEFER intervals); once they are read, it is written. A snapshot that took
    long pushes the next one out (`pause`)."""
    import asyncio

    from gpuorch.runtime import snapshot

    monkeypatch.setattr(snapshot, "BUSY", 5)
    pub = Publisher(js, names)
    await pub.publish([MAKERS["submitted"](f"w{i}-a", 0, 1, 1.0) for i in range(20)])
    durable = names.durable("router", "events")
    sub = await bind_consumer(js, stream=names.stream_evt, durable=durable, filter_subject=names.evt_all, ack_wait=30, max_deliver=5)
    first = await sub.fetch(2, timeout=5)
    for msg in first:
        await msg.ack_sync()  # an ack floor: something to snapshot
    dumps: list[float] = []
    snaps = Snapshots(js, names, "router", durable, lambda: dumps.append(1.0) or b"state", interval=1.0)
    asked: list[bool] = []
    busy = snaps.busy

    async def counted() -> bool:
        asked.append(await busy())
        return asked[-1]

    snaps.busy = counted  # type: ignore[method-assign]
    stop = asyncio.Event()
    task = asyncio.create_task(snaps.run(stop))
    try:
        await assert_eventually(lambda: len(asked) >= 2, timeout=10)  # due, and asked again a second later
        assert all(asked) and not dumps, "a snapshot was written while the durable was busy"
        for msg in await sub.fetch(18, timeout=5):
            await msg.ack_sync()
        await assert_eventually(lambda: dumps, timeout=10)  # the lull: it is written
        assert snaps.last is not None and snaps.last.seq == 20
    finally:
        stop.set()
        await task
        await sub.unsubscribe()
    snaps.took = 1.0
    assert snaps.pause() == 30.0, "a snapshot that took 1 s: the next one not before 30 s"
