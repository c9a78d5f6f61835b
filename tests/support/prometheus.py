"""Prometheus for the tests: its tools (Debian's `prometheus` package: /usr/bin/promtool and
/usr/bin/prometheus; `.ci/run` installs it), the metric names a PromQL expression reads, and a
real `prometheus` server run in a temporary directory (`running_prometheus`)."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent.parent
RULES = ROOT / "deploy" / "prometheus" / "rules.yml"
RULES_TEST = ROOT / "deploy" / "prometheus" / "rules_test.yml"
DASHBOARD = ROOT / "deploy" / "grafana" / "gpuorch.json"


def tool(name: str) -> str:
    """The path of `promtool` or `prometheus`. Missing: the test fails under CI (.ci/run installs
    the package), and is skipped elsewhere with the command that installs it."""
    path = shutil.which(name) or f"/usr/bin/{name}"
    if os.access(path, os.X_OK):
        return path
    if os.environ.get("CI"):
        pytest.fail(f"{name} is missing: .ci/run installs Debian's prometheus package")
    pytest.skip(f"{name} is not installed (apt-get install -y prometheus)")


def promtool(*args: str | Path, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([tool("promtool"), *map(str, args)], capture_output=True, text=True, timeout=120, cwd=cwd)


def alert_rules(path: Path = RULES) -> dict[str, dict[str, Any]]:
    """The alerting rules of a rules file: alert name -> rule."""
    doc = yaml.safe_load(path.read_text())
    return {r["alert"]: r for g in doc["groups"] for r in g["rules"] if "alert" in r}


# --- the metric names of a PromQL expression -------------------------------------------------
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
_NAME_MATCHER = re.compile(r'__name__\s*=\s*("(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\')')
_BRACES = re.compile(r"\{[^{}]*\}")
_BRACKETS = re.compile(r"\[[^\[\]]*\]")
_GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)")
_IDENT = re.compile(r"(?<![\w.:$])[a-zA-Z_:][a-zA-Z0-9_:]*(?![\w:]|\s*\()")
_KEYWORDS = frozenset({"and", "or", "unless", "bool", "offset", "by", "without", "on", "ignoring", "group_left",
                       "group_right", "inf", "nan", "Inf", "NaN", "atan2"})  # fmt: skip


def metric_names(expr: str) -> set[str]:
    """The metric names a (valid) PromQL expression selects: every identifier that is not a
    function or aggregation, a keyword, a label (matchers, `by (...)`), a duration or a string;
    plus `{__name__="x"}`. `promtool check rules` is what tells a valid expression from another."""
    names = {m.group(1)[1:-1] for m in _NAME_MATCHER.finditer(expr)}
    text = _STRING.sub('""', expr)
    text = _BRACES.sub(" ", text)
    text = _BRACKETS.sub(" ", text)
    text = _GROUPING.sub(" ", text)
    return names | {m.group(0) for m in _IDENT.finditer(text) if m.group(0) not in _KEYWORDS}


# --- the Grafana dashboard's queries ----------------------------------------------------------
#: Grafana's built-in interval variables, as a value Prometheus parses
GRAFANA_INTERVALS = {"$__rate_interval": "1m", "$__interval": "1m", "$__range": "1h"}
_LABEL_VALUES = re.compile(r"^label_values\(\s*(?:(?P<expr>.+?)\s*,\s*)?(?P<label>[a-zA-Z_]\w*)\s*\)$")


def dashboard() -> dict[str, Any]:
    return dict(json.loads(DASHBOARD.read_text()))


def dashboard_panels(doc: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for p in doc["panels"]:
        yield p
        yield from p.get("panels", [])  # a collapsed row holds its panels


def dashboard_queries(doc: dict[str, Any]) -> list[tuple[str, str]]:
    """(where, PromQL) of every panel query and of every query variable (`label_values(expr, l)`)."""
    out = [(f"panel {p['title']!r} {t['refId']}", t["expr"]) for p in dashboard_panels(doc) for t in p.get("targets", [])]
    for v in doc["templating"]["list"]:
        if v["type"] == "query":
            q = v["query"]["query"] if isinstance(v["query"], dict) else v["query"]
            m = _LABEL_VALUES.match(q.strip())
            assert m and m["expr"], f"variable {v['name']}: {q!r} is not label_values(<PromQL>, label)"
            out.append((f"variable {v['name']}", m["expr"]))
    return out


def as_prometheus(expr: str, **variables: str) -> str:
    """A Grafana query as Prometheus takes it: the interval variables and `variables` filled in."""
    for var, value in {**GRAFANA_INTERVALS, **{f"${k}": v for k, v in variables.items()}}.items():
        expr = expr.replace(var, value)
    return expr


# --- a real Prometheus ------------------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Prometheus:
    """A real `prometheus` with `config` (written as `workdir/prometheus.yml`), its TSDB in
    `workdir`, on loopback at `port` (a free one unless given: a test that must name the URL
    before the server starts passes one from `free_port`)."""

    def __init__(self, workdir: Path, config: dict[str, Any], port: int | None = None) -> None:
        self.dir, self.config = workdir, config
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = workdir / "prometheus.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 60) -> Prometheus:
        """Start it; return once /-/ready answers 200 (fails with its log if it exits or times out)."""
        self.dir.mkdir(parents=True, exist_ok=True)
        conf = self.dir / "prometheus.yml"
        conf.write_text(yaml.safe_dump(self.config, sort_keys=False))
        with open(self.log, "ab") as fh:
            self.proc = subprocess.Popen([
                tool("prometheus"), f"--config.file={conf}", f"--storage.tsdb.path={self.dir / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}", "--storage.tsdb.retention.time=1h", "--web.enable-lifecycle",
            ], stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)  # fmt: skip
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                raise AssertionError(f"prometheus exited with {self.proc.returncode}: {self.log.read_text()[-3000:]}")
            with contextlib.suppress(OSError):
                with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as r:
                    if r.status == 200:
                        return self
            if time.monotonic() > deadline:
                raise AssertionError(f"prometheus not ready within {timeout:g}s: {self.log.read_text()[-3000:]}")
            time.sleep(0.1)  # polling a condition (the server's readiness), with a deadline

    def add_jobs(self, jobs: list[dict[str, Any]]) -> None:
        """Scrape these too: the configuration rewritten with them and reloaded (`POST /-/reload`)."""
        self.config = {**self.config, "scrape_configs": [*self.config.get("scrape_configs", []), *jobs]}
        (self.dir / "prometheus.yml").write_text(yaml.safe_dump(self.config, sort_keys=False))
        with urllib.request.urlopen(urllib.request.Request(f"{self.url}/-/reload", method="POST"), timeout=30) as r:
            assert r.status == 200, r.status

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after 15 s; idempotent."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def api(self, path: str, **params: str) -> Any:
        """GET /api/v1/<path>: its `data` (an error status raises with Prometheus's error)."""
        query = f"?{urllib.parse.urlencode(params)}" if params else ""
        try:
            with urllib.request.urlopen(f"{self.url}/api/v1/{path}{query}", timeout=10) as r:
                body = json.loads(r.read())
        except urllib.error.HTTPError as exc:
            body = json.loads(exc.read() or b"{}")
        assert body.get("status") == "success", f"{path} {params}: {body}"
        return body["data"]

    def query(self, q: str, at: float | None = None) -> list[dict[str, Any]]:
        """An instant query's result vector."""
        params = {"query": q, **({"time": f"{at:.3f}"} if at is not None else {})}
        return list(self.api("query", **params)["result"])

    def targets(self) -> list[dict[str, Any]]:
        return list(self.api("targets")["activeTargets"])


@contextlib.contextmanager
def running_prometheus(
    workdir: Path, config: dict[str, Any], timeout: float = 60, port: int | None = None
) -> Iterator[Prometheus]:
    """A started `Prometheus` (see there), stopped on exit."""
    p = Prometheus(workdir, config, port)
    try:
        yield p.start(timeout)
    finally:
        p.stop()
