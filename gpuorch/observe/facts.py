"""Where the activity facts come from for each of their readers (docs/activity.md, *Who reads
metrics, and how often*).

- `gpuorch explain` and `gpuorch report` read once per run: `Sources.of(settings)`, then
  `Sources.facts` (every attempt of the views given).
- `gpuorch web` keeps a bounded cache per attempt (`FactsCache`), so that a page shown again, or
  the report computed again, reads again only what may have changed: a live attempt after
  `LIVE_TTL`, a finished one with a measurement missing after `RETRY_TTL`, a finished one fully
  measured (and read `SETTLE` after its pods let go, so its last samples were scraped) never.
  The workload page reads its own attempts (or its stages'); the report and the exported
  metrics read every attempt in a *round* (`Board`): one computation at a time, shared by every
  request, again when the log moved or the round is `ROUND_MAX_AGE` old. The workload list reads
  none: no row ever costs a request to Prometheus.

The facts themselves are gathered by `gpuorch.observe.devices` and judged by
`gpuorch.observe.activity`; nothing here decides anything.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from gpuorch.config import Registry, Settings, load_registry
from gpuorch.projection import WorkloadView
from gpuorch_proto import ClusterSnapshot

from .activity import AttemptFacts, Cell, Judged, Unknown, cells, judge, report_of
from .devices import CONCURRENCY, Reader, attempt_facts

#: a live attempt's facts are read again after this (real seconds)
LIVE_TTL: Final = 10.0
#: a finished attempt with a measurement missing (Prometheus down, no progress yet) after this
RETRY_TTL: Final = 60.0
#: a finished attempt's facts read this long after its pods let go are final (its last samples
#: were scraped: Prometheus' default scrape interval is 1 minute, dcgm-exporter's collection 30 s)
SETTLE: Final = 90.0
#: attempts the web view keeps facts of (a few hundred bytes each)
CACHE_SIZE: Final = 20_000
#: a round (the report, the metrics) older than this is computed again, even with no new event
ROUND_MAX_AGE: Final = 30.0
#: a page waits this long for a round being computed before it shows the previous one
ROUND_WAIT: Final = 10.0


@dataclass
class Sources:
    """What this process reads activity from: the registry's metrics sources (with its own
    kubeconfig for exporter mode) and the stores (the programs' progress)."""

    registry: Registry | None
    kube: Mapping[str, Any]
    stores: Any

    @classmethod
    def of(cls, s: Settings) -> Sources:
        """From the settings; what cannot be loaded makes the facts "unknown" with the reason,
        never an error here."""
        from gpuorch.stores import stores_of

        try:
            registry = load_registry(s.registry) if s.registry else None
        except (OSError, ValueError):
            registry = None  # every cluster's metrics then say: not in the registry
        kube: dict[str, Any] = {}
        if s.kubeconfig is not None and registry is not None and any(
            e.metrics is not None and e.metrics.exporter is not None for e in registry.clusters.values()
        ):
            from gpuorch.kube import make_clients

            try:
                kube = dict(make_clients(s.kubeconfig))
            except (OSError, ValueError):
                kube = {}
        return cls(registry, kube, stores_of(s, registry))

    def reader(self) -> Reader:
        """A reader for one pass (it reads each cluster's exporter page at most once)."""
        return Reader(self.registry, self.kube)

    async def facts(self, views: Sequence[WorkloadView], snapshots: Mapping[str, ClusterSnapshot], now: float) -> list[AttemptFacts]:
        """Every attempt's facts of `views`, read now (no cache)."""
        reader, gate = self.reader(), asyncio.Semaphore(CONCURRENCY)

        async def one(v: WorkloadView, a: Any) -> AttemptFacts:
            async with gate:
                return await attempt_facts(v, a, reader, self.stores, snapshots, now)

        return list(await asyncio.gather(*(one(v, a) for v in views for a in sorted(v.attempts.values(), key=lambda x: x.number))))


def ttl(f: AttemptFacts, read_at: float) -> float | None:
    """How long facts read at `read_at` stay good, in seconds; None: for good (see the module doc)."""
    if f.outcome == "live":
        return LIVE_TTL
    if f.held is None:
        return None  # ended before its pods held anything: nothing more will be measured
    measured = (f.progress,) if f.gpus <= 0 else (f.progress, f.held_use, f.compute_use)
    if any(isinstance(m, Unknown) for m in measured) or read_at < f.held[1] + SETTLE:
        return RETRY_TTL
    return None


@dataclass
class _Entry:
    stamp: Any  # the workload's last event sequence when read: a new event reads it again
    read_at: float
    ttl: float | None
    facts: AttemptFacts


@dataclass
class FactsCache:
    """Facts per attempt, least recently used dropped beyond `size`."""

    sources: Sources
    size: int = CACHE_SIZE
    entries: OrderedDict[str, _Entry] = field(default_factory=OrderedDict)
    reads: int = 0  # attempts read (not served from the cache), for the docs' numbers and the tests

    def fresh(self, attempt_id: str, stamp: Any, now: float) -> AttemptFacts | None:
        e = self.entries.get(attempt_id)
        if e is None or e.stamp != stamp or (e.ttl is not None and now - e.read_at >= e.ttl):
            return None
        self.entries.move_to_end(attempt_id)
        return e.facts

    def put(self, f: AttemptFacts, stamp: Any, now: float) -> None:
        self.entries[f.attempt_id] = _Entry(stamp, now, ttl(f, now), f)
        self.entries.move_to_end(f.attempt_id)
        while len(self.entries) > self.size:
            self.entries.popitem(last=False)

    async def facts(
        self, views: Sequence[WorkloadView], snapshots: Mapping[str, ClusterSnapshot], now: float,
        on_read: Callable[[int, int], None] | None = None,
    ) -> list[AttemptFacts]:  # fmt: skip
        """Every attempt's facts of `views` (in order), from the cache where still good; `on_read`
        hears (read so far, to read) as attempts are read."""
        wanted = [(v, a) for v in views for a in sorted(v.attempts.values(), key=lambda x: x.number)]
        out: list[AttemptFacts | None] = [self.fresh(a.attempt_id, v.last_seq, now) for v, a in wanted]
        missing = [i for i, f in enumerate(out) if f is None]
        if missing:
            reader, gate, done = self.sources.reader(), asyncio.Semaphore(CONCURRENCY), [0]

            async def read(i: int) -> None:
                v, a = wanted[i]
                async with gate:
                    f = await attempt_facts(v, a, reader, self.sources.stores, snapshots, now)
                self.put(f, v.last_seq, now)
                self.reads += 1
                out[i] = f
                done[0] += 1
                if on_read is not None:
                    on_read(done[0], len(missing))

            await asyncio.gather(*(read(i) for i in missing))
        return [f for f in out if f is not None]


@dataclass
class Round:
    """Every attempt of the log judged once: the report's activity part and the metrics' cells."""

    at: float  # when it was read (wall clock)
    seconds: float  # how long reading and judging took
    stamp: Any  # the log's position it covers
    judged: list[Judged]
    cells: list[Cell]
    _reports: dict[str | None, dict[str, Any]] = field(default_factory=dict)

    def report(self, cluster: str | None = None) -> dict[str, Any]:
        """`gpuorch report`'s activity part, for every destination or one."""
        if cluster not in self._reports:
            self._reports[cluster] = report_of(j for j in self.judged if cluster is None or j.facts.cluster == cluster)
        return self._reports[cluster]


class Board:
    """The web view's rounds: the latest one, and at most one being computed (shared by every
    request that wants it)."""

    def __init__(self, cache: FactsCache, time_scale: float = 1.0, max_age: float = ROUND_MAX_AGE) -> None:
        self.cache, self.time_scale, self.max_age = cache, time_scale, max_age
        self.latest: Round | None = None
        self.error: str | None = None  # why the last computation failed (the page says so)
        self.progress: tuple[int, int] = (0, 0)  # attempts read / to read by the round under way
        self._task: asyncio.Task[None] | None = None

    def stale(self, stamp: Any, now: float) -> bool:
        r = self.latest
        return r is None or r.stamp != stamp or now - r.at >= self.max_age

    async def current(
        self, views: Callable[[], list[WorkloadView]], snapshots: Callable[[], Mapping[str, ClusterSnapshot]], stamp: Any,
        wait: float = ROUND_WAIT,
    ) -> Round | None:  # fmt: skip
        """The latest round, computed again first if stale (waiting at most `wait` for it: after
        that, the previous one, or None before the first)."""
        if self._task is None and self.stale(stamp, time.time()):
            self._task = asyncio.create_task(self._compute(views(), dict(snapshots()), stamp))
        if self._task is not None:
            await asyncio.wait({self._task}, timeout=wait)
        return self.latest

    async def _compute(self, views: list[WorkloadView], snapshots: dict[str, ClusterSnapshot], stamp: Any) -> None:
        t0, now = time.perf_counter(), time.time()
        try:
            self.progress = (0, 0)
            facts = await self.cache.facts(views, snapshots, now, on_read=lambda n, of: setattr(self, "progress", (n, of)))
            judged = judge(facts, self.time_scale)
            self.latest = Round(now, time.perf_counter() - t0, stamp, judged, cells(judged))
            self.error = None
        except Exception as exc:  # shown on the page; the previous round stays
            self.error = f"{type(exc).__name__}: {exc}"
        finally:
            self._task = None
