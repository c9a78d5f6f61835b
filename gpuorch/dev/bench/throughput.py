"""End-to-end throughput: workloads submitted over the bus, measured to `attempt-created`.

One ``System`` per scenario (nats-server, two local clusters of 50 nodes x 8 GPUs each = 800
GPUs, the four services as processes with default settings). 1-GPU workloads are published over
the bus by one client (up to ``IN_FLIGHT`` publishes in flight, acks awaited together). A workload
is done for this bench when its `attempt-created` is in the log: the destination's API accepted
its Job. Its pods run `sleep` for longer than the bench, so once the 800 GPUs are taken every
further Job waits at its destination (pending pods), as real bursts do.

Scenarios (issue 12, item 1; sizes are parameters, the defaults are the issue's):

* ``burst N`` (default 10,000): N at once into an empty system; sustained rate =
  N / (last `attempt-created` - first publish); latency p50/p99; per stage p50/p99 (submit ->
  `submitted`: the router accepted it, -> `routed`, -> `attempt-created`: the dispatcher created
  the Job); the router's own rate (N / (last `routed` - first publish)); memory per pending
  workload per service (RSS growth of each process / workloads pending at the destinations).
* ``backlog``: one system filled to 1k, 3k and 10k pending (``--levels``), a probe burst of
  ``--probe`` (1,000) at each level, once the processes are idle after the fill (`settle`, at
  most 20 s: a state snapshot deferred during the fill is written in that lull, not in the
  probe); the probe's rate at 10k over its rate at 1k (target: within 20 %).
* ``steady R/s x D s`` (default 250/s for 60 s): submits paced at R per second; latency p50/p99
  (target p99 < 250 ms) and whether the system kept up; each process's CPU per workload and its
  share of one core over the run (which process, if any, is the bound).
* every scenario measures the raw JetStream publish rate first (same client, same server, a
  scratch stream, same publishes in flight) and prints each rate with its ratio to it.

Events are followed with one ordered consumer on `evt.>` (only `submitted`, `routed` and
`attempt-created` are decoded, and only their `workload_id` and `at`). Times are each event's
`at` (the emitting service's clock) and the client's clock at publish; all on one machine.

``--profile DIR`` runs the services with ``GPUORCH_PROFILE=DIR`` (cProfile of each service's
event loop, written at its clean stop) and prints the top of the slowest stage's service.

``python -m gpuorch.dev.bench.throughput [--quick] [--burst N ...] [--backlog] [--steady R D]``;
docs/performance.md holds the results.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import io
import os
import pstats
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
import yaml
from nats.js.api import DeliverPolicy

from gpuorch.client import Client
from gpuorch.dev.bench.rows import Row
from gpuorch.runtime import bus
from gpuorch.system import System
from gpuorch_proto import Workload, workload_from_obj

IN_FLIGHT = 256  # publishes in flight from the one client
CLUSTER = {
    "nodes": [
        {
            "name": "gpu",
            "count": 50,
            "pool": "train",
            "cpu": "256",
            "memory": "2048Gi",
            "gpu": {"model": "NVIDIA-A100-SXM4-80GB", "memory_mib": 81920, "count": 8},
        }
    ],
    "registry": {
        "price_per_gpu_hour": 2.0,
        "artifact_stores": ["prod"],
        "queues": [{"name": "default", "owners": ["*"]}],
    },
}
DIGEST = "example.org/bench/sleep@sha256:" + "be" * 32
STAGES = ("submitted", "routed", "attempt-created")
SERVICES = ("router", "dispatcher", "fencer", "inventory", "localkube")


NODES = 50  # per cluster, 8 GPUs each (`--nodes`)


def gpus(nodes: int) -> int:
    return 2 * nodes * 8


def clusters_file(path: Path, nodes: int = NODES) -> Path:
    one = {**CLUSTER, "nodes": [{**CLUSTER["nodes"][0], "count": nodes}]}  # type: ignore[index]
    cfg = {
        "time_scale": 600,
        "job_clock": "simulated",
        "clusters": [{"name": "east", **one}, {"name": "west", **one}],
    }
    path.write_text(yaml.safe_dump(cfg))
    return path


def workload(i: int) -> Workload:
    return workload_from_obj(
        {
            "metadata": {"name": f"b{i}", "owner": "bench"},
            "spec": {
                "image": DIGEST,
                "command": ["sleep"],
                "args": ["100000000"],  # outlives the bench
                "resources": {"gpus": 1, "cpu": "100m", "memory": "64Mi"},
                "expected_runtime": "10h",
                "output": {"store": "prod"},
            },
        }
    )


def _pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    return s[min(len(s) - 1, max(0, round(q * (len(s) - 1))))]


def rss(pid: int) -> int:
    """Resident bytes of one process (Linux /proc; 0 if it is gone)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def cpu_seconds(pid: int) -> float:
    """CPU (user + system) of one process and its direct children, in seconds (Linux /proc; 0 if
    gone). `nats` is a wrapper whose child is the nats-server."""
    tick = os.sysconf("SC_CLK_TCK")

    def own(stat: str) -> tuple[int, float]:
        rest = stat.rpartition(")")[2].split()  # after "pid (comm)": state ppid ... utime stime
        return int(rest[1]), (int(rest[11]) + int(rest[12])) / tick

    total = 0.0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid, used = own((entry / "stat").read_text())
        except (OSError, IndexError, ValueError):
            continue
        if int(entry.name) == pid or ppid == pid:
            total += used
    return total


