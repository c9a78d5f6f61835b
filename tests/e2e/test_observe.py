"""Seeing the whole path, end to end (issue 14): the report against the events' own timestamps,
its charts, one trace per workload at a real OTLP receiver, Prometheus metrics from every
service, log lines with their ids, and the web view in a real headless browser."""

from __future__ import annotations

import asyncio
import gzip
import json
import os
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from prometheus_client.parser import text_string_to_metric_families

from gpuorch.client import Client
from gpuorch.observe.report import build_report
from gpuorch.observe.timeline import timelines
from gpuorch.runtime.telemetry import trace_id_hex
from gpuorch.system import System
from gpuorch_proto import Event, type_tag
from gpuorch_proto import events as ev
from tests.e2e.workloads import train
from tests.support.browser import launch
from tests.support.system import running
from tests.support.wait import assert_eventually

pytestmark = pytest.mark.e2e
HERE = Path(__file__).parent
ROOT = HERE.parent.parent
SERVICES = ("router", "dispatcher", "fencer", "inventory")
METRICS = (
    "gpuorch_routing_decisions", "gpuorch_routing_latency_seconds", "gpuorch_queue_depth", "gpuorch_orchestration_queue_depth",
    "gpuorch_attempts", "gpuorch_workloads", "gpuorch_clusters_lost", "gpuorch_cluster_reachable", "gpuorch_fences",
    "gpuorch_promotions", "gpuorch_promotion_rejections", "gpuorch_orphan_deletions", "gpuorch_attempts_lost",
    "gpuorch_consumer_lag_messages", "gpuorch_messages_handled", "gpuorch_events_published",
)  # fmt: skip


class OtlpReceiver:
    """The OTLP/HTTP protocol (protobuf `ExportTraceServiceRequest` on POST /v1/traces), served by
    a small in-test HTTP server: what a collector's otlphttp receiver accepts."""

    def __init__(self) -> None:
        self.spans: list[dict[str, Any]] = []
        self.lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                if self.path != "/v1/traces" or self.headers.get("Content-Type") != "application/x-protobuf":
                    self.send_response(404)
                    self.end_headers()
                    return
                req = ExportTraceServiceRequest.FromString(body)
                with receiver.lock:
                    for rs in req.resource_spans:
                        attrs = {a.key: a.value.string_value for a in rs.resource.attributes}
                        for ss in rs.scope_spans:
                            for s in ss.spans:
                                receiver.spans.append({
                                    "trace_id": s.trace_id.hex(), "span_id": s.span_id.hex(), "parent": s.parent_span_id.hex(),
                                    "name": s.name, "service": attrs.get("service.name"),
                                    "attributes": {a.key: a.value.string_value or a.value.int_value for a in s.attributes},
                                })  # fmt: skip
                out = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def of_trace(self, trace_id: str) -> list[dict[str, Any]]:
        with self.lock:
            return [s for s in self.spans if s["trace_id"] == trace_id]


@pytest.fixture(scope="module")
def otlp() -> Iterator[OtlpReceiver]:
    r = OtlpReceiver()
    yield r
    r.server.shutdown()


@pytest.fixture(scope="module")
def system(tmp_path_factory: pytest.TempPathFactory, otlp: OtlpReceiver) -> Iterator[System]:
    with running(tmp_path_factory.mktemp("observe"), HERE / "clusters.yaml", env_extra={
        "GPUORCH_LOST_AFTER": "2", "GPUORCH_METRICS_PORT": "0",
        "OTEL_EXPORTER_OTLP_ENDPOINT": otlp.url, "OTEL_BSP_SCHEDULE_DELAY": "200",
    }) as s:  # fmt: skip
        yield s


