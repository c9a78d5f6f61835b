"""Export the contract as JSON Schema files: `python -m gpuorch_proto.schema [--check] DIR`."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import msgspec

from .events import Event
from .inventory import ClusterRegistryEntry, ClusterSnapshot
from .routing import RoutingDecision
from .state import FenceRecord, OwnerLease
from .workload import Workload

EXPORTS: dict[str, Any] = {
    "workload.schema.json": Workload,
    "event.schema.json": Event,
    "cluster-snapshot.schema.json": ClusterSnapshot,
    "cluster-registry-entry.schema.json": ClusterRegistryEntry,
    "routing-decision.schema.json": RoutingDecision,
    "fence-record.schema.json": FenceRecord,
    "owner-lease.schema.json": OwnerLease,
}


def render() -> dict[str, str]:
    out = {}
    for fname, tp in EXPORTS.items():
        schema = msgspec.json.schema(tp)
        schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
        schema["$id"] = f"https://gpuorch.dev/schemas/v1/{fname}"
        out[fname] = json.dumps(schema, indent=2, sort_keys=True) + "\n"
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("dir", type=Path)
    ap.add_argument("--check", action="store_true", help="fail if the files differ from the contract")
    ns = ap.parse_args(argv)
    rendered = render()
    if ns.check:
        bad = [f for f, text in rendered.items() if not (ns.dir / f).exists() or (ns.dir / f).read_text() != text]
        if bad:
            print(f"schema drift in {bad}: run `make schemas` and commit", file=sys.stderr)
            return 1
        return 0
    ns.dir.mkdir(parents=True, exist_ok=True)
    for f, text in rendered.items():
        (ns.dir / f).write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
