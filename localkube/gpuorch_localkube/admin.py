"""The admin endpoint of `python -m gpuorch_localkube serve` (loopback only) and its client."""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import yaml

from .cluster import LocalCluster, LocalClusters

__all__ = ["FAULTS", "AdminServer", "apply_fault", "read_admin_file", "send_fault"]

log = logging.getLogger("gpuorch_localkube.admin")
FAULTS = ("partition", "heal", "lose-node", "add-node", "capacity", "slow-api", "background")


class FaultError(ValueError):
    pass


def apply_fault(cluster: LocalCluster, fault: str, args: list[str]) -> Any:
    """Apply one fault by name with string arguments (what the CLI sends)."""
    try:
        if fault == "partition" and not args:
            cluster.partition()
            return {"partitioned": True, "port": cluster.port}
        if fault == "heal" and not args:
            cluster.heal()
            return {"partitioned": False, "url": cluster.url}
        if fault == "lose-node" and len(args) == 1:
            return {"node": args[0], "lost_pods": cluster.lose_node(args[0])}
        if fault == "add-node" and len(args) in (1, 2):
            cluster.add_node(args[0], args[1] if len(args) == 2 else None)
            return {"node": args[0]}
        if fault == "capacity" and len(args) == 2:
            cluster.set_node_gpus(args[0], int(args[1]))
            return {"node": args[0], "gpus": int(args[1])}
        if fault == "slow-api" and len(args) == 1:
            cluster.slow_api(float(args[0]))
            return {"slow_api_seconds": float(args[0])}
        if fault == "background" and len(args) == 1:
            loads = yaml.safe_load(args[0]) or []
            cluster.set_background(loads if isinstance(loads, list) else [loads])
            return {"background": [b.name for b in cluster.background.loads]}
    except KeyError as e:
        raise FaultError(str(e.args[0]) if e.args else str(e)) from e
    except ValueError as e:
        raise FaultError(str(e)) from e
    raise FaultError(
        f"unknown fault or wrong arguments: {fault} {args}; use partition | heal | lose-node NODE | "
        "add-node NODE [GROUP] | capacity NODE GPUS | slow-api SECONDS | background YAML"
    )


class _Handler(BaseHTTPRequestHandler):
    server: _AdminHTTPServer

    def log_message(self, format: str, *args: Any) -> None:
        log.debug(format, *args)

    def _reply(self, code: int, obj: Any) -> None:
        data = json.dumps(obj).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        if self.path.rstrip("/") in ("", "/status"):
            self._reply(200, {"clusters": {c.name: c.status() for c in self.server.clusters}})
        else:
            self._reply(404, {"error": "not found"})

    def do_POST(self) -> None:
        if self.path.rstrip("/") != "/fault":
            self._reply(404, {"error": "not found"})
            return
        try:
            req = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
            name = str(req.get("cluster"))
            if name not in self.server.clusters.names:
                raise FaultError(f"unknown cluster {name!r}: one of {self.server.clusters.names}")
            result = apply_fault(self.server.clusters[name], str(req.get("fault")), [str(a) for a in req.get("args") or []])
            self._reply(200, {"ok": True, "cluster": name, "result": result})
        except (FaultError, ValueError) as e:
            self._reply(400, {"ok": False, "error": str(e)})
        except OSError as e:  # e.g. heal could not bind its port again
            self._reply(500, {"ok": False, "error": f"{type(e).__name__}: {e}"})


class _AdminHTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, addr: tuple[str, int], clusters: LocalClusters):
        self.clusters = clusters
        super().__init__(addr, _Handler)


class AdminServer:
    def __init__(self, clusters: LocalClusters, port: int = 0, host: str = "127.0.0.1"):
        self._httpd = _AdminHTTPServer((host, port), clusters)
        self.port = self._httpd.server_address[1]
        self.url = f"http://{host}:{self.port}"
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()


def read_admin_file(state_dir: str | Path) -> dict[str, Any]:
    path = Path(state_dir) / "admin.json"
    try:
        return dict(json.loads(path.read_text()))
    except FileNotFoundError as e:
        raise FaultError(f"{path} not found: is `python -m gpuorch_localkube serve --state-dir {state_dir}` running?") from e


def send_fault(state_dir: str | Path, cluster: str, fault: str, args: list[str], timeout: float = 30.0) -> dict[str, Any]:
    info = read_admin_file(state_dir)
    body = json.dumps({"cluster": cluster, "fault": fault, "args": args}).encode()
    req = urllib.request.Request(
        f"{info['admin_url']}/fault", data=body, method="POST", headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return dict(json.loads(resp.read()))
    except urllib.error.HTTPError as e:
        with contextlib.suppress(ValueError):
            return dict(json.loads(e.read()))
        raise