@pytest.fixture(scope="module")
def ran(system: System) -> dict[str, str]:
    """Several workloads: a clean one, one that fails once and is retried, one whose cluster is
    lost mid-run and is replaced elsewhere (then the partition heals and its Job is collected)."""

    async def run() -> dict[str, str]:
        s = system.settings
        async with Client(s.nats_url, s.names, creds=s.nats_creds) as c:
            ids = {
                "clean": await c.submit(train("obs-clean", steps=10)),
                "retried": await c.submit(train("obs-retried", steps=20, args=[  # resumed from its step-10 checkpoint
                    "--input", "mnist@v1", "--steps", "20", "--step-seconds", "60", "--checkpoint-every", "5",
                    "--fail-at-step", "10", "--exit-code", "3"])),
            }  # fmt: skip

            async def failed_once() -> bool:  # before any partition: its failure is its own
                v = await c.view(ids["retried"])
                return v is not None and any(a.status == "failed" for a in v.attempts.values())

            await assert_eventually(failed_once, timeout=60)
            ids["lost"] = await c.submit(train("obs-lost", steps=80, fencing="fast", lease="10h"))

            async def running_home() -> str | None:
                v = await c.view(ids["lost"])
                a = v.latest_attempt if v is not None else None
                return a.cluster if a is not None and a.status == "running" else None

            home = await assert_eventually(running_home, timeout=60)
            system.fault(home, "partition")
            try:
                async def replaced() -> bool:
                    v = await c.view(ids["lost"])
                    return v is not None and any(a.cluster != home and a.status in ("running", "succeeded") for a in v.attempts.values())

                await assert_eventually(replaced, timeout=60)
            finally:
                system.fault(home, "heal")
            for wid in ids.values():
                v = await c.wait(wid, timeout=120)
                assert v.status == "completed", (wid, v.reason)

            async def old_collected() -> bool:  # the lost attempt's Job is removed once its cluster answers
                v = await c.view(ids["lost"])
                assert v is not None
                return any(a.cluster == home and a.gone for a in v.attempts.values())

            await assert_eventually(old_collected, timeout=60)
        return ids

    return asyncio.run(run())


def _ready(events: list[Event], n: int) -> float:
    for e in events:
        if n == 1 and isinstance(e, ev.Submitted):
            return e.at
        if isinstance(e, ev.RouteRequested) and e.attempt_number == n:
            return e.at
    raise AssertionError(f"no ready mark for attempt {n}")