class _At(msgspec.Struct):
    workload_id: str
    at: float


@dataclass
class Watch:
    """`at` of each workload's `submitted`, `routed`, `attempt-created`, from an ordered consumer."""

    stages: dict[str, dict[str, float]] = field(default_factory=dict)
    created: int = 0
    kinds: dict[str, int] = field(default_factory=dict)  # events seen, by type (what every follower reads)
    sub: Any = None
    admin: Any = None  # the admin's JetStream context (the raw rate's scratch stream)
    _decode: Callable[[bytes], _At] = msgspec.json.Decoder(_At).decode

    async def start(self, nc: Any, system: System) -> None:
        js = nc.jetstream()
        self.sub = await js.subscribe(system.settings.names.evt_all, cb=self.on_msg, ordered_consumer=True,
                                      deliver_policy=DeliverPolicy.NEW)  # fmt: skip

    async def on_msg(self, msg: Any) -> None:
        kind = msg.subject.rsplit(".", 1)[-1]
        self.kinds[kind] = self.kinds.get(kind, 0) + 1
        if kind not in STAGES:
            return
        e = self._decode(msg.data)
        s = self.stages.setdefault(e.workload_id, {})
        if kind not in s:
            s[kind] = e.at
            if kind == "attempt-created":
                self.created += 1

    async def until(self, wids: dict[str, float], timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if all("attempt-created" in self.stages.get(w, {}) for w in wids):
                return
            await asyncio.sleep(0.25)  # a bench following the log, not a test waiting for a condition


async def _gather_bounded(coros: list[Awaitable[Any]], limit: int) -> list[Any]:
    sem = asyncio.Semaphore(limit)

    async def one(c: Awaitable[Any]) -> Any:
        async with sem:
            return await c

    return await asyncio.gather(*(one(c) for c in coros))


async def raw_rate(js: Any, n: int) -> float:
    """JetStream publishes/s to a scratch stream (acks awaited, `IN_FLIGHT` at a time), from the
    admin's connection (only the admin may create a stream), same server, same process."""
    name = f"BENCH_RAW_{uuid.uuid4().hex[:8]}"
    subject = f"benchraw.{name.lower()}"
    await js.add_stream(name=name, subjects=[subject])
    try:
        body = b"x" * 600  # about a submit's size
        t0 = time.perf_counter()
        await _gather_bounded([js.publish(subject, body) for _ in range(n)], IN_FLIGHT)
        return n / (time.perf_counter() - t0)
    finally:
        await js.delete_stream(name)


def figures(watch: Watch, sent: dict[str, float], t_first: float) -> dict[str, float]:
    """Rates and latencies of the workloads in `sent` (wid -> client clock at publish)."""
    st = {w: watch.stages.get(w, {}) for w in sent}
    created = [s["attempt-created"] for s in st.values() if "attempt-created" in s]
    routed = [s["routed"] for s in st.values() if "routed" in s]
    out = {
        "workloads": float(len(sent)),
        "created": float(len(created)),
        "rate": len(created) / max(1e-9, (max(created) if created else t_first) - t_first),
        "routed_rate": len(routed) / max(1e-9, (max(routed) if routed else t_first) - t_first),
    }
    for kind in STAGES:
        lat = [st[w][kind] - t for w, t in sent.items() if kind in st[w]]
        out[f"{kind}_p50"], out[f"{kind}_p99"] = _pct(lat, 0.5), _pct(lat, 0.99)
    # the time each stage itself took: submit -> submitted -> routed -> attempt-created
    prev = {w: t for w, t in sent.items()}
    for kind in STAGES:
        d = [st[w][kind] - prev[w] for w in sent if kind in st[w] and w in prev]
        out[f"stage_{kind}_p50"], out[f"stage_{kind}_p99"] = _pct(d, 0.5), _pct(d, 0.99)
        prev = {w: st[w][kind] for w in sent if kind in st[w]}
    return out


async def burst(
    client: Client, watch: Watch, n: int, tag: str, timeout: float, start: int = 0
) -> dict[str, float]:
    """Submit `n` workloads at once; wait for every `attempt-created`; the figures of this burst."""
    sent: dict[str, float] = {}

    async def one(i: int) -> None:
        t = time.time()
        wid = await client.submit(workload(i), idempotency_key=f"{tag}-{i}")
        sent[wid] = t

    t_first = time.time()
    await _gather_bounded([one(i) for i in range(start, start + n)], IN_FLIGHT)
    publish_s = time.time() - t_first
    await watch.until(sent, timeout)
    return {**figures(watch, sent, t_first), "publish_s": publish_s}


async def steady(
    client: Client, watch: Watch, rate: float, duration: float, tag: str, timeout: float
) -> dict[str, float]:
    """Submits paced at `rate`/s for `duration` s; latency from each one's publish."""
    n = max(1, int(rate * duration))
    sent: dict[str, float] = {}
    sem = asyncio.Semaphore(IN_FLIGHT)

    async def one(i: int) -> None:
        async with sem:
            t = time.time()
            wid = await client.submit(workload(i), idempotency_key=f"{tag}-{i}")
            sent[wid] = t

    t_first = time.time()
    t0 = time.perf_counter()
    tasks = []
    for i in range(n):
        delay = t0 + i / rate - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)  # pacing the offered load
        tasks.append(asyncio.create_task(one(i)))
    await asyncio.gather(*tasks)
    offered_s = time.time() - t_first
    await watch.until(sent, timeout)
    return {**figures(watch, sent, t_first), "offered_rate": n / max(1e-9, offered_s)}


