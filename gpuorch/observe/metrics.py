"""Prometheus metrics of every service (the official `prometheus_client`), served by the shell.

`serve()` in `gpuorch.runtime.shell` starts the endpoint (`start_server`) on
`$GPUORCH_METRICS_ADDR:$GPUORCH_METRICS_PORT` (default `127.0.0.1:0`: any free port; `off`
disables it), logs `metrics.listening` with its URL and, with `$GPUORCH_STATE_DIR`, writes it to
`<state>/metrics/<service>-<pid>.json`. The counters are incremented in the shell where events
are published (`published`) and handled (`handled`); the gauges are read at scrape time from
the service's live projection (`watch_projection`, set by `gpuorch.follow.Follower`) and, in the
inventory, from the snapshots it publishes (`observe_snapshot`). docs/operations.md lists them.
"""

from __future__ import annotations

import functools
import json
import os
import weakref
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram, start_http_server
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from gpuorch.config import Settings
from gpuorch_proto import Base, ClusterSnapshot, type_tag
from gpuorch_proto import events as ev

PORT_ENV = "GPUORCH_METRICS_PORT"
ADDR_ENV = "GPUORCH_METRICS_ADDR"

DECISIONS = Counter("gpuorch_routing_decisions", "Routing decisions published, by outcome", ["outcome"])
ROUTING_LATENCY = Histogram(
    "gpuorch_routing_latency_seconds", "From a routing input received to its decision published",
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0),
)  # fmt: skip
HANDLING = Histogram(
    "gpuorch_message_handling_seconds", "From a message received to its outputs published", ["handler"],
)  # fmt: skip
MESSAGES = Counter("gpuorch_messages_handled", "Input messages by handler and result (ok, retry, rejected, dead_lettered)", ["handler", "result"])
EVENTS = Counter("gpuorch_events_published", "Events published (duplicates dropped by JetStream not counted), by type", ["type"])
FENCES = Counter("gpuorch_fences", "Attempts fenced (epoch moved past them), by cluster", ["cluster"])
PROMOTIONS = Counter("gpuorch_promotions", "Attempt outputs promoted to results, by cluster", ["cluster"])
PROMOTION_REJECTIONS = Counter("gpuorch_promotion_rejections", "Promotions refused (stale epoch), by cluster", ["cluster"])
ORPHANS = Counter("gpuorch_orphan_deletions", "Orphaned Jobs deleted, by cluster", ["cluster"])
LOST = Counter("gpuorch_attempts_lost", "Attempts declared lost (their cluster stopped answering), by cluster", ["cluster"])
CONSUMER_LAG = Gauge("gpuorch_consumer_lag_messages", "Messages left for a durable consumer after its latest fetch", ["stream", "durable"])
QUEUE_DEPTH = Gauge("gpuorch_queue_depth", "Pending jobs in each destination queue (from inventory snapshots)", ["cluster", "queue"])
REACHABLE = Gauge("gpuorch_cluster_reachable", "1 when the cluster answered inventory's latest list, else 0", ["cluster"])
KUBE_REQUESTS = Counter("gpuorch_kube_requests", "Kubernetes API calls made, by cluster, verb (list, watch, get, create, ...) and resource", ["cluster", "verb", "resource"])
CLUSTERS_LOST = Gauge("gpuorch_clusters_lost", "Clusters that do not answer (from inventory snapshots)")

#: What `handled` counts a message as: one series per handler and result, each at 0 from the start.
RESULTS = ("ok", "retry", "rejected", "dead_lettered")
#: The per-cluster counters: each at 0 from the first client of its cluster on (`cluster_seen`).
PER_CLUSTER = (FENCES, PROMOTIONS, PROMOTION_REJECTIONS, ORPHANS, LOST)

_projection: Any = None  # weakref.ref to the live Projection
_snapshots: dict[str, ClusterSnapshot] = {}


def published(event: Base) -> None:
    """Count one event that the stream stored (not a duplicate)."""
    kind = type_tag(event)
    EVENTS.labels(kind).inc()
    match event:
        case ev.Routed():
            DECISIONS.labels("routed").inc()
        case ev.Unroutable():
            DECISIONS.labels("unroutable").inc()
        case ev.Rejected() if event.decision is not None:
            DECISIONS.labels("rejected").inc()
        case ev.Fenced():
            FENCES.labels(event.cluster).inc()
        case ev.Promoted():
            PROMOTIONS.labels(event.cluster).inc()
        case ev.PromotionRejected():
            PROMOTION_REJECTIONS.labels(event.cluster).inc()
        case ev.OrphanDeleted():
            ORPHANS.labels(event.cluster).inc()
        case ev.Lost():
            LOST.labels(event.cluster).inc()
        case _:
            pass


