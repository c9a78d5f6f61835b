"""`gpuorch up` supervises: a `kill -9`'d process comes back, recorded, and work in flight completes.

These tests drive the real CLI: `gpuorch up` (a detached supervisor owning NATS, the local
clusters and the four services), `gpuorch restart`, `gpuorch status`, `gpuorch down`, all on a
state directory of their own (not the shared `system` fixture, which is not supervised).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from gpuorch.cli import settings_for
from gpuorch.client import Client
from gpuorch.supervisor import read_restarts
from gpuorch.system import System
from gpuorch_proto import type_tag
from tests.e2e.workloads import train
from tests.support.wait import assert_eventually

pytestmark = pytest.mark.e2e

HERE = Path(__file__).parent
CLI = Path(sys.executable).parent / "gpuorch"
INITIAL = 0.3  # GPUORCH_RESTART_INITIAL for this system: the first backoff after a crash
ENV = {**os.environ, "GPUORCH_LOST_AFTER": "2", "GPUORCH_RESTART_INITIAL": str(INITIAL)}


def gpuorch(state: Path, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(CLI), "--state", str(state), *args], capture_output=True, text=True, timeout=timeout, env=ENV)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with contextlib.suppress(OSError):  # a zombie is dead
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] != "Z"
    return True


def system_doc(state: Path) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads((state / "system.json").read_text())
    return doc


def pids(state: Path) -> dict[str, int]:
    return {n: int(p["pid"]) for n, p in system_doc(state)["procs"].items()}


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    state = tmp_path_factory.mktemp("supervised")
    out = gpuorch(state, "up", "--clusters", str(HERE / "clusters.yaml"))
    assert out.returncode == 0, out.stderr + out.stdout
    try:
        yield state
    finally:
        gpuorch(state, "down", timeout=180)
        with contextlib.suppress(OSError, ValueError):  # whatever `down` left behind, if it failed
            os.kill(int((state / "supervisor.pid").read_text()), signal.SIGKILL)
        if (state / "system.json").exists():
            System.load(state).stop()


@pytest.fixture
async def client(up: Path) -> AsyncIterator[Client]:
    s = settings_for(up)
    async with Client(s.nats_url, s.names, creds=s.nats_creds) as c:
        yield c


def restart_of(state: Path, service: str, old_pid: int) -> dict[str, Any] | None:
    """The record of the restart that replaced `old_pid`, once the new process is in system.json."""
    for r in read_restarts(state):
        if r["service"] == service and r["old_pid"] == old_pid:
            assert r["restarted"], r
            assert pids(state)[service] == r["new_pid"], "system.json names the new process"
            return r
    return None


async def in_flight(client: Client, wid: str) -> bool:
    v = await client.view(wid)
    return v is not None and bool(v.attempts) and not v.terminal


async def completed_exactly_once(client: Client, wids: list[str]) -> None:
    views = await asyncio.gather(*(client.wait(w, timeout=180) for w in wids))
    for v in views:
        assert v.status == "completed", (v.workload_id, v.status, v.reason)
        kinds = [type_tag(e) for _, e in await client.events(v.workload_id)]
        assert kinds.count("promoted") == 1 and kinds.count("completed") == 1, (v.workload_id, kinds)


async def test_kill_9_of_each_service_is_restarted_recorded_and_work_in_flight_completes(up: Path, client: Client) -> None:
    assert system_doc(up)["supervisor"]["pid"] == int((up / "supervisor.pid").read_text())
    wids: list[str] = []
    for service in ("router", "dispatcher", "fencer", "inventory"):
        wid = await client.submit(train(f"sup-{service}", steps=60))
        wids.append(wid)
        await assert_eventually(lambda w=wid: in_flight(client, w), timeout=60)
        old = pids(up)[service]
        os.kill(old, signal.SIGKILL)
        # submitted while the service is down: it waits on the bus for the restarted one
        wids.append(await client.submit(train(f"sup-during-{service}", steps=5)))
        rec = await assert_eventually(lambda s=service, o=old: restart_of(up, s, o), timeout=30)
        assert rec["kind"] == "crash" and rec["signal"] == "SIGKILL" and rec["exit_code"] is None, rec
        assert rec["backoff_s"] == INITIAL and rec["crashes"] == 1, rec
        assert rec["new_pid"] != old and alive(rec["new_pid"]) and not alive(old)
    # a crash loop backs off: the router again, within the healthy period -> twice the delay
    old = pids(up)["router"]
    os.kill(old, signal.SIGKILL)
    rec = await assert_eventually(lambda: restart_of(up, "router", old), timeout=30)
    assert rec["crashes"] == 2 and rec["backoff_s"] == 2 * INITIAL, rec
    await completed_exactly_once(client, wids)
    # and `gpuorch status` reports what happened
    st = json.loads(gpuorch(up, "status", "-o", "json").stdout)
    assert st["supervisor"]["alive"]
    counts = {n: p["restarts"] for n, p in st["processes"].items()}
    assert counts["router"] == 2 and counts["dispatcher"] == counts["fencer"] == counts["inventory"] == 1, counts
    assert counts["nats"] == counts["localkube"] == 0, counts
    assert all(p["alive"] for p in st["processes"].values()), st
    text = gpuorch(up, "status").stdout
    assert "SIGKILL" in text and "router" in text, text


async def test_kill_9_of_nats_comes_back_on_the_same_url_and_work_completes(up: Path) -> None:
    url = system_doc(up)["nats_url"]
    s = settings_for(up)
    async with Client(s.nats_url, s.names, creds=s.nats_creds) as c:
        wid = await c.submit(train("sup-nats", steps=60))
        await assert_eventually(lambda: in_flight(c, wid), timeout=60)
    old = pids(up)["nats"]
    os.kill(old, signal.SIGKILL)
    rec = await assert_eventually(lambda: restart_of(up, "nats", old), timeout=30)
    assert rec["signal"] == "SIGKILL" and rec["backoff_s"] == INITIAL, rec
    assert system_doc(up)["nats_url"] == url, "same port, so every client reconnects"
    async with Client(s.nats_url, s.names, creds=s.nats_creds) as c:
        await completed_exactly_once(c, [wid])
        # and new work after the restart goes through all four services
        await completed_exactly_once(c, [await c.submit(train("sup-after-nats", steps=3))])


async def test_gpuorch_restart_restarts_just_that_service_as_a_requested_restart(up: Path, client: Client) -> None:
    wid = await client.submit(train("sup-restart", steps=60))
    await assert_eventually(lambda: in_flight(client, wid), timeout=60)
    before = pids(up)
    out = gpuorch(up, "restart", "dispatcher", "-o", "json")
    assert out.returncode == 0, out.stderr
    res = json.loads(out.stdout)
    assert res["ok"] and res["old_pid"] == before["dispatcher"] and res["new_pid"] != before["dispatcher"], res
    after = pids(up)
    assert after["dispatcher"] == res["new_pid"] and not alive(before["dispatcher"])
    assert {n: p for n, p in after.items() if n != "dispatcher"} == {n: p for n, p in before.items() if n != "dispatcher"}, \
        "nats, the local clusters and the other services are untouched"
    rec = restart_of(up, "dispatcher", before["dispatcher"])
    assert rec is not None and rec["kind"] == "requested" and rec["backoff_s"] == 0.0, rec
    assert rec["signal"] is None, "asked to stop (SIGTERM), it stopped by itself"
    await completed_exactly_once(client, [wid])
    # the table form, and the refusals
    assert gpuorch(up, "restart", "fencer").stdout.startswith("fencer restarted: pid ")
    bad = gpuorch(up, "restart", "scheduler")
    assert bad.returncode != 0
    for name in ("router", "dispatcher", "fencer", "inventory"):
        assert name in bad.stderr, bad.stderr
    again = gpuorch(up, "up", "--clusters", str(HERE / "clusters.yaml"))
    assert again.returncode == 1 and "already up" in again.stderr


def test_restart_without_a_running_system_is_a_clear_error(tmp_path: Path) -> None:
    out = gpuorch(tmp_path, "restart", "router")
    assert out.returncode == 1 and "no supervisor is running" in out.stderr, out.stderr


def test_down_stops_the_supervisor_first_then_every_process(up: Path) -> None:
    procs = pids(up)
    sup = int((up / "supervisor.pid").read_text())
    records = len(read_restarts(up))
    out = gpuorch(up, "down", timeout=180)
    assert out.returncode == 0 and "stopped" in out.stdout, out.stderr
    assert not alive(sup)
    assert [n for n, p in procs.items() if alive(p)] == []
    assert len(read_restarts(up)) == records, "nothing was restarted while stopping"
    assert not (up / "system.json").exists() and not (up / "supervisor.pid").exists()
    assert gpuorch(up, "status").returncode == 1