def memory(system: System) -> dict[str, int]:
    return {name: rss(system.procs[name].pid) for name in SERVICES if name in system.procs}


def cpu(system: System) -> dict[str, float]:
    return {name: cpu_seconds(system.procs[name].pid) for name in (*SERVICES, "nats") if name in system.procs}


def cpu_since(system: System, before: dict[str, float]) -> dict[str, float]:
    """CPU seconds of each process since `before` (a `cpu` reading)."""
    return {k: v - before.get(k, 0.0) for k, v in cpu(system).items()}


@contextlib.asynccontextmanager
async def running(root: Path, profile: Path | None = None, nodes: int = NODES) -> Any:
    env = {"GPUORCH_PROFILE": str(profile)} if profile else {}
    root.mkdir(parents=True, exist_ok=True)
    system = System(
        state_dir=root / "state", clusters_file=clusters_file(root / "clusters.yaml", nodes), env_extra=env
    )
    system.start()
    try:
        s = system.settings
        async with Client(s.nats_url, s.names, creds=s.nats_creds) as client:
            watcher_nc = await bus.connect(s.nats_url, "bench-watch", creds=system.creds("admin"))
            watch = Watch(admin=watcher_nc.jetstream())
            await watch.start(watcher_nc, system)
            try:
                yield system, client, watch
            finally:
                await watcher_nc.close()
    finally:
        system.stop()


