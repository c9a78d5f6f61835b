"""One compare-and-set for every writer of authoritative state, against a real nats-server."""

from __future__ import annotations

import asyncio

import pytest
from nats.js import JetStreamContext
from nats.js.errors import KeyWrongLastSequenceError

from gpuorch.runtime import kv
from gpuorch_proto import Names


async def test_concurrent_increments_each_win_once(js: JetStreamContext, names: Names) -> None:
    bucket = await js.key_value(names.kv_fence)
    decided: list[int] = []

    def bump(value: bytes | None) -> tuple[int, bytes]:
        n = int(value or b"0") + 1
        decided.append(n)
        return n, str(n).encode()

    results = await asyncio.gather(*(kv.compare_and_set(bucket, "w-1", bump) for _ in range(8)))
    assert sorted(r.decision for r in results) == list(range(1, 9)), "every writer saw the value it replaced"
    assert (await bucket.get("w-1")).value == b"8"
    assert len(decided) >= 8  # a conflict decides again, on what is there now
    assert results[-1].revision > 0


async def test_nothing_to_write_writes_nothing(js: JetStreamContext, names: Names) -> None:
    bucket = await js.key_value(names.kv_fence)
    w = await kv.compare_and_set(bucket, "w-2", lambda v: ("leave", None))
    assert (w.decision, w.value, w.revision) == ("leave", None, 0)
    assert await kv.read(bucket, "w-2") == (None, 0)


class Interleaved:
    """The real bucket, with another writer's put landing between our read and our write."""

    def __init__(self, bucket: object) -> None:
        self.bucket = bucket

    async def get(self, key: str) -> object:
        return await self.bucket.get(key)  # type: ignore[attr-defined]

    async def update(self, key: str, value: bytes, last: int) -> int:
        await self.bucket.put(key, b"theirs")  # type: ignore[attr-defined]
        return int(await self.bucket.update(key, value, last=last))  # type: ignore[attr-defined]


async def test_one_try_gives_up_on_a_conflict_and_the_default_decides_again(js: JetStreamContext, names: Names) -> None:
    bucket = await js.key_value(names.kv_owners)
    await bucket.create("w-3", b"a")
    with pytest.raises(KeyWrongLastSequenceError):
        await kv.compare_and_set(Interleaved(bucket), "w-3", lambda v: ("mine", b"c"), attempts=1)
    assert (await bucket.get("w-3")).value == b"theirs", "the stale write did not land"
    seen: list[bytes | None] = []

    def decide(v: bytes | None) -> tuple[str, bytes | None]:
        seen.append(v)
        return ("mine", b"c") if len(seen) < 3 else ("leave", None)

    w = await kv.compare_and_set(Interleaved(bucket), "w-3", decide)
    assert seen == [b"theirs", b"theirs", b"theirs"] and w.decision == "leave"


class Counted:
    """The real bucket, counting the reads made through it."""

    def __init__(self, bucket: object) -> None:
        self.bucket, self.reads = bucket, 0

    async def get(self, key: str) -> object:
        self.reads += 1
        return await self.bucket.get(key)  # type: ignore[attr-defined]

    async def create(self, key: str, value: bytes) -> int:
        return int(await self.bucket.create(key, value))  # type: ignore[attr-defined]

    async def update(self, key: str, value: bytes, last: int) -> int:
        return int(await self.bucket.update(key, value, last=last))  # type: ignore[attr-defined]


async def test_a_likely_absent_key_is_created_without_a_read_and_an_existing_one_decided_on(
    js: JetStreamContext, names: Names
) -> None:
    bucket = await js.key_value(names.kv_owners)
    seen: list[bytes | None] = []

    def claim(v: bytes | None) -> tuple[str, bytes | None]:
        seen.append(v)
        return ("claimed", b"me") if v is None else ("theirs", None)

    counted = Counted(bucket)
    w = await kv.compare_and_set(counted, "w-4", claim, attempts=1, likely_absent=True)
    assert (w.decision, counted.reads, seen) == ("claimed", 0, [None]), "one create, no read"
    await bucket.create("w-5", b"other")
    w = await kv.compare_and_set(counted, "w-5", claim, attempts=1, likely_absent=True)
    assert (w.decision, w.value) == ("theirs", None), "it existed: decided on its value, not a conflict"
    assert seen[-1] == b"other" and counted.reads == 1
    assert (await bucket.get("w-5")).value == b"other"
