"""The security mutation campaign: each protection removed on its own must fail its attack tests.

    python -m gpuorch.dev.security_mutants [--mutant NAME ...] [--jobs J] [--no-baseline]
    python -m gpuorch.dev.security_mutants --list

First the attack tests run as they are (the baseline: every one must pass), then, for each mutant
of `gpuorch.dev.security_mutants.mutants`, only the tests that target it run against an embedded
system started with it (a real nats-server under the generated permissions, as mutated; the
services with their receivers, as mutated). A mutant is *killed* when each of its tests fails in
its call or teardown; it *survived* when one of them passed; *error* when a test could not run
(its setup failed: the system did not start, say). Prints the table; exit status 1 unless the
baseline passed and every mutant was killed. Each run's output: `--logs` (.gpuorch/security-mutants).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from gpuorch.system import SECURITY_MUTANT_ENV

from .mutants import MUTANTS, NOT_A_PROTECTION

ROOT = Path(__file__).resolve().parents[3]
BASELINE = "(none)"


@dataclass(frozen=True)
class Run:
    mutant: str  # BASELINE: no mutant
    tests: tuple[str, ...]
    result: str  # killed, survived, error; for the baseline: passed, failed
    failed: tuple[str, ...]  # the tests that failed (call or teardown)
    seconds: float
    log: Path


def short(nodeid: str) -> str:
    return nodeid.rpartition("::")[2]


def verdict(nodeid: str, phases: dict[str, str] | None) -> str:
    """passed, failed (in its call or teardown) or unrun (not collected, or its setup did not pass)."""
    if not phases or phases.get("setup") != "passed":
        return "unrun"
    if "failed" in (phases.get("call"), phases.get("teardown")):
        return "failed"
    return "passed" if phases.get("call") == "passed" else "unrun"


def run(mutant: str, tests: tuple[str, ...], logs: Path) -> Run:
    slug = "baseline" if mutant == BASELINE else mutant
    log, outcomes, basetemp = logs / f"{slug}.log", logs / f"{slug}.json", logs / f"{slug}.tmp"
    outcomes.unlink(missing_ok=True)
    env = {k: v for k, v in os.environ.items() if k != SECURITY_MUTANT_ENV}
    argv = [sys.executable, "-m"]
    if mutant == BASELINE:
        argv.append("pytest")
    else:
        env[SECURITY_MUTANT_ENV] = mutant
        argv += ["gpuorch.dev.security_mutants.launch", "pytest"]
    argv += [*tests, "-q", "-p", "no:cacheprovider", "-p", "gpuorch.dev.security_mutants.outcomes",
             "--outcomes", str(outcomes), "--basetemp", str(basetemp)]  # fmt: skip
    t0 = time.monotonic()
    with open(log, "wb") as fh:
        subprocess.run(
            argv,
            cwd=ROOT,
            env=env,
            stdout=fh,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            check=False,
        )
    seconds = time.monotonic() - t0
    seen: dict[str, dict[str, str]] = json.loads(outcomes.read_text()) if outcomes.exists() else {}
    got = {t: verdict(t, seen.get(t)) for t in tests}
    failed = tuple(t for t in tests if got[t] == "failed")
    if mutant == BASELINE:
        result = "passed" if all(v == "passed" for v in got.values()) else "failed"
    elif any(v == "passed" for v in got.values()):
        result = "survived"
    else:
        result = "killed" if len(failed) == len(tests) else "error"
    return Run(mutant, tests, result, failed, seconds, log)


def table(runs: list[Run]) -> str:
    width = max(len(r.mutant) for r in runs)
    lines = [f"{'mutant':<{width}}  {'result':<8}  {'time':>6}  test(s)"]
    for r in runs:
        tests = (
            f"all {len(r.tests)} attack tests"
            if r.mutant == BASELINE
            else ", ".join(short(t) for t in r.tests)
        )
        lines.append(f"{r.mutant:<{width}}  {r.result:<8}  {r.seconds:5.0f}s  {tests}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m gpuorch.dev.security_mutants",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--mutant", action="append", choices=sorted(MUTANTS), help="only this one (repeatable)")
    ap.add_argument(
        "--jobs",
        type=int,
        default=min(2, os.cpu_count() or 1),
        help="runs at a time (each starts its own system)",
    )
    ap.add_argument("--no-baseline", action="store_true", help="skip the run without a mutant")
    ap.add_argument(
        "--logs", type=Path, default=ROOT / ".gpuorch" / "security-mutants", help="each run's output"
    )
    ap.add_argument("--list", action="store_true", help="print the mutants, what each removes and its tests")
    ns = ap.parse_args(argv)
    names = ns.mutant or list(MUTANTS)
    if ns.list:
        for n in names:
            m = MUTANTS[n]
            print(
                f"{n}  [{', '.join(m.processes)}]\n    removes: {m.removes}\n    tests:   {', '.join(short(t) for t in m.tests)}"
            )
        return 0
    ns.logs.mkdir(parents=True, exist_ok=True)
    plan = [(n, MUTANTS[n].tests) for n in names]
    if not ns.no_baseline:
        every = dict.fromkeys(t for _, tests in plan for t in tests)
        every.update(dict.fromkeys(NOT_A_PROTECTION))
        plan.insert(0, (BASELINE, tuple(every)))
    print(
        f"security mutants: {len(names)} (and {'a' if not ns.no_baseline else 'no'} baseline), {ns.jobs} at a time; logs in {ns.logs}",
        flush=True,
    )
    t0 = time.monotonic()
    done: dict[str, Run] = {}
    with ThreadPoolExecutor(max_workers=max(1, ns.jobs)) as pool:
        futures = [pool.submit(run, m, tests, ns.logs) for m, tests in plan]
        for f in futures:
            r = f.result()
            done[r.mutant] = r
            print(f"  {r.mutant}: {r.result} in {r.seconds:.0f}s", file=sys.stderr, flush=True)
    runs = [done[m] for m, _ in plan]
    print()
    print(table(runs))
    mutants = [r for r in runs if r.mutant != BASELINE]
    killed = sum(r.result == "killed" for r in mutants)
    print(f"\nkilled {killed} of {len(mutants)} in {time.monotonic() - t0:.0f}s")
    bad = [r for r in runs if r.result not in ("killed", "passed")]
    for r in bad:
        print(f"  {r.mutant}: {r.result}; see {r.log}")
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
