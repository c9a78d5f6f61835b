"""Restart time with a long history: 100,000 finished workloads in the event log (issue 12, item 5).

One nats-server (its own identities, the production permission model); the admin publishes the
history straight into the event stream: per workload the nine events of a finished life
(`submitted`, `routed` with a real policy decision over two clusters, `attempt-created`,
`admitted`, `running`, `succeeded`, `promote-requested`, `promoted`, `completed`), JSON as the
services publish them. Then, in this process, with the services' own code and identities:

* ``full replay``: what each service did at start-up before snapshots: `Follower.catch_up` over
  the whole stream (dispatcher, fencer), `Router.catch_up` (projection and `RouterState`) plus
  the router's pass that learns from every completed workload;
* ``snapshot write``: the body (`follower_body`: projection, trace contexts, the core's state)
  and `SnapshotStore.save` into the snapshots bucket, as that service's identity;
* ``restart``: `restore_follower` (load, check, decode) and the replay of what came after the
  snapshot (`--tail` more finished workloads published after it), the router's learning pass
  included: the restart a service does now. Target: < 5 s per service.

Also the snapshot's size (compressed, raw) and the RSS growth of this process per workload held
in a restored projection (a finished workload; a pending one holds less: no attempt yet).

``python -m gpuorch.dev.bench.restart [--workloads N] [--tail N]``; docs/performance.md.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec

from gpuorch.config import Settings
from gpuorch.dev.bench.rows import Row
from gpuorch.follow import Follower
from gpuorch.runtime import bus
from gpuorch.runtime.natsembed import EmbeddedNats
from gpuorch.runtime.snapshot import Snapshots, SnapshotStore, follower_body, no_gc, restore_follower
from gpuorch_proto import Event, Names, encode, event_id, k8s, workload_from_obj
from gpuorch_proto import events as ev
from gpuorch_router import core as router_core
from gpuorch_router.policy import build_index
from gpuorch_router.service import Router

from .throughput import CLUSTER

NAMES = Names("gpuorch")
IN_FLIGHT = 4096  # publishes whose acks are awaited together
SERVICES = ("router", "dispatcher", "fencer")


def rss_bytes() -> int:
    """This process's resident set (Linux /proc)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def _world() -> tuple[Any, dict[str, Any]]:
    from gpuorch_proto import ClusterRegistryEntry, ClusterSnapshot, NodeInfo

    nodes = [NodeInfo(name=f"gpu-{i}", ready=True, pool="train", gpu_product="NVIDIA-A100-SXM4-80GB",
                      gpu_memory_mib=81920, gpus_allocatable=8, gpus_free=8, cpu_free=256.0,
                      memory_free=float(2048 << 30)) for i in range(4)]  # fmt: skip
    registry = msgspec.convert(CLUSTER["registry"], ClusterRegistryEntry)
    now = time.time()
    snaps = {c: ClusterSnapshot(cluster=c, reachable=True, observed_at=now, published_at=now, nodes=nodes, registry=registry)
             for c in ("east", "west")}  # fmt: skip
    wl = workload_from_obj({
        "metadata": {"name": "r", "owner": "bench"},
        "spec": {"image": "example.org/bench/sleep@sha256:" + "be" * 32, "command": ["sleep"], "args": ["1"],
                 "resources": {"gpus": 1, "cpu": "100m", "memory": "64Mi"}, "expected_runtime": "1h",
                 "output": {"store": "prod"}},
    })  # fmt: skip
    return wl, {c: build_index(s) for c, s in snaps.items()}


def finished_life(i: int, tag: str, wl: Any, decision: Any, t: float) -> list[Event]:
    """The nine events of a workload that ran once and finished."""
    wid = f"{tag}{i:07d}"
    aid = k8s.attempt_id(wid, 1)
    d = msgspec.structs.replace(decision, workload_id=wid)
    common: dict[str, Any] = {"workload_id": wid, "attempt_id": aid, "epoch": 1, "cluster": d.cluster or "east"}
    out = f"/store/prod/{wid}/attempts/{aid}/"
    return [
        ev.Submitted(event_id=event_id(wid, "submitted"), workload_id=wid, at=t, workload=wl, idempotency_key=f"k-{wid}"),
        ev.Routed(event_id=event_id(wid, "routed", 1), workload_id=wid, at=t + 0.1, decision=d, attempt_number=1),
        ev.AttemptCreated(event_id=event_id(wid, "attempt-created", 1), at=t + 0.2, attempt_number=1, job_name=f"gpuorch-{aid}",
                          output_path=out, checkpoint_path=f"/store/prod/{wid}/checkpoints/", **common),
        ev.Admitted(event_id=event_id(wid, "admitted", 1), at=t + 1, **common),
        ev.Running(event_id=event_id(wid, "running", 1), at=t + 2, **common),
        ev.Succeeded(event_id=event_id(wid, "succeeded", 1), at=t + 60, output_path=out, **common),
        ev.PromoteRequested(event_id=event_id(wid, "promote-requested", 1), at=t + 61, output_path=out, **common),
        ev.Promoted(event_id=event_id(wid, "promoted", 1), at=t + 62, output_path=out, result_path=f"/store/prod/{wid}/result/", **common),
        ev.Completed(event_id=event_id(wid, "completed"), workload_id=wid, at=t + 63, attempt_id=aid, result_path=f"/store/prod/{wid}/result/"),
    ]  # fmt: skip


