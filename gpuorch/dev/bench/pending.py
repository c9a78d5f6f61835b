"""Memory per pending workload, per service (issue 12: ≤ 2 KB with 100,000 pending).

No broker and no cluster: N workloads are taken through the real event sequence of a workload
pending at its destination, made by the services' own code: the router accepts each submit
(`Gate.accept`) and its gate round releases and routes it (`core.gate_round`: `submitted`,
`released`, `routed` with a real decision over two clusters), the dispatcher's core makes its
Job and `attempt-created` (`core.on_routed`). Every event goes through JSON, as on the bus, and
each service decodes its own copy (they are separate processes) of the types it reads
(`core.READS`), with a trace context in its headers (each message's headers decoded afresh, as
nats-py parses them: what a service keeps of them is its own). The router's own events (what it
publishes) share its one string of the workload's id, as the objects it makes do. Then each
service builds its state as its handlers do:

* router: the gate and `RouterState` as the submit handler and the gate round left them (the
  router that decided is the one measured), then every echo folded (`Router.fold`, `remember`);
* dispatcher: `Follower` fold and `remember`, and the tables its `routed` handler fills when it
  claims a workload and creates its Job (`records`, `_owned`, `created`, `created_rv`; the same
  assignments as `_claim`, `execute` and `create_job`), then its `attempt-created` handler's
  step for `created`; the watch's `dirty` set drained as its tick does;
* fencer: `Follower` fold and `remember`, and the fence record its `attempt-created` handler
  writes and remembers (`core.on_attempt_created`, `Records._known` as `Records.cas` sets it).

Each figure is the state's growth over the N workloads: tracemalloc (exact: what the state
holds), per workload, with the ratio to the 2 KB target. `--baseline N` measures the same with the views kept whole
(`Projection(compact=False)`, the representation before; a smaller N: whole views take about
13 KB each). Run it with another checkout's interpreter to measure that tree's code (features
it lacks are skipped: `compact`). Inventory holds no per-workload state.

``python -m gpuorch.dev.bench.pending [--workloads N] [--baseline N]``; docs/performance.md.
"""

from __future__ import annotations

import argparse
import functools
import gc
import sys
import time
import tracemalloc
from collections.abc import Callable
from typing import Any

import msgspec

from gpuorch.config import Settings
from gpuorch.dev.bench.rows import Row
from gpuorch.projection import Projection
from gpuorch_proto import Event, OwnerRecord, encode, event_id
from gpuorch_proto import events as ev

TARGET = 2048  # bytes per pending workload (issue 12)
SERVICES = ("router", "dispatcher", "fencer")
PREFIX = "gpuorch"


def rss_bytes() -> int:
    from .restart import rss_bytes as rss

    return rss()


def _documents(n: int) -> Callable[[int], Any]:
    """The i-th workload's document: one template, each with its own name and arguments (a sweep's
    trials, a team's runs), as decoded from the bus."""
    from .restart import _world

    wl, _ = _world()
    spec, meta = wl.spec, wl.metadata

    def doc(i: int) -> Any:
        return msgspec.structs.replace(
            wl, metadata=msgspec.structs.replace(meta, name=f"trial-{i}"),
            spec=msgspec.structs.replace(spec, args=["--seed", str(i)]),
        )  # fmt: skip

    return doc


def _traceparent(i: int) -> dict[str, str]:
    return {"traceparent": f"00-{i:032x}-{i * 7919 % (1 << 64):016x}-01"}


def _router(baseline: bool) -> Any:
    from gpuorch_router.service import Router

    r = Router(Settings(prefix=PREFIX))
    _whole(r.follower, baseline)
    return r


def _whole(follower: Any, baseline: bool) -> None:
    """The baseline's views: kept whole, as before `Projection(compact=True)`."""
    if baseline and getattr(follower.projection, "compact", False):
        follower.projection = Projection(retire=True)


