"""Deterministic simulation of the whole control plane, many schedules, checked by the invariants.

    python -m gpuorch.dev.dst [--schedules N] [--seed S] [--jobs J]
    python -m gpuorch.dev.dst --seed S --trace        # replay one schedule exactly, print its steps
    python -m gpuorch.dev.dst --mutant NAME           # a one-line mutant of production code: its first failing seed
    python -m gpuorch.dev.dst --mutants all           # every mutant (or NAME,NAME): seed, invariant, schedules

Prints the faults injected by kind, the violations by invariant with the seeds that found them,
and for the first failing seed the command that replays it. Exit status 1 when any schedule
violated an invariant. See docs/simulation-testing.md.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections import Counter
from collections.abc import Iterable, Iterator
from concurrent.futures import ProcessPoolExecutor

from .mutants import MUTANTS, MutantError, applied
from .sim import Result, run

DEFAULT_SCHEDULES = 10_000


def _batch(seeds: list[int], mutant: str | None = None) -> list[Result]:
    with applied(mutant):
        return [run(s) for s in seeds]


def results(seeds: list[int], jobs: int, mutant: str | None = None) -> Iterator[Result]:
    """Every schedule's result, in seed order (with `jobs` worker processes)."""
    if jobs <= 1 or len(seeds) < 50:
        with applied(mutant):
            for s in seeds:
                yield run(s)
        return
    chunk = 100
    parts = [seeds[i : i + chunk] for i in range(0, len(seeds), chunk)]
    with ProcessPoolExecutor(max_workers=jobs) as pool:
        for part in pool.map(_batch, parts, [mutant] * len(parts)):
            yield from part


def summarize(found: Iterable[Result], *, progress: bool = False, mutant: str | None = None) -> tuple[int, Counter[str], dict[str, list[int]]]:
    """(schedules, faults by kind, seeds per violated invariant) over `found`, printed as it goes."""
    faults: Counter[str] = Counter()
    bad: dict[str, list[int]] = {}
    n = steps = unsettled = 0
    loop_errors: Counter[str] = Counter()
    t0 = time.monotonic()
    for r in found:
        n += 1
        steps += r.steps
        faults.update(r.faults)
        unsettled += not r.settled
        for e in r.loop_errors:
            loop_errors[e.split(":", 1)[0]] += 1
        for kind in sorted({v.invariant for v in r.violations}):
            bad.setdefault(kind, []).append(r.seed)
        if progress and n % 1000 == 0:
            print(f"  {n} schedules, {n / (time.monotonic() - t0):.0f}/s, violations so far: {sum(len(v) for v in bad.values())}", file=sys.stderr, flush=True)
    dt = time.monotonic() - t0
    print(f"simulated schedules: {n} in {dt:.1f}s ({n / dt if dt else 0:.0f}/s), {steps} steps, {unsettled} not settled by the horizon")
    print("faults injected: " + (", ".join(f"{k}={faults[k]}" for k in sorted(faults)) or "none"))
    print(f"schedules with invariant violations: {len({s for v in bad.values() for s in v})}")
    flag = f" --mutant {mutant}" if mutant else ""
    for kind, seeds in sorted(bad.items()):
        more = f" ... ({len(seeds)} seeds)" if len(seeds) > 10 else ""
        print(f"  {kind}: seeds {', '.join(map(str, seeds[:10]))}{more}")
        print(f"    replay: python -m gpuorch.dev.dst --seed {seeds[0]} --trace{flag}")
    if loop_errors:
        print("service loop errors (logged by the shell, not violations): " + ", ".join(f"{k} x{v}" for k, v in loop_errors.most_common(5)))
    if bad:
        first = min(s for v in bad.values() for s in v)
        print(f"\nthe steps that led to the first one (seed {first}; the whole trace: --seed {first} --trace{flag}):")
        print("\n".join(story(first, mutant)))
    return n, faults, bad


