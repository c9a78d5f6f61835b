"""Deterministic simulation of the whole control plane, many schedules, checked by the invariants.

    python -m gpuorch.dev.dst [--schedules N] [--seed S] [--jobs J]
    python -m gpuorch.dev.dst --seed S --trace        # replay one schedule exactly, print its steps

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

from .mutants import MUTANTS, applied
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


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m gpuorch.dev.dst", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--schedules", type=int, default=DEFAULT_SCHEDULES)
    ap.add_argument("--seed", type=int, default=1, help="first seed (with --trace: the one seed to replay)")
    ap.add_argument("--trace", action="store_true", help="replay the one schedule of --seed and print every step")
    ap.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1), help="worker processes")
    ap.add_argument("--mutant", choices=sorted(MUTANTS), help="run with a deliberate bug in a core (gpuorch.dev.dst.mutants)")
    ns = ap.parse_args(argv)
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