def cpu_rows(case: str, used: dict[str, float], created: float) -> list[Row]:
    """CPU per workload of each process over a run (`cpu` before and after), and the rate that
    CPU would allow at most on this machine's cores."""
    n, cores = max(1.0, created), os.cpu_count() or 1
    total = sum(used.values())
    return [
        *(Row("cpu", case, f"{name}: CPU per workload", 1000 * sec / n, f"ms ({sec:.1f} s over the run)") for name, sec in used.items()),
        Row("cpu", case, "all processes: CPU per workload", 1000 * total / n,
            f"ms (so at most {cores} cores / that = {n * cores / max(total, 1e-9):,.0f} workloads/s)"),
    ]  # fmt: skip


def _rows(case: str, f: dict[str, float], raw: float) -> list[Row]:
    return [
        Row(
            "throughput",
            case,
            "submit -> Job created",
            f["rate"],
            f"workloads/s ({f['rate'] / raw:.4f} of raw)",
        ),
        Row(
            "throughput",
            case,
            "submit -> routed (router)",
            f["routed_rate"],
            f"workloads/s ({f['routed_rate'] / raw:.4f} of raw)",
        ),
        Row("throughput", case, "raw JetStream publish", raw, "msgs/s"),
        Row("throughput", case, "ratio to raw", f["rate"] / raw, "x"),
        Row("throughput", case, "created", f["created"], f"of {f['workloads']:.0f}"),
        Row("throughput", case, "latency p50", f["attempt-created_p50"], "s"),
        Row("throughput", case, "latency p99", f["attempt-created_p99"], "s"),
        *(
            Row(
                "throughput",
                case,
                f"stage -> {k} p50 / p99",
                f[f"stage_{k}_p50"],
                f"s / {f[f'stage_{k}_p99']:.3f} s",
            )
            for k in STAGES
        ),
    ]


async def scenario_burst(
    root: Path, n: int, timeout: float, profile: Path | None, nodes: int = NODES
) -> list[Row]:
    async with running(root, profile, nodes) as (system, client, watch):
        raw = await raw_rate(watch.admin, min(n, 10_000))
        before, used = memory(system), cpu(system)
        f = await burst(client, watch, n, f"t{uuid.uuid4().hex[:6]}", timeout)
        after, used = memory(system), cpu_since(system, used)
        print(f"# burst {n} (raw {raw:.0f}/s): {f}", file=sys.stderr)
        print(
            f"# events by type during the burst: {dict(sorted(watch.kinds.items(), key=lambda kv: -kv[1]))}",
            file=sys.stderr,
        )
        pending = max(1, int(f["created"]) - gpus(nodes))
        rows = _rows(f"burst {n:,}", f, raw)
        rows += [Row("memory", f"burst {n:,}", f"{name}: per pending workload", (after[name] - before[name]) / pending,
                     f"bytes ({pending:,} pending; RSS {after[name] / 2**20:,.0f} MiB)") for name in after]  # fmt: skip
        rows += cpu_rows(f"burst {n:,}", used, f["created"])
    if profile:
        rows += profile_rows(profile, f)
    return rows


