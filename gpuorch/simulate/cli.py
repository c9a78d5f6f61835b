"""`gpuorch simulate`: replay a job trace over configured clusters under one or more policies."""

from __future__ import annotations

import argparse
import dataclasses
import json
import multiprocessing
import os
import sys
import time
from collections.abc import Sequence
from concurrent.futures import Future, ProcessPoolExecutor, as_completed
from pathlib import Path

from . import whatif
from .engine import QUEUE_MODELS, BackgroundJob, RunResult, Simulation, background_jobs
from .generator import GeneratorConfig, SimJob, generate
from .mapping import TraceFormat, builtin_formats, load_mapping
from .plots import write_plots, write_whatif_plot
from .policies import POLICIES
from .progress import CLEAR, Progress
from .report import Row, document, markdown, summarize
from .trace import read_nodes, read_trace
from .world import World, load_world, world_from_nodes

DEFAULT_CLUSTERS = Path(__file__).resolve().parents[2] / "deploy" / "sim" / "clusters.yaml"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--trace", type=Path, required=True, help="a trace CSV, or a folder of them on one clock (ITP)")
    p.add_argument("--trace-format", default="itp", metavar="NAME|FILE",
                   help=f"the trace's mapping: {', '.join(builtin_formats())}, or a mapping file (docs/simulation.md)")
    p.add_argument("--clusters", type=Path, default=None,
                   help="clusters file (deploy/sim/clusters.yaml shape; the default without --nodes)")
    p.add_argument("--nodes", type=Path, default=None, metavar="CSV",
                   help="a node list: build the clusters from it, grouped as the mapping's nodes: section says")
    p.add_argument("--nodes-by", default=None, metavar="COLUMN",
                   help="with --nodes: one cluster per value of this column (instead of the mapping's grouping)")
    p.add_argument("--policy", default="all", help=f"one of {', '.join(POLICIES)}, a comma list, or all")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--limit", type=int, default=None, help="read only the first N jobs of each trace file")
    p.add_argument("--queue-model", default="inventory", choices=QUEUE_MODELS,
                   help="how snapshots estimate queue waits (docs/simulation.md)")
    p.add_argument("-o", "--output", choices=["table", "json"], default="table")
    p.add_argument("--plot", type=Path, default=None, help="write PNG plots into this folder")
    p.add_argument("--days", type=float, default=None, help="replay only the jobs submitted in the first N days of the trace")
    p.add_argument("--what-if", action="append", default=[], metavar="CHANGE",
                   help='a changed fleet, e.g. "east-h100:+16 nodes", "central-lab/dev:-4 nodes" (repeatable): '
                        "replay both fleets, print the difference per policy")
    p.add_argument("--workers", type=int, default=None, metavar="N",
                   help="replay N policies at once, one process each (default: the machine's cores; 1: one after another)")
    p.add_argument("--what-if-clusters", type=Path, default=None, metavar="FILE",
                   help="the what-if fleet as a second clusters file (--what-if changes apply on top of it)")


def _load(path: Path) -> World:
    try:
        return load_world(path)
    except (OSError, ValueError) as exc:
        raise SystemExit(f"gpuorch simulate: {exc}") from exc


#: what a worker process replays (set in the worker, before any replay: `_start_worker`)
_worker: dict[str, object] = {}


def _start_worker(world: World, jobs: Sequence[SimJob], seed: int, queue_model: str, background: Sequence[BackgroundJob]) -> None:
    _worker.update(world=world, jobs=jobs, seed=seed, queue_model=queue_model, background=background)


def _replay_one(name: str) -> tuple[Row, RunResult]:
    """One policy's replay in a worker process, its CPU time measured there."""
    w = _worker
    cpu0 = time.process_time()
    result = Simulation(w["world"], w["jobs"], name, seed=w["seed"], queue_model=w["queue_model"],  # type: ignore[arg-type]
                        background=w["background"]).run()  # type: ignore[arg-type]
    return summarize(result, cpu_seconds=time.process_time() - cpu0), result


