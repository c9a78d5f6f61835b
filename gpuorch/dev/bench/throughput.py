"""End-to-end throughput: workloads submitted over the bus, measured to `attempt-created`.

One ``System`` (nats-server, two local clusters of 50 nodes x 8 GPUs each = 800 GPUs, the four
services as processes with default settings) takes bursts of 1-GPU workloads published over the
bus as fast as one client can (publishes in flight, acks awaited together). A workload is done
for this bench when its `attempt-created` is in the log: the destination's API accepted its Job.
Its pods then run `sleep`, so the clusters fill and later bursts queue at their destinations.

Figures (from each event's `at`, the emitting service's clock, and the client's own clock at
publish; all on one machine):

* sustained rate of a burst: workloads / (last `attempt-created` - first publish);
* latency submit -> `attempt-created` p50 / p99, and per stage: submit -> `submitted` (router
  accepted), -> `routed`, -> `attempt-created` (dispatcher: Job created);
* raw JetStream publish rate in the same run (same client, same server, a scratch stream, the
  same number of messages in flight), printed beside the end-to-end rate as a ratio.

``python -m gpuorch.dev.bench.throughput [--quick] [--burst N ...]`` runs it alone; docs/performance.md.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import yaml

from gpuorch.client import Client
from gpuorch.dev.bench.routing import Row
from gpuorch.system import System
from gpuorch_proto import Workload, workload_from_obj
from gpuorch_proto import events as ev

IN_FLIGHT = 256  # publishes in flight from the one client
CLUSTER = {
    "nodes": [{"name": "gpu", "count": 50, "pool": "train", "cpu": "256", "memory": "2048Gi",
               "gpu": {"model": "NVIDIA-A100-SXM4-80GB", "memory_mib": 81920, "count": 8}}],
    "registry": {"price_per_gpu_hour": 2.0, "artifact_stores": ["prod"], "queues": [{"name": "default", "owners": ["*"]}]},
}
DIGEST = "example.org/bench/sleep@sha256:" + "be" * 32


def clusters_file(path: Path) -> Path:
    cfg = {"time_scale": 600, "job_clock": "simulated",
           "clusters": [{"name": "east", **CLUSTER}, {"name": "west", **CLUSTER}]}
    path.write_text(yaml.safe_dump(cfg))
    return path


def workload(i: int) -> Workload:
    return workload_from_obj({
        "metadata": {"name": f"b{i}", "owner": "bench"},
        "spec": {"image": DIGEST, "command": ["sleep"], "args": ["3600"],
                 "resources": {"gpus": 1, "cpu": "100m", "memory": "64Mi"},
                 "expected_runtime": "10h", "output": {"store": "prod"}},
    })


def _pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    return s[min(len(s) - 1, max(0, round(q * (len(s) - 1))))]


async def _gather_bounded(coros: list[Any], limit: int) -> list[Any]:
    out: list[Any] = []
    for i in range(0, len(coros), limit):
        out += await asyncio.gather(*coros[i : i + limit])
    return out


async def raw_rate(client: Client, n: int) -> float:
    """JetStream publishes/s from this client to a scratch stream (acks awaited, `IN_FLIGHT` at a time)."""
    name = f"BENCH_RAW_{uuid.uuid4().hex[:8]}"
    subject = f"benchraw.{name.lower()}"
    await client.js.add_stream(name=name, subjects=[subject])
    try:
        body = b"x" * 600  # about a submit's size
        t0 = time.perf_counter()
        await _gather_bounded([client.js.publish(subject, body) for _ in range(n)], IN_FLIGHT)
        return n / (time.perf_counter() - t0)
    finally:
        await client.js.delete_stream(name)


async def burst(client: Client, n: int, tag: str, timeout: float) -> dict[str, float]:
    """Submit `n` workloads; wait for every `attempt-created`; the figures of this burst."""
    sent: dict[str, float] = {}

    async def one(i: int) -> None:
        wl = workload(i)
        t = time.time()
        wid = await client.submit(wl, idempotency_key=f"{tag}-{i}")
        sent[wid] = t

    t_first = time.time()
    await _gather_bounded([one(i) for i in range(n)], IN_FLIGHT)
    t_published = time.time()
    stages: dict[str, dict[str, float]] = {}
    deadline = time.monotonic() + timeout
    while True:
        stages = {}
        for _, e in await client.events():
            if e.workload_id in sent and isinstance(e, ev.Submitted | ev.Routed | ev.AttemptCreated):
                stages.setdefault(e.workload_id, {}).setdefault(ev.type_tag(e), e.at)
        done = sum(1 for s in stages.values() if "attempt-created" in s)
        if done >= n or time.monotonic() > deadline:
            break
        await asyncio.sleep(0.5)  # a bench polling the log, not a test waiting for a condition
    created = [s["attempt-created"] for s in stages.values() if "attempt-created" in s]
    lat = [stages[w]["attempt-created"] - t for w, t in sent.items() if "attempt-created" in stages.get(w, {})]
    to_sub = [stages[w]["submitted"] - t for w, t in sent.items() if "submitted" in stages.get(w, {})]
    to_routed = [stages[w]["routed"] - t for w, t in sent.items() if "routed" in stages.get(w, {})]
    return {
        "workloads": float(n),
        "created": float(len(created)),
        "publish_s": t_published - t_first,
        "rate": len(created) / max(1e-9, (max(created) if created else t_first) - t_first),
        "p50": _pct(lat, 0.5),
        "p99": _pct(lat, 0.99),
        "submitted_p50": _pct(to_sub, 0.5),
        "routed_p50": _pct(to_routed, 0.5),
        "created_p50": _pct(lat, 0.5),
    }


async def _run(bursts: list[int], timeout: float) -> list[Row]:
    rows: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="gpuorch-bench-tp-") as tmp:
        root = Path(tmp)
        system = System(state_dir=root / "state", clusters_file=clusters_file(root / "clusters.yaml"))
        system.start()
        try:
            s = system.settings
            async with Client(s.nats_url, s.names, creds=s.nats_creds) as client:
                for n in bursts:
                    raw = await raw_rate(client, n)
                    f = await burst(client, n, f"t{uuid.uuid4().hex[:6]}", timeout)
                    case = f"burst {n}"
                    rows += [
                        Row("throughput", case, "submit -> Job created", f["rate"], "workloads/s"),
                        Row("throughput", case, "raw JetStream publish", raw, "msgs/s"),
                        Row("throughput", case, "ratio to raw", f["rate"] / raw, "x"),
                        Row("throughput", case, "created", f["created"], f"of {n}"),
                        Row("throughput", case, "latency p50", f["p50"], "s"),
                        Row("throughput", case, "latency p99", f["p99"], "s"),
                        Row("throughput", case, "stage p50 -> submitted", f["submitted_p50"], "s"),
                        Row("throughput", case, "stage p50 -> routed", f["routed_p50"], "s"),
                        Row("throughput", case, "stage p50 -> attempt-created", f["created_p50"], "s"),
                    ]
                    print(f"# burst {n}: {f}", file=sys.stderr)
        finally:
            system.stop()
    return rows


def run(quick: bool = False, bursts: list[int] | None = None, timeout: float = 600.0) -> list[Row]:
    return asyncio.run(_run(bursts or ([200] if quick else [300, 1000]), timeout))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m gpuorch.dev.bench.throughput", description=__doc__)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--burst", type=int, action="append", default=[], help="burst size (repeatable)")
    ap.add_argument("--timeout", type=float, default=600.0)
    args = ap.parse_args(argv)
    for r in run(args.quick, args.burst or None, args.timeout):
        print(f"{r.case:12} {r.metric:30} {r.value:12.3f} {r.unit}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