async def settle(system: System, most: float = 20.0, idle: float = 0.25) -> float:
    """Wait until the processes were idle (less than `idle` of a core in all over half a second)
    after a fill, for at most `most` seconds: what the fill left to do (the last events, a state
    snapshot deferred to the first lull: gpuorch.runtime.snapshot) is not counted in the probe
    after it. Returns the seconds waited."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < most:
        before = sum(cpu(system).values())
        await asyncio.sleep(0.5)  # the CPU clock's window, not a wait for a condition
        if sum(cpu(system).values()) - before < idle * 0.5:
            break
    return time.monotonic() - t0


async def scenario_backlog(
    root: Path, levels: list[int], probe: int, timeout: float, nodes: int = NODES
) -> list[Row]:
    rows: list[Row] = []
    rates: dict[int, float] = {}
    capacity = gpus(nodes)
    async with running(root, nodes=nodes) as (system, client, watch):
        raw = await raw_rate(watch.admin, 10_000)
        tag, at = f"k{uuid.uuid4().hex[:6]}", 0
        pending = 0
        for level in sorted(levels):
            fill = level - pending + (capacity if pending == 0 else 0)
            if fill > 0:
                f = await burst(client, watch, fill, tag, timeout, start=at)
                at += fill
                pending += int(f["created"]) - (capacity if pending == 0 else 0)
                print(f"# backlog fill to {pending}: {f}", file=sys.stderr)
            settled = await settle(system)
            print(f"# backlog at {pending}: the system was idle {settled:.1f} s after the fill", file=sys.stderr)
            used, kinds = cpu(system), dict(watch.kinds)
            f = await burst(client, watch, probe, tag, timeout, start=at)
            used = cpu_since(system, used)
            at += probe
            print(f"# backlog probe at {pending} (raw {raw:.0f}/s): {f}", file=sys.stderr)
            more = {k: n - kinds.get(k, 0) for k, n in watch.kinds.items() if n > kinds.get(k, 0)}
            print(f"# events by type during the probe: {dict(sorted(more.items(), key=lambda kv: -kv[1]))}", file=sys.stderr)
            rates[level] = f["rate"]
            case = f"probe {probe:,} at {pending:,} pending"
            rows += _rows(case, f, raw) + cpu_rows(case, used, f["created"])
            pending += int(f["created"])
    lo, hi = min(rates), max(rates)
    rows.append(
        Row(
            "throughput",
            "backlog",
            f"rate at {hi:,} / rate at {lo:,} pending",
            rates[hi] / rates[lo],
            "x (target >= 0.8)",
        )
    )
    return rows


async def scenario_steady(
    root: Path, rate: float, duration: float, timeout: float, nodes: int = NODES
) -> list[Row]:
    async with running(root, nodes=nodes) as (system, client, watch):
        raw = await raw_rate(watch.admin, 10_000)
        used, t0 = cpu(system), time.monotonic()
        f = await steady(client, watch, rate, duration, f"s{uuid.uuid4().hex[:6]}", timeout)
        wall = time.monotonic() - t0
        used = cpu_since(system, used)
        print(f"# steady {rate}/s x {duration}s (raw {raw:.0f}/s): {f}", file=sys.stderr)
    case = f"steady {rate:g}/s x {duration:g}s"
    return [
        *_rows(case, f, raw),
        Row("throughput", case, "offered", f["offered_rate"], "workloads/s"),
        *cpu_rows(case, used, f["created"]),
        *core_rows(case, used, wall),
    ]


def core_rows(case: str, used: dict[str, float], wall: float) -> list[Row]:
    """Each process's CPU as a share of one core over the run, busiest first: a process near
    1.0 is the bottleneck whatever the other core does (one event loop, one GIL)."""
    ranked = sorted(used.items(), key=lambda kv: -kv[1])
    return [
        Row("cpu", case, f"{name}: share of one core", sec / max(wall, 1e-9), f"cores ({sec:.1f} s CPU in {wall:.1f} s)")
        for name, sec in ranked
    ]


def profile_rows(directory: Path, f: dict[str, float]) -> list[Row]:
    """Which stage is slowest, and the top of its service's profile (printed to stderr)."""
    slowest = max(("routed", "attempt-created"), key=lambda k: f[f"stage_{k}_p50"])
    service = "router" if slowest == "routed" else "dispatcher"
    files = sorted(directory.glob(f"{service}-*.prof"))
    if not files:
        print(f"# profile: no {service} profile in {directory}", file=sys.stderr)
        return []
    out = io.StringIO()
    stats = pstats.Stats(str(files[-1]), stream=out)
    stats.sort_stats("tottime").print_stats(25)
    print(
        f"# profile of the {service} (slowest stage: -> {slowest}), by own time:\n{out.getvalue()}",
        file=sys.stderr,
    )
    return [
        Row(
            "profile",
            "slowest stage",
            f"-> {slowest}: {service}",
            f[f"stage_{slowest}_p50"],
            f"s p50 (profile: {files[-1]})",
        )
    ]


