"""`make demo`: the seed's scenario, end to end, on the embedded system.

Three clusters (deploy/local/clusters.yaml): `primary` holds imagenet@v3 behind a
long queue, `spare` has idle 40 GB GPUs but a slow link, `short` takes short
experiments but cannot reach the `prod` artifact store. The demo submits the
seed's workloads (examples/seed/) and two that must be refused (examples/bad/),
waits for every one to end, prints where each ran and why, its attempts, outcome,
promoted output and the time of each phase, then stops everything it started.
"""

from __future__ import annotations

import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path

import yaml

from gpuorch.client import Client
from gpuorch.config import load_registry
from gpuorch.projection import WorkloadView
from gpuorch.system import System
from gpuorch_proto import ContractError, load_workload_yaml
from gpuorch_proto.events import message_ref
from gpuorch_proto.units import format_duration

ROOT = Path(__file__).resolve().parents[1]
SEED = ROOT / "examples" / "seed"
BAD = ROOT / "examples" / "bad"


def phases(v: WorkloadView, scale: float) -> str:
    """Phase durations of the promoted (or last) attempt, in simulated time."""
    a = next((x for x in v.attempts.values() if x.promoted), v.latest_attempt)
    if a is None:
        return "-"
    t = a.times
    sub = v.times.get("submitted")
    parts = []

    def span(name: str, start: float | None, end: float | None) -> None:
        if start is not None and end is not None and end >= start:
            parts.append(f"{name} {format_duration((end - start) * scale)}")

    span("route", sub, v.times.get("routed"))
    span("queue+stage", t.get("created"), t.get("running"))
    span("run", t.get("running"), t.get("finished"))
    span("promote", t.get("finished"), t.get("promoted"))
    span("total", sub, v.times.get("completed") or v.times.get("rejected"))
    return ", ".join(parts) or "-"


def outcome_table(views: list[tuple[str, WorkloadView]], scale: float) -> str:
    rows = []
    whys = []
    for label, v in views:
        a = v.latest_attempt
        cluster = (a.cluster if a else (v.decision.cluster if v.decision else None)) or "-"
        rows.append([label, cluster, str(len(v.attempts)), v.status, v.result_path or "-", phases(v, scale)])
        whys.append(f"  {label} -> {cluster}: {v.decision.summary if v.decision and v.status != 'rejected' else v.reason}")
    head = ["WORKLOAD", "CLUSTER", "ATTEMPTS", "OUTCOME", "PROMOTED OUTPUT", "PHASES (simulated time)"]
    widths = [max([len(h), *(len(r[i]) for r in rows)]) for i, h in enumerate(head)]
    lines = ["  ".join(h.ljust(widths[i]) for i, h in enumerate(head))]
    for r in rows:
        lines.append("  ".join(c.ljust(widths[i]) for i, c in enumerate(r)))
    return "\n".join([*lines, "", "Why each went where it went (or did not go at all):", *whys])


async def scenario(system: System, files: list[Path]) -> list[tuple[str, WorkloadView]]:
    s = system.settings
    out: list[tuple[str, WorkloadView]] = []
    async with Client(s.nats_url, s.names, creds=s.nats_creds) as c:
        ids: list[tuple[str, str]] = []
        for f in files:
            key = f"demo-{f.stem}-{time.time_ns()}"
            try:
                wl = load_workload_yaml(f.read_text())
            except ContractError as exc:
                # `gpuorch submit` refuses it before it reaches the bus; another system might not:
                # publish it raw and let the router answer with a `rejected` event
                print(f"  {f.relative_to(ROOT)}: refused by the CLI ({exc.errors[0].path}); publishing it raw to the bus")
                doc = yaml.safe_load(f.read_text())
                ack = await c.js.publish(s.names.cmd_submit, json.dumps({"type": "submit", "workload": doc}).encode(), headers={"Nats-Msg-Id": key})
                ids.append((f.stem, message_ref(ack.stream, ack.seq)))  # its rejection is the message's record
                continue
            for inp in wl.spec.inputs:  # the embedded data locations hold a small synthetic copy
                for loc in inp.locations:
                    system.ensure_dataset(loc, inp.ref)
            wid = await c.submit(wl, idempotency_key=key)
            print(f"  submitted {f.relative_to(ROOT)} as {wid}")
            ids.append((f.stem, wid))
        for label, wid in ids:
            out.append((label, await c.wait(wid, timeout=600)))
    return out


def run_demo(clusters: Path, keep: bool = False) -> int:
    scale = load_registry(clusters).time_scale
    state = Path(tempfile.mkdtemp(prefix="gpuorch-demo-"))
    print(f"gpuorch demo: state in {state}; time scale {scale:g} (1 real second = {format_duration(scale)} simulated)")
    system = System(state_dir=state, clusters_file=clusters)
    t0 = time.monotonic()
    try:
        system.start()
        print(f"  up in {time.monotonic() - t0:.1f}s: NATS {system.nats_url}, 3 local clusters, 4 services")
        files = sorted(SEED.glob("*.yaml")) + sorted(BAD.glob("*.yaml"))
        views = asyncio.run(scenario(system, files))
        print()
        print(outcome_table(views, scale))
        print()
        print(f"demo finished in {time.monotonic() - t0:.1f}s real")
        ok = all(v.terminal for _, v in views)
        return 0 if ok else 1
    finally:
        if not keep:
            system.stop()
            print("stopped every process the demo started")


if __name__ == "__main__":
    sys.exit(run_demo(ROOT / "deploy" / "local" / "clusters.yaml"))