async def publish_history(js: Any, n: int, tag: str, fold: Callable[[Event, int], None] | None = None) -> tuple[int, float]:
    """Publish `n` finished lives; returns (messages, seconds). `fold(event, seq)`: each event
    with its stream sequence, in order (the state a full replay builds, without the replay)."""
    wl, indexes = _world()
    decision = router_core.decide(router_core.RouterState(), wl, "x", 1, indexes, time.time())
    t0 = time.perf_counter()
    sent = 0
    pending: list[tuple[Event, asyncio.Future[Any]]] = []

    async def settle() -> None:
        acks = await asyncio.gather(*(f for _, f in pending))
        if fold is not None:
            for (e, _), ack in zip(pending, acks, strict=True):
                fold(e, ack.seq)
        pending.clear()

    t = time.time() - 86400.0
    for i in range(n):
        for e in finished_life(i, tag, wl, decision, t + i * 0.01):
            fut = await js.publish_async(NAMES.evt(e.workload_id, ev.type_tag(e)), encode(e), headers={"Content-Type": "application/json"})
            pending.append((e, fut))
            sent += 1
            if len(pending) >= IN_FLIGHT:
                await settle()
    await settle()
    return sent, time.perf_counter() - t0


def _router(names: Names) -> Router:
    return Router(Settings(prefix=names.prefix))


async def _traced_restore(js: Any, owner: str, service: str) -> int:
    """Bytes the state restored from the snapshot holds (tracemalloc: exact, unlike an RSS delta
    that reuses what the allocator kept from the run before). Not timed."""
    import tracemalloc

    snaps = Snapshots(js, NAMES, owner, NAMES.durable(service, "events"), lambda: b"")
    loaded = await SnapshotStore(await js.key_value(NAMES.kv_snapshots), owner).load()
    assert loaded is not None
    gc.collect()
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        if service == "router":
            r = _router(NAMES)
            _, folded = await restore_follower(snaps, r.follower, router_core.load_router)
            assert folded is not None
            r.state, r.gate, r.history = folded
            held: Any = r
        else:
            f = Follower()
            await restore_follower(snaps, f)
            held = f
        del loaded
        gc.collect()
        size = tracemalloc.get_traced_memory()[0] - base
        del held
    finally:
        tracemalloc.stop()
    return size


def _folder(r: Router, f: Follower) -> Callable[[Event, int], None]:
    def fold(e: Event, seq: int) -> None:  # as the router's and a follower's consumers fold it
        r.fold(e, seq)
        f.projection.apply(e, seq)

    return fold


async def _as(server: EmbeddedNats, identity: str) -> Any:
    return await bus.connect(server.url, f"bench-{identity}", creds=server.creds(identity))


