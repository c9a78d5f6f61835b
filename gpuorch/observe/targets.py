"""Prometheus scrape targets of a running embedded system (docs/operations.md, "Alert rules,
scrape config, dashboard").

Each service writes where it serves `/metrics` to `<state>/metrics/<service>-<pid>.json` when it
starts (`gpuorch.observe.metrics.start_server`); `<state>/system.json` names the processes running
now (`gpuorch up` and its supervisor keep it current across restarts). `targets` joins the two by
pid, so the endpoint of a process that died or was restarted is left out; `file_sd` and `config`
render the result as Prometheus reads it. Pure; `main` is the shell:

    python -m gpuorch.observe.targets [--state DIR] [--format file_sd|config] [-o FILE]
           [--rules FILE] [--scrape-interval 15s] [--evaluation-interval 15s]

`file_sd` is a `file_sd_configs` file (Prometheus re-reads it when it changes: run this again
after a restart moves a service to a new port); `config` a whole `prometheus.yml` with the rules.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import yaml

from gpuorch.system import SERVICES

JOB = "gpuorch"
RULES = Path(__file__).resolve().parent.parent.parent / "deploy" / "prometheus" / "rules.yml"


class TargetsError(ValueError):
    pass


@dataclass(frozen=True)
class Target:
    process: str  # as system.json names it: router, router-1, ...
    service: str  # router
    address: str  # host:port
    path: str  # /metrics


def targets(system: Mapping[str, Any], endpoints: Iterable[Mapping[str, Any]]) -> tuple[list[Target], list[str]]:
    """The service processes of `system` (a system.json document) with their endpoint (the
    metrics files' documents: service, pid, url), in process order; and the processes that have
    none (not started yet, or `GPUORCH_METRICS_PORT=off`). Endpoints of other pids are stale."""
    by_pid: dict[int, Mapping[str, Any]] = {}
    for doc in endpoints:
        try:
            by_pid[int(doc["pid"])] = doc
        except (KeyError, TypeError, ValueError) as exc:
            raise TargetsError(f"a metrics endpoint without a pid: {doc!r}") from exc
    found, missing = [], []
    procs = system.get("procs")
    if not isinstance(procs, Mapping):
        raise TargetsError("system.json has no `procs` mapping: is this a gpuorch state directory?")
    for name, proc in sorted(procs.items(), key=lambda kv: _order(kv[0])):
        service = name.partition("-")[0]
        if service not in SERVICES:
            continue  # nats, localkube: no /metrics
        try:
            pid = int(proc["pid"])
        except (KeyError, TypeError, ValueError) as exc:
            raise TargetsError(f"system.json: process {name} has no pid: {proc!r}") from exc
        ep = by_pid.get(pid)
        if ep is None or ep.get("service") != service:  # none yet, or an old file of a reused pid
            missing.append(name)
            continue
        try:
            url = urlsplit(str(ep.get("url", "")))
            port = url.port
        except ValueError:
            port = None
        if url.scheme not in ("http", "https") or not url.hostname or port is None:
            raise TargetsError(f"process {name} (pid {pid}): metrics url {ep.get('url')!r} is not http://host:port/path")
        found.append(Target(name, service, f"{url.hostname}:{port}", url.path or "/metrics"))
    return found, missing


def _order(name: str) -> tuple[int, str]:
    base = name.partition("-")[0]
    return (SERVICES.index(base) if base in SERVICES else len(SERVICES), name)


def file_sd(found: Iterable[Target]) -> list[dict[str, Any]]:
    """A `file_sd_configs` document: one group per process, labelled `service` and `process`."""
    out = []
    for t in found:
        labels = {"service": t.service, "process": t.process}
        if t.path != "/metrics":
            labels["__metrics_path__"] = t.path
        out.append({"targets": [t.address], "labels": labels})
    return out


def config(found: Iterable[Target], *, rules: Iterable[str | Path] = (), scrape_interval: str = "15s",
           evaluation_interval: str = "15s") -> dict[str, Any]:  # fmt: skip
    """A whole `prometheus.yml`: job `gpuorch` over the targets (static), and the rule files."""
    doc: dict[str, Any] = {"global": {"scrape_interval": scrape_interval, "evaluation_interval": evaluation_interval}}
    rule_files = [str(r) for r in rules]
    if rule_files:
        doc["rule_files"] = rule_files
    doc["scrape_configs"] = [{"job_name": JOB, "static_configs": file_sd(found)}]
    return doc


def read(state_dir: Path) -> tuple[list[Target], list[str]]:
    """`targets` of the system running in `state_dir` (its system.json and metrics files)."""
    path = state_dir / "system.json"
    try:
        system = json.loads(path.read_text())
    except FileNotFoundError as exc:
        raise TargetsError(f"{path} does not exist: no system is running with this state directory (gpuorch up)") from exc
    except json.JSONDecodeError as exc:
        raise TargetsError(f"{path}: not JSON ({exc})") from exc
    endpoints = []
    for f in sorted((state_dir / "metrics").glob("*.json")):
        try:
            endpoints.append(json.loads(f.read_text()))
        except (OSError, json.JSONDecodeError) as exc:
            raise TargetsError(f"{f}: unreadable metrics endpoint ({exc})") from exc
    return targets(system, endpoints)


def main(argv: list[str] | None = None) -> int:
    from gpuorch.config import Settings

    ap = argparse.ArgumentParser(prog="python -m gpuorch.observe.targets", description=__doc__.split("\n\n")[0])
    ap.add_argument("--state", type=Path, default=Settings.default_state_dir(), help="the system's state directory")
    ap.add_argument("--format", choices=("file_sd", "config"), default="file_sd")
    ap.add_argument("-o", "--out", type=Path, help="write here (atomically) instead of standard output")
    ap.add_argument("--rules", action="append", type=Path, help=f"rule file for --format config (default {RULES.name} of the checkout)")
    ap.add_argument("--scrape-interval", default="15s")
    ap.add_argument("--evaluation-interval", default="15s")
    ns = ap.parse_args(argv)
    try:
        found, missing = read(ns.state)
    except TargetsError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for name in missing:
        print(f"warning: process {name} has no metrics endpoint yet (starting, or GPUORCH_METRICS_PORT=off)", file=sys.stderr)
    if ns.format == "file_sd":
        text = json.dumps(file_sd(found), indent=2) + "\n"
    else:
        rules = ns.rules if ns.rules is not None else ([RULES] if RULES.exists() else [])
        doc = config(found, rules=[r.resolve() for r in rules], scrape_interval=ns.scrape_interval,
                     evaluation_interval=ns.evaluation_interval)  # fmt: skip
        text = yaml.safe_dump(doc, sort_keys=False)
    if ns.out is None:
        sys.stdout.write(text)
    else:
        tmp = ns.out.with_name(ns.out.name + ".tmp")  # Prometheus never reads half a file
        tmp.write_text(text)
        tmp.replace(ns.out)
    return 0 if found else 1


if __name__ == "__main__":
    sys.exit(main())
