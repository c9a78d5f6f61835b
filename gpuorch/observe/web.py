"""`gpuorch web`: a read-only web view of the fleet, served from the event stream.

Starlette (ASGI) under uvicorn, HTML rendered on the server with Jinja2, live updates by
server-sent events: nothing to build, no JavaScript framework, nothing fetched from elsewhere; a
few lines of inline script open an `EventSource` and refresh the part of the page an event
changed. It listens on loopback unless told otherwise, and has no route that writes anything: it
is a client of the bus like `gpuorch list` (the `client` identity), following `gpuorch.evt.>`
into the same projection.

The workload list is filtered, sorted and paged on the server (`gpuorch.observe.browse`): a page
holds one page of rows whatever the number of workloads. Every path below sits under the base
path (`--base-path`, `GPUORCH_WEB_BASE_PATH`; "" by default), so a reverse proxy can serve it at
`https://ops.example.org/gpuorch/` by passing the path through unchanged.

| path | what |
|---|---|
| `/` | the workloads: filter (`status`, `owner`, `queue`, `cluster`, `pipeline`, `q`), `sort`, `page`, `per` (docs/web.md) |
| `/workloads/{id}` | one workload: timeline with named gaps, every cluster's verdict and estimate terms (as `explain` prints), attempts, events (live) |
| `/pipelines/{id}` | a pipeline: its stages drawn as a graph, each in the colour of its state, linked to its workload (live) |
| `/clusters`, `/clusters/{name}` | the capacity snapshots; one cluster's capacity and queue length over time |
| `/fragment/workloads/{id}/activity` | its attempts' (or its stages') allocated vs productive diagnosis (docs/activity.md): the workload page fetches it after it loads |
| `/report` | the per-destination report, allocated vs active GPU-hours per destination, owner and stage, and the charts (`/report/{chart}.png`); `?cluster=` for one |
| `/metrics` | the allocated vs active figures for Prometheus (`gpuorch.observe.metrics.activity_registry`) |
| `/stream?workload=ID`, `?pipeline=ID` | server-sent events: one `event` per lifecycle event (of that workload, of that pipeline's stages) |
| `/api/workloads` (the list's query), `/api/workloads/{id}`, `/api/clusters/{name}`, `/api/report` | the same as JSON |
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import json
import re
import socket
import time
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, TextIO

import msgspec
from jinja2 import Environment, PackageLoader, select_autoescape
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, RedirectResponse, Response, StreamingResponse
from starlette.routing import BaseRoute, Mount, Route

from gpuorch.config import Settings
from gpuorch.projection import Projection, WorkloadView
from gpuorch_proto import ClusterSnapshot, Event, type_tag
from gpuorch_proto import events as ev
from gpuorch_proto.units import format_duration

from . import browse, capacity, dag
from . import timeline as tl
from .facts import ROUND_WAIT, Board, FactsCache, Round, Sources
from .metrics import activity_registry
from .report import build_report

SNAPSHOT_EVERY = 2.0
METRICS_WAIT = 5.0  # /metrics waits this long for a round (Prometheus' scrape timeout is 10 s by default)
ACTIVITY_STAGES = 100  # a pipeline's page diagnoses its first stages (the report has them all)
GANTT_ROWS = 40  # the report page's gantt: the latest workloads (all of 10,000 is no chart)
STAGES_DRAWN = 400  # a pipeline page draws its first stages (a sweep of 10,000 trials: the list has them all)
_BASE_PATH = re.compile(r"(/[A-Za-z0-9._~-]+)+")


def base_path(text: str | None) -> str:
    """The prefix every path is served under: "" for none ("" or "/"), else `/a/b` (no trailing
    slash). Raises ValueError saying what is wrong with `text`."""
    t = (text or "").strip()
    if t in ("", "/"):
        return ""
    if not t.startswith("/"):
        raise ValueError(f"base path {t!r}: must start with '/' (e.g. /gpuorch)")
    t = t.rstrip("/")
    if not _BASE_PATH.fullmatch(t) or any(seg in (".", "..") for seg in t.split("/")):
        raise ValueError(f"base path {t!r}: segments of letters, digits, '-', '.', '_' or '~' only, each after one '/' (no '.' or '..')")
    return t


@dataclass
class Live:
    """The event log as far as it has arrived, folded and indexed for the list; the clusters'
    latest snapshots and their history; subscribers get every new event."""

    projection: Projection = field(default_factory=Projection)
    events: list[tuple[int, Event]] = field(default_factory=list)
    by_workload: dict[str, list[tuple[int, Event]]] = field(default_factory=dict)
    snapshots: dict[str, ClusterSnapshot] = field(default_factory=dict)
    subscribers: set[asyncio.Queue[tuple[int, Event]]] = field(default_factory=set)
    seen: set[int] = field(default_factory=set)
    index: browse.Index = field(default_factory=browse.Index)
    history: capacity.History = field(default_factory=capacity.History)

    def add(self, seq: int, e: Event) -> None:
        if seq in self.seen:
            return
        self.seen.add(seq)
        self.projection.apply(e, seq)
        if e.workload_id:  # the rows this event changed: its workload's, and the stages a pipeline announced
            for wid in (e.workload_id, *(c.workload_id for c in e.children)) if isinstance(e, ev.PipelineExpanded) else (e.workload_id,):
                v = self.projection.get(wid)
                if v is not None:
                    self.index.update(v)
        self.events.append((seq, e))
        self.by_workload.setdefault(e.workload_id, []).append((seq, e))
        for q in list(self.subscribers):
            with contextlib.suppress(asyncio.QueueFull):
                q.put_nowait((seq, e))

    def snapshot(self, sn: ClusterSnapshot) -> None:
        self.snapshots[sn.cluster] = sn
        self.history.record(sn)

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
    """The workload as the list shows it (a workload with no accepted document has only an id,
    a status and why)."""
    r = browse.row_of(v)
    if r is None:
        return {"id": v.workload_id, "status": v.status, "cluster": None, "attempts": len(v.attempts), "owner": None,
                "reason": v.reason, "pipeline": v.pipeline, "stage": v.stage}  # fmt: skip
    return r.as_dict()


def make_app(settings: Settings, *, time_scale: float = 1.0, live: Live | None = None, follow: bool = True,
             base: str = "") -> Starlette:  # fmt: skip
    """The web app; `base` (checked by `base_path`) prefixes every path it serves and links to."""
    base = base_path(base)
    state = live or Live()
    env = Environment(loader=PackageLoader("gpuorch.observe", "templates"), autoescape=select_autoescape())
    env.filters["dur"] = lambda s: format_duration(s * time_scale) if s is not None else "-"
    env.filters["real"] = format_duration  # real seconds (the capacity charts' span)
    env.filters["clock"] = lambda t: time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t)) if t else "-"
    env.globals.update(base=base, NONE=browse.NONE, colour=dag.colour, dag_node=(dag.NODE_W, dag.NODE_H))
    tasks: list[asyncio.Task[None]] = []
    reports: dict[Any, tuple[dict[str, Any], list[tl.WorkloadTimeline]]] = {}
    boards: list[Board] = []  # made on first use: the metrics sources, the stores, the per-attempt cache

    def board() -> Board:
        if not boards:
            boards.append(Board(FactsCache(Sources.of(settings)), time_scale))
        return boards[0]

    async def activity_round(wait: float = ROUND_WAIT) -> Round | None:
        """The latest round over every attempt (computed again when the log moved or it is old)."""
        return await board().current(lambda: [v for v in state.projection.workloads.values() if v.attempts],
                                     lambda: state.snapshots, len(state.events), wait)  # fmt: skip

    def activity_meta(r: Round | None) -> dict[str, Any]:
        b = board()
        return {"at": r.at if r else None, "seconds": r.seconds if r else None, "attempts": len(r.judged) if r else 0,
                "progress": b.progress, "error": b.error}  # fmt: skip

    def page(name: str, status: int = 200, **ctx: Any) -> HTMLResponse:
        return HTMLResponse(env.get_template(name).render(time_scale=time_scale, **ctx), status_code=status)

    def error(message: str, status: int) -> HTMLResponse:
        return page("error.html", status, title="Error", message=message)

    def listing(request: Request) -> tuple[browse.Query, browse.Page]:
        q = browse.parse_query(request.query_params.multi_items())
        return q, state.index.query(q)

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

    def pipeline(wid: str) -> dict[str, Any] | None:
        v = state.projection.get(wid)
        if v is None or not v.children:
            return None
        drawn = v.children[:STAGES_DRAWN]
        stages, status = [], {}
        for c in drawn:
            stage = state.projection.get(c.workload_id)
            if stage is not None:
                status[c.workload_id] = stage.status
            stages.append({"child": c, "row": workload_row(stage) if stage is not None else None})
        for c in v.children[STAGES_DRAWN:]:
            stage = state.projection.get(c.workload_id)
            if stage is not None:
                status[c.workload_id] = stage.status
        counts = Counter(status.get(c.workload_id, "pending") for c in v.children)
        return {"view": v, "row": workload_row(v), "layout": dag.layout(drawn, status), "stages": stages,
                "counts": dict(sorted(counts.items())), "all": len(v.children)}  # fmt: skip

    def report(cluster: str | None) -> tuple[dict[str, Any], list[tl.WorkloadTimeline]]:
        key = (len(state.events), cluster)  # the same log, the same report
        got = reports.get(key)
        if got is None:
            tls = [state.timeline(v) for v in state.projection.workloads.values()]
            r = build_report(tls, cluster=cluster, time_scale=time_scale)
            if cluster is not None:  # the charts: the workloads that had an attempt there
                tls = [t for t in tls if any(a.cluster == cluster for a in t.attempts)]
            got = (r, tls)
            reports.clear()
            reports[key] = got
        return got

    def cluster_names() -> list[str]:
        return sorted({*state.snapshots, *state.history.samples})

    async def index(request: Request) -> Response:
        try:
            q, pg = listing(request)
        except browse.QueryError as err:
            return error(str(err), 400)
        return page("workloads.html", title="Workloads", query=q, page=pg, facets=state.index.facets())

    async def frag_workloads(request: Request) -> Response:
        try:
            q, pg = listing(request)
        except browse.QueryError as err:
            return HTMLResponse(f"<p class='no'>{err}</p>", status_code=400)
        return page("_workload_list.html", query=q, page=pg)

    async def workload(request: Request) -> Response:
        d = detail(request.path_params["wid"])
        if d is None:
            return error(f"no workload {request.path_params['wid']!r}", 404)
        return page("workload.html", title=d["row"]["id"], **d)

    async def frag_workload(request: Request) -> Response:
        d = detail(request.path_params["wid"])
        if d is None:
            return HTMLResponse("", status_code=404)
        return page("_workload_state.html", **d)

    async def frag_activity(request: Request) -> Response:
        from .activity import account, judge

        v = state.projection.get(request.path_params["wid"])
        if v is None:
            return HTMLResponse("", status_code=404)
        views = [v]
        if v.children:
            views = [w for w in (state.projection.get(c.workload_id) for c in v.children[:ACTIVITY_STAGES]) if w is not None]
        views = [w for w in views if w.attempts]
        facts = await board().cache.facts(views, state.snapshots, time.time())
        return page("_activity.html", view=v, accounts=[account(j) for j in judge(facts, time_scale)],
                    stages=len(v.children), drawn=min(len(v.children), ACTIVITY_STAGES))  # fmt: skip

    async def pipeline_page(request: Request) -> Response:
        wid = request.path_params["wid"]
        d = pipeline(wid)
        if d is None:
            what = "not a pipeline (it has no stages)" if wid in state.projection else "no such workload"
            return error(f"{wid!r}: {what}", 404)
        return page("pipeline.html", title=f"Pipeline {wid}", **d)

    async def frag_pipeline(request: Request) -> Response:
        d = pipeline(request.path_params["wid"])
        if d is None:
            return HTMLResponse("", status_code=404)
        return page("_pipeline_graph.html", **d)

    def sparkline(name: str) -> dict[str, Any]:
        samples = state.history.of(name)
        return {"capacity": capacity.chart(samples, [("free", lambda s: s.gpus_free)], width=160, height=28),
                "queue": capacity.chart(samples, [("pending", lambda s: s.pending_jobs)], width=160, height=28)}  # fmt: skip

    def cluster_row(name: str, sn: ClusterSnapshot, now: float) -> dict[str, Any]:
        return {"cluster": name, "reachable": sn.reachable, "age": f"{sn.age(now):.1f}s", "nodes": len(sn.nodes),
                "gpus_free": sum(n.gpus_free for n in sn.nodes), "gpus": sum(n.gpus_allocatable for n in sn.nodes),
                "models": ", ".join(sorted({f"{n.gpu_product} ({n.gpu_memory_mib // 1024} GiB)" for n in sn.nodes if n.gpu_product})),
                "queues": [(q.name, q.pending_jobs, q.estimated_wait_seconds) for q in sn.queues],
                "stores": ", ".join(sn.registry.artifact_stores), "cached": ", ".join(sn.registry.datasets_cached),
                "error": sn.error, "spark": sparkline(name)}  # fmt: skip

    async def clusters(request: Request) -> Response:
        now = time.time()
        rows = [cluster_row(name, sn, now) for name, sn in sorted(state.snapshots.items())]
        fragment = request.url.path.endswith("/fragment/clusters")
        return page("_clusters.html" if fragment else "clusters.html", rows=rows, title="Clusters")

    async def cluster_page(request: Request) -> Response:
        name = request.path_params["name"]
        sn = state.snapshots.get(name)
        if sn is None:
            return error(f"no cluster {name!r} (known: {', '.join(cluster_names()) or 'none yet'})", 404)
        samples = state.history.of(name)
        fragment = request.url.path.endswith(f"/fragment/clusters/{name}")
        return page("_cluster.html" if fragment else "cluster.html", title=f"Cluster {name}", row=cluster_row(name, sn, time.time()),
                    snapshot=sn, capacity=capacity.capacity_chart(samples), queues=capacity.queue_chart(samples),
                    on_cluster=len(state.index.by["cluster"].get(name, ())))  # fmt: skip

    async def report_page(request: Request) -> Response:
        from .plots import CHARTS

        cluster = request.query_params.get("cluster") or None
        r, _ = report(cluster)
        rd = await activity_round()
        return page("report.html", report=r, charts=CHARTS, title="Report", stamp=len(state.events), cluster=cluster,
                    clusters=cluster_names(), activity=rd.report(cluster) if rd else None, meta=activity_meta(rd),
                    now=time.time())  # fmt: skip

    async def chart(request: Request) -> Response:
        from .plots import ACTIVITY_CHART, CHARTS, render_png

        name = request.path_params["name"]
        cluster = request.query_params.get("cluster") or None
        if name == ACTIVITY_CHART:
            rd = await activity_round()
            if rd is None:
                return Response("the activity figures are being read", status_code=503, headers={"Retry-After": "5"})
            png = await asyncio.to_thread(render_png, name, {"activity": rd.report(cluster)}, [])
            return Response(png, media_type="image/png", headers={"Cache-Control": "no-store"})
        if name not in CHARTS:
            return Response(status_code=404)
        r, tls = report(cluster)
        if name == "gantt":
            tls = heapq.nlargest(GANTT_ROWS, (t for t in tls if t.submitted is not None and t.attempts), key=lambda t: t.submitted or 0.0)
        png = await asyncio.to_thread(render_png, name, r, tls)
        return Response(png, media_type="image/png", headers={"Cache-Control": "no-store"})

    async def stream(request: Request) -> Response:
        wid = request.query_params.get("workload")
        pid = request.query_params.get("pipeline")
        q: asyncio.Queue[tuple[int, Event]] = asyncio.Queue(maxsize=10000)
        state.subscribers.add(q)

        def wanted(e: Event) -> bool:
            if wid and e.workload_id != wid:
                return False
            if pid and e.workload_id != pid:
                v = state.projection.get(e.workload_id)
                return v is not None and v.pipeline == pid
            return True

        async def gen() -> AsyncIterator[str]:
            try:
                yield "retry: 1000\n\n"
                while True:
                    try:
                        seq, e = await asyncio.wait_for(q.get(), timeout=15)
                    except TimeoutError:
                        yield ": keep-alive\n\n"
                        continue
                    if wanted(e):
                        yield f"id: {seq}\nevent: lifecycle\ndata: {json.dumps(event_row(seq, e))}\n\n"
            finally:
                state.subscribers.discard(q)

        return StreamingResponse(gen(), media_type="text/event-stream", headers={"Cache-Control": "no-store"})

    async def api_workloads(request: Request) -> Response:
        try:
            _, pg = listing(request)
        except browse.QueryError as err:
            return JSONResponse({"error": str(err), "parameter": err.param}, status_code=400)
        return JSONResponse({"total": pg.total, "of": pg.of, "page": pg.page, "pages": pg.pages, "per": pg.per,
                             "rows": [r.as_dict() for r in pg.rows]})  # fmt: skip

    async def api_workload(request: Request) -> Response:
        v = state.projection.get(request.path_params["wid"])
        if v is None:
            return JSONResponse({"error": "no such workload"}, status_code=404)
        return JSONResponse({**workload_row(v), "timeline": tl.as_dict(state.timeline(v)),
                             "decision": msgspec.to_builtins(v.decision) if v.decision else None})  # fmt: skip

    async def api_cluster(request: Request) -> Response:
        name = request.path_params["name"]
        if name not in state.snapshots:
            return JSONResponse({"error": f"no cluster {name!r}"}, status_code=404)
        return JSONResponse({"cluster": name, "samples": [msgspec.to_builtins(s) for s in state.history.of(name)]})

    async def api_report(request: Request) -> Response:
        cluster = request.query_params.get("cluster") or None
        rd = await activity_round()
        return JSONResponse({**report(cluster)[0], "activity": rd.report(cluster) if rd else None, "activity_read": activity_meta(rd)})

    async def prometheus_metrics(request: Request) -> Response:
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        await activity_round(METRICS_WAIT)  # a slow round: this scrape gets the previous one
        return Response(generate_latest(exported), media_type=CONTENT_TYPE_LATEST)

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
                        for sn in (await c.snapshots()).values():
                            state.snapshot(sn)
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

    routes: list[BaseRoute] = [
        Route("/", index), Route("/fragment/workloads", frag_workloads),
        Route("/workloads/{wid}", workload), Route("/fragment/workloads/{wid}", frag_workload),
        Route("/pipelines/{wid}", pipeline_page), Route("/fragment/pipelines/{wid}", frag_pipeline),
        Route("/clusters", clusters), Route("/clusters/{name}", cluster_page),
        Route("/fragment/clusters", clusters), Route("/fragment/clusters/{name}", cluster_page),
        Route("/report", report_page), Route("/report/{name}.png", chart),
        Route("/stream", stream), Route("/api/workloads", api_workloads), Route("/api/workloads/{wid}", api_workload),
        Route("/api/clusters/{name}", api_cluster), Route("/api/report", api_report), Route("/healthz", healthz),
        Route("/fragment/workloads/{wid}/activity", frag_activity), Route("/metrics", prometheus_metrics),
    ]  # fmt: skip
    if base:

        async def to_base(request: Request) -> Response:
            return RedirectResponse(f"{base}/", status_code=307)

        routes = [Mount(base, routes=routes), Route("/", to_base)]
    exported = activity_registry(lambda: board().latest if boards else None)
    app = Starlette(routes=routes, lifespan=lifespan)
    app.state.live = state
    app.state.board = board
    return app


def serve(settings: Settings, *, host: str = "127.0.0.1", port: int = 8765, time_scale: float = 1.0, out: TextIO | None = None,
          base: str = "") -> None:  # fmt: skip
    """Run the web view until interrupted; prints its URL once it listens."""
    import uvicorn

    app = make_app(settings, time_scale=time_scale, base=base)
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    url = f"http://{host}:{sock.getsockname()[1]}{base_path(base)}/"
    config = uvicorn.Config(app, log_level="warning", lifespan="on", timeout_graceful_shutdown=1)
    server = uvicorn.Server(config)
    if out is not None:
        print(f"gpuorch web: {url}", file=out, flush=True)
    asyncio.run(server.serve(sockets=[sock]))
