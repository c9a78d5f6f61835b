"""State snapshots, so that a restart replays only what came after (issue 12, item 5).

A service that folds the event log into memory (router, dispatcher, fencer: the projection and
its own core state) writes, now and then and on a clean stop, a *snapshot* of that state with
the stream sequence it covers. At start-up it loads the snapshot and replays only the events after
it (`shell.replay(start_seq=...)`); the per-workload idempotence of the folds
(`Projection.apply`, `RouterState.apply`) makes "snapshot + the rest" equal to a full replay
(tests/snapshot: a property test over random histories).

Which sequence a snapshot covers: the *ack floor* of the service's durable event consumer, read
before the state is serialised (with no await in between). Every event at or below the floor was
acked, so handled, so folded in (a handler folds its event first). Events above it may be folded
already (the consumer runs many workloads at once): each workload's folded events are a prefix of
its events, so replaying from the floor re-applies them as no-ops.

Where: the KV bucket `names.kv_snapshots`, keys `<owner>.head` and `<owner>.<slot>.<n>` (the
body, zlib-compressed, in chunks under the server's max payload). A snapshot is written to the
slot the head does not name, then the head (with the chunk count, the size and a sha256): a
crash while writing leaves the previous snapshot whole. Each identity may write only its own keys
(`$KV.<bucket>.<owner>.>`, gpuorch.security.model).

A snapshot is refused (the service replays everything, logged `snapshot.unusable` with why) when
it cannot be read whole, its checksum or format differ, or it covers a sequence the stream has not
reached (the stream was recreated).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import hashlib
import time
import zlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, TypeVar

import msgspec
import nats.errors
import nats.js.errors
import structlog
from nats.js import JetStreamContext

from gpuorch.projection import Projection, dump_projection, load_projection
from gpuorch.resync import COST_SHARE
from gpuorch.runtime.telemetry import carrier_of
from gpuorch_proto import Names

log = structlog.get_logger("gpuorch.runtime.snapshot")

#: (`COST_SHARE`, from gpuorch.resync: a snapshot's cost is bounded to about 1/COST_SHARE of the
#: time as a resync's is: the next one waits at least that many times as long as the last took)

FORMAT = 1
CHUNK = 512 * 1024  # bytes per KV value (the server's max payload is 1 MiB)
DEFAULT_INTERVAL = 60.0  # seconds between periodic snapshots (`Tuning.snapshot_interval`)
#: while the service's durable has more than BUSY messages waiting, a due snapshot waits for a
#: lull (a burst is not slowed by writing the whole state), for at most MAX_DEFER intervals
BUSY = 200
MAX_DEFER = 5

T = TypeVar("T")


class Head(msgspec.Struct, frozen=True, kw_only=True):
    """What `<owner>.head` holds: where the current snapshot is and what it covers."""

    format: int = FORMAT
    owner: str
    seq: int  # every event of the stream at or below it is in the snapshot
    at: float  # when it was taken (the writer's clock)
    slot: str  # "a" or "b"
    chunks: int
    size: int  # bytes of the compressed body
    sha256: str
    raw_size: int = 0  # bytes before compression
    counts: dict[str, int] = msgspec.field(default_factory=dict)  # chunks in each slot


class Body(msgspec.Struct, frozen=True, kw_only=True):
    """A follower's state: the projection (`gpuorch.projection.dump_projection`), the trace
    context of the workloads still going on, and the service core's own folded state."""

    format: int = FORMAT
    projection: bytes
    traceparents: dict[str, dict[str, str]] = msgspec.field(default_factory=dict)
    core: bytes = b""


_HEAD = msgspec.msgpack.Decoder(Head)
_BODY = msgspec.msgpack.Decoder(Body)


class Unusable(Exception):
    """A snapshot that cannot be used (the reason says why); the service replays everything."""


