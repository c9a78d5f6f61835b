"""Gathering what `gpuorch.observe.activity` judges (the I/O shell; docs/activity.md):

- **device activity**, from where the registry says a cluster's GPU metrics are read
  (`registry.metrics`, `gpuorch_proto.MetricsSource`): a Prometheus HTTP API (PromQL over
  ``/api/v1/query``, plain HTTP), or NVIDIA's dcgm-exporter through the Kubernetes API's service
  proxy (the text format, parsed by prometheus_client's parser; present values only). Samples are
  attributed to an attempt by the labels dcgm-exporter sets with pod attribution on: `namespace`
  (`gpuorch`) and `pod` (its Job's pods, `gpuorch_proto.k8s.pod_name_regex`);
- **useful work**, from the program's progress as gpuorch's agent uploaded it to the attempt's
  prefix (``.gpuorch/progress.json``);
- **the shape of an unplaced request** against the destination's latest snapshot, by the
  router's own rules (`parse_demand`, `node_checks`, `free_slots`: placement is not decided again
  here).

Whatever cannot be read becomes `Unknown(reason)`; nothing here raises to its caller, and
nothing here is on the path of routing or promotion (only `gpuorch explain`, `gpuorch report`
and `gpuorch web` call it, through `gpuorch.observe.facts`).
"""

from __future__ import annotations

import asyncio
import json
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping, Sequence
from typing import Any, Final

from gpuorch.config import Registry
from gpuorch.observe.activity import AttemptFacts, DeviceUse, Measured, Progress, Shape, Unknown
from gpuorch.observe.progress import parse_work
from gpuorch.projection import AttemptView, WorkloadView
from gpuorch_proto import ClusterSnapshot, MetricsSource
from gpuorch_proto.k8s import NAMESPACE, pod_name_regex
from gpuorch_proto.storage import PROGRESS

GR_ENGINE_ACTIVE: Final = "DCGM_FI_PROF_GR_ENGINE_ACTIVE"  # ratio 0-1, where DCGM's profiling fields are on
GPU_UTIL: Final = "DCGM_FI_DEV_GPU_UTIL"  # percent, everywhere
FB_USED: Final = "DCGM_FI_DEV_FB_USED"  # MiB
#: seconds a Prometheus query or an exporter read may take
TIMEOUT: Final = 5.0
#: metrics reads in flight at once (the report reads every attempt)
CONCURRENCY: Final = 8


def _matchers(labels: Mapping[str, str], regex: Mapping[str, str] | None = None) -> str:
    def q(v: str) -> str:
        return v.replace("\\", "\\\\").replace('"', '\\"')

    parts = [f'{k}="{q(v)}"' for k, v in sorted(labels.items())]
    parts += [f'{k}=~"{q(v)}"' for k, v in sorted((regex or {}).items())]
    return "{" + ",".join(parts) + "}"


def queries(series: str, src: MetricsSource, attempt_id: str, seconds: float) -> dict[str, str]:
    """The PromQL of one window (evaluated at its end): per device series, the mean, the number of
    samples and the most device memory; and whether the cluster has any device series at all."""
    rng = f"[{max(1, round(seconds * 1000))}ms]"
    sel = _matchers({**src.selector, "namespace": NAMESPACE}, {"pod": pod_name_regex(attempt_id)})
    return {
        "mean": f"avg_over_time({series}{sel}{rng})",
        "count": f"count_over_time({series}{sel}{rng})",
        "fb": f"max(max_over_time({FB_USED}{sel}{rng}))",
        "any": f"count(count_over_time({GPU_UTIL}{_matchers(src.selector)}{rng}))",
    }


class MetricsUnavailable(Exception):
    """The source did not answer, or refused: the message says which and why."""


