"""`gpuorch report` and `gpuorch web`: their arguments and what they run (the CLI delegates here)."""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import Any

from gpuorch.config import Settings, load_registry


def parse_since(text: str | None, now: float) -> float | None:
    """`--since`: a duration back from now (`90m`, `2h`, `1d`, `30s`) or an ISO time."""
    if not text:
        return None
    m = re.fullmatch(r"(\d+(?:\.\d+)?)([smhd])", text.strip())
    if m:
        return now - float(m.group(1)) * {"s": 1, "m": 60, "h": 3600, "d": 86400}[m.group(2)]
    try:
        return datetime.fromisoformat(text).timestamp()
    except ValueError:
        raise argparse.ArgumentTypeError(f"--since {text!r}: give a duration (90m, 2h, 1d) or an ISO time") from None


def time_scale(s: Settings) -> float:
    try:
        return load_registry(s.registry).time_scale if s.registry else 1.0
    except Exception:
        return 1.0


def add_report_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--since", default=None, help="only workloads submitted since: 90m, 2h, 1d or an ISO time")
    p.add_argument("--cluster", default=None, help="only this destination")
    p.add_argument("--plot", type=Path, default=None, metavar="DIR", help="write PNG charts into DIR")


def add_web_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default: loopback only)")
    p.add_argument("--port", type=int, default=8765, help="0 = any free port (printed)")
    p.add_argument("--base-path", default=None, metavar="PATH",
                   help="serve every page, link and asset under PATH (e.g. /gpuorch) for a reverse proxy that passes "
                        "the path through; default: GPUORCH_WEB_BASE_PATH, else none")  # fmt: skip


async def activity_facts(s: Settings, views: list[Any], snapshots: dict[str, Any]) -> list[Any]:
    """Every attempt's facts for the activity diagnosis (`gpuorch.observe.facts.Sources`), read
    from the registry's metrics sources, the stores and `snapshots`; what cannot be read is
    "unknown" with its reason, never an error here."""
    from .facts import Sources

    return await Sources.of(s).facts(views, snapshots, time.time())


async def explain_activity(s: Settings, c: Any, v: Any) -> tuple[list[str], list[dict[str, Any]]]:
    """`gpuorch explain`'s activity part: lines, and the JSON (`-o json`'s `activity`): the
    workload's attempts, or each stage's of a pipeline."""
    from .activity import account, judge, render

    views = [v]
    if v.children:  # every stage's view from one read of the pipeline's events
        from gpuorch.projection import Projection

        family = Projection.of(await c.pipeline_events(v.workload_id))
        views = [w for w in (family.get(ch.workload_id) for ch in v.children) if w is not None]
    facts = await activity_facts(s, [w for w in views if w.attempts], await c.snapshots())
    k = time_scale(s)
    keys = ("workload_id", "attempt_id", "cluster", "stage", "work", "diagnosis")
    doc = [{key: acc[key] for key in keys} for acc in map(account, judge(facts, k))]
    return (render(facts, k) if facts else []), doc


async def run_report(ns: argparse.Namespace, s: Settings) -> int:
    from gpuorch.client import Client
    from gpuorch.projection import Projection

    from .activity import render_report
    from .activity import report as activity_report
    from .report import build_report, render
    from .timeline import timelines

    async with Client(s.nats_url, s.names, creds=s.nats_creds) as c:
        events = await c.events()
        snapshots = await c.snapshots()
    since = parse_since(ns.since, time.time())
    tls = list(timelines(events).values())
    report = build_report(tls, since=since, cluster=ns.cluster, time_scale=time_scale(s))
    views = [v for v in Projection.of(events).workloads.values()
             if v.attempts and (since is None or v.times.get("submitted", 0.0) >= since)]  # fmt: skip
    facts = [f for f in await activity_facts(s, views, snapshots) if ns.cluster is None or f.cluster == ns.cluster]
    report["activity"] = activity_report(facts, time_scale(s))
    if ns.plot is not None:
        from .plots import render_all

        report["charts"] = [str(p) for p in render_all(report, tls, ns.plot)]
    if ns.output == "json":
        print(json.dumps(report, indent=2))
    else:
        print(render(report))
        print("\n".join(["", "allocated vs active (docs/activity.md):", *render_report(report["activity"])]))
        for p in report.get("charts", []):
            print(f"chart: {p}")
    return 0


def timeline_of(view: Any, events: list[tuple[int, Any]]) -> Any:
    from .timeline import workload_timeline

    return workload_timeline(view, [e for _, e in events], now=time.time())


def run_web(ns: argparse.Namespace, s: Settings) -> int:
    from gpuorch.config import SettingError, Tuning

    from .web import base_path, serve

    try:
        base = base_path(ns.base_path if ns.base_path is not None else Tuning.from_env().web_base_path)
    except SettingError as err:
        print(f"gpuorch web: {err}", file=sys.stderr)
        return 2
    except ValueError as err:
        what = "--base-path" if ns.base_path is not None else "GPUORCH_WEB_BASE_PATH"
        print(f"gpuorch web: {what}: {err}", file=sys.stderr)
        return 2
    serve(s, host=ns.host, port=ns.port, time_scale=time_scale(s), out=sys.stdout, base=base)
    return 0
