"""The shell's cost per message: what every service pays for each event it reads, before its handler.

One nats-server (the embedded one, with its permission model) and one stream holding ``N``
events (`released`, the smallest; the same body for both cases below). In this process, timed by
its CPU clock (`time.process_time`, so the server's CPU is not counted):

* ``raw``: the baseline, nats-py alone: a pull consumer fetching batches of 256 and acking each
  message, decoding nothing;
* ``shell``: the services' consume loop (`gpuorch.runtime.shell.consume`, 64 messages in flight,
  their trace context, log context, metrics, subject checks and decoding) with a handler that does
  nothing and publishes nothing.

The difference is the shell's own cost per message; times the messages a workload causes each
service to read (about 14 over router, dispatcher and fencer, docs/performance.md) it is a floor
under the CPU a workload costs end to end.

``python -m gpuorch.dev.bench.shell [--messages N]`` runs it alone.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import tempfile
import time
from typing import Any

from gpuorch.dev.bench.rows import Row
from gpuorch.runtime.bus import connect, ensure_topology
from gpuorch.runtime.logs import configure_logging
from gpuorch.runtime.natsembed import EmbeddedNats
from gpuorch.runtime.shell import Incoming, Publisher, consume
from gpuorch_proto import Names, event_id
from gpuorch_proto import events as ev

MESSAGES = 20_000
CONCURRENCY = 64


async def _fill(js: Any, names: Names, n: int, tag: str) -> None:
    pub = Publisher(js, names)
    now = time.time()
    for i in range(0, n, 500):
        await pub.publish(
            [
                ev.Released(event_id=event_id(f"{tag}{j}", "released"), workload_id=f"{tag}{j}", at=now, queue="q", gpus=1.0)
                for j in range(i, min(n, i + 500))
            ]
        )


async def _raw(js: Any, names: Names, n: int, tag: str) -> float:
    """CPU seconds per message of nats-py's own pull consumer: fetch, ack."""
    sub = await js.pull_subscribe(names.evt_kind("released"), durable=f"raw-{tag}", stream=names.stream_evt)
    seen, t0 = 0, time.process_time()
    while seen < n:
        for msg in await sub.fetch(256, timeout=5):
            _ = msg.metadata.sequence.stream  # as any reader does
            await msg.ack()
            seen += 1
    return (time.process_time() - t0) / n


async def _shell(js: Any, names: Names, n: int, tag: str) -> float:
    """CPU seconds per message of the services' consume loop with a handler that does nothing."""
    seen, done, stop = 0, asyncio.Event(), asyncio.Event()

    async def handler(msg: Incoming) -> list[ev.Base]:
        nonlocal seen
        seen += 1
        if seen >= n:
            done.set()
        return []

    t0 = time.process_time()
    task = asyncio.create_task(
        consume(js, stream=names.stream_evt, durable=f"shell-{tag}", filter_subject=names.evt_kind("released"),
                handler=handler, publisher=Publisher(js, names), names=names, stop=stop, concurrency=CONCURRENCY)
    )  # fmt: skip
    await done.wait()
    used = time.process_time() - t0
    stop.set()
    await task
    return used / n


async def _run(n: int) -> list[Row]:
    configure_logging("bench", "INFO", open(os.devnull, "w"))  # the loggers keep the stream
    with tempfile.TemporaryDirectory() as tmp, EmbeddedNats(tmp) as srv:
        nc = await connect(srv.url, "bench-shell", creds=srv.creds("admin"))
        try:
            js = nc.jetstream()
            names = Names("bshell")
            await ensure_topology(js, names)
            await _fill(js, names, n, "m")
            raw = await _raw(js, names, n, "a")
            shell = await _shell(js, names, n, "a")
        finally:
            await nc.close()
    case = f"{n:,} events, do-nothing handler"
    return [
        Row("shell", case, "nats-py pull consumer (fetch, ack)", raw * 1e6, "us CPU per message (baseline)"),
        Row("shell", case, "shell consume loop", shell * 1e6, f"us CPU per message ({shell / raw:.2f} x baseline)"),
        Row("shell", case, "shell's own cost", (shell - raw) * 1e6, "us CPU per message"),
    ]


def run(quick: bool = False, messages: int | None = None) -> list[Row]:
    return asyncio.run(_run(messages or (3_000 if quick else MESSAGES)))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m gpuorch.dev.bench.shell", description=__doc__)
    ap.add_argument("--messages", type=int, default=MESSAGES)
    args = ap.parse_args(argv)
    for r in run(messages=args.messages):
        print(f"{r.case:34} {r.metric:40} {r.value:10.1f} {r.unit}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
