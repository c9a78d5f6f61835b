"""A real Prometheus for the tests: Debian's `prometheus` package (`/usr/bin/prometheus`; `.ci/run`
installs it), on a loopback port, with a temporary TSDB and the scrape jobs the test gives. Under
CI=1 a missing binary fails the test; elsewhere it skips it."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml

BINARY = "/usr/bin/prometheus"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def binary() -> str:
    found = shutil.which("prometheus") or (BINARY if os.access(BINARY, os.X_OK) else None)
    if found is None:
        message = f"no prometheus binary ({BINARY}: apt-get install -y prometheus; .ci/run installs it)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return found


class Prometheus:
    def __init__(self, directory: Path, port: int | None = None, scrape_interval: str = "200ms") -> None:
        self.dir = directory
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.interval = scrape_interval
        self.proc: subprocess.Popen[bytes] | None = None

    def _configure(self, jobs: list[dict[str, Any]]) -> None:
        self.jobs = list(jobs)
        config = {"global": {"scrape_interval": self.interval, "scrape_timeout": self.interval}, "scrape_configs": self.jobs}
        (self.dir / "prometheus.yml").write_text(yaml.safe_dump(config))

    def add_jobs(self, jobs: list[dict[str, Any]]) -> None:
        """Scrape these too: the configuration rewritten and reloaded (`POST /-/reload`)."""
        self._configure([*self.jobs, *jobs])
        with urllib.request.urlopen(urllib.request.Request(f"{self.url}/-/reload", method="POST"), timeout=30) as r:
            assert r.status == 200, r.status

    def start(self, jobs: list[dict[str, Any]], timeout: float = 60.0) -> Prometheus:
        self.dir.mkdir(parents=True, exist_ok=True)
        self._configure(jobs)
        log = (self.dir / "prometheus.log").open("wb")
        self.proc = subprocess.Popen([
            binary(), f"--config.file={self.dir / 'prometheus.yml'}", f"--storage.tsdb.path={self.dir / 'data'}",
            f"--web.listen-address=127.0.0.1:{self.port}", "--web.enable-lifecycle",
        ], stdout=log, stderr=subprocess.STDOUT)  # fmt: skip
        deadline = time.monotonic() + timeout
        while True:
            try:
                with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as r:
                    if r.status == 200:
                        return self
            except OSError:
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"prometheus did not become ready: {(self.dir / 'prometheus.log').read_text()[-2000:]}")
            time.sleep(0.1)

    def query(self, q: str, at: float | None = None) -> list[dict[str, Any]]:
        params = {"query": q, **({"time": f"{at:.3f}"} if at is not None else {})}
        with urllib.request.urlopen(f"{self.url}/api/v1/query?{urllib.parse.urlencode(params)}", timeout=10) as r:
            doc = json.loads(r.read())
        assert doc["status"] == "success", doc
        return list(doc["data"]["result"])

    def targets(self) -> list[dict[str, Any]]:
        with urllib.request.urlopen(f"{self.url}/api/v1/targets", timeout=10) as r:
            return list(json.loads(r.read())["data"]["activeTargets"])

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=20)
        self.proc = None