@functools.cache
def _messages(handler: str, result: str) -> Any:
    return MESSAGES.labels(handler, result)  # a child per label pair, looked up once (per message otherwise)


@functools.cache
def _handling(handler: str) -> Any:
    return HANDLING.labels(handler)


def handled(handler: str, result: str, seconds: float | None = None, outputs: Sequence[Base] = ()) -> None:
    _messages(handler, result).inc()
    if seconds is None:
        return
    _handling(handler).observe(seconds)
    if any(isinstance(o, (ev.Routed, ev.Unroutable)) or (isinstance(o, ev.Rejected) and o.decision is not None) for o in outputs):
        ROUTING_LATENCY.observe(seconds)


def consumer_started(handler: str) -> None:
    """Export `handler`'s message counters at 0 before its first message: an alert on
    `increase(...)` needs a sample before the first count (deploy/prometheus/rules.yml)."""
    for result in RESULTS:
        _messages(handler, result)


def cluster_seen(cluster: str) -> None:
    """Export the per-cluster counters of `cluster` at 0 (the service has a client for it), so
    the first fence, rejection or orphan of a cluster is an increase Prometheus can see."""
    for counter in PER_CLUSTER:
        counter.labels(cluster)


def exported_names(registry: CollectorRegistry = REGISTRY) -> frozenset[str]:
    """Every sample name a service built on `registry` serves on `/metrics` (a counter `x` as
    `x_total` and `x_created`, a histogram as `x_bucket`, `x_count`, `x_sum`, `x_created`), also
    for a labelled family without samples yet. What alert rules and dashboards may name."""
    return frozenset(n for family in registry.collect() for n in sample_names(family))


def sample_names(family: Metric) -> frozenset[str]:
    """The sample names of one metric family (a labelled one before its first child: the names
    its first child will have)."""
    if family.samples:
        return frozenset(s.name for s in family.samples)
    return frozenset(family.name + suffix for suffix in _SUFFIXES.get(family.type, ("",)))


_SUFFIXES = {
    "counter": ("_total", "_created"),
    "histogram": ("_bucket", "_count", "_sum", "_created"),
    "summary": ("", "_count", "_sum", "_created"),
    "gaugehistogram": ("_bucket", "_gcount", "_gsum"),
    "info": ("_info",),
}


def consumer_lag(stream: str, durable: str, pending: int) -> None:
    CONSUMER_LAG.labels(stream, durable).set(pending)


def observe_snapshot(snap: ClusterSnapshot) -> None:
    _snapshots[snap.cluster] = snap
    REACHABLE.labels(snap.cluster).set(1 if snap.reachable else 0)
    for q in snap.queues:
        QUEUE_DEPTH.labels(snap.cluster, q.name).set(q.pending_jobs)
    CLUSTERS_LOST.set(sum(1 for s in _snapshots.values() if not s.reachable))


def watch_projection(projection: Any) -> None:
    """Export gauges of this live projection at every scrape (the latest one registered)."""
    global _projection
    _projection = weakref.ref(projection)


class _ProjectionCollector(Collector):
    def collect(self) -> Iterator[GaugeMetricFamily]:
        p = _projection() if _projection is not None else None
        workloads = GaugeMetricFamily("gpuorch_workloads", "Workloads by status (this service's projection)", labels=["status"])
        attempts = GaugeMetricFamily("gpuorch_attempts", "Attempts by state and cluster (this service's projection)", labels=["cluster", "state"])
        queue = GaugeMetricFamily("gpuorch_orchestration_queue_depth", "Workloads not yet dispatched: submitted, waiting or routed")
        if p is not None:
            by_status: dict[str, int] = {}
            by_attempt: dict[tuple[str, str], int] = {}
            for v in list(p.workloads.values()):
                if v.workload is None:
                    continue
                by_status[v.status] = by_status.get(v.status, 0) + 1
                for a in list(v.attempts.values()):
                    key = (a.cluster, a.status)
                    by_attempt[key] = by_attempt.get(key, 0) + 1
            for r in list(getattr(p, "retired", {}).values()):  # finished workloads kept compact
                if r.doc is None:
                    continue
                by_status[r.status] = by_status.get(r.status, 0) + 1
                for ra in r.attempts:
                    key = (ra.cluster, ra.status)
                    by_attempt[key] = by_attempt.get(key, 0) + 1
            for status, n in sorted(by_status.items()):
                workloads.add_metric([status], n)
            for (cluster, state), n in sorted(by_attempt.items()):
                attempts.add_metric([cluster, state], n)
            queue.add_metric([], sum(by_status.get(s, 0) for s in ("submitted", "waiting", "routed")))
        yield workloads
        yield attempts
        yield queue

    def describe(self) -> Iterator[GaugeMetricFamily]:
        return iter(())