def prometheus_query(url: str, query: str, at: float, timeout: float = TIMEOUT) -> list[dict[str, Any]]:
    """One instant query (``GET <url>/api/v1/query``): the result vector."""
    full = url.rstrip("/") + "/api/v1/query?" + urllib.parse.urlencode({"query": query, "time": f"{at:.3f}"})
    try:
        with urllib.request.urlopen(full, timeout=timeout) as resp:  # a URL from the registry, checked http(s)
            doc = json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        try:
            detail = json.loads(exc.read()).get("error", "")
        except ValueError:
            detail = ""
        raise MetricsUnavailable(f"Prometheus at {url} refused the query ({exc.code}{': ' + detail if detail else ''})") from exc
    except (urllib.error.URLError, OSError, TimeoutError, ValueError) as exc:
        raise MetricsUnavailable(f"Prometheus at {url} did not answer: {getattr(exc, 'reason', exc)}") from exc
    if doc.get("status") != "success":
        raise MetricsUnavailable(f"Prometheus at {url} answered {doc.get('status')}: {doc.get('error')}")
    return list(doc.get("data", {}).get("result") or [])


def _value(sample: Mapping[str, Any]) -> float:
    return float(sample["value"][1])


def use_from_vectors(series: str, mean: Sequence[Mapping[str, Any]], count: Sequence[Mapping[str, Any]],
                     fb: Sequence[Mapping[str, Any]], source: str) -> DeviceUse | None:  # fmt: skip
    """The window's device use from the instant vectors (per device series: its mean and its
    number of samples), weighted by samples; percent series read as ratios. None: no series."""
    if not mean:
        return None
    counts = {json.dumps(s["metric"], sort_keys=True): _value(s) for s in count}
    scale = 100.0 if series == GPU_UTIL else 1.0
    total = n = 0.0
    for s in mean:
        k = counts.get(json.dumps(s["metric"], sort_keys=True), 1.0)
        total += _value(s) / scale * k
        n += k
    devices = {(s["metric"].get("Hostname", ""), s["metric"].get("gpu", ""), s["metric"].get("UUID", "")) for s in mean}
    return DeviceUse(activity=total / n if n else 0.0, samples=int(n), devices=len(devices),
                     fb_used_mib=_value(fb[0]) if fb else 0.0, series=series, source=source)  # fmt: skip


async def prometheus_use(src: MetricsSource, attempt_id: str, window: tuple[float, float]) -> Measured:
    assert src.prometheus is not None
    url = src.prometheus
    start, end = window
    seconds = end - start
    if seconds <= 0:
        return Unknown("an empty window")
    try:
        for series in (GR_ENGINE_ACTIVE, GPU_UTIL):
            q = queries(series, src, attempt_id, seconds)
            mean, count, fb = await asyncio.gather(*(asyncio.to_thread(prometheus_query, url, q[k], end) for k in ("mean", "count", "fb")))
            use = use_from_vectors(series, mean, count, fb, f"prometheus {url}")
            if use is not None:
                return use
        present = await asyncio.to_thread(prometheus_query, url, q["any"], end)
    except MetricsUnavailable as exc:
        return Unknown(str(exc))
    sel = _matchers(src.selector) if src.selector else "no selector"
    if not present or _value(present[0]) == 0:
        return Unknown(f"no dcgm-exporter series ({GPU_UTIL}, {sel}) in Prometheus at {url} over the window: is the exporter scraped?")
    return Unknown(f"no device series attributed to its pods (namespace {NAMESPACE}, pod=~{pod_name_regex(attempt_id)}): "
                   "dcgm-exporter's pod attribution is off, or its pods held no GPU then")  # fmt: skip


def exporter_text(client: Any, src: MetricsSource, timeout: float = TIMEOUT) -> str:
    """The exporter's page through the API server's service proxy (the official client)."""
    from kubernetes.client.exceptions import ApiException

    assert src.exporter is not None
    e = src.exporter
    where = f"/api/v1/namespaces/{e.namespace}/services/{e.service}:{e.port}/proxy/metrics"
    try:
        return str(client.core.connect_get_namespaced_service_proxy_with_path(
            f"{e.service}:{e.port}", e.namespace, "metrics", _request_timeout=(timeout, timeout)))  # fmt: skip
    except ApiException as exc:
        raise MetricsUnavailable(f"no dcgm-exporter at {where}: the API server answered {exc.status} {exc.reason}") from exc
    except Exception as exc:  # the cluster did not answer (urllib3 / socket errors)
        raise MetricsUnavailable(f"the API server did not answer for {where}: {type(exc).__name__}: {exc}") from exc


