"""`gpuorch simulate`: replay a job trace over configured clusters under one or more policies."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from .engine import QUEUE_MODELS, Simulation
from .generator import GeneratorConfig, generate
from .plots import write_plots
from .policies import POLICIES
from .report import document, markdown, summarize
from .trace import PRESETS, read_trace
from .world import load_world

DEFAULT_CLUSTERS = Path(__file__).resolve().parents[2] / "deploy" / "sim" / "clusters.yaml"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--trace", type=Path, required=True, help="a trace CSV, or a folder of them on one clock (ITP)")
    p.add_argument("--trace-format", default="itp", choices=sorted(PRESETS), help="column mapping (docs/simulation.md)")
    p.add_argument("--clusters", type=Path, default=DEFAULT_CLUSTERS, help="clusters file (deploy/sim/clusters.yaml shape)")
    p.add_argument("--policy", default="all", help=f"one of {', '.join(POLICIES)}, a comma list, or all")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--limit", type=int, default=None, help="read only the first N jobs of each trace file")
    p.add_argument("--queue-model", default="pooled", choices=QUEUE_MODELS,
                   help="how snapshots estimate queue waits (docs/simulation.md)")
    p.add_argument("-o", "--output", choices=["table", "json"], default="table")
    p.add_argument("--plot", type=Path, default=None, help="write PNG plots into this folder")


def run(ns: argparse.Namespace) -> int:
    names = list(POLICIES) if ns.policy == "all" else [p.strip() for p in ns.policy.split(",") if p.strip()]
    bad = [p for p in names if p not in POLICIES]
    if bad:
        raise SystemExit(f"unknown policy {', '.join(bad)}; one of {', '.join(POLICIES)}")
    world = load_world(ns.clusters)
    wall0 = time.perf_counter()
    trace, stats = read_trace(ns.trace, ns.trace_format, limit=ns.limit)
    cfg = GeneratorConfig.from_mapping(world.generator)
    jobs = [generate(t, i, ns.seed, world.datasets, cfg) for i, t in enumerate(trace)]
    rows, results = [], []
    for name in names:
        cpu0 = time.process_time()
        result = Simulation(world, jobs, name, seed=ns.seed, queue_model=ns.queue_model).run()
        rows.append(summarize(result, cpu_seconds=time.process_time() - cpu0))
        results.append(result)
    meta = {"trace": str(ns.trace), "trace_format": ns.trace_format, "files": len(stats.files), "rows": stats.rows,
            "skipped": stats.skipped, "jobs": len(jobs), "clusters": [c.name for c in world.clusters],
            "gpus": sum(c.gpus for c in world.clusters), "seed": ns.seed, "queue_model": ns.queue_model,
            "snapshot_interval_s": world.snapshot_interval, "wall_seconds": round(time.perf_counter() - wall0, 1)}
    plots = [str(p) for p in write_plots(results, ns.plot)] if ns.plot else []
    if ns.output == "json":
        doc = document(rows, meta)
        doc["plots"] = plots
        print(json.dumps(doc, indent=2, sort_keys=True))
        return 0
    span = max((j.submit for j in jobs), default=0.0) / 86400
    print(f"trace {ns.trace} ({ns.trace_format}): {len(jobs):,} jobs over {span:.1f} days"
          f" ({stats.skipped} rows skipped); {len(world.clusters)} clusters, {meta['gpus']:,} GPUs; seed {ns.seed}")
    print(f"real fields: {', '.join(document(rows, meta)['fields']['real'])}; everything else generated (seeded)")
    print()
    print(markdown(rows))
    print()
    print(f"wall {meta['wall_seconds']} s; CPU per policy: " + ", ".join(f"{r.policy} {r.cpu_seconds:.0f} s" for r in rows))
    for p in plots:
        print(f"plot: {p}")
    return 0