REGISTRY.register(_ProjectionCollector())

# --- allocated vs productive (docs/activity.md, *Metrics*): exported by `gpuorch web` ----------------

CELL = ["destination", "owner", "stage"]
# name: (help, the figure of a cell's `gpuorch.observe.activity.Group`); GPU-seconds and seconds in the clusters' time
ACTIVITY_FAMILIES: dict[str, tuple[str, Callable[[Any], float]]] = {
    "gpuorch_gpu_allocated_seconds": ("GPU-seconds held by attempts' pods (GPUs x placed -> ended), clusters' time",
                                      lambda g: g.allocated * 3600.0),
    "gpuorch_gpu_active_seconds": ("Allocated GPU-seconds x the devices' mean activity (dcgm-exporter), where measured",
                                   lambda g: g.active * 3600.0),
    "gpuorch_gpu_activity_known_seconds": ("Allocated GPU-seconds whose device activity was measured (active / this = activity)",
                                           lambda g: g.known * 3600.0),
    "gpuorch_useful_steps": ("Steps the programs reported (their progress)", lambda g: g.steps),
    "gpuorch_useful_samples": ("Samples the programs reported (their progress)", lambda g: g.samples),
    "gpuorch_stepping_seconds": ("Time the programs stepped, clusters' time (steps / this = throughput)", lambda g: g.stepping_hours * 3600.0),
    "gpuorch_results_promoted": ("Attempts whose output was promoted to a result", lambda g: g.results),
}  # fmt: skip


class _ActivityCollector(Collector):
    """The latest round of `gpuorch web` (`gpuorch.observe.facts.Board`) at each scrape: one series
    per (destination, owner, stage) cell, owners and stages beyond the top ones summed as `other`
    (`gpuorch.observe.activity.cells`), and the attempts per verdict."""

    def __init__(self, latest: Callable[[], Any]) -> None:  # a `gpuorch.observe.facts.Round` or None
        # (not imported: the services import this module, and the activity's reading imports the router's rules)
        self.latest = latest

    def collect(self) -> Iterator[GaugeMetricFamily]:
        r = self.latest()
        families = {name: GaugeMetricFamily(name, text, labels=CELL) for name, (text, _) in ACTIVITY_FAMILIES.items()}
        verdicts = GaugeMetricFamily("gpuorch_attempts_diagnosed", "Attempts by the activity verdict on them (docs/activity.md)",
                                     labels=[*CELL, "verdict"])  # fmt: skip
        at = GaugeMetricFamily("gpuorch_activity_round_timestamp_seconds", "When the figures were read (Unix time)")
        took = GaugeMetricFamily("gpuorch_activity_round_duration_seconds", "How long reading and judging every attempt took")
        attempts = GaugeMetricFamily("gpuorch_activity_round_attempts", "Attempts the figures cover")
        if r is not None:
            for c in r.cells:
                cell = [c.destination, c.owner, c.stage]
                for name, (_, figure) in ACTIVITY_FAMILIES.items():
                    families[name].add_metric(cell, figure(c.group))
                for verdict, n in sorted(c.group.cases.items()):
                    verdicts.add_metric([*cell, verdict], n)
            at.add_metric([], r.at)
            took.add_metric([], r.seconds)
            attempts.add_metric([], len(r.judged))
        yield from families.values()
        yield from (verdicts, at, took, attempts)

    def describe(self) -> Iterator[GaugeMetricFamily]:
        return iter(())


def activity_registry(latest: Callable[[], Any]) -> CollectorRegistry:
    """A registry of the activity figures of `latest()` (the web view serves it at `/metrics`)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_ActivityCollector(latest))
    return registry


def start_server(service: str, log: Any = None) -> str | None:
    """Serve `/metrics` in a thread; returns its URL (None when disabled by `GPUORCH_METRICS_PORT=off`)."""
    settings = Settings.from_env()
    raw = settings.tuning.metrics_port.strip()
    if raw.lower() in ("off", "none", "-1"):
        return None
    addr = settings.tuning.metrics_addr
    server, _thread = start_http_server(int(raw or 0), addr=addr)
    url = f"http://{addr}:{server.server_port}/metrics"
    if settings.state_dir:
        d = settings.state_dir / "metrics"
        d.mkdir(parents=True, exist_ok=True)
        (d / f"{service}-{os.getpid()}.json").write_text(json.dumps({"service": service, "pid": os.getpid(), "url": url}))
    if log is not None:
        log.info("metrics.listening", url=url)
    return url