def use_from_exporter(text: str, attempt_id: str, source: str) -> DeviceUse | Unknown:
    """The attempt's devices as the exporter shows them now (one sample per device)."""
    import re

    from prometheus_client.parser import text_string_to_metric_families

    pod = re.compile(pod_name_regex(attempt_id))
    found: dict[str, list[tuple[dict[str, str], float]]] = {}
    try:
        for fam in text_string_to_metric_families(text):
            for s in fam.samples:
                found.setdefault(s.name, []).append((dict(s.labels), float(s.value)))
    except ValueError as exc:
        return Unknown(f"{source} is not the Prometheus text format: {exc}")
    if not found.get(GPU_UTIL):
        return Unknown(f"{source} has no {GPU_UTIL} series")

    def mine(series: str) -> list[float]:
        return [v for lab, v in found.get(series, []) if lab.get("namespace") == NAMESPACE and pod.fullmatch(lab.get("pod", ""))]

    series, values = (GR_ENGINE_ACTIVE, mine(GR_ENGINE_ACTIVE)) if mine(GR_ENGINE_ACTIVE) else (GPU_UTIL, [v / 100 for v in mine(GPU_UTIL)])
    if not values:
        return Unknown(f"no device of {source} is attributed to its pods now (pod attribution off, or it holds no GPU now)")
    return DeviceUse(activity=sum(values) / len(values), samples=len(values), devices=len(values),
                     fb_used_mib=max(mine(FB_USED), default=0.0), series=series, source=source)  # fmt: skip


class Reader:
    """Device use per attempt window, from each cluster's `registry.metrics`."""

    def __init__(self, registry: Registry | None, kube: Mapping[str, Any] | None = None) -> None:
        self.registry = registry
        self.kube = kube or {}
        self.gate = asyncio.Semaphore(CONCURRENCY)
        self._pages: dict[str, asyncio.Task[str]] = {}

    def source(self, cluster: str) -> MetricsSource | Unknown:
        entry = self.registry.clusters.get(cluster) if self.registry is not None else None
        if entry is None:
            return Unknown(f"cluster {cluster} is not in the registry")
        if entry.metrics is None:
            return Unknown(f"the registry names no metrics source for {cluster} (clusters[].registry.metrics)")
        return entry.metrics

    async def use(self, cluster: str, attempt_id: str, window: tuple[float, float] | None, *, live: bool) -> Measured:
        if window is None:
            return Unknown("no window: its pods held no GPUs, or the program reported no steps")
        src = self.source(cluster)
        if isinstance(src, Unknown):
            return src
        async with self.gate:
            if src.prometheus is not None:
                got = await prometheus_use(src, attempt_id, window)
                if not isinstance(got, Unknown) or src.exporter is None or not live:
                    return got
            if not live:
                return Unknown("the exporter gives only present values: a finished attempt's activity needs "
                               "a Prometheus (registry.metrics.prometheus)")  # fmt: skip
            client = self.kube.get(cluster)
            if client is None:
                return Unknown(f"no Kubernetes client for {cluster} to reach its exporter")
            if cluster not in self._pages:
                self._pages[cluster] = asyncio.ensure_future(asyncio.to_thread(exporter_text, client, src))
            try:
                text = await self._pages[cluster]
            except MetricsUnavailable as exc:
                return Unknown(str(exc))
            assert src.exporter is not None
            return use_from_exporter(text, attempt_id, f"dcgm-exporter {src.exporter.namespace}/{src.exporter.service} (now)")