class SnapshotStore:
    """One owner's snapshots in the snapshot bucket."""

    def __init__(self, kv: Any, owner: str, *, chunk: int = CHUNK) -> None:
        if not owner or any(c in owner for c in " *>"):
            raise ValueError(f"snapshot owner {owner!r} is not a key token")
        self.kv, self.owner, self.chunk = kv, owner, chunk

    async def head(self) -> Head | None:
        try:
            entry = await self.kv.get(f"{self.owner}.head")
        except nats.js.errors.KeyNotFoundError:
            return None
        if not entry.value:
            return None
        try:
            return _HEAD.decode(entry.value)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            raise Unusable(f"head of {self.owner} undecodable: {exc}") from None

    async def save(self, body: bytes, seq: int, *, at: float | None = None) -> Head:
        """Write `body` (what `seq` covers) to the free slot, then the head; returns the head."""
        old = await self._head_or_none()
        slot = "b" if old is not None and old.slot == "a" else "a"
        packed = await asyncio.to_thread(zlib.compress, body, 1)  # zlib lets go of the GIL: the loop goes on
        parts = [packed[i : i + self.chunk] for i in range(0, len(packed), self.chunk)] or [b""]
        for n, part in enumerate(parts):
            await self.kv.put(f"{self.owner}.{slot}.{n}", part)
        counts = dict(old.counts) if old is not None else {}
        for n in range(len(parts), counts.get(slot, 0)):  # what a bigger earlier snapshot left there
            with contextlib.suppress(nats.js.errors.KeyNotFoundError):
                await self.kv.purge(f"{self.owner}.{slot}.{n}")
        counts[slot] = len(parts)
        head = Head(
            owner=self.owner, seq=seq, at=time.time() if at is None else at, slot=slot,
            chunks=len(parts), size=len(packed), sha256=hashlib.sha256(packed).hexdigest(),
            raw_size=len(body), counts=counts,
        )  # fmt: skip
        await self.kv.put(f"{self.owner}.head", msgspec.msgpack.encode(head))
        return head

    async def load(self) -> tuple[Head, bytes] | None:
        """The current snapshot (None: there is none); raises `Unusable` when it is not whole."""
        head = await self.head()
        if head is None:
            return None
        if head.format != FORMAT:
            raise Unusable(f"format {head.format}, this release reads {FORMAT}")
        parts: list[bytes] = []
        for n in range(head.chunks):
            try:
                entry = await self.kv.get(f"{self.owner}.{head.slot}.{n}")
            except nats.js.errors.KeyNotFoundError:
                raise Unusable(f"chunk {head.slot}.{n} of {head.chunks} is missing") from None
            parts.append(entry.value or b"")
        packed = b"".join(parts)
        if len(packed) != head.size or hashlib.sha256(packed).hexdigest() != head.sha256:
            raise Unusable(f"body of {len(packed)} bytes does not match its head ({head.size} bytes, sha256)")
        try:
            return head, zlib.decompress(packed)
        except zlib.error as exc:
            raise Unusable(f"body does not decompress: {exc}") from None

    async def _head_or_none(self) -> Head | None:
        try:
            return await self.head()
        except Unusable:
            return None


def decode_body(data: bytes) -> Body:
    try:
        body = _BODY.decode(data)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise Unusable(f"body undecodable: {exc}") from None
    if body.format != FORMAT:
        raise Unusable(f"body format {body.format}, this release reads {FORMAT}")
    return body


def encode_body(body: Body) -> bytes:
    return msgspec.msgpack.encode(body)


def follower_body(projection: Projection, traceparents: Mapping[str, bytes | str | dict[str, str]], core: bytes = b"") -> bytes:
    """A follower's body: its projection, the trace context of workloads not finished, `core`.
    (A follower keeps a lone `traceparent` packed or as its string: the body has the carrier dict.)"""
    retired, views = projection.retired, projection.workloads
    live = {
        w: carrier_of(tp)
        for w, tp in traceparents.items() if w not in retired and ((v := views.get(w)) is None or not v.terminal)
    }  # fmt: skip
    return encode_body(Body(projection=dump_projection(projection), traceparents=live, core=core))