async def _run(bursts: list[int], backlog: list[int] | None, probe: int, steady_load: tuple[float, float] | None,
               timeout: float, profile: Path | None, nodes: int = NODES) -> list[Row]:  # fmt: skip
    rows: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="gpuorch-bench-tp-") as tmp:
        root = Path(tmp)
        for i, n in enumerate(bursts):
            rows += await scenario_burst(root / f"burst{i}", n, timeout, profile, nodes)
        if backlog:
            rows += await scenario_backlog(root / "backlog", backlog, probe, timeout, nodes)
        if steady_load:
            rows += await scenario_steady(root / "steady", *steady_load, timeout, nodes)
    return rows


def run(quick: bool = False, bursts: list[int] | None = None, backlog: list[int] | None = None, probe: int = 1000,
        steady_load: tuple[float, float] | None = None, timeout: float = 1800.0, profile: Path | None = None) -> list[Row]:  # fmt: skip
    """`make bench`: the issue's sizes (burst 10,000; backlog 1k/3k/10k; 250/s for 60 s); quick: small ones."""
    if quick:
        return asyncio.run(_run(bursts or [200], None, probe, steady_load or (50.0, 5.0), timeout, profile))
    return asyncio.run(
        _run(
            bursts or [10_000],
            backlog or [1_000, 3_000, 10_000],
            probe,
            steady_load or (250.0, 60.0),
            timeout,
            profile,
        )
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m gpuorch.dev.bench.throughput", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    ap.add_argument("--quick", action="store_true")
    ap.add_argument(
        "--burst", type=int, action="append", default=[], help="burst size (repeatable; default 10,000)"
    )
    ap.add_argument("--no-burst", action="store_true", help="skip the burst scenario")
    ap.add_argument(
        "--backlog",
        type=int,
        action="append",
        default=[],
        help="pending level (repeatable; default 1k 3k 10k)",
    )
    ap.add_argument("--no-backlog", action="store_true")
    ap.add_argument("--probe", type=int, default=1000, help="probe burst at each backlog level")
    ap.add_argument("--steady", type=float, nargs=2, metavar=("RATE", "SECONDS"), default=None)
    ap.add_argument("--no-steady", action="store_true")
    ap.add_argument("--timeout", type=float, default=1800.0, help="seconds to wait for a scenario's Jobs")
    ap.add_argument("--profile", type=Path, default=None, help="cProfile the services into this directory")
    ap.add_argument(
        "--nodes", type=int, default=NODES, help="nodes per cluster (8 GPUs each; default 50: 800 GPUs)"
    )
    args = ap.parse_args(argv)
    if args.quick:
        rows = run(True, args.burst or None, timeout=args.timeout, profile=args.profile)
    else:
        rows = asyncio.run(_run(
            [] if args.no_burst else (args.burst or [10_000]),
            None if args.no_backlog else (args.backlog or [1_000, 3_000, 10_000]),
            args.probe,
            None if args.no_steady else (args.steady[0], args.steady[1]) if args.steady else (250.0, 60.0),
            args.timeout, args.profile, args.nodes,
        ))  # fmt: skip
    for r in rows:
        print(f"{r.case:28} {r.metric:36} {r.value:12.3f} {r.unit}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
