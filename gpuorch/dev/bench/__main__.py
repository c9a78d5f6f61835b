"""``python -m gpuorch.dev.bench [--quick] [--only NAME] [NAME...]``: run the benches and print a table."""

from __future__ import annotations

import argparse
import importlib
import platform
import sys
import time
from collections.abc import Callable
from typing import Any

from . import BENCHES
from .rows import Row


def _load(path: str) -> Callable[..., list[Any]]:
    module, _, func = path.partition(":")
    fn: Callable[..., list[Any]] = getattr(importlib.import_module(module), func or "run")
    return fn


def _fmt(value: float) -> str:
    if isinstance(value, int):
        return f"{value:,}"
    if value >= 100:
        return f"{value:,.0f}"
    if value >= 10:
        return f"{value:.1f}"
    return f"{value:.3g}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m gpuorch.dev.bench", description=__doc__)
    ap.add_argument("--quick", action="store_true", help="fewer iterations (for CI smoke runs)")
    ap.add_argument("--only", action="append", default=[], help="run only benches whose path contains this")
    ap.add_argument("names", nargs="*", help="the same as --only NAME (e.g. `storage`)")
    args = ap.parse_args(argv)
    only = [*args.only, *args.names]
    print(f"# gpuorch benches on Python {platform.python_version()} / {platform.machine()}")
    rows: list[Row] = []
    for path in BENCHES:
        if only and not any(o in path for o in only):
            continue
        t0 = time.perf_counter()
        rows += _load(path)(quick=args.quick)
        print(f"# {path}: {time.perf_counter() - t0:.1f}s", file=sys.stderr)
    print_table(rows)
    return 0


def print_table(rows: list[Row]) -> None:
    table = [(r.bench, r.case, r.metric, _fmt(r.value), r.unit) for r in rows]
    header = ("bench", "case", "metric", "value", "unit")
    widths = [max(len(row[i]) for row in [header, *table]) for i in range(len(header))]
    for row in [header, tuple("-" * w for w in widths), *table]:
        print(
            "  ".join(
                c.rjust(w) if i == 3 else c.ljust(w) for i, (c, w) in enumerate(zip(row, widths, strict=True))
            ).rstrip()
        )


if __name__ == "__main__":
    raise SystemExit(main())