async def ack_floor(js: JetStreamContext, stream: str, durable: str) -> int:
    """The stream sequence at and below which the durable has acked everything (0: none yet)."""
    try:
        info = await js.consumer_info(stream, durable)
    except nats.js.errors.NotFoundError:
        return 0
    return int(info.ack_floor.stream_seq or 0) if info.ack_floor else 0


class Snapshots:
    """A service's snapshots: `restore` at start-up, `run` takes one every `interval` seconds
    (when anything was folded since), `take` at a clean stop.

    When: a snapshot writes the whole state (its cost grows with it), so `run` waits at least
    `COST_SHARE` times as long as the last one took, and a due snapshot waits while the
    service's durable has more than `BUSY` messages waiting (a burst), for at most `MAX_DEFER`
    intervals: with 10,000 workloads pending, snapshots taken in the middle of bursts were most of
    the slowdown of the backlog bench (docs/performance.md). A restart then replays more, at most
    what came in those intervals.

    `dump()` returns the body's bytes (synchronously: nothing is folded while it runs); the
    sequence is the ack floor of `durable` on the event stream, read just before."""

    def __init__(
        self,
        js: JetStreamContext,
        names: Names,
        owner: str,
        durable: str,
        dump: Callable[[], bytes],
        *,
        interval: float = DEFAULT_INTERVAL,
        inputs: Sequence[tuple[str, str]] = (),
    ) -> None:
        self.js, self.names, self.owner, self.durable, self.dump = js, names, owner, durable, dump
        self.interval = interval
        #: (stream, durable) of the service's other inputs, whose backlog is a burst too (the
        #: router's submits: its events durable keeps up with what it publishes itself)
        self.inputs = [(names.stream_evt, durable), *inputs]
        self.store: SnapshotStore | None = None
        self.last: Head | None = None
        self.took = 0.0  # seconds the last snapshot took (dump and write)

    async def _store(self) -> SnapshotStore:
        if self.store is None:
            self.store = SnapshotStore(await self.js.key_value(self.names.kv_snapshots), self.owner)
        return self.store

    async def restore(self) -> tuple[Head, Body] | None:
        """The snapshot to start from, or None (none, or unusable: logged with why)."""
        t0 = time.perf_counter()
        try:
            loaded = await (await self._store()).load()
            if loaded is None:
                log.info("snapshot.none", owner=self.owner)
                return None
            head, raw = loaded
            state = (await self.js.stream_info(self.names.stream_evt)).state
            if head.seq > (state.last_seq or 0):
                raise Unusable(f"covers sequence {head.seq}, the stream ends at {state.last_seq}: another history")
            if (state.first_seq or 0) > head.seq + 1:
                log.error(  # retention must never do this (docs/operations.md): said loudly, not hidden
                    "snapshot.gap", owner=self.owner, seq=head.seq, first_seq=state.first_seq,
                    reason="events after the snapshot were dropped by the stream's limits",
                )  # fmt: skip
            body = decode_body(raw)
        except Unusable as exc:
            log.warning("snapshot.unusable", owner=self.owner, reason=str(exc))
            return None
        except (TimeoutError, nats.js.errors.Error, nats.errors.Error) as exc:
            log.warning("snapshot.unusable", owner=self.owner, reason=f"could not be read: {exc!r}")
            return None
        self.last = head
        log.info("snapshot.loaded", owner=self.owner, seq=head.seq, bytes=head.size, seconds=round(time.perf_counter() - t0, 3))
        return head, body

    async def take(self) -> Head | None:
        """Write a snapshot now (None: nothing new since the last one, or nothing acked yet)."""
        seq = await ack_floor(self.js, self.names.stream_evt, self.durable)
        if seq == 0 or (self.last is not None and seq <= self.last.seq):
            return None
        t0 = time.perf_counter()
        body = self.dump()  # synchronous: the state does not change under it
        head = await (await self._store()).save(body, seq)
        self.last = head
        self.took = time.perf_counter() - t0
        log.info("snapshot.written", owner=self.owner, seq=seq, bytes=head.size, raw_bytes=head.raw_size, seconds=round(time.perf_counter() - t0, 3))
        return head

    def pause(self) -> float:
        """Seconds until the next snapshot is due: the interval, or longer after a costly one."""
        return max(self.interval, COST_SHARE * self.took)

    async def busy(self) -> bool:
        """Has one of the service's durables more than `BUSY` messages waiting for it (a burst)?"""
        for stream, durable in self.inputs:
            try:
                info = await self.js.consumer_info(stream, durable)
            except Exception:  # not known: as if quiet
                continue
            if int(info.num_pending or 0) > BUSY:
                return True
        return False

    async def run(self, stop: asyncio.Event) -> None:
        """A snapshot every `pause()` seconds until `stop`, each waiting for a lull for at most
        `MAX_DEFER` intervals (a failed one is logged, then the next)."""
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=self.pause())
            deadline = time.monotonic() + self.interval * (MAX_DEFER - 1)
            while not stop.is_set() and time.monotonic() < deadline and await self.busy():
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), timeout=1.0)
            if stop.is_set():
                return
            try:
                await self.take()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("snapshot.failed", owner=self.owner, error=repr(exc))

    async def final(self) -> None:
        """On a clean stop, after the consumers have drained: the last snapshot (never raises)."""
        try:
            await self.take()
        except Exception as exc:
            log.warning("snapshot.failed", owner=self.owner, error=repr(exc), when="stop")


