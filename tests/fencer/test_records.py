"""The fencer's records: compare-and-set in one round trip when nobody wrote in between, the
usual read-decide-write when someone did, against a real bucket (two replicas = two `Records`)."""

from __future__ import annotations

from collections import Counter
from typing import Any

from nats.js import JetStreamContext

from gpuorch_fencer import core
from gpuorch_fencer.service import Records
from gpuorch_proto import FenceRecord, Names, decode_fence
from gpuorch_proto import events as ev


class Counted:
    """The real bucket, counting the calls made to it."""

    def __init__(self, bucket: Any) -> None:
        self.bucket = bucket
        self.calls: Counter[str] = Counter()

    async def get(self, key: str) -> Any:
        self.calls["get"] += 1
        return await self.bucket.get(key)

    async def create(self, key: str, value: bytes) -> int:
        self.calls["create"] += 1
        return int(await self.bucket.create(key, value))

    async def update(self, key: str, value: bytes, last: int) -> int:
        self.calls["update"] += 1
        return int(await self.bucket.update(key, value, last=last))


def created(wid: str, aid: str, epoch: int = 1) -> ev.AttemptCreated:
    return ev.AttemptCreated(
        workload_id=wid, at=1.0, attempt_id=aid, epoch=epoch, cluster="east", attempt_number=1, job_name=aid,
        output_path="/s", checkpoint_path="/c",
    )


def fence(wid: str, aid: str, epoch: int = 1) -> ev.FenceRequested:
    return ev.FenceRequested(workload_id=wid, at=2.0, attempt_id=aid, epoch=epoch, cluster="east", reason="lost", lease_expires_at=9.0)


async def stored(js: JetStreamContext, names: Names, wid: str) -> FenceRecord:
    return decode_fence((await (await js.key_value(names.kv_fence)).get(wid)).value)


async def test_a_new_record_is_created_without_reading_first(js: JetStreamContext, names: Names) -> None:
    bucket = Counted(await js.key_value(names.kv_fence))
    recs = Records(bucket)
    d = await recs.cas("w-new", lambda r: core.on_attempt_created(r, created("w-new", "a1"), 1.0))
    assert d.record == FenceRecord(epoch=1, current_attempt="a1")
    assert bucket.calls == Counter(create=1), "one round trip"
    assert await stored(js, names, "w-new") == d.record


async def test_the_next_write_uses_the_revision_it_wrote(js: JetStreamContext, names: Names) -> None:
    bucket = Counted(await js.key_value(names.kv_fence))
    recs = Records(bucket)
    await recs.cas("w-next", lambda r: core.on_attempt_created(r, created("w-next", "a1"), 1.0))
    d = await recs.cas("w-next", lambda r: core.on_fence_requested(r, fence("w-next", "a1"), 2.0))
    assert d.record is not None and d.record.epoch == 2
    assert bucket.calls == Counter(create=1, update=1), "no read: the revision was its own write's"
    assert await stored(js, names, "w-next") == d.record
    assert await recs.known("w-next") == d.record
    assert bucket.calls["get"] == 0, "the collector's read is the remembered record"


async def test_another_replicas_write_in_between_is_decided_on(js: JetStreamContext, names: Names) -> None:
    raw = await js.key_value(names.kv_fence)
    a, b = Records(Counted(raw)), Records(Counted(raw))
    await a.cas("w-race", lambda r: core.on_attempt_created(r, created("w-race", "a1"), 1.0))
    await b.cas("w-race", lambda r: core.on_fence_requested(r, fence("w-race", "a1"), 2.0))  # b bumps to 2
    # a still remembers epoch 1: its write with that revision fails, and it decides on epoch 2
    d = await a.cas("w-race", lambda r: core.on_fence_requested(r, fence("w-race", "a1"), 3.0))
    assert d.record is None, "already bumped past the attempt: nothing to write"
    assert [type(x) for x in d.events] == [ev.Fenced] and d.events[0].new_epoch == 2  # type: ignore[attr-defined]
    assert (await stored(js, names, "w-race")).epoch == 2, "not bumped twice"
    assert await a.known("w-race") == await stored(js, names, "w-race"), "it remembers what it read"


async def test_a_decision_that_writes_nothing_reads_the_bucket(js: JetStreamContext, names: Names) -> None:
    raw = await js.key_value(names.kv_fence)
    a, b = Records(Counted(raw)), Records(Counted(raw))
    await a.cas("w-stale", lambda r: core.on_attempt_created(r, created("w-stale", "a1"), 1.0))
    await b.cas("w-stale", lambda r: core.on_fence_requested(r, fence("w-stale", "a1"), 2.0))
    # on a's remembered record (epoch 1, a1 current) a1's creation changes nothing; on the real one
    # (epoch 2) the attempt was born stale and is fenced
    d = await a.cas("w-stale", lambda r: core.on_attempt_created(r, created("w-stale", "a1"), 4.0))
    assert [type(x) for x in d.events] == [ev.Fenced] and d.delete_job


async def test_a_record_never_seen_is_read_from_the_bucket(js: JetStreamContext, names: Names) -> None:
    raw = await js.key_value(names.kv_fence)
    await Records(raw).cas("w-old", lambda r: core.on_attempt_created(r, created("w-old", "a1", epoch=3), 1.0))
    bucket = Counted(raw)
    fresh = Records(bucket)  # a restarted replica
    assert await fresh.known("w-old") == FenceRecord(epoch=3, current_attempt="a1")
    assert await fresh.known("w-absent") is None
    assert bucket.calls == Counter(get=2)
    await fresh.known("w-old")
    assert bucket.calls == Counter(get=2), "read once"
    # a replica that never saw it writes: its create fails, then read-decide-write on the real one
    other = Counted(raw)
    d = await Records(other).cas("w-old", lambda r: core.on_fence_requested(r, fence("w-old", "a1", epoch=3), 2.0))
    assert d.record is not None and d.record.epoch == 4
    assert other.calls["create"] == 1 and other.calls["update"] == 1
    assert (await stored(js, names, "w-old")).epoch == 4
