"""Inventory's shell: follow every cluster, build its snapshot (pure core), publish it.

Per kubeconfig context (one per cluster), informers (``gpuorch.informer``: list once, then
watch from the list's resourceVersion, re-list on 410 Gone) keep the cluster's nodes and pods
in a local cache; every interval a round reads the caches (no API call), calls
``core.build_snapshot`` and publishes the result as JSON to ``names.inventory(cluster)`` when it
changed (``core.snapshot_changed``) and at least every heartbeat. The stream keeps the last
message per subject, so a consumer that starts later reads every cluster's latest snapshot.

A cluster whose latest list or watch call failed (no answer, or an API error) is published as
unreachable: ``observed_at`` stays at the last successful observation, so the snapshot's age
says how stale it is. A quiet cluster (an open watch with nothing to say) is reachable. Datasets gpuorch staged come from the ``kv_staged`` bucket
(a KV watcher keeps them current). Queue delays of pods that started are measured on the way
and kept as an EWMA per (cluster, queue) (``core.QueueHistory``).

Environment: ``Settings.from_env()`` (GPUORCH_NATS_URL, GPUORCH_PREFIX, GPUORCH_KUBECONFIG,
GPUORCH_REGISTRY) plus GPUORCH_INVENTORY_INTERVAL (poll period, s, default 1) and
GPUORCH_INVENTORY_HEARTBEAT (republish period, s, default 5). SIGTERM/SIGINT: clean exit.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import msgspec
import nats.errors
import nats.js.errors
import structlog
from nats.js import JetStreamContext
from nats.js.kv import KeyValue
from opentelemetry.trace import SpanKind

from gpuorch.config import Registry, Settings, load_registry
from gpuorch.informer import PROBE_INTERVAL, ClusterInformers, Informer, describe
from gpuorch.informer import object_key as informer_key
from gpuorch.kube import TIMEOUT, ClusterClient, make_clients
from gpuorch.liveness import answering
from gpuorch.observe import metrics
from gpuorch.runtime import bus, logs, telemetry
from gpuorch.runtime.shell import run_service
from gpuorch_proto import ClusterRegistryEntry, ClusterSnapshot, Names, encode
from gpuorch_proto.subjects import valid_token

from . import core

log = structlog.get_logger("gpuorch.inventory")

DEFAULT_INTERVAL = 1.0
DEFAULT_HEARTBEAT = 5.0
PUBLISH_TIMEOUT = 5.0
STAGED_INITIAL_WAIT = 2.0  # at start, how long to wait for the staged-datasets watcher to catch up


def list_cluster(cc: ClusterClient) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Nodes and pods as plain dicts (blocking: runs in a worker thread)."""
    nodes = cc.sanitize(cc.core.list_node(_request_timeout=TIMEOUT))
    pods = cc.sanitize(cc.core.list_pod_for_all_namespaces(_request_timeout=TIMEOUT))
    return list(nodes.get("items") or []), list(pods.get("items") or [])


def describe_failure(exc: BaseException) -> str:
    """The `error` of an unreachable snapshot: short, without object addresses."""
    return describe(exc)


def informers_for(cc: ClusterClient, probe_interval: float = PROBE_INTERVAL) -> ClusterInformers:
    """Every node and every pod of one cluster (background load counts too), list-then-watch."""
    group = ClusterInformers(cc.name, probe=cc.probe, probe_interval=probe_interval, heartbeat=False)
    group.add("nodes", cc.core.list_node)
    group.add("pods", cc.core.list_pod_for_all_namespaces)
    return group


def trace_cluster_queue(cluster: str, start: core.PodStart) -> None:
    """The time an attempt's pod waited on its cluster, as a span in the workload's trace.

    Inventory is the component that sees it: from the pod's creation to its start, as the
    cluster reports them. The parent is the trace context the dispatcher gave the pod
    (``TRACEPARENT`` in its env), so the span lands in the workload's one trace.
    """
    parent = telemetry.extract({"traceparent": start.traceparent or ""})
    begin = int(start.created * 1e9)
    span = telemetry.tracer().start_span(
        "cluster.queue_wait",
        context=parent,
        kind=SpanKind.INTERNAL,
        start_time=begin,
        attributes={
            "gpuorch.workload": start.workload or "",
            "gpuorch.attempt": start.attempt or "",
            "gpuorch.cluster": cluster,
            "gpuorch.queue": start.queue,
            "gpuorch.gpus": start.gpus,
            "gpuorch.queue_wait_simulated_s": start.delay_s,
            "k8s.pod.name": start.name,
        },
    )
    span.end(end_time=max(begin, int(start.started * 1e9)))
    if start.workload:
        logs.remember_trace(start.workload, telemetry.trace_id_hex(span))  # its log lines carry the trace id
    log.info(
        "attempt.started_on_cluster",
        cluster=cluster,
        workload=start.workload,
        attempt=start.attempt,
        queue=start.queue,
        queue_wait_simulated_s=round(start.delay_s, 3),
    )


