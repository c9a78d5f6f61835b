"""`gpuorch queues`: its arguments and what it runs (the CLI delegates here).

The shell only: it reads the event log and the latest capacity snapshots, folds the log as the
router does (`gpuorch_router.queues.fold`), and prints `gpuorch_router.queues.queues_report`
(pure) as a table or as JSON. Limits, budgets and fair share come from the admission policy the
router reads (the one the clusters file names), or from `--policy FILE`.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import msgspec
import yaml

from gpuorch.config import Settings
from gpuorch_proto.codec import load_policy_yaml
from gpuorch_proto.policy import AdmissionPolicy, PolicyError


class PolicyUnreadable(Exception):
    """The admission policy cannot be read: the message says which file and what is wrong."""


def add_queues_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--policy", type=Path, default=None, metavar="FILE",
        help="admission policy to show limits, budgets and fair share of (default: the one the clusters file names, as the router reads it)",
    )  # fmt: skip


def read_policy(s: Settings, given: Path | None) -> tuple[AdmissionPolicy, str]:
    """The admission policy and where it came from; `PolicyUnreadable` says what is wrong and where."""
    from gpuorch_router.service import admission_policy_path

    path = given
    if path is None:
        if s.registry is None:
            return AdmissionPolicy(), "none (no clusters file): one default queue, open to everyone, no limits"
        try:
            path = admission_policy_path(s.registry)
        except (OSError, yaml.YAMLError) as exc:
            raise PolicyUnreadable(f"clusters file {s.registry}: {exc}") from None
        if path is None:
            return AdmissionPolicy(), f"none named in {s.registry}: one default queue, open to everyone, no limits"
    try:
        return load_policy_yaml(path.read_text()), str(path)
    except OSError as exc:
        raise PolicyUnreadable(f"admission policy {path}: cannot read it: {exc.strerror or exc}") from None
    except (PolicyError, yaml.YAMLError) as exc:
        raise PolicyUnreadable(f"admission policy {path}: {exc}") from None


async def run_queues(ns: argparse.Namespace, s: Settings) -> int:
    from gpuorch.client import Client
    from gpuorch_router.queues import fold, queues_report, render

    from .commands import time_scale

    try:
        policy, source = read_policy(s, ns.policy)
    except PolicyUnreadable as exc:
        print(f"gpuorch queues: {exc}", file=sys.stderr)
        return 2
    async with Client(s.nats_url, s.names, creds=s.nats_creds) as c:
        events = await c.events()
        snapshots = await c.snapshots()
    gate, projection = fold(events)
    report = queues_report(
        policy, gate, projection, snapshots, time.time(), time_scale=time_scale(s), policy_source=source
    )
    if ns.output == "json":
        print(msgspec.json.format(msgspec.json.encode(report), indent=2).decode())
    else:
        print(render(report))
    return 0