def _workers(ns: argparse.Namespace, replays: int) -> int:
    if ns.workers is not None:
        return max(1, min(int(ns.workers), replays))
    if "fork" not in multiprocessing.get_all_start_methods():
        return 1
    return max(1, min(os.cpu_count() or 1, replays))


def _replay(world: World, jobs: Sequence[SimJob], names: Sequence[str], ns: argparse.Namespace,
            background: Sequence[BackgroundJob], progress: Progress | None, labels: Sequence[str]) -> tuple[list[Row], list[RunResult]]:
    workers = _workers(ns, len(names))
    if workers > 1:
        return _replay_parallel(world, jobs, names, ns, background, progress, labels, workers)
    rows, results = [], []
    span = max((j.submit for j in jobs), default=0.0)
    for name, label in zip(names, labels, strict=True):
        cpu0 = time.process_time()
        callback = progress.start(label, span) if progress is not None else None
        try:
            result = Simulation(world, jobs, name, seed=ns.seed, queue_model=ns.queue_model, background=background,
                                progress=callback).run()
        finally:
            if progress is not None:
                progress.finish()
        rows.append(summarize(result, cpu_seconds=time.process_time() - cpu0))
        results.append(result)
    return rows, results


def _fleet(ns: argparse.Namespace, fmt: TraceFormat) -> World:
    """The world: the clusters file, or the node list grouped by the mapping (the clusters file,
    if given, lends its registries, background, datasets and generator by cluster name)."""
    if ns.nodes is None:
        if ns.nodes_by:
            raise SystemExit("gpuorch simulate: --nodes-by groups a node list: give --nodes too")
        return _load(ns.clusters or DEFAULT_CLUSTERS)
    base = _load(ns.clusters) if ns.clusters else None
    try:
        if ns.nodes_by:
            if fmt.nodes is None:
                raise ValueError(f"{fmt.source or fmt.name}: nodes: missing: this mapping does not describe a node list")
            fmt = dataclasses.replace(fmt, nodes=dataclasses.replace(fmt.nodes, by_column=ns.nodes_by, prefix="", rules=()))
        rows = read_nodes(ns.nodes, fmt)
        assert fmt.nodes is not None
        return world_from_nodes(rows, fmt.nodes.registry, fmt.source or fmt.name, base)
    except (OSError, ValueError) as exc:
        raise SystemExit(f"gpuorch simulate: {exc}") from exc


def _replay_parallel(world: World, jobs: Sequence[SimJob], names: Sequence[str], ns: argparse.Namespace,
                     background: Sequence[BackgroundJob], progress: Progress | None, labels: Sequence[str],
                     workers: int) -> tuple[list[Row], list[RunResult]]:
    """The replays in `workers` forked processes (each replay is independent and seeded: the same
    rows as one after another). The world and jobs are inherited by the fork, not sent; each result
    comes back with its CPU time. On a terminal, a line says which replays are done (a worker's
    replay has no per-job progress)."""
    ctx = multiprocessing.get_context("fork")
    with ProcessPoolExecutor(workers, mp_context=ctx, initializer=_start_worker,
                             initargs=(world, jobs, ns.seed, ns.queue_model, background)) as pool:
        futures: list[Future[tuple[Row, RunResult]]] = [pool.submit(_replay_one, name) for name in names]
        if progress is not None:
            label_of = dict(zip(futures, labels, strict=True))
            done: list[str] = []
            progress.write(f"{CLEAR}0/{len(futures)} replays done in {workers} processes")
            for fut in as_completed(futures):
                done.append(label_of[fut])
                progress.write(f"{CLEAR}{len(done)}/{len(futures)} replays done in {workers} processes ({', '.join(done)})")
            progress.write(CLEAR)
        out = [fut.result() for fut in futures]
    return [r for r, _ in out], [res for _, res in out]


