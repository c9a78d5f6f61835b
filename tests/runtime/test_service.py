"""Logging configuration and the service entry point (signals, clean exit, flushed traces)."""

from __future__ import annotations

import asyncio
import io
import json
import logging
import os
import signal
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
import structlog

from gpuorch.runtime import telemetry
from gpuorch.runtime.logs import configure_logging
from gpuorch.runtime.shell import run_service


@pytest.fixture
def restore_logging() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    try:
        yield
    finally:
        structlog.reset_defaults()
        root.handlers[:] = handlers
        root.setLevel(level)
        structlog.contextvars.clear_contextvars()


def test_logs_are_json_lines_with_service_and_bound_context(restore_logging: None) -> None:
    out = io.StringIO()
    configure_logging("router", "INFO", stream=out)
    log = structlog.get_logger()
    with structlog.contextvars.bound_contextvars(subject="p.cmd.submit", stream_seq=7, trace_id="ab" * 16):
        log.info("msg.processed", outputs=2)
    log.debug("too.chatty")
    logging.getLogger("nats").warning("from the stdlib")
    lines = [json.loads(line) for line in out.getvalue().splitlines()]
    assert [line["event"] for line in lines] == ["msg.processed", "from the stdlib"]
    first = lines[0]
    assert first["service"] == "router" and first["level"] == "info" and first["outputs"] == 2
    assert (first["subject"], first["stream_seq"], first["trace_id"]) == ("p.cmd.submit", 7, "ab" * 16)
    assert first["timestamp"].endswith("Z")
    assert lines[1]["service"] == "router" and lines[1]["level"] == "warning" and lines[1]["logger"] == "nats"


SERVICE = textwrap.dedent(
    """
    import asyncio
    from gpuorch.runtime import telemetry
    from gpuorch.runtime.shell import run_service

    async def main(stop: asyncio.Event) -> None:
        with telemetry.tracer().start_as_current_span("svc work"):
            print("ready", flush=True)
            await stop.wait()

    run_service("svc-test", main)  # called from plain code: runs its own loop
    print("exited", flush=True)
    """
)


async def test_a_service_stops_cleanly_on_sigterm_and_flushes_its_spans(tmp_path: Path) -> None:
    trace_file = tmp_path / "trace.jsonl"
    script = tmp_path / "svc.py"
    script.write_text(SERVICE)
    env = {**os.environ, telemetry.TRACE_FILE_ENV: str(trace_file)}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, str(script), env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    try:
        assert proc.stdout is not None
        assert (await asyncio.wait_for(proc.stdout.readline(), 20)).strip() == b"ready"
        proc.send_signal(signal.SIGTERM)
        stdout, stderr = await asyncio.wait_for(proc.communicate(), 20)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert proc.returncode == 0, stderr.decode()
    assert stdout.strip() == b"exited"
    events = [json.loads(line)["event"] for line in stderr.decode().splitlines() if line.startswith("{")]
    assert events[0] == "service.started" and events[-1] == "service.stopped", events
    assert "service.stopping" in events and "service.crashed" not in events
    [span] = telemetry.read_trace_file(trace_file)
    assert (span["name"], span["service"]) == ("svc work", "svc-test")


async def test_run_service_can_be_awaited_inside_a_loop(restore_logging: None) -> None:
    ran: list[bool] = []

    async def main(stop: asyncio.Event) -> None:
        ran.append(stop.is_set())

    await run_service("inline", main)
    assert ran == [False]