async def progress_of(stores: Any, a: AttemptView) -> Progress | Unknown:
    """The program's last uploaded progress for the attempt, or why there is none."""
    from gpuorch.objectstore import StoreUnavailable

    where = stores.locate(a.output_path) if a.output_path else None
    if where is None:
        return Unknown(f"its output path {a.output_path or '(none)'} is in no store this process knows")
    key = f"{where[1].rstrip('/')}/{PROGRESS}"
    try:
        data = await stores[where[0]].get(key)
    except StoreUnavailable as exc:
        return Unknown(f"store {where[0]} did not answer: {exc}")
    if data is None:
        return Unknown(f"the program reported no progress ({stores[where[0]].url_of(key)} does not exist)")
    doc = parse_work(data)
    return Progress.of(doc) if doc is not None else Unknown(f"{stores[where[0]].url_of(key)} is not a progress document")


def shape_of(view: WorkloadView, a: AttemptView, snapshot: ClusterSnapshot | None) -> Shape | None:
    """The unplaced attempt's request against its destination's free GPUs, by the router's rules:
    the suitable nodes (`node_checks`) and the placements free now (`free_slots`)."""
    from gpuorch_router.checks import free_slots, node_checks
    from gpuorch_router.demand import parse_demand
    from gpuorch_router.explain import HINTS
    from gpuorch_router.index import SnapshotIndex

    if snapshot is None or view.workload is None:
        return None
    d = parse_demand(view.workload, None, None)
    if d.per_node <= 0:
        return None
    idx = SnapshotIndex(snapshot)
    checks, suitable = node_checks(idx, d)
    free_by_node = sorted((min(max(n.gpus_free, 0), n.gpus_allocatable) for c in suitable for n in c.members if n.ready), reverse=True)
    verdict = next((v for v in view.decision.verdicts if v.cluster == a.cluster), None) if view.decision else None
    said = tuple(f"{c.code}: {c.message}" for c in (verdict.checks if verdict else checks) if c.code in ("GPU_SHAPE", "GPU_CAPACITY", "GANG_SPLIT"))
    return Shape(
        cluster=a.cluster, per_node=d.per_node, units=d.units,
        free_total=sum(free_by_node), free_slots=sum(free_slots(c, d.per_node, d.units) for c in suitable),
        free_by_node=tuple(f for f in free_by_node if f > 0), scheduler=a.unschedulable, explain=said,
        hint=HINTS["GPU_SHAPE"][1],
    )  # fmt: skip


async def attempt_facts(
    view: WorkloadView, a: AttemptView, reader: Reader, stores: Any, snapshots: Mapping[str, ClusterSnapshot], now: float
) -> AttemptFacts:
    """One attempt's facts: its allocation (the timeline), its progress, its devices' use over the
    time its pods held them and while its program stepped, and its shape while unplaced."""
    from gpuorch.observe.timeline import attempt_timeline

    owner = view.workload.metadata.owner if view.workload else ""
    t = attempt_timeline(view, a, None, None, now)
    progress = await progress_of(stores, a) if a.output_path else Unknown("no attempt prefix yet")
    p = progress if isinstance(progress, Progress) else None
    live = t.outcome == "live"
    stepping: tuple[float, float] | None = None
    if p is not None and p.first_step_at is not None and p.last_step_at is not None and p.last_step_at > p.first_step_at:
        stepping = (p.first_step_at, now if live and not p.done else p.last_step_at)
    elif "compute-started" in a.times and t.held is not None:
        stepping = (a.times["compute-started"], t.held[1])
    held_use: Measured
    compute_use: Measured
    if t.gpus <= 0:
        held_use = compute_use = Unknown("it holds no GPU")
    else:
        held_use, compute_use = await asyncio.gather(
            reader.use(a.cluster, a.attempt_id, t.held, live=live), reader.use(a.cluster, a.attempt_id, stepping, live=live))
    shape = shape_of(view, a, snapshots.get(a.cluster)) if t.held is None and live else None
    return AttemptFacts(
        workload_id=view.workload_id, attempt_id=a.attempt_id, cluster=a.cluster, owner=owner, gpus=t.gpus,
        held=t.held, outcome=t.outcome, progress=progress, held_use=held_use, compute_use=compute_use,
        stage=view.stage, pipeline=view.pipeline, compute_started=a.times.get("compute-started"), shape=shape,
    )  # fmt: skip

