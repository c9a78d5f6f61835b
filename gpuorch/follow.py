"""What every service shell shares beyond the runtime: the projection kept live from the log.

At start-up a service replays the event stream into its `Projection`; afterwards its
durable consumer on `gpuorch.evt.>` applies each event before acting on it
(`Projection.apply` is idempotent by stream sequence, so the replayed tail that the
durable consumer redelivers changes nothing).

It also remembers each workload's trace context (the `traceparent` of the event
that carried it), so that work a service starts on its own (a timer, a watch) is
still a span of the workload's one trace: the `traceparent` alone, or the carrier dict
when a `tracestate` comes with it (memory: docs/performance.md). A `traceparent` in the W3C
form gpuorch sends (lowercase hex) is kept as its 26 bytes (`pack_traceparent`), about half the
string; any other as its string.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import structlog
from opentelemetry.context import Context

from gpuorch.config import SettingError, Tuning
from gpuorch.observe import metrics
from gpuorch.projection import Projection
from gpuorch.runtime import telemetry
from gpuorch.runtime.shell import replay
from gpuorch.runtime.snapshot import no_gc, settle_heap
from gpuorch.runtime.telemetry import carrier_of, pack_traceparent


def _services_projection() -> Projection:
    # settled finished workloads as compact records, live views in the compact form (gpuorch.projection)
    return Projection(retire=True, compact=True)


#: A remembered trace context: the `traceparent` alone (packed, `pack_traceparent`, or its
#: string), or the carrier with its `tracestate`.
Carrier = bytes | str | dict[str, str]



RETIRE = ("settled", "never")  # `Tuning.retire_finished`


@dataclass
class Follower:
    projection: Projection = field(default_factory=_services_projection)
    traceparents: dict[str, Carrier] = field(default_factory=dict)

    @classmethod
    def of(cls, tuning: Tuning) -> Follower:
        """A service's follower, retiring finished workloads as `tuning.retire_finished` says."""
        if tuning.retire_finished not in RETIRE:
            raise SettingError(f"GPUORCH_RETIRE_FINISHED={tuning.retire_finished!r}: one of {', '.join(RETIRE)}")
        return cls(Projection(retire=tuning.retire_finished == "settled", compact=True))

    def __post_init__(self) -> None:
        metrics.watch_projection(self.projection)  # gauges of workloads and attempts, read at scrape time

    def remember(self, workload_id: str, headers: dict[str, str] | None) -> None:
        """Keep the workload's trace context (called after its event is folded): none for a
        retired workload (`gpuorch.projection`), whose work is over."""
        if workload_id in self.projection.retired:
            self.traceparents.pop(workload_id, None)
            return
        if headers and "traceparent" in headers and workload_id not in self.traceparents:
            view = self.projection.workloads.get(workload_id)  # its id as the projection's one string
            key = view.workload_id if view is not None else workload_id
            tp = headers["traceparent"]
            self.traceparents[key] = {"traceparent": tp, "tracestate": headers["tracestate"]} if "tracestate" in headers else pack_traceparent(tp)

    def context(self, workload_id: str) -> Context | None:
        kept = self.traceparents.get(workload_id)
        return telemetry.extract(carrier_of(kept)) if kept else None

    def traceparent(self, workload_id: str) -> str | None:
        kept = self.traceparents.get(workload_id)
        return carrier_of(kept).get("traceparent") if kept else None

    def restore(self, projection: Projection, traceparents: Mapping[str, dict[str, str]]) -> None:
        """Start from a state snapshot's projection (gpuorch.runtime.snapshot), before `catch_up`."""
        self.projection.workloads, self.projection.last_seq = projection.workloads, projection.last_seq
        self.projection.retired = projection.retired
        if self.projection.retire:
            self.projection.retire_settled()  # a snapshot of a release that kept every view whole
        if self.projection.compact:
            self.projection.compact_all()  # decoded whole: shared parts and one string per id again
        views = self.projection.workloads
        for w, c in traceparents.items():
            v = views.get(w)
            self.traceparents[v.workload_id if v is not None else w] = pack_traceparent(c["traceparent"]) if c.keys() == {"traceparent"} else c

    async def catch_up(self, js: Any, stream: str, subject: str | Sequence[str], *, start_seq: int = 0) -> int:
        """Replay the log (from `start_seq`: what a restored snapshot does not cover) into the projection."""
        n = 0
        with no_gc():  # nothing folded is garbage: see gpuorch.runtime.snapshot.no_gc
            async for evt, _subject, seq, headers in replay(js, stream, subject, start_seq=start_seq):
                if evt is None:
                    continue
                self.projection.apply(evt, seq)
                self.remember(evt.workload_id, headers)
                n += 1
        settle_heap()
        return n


async def every(
    stop: asyncio.Event,
    interval: float,
    tick: Callable[[], Awaitable[None]],
    *,
    name: str,
    wake: asyncio.Event | None = None,
) -> None:
    """Run `tick` now and then every `interval` seconds until `stop` (the one periodic loop);
    `wake`, when set, runs the next tick at once (e.g. a cluster's call just failed).

    A tick that raises is logged and the next one runs: a service's loop never dies silently
    while the service goes on answering as if it watched.
    """
    log = structlog.get_logger("gpuorch.loop")
    while not stop.is_set():
        if wake is not None:
            wake.clear()
        try:
            await tick()
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("loop.tick_failed", loop=name)
        if wake is None:
            try:
                await asyncio.wait_for(stop.wait(), timeout=interval)
            except TimeoutError:
                pass
            continue
        waits = [asyncio.ensure_future(stop.wait()), asyncio.ensure_future(wake.wait())]
        try:
            await asyncio.wait(waits, timeout=interval, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for w in waits:
                w.cancel()


async def run_until_stopped(service: str, stop: asyncio.Event, work: list[Coroutine[Any, Any, Any]], **ready: Any) -> None:
    """Run a service's loops, say `<service>.ready`, and on `stop` cancel them and wait for them."""
    tasks = [asyncio.create_task(c) for c in work]
    structlog.get_logger(f"gpuorch.{service}").info(f"{service}.ready", **ready)
    await stop.wait()
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