def run(ns: argparse.Namespace) -> int:
    names = list(POLICIES) if ns.policy == "all" else [p.strip() for p in ns.policy.split(",") if p.strip()]
    bad = [p for p in names if p not in POLICIES]
    if bad:
        raise SystemExit(f"unknown policy {', '.join(bad)}; one of {', '.join(POLICIES)}")
    if ns.days is not None and not ns.days > 0:
        raise SystemExit(f"gpuorch simulate: --days {ns.days}: give a positive number of days")
    try:
        fmt = load_mapping(ns.trace_format)
    except ValueError as exc:
        raise SystemExit(f"gpuorch simulate: {exc}") from exc
    world = _fleet(ns, fmt)
    what_world: World | None = None
    if ns.what_if or ns.what_if_clusters:
        try:
            changes = [whatif.parse_change(text) for text in ns.what_if]
            start = _load(ns.what_if_clusters) if ns.what_if_clusters else world
            what_world = whatif.apply(start, changes, str(ns.what_if_clusters or ns.nodes or ns.clusters or DEFAULT_CLUSTERS))
        except whatif.WhatIfError as exc:
            raise SystemExit(f"gpuorch simulate: {exc}") from exc
    wall0 = time.perf_counter()
    try:
        trace, stats = read_trace(ns.trace, fmt, limit=ns.limit)
    except (OSError, ValueError) as exc:
        raise SystemExit(f"gpuorch simulate: {exc}") from exc
    if ns.days is not None:
        trace = [t for t in trace if t.submit < ns.days * 86400]  # sorted: the indices (and so attributes) stay
    try:
        cfg = GeneratorConfig.from_mapping({**fmt.generator, **world.generator})  # the clusters file's win
        jobs = [generate(t, i, ns.seed, world.datasets, cfg, fmt.sharing) for i, t in enumerate(trace)]
    except (TypeError, ValueError) as exc:
        raise SystemExit(f"gpuorch simulate: {exc}") from exc
    horizon = max((j.submit for j in jobs), default=0.0)
    progress = Progress(_write_stderr, time.monotonic) if ns.output != "json" and sys.stderr.isatty() else None
    if what_world is not None:
        return _run_what_if(ns, names, world, what_world, jobs, stats.skipped, horizon, progress, wall0, fmt)
    n = len(names)
    rows, results = _replay(world, jobs, names, ns, background_jobs(world, ns.seed, horizon), progress,
                            [f"{name} ({k}/{n})" for k, name in enumerate(names, 1)])
    meta = {"trace": str(ns.trace), "trace_format": fmt.name, "files": len(stats.files), "rows": stats.rows,
            "skipped": stats.skipped, "jobs": len(jobs), "clusters": [c.name for c in world.clusters],
            "gpus": sum(c.gpus for c in world.clusters), "seed": ns.seed, "queue_model": ns.queue_model,
            "snapshot_interval_s": world.snapshot_interval, "wall_seconds": round(time.perf_counter() - wall0, 1)}
    if ns.days is not None:
        meta["days"] = ns.days
    if ns.nodes is not None:
        meta["nodes"] = {"file": str(ns.nodes), "nodes": sum(len(c.nodes) for c in world.clusters),
                         "shared_nodes": sum(1 for c in world.clusters for n in c.nodes if n.sharing)}
    meta["fractional_jobs"] = sum(1 for j in jobs if j.sharing is not None)
    plots = [str(p) for p in write_plots(results, ns.plot)] if ns.plot else []
    if ns.output == "json":
        doc = document(rows, meta, fmt)
        doc["plots"] = plots
        print(json.dumps(doc, indent=2, sort_keys=True))
        return 0
    span = max((j.submit for j in jobs), default=0.0) / 86400
    fields = document(rows, meta, fmt)["fields"]
    print(f"trace {ns.trace} ({fmt.name}): {len(jobs):,} jobs over {span:.1f} days"
          f" ({stats.skipped} rows skipped); {len(world.clusters)} clusters, {meta['gpus']:,} GPUs; seed {ns.seed}")
    if ns.nodes is not None:
        print(f"clusters from the node list {ns.nodes}: {meta['nodes']['nodes']:,} nodes "
              f"({meta['nodes']['shared_nodes']:,} sharing their GPUs); {meta['fractional_jobs']:,} fractional jobs")
    print(f"real fields: {', '.join(fields['real'])}")
    print(f"generated (seeded): {', '.join(fields['generated'])}")
    print()
    print(markdown(rows))
    print()
    print(f"wall {meta['wall_seconds']} s; CPU per policy: " + ", ".join(f"{r.policy} {r.cpu_seconds:.0f} s" for r in rows))
    for p in plots:
        print(f"plot: {p}")
    return 0


