"""`python -m gpuorch_localkube serve|fault|status` (see docs/local-clusters.md)."""

from __future__ import annotations

import argparse
import gc
import json
import logging
import os
import signal
import sys
import threading
import urllib.request
from pathlib import Path

from .admin import FAULTS, AdminServer, FaultError, read_admin_file, send_fault
from .cluster import LocalClusters
from .config import ConfigError

DEFAULT_CONFIG = "deploy/local/clusters.yaml"
FREEZE_SECONDS = 5.0


def _serve(args: argparse.Namespace) -> int:
    state_dir = Path(args.state_dir).resolve()
    state_dir.mkdir(parents=True, exist_ok=True)
    kubeconfig = Path(args.kubeconfig or state_dir / "kubeconfig").resolve()
    try:
        clusters = LocalClusters(args.config, state_dir)
    except (ConfigError, OSError) as e:
        print(f"localkube: {e}", file=sys.stderr)
        return 2
    stop = threading.Event()

    def on_signal(signum: int, _frame: object) -> None:
        logging.getLogger("gpuorch_localkube").info("signal %d: stopping", signum)
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    admin: AdminServer | None = None
    admin_file = state_dir / "admin.json"
    try:
        clusters.start()
        clusters.write_kubeconfig(kubeconfig)
        admin = AdminServer(clusters, port=args.admin_port)
        admin.start()
        info = {
            "pid": os.getpid(),
            "admin_port": admin.port,
            "admin_url": admin.url,
            "kubeconfig": str(kubeconfig),
            "clusters": clusters.urls,
            "time_scale": clusters.config.time_scale,
        }
        tmp = admin_file.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(info, indent=2))
        tmp.replace(admin_file)
        print(f"localkube ready: {len(clusters)} clusters {json.dumps(clusters.urls)} kubeconfig={kubeconfig} "
              f"admin={admin.url}", flush=True)
        while not stop.wait(FREEZE_SECONDS):
            # The store holds millions of long-lived, acyclic objects (every pod is a few hundred
            # dicts and strings): without this, each full cyclic-GC pass walks all of them (about a
            # second at 10,000 pods, every time the heap grows by a quarter). Frozen objects are
            # still freed by reference counting when the store drops them.
            gc.freeze()
    finally:
        if admin is not None:
            admin.stop()
        clusters.stop(grace=args.grace)
        try:
            if json.loads(admin_file.read_text()).get("pid") == os.getpid():
                admin_file.unlink()
        except (OSError, ValueError):
            pass
        print("localkube stopped", flush=True)
    return 0


def _fault(args: argparse.Namespace) -> int:
    try:
        out = send_fault(args.state_dir, args.cluster, args.fault, args.args)
    except (FaultError, OSError) as e:
        print(f"localkube fault: {e}", file=sys.stderr)
        return 2
    print(json.dumps(out))
    return 0 if out.get("ok") else 1


def _status(args: argparse.Namespace) -> int:
    try:
        info = read_admin_file(args.state_dir)
        with urllib.request.urlopen(f"{info['admin_url']}/status", timeout=10) as resp:
            print(resp.read().decode())
    except (FaultError, OSError) as e:
        print(f"localkube status: {e}", file=sys.stderr)
        return 2
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m gpuorch_localkube", description="Embedded local Kubernetes-API clusters.")
    sub = p.add_subparsers(dest="command", required=True)
    s = sub.add_parser("serve", help="run the clusters of a config file until SIGTERM/SIGINT")
    s.add_argument("--config", default=DEFAULT_CONFIG)
    s.add_argument("--state-dir", required=True)
    s.add_argument("--kubeconfig", help="where to write the kubeconfig (default STATE_DIR/kubeconfig)")
    s.add_argument("--admin-port", type=int, default=0)
    s.add_argument("--grace", type=float, default=5.0, help="seconds between SIGTERM and SIGKILL of pods at shutdown")
    s.add_argument("--log-level", default="INFO")
    f = sub.add_parser("fault", help="inject a fault into a running `serve`")
    f.add_argument("--state-dir", required=True)
    f.add_argument("cluster")
    f.add_argument("fault", choices=FAULTS)
    f.add_argument("args", nargs="*")
    st = sub.add_parser("status", help="show the clusters of a running `serve`")
    st.add_argument("--state-dir", required=True)
    args = p.parse_args(argv)
    if args.command == "serve":
        logging.basicConfig(level=getattr(logging, str(args.log_level).upper(), logging.INFO),
                            format="%(asctime)s %(levelname)s %(name)s: %(message)s")
        return _serve(args)
    if args.command == "fault":
        return _fault(args)
    return _status(args)


if __name__ == "__main__":
    sys.exit(main())
