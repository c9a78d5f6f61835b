"""What a service holds is kept out of the cyclic collector's passes (`gc.freeze`), now and then.

A service's state (its projection and tables) is millions of objects at 10,000 pending workloads,
and folding makes no reference cycles: a backlog run found next to nothing in the collector's
passes (0 to 50 objects a pass). Yet each full pass traverses every object: 0.4 to 0.75 s of CPU
per pass at 10,000 pending, 15 to 20 % of a service's time in a backlog probe
(docs/performance.md). So, every `FREEZE_EVERY` seconds, the young generations are collected
(garbage among the newest objects goes) and what survived is frozen: left out of every later
pass, and still freed by reference counting as usual when nothing refers to it any more. Start-up
does the same once for what it restored (`gpuorch.runtime.snapshot.settle_heap`).

A cycle that becomes garbage once frozen is not found by the collector's usual passes, so a full
collection over everything (frozen or not) still runs every `FULL_EVERY` rounds at least, and
less often when it is costly (`gpuorch.resync`: not before 30 times its last duration).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import time

import structlog

from gpuorch.resync import Resync

log = structlog.get_logger("gpuorch.runtime.heap")

FREEZE_EVERY = 10.0  # seconds between rounds: young generations collected, the survivors frozen
FULL_EVERY = 60  # rounds (10 minutes) between full collections over every object, at least


def freeze_young() -> int:
    """Collect the young generations, then freeze what is left; returns what was collected."""
    found = gc.collect(1)
    gc.freeze()
    return found


def collect_all() -> int:
    """A collection over every object, frozen ones too; then freeze what is left."""
    gc.unfreeze()
    try:
        return gc.collect()
    finally:
        gc.freeze()


def round_once(pacing: Resync, now: float) -> str:
    """One round: a full collection when `pacing` says so, otherwise the young generations.
    Returns which ("full" or "young")."""
    if pacing.full(now):
        began = time.perf_counter()
        found = collect_all()
        took = time.perf_counter() - began
        pacing.took(now, took)
        log.debug("heap.collected", found=found, seconds=round(took, 3), frozen=gc.get_freeze_count())
        return "full"
    freeze_young()
    return "young"


async def keep(stop: asyncio.Event, every: float = FREEZE_EVERY) -> None:
    """Run rounds every `every` seconds until `stop` (started by `gpuorch.runtime.shell.serve`)."""
    pacing = Resync(FULL_EVERY)
    pacing.full(time.time())  # round 0: start-up settled the heap already (`settle_heap`)
    while not stop.is_set():
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(stop.wait(), timeout=every)
        if not stop.is_set():
            round_once(pacing, time.time())