def _write_stderr(text: str) -> None:
    sys.stderr.write(text)
    sys.stderr.flush()


def _run_what_if(ns: argparse.Namespace, names: Sequence[str], world: World, what_world: World, jobs: Sequence[SimJob],
                 skipped: int, horizon: float, progress: Progress | None, wall0: float, fmt: TraceFormat) -> int:
    """Both fleets over the same jobs and seed, every policy; the difference per policy."""
    n = 2 * len(names)
    base_rows, base_results = _replay(world, jobs, names, ns, background_jobs(world, ns.seed, horizon), progress,
                                      [f"baseline {name} ({k}/{n})" for k, name in enumerate(names, 1)])
    what_rows, what_results = _replay(what_world, jobs, names, ns, whatif.background_for(world, what_world, ns.seed, horizon),
                                      progress, [f"what-if {name} ({k}/{n})" for k, name in enumerate(names, len(names) + 1)])
    deltas = whatif.diff({r.policy: whatif.measures(r, res, horizon) for r, res in zip(base_rows, base_results, strict=True)},
                         {r.policy: whatif.measures(r, res, horizon) for r, res in zip(what_rows, what_results, strict=True)})
    changes = list(ns.what_if)
    title = "; ".join([*([f"clusters {ns.what_if_clusters}"] if ns.what_if_clusters else []), *changes])
    plots = [str(write_whatif_plot(base_results, what_results, deltas, ns.plot, title=title))] if ns.plot else []
    wall = round(time.perf_counter() - wall0, 1)
    if ns.output == "json":
        def fleet(w: World, rows: Sequence[Row]) -> dict[str, object]:
            return {"clusters": [c.name for c in w.clusters], "nodes": sum(len(c.nodes) for c in w.clusters),
                    "gpus": sum(c.gpus for c in w.clusters), "policies": [r.as_dict() for r in rows]}

        print(json.dumps({
            "trace": str(ns.trace), "trace_format": fmt.name, "jobs": len(jobs), "skipped": skipped, "seed": ns.seed,
            "days": ns.days, "queue_model": ns.queue_model, "utilization_window_s": horizon,
            "baseline": {"clusters_file": str(ns.nodes or ns.clusters or DEFAULT_CLUSTERS), **fleet(world, base_rows)},
            "what_if": {"clusters_file": str(ns.what_if_clusters or ns.nodes or ns.clusters or DEFAULT_CLUSTERS), "changes": changes, **fleet(what_world, what_rows)},
            "diff": [d.as_dict() for d in deltas], "plots": plots, "wall_seconds": wall,
        }, indent=2, sort_keys=True))
        return 0
    print(f"trace {ns.trace} ({fmt.name}): {len(jobs):,} jobs over {horizon / 86400:.1f} days"
          f"{f' (first {ns.days:g} days)' if ns.days else ''}; seed {ns.seed}; the same jobs on both fleets")
    print(f"baseline {ns.nodes or ns.clusters or DEFAULT_CLUSTERS}: {whatif.describe_fleet(world)}")
    print(f"what-if  {title}: {whatif.describe_fleet(what_world)}")
    print()
    print(whatif.markdown(deltas))
    print()
    print(f"utilization: busy GPUs (trace and background) / the fleet's GPUs, over the {horizon / 86400:.1f} days of arrivals")
    print(f"wall {wall} s; CPU per policy (baseline, what-if): "
          + ", ".join(f"{b.policy} {b.cpu_seconds:.0f}+{w.cpu_seconds:.0f} s" for b, w in zip(base_rows, what_rows, strict=True)))
    for p in plots:
        print(f"plot: {p}")
    return 0