async def _run(n: int, tail: int, replay_full: bool = True) -> list[Row]:
    rows: list[Row] = []
    case = f"{n:,} finished"
    with tempfile.TemporaryDirectory(prefix="gpuorch-bench-restart-") as tmp:
        server = EmbeddedNats(Path(tmp) / "nats", die_with_parent=True).start()
        try:
            admin = await _as(server, "admin")
            ajs = admin.jetstream(timeout=30.0)
            await bus.ensure_topology(ajs, NAMES)
            r0, f0 = _router(NAMES), Follower()
            fold_both = _folder(r0, f0)

            with no_gc():
                msgs, secs = await publish_history(ajs, n, "a", None if replay_full else fold_both)
            info = await ajs.stream_info(NAMES.stream_evt)
            print(f"# restart: published {msgs:,} events in {secs:.1f}s; stream {info.state.bytes / 2**20:,.0f} MiB", file=sys.stderr)
            rows.append(Row("restart", case, "events in the log", float(info.state.messages), "events"))
            rows.append(Row("restart", case, "log size", info.state.bytes / 2**20, "MiB"))

            # before: every service replayed everything at start-up (the router also folds its
            # RouterState and learns from every completed workload; dispatcher and fencer fold the
            # projection alone: one measurement for both)
            full: dict[str, float] = {}
            bodies: dict[str, bytes] = {}
            seqs: dict[str, int] = {}
            for who in ("router", "dispatcher") if replay_full else ():
                nc = await _as(server, who)
                js = nc.jetstream(timeout=30.0)
                t0 = time.perf_counter()
                if who == "router":
                    r = _router(NAMES)
                    await r.catch_up(js)  # folds and learns from every completed workload
                    full[who] = time.perf_counter() - t0
                    t0 = time.perf_counter()
                    bodies[who], seqs[who] = r.dump_snapshot(), r.follower.projection.last_seq
                    del r
                else:
                    f = Follower()
                    await f.catch_up(js, NAMES.stream_evt, NAMES.evt_all)
                    full["dispatcher"] = full["fencer"] = time.perf_counter() - t0
                    t0 = time.perf_counter()
                    bodies["dispatcher"] = bodies["fencer"] = follower_body(f.projection, f.traceparents)
                    seqs["dispatcher"] = seqs["fencer"] = f.projection.last_seq
                    del f
                full[f"{who} dump"] = time.perf_counter() - t0
                await nc.close()
                gc.collect()
            if replay_full:
                print(f"# restart: full replay router {full['router']:.1f}s, dispatcher/fencer {full['dispatcher']:.1f}s", file=sys.stderr)
            else:  # the same state, folded while publishing (no replay measured)
                t0 = time.perf_counter()
                bodies["router"], seqs["router"] = r0.dump_snapshot(), r0.follower.projection.last_seq
                full["router dump"] = time.perf_counter() - t0
                t0 = time.perf_counter()
                bodies["dispatcher"] = bodies["fencer"] = follower_body(f0.projection, f0.traceparents)
                seqs["dispatcher"] = seqs["fencer"] = f0.projection.last_seq
                full["dispatcher dump"] = time.perf_counter() - t0
            del r0, f0, fold_both
            gc.collect()

            for service in SERVICES:
                nc = await _as(server, service)
                js = nc.jetstream(timeout=30.0)
                owner = "dispatcher.0" if service == "dispatcher" else service
                t0 = time.perf_counter()  # the snapshot, written as the service's own identity
                store = SnapshotStore(await js.key_value(NAMES.kv_snapshots), owner)
                head = await store.save(bodies[service], seqs[service])
                write = time.perf_counter() - t0 + full["router dump" if service == "router" else "dispatcher dump"]
                if tail:  # newer history after the snapshot, then the restart from it
                    await publish_history(ajs, tail, f"t{service[0]}")
                gc.collect()
                rss0 = rss_bytes()
                t0 = time.perf_counter()
                snaps = Snapshots(js, NAMES, owner, NAMES.durable(service, "events"), lambda: b"")
                if service == "router":
                    r = _router(NAMES)
                    start, folded = await restore_follower(snaps, r.follower, router_core.load_router)
                    assert folded is not None, "the router's snapshot did not restore"
                    r.state, r.gate, r.history = folded  # as `Router.run`: the history learnt is in the snapshot
                    replayed = await r.catch_up(js, start)  # learns from what completed after it
                    held = len(r.follower.projection)
                else:
                    f = Follower()
                    start, _ = await restore_follower(snaps, f)
                    replayed = await f.catch_up(js, NAMES.stream_evt, NAMES.evt_all, start_seq=start)
                    held = len(f.projection)
                restart = time.perf_counter() - t0
                per_wl = (rss_bytes() - rss0) / max(1, held)
                traced = await _traced_restore(js, owner, service) / max(1, held - replayed // 9)
                assert start == head.seq + 1, f"{service}: restarted from {start}, the snapshot covers {head.seq}"
                rows += [
                    *([Row("restart", case, f"{service}: full replay (before)", full[service], "s")] if replay_full else []),
                    Row("restart", case, f"{service}: snapshot write", write, "s"),
                    Row("restart", case, f"{service}: snapshot size", head.size / 2**20, f"MiB ({head.raw_size / 2**20:,.0f} MiB raw)"),
                    Row("restart", case, f"{service}: restart from snapshot", restart, f"s (+{replayed:,} events after it; target < 5)"),
                    Row("restart", case, f"{service}: memory per workload held", per_wl, "bytes (RSS delta)"),
                    Row("restart", case, f"{service}: memory per workload restored", traced, "bytes (tracemalloc of the restored state)"),
                ]
                print(f"# restart {service}: write {write:.2f}s ({head.size / 2**20:.1f} MiB), "
                      f"restart {restart:.2f}s (+{replayed} events), {per_wl:,.0f} B/workload RSS, {traced:,.0f} B/workload traced", file=sys.stderr)  # fmt: skip
                if service == "router":
                    del r
                else:
                    del f
                gc.collect()
                await nc.close()
            await admin.close()
        finally:
            server.stop()
    return rows


def run(quick: bool = False, workloads: int | None = None, tail: int | None = None, replay_full: bool = True) -> list[Row]:
    n = workloads if workloads is not None else (2_000 if quick else 100_000)
    return asyncio.run(_run(n, tail if tail is not None else max(1, n // 100), replay_full))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m gpuorch.dev.bench.restart", description=__doc__)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--workloads", type=int, default=None, help="finished workloads in the log (default 100,000)")
    ap.add_argument("--tail", type=int, default=None, help="finished workloads published after the snapshot (default 1%%)")
    ap.add_argument("--no-full", action="store_true", help="skip the full replays (the state is folded while publishing)")
    args = ap.parse_args(argv)
    for r in run(args.quick, args.workloads, args.tail, not args.no_full):
        print(f"{r.case:18} {r.metric:40} {r.value:12.3f} {r.unit}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
