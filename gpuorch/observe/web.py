"""`gpuorch web`: a read-only web view of the fleet, served from the event stream.

Starlette (ASGI) under uvicorn, HTML rendered on the server with Jinja2, live updates by
server-sent events: nothing to build, no JavaScript framework; a few lines of inline script
open an `EventSource` and refresh the part of the page an event changed. It listens on loopback
unless told otherwise, and has no route that writes anything: it is a client of the bus like
`gpuorch list` (the `client` identity), following `gpuorch.evt.>` into the same projection.

| path | what |
|---|---|
| `/` | the workloads: state, where they run, attempts, why |
| `/workloads/{id}` | one workload: timeline with named gaps, every cluster's verdict and estimate terms (as `explain` prints), attempts, events (live) |
| `/clusters` | the capacity snapshots |
| `/report` | the per-destination report and its charts (`/report/{chart}.png`) |
| `/stream?workload=ID` | server-sent events: one `event` per lifecycle event (of that workload) |
| `/api/workloads`, `/api/workloads/{id}`, `/api/report` | the same as JSON |
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, TextIO

import msgspec
from jinja2 import Environment, PackageLoader, select_autoescape
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from gpuorch.config import Settings
from gpuorch.projection import Projection, WorkloadView
from gpuorch_proto import ClusterSnapshot, Event, type_tag
from gpuorch_proto.units import format_duration

from . import timeline as tl
from .report import build_report

SNAPSHOT_EVERY = 2.0


@dataclass
class Live:
    """The event log as far as it has arrived, folded; subscribers get every new event."""

    projection: Projection = field(default_factory=Projection)
    events: list[tuple[int, Event]] = field(default_factory=list)
    by_workload: dict[str, list[tuple[int, Event]]] = field(default_factory=dict)
    snapshots: dict[str, ClusterSnapshot] = field(default_factory=dict)
    subscribers: set[asyncio.Queue[tuple[int, Event]]] = field(default_factory=set)
    seen: set[int] = field(default_factory=set)

    def add(self, seq: int, e: Event) -> None:
        if seq in self.seen:
            return
        self.seen.add(seq)
        self.projection.apply(e, seq)
        self.events.append((seq, e))
        self.by_workload.setdefault(e.workload_id, []).append((seq, e))
        for q in list(self.subscribers):
            with contextlib.suppress(asyncio.QueueFull):
                q.put_nowait((seq, e))

    def timeline(self, v: WorkloadView) -> tl.WorkloadTimeline:
        return tl.workload_timeline(v, [e for _, e in self.by_workload.get(v.workload_id, [])], now=time.time())


def event_row(seq: int, e: Event) -> dict[str, Any]:
    body = {k: v for k, v in msgspec.to_builtins(e).items()
            if k not in ("schema_version", "event_id", "workload_id", "at", "type", "workload", "decision")}  # fmt: skip
    if getattr(e, "decision", None) is not None:
        body["summary"] = e.decision.summary  # type: ignore[union-attr]
    return {"seq": seq, "at": time.strftime("%H:%M:%S", time.localtime(e.at)) if e.at else "", "type": type_tag(e),
            "workload_id": e.workload_id, "detail": json.dumps(body)[:300]}  # fmt: skip


def workload_row(v: WorkloadView) -> dict[str, Any]:
    a = v.latest_attempt
    return {"id": v.workload_id, "status": v.status, "cluster": a.cluster if a else (v.decision.cluster if v.decision else None),
            "attempts": len(v.attempts), "owner": v.workload.metadata.owner if v.workload else None, "reason": v.reason}  # fmt: skip


def make_app(settings: Settings, *, time_scale: float = 1.0, live: Live | None = None, follow: bool = True) -> Starlette:
    state = live or Live()
    env = Environment(loader=PackageLoader("gpuorch.observe", "templates"), autoescape=select_autoescape())
    env.filters["dur"] = lambda s: format_duration(s * time_scale) if s is not None else "-"
    tasks: list[asyncio.Task[None]] = []

    def page(name: str, **ctx: Any) -> HTMLResponse:
        return HTMLResponse(env.get_template(name).render(time_scale=time_scale, **ctx))

    def workloads() -> list[dict[str, Any]]:
        views = [v for v in state.projection.workloads.values() if v.workload is not None]
        views.sort(key=lambda v: v.times.get("submitted", 0.0), reverse=True)
        return [workload_row(v) for v in views]

    def detail(wid: str) -> dict[str, Any] | None:
        from gpuorch_router.explain import render_explain

        v = state.projection.get(wid)
        if v is None:
            return None
        t = state.timeline(v)
        t0 = t.submitted or min((a.marks.get("ready", 0.0) for a in t.attempts), default=0.0)
        end = max([t0, *(g.end for a in t.attempts for g in a.gaps)])
        width = max(end - t0, 1e-9)
        bars = [{"attempt": a, "gaps": [{"name": g.name, "left": 100 * (g.start - t0) / width, "width": max(100 * g.seconds / width, 0.3),
                                          "seconds": g.seconds} for g in a.gaps]} for a in t.attempts]  # fmt: skip
        return {
            "view": v, "row": workload_row(v), "timeline": t, "bars": bars, "t0": t0, "marks": tl.MARKS,
            "explain": render_explain(v.decision) if v.decision else None, "decision": v.decision,
            "events": [event_row(s, e) for s, e in state.by_workload.get(wid, [])],
        }

    def report() -> tuple[dict[str, Any], list[tl.WorkloadTimeline]]:
        tls = [state.timeline(v) for v in state.projection.workloads.values()]
        return build_report(tls, time_scale=time_scale), tls

    async def index(request: Request) -> Response:
        return page("workloads.html", rows=workloads(), title="Workloads")

    async def frag_workloads(request: Request) -> Response:
        return page("_workload_rows.html", rows=workloads())

    async def workload(request: Request) -> Response:
        d = detail(request.path_params["wid"])
        if d is None:
            return HTMLResponse(f"no workload {request.path_params['wid']!r}", status_code=404)
        return page("workload.html", title=d["row"]["id"], **d)

    async def frag_workload(request: Request) -> Response:
        d = detail(request.path_params["wid"])
        if d is None:
            return HTMLResponse("", status_code=404)
        return page("_workload_state.html", **d)

    async def clusters(request: Request) -> Response:
        now = time.time()
        rows = []
        for name, sn in sorted(state.snapshots.items()):
            rows.append({"cluster": name, "reachable": sn.reachable, "age": f"{sn.age(now):.1f}s", "nodes": len(sn.nodes),
                         "gpus_free": sum(n.gpus_free for n in sn.nodes), "gpus": sum(n.gpus_allocatable for n in sn.nodes),
                         "models": ", ".join(sorted({f"{n.gpu_product} ({n.gpu_memory_mib // 1024} GiB)" for n in sn.nodes if n.gpu_product})),
                         "queues": [(q.name, q.pending_jobs, q.estimated_wait_seconds) for q in sn.queues],
                         "stores": ", ".join(sn.registry.artifact_stores), "cached": ", ".join(sn.registry.datasets_cached)})  # fmt: skip
        return page("clusters.html", rows=rows, title="Clusters")

    async def report_page(request: Request) -> Response:
        r, _ = report()
        from .plots import CHARTS

        return page("report.html", report=r, charts=CHARTS, title="Report", stamp=len(state.events))

    async def chart(request: Request) -> Response:
        from .plots import CHARTS, render_png

        name = request.path_params["name"]
        if name not in CHARTS:
            return Response(status_code=404)
        r, tls = report()
        png = await asyncio.to_thread(render_png, name, r, tls)
        return Response(png, media_type="image/png", headers={"Cache-Control": "no-store"})

    async def stream(request: Request) -> Response:
        wid = request.query_params.get("workload")
        q: asyncio.Queue[tuple[int, Event]] = asyncio.Queue(maxsize=10000)
        state.subscribers.add(q)

        async def gen() -> AsyncIterator[str]:
            try:
                yield "retry: 1000\n\n"
                while True:
                    try:
                        seq, e = await asyncio.wait_for(q.get(), timeout=15)
                    except TimeoutError:
                        yield ": keep-alive\n\n"
                        continue
                    if wid and e.workload_id != wid:
                        continue
                    yield f"id: {seq}\nevent: lifecycle\ndata: {json.dumps(event_row(seq, e))}\n\n"
            finally:
                state.subscribers.discard(q)

        return StreamingResponse(gen(), media_type="text/event-stream", headers={"Cache-Control": "no-store"})

    async def api_workloads(request: Request) -> Response:
        return JSONResponse(workloads())

    async def api_workload(request: Request) -> Response:
        v = state.projection.get(request.path_params["wid"])
        if v is None:
            return JSONResponse({"error": "no such workload"}, status_code=404)
        return JSONResponse({**workload_row(v), "timeline": tl.as_dict(state.timeline(v)),
                             "decision": msgspec.to_builtins(v.decision) if v.decision else None})  # fmt: skip

    async def api_report(request: Request) -> Response:
        return JSONResponse(report()[0])

    async def healthz(request: Request) -> Response:
        return JSONResponse({"events": len(state.events), "workloads": len(state.projection.workloads)})

    async def follow_events() -> None:
        from gpuorch.client import Client

        while True:
            try:
                async with Client(settings.nats_url, settings.names, creds=settings.nats_creds) as c:
                    async for seq, e in c.follow():
                        state.add(seq, e)
            except asyncio.CancelledError:
                raise
            except Exception:
                await asyncio.sleep(1.0)

    async def follow_snapshots() -> None:
        from gpuorch.client import Client

        while True:
            try:
                async with Client(settings.nats_url, settings.names, creds=settings.nats_creds) as c:
                    while True:
                        state.snapshots.update(await c.snapshots())
                        await asyncio.sleep(SNAPSHOT_EVERY)
            except asyncio.CancelledError:
                raise
            except Exception:
                await asyncio.sleep(1.0)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        if follow:
            tasks.extend([asyncio.create_task(follow_events()), asyncio.create_task(follow_snapshots())])
        try:
            yield
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    app = Starlette(routes=[
        Route("/", index), Route("/fragment/workloads", frag_workloads),
        Route("/workloads/{wid}", workload), Route("/fragment/workloads/{wid}", frag_workload),
        Route("/clusters", clusters), Route("/report", report_page), Route("/report/{name}.png", chart),
        Route("/stream", stream), Route("/api/workloads", api_workloads), Route("/api/workloads/{wid}", api_workload),
        Route("/api/report", api_report), Route("/healthz", healthz),
    ], lifespan=lifespan)  # fmt: skip
    app.state.live = state
    return app


def serve(settings: Settings, *, host: str = "127.0.0.1", port: int = 8765, time_scale: float = 1.0, out: TextIO | None = None) -> None:
    """Run the web view until interrupted; prints its URL once it listens."""
    import uvicorn

    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    url = f"http://{host}:{sock.getsockname()[1]}/"
    config = uvicorn.Config(make_app(settings, time_scale=time_scale), log_level="warning", lifespan="on", timeout_graceful_shutdown=1)
    server = uvicorn.Server(config)
    if out is not None:
        print(f"gpuorch web: {url}", file=out, flush=True)
    asyncio.run(server.serve(sockets=[sock]))
