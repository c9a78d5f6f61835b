"""Randomized fault schedules against the whole embedded system, checked by the invariants.

    python -m gpuorch.chaos --schedules N [--seed S] [--workloads K] [--faults F]

Each schedule, seeded and bounded in count and time: submit K workloads, inject F faults
drawn at random (partition a cluster then heal it, kill -9 a service then restart it, slow
a cluster's API), heal everything, wait until every workload is terminal, then read the
event stream and the Jobs left on the clusters and check the invariants
(`gpuorch.invariants`). Prints how many faults of each kind were injected, how many
invariant violations were found, and per lost attempt the time to detect, to fence, until
the replacement ran, and the compute lost.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpuorch.client import Client
from gpuorch.invariants import Violation, check
from gpuorch.kube import make_clients
from gpuorch.system import SERVICES, System
from gpuorch_proto import Event, Workload, workload_from_obj
from gpuorch_proto import events as ev

HERE = Path(__file__).resolve().parent
CLUSTERS = HERE.parent / "tests" / "e2e" / "clusters.yaml"
DIGEST = "example.org/gpuorch/train@sha256:" + "c4" * 32


def workload(i: int, rng: random.Random) -> Workload:
    steps = rng.randint(40, 120)
    return workload_from_obj({
        "metadata": {"name": f"chaos-{i}", "owner": "chaos"},
        "spec": {
            "image": DIGEST,
            "command": ["python", "-m", "gpuorch.workloads.train"],
            "args": ["--input", "mnist@v1", "--steps", str(steps), "--step-seconds", "60", "--checkpoint-every", "5"],
            "inputs": [{"ref": "mnist@v1", "size_gb": 10, "locations": ["alpha-nfs"]}],
            "resources": {"gpus": rng.choice([1, 2, 4]), "gpu_memory_gib": 40, "cpu": "2", "memory": "8Gi"},
            "expected_runtime": f"{steps}m",
            "checkpoint": {"path": "ckpt", "portable": True, "store": "prod"},
            "output": {"store": "prod"},
            "fencing": rng.choice(["strict", "fast"]),
            "lease": "10m",
            "retry": {"budget": 3},
        },
    })


@dataclass
class Figures:
    detect: list[float] = field(default_factory=list)
    fence: list[float] = field(default_factory=list)
    replacement: list[float] = field(default_factory=list)
    lost_gpu_seconds: list[float] = field(default_factory=list)


def fault_figures(events: Sequence[tuple[int, Event]], partitions: dict[str, list[tuple[float, float]]], scale: float) -> Figures:
    """Per lost attempt: detect (fault → lost), fence (lost → fenced), replacement (lost → next attempt
    running), compute lost (simulated GPU-seconds of the lost attempt not saved by a checkpoint)."""
    f = Figures()
    by_w: dict[str, list[Event]] = {}
    for _, e in events:
        by_w.setdefault(e.workload_id, []).append(e)
    for evs in by_w.values():
        created = {e.attempt_id: e for e in evs if isinstance(e, ev.AttemptCreated)}
        running = {e.attempt_id: e.at for e in evs if isinstance(e, ev.Running)}
        for lost in (e for e in evs if isinstance(e, ev.Lost)):
            starts = [s for s, end in partitions.get(lost.cluster, []) if s <= lost.at <= end + 30]
            if starts:
                f.detect.append(lost.at - max(starts))
            fenced = next((e.at for e in evs if isinstance(e, ev.Fenced) and e.attempt_id == lost.attempt_id), None)
            if fenced is not None:
                f.fence.append(fenced - lost.at)
            nxt = [c for c in created.values() if c.attempt_number == created[lost.attempt_id].attempt_number + 1] if lost.attempt_id in created else []
            if nxt and nxt[0].attempt_id in running:
                f.replacement.append(running[nxt[0].attempt_id] - lost.at)
                gpus = 1.0
                ran = max(0.0, (starts[-1] if starts else lost.at) - running.get(lost.attempt_id, lost.at))
                saved = 0.0 if nxt[0].mode != "resume" else min(ran, ran - (ran % (5 * 60 / scale)))
                f.lost_gpu_seconds.append((ran - saved) * scale * gpus)
    return f


async def run_schedule(system: System, seed: int, n_workloads: int, n_faults: int, horizon: float) -> tuple[Counter[str], list[Violation], Figures]:
    rng = random.Random(seed)
    s = system.settings
    faults: Counter[str] = Counter()
    partitions: dict[str, list[tuple[float, float]]] = {}
    clusters = ["alpha", "beta"]
    async with Client(s.nats_url, s.names) as c:
        wids = [await c.submit(workload(i, rng), idempotency_key=f"chaos-{seed}-{i}") for i in range(n_workloads)]
        t_end = time.monotonic() + horizon
        for _ in range(n_faults):
            await asyncio.sleep(rng.uniform(0.5, max(0.6, horizon / max(n_faults, 1))))  # chaos pacing, not a wait
            kind = rng.choice(["partition", "kill", "slow-api"])
            if kind == "partition":
                cl = rng.choice(clusters)
                t0 = time.time()
                system.fault(cl, "partition")
                await asyncio.sleep(rng.uniform(1.0, 5.0))  # how long the cluster stays away
                system.fault(cl, "heal")
                partitions.setdefault(cl, []).append((t0, time.time()))
            elif kind == "kill":
                svc = rng.choice(SERVICES)
                system.kill(svc)
                system.restart(svc)
            else:
                cl = rng.choice(clusters)
                system.fault(cl, "slow-api", "0.5")
                await asyncio.sleep(rng.uniform(0.5, 2.0))
                system.fault(cl, "slow-api", "0")
            faults[kind] += 1
            if time.monotonic() > t_end:
                break
        for w in wids:
            await c.wait(w, timeout=300)
        events = [(seq, e) for seq, e in await c.events() if e.workload_id in set(wids)]
        # Jobs of finished workloads are removed asynchronously: give the fencer its grace period
        kube = make_clients(system.kubeconfig)
        deadline = time.monotonic() + 60
        while True:
            jobs: dict[str, list[tuple[str, str]]] = {}
            for name, cc in kube.items():
                listed = await asyncio.to_thread(cc.batch.list_namespaced_job, "gpuorch", label_selector="gpuorch.io/managed=true", _request_timeout=(2, 5))
                jobs[name] = [((j.metadata.labels or {}).get("gpuorch.io/workload", ""), j.metadata.name or "") for j in listed.items if (j.metadata.labels or {}).get("gpuorch.io/workload") in set(wids)]
            violations = check(events, jobs=jobs)
            if not any(v.invariant == "no-orphans" for v in violations) or time.monotonic() > deadline:
                break
            await asyncio.sleep(1.0)  # poll until the orphan collector has run (bounded above)
    return faults, violations, fault_figures(events, partitions, 600.0)


def _stats(xs: list[float]) -> str:
    if not xs:
        return "n=0"
    xs = sorted(xs)
    return f"n={len(xs)} median={xs[len(xs) // 2]:.2f} max={xs[-1]:.2f}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m gpuorch.chaos", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--schedules", type=int, default=3)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--workloads", type=int, default=4)
    ap.add_argument("--faults", type=int, default=4)
    ap.add_argument("--horizon", type=float, default=20.0, help="seconds of fault injection per schedule")
    ns = ap.parse_args(argv)
    state = Path(tempfile.mkdtemp(prefix="gpuorch-chaos-"))
    system = System(state_dir=state, clusters_file=CLUSTERS, env_extra={"GPUORCH_LOST_AFTER": "2", "GPUORCH_ORPHAN_GRACE": "10"})
    total: Counter[str] = Counter()
    violations: list[Violation] = []
    figs = Figures()
    t0 = time.monotonic()
    try:
        system.start()
        for i in range(ns.schedules):
            seed = ns.seed + i
            faults, v, f = asyncio.run(run_schedule(system, seed, ns.workloads, ns.faults, ns.horizon))
            total.update(faults)
            violations.extend(v)
            for name in ("detect", "fence", "replacement", "lost_gpu_seconds"):
                getattr(figs, name).extend(getattr(f, name))
            print(f"schedule {i + 1}/{ns.schedules} seed={seed}: faults {dict(faults)}, violations {len(v)}", flush=True)
            for x in v:
                print(f"  VIOLATION {x.invariant} {x.workload_id}: {x.detail}")
    finally:
        system.stop()
    print()
    print(f"schedules: {ns.schedules}  workloads: {ns.schedules * ns.workloads}  real time: {time.monotonic() - t0:.0f}s")
    print("faults injected: " + ", ".join(f"{k}={total[k]}" for k in ("partition", "kill", "slow-api")))
    print(f"invariant violations: {len(violations)}")
    print("lost attempts (real seconds; x600 for simulated):")
    print(f"  time to detect      {_stats(figs.detect)}")
    print(f"  time to fence       {_stats(figs.fence)}")
    print(f"  until replacement runs {_stats(figs.replacement)}")
    print(f"  compute lost (simulated GPU-seconds per lost attempt) {_stats(figs.lost_gpu_seconds)}")
    return 1 if violations else 0


def _unused(_: Any) -> None:  # keep the import list honest for type checkers
    return None


if __name__ == "__main__":
    raise SystemExit(main())