def _decide(n: int, sink: Callable[[int, list[Event], dict[str, str]], None]) -> None:
    """A router decides `n` workloads as its handlers do (`Gate.accept`, `Router.gate_round`);
    `sink(i, events, headers)` gets each workload's events in log order, the dispatcher's
    `attempt-created` (`core.on_routed`) last. (This router folds no echo: its projection stays
    empty, so its rounds do not grow with the workloads decided before.)"""
    from gpuorch.dev.bench.restart import _world
    from gpuorch_dispatcher import core as dcore
    from gpuorch_proto import workload_id_for
    from gpuorch_proto.storage import StoreConfig

    router = _router(False)
    _, router.indexes = _world()
    doc = _documents(n)
    env = dcore.Environment(registry={}, stores={"prod": StoreConfig(url="s3://bench/prod")})
    scratch = Projection(retire=True)  # the dispatcher's view to make the Job from (not measured)
    seq = 0
    start = time.time()  # the clusters' snapshots were observed now
    for i in range(n):
        now = start + i * 1e-6  # (the clock of a burst: with the real one a long run's snapshots go stale, and the router stops routing)
        wl = doc(i)
        key = f"bench-pending-{i}"
        wid = sys.intern(workload_id_for(key, wl.metadata.name))  # as `Router.on_command`
        headers = _traceparent(i)
        submitted = ev.Submitted(event_id=event_id(wid, "submitted"), workload_id=wid, at=now, workload=wl, idempotency_key=key)
        events: list[Event] = [*router.gate.accept(router.policy, submitted, None, now), *router.gate_round(now).events]
        routed = next(e for e in events if isinstance(e, ev.Routed))
        for e in events:
            seq += 1
            scratch.apply(e, seq)
        view = scratch.get(wid)
        assert view is not None
        acts = dcore.on_routed(view, routed, now, env, traceparent=headers["traceparent"])
        created = next(a.created for a in acts if isinstance(a, dcore.CreateJob))
        scratch.workloads.pop(wid, None)
        router.gate.confirm(events)
        router.gate.finished.clear()
        router.gate.running.clear()
        router.gate.releasing.pop(wid, None)  # (a release is `releasing` until the log's echo, which never comes here)
        router.gate.waiting.pop(wid, None)
        router.gate.seqs.clear()
        sink(i, [*events, created], headers)


def _measure(build: Callable[[], Any], traced: bool) -> tuple[int, Any]:
    """Bytes `build()` leaves held: tracemalloc's count, or the RSS growth."""
    gc.collect()
    if traced:
        tracemalloc.start()
        base = tracemalloc.get_traced_memory()[0]
    else:
        base = rss_bytes()
    held = build()
    gc.collect()
    size = (tracemalloc.get_traced_memory()[0] if traced else rss_bytes()) - base
    if traced:
        tracemalloc.stop()
    return size, held


def _router_state(baseline: bool, wire: list[list[tuple[bytes, bytes]]]) -> Any:
    """The router's state: what its submit handler and gate round note of each workload
    (`remember`, `Gate.accept`, the released and routed events noted as published), then every
    echo folded as its event handler folds it (`Router.fold`, `remember`)."""
    r = _router(baseline)
    decoder = msgspec.json.Decoder(Event)
    seq = 0
    for lives in wire:
        own = [decoder.decode(raw) for raw, _ in lives[:-1]]  # its own objects, before publishing
        sub = own[0]
        assert isinstance(sub, ev.Submitted)
        for e in own[1:]:  # (made from the submit's id: `Router.on_command`, the gate's round)
            msgspec.structs.force_setattr(e, "workload_id", sub.workload_id)
        r.follower.remember(sub.workload_id, _headers(lives[0][1]))  # the submit command's
        r.gate.accept(r.policy, sub, None, sub.at)
        r.gate.note([e for e in own[1:] if isinstance(e, ev.Released)], sub.at)
        r.state.note_published([e for e in own if isinstance(e, ev.Routed)])
        for raw, hdrs in lives:
            seq += 1
            echo = decoder.decode(raw)
            r.fold(echo, seq)
            r.follower.remember(echo.workload_id, _headers(hdrs))
    r.touched.clear()  # (a re-evaluation round's work list, drained every round)
    return r


def _service_state(service: str, n: int, baseline: bool, wire: list[list[tuple[bytes, bytes]]]) -> Any:
    """The dispatcher's or the fencer's state after folding `wire` as their handlers do."""
    decoder = msgspec.json.Decoder(Event)
    if service == "dispatcher":
        from gpuorch_dispatcher import core as dcore
        from gpuorch_dispatcher.service import Dispatcher

        svc: Any = Dispatcher(Settings(prefix=PREFIX))
        reads = set(dcore.READS)
    else:
        from gpuorch_fencer import core as fcore
        from gpuorch_fencer.service import Fencer, Records

        svc = Fencer(Settings(prefix=PREFIX))
        svc.records = Records(None)
        reads = set(fcore.READS)
    _whole(svc.follower, baseline)
    f = svc.follower
    seq = 0
    for lives in wire:
        for raw, headers in lives:
            seq += 1
            e = decoder.decode(raw)
            if ev.type_tag(e) not in reads:
                continue
            f.projection.apply(e, seq)  # as `_on_event` / `on_event`
            f.remember(e.workload_id, _headers(headers))
            wid = e.workload_id
            if service == "dispatcher":
                svc.dirty.add(wid)
                if isinstance(e, ev.Routed):  # claimed (`_claim`), its Job created (`execute`, `create_job`)
                    svc.records[wid] = OwnerRecord(owner=svc.me, generation=1)
                    svc._owned[wid] = seq
                    aid = f"{wid}-a{e.attempt_number}"
                    svc.created.setdefault(wid, set()).add(aid)
                    svc.created_rv[aid] = seq
                elif isinstance(e, ev.AttemptCreated) and not baseline and _prunes_created():
                    mine = svc.created.get(wid)  # its handler's step (`_on_event`), where this tree has it
                    if mine is not None:
                        mine.discard(e.attempt_id)
                        if not mine:
                            del svc.created[wid]
                    if (rv := svc.created_rv.pop(e.attempt_id, None)) is not None:
                        svc.created_rv[e.attempt_id] = rv
            else:
                svc.judge_dirty.add(wid)
                if isinstance(e, ev.AttemptCreated):  # `Records.cas` after `core.on_attempt_created`
                    d = fcore.on_attempt_created(None, e, time.time())
                    svc.records._known[wid] = (d.record, seq)
    if service == "dispatcher":
        svc.dirty = set()  # (the watch's tick takes it: `to_look_at`)
    else:
        svc.judge_dirty = set()  # (the orphan round takes it)
    return svc


