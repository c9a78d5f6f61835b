"""One compare-and-set over a JetStream KV bucket, for every writer of authoritative state.

The fencing record and the ownership leases change only with the revision the writer read
(DESIGN §7): `update(key, value, last=rev)` (and `create` for a new key) raise
`KeyWrongLastSequenceError` when someone else wrote in between, and then the decision is taken
again on what is there now. Nothing here matches error strings.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from nats.js.errors import KeyNotFoundError, KeyWrongLastSequenceError

T = TypeVar("T")

__all__ = ["Written", "compare_and_set", "read"]


@dataclass(frozen=True)
class Written(Generic[T]):
    """The outcome of one compare-and-set: what the decision was, and the revision now."""

    decision: T
    value: bytes | None  # what was written (None: the decision wrote nothing)
    revision: int  # the key's revision after the write (or the one read, when nothing was written)


async def read(kv: Any, key: str) -> tuple[bytes | None, int]:
    """The key's value and revision (None, 0 when it does not exist)."""
    try:
        entry = await kv.get(key)
    except KeyNotFoundError:
        return None, 0
    return entry.value, int(entry.revision)


async def compare_and_set(
    kv: Any,
    key: str,
    decide: Callable[[bytes | None], tuple[T, bytes | None]],
    *,
    attempts: int | None = None,
    likely_absent: bool = False,
) -> Written[T]:
    """Read, decide, write with the revision read; on a conflict read and decide again.

    `decide(current value or None)` returns (its decision, the bytes to write or None to write
    nothing). `attempts`: give up after that many conflicts (re-raising the last one); None =
    retry until the write wins (each conflict means someone else made progress).
    `likely_absent`: first decide on "no value" and `create` without reading (one round trip
    instead of two for a key that does not exist yet); if it exists, that is not a conflict:
    read and decide as usual.
    """
    conflicts = 0
    if likely_absent:
        decision, new = decide(None)
        if new is not None:
            try:
                return Written(decision, new, int(await kv.create(key, new)))
            except KeyWrongLastSequenceError:
                pass  # it exists: decide on what it holds
    while True:
        value, rev = await read(kv, key)
        decision, new = decide(value)
        if new is None:
            return Written(decision, None, rev)
        try:
            if rev == 0:
                written = await kv.create(key, new)
            else:
                written = await kv.update(key, new, last=rev)
            return Written(decision, new, int(written))
        except KeyWrongLastSequenceError:
            conflicts += 1
            if attempts is not None and conflicts >= attempts:
                raise