def story(seed: int, mutant: str | None = None, limit: int = 60) -> list[str]:
    """The trace of `seed`, cut to the faults, the crashes and the steps about the violating workloads."""
    with applied(mutant):
        r = run(seed, trace=True)
    assert r.trace is not None
    ids = {v.workload_id for v in r.violations}
    keep = [
        line for line in r.trace
        if line.startswith(("VIOLATION", "---")) or " chaos: " in line or " sim: " in line
        or (any(i in line for i in ids) and " deliver " not in line)
    ]
    return keep if len(keep) <= limit else [*keep[: limit // 3], f"   ... {len(keep) - limit} lines ...", *keep[-(limit - limit // 3) :]]


def _first_hit(seeds: list[int], mutant: str, invariant: str) -> tuple[int | None, int, str]:
    """(the first of `seeds` whose schedule breaks `invariant` with `mutant`, schedules run, the violation)."""
    n = 0
    with applied(mutant):
        for s in seeds:
            n += 1
            hit = next((v for v in run(s).violations if v.invariant == invariant), None)
            if hit is not None:
                return s, n, f"{hit.workload_id}: {hit.detail}"
    return None, n, ""


def search(mutant: str, limit: int = DEFAULT_SCHEDULES, jobs: int = 1, chunk: int = 20) -> tuple[int | None, int, str]:
    """The first seed from 1 to `limit` whose schedule breaks the mutant's invariant (None: none),
    the schedules it took (the seed itself: every seed before it was run), and the violation."""
    invariant = MUTANTS[mutant].invariant
    if jobs <= 1:
        return _first_hit(list(range(1, limit + 1)), mutant, invariant)
    parts = [list(range(i, min(i + chunk, limit + 1))) for i in range(1, limit + 1, chunk)]
    with ProcessPoolExecutor(max_workers=jobs) as pool:
        for k in range(0, len(parts), jobs):  # `jobs` chunks at a time, the first hit in seed order
            batch = parts[k : k + jobs]
            for seed, _, detail in pool.map(_first_hit, batch, [mutant] * len(batch), [invariant] * len(batch)):
                if seed is not None:
                    return seed, seed, detail
    return None, limit, ""


def campaign(names: list[str], limit: int, jobs: int) -> int:
    """Search every mutant in `names`; print its seed, invariant, schedules and replay command.
    Exit status 1 when one is not found within `limit` schedules."""
    missed = 0
    print(f"mutants of production code ({len(names)}), each searched from seed 1 up to {limit} schedules:")
    for name in names:
        m = MUTANTS[name]
        t0 = time.monotonic()
        print(f"  {name}: {m.module}: {m.original.strip()!r} -> {m.replacement.strip()!r}")
        try:
            seed, n, detail = search(name, limit, jobs)
        except MutantError as exc:
            missed += 1
            print(f"    REFUSED: {exc}")
            continue
        dt = time.monotonic() - t0
        if seed is None:
            missed += 1
            print(f"    NOT FOUND in {n} schedules ({dt:.1f}s): {m.invariant} never broken")
            continue
        moved = "" if seed == m.seed else f" (recorded: seed {m.seed}; update gpuorch.dev.dst.mutants)"
        print(f"    found: {m.invariant} at seed {seed}, after {n} schedules ({dt:.1f}s){moved}")
        print(f"      {detail[:160]}")
        print(f"    replay: python -m gpuorch.dev.dst --seed {seed} --trace --mutant {name}")
    print(f"mutants found: {len(names) - missed} of {len(names)}")
    return 1 if missed else 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m gpuorch.dev.dst", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--schedules", type=int, default=DEFAULT_SCHEDULES)
    ap.add_argument("--seed", type=int, default=1, help="first seed (with --trace: the one seed to replay)")
    ap.add_argument("--trace", action="store_true", help="replay the one schedule of --seed and print every step")
    ap.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1), help="worker processes")
    ap.add_argument("--mutant", choices=sorted(MUTANTS), help="a one-line mutant of production code (gpuorch.dev.dst.mutants): "
                    "search its first failing seed (up to --schedules), or with --trace replay --seed under it")
    ap.add_argument("--mutants", metavar="all|NAME,...", help="search each mutant's first failing seed (up to --schedules)")
    ap.add_argument("--run-all", action="store_true", help="with --mutant: run every schedule under it, not stop at the first hit")
    ns = ap.parse_args(argv)
    if ns.mutants is not None:
        names = sorted(MUTANTS) if ns.mutants == "all" else [x.strip() for x in ns.mutants.split(",") if x.strip()]
        unknown = [x for x in names if x not in MUTANTS]
        if unknown or not names:
            ap.error(f"--mutants: unknown {', '.join(unknown) or '(none given)'}; mutants: all, {', '.join(sorted(MUTANTS))}")
        return campaign(names, ns.schedules, ns.jobs)
    if ns.mutant is not None and not ns.trace and not ns.run_all:
        return campaign([ns.mutant], ns.schedules, ns.jobs)
    if ns.trace:
        with applied(ns.mutant):
            r = run(ns.seed, trace=True)
        assert r.trace is not None
        print("\n".join(r.trace))
        return 1 if r.violations else 0
    print(f"deterministic simulation: {ns.schedules} schedules from seed {ns.seed}" + (f", mutant {ns.mutant}" if ns.mutant else ""))
    _, _, bad = summarize(results(list(range(ns.seed, ns.seed + ns.schedules)), ns.jobs, ns.mutant), progress=True, mutant=ns.mutant)
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
