"""The one periodic loop: a tick that raises is logged and the loop goes on."""

from __future__ import annotations

import asyncio

from gpuorch.follow import every


async def test_a_failing_tick_does_not_end_the_loop() -> None:
    stop = asyncio.Event()
    ticks: list[int] = []

    async def tick() -> None:
        ticks.append(len(ticks))
        if len(ticks) == 2:
            raise RuntimeError("the cluster said something odd")
        if len(ticks) == 4:
            stop.set()

    await asyncio.wait_for(every(stop, 0.001, tick, name="test"), timeout=10)
    assert ticks == [0, 1, 2, 3], "the tick after the failure ran, and the loop ended on stop"


async def test_stop_ends_the_wait_at_once() -> None:
    stop = asyncio.Event()

    async def tick() -> None:
        stop.set()

    await asyncio.wait_for(every(stop, 3600.0, tick, name="test"), timeout=5)
    assert stop.is_set()