@contextlib.contextmanager
def no_gc() -> Iterator[None]:
    """The cyclic collector off while a large state is built (decoding 100,000 workloads makes
    millions of objects, none of them garbage: each collection pass would scan them all again)."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def settle_heap() -> None:
    """After start-up: move what was built (the restored state) out of the collector's
    generations (`gc.freeze`), so later passes do not rescan it. No collection first: a pass over
    millions of live objects costs seconds and finds next to nothing (folding makes no cycles)."""
    gc.freeze()


async def restore_follower(
    snapshots: Snapshots, follower: Any, decode_core: Callable[[bytes], T] | None = None
) -> tuple[int, T | None]:
    """Restore `follower` (a `gpuorch.follow.Follower`) from the owner's snapshot: returns the
    sequence to replay from (0: everything, no usable snapshot) and the decoded core state
    (`decode_core(body.core)`; None without a snapshot). Nothing is restored unless all decodes."""
    restored = await snapshots.restore()
    if restored is None:
        return 0, None
    head, body = restored
    try:
        with no_gc():
            projection = load_projection(body.projection)
            core = decode_core(body.core) if decode_core is not None else None
    except Exception as exc:  # a body this release cannot read: replay everything instead
        log.warning("snapshot.unusable", owner=snapshots.owner, reason=f"state undecodable: {exc!r}")
        snapshots.last = None
        return 0, None
    follower.restore(projection, body.traceparents)
    return head.seq + 1, core


async def retention_floor(js: JetStreamContext, names: Names, owners: Sequence[str]) -> int:
    """The highest event-stream sequence below which every `owner`'s snapshot covers the log:
    events at or below it may be dropped without any service losing state (0: some owner has no
    snapshot yet, so nothing may go). Retention (docs/operations.md) never purges above it."""
    kv = await js.key_value(names.kv_snapshots)
    floor: int | None = None
    for owner in owners:
        try:
            head = await SnapshotStore(kv, owner).head()
        except Unusable:
            return 0
        if head is None:
            return 0
        floor = head.seq if floor is None else min(floor, head.seq)
    return floor or 0
