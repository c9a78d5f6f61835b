"""The trace replay's speed (docs/simulation.md, *Speed*): CPU seconds per policy replaying the
first days of the ITP trace over the documented world (deploy/sim/clusters.yaml, seed 0), and
gpuorch's router decisions and snapshots per CPU second.

``python -m gpuorch.dev.bench.replay [--days N] [--policy P,...]`` (``--days 0``: the full trace);
``make bench`` runs the first 7 days (1 with ``--quick``). The trace is read from
``$GPUORCH_ITP_TRACE``, else ``../shared/data/traces/itp`` beside the checkout; without it the
bench says so and prints no rows. CPU time, not wall time: the figures hold on a shared machine.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from gpuorch.simulate.cli import DEFAULT_CLUSTERS
from gpuorch.simulate.engine import Simulation, background_jobs
from gpuorch.simulate.generator import GeneratorConfig, generate
from gpuorch.simulate.policies import POLICIES
from gpuorch.simulate.trace import read_trace
from gpuorch.simulate.world import load_world

from .rows import Row

DEFAULT_TRACE = Path(__file__).resolve().parents[3] / ".." / "shared" / "data" / "traces" / "itp"


def trace_path() -> Path:
    return Path(os.environ.get("GPUORCH_ITP_TRACE", str(DEFAULT_TRACE)))


def measure(days: float | None, policies: tuple[str, ...] = POLICIES, seed: int = 0) -> list[Row]:
    path = trace_path()
    if not path.exists():
        print(f"# replay: no trace at {path} (set GPUORCH_ITP_TRACE): skipped", file=sys.stderr)
        return []
    world = load_world(DEFAULT_CLUSTERS)
    trace, _ = read_trace(path, "itp")
    if days:
        trace = [t for t in trace if t.submit < days * 86400]
    cfg = GeneratorConfig.from_mapping(world.generator)
    jobs = [generate(t, i, seed, world.datasets, cfg) for i, t in enumerate(trace)]
    horizon = max((j.submit for j in jobs), default=0.0)
    background = background_jobs(world, seed, horizon)
    case = f"ITP {'full trace' if not days else f'first {days:g} days'}, {len(jobs):,} jobs"
    rows: list[Row] = []
    for name in policies:
        cpu0 = time.process_time()
        result = Simulation(world, jobs, name, seed=seed, background=background).run()
        cpu = time.process_time() - cpu0
        rows.append(Row("replay", case, f"{name}: CPU", cpu, "s"))
        if name == "gpuorch" and cpu > 0:
            rows.append(Row("replay", case, "gpuorch: router decisions per CPU second", result.decisions / cpu, "/s"))
            rows.append(Row("replay", case, "gpuorch: snapshots indexed per CPU second", result.snapshots_built / cpu, "/s"))
        print(f"# replay {name}: {cpu:.1f} s CPU", file=sys.stderr)
    return rows


def run(quick: bool = False) -> list[Row]:
    return measure(1.0 if quick else 7.0)


def main(argv: list[str] | None = None) -> int:
    from . import __main__ as table

    ap = argparse.ArgumentParser(prog="python -m gpuorch.dev.bench.replay", description=__doc__)
    ap.add_argument("--days", type=float, default=7.0, help="the first N days of the trace (0: all of it)")
    ap.add_argument("--policy", default="all", help=f"a comma list of {', '.join(POLICIES)}, or all")
    args = ap.parse_args(argv)
    names = POLICIES if args.policy == "all" else tuple(p.strip() for p in args.policy.split(",") if p.strip())
    unknown = [p for p in names if p not in POLICIES]
    if unknown:
        ap.error(f"unknown policy {', '.join(unknown)}; one of {', '.join(POLICIES)}")
    table.print_table(measure(args.days or None, names))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