@dataclass
class ClusterState:
    """What one poll loop remembers between rounds."""

    name: str
    last_ok: ClusterSnapshot | None = None  # the last successful observation
    last_published: ClusterSnapshot | None = None
    last_published_at: float = float("-inf")  # monotonic
    seen_started: frozenset[str] = frozenset()
    memo: core.Memo = field(default_factory=core.Memo)  # parsed pods and nodes, from round to round
    pods: core.PodSet = field(default_factory=core.PodSet)  # parsed pods, from the watch's changes
    pods_generation: int = -1  # the pods informer's generation `pods` covers (-1: none yet)
    published_once: asyncio.Event = field(default_factory=asyncio.Event)


class Inventory:
    def __init__(
        self,
        settings: Settings,
        *,
        interval: float = DEFAULT_INTERVAL,
        heartbeat: float = DEFAULT_HEARTBEAT,
        clients: Mapping[str, ClusterClient] | None = None,
        registry: Registry | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.settings = settings
        self.names: Names = settings.names
        self.interval = interval
        self.heartbeat = heartbeat
        self.clock = clock
        if registry is None:
            registry = load_registry(settings.registry) if settings.registry else Registry(clusters={})
        self.registry = registry
        if clients is None:
            if settings.kubeconfig is None:
                raise SystemExit("inventory: GPUORCH_KUBECONFIG is not set (one context per cluster)")
            clients = make_clients(settings.kubeconfig)
        self.clients: dict[str, ClusterClient] = {}
        for name, cc in clients.items():
            if valid_token(name):
                self.clients[name] = cc
            else:
                log.error("cluster.invalid_name", cluster=name, hint="lowercase a-z0-9- (a subject token)")
        for name in sorted(set(self.clients) - set(self.registry.clusters)):
            log.warning("cluster.not_in_registry", cluster=name, hint="stores, prices, data locations unknown")
        self.history = core.QueueHistory()
        self.staged: dict[str, bytes] = {}  # kv_staged key -> value
        self.staged_ready = asyncio.Event()
        self.states = {name: ClusterState(name) for name in self.clients}
        self.informers = {name: informers_for(cc, settings.tuning.probe_interval) for name, cc in self.clients.items()}

    def entry(self, cluster: str) -> ClusterRegistryEntry:
        return self.registry.clusters.get(cluster, ClusterRegistryEntry())

    # --- one round for one cluster -----------------------------------------------------------
    def snapshot_from(
        self, state: ClusterState, nodes: list[dict[str, Any]], pods: core.Pods, now: float
    ) -> ClusterSnapshot:
        entry = self.entry(state.name)
        starts, state.seen_started = core.observe_pod_starts(
            pods, entry, time_scale=self.registry.time_scale, seen=state.seen_started, memo=state.memo
        )
        for start in starts:
            if start.gpus > 0:  # CPU pods do not wait for GPUs
                self.history = core.observe(self.history, state.name, start.queue, start.delay_s)
            if start.workload and start.traceparent:
                trace_cluster_queue(state.name, start)
        return core.build_snapshot(
            state.name,
            nodes,
            pods,
            entry,
            now=now,
            observed_at=now,
            time_scale=self.registry.time_scale,
            staged=core.staged_refs(self.staged, state.name),
            measured=core.measured_bandwidth(self.staged, state.name),
            history=self.history,
            memo=state.memo,
        )

    async def poll_once(self, state: ClusterState, cc: ClusterClient) -> ClusterSnapshot | None:
        """One round from the informers' caches (`cc` is not called: the informers are)."""
        inf = self.informers[state.name]
        if not answering(failing=inf.failing, synced=inf.synced):
            if not inf.failing:
                return None  # the first list has not answered yet, nor failed
            error = inf.error
            if state.last_published is None or state.last_published.reachable:
                log.warning("cluster.unreachable", cluster=state.name, error=error)
            return core.unreachable_snapshot(
                state.last_ok, state.name, self.entry(state.name), self.clock(), error,
                time_scale=self.registry.time_scale,
            )
        snap = self.snapshot_from(state, inf["nodes"].items(), self.follow_pods(state, inf["pods"]), self.clock())
        if state.last_published is not None and not state.last_published.reachable:
            log.info("cluster.reachable", cluster=state.name)
        state.last_ok = snap
        return snap

    @staticmethod
    def follow_pods(state: ClusterState, pods: Informer) -> core.PodSet:
        """`state.pods` brought up to the informer's cache: the pods changed since the last round
        parsed again (each as the cache holds it now), or all of them when the changes are not
        all known (the first round, a re-list)."""
        generation, changes = pods.changes_since(state.pods_generation)
        if changes is None:
            state.pods.reset((informer_key(o), o) for o in pods.items())
        else:
            keys = dict.fromkeys(c.key for c in changes)  # each once (a pod may change many times)
            state.pods.update((k, pods.get(k[1], k[0])) for k in keys)
        state.pods_generation = generation
        return state.pods

    async def publish(self, js: JetStreamContext, state: ClusterState, snap: ClusterSnapshot | None) -> None:
        due = time.monotonic() - state.last_published_at >= self.heartbeat
        if snap is None:  # nothing new: the heartbeat republishes the last one (its age keeps growing)
            if not due or state.last_published is None:
                return
            snap = state.last_published
        elif not (due or core.snapshot_changed(state.last_published, snap)):
            return
        snap = msgspec.structs.replace(snap, published_at=self.clock())
        try:
            await js.publish(self.names.inventory(state.name), encode(snap), timeout=PUBLISH_TIMEOUT)
        except (nats.errors.Error, nats.js.errors.Error, TimeoutError) as exc:
            log.warning("snapshot.publish_failed", cluster=state.name, error=repr(exc))
            return  # retried next round: last_published is unchanged
        metrics.observe_snapshot(snap)  # queue depth and reachability gauges
        changed = core.snapshot_changed(state.last_published, snap)
        state.last_published, state.last_published_at = snap, time.monotonic()
        state.published_once.set()
        (log.info if changed else log.debug)(
            "snapshot.published",
            cluster=state.name,
            reachable=snap.reachable,
            changed=changed,
            nodes=len(snap.nodes),
            gpus_free=sum(n.gpus_free for n in snap.nodes),
            running_gpus=snap.running_gpus,
            pending_gpus=snap.pending_gpus,
        )

    async def poll_loop(self, js: JetStreamContext, name: str, stop: asyncio.Event) -> None:
        state, cc = self.states[name], self.clients[name]
        structlog.contextvars.bind_contextvars(cluster=name)
        while not stop.is_set():
            started = time.monotonic()
            try:
                await self.publish(js, state, await self.poll_once(state, cc))
            except Exception:  # never let one round end the loop
                log.exception("cluster.round_failed", cluster=name)
            delay = max(0.0, self.interval - (time.monotonic() - started))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=delay)

    # --- datasets staged by gpuorch ----------------------------------------------------------
    async def watch_staged(self, kv: KeyValue, stop: asyncio.Event) -> None:
        while not stop.is_set():
            watcher = None
            try:
                watcher = await kv.watchall()
                async for entry in watcher:
                    if entry is None:  # caught up with what the bucket held
                        self.staged_ready.set()
                        continue
                    if entry.operation in ("DEL", "PURGE"):
                        self.staged.pop(entry.key, None)
                    else:
                        self.staged[entry.key] = entry.value or b""
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("staged.watch_failed", error=repr(exc))
            finally:
                if watcher is not None:
                    with contextlib.suppress(Exception):
                        await watcher.stop()  # type: ignore[no-untyped-call]
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=1.0)

    # --- the service -------------------------------------------------------------------------
    async def run(self, stop: asyncio.Event) -> None:
        loop = asyncio.get_running_loop()
        # one worker per cluster, so a hung cluster never delays another's listing
        loop.set_default_executor(concurrent.futures.ThreadPoolExecutor(max_workers=len(self.clients) + 2))
        nc = await bus.connect_as(self.settings, "gpuorch-inventory")  # its own identity (GPUORCH_NATS_CREDS)
        tasks: list[asyncio.Task[None]] = []
        try:
            js = nc.jetstream()
            await bus.await_topology(js, self.names)  # created by the admin identity
            kv = await js.key_value(self.names.kv_staged)
            tasks.append(asyncio.create_task(self.watch_staged(kv, stop)))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.staged_ready.wait(), timeout=STAGED_INITIAL_WAIT)
            for inf in self.informers.values():
                inf.start()
            tasks += [asyncio.create_task(self.poll_loop(js, name, stop)) for name in sorted(self.clients)]
            first_round: asyncio.Future[Any] = asyncio.ensure_future(
                asyncio.gather(*(s.published_once.wait() for s in self.states.values()))
            )
            stopping: asyncio.Future[Any] = asyncio.ensure_future(stop.wait())
            await asyncio.wait({first_round, stopping}, return_when=asyncio.FIRST_COMPLETED)
            if first_round.done():
                log.info(
                    "inventory.ready",
                    clusters=sorted(self.clients),
                    time_scale=self.registry.time_scale,
                    interval=self.interval,
                    heartbeat=self.heartbeat,
                )
            first_round.cancel()
            stopping.cancel()
            await stop.wait()
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            for inf in self.informers.values():
                await asyncio.to_thread(inf.stop)
            await nc.close()


def main() -> None:
    settings = Settings.for_service("inventory")
    interval, heartbeat = settings.tuning.inventory_interval, settings.tuning.inventory_heartbeat

    async def start(stop: asyncio.Event) -> None:
        # built inside the loop (it owns asyncio.Events); a bad configuration fails fast
        await Inventory(settings, interval=interval, heartbeat=heartbeat).run(stop)

    run_service("inventory", start)