async def test_report_matches_the_events_and_charts_are_written(system: System, ran: dict[str, str], client: Client, tmp_path: Path) -> None:
    events = await client.events()
    mine = set(ran.values())
    by: dict[str, list[Event]] = {}
    for _, e in events:
        if e.workload_id in mine:
            by.setdefault(e.workload_id, []).append(e)
    tls = [t for wid, t in timelines(events).items() if wid in mine]
    report = build_report(tls, time_scale=600.0)
    dests = {d["cluster"]: d for d in report["destinations"]}

    # from the events alone: per cluster, every attempt's queue delay, GPU-hours, failures, losses
    queue: dict[str, list[float]] = {}
    hours: dict[str, float] = {}
    failed: dict[str, int] = {}
    lost: dict[str, int] = {}
    results: dict[str, int] = {}
    attempts: dict[str, int] = {}
    for wid, es in by.items():
        created = [e for e in es if isinstance(e, ev.AttemptCreated)]
        assert created, wid
        for c in created:
            mine_e = [e for e in es if getattr(e, "attempt_id", None) == c.attempt_id]
            at = {type_tag(e): e.at for e in reversed(mine_e)}  # the first of each type
            attempts[c.cluster] = attempts.get(c.cluster, 0) + 1
            queue.setdefault(c.cluster, [])
            hours.setdefault(c.cluster, 0.0)
            admitted = at.get("admitted")
            if admitted is not None:  # (an attempt created just as its cluster is cut off is lost unplaced: no GPU-hours)
                queue[c.cluster].append((admitted - _ready(es, c.attempt_number)) * 600)
                end = at.get("succeeded", at.get("failed"))
                if end is None:
                    end = min(x for x in (at.get("cancel-confirmed"), at.get("orphan-deleted")) if x is not None)
                hours[c.cluster] += 2 * (end - admitted) * 600 / 3600
            failed[c.cluster] = failed.get(c.cluster, 0) + ("failed" in at)
            lost[c.cluster] = lost.get(c.cluster, 0) + ("lost" in at)
            results[c.cluster] = results.get(c.cluster, 0) + ("promoted" in at)
            # the program reported its first step: the timeline has a startup and a run
            if "succeeded" in at and c.attempt_id.endswith("a1") and wid == ran["clean"]:
                assert "compute-started" in at
    trail = {wid: [f"{type_tag(e)}:{getattr(e, 'attempt_id', '')}" for e in es] for wid, es in by.items()}
    # the partition loses whatever ran on that cluster then; the retried one failed once
    assert sum(failed.values()) >= 1 and sum(lost.values()) >= 1, trail
    assert set(dests) == set(queue)
    for cluster, d in dests.items():
        assert d["attempts"] == attempts[cluster]
        for q in (50, 90, 99):
            assert d["queue_delay_s"][f"p{q}"] == pytest.approx(float(np.percentile(queue[cluster], q)), rel=1e-9)
        assert d["gpu_hours"] == pytest.approx(hours[cluster], rel=1e-9)
        assert d["failed_attempts"] == failed[cluster] and d["lost_attempts"] == lost[cluster]
        assert d["results"] == results[cluster]
        if results[cluster]:
            assert d["gpu_hours_per_result"] == pytest.approx(hours[cluster] / results[cluster], rel=1e-9)
    assert report["fleet"]["results"] == 3
    assert sum(d["cleanup"]["confirmed_gone"] for d in dests.values()) >= 2  # the failed and the lost one

    # the CLI: the same figures as JSON, and the charts
    out = await asyncio.to_thread(subprocess.run,
        [sys.executable, "-m", "gpuorch.cli", "--state", str(system.state_dir), "report", "-o", "json", "--plot", str(tmp_path)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert {d["cluster"] for d in doc["destinations"]} >= set(dests)
    for name in ("queue-delay", "gantt", "gpu-hours"):
        png = tmp_path / f"{name}.png"
        assert png.read_bytes()[:4] == b"\x89PNG" and png.stat().st_size > 5000

    got = await asyncio.to_thread(subprocess.run, [sys.executable, "-m", "gpuorch.cli", "--state", str(system.state_dir), "get", ran["clean"]],
                         capture_output=True, text=True, timeout=60)  # fmt: skip
    assert got.returncode == 0, got.stderr
    for gap in ("policy delay", "admission", "staging", "startup", "run", "output"):
        assert gap in got.stdout, got.stdout


async def test_one_trace_per_workload_at_an_otlp_receiver(ran: dict[str, str], client: Client, otlp: OtlpReceiver) -> None:
    tid = trace_id_hex(await client.trace_context(ran["lost"]))
    assert tid

    def complete() -> bool:
        got = otlp.of_trace(tid)
        services = {s["service"] for s in got}
        names = {s["name"] for s in got}
        assert services >= set(SERVICES), services
        assert {"routing", "dispatch", "fence", "promotion"} <= names, names
        assert sum(1 for n in names if n.startswith("attempt ")) == 2, names  # the lost one and its replacement
        return True

    await assert_eventually(complete, timeout=30)
    # one workload, one trace: no span of another workload in it
    assert {s["attributes"].get("gpuorch.workload_id") for s in otlp.of_trace(tid)} <= {ran["lost"], "", None, 0}


async def test_a_cancel_joins_the_workloads_trace(client: Client, otlp: OtlpReceiver) -> None:
    c = client
    wid = await c.submit(train("obs-cancel", steps=200))

    async def attempt() -> bool:
        v = await c.view(wid)
        return v is not None and bool(v.attempts)

    await assert_eventually(attempt, timeout=60)
    await c.cancel(wid, "test")
    v = await c.wait(wid, timeout=60)
    assert v.status == "cancelled", v.reason
    tid = trace_id_hex(await c.trace_context(wid))
    assert tid

    def joined() -> bool:
        names = {(s["service"], s["name"]) for s in otlp.of_trace(tid)}
        assert ("dispatcher", "cancel") in names, names
        assert any(n.endswith("cmd.cancel process") for _, n in names), names
        return True

    await assert_eventually(joined, timeout=30)


def test_every_service_serves_prometheus_metrics(system: System, ran: dict[str, str]) -> None:
    urls = {}
    for f in (system.state_dir / "metrics").glob("*.json"):
        doc = json.loads(f.read_text())
        if doc["pid"] == system.procs[doc["service"]].pid:
            urls[doc["service"]] = doc["url"]
    assert set(urls) == set(SERVICES)
    seen: dict[str, dict[str, Any]] = {}
    for service, url in urls.items():
        with urllib.request.urlopen(url, timeout=5) as r:
            assert r.headers["Content-Type"].startswith("text/plain; version=")
            text = r.read().decode()
        families = {f.name: f for f in text_string_to_metric_families(text)}
        missing = [m for m in METRICS if m not in families]
        assert not missing, f"{service}: {missing}"
        seen[service] = families
    samples = lambda svc, name: {tuple(sorted(s.labels.items())): s.value for s in seen[svc][name].samples if s.name == name + "_total" or s.name == name}  # noqa: E731
    assert samples("router", "gpuorch_routing_decisions")[(("outcome", "routed"),)] >= 4
    assert sum(samples("fencer", "gpuorch_promotions").values()) >= 3
    assert sum(samples("fencer", "gpuorch_fences").values()) >= 2
    assert sum(samples("dispatcher", "gpuorch_attempts_lost").values()) >= 1
    assert any(s.name == "gpuorch_routing_latency_seconds_count" and s.value >= 4 for s in seen["router"]["gpuorch_routing_latency_seconds"].samples)
    assert samples("inventory", "gpuorch_queue_depth"), "queue depth per destination queue"
    assert samples("dispatcher", "gpuorch_attempts")


def test_log_lines_about_a_workload_carry_its_ids(system: System, ran: dict[str, str]) -> None:
    wid = ran["lost"]
    lines = 0
    for service in SERVICES:
        for raw in (system.logs / f"{service}.log").read_text().splitlines():
            if wid not in raw or not raw.startswith("{"):
                continue
            line = json.loads(raw)
            if "logger" in line:  # a library's own line through stdlib logging (e.g. urllib3 naming a Job URL)
                continue
            lines += 1
            assert line.get("workload_id") == wid, line
            assert line.get("trace_id"), line
            if isinstance(line.get("attempt"), str) or str(line.get("event", "")).startswith("job."):
                assert str(line.get("attempt_id") or line.get("job", "")).startswith(wid), line
    assert lines > 5  # the services' decisions about it (msg.processed is at debug)


# -- the web view in a real browser ------------------------------------------------------------


@pytest.fixture(scope="module")
def web(system: System) -> Iterator[str]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpuorch.cli", "--state", str(system.state_dir), "web", "--port", "0"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("gpuorch web: http://127.0.0.1:"), line + (proc.stderr.read() if proc.poll() is not None and proc.stderr else "")
        yield line.split(": ", 1)[1].strip()
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


async def test_web_view_in_a_headless_browser(system: System, ran: dict[str, str], web: str) -> None:
    from playwright.async_api import async_playwright

    shots = Path(os.environ.get("GPUORCH_SCREENSHOTS") or (system.state_dir / "screenshots"))
    shots.mkdir(parents=True, exist_ok=True)
    s = system.settings
    async with async_playwright() as p, Client(s.nats_url, s.names, creds=s.nats_creds) as c:
        browser = await launch(p)
        try:
            page = await browser.new_page(viewport={"width": 1400, "height": 900})
            # the workloads page lists the submitted workloads
            await page.goto(web)
            for wid in ran.values():
                await page.wait_for_selector(f'#workload-rows tr[data-id="{wid}"]', timeout=15000)
            await page.screenshot(path=str(shots / "web-workloads.png"), full_page=True)

            # a workload page: its timeline and every cluster's verdict
            await page.goto(f"{web}workloads/{ran['lost']}")
            await page.wait_for_selector("#timeline tr.attempt", timeout=15000)
            assert await page.locator("#timeline tr.attempt").count() == 2
            gaps = await page.locator("#timeline .gap").all_inner_texts()
            assert any(g.startswith("admission") for g in gaps) and any(g.startswith("run") for g in gaps), gaps
            verdicts = await page.locator("#verdicts tr[data-cluster]").evaluate_all("rows => rows.map(r => r.dataset.cluster)")
            assert set(verdicts) == {"alpha", "beta"}, verdicts
            await page.screenshot(path=str(shots / "web-workload.png"), full_page=True)

            # an event that arrives after the page loaded appears without a reload
            wid = await c.submit(train("obs-live", steps=20))

            def known() -> bool:  # the web view has seen its first event
                try:
                    with urllib.request.urlopen(f"{web}api/workloads/{wid}", timeout=5) as r:
                        return r.status == 200
                except urllib.error.HTTPError:
                    return False

            await assert_eventually(known, timeout=30)
            await page.goto(f"{web}workloads/{wid}")
            await page.wait_for_selector("#event-rows tr", timeout=15000)
            await page.evaluate("window.__loaded = 'same page'")
            await page.wait_for_selector('#event-rows td.type:text-is("completed")', timeout=60000)
            assert await page.evaluate("window.__loaded") == "same page"  # no reload happened
            await page.wait_for_selector('#status:text-is("completed")', timeout=10000)

            await page.goto(f"{web}clusters")
            await page.wait_for_selector('#clusters tbody tr[data-cluster="alpha"] a[href$="/clusters/alpha"]', timeout=15000)
            await page.screenshot(path=str(shots / "web-clusters.png"), full_page=True)
            await page.goto(f"{web}report")
            await page.wait_for_selector("#report tbody tr", timeout=15000)
            await page.wait_for_function("[...document.images].every(i => i.complete && i.naturalWidth > 0)", timeout=30000)
            await page.screenshot(path=str(shots / "web-report.png"), full_page=True)
        finally:
            await browser.close()
    if os.environ.get("GPUORCH_SCREENSHOTS"):
        assert all((shots / f"web-{n}.png").stat().st_size > 10000 for n in ("workloads", "workload", "clusters", "report"))