@functools.cache
def _prunes_created() -> bool:
    """Does this tree's dispatcher drop `created` once the projection has the attempt?"""
    import inspect

    from gpuorch_dispatcher.service import Dispatcher

    return "mine.discard(e.attempt_id)" in inspect.getsource(Dispatcher._on_event)


def wire_of(n: int) -> list[list[tuple[bytes, bytes]]]:
    """Every workload's events as JSON (as published) with their headers (encoded: each message's are its own)."""
    import gpuorch_dispatcher.service  # noqa: F401
    import gpuorch_fencer.service  # noqa: F401

    wire: list[list[tuple[bytes, bytes]]] = []
    _decide(n, lambda i, events, headers: wire.append([(encode(e), msgspec.json.encode(headers)) for e in events]))
    return wire


_headers = msgspec.json.Decoder(dict[str, str]).decode  # a message's headers, its own strings


def measure_one(service: str, n: int, baseline: bool, traced: bool) -> float:
    """Bytes per pending workload one service holds (run in a fresh process: `--one`)."""
    wire = wire_of(n)  # (and every module the services use imported: not counted)
    if service == "router":
        size, held = _measure(lambda: _router_state(baseline, wire), traced)
    else:
        size, held = _measure(lambda: _service_state(service, n, baseline, wire), traced)
    del held
    return size / n


def measure(n: int, baseline: bool = False) -> dict[str, float]:
    """Per service: tracemalloc's bytes per pending workload, each from a fresh process. (Not the
    RSS growth: the allocator reuses what building the events freed, so it says next to nothing.)"""
    import subprocess

    out: dict[str, float] = {}
    for service in SERVICES:
        cmd = [sys.executable, "-m", "gpuorch.dev.bench.pending", "--one", service, "--workloads", str(n)]
        cmd += ["--whole"] if baseline else []
        res = subprocess.run(cmd, check=True, capture_output=True, text=True)
        out[service] = float(res.stdout.strip().splitlines()[-1])
    return out


def run(quick: bool = False, workloads: int | None = None, baseline: int | None = None) -> list[Row]:
    n = workloads if workloads is not None else (10_000 if quick else 100_000)
    b = baseline if baseline is not None else min(n, 10_000)
    rows: list[Row] = []
    for label, count, whole in (("compact", n, False), ("views whole (before)", b, True)):
        if count <= 0:
            continue
        case = f"{count:,} pending, {label}"
        t0 = time.perf_counter()
        got = measure(count, whole)
        print(f"# pending {case}: {time.perf_counter() - t0:.1f}s", file=sys.stderr)
        for service in SERVICES:
            traced = got[service]
            rows.append(Row("pending", case, f"{service}: bytes per pending workload", traced, f"B traced ({traced / TARGET:.2f} x the 2 KB target)"))
    return rows


def _quiet() -> None:
    """The services' info lines (a gate line per release) would be most of the run."""
    import logging

    import structlog

    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m gpuorch.dev.bench.pending", description=__doc__)
    ap.add_argument("--quick", action="store_true", help="10,000 pending instead of 100,000")
    ap.add_argument("--workloads", type=int, default=None, help="pending workloads (default 100,000)")
    ap.add_argument("--baseline", type=int, default=None, help="pending workloads for the views-whole baseline (default min(N, 10,000); 0: none)")
    ap.add_argument("--one", choices=SERVICES, help=argparse.SUPPRESS)  # one measurement, in this process
    ap.add_argument("--whole", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--rss", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    _quiet()
    if args.one:
        print(measure_one(args.one, args.workloads or 10_000, args.whole, not args.rss))
        return 0
    for r in run(args.quick, args.workloads, args.baseline):
        print(f"{r.case:34} {r.metric:42} {r.value:10.0f} {r.unit}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
