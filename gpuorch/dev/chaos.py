"""Randomized fault schedules against the whole embedded system, checked by the invariants.

    python -m gpuorch.dev.chaos --schedules N [--seed S] [--workloads K] [--faults F]

Each schedule, seeded and bounded in count and time: submit K workloads, inject F faults
drawn at random (partition a cluster then heal it, kill -9 a service then restart it, slow
a cluster's API), heal everything, wait until every workload is terminal, then read the
event stream and the Jobs left on the clusters and check the invariants
(`gpuorch.invariants`); all the while, about once a second, check that every wait has a reason
that is true now (`check_waits` over the events so far and every snapshot inventory published).
Partitions aim at a cluster that is running attempts at that moment
(most of them long enough for the attempts to be declared lost, some short blips that must
not be). Prints how many faults of each kind were injected, how many invariant violations
were found, and per lost or failed attempt the time to detect, to fence, until the
replacement ran, and the compute lost (see `fault_figures`; docs/faults.md).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import re
import statistics
import tempfile
import time
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from nats.js.api import DeliverPolicy

from gpuorch.client import Client
from gpuorch.invariants import WAIT_TOLERANCE, Violation, check, check_manifests, check_waits
from gpuorch.kube import make_clients
from gpuorch.projection import Projection
from gpuorch.system import SERVICES, System
from gpuorch_localkube.admin import send_fault
from gpuorch_proto import ClusterSnapshot, Event, Workload, decode_snapshot, k8s, workload_from_obj
from gpuorch_proto import events as ev
from gpuorch_proto.storage import Manifest

HERE = Path(__file__).resolve().parents[2]
CLUSTERS = HERE / "tests" / "e2e" / "clusters.yaml"
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


# --- figures per lost or failed attempt --------------------------------------------------------


@dataclass(frozen=True)
class Fault:
    """One injected fault, as the injector saw it."""

    kind: str  # partition | lose-node | exit | kill | slow-api
    target: str  # the cluster (partition, lose-node, slow-api), the service (kill), the attempt (exit)
    at: float  # unix seconds from which the fault was in effect
    until: float | None = None  # healed / restarted; None: instantaneous or never healed
    attempts: tuple[str, ...] = ()  # the attempts that were running where it hit


@dataclass(frozen=True)
class LostAttempt:
    """What one lost (or failed) attempt cost. Times are real seconds, None when not observed."""

    workload_id: str
    attempt_id: str
    cluster: str
    cause: str  # "lost" or "failed"
    fault: Fault | None  # the fault that explains it (None: no injected fault matches)
    detect: float | None  # fault (or the attempt's creation, if later) -> lost / failed
    fence: float | None  # lost / failed -> fenced (the epoch moved past the attempt's)
    replacement: float | None  # fault (same start) -> the next attempt's running
    replacement_id: str | None
    replacement_mode: str | None  # fresh | retry | resume
    redone_steps: int | None  # steps the old attempt had done that the replacement did again
    gpus: float  # GPUs of the workload (per worker x workers)
    step_seconds: float  # simulated seconds per step (the trainer's --step-seconds)

    @property
    def lost_gpu_seconds(self) -> float | None:
        """Simulated GPU-seconds of work redone (divide by the time scale for real seconds)."""
        if self.redone_steps is None:
            return None
        return self.redone_steps * self.step_seconds * self.gpus


@dataclass
class Figures:
    detect: list[float] = field(default_factory=list)
    fence: list[float] = field(default_factory=list)
    replacement: list[float] = field(default_factory=list)
    lost_gpu_seconds: list[float] = field(default_factory=list)  # simulated GPU-seconds per lost attempt
    attempts: list[LostAttempt] = field(default_factory=list)
    wait_checks: int = 0  # how many times invariant 5 (`check_waits`) ran during the schedules

    def extend(self, other: Figures) -> None:
        self.wait_checks += other.wait_checks
        self.detect += other.detect
        self.fence += other.fence
        self.replacement += other.replacement
        self.lost_gpu_seconds += other.lost_gpu_seconds
        self.attempts += other.attempts


def _arg(args: Sequence[str], flag: str, default: float) -> float:
    for i, a in enumerate(args):
        if a == flag and i + 1 < len(args):
            with contextlib.suppress(ValueError):
                return float(args[i + 1])
        if a.startswith(flag + "="):
            with contextlib.suppress(ValueError):
                return float(a.split("=", 1)[1])
    return default


def _matching_fault(faults: Iterable[Fault], attempt_id: str, cluster: str, since: float, at: float, slack: float, window: float = 60.0) -> Fault | None:
    """The latest injected fault that explains an attempt going lost / failed at `at`: aimed at
    the attempt or its cluster, in effect before `at`, and not healed before the attempt existed
    (nor more than `slack` seconds before `at`)."""
    best: Fault | None = None
    for f in faults:
        if f.kind in ("kill", "slow-api"):
            continue  # a service restart or a slow API is not meant to lose attempts
        if attempt_id not in f.attempts and f.target not in (attempt_id, cluster):
            continue
        end = f.until if f.until is not None else f.at + window
        if not f.at <= at <= end + slack or end < since:
            continue
        if best is None or f.at > best.at:
            best = f
    return best


def fault_figures(
    events: Sequence[tuple[int, Event]],
    faults: Sequence[Fault],
    *,
    final_step: Mapping[str, int] | None = None,
    resumed_step: Mapping[str, int] | None = None,
    slack: float = 2.0,
) -> Figures:
    """Per attempt that went `lost` or `failed`, derived from the event stream and the faults:

    * detect: the fault (or the attempt's creation, if it came later) -> `lost` / `failed`;
    * fence: `lost` / `failed` -> `fenced`;
    * replacement: the same start -> the next attempt's `running`;
    * compute lost: GPUs x step seconds x (the old attempt's last step - the step the replacement
      resumed from; 0 for a retry from scratch), i.e. the work the replacement did again.

    `final_step`: attempt -> the last step it completed (its final checkpoint is exact when it
    was stopped with SIGTERM, which checkpoints, or finished); `resumed_step`: attempt -> the
    step it resumed from (metrics.json `resumed_from_step`). Without them compute lost is not
    reported. An attempt whose failure no injected fault explains still gets its fence figure.
    """
    f = Figures()
    final_step = final_step or {}
    resumed_step = resumed_step or {}
    by_w: dict[str, list[Event]] = {}
    for _, e in events:
        by_w.setdefault(e.workload_id, []).append(e)
    for wid, evs in by_w.items():
        wl = next((e.workload for e in evs if isinstance(e, ev.Submitted)), None)
        gpus = float(wl.spec.resources.gpus * wl.spec.resources.workers) if wl else 1.0
        step_s = _arg(wl.spec.args, "--step-seconds", 0.0) if wl else 0.0
        created = {e.attempt_id: e for e in evs if isinstance(e, ev.AttemptCreated)}
        running: dict[str, float] = {}
        fenced: dict[str, float] = {}
        for e in evs:
            if isinstance(e, ev.Running):
                running.setdefault(e.attempt_id, e.at)
            elif isinstance(e, ev.Fenced):
                fenced.setdefault(e.attempt_id, e.at)
        seen: set[str] = set()
        for e in evs:
            if not isinstance(e, ev.Lost | ev.Failed) or e.attempt_id in seen:
                continue
            seen.add(e.attempt_id)
            c = created.get(e.attempt_id)
            since = c.at if c else e.at
            fault = _matching_fault(faults, e.attempt_id, e.cluster, since, e.at, slack)
            start = max(fault.at, since) if fault else None
            nxt = next((n for n in created.values() if c and n.attempt_number == c.attempt_number + 1), None)
            repl_running = running.get(nxt.attempt_id) if nxt else None
            redone: int | None = None
            if nxt is not None and e.attempt_id in final_step:
                base = resumed_step.get(nxt.attempt_id)
                if base is None and nxt.mode != "resume":
                    base = 0
                if base is not None:
                    redone = max(0, final_step[e.attempt_id] - base)
            la = LostAttempt(
                workload_id=wid, attempt_id=e.attempt_id, cluster=e.cluster,
                cause="lost" if isinstance(e, ev.Lost) else "failed", fault=fault,
                detect=(e.at - start) if start is not None else None,
                fence=(fenced[e.attempt_id] - e.at) if e.attempt_id in fenced else None,
                replacement=(repl_running - start) if start is not None and repl_running is not None else None,
                replacement_id=nxt.attempt_id if nxt else None,
                replacement_mode=nxt.mode if nxt else None,
                redone_steps=redone, gpus=gpus, step_seconds=step_s,
            )
            f.attempts.append(la)
            if la.detect is not None:
                f.detect.append(la.detect)
            if la.fence is not None:
                f.fence.append(la.fence)
            if la.replacement is not None:
                f.replacement.append(la.replacement)
            if la.lost_gpu_seconds is not None and fault is not None:
                f.lost_gpu_seconds.append(la.lost_gpu_seconds)
    return f


# --- what the attempts did, read from their files ------------------------------------------------

_RESUMED = re.compile(rb"^resumed step=(\d+)", re.M)


def checkpoint_step(checkpoint_dir: str) -> int | None:
    """The step of an attempt's newest checkpoint (`ckpt.npz`), None if it wrote none."""
    import numpy as np  # the trainer's dependency; only needed once there are checkpoints

    local = urlsplit(checkpoint_dir).path if checkpoint_dir.startswith("file://") else checkpoint_dir
    if "://" in local:
        return None  # a remote store: no figure (the pod log still says where a resume started)
    path = Path(local) / "ckpt.npz"
    for _ in range(3):  # written atomically, but may be replaced while we read
        try:
            with np.load(path, allow_pickle=False) as ck:
                return int(ck["step"])
        except FileNotFoundError:
            return None
        except (OSError, KeyError, ValueError):
            time.sleep(0.01)
    return None


def pod_log(state_dir: Path, cluster: str, attempt_id: str) -> Path | None:
    """The main container's log of an attempt's (first) pod on a local cluster."""
    logs = sorted((state_dir / "clusters" / cluster / "pods").glob(f"*/{attempt_id}-*/logs/main.log"))
    return logs[0] if logs else None


def resumed_from(output_dir: str, log: Path | None = None) -> int | None:
    """The step an attempt resumed from: its metrics.json (in its prefix of a file:// store, or a
    local directory), or while it runs (or in a remote store) its pod log."""
    local = urlsplit(output_dir).path if output_dir.startswith("file://") else output_dir
    with contextlib.suppress(OSError, ValueError):
        if "://" in local:
            raise ValueError("a remote store: read the pod log")
        metrics = json.loads((Path(local) / "metrics.json").read_text())
        return int(metrics.get("resumed_from_step") or 0)
    if log is not None:
        with contextlib.suppress(OSError):
            m = _RESUMED.search(log.read_bytes())
            if m:
                return int(m.group(1))
    return None


def attempt_progress(events: Sequence[tuple[int, Event]], state_dir: Path) -> tuple[dict[str, int], dict[str, int]]:
    """(final step, resumed-from step) per attempt, read once everything settled.

    The final checkpoint is an attempt's last step when it finished or was stopped with SIGTERM
    (the trainer checkpoints then); after a SIGKILL it is a lower bound (up to
    `--checkpoint-every` - 1 steps short).
    """
    final: dict[str, int] = {}
    resumed: dict[str, int] = {}
    for _, e in events:
        if not isinstance(e, ev.AttemptCreated):
            continue
        step = checkpoint_step(e.checkpoint_path)
        if step is not None:
            final[e.attempt_id] = step
        r = resumed_from(e.output_path, pod_log(state_dir, e.cluster, e.attempt_id))
        if r is not None:
            resumed[e.attempt_id] = r
    return final, resumed


# --- schedules ------------------------------------------------------------------------------------


def inject(system: System, cluster: str, fault: str, *args: str) -> tuple[float, float]:
    """`System.fault` without the CLI subprocess, straight to the localkube admin endpoint: returns
    (sent, done) in unix seconds, a few milliseconds apart; the fault takes effect in between."""
    sent = time.time()
    out = send_fault(system.state_dir / "clusters", cluster, fault, list(args))
    if not out.get("ok"):
        raise RuntimeError(f"fault {cluster} {fault} {' '.join(args)} failed: {out}")
    return sent, time.time()


async def _follow(c: Client, proj: Projection, wids: set[str], stop: asyncio.Event, log: list[tuple[int, Event]] | None = None) -> None:
    async for seq, e in c.follow(None, from_start=True):
        if e.workload_id in wids:
            proj.apply(e, seq)
            if log is not None:
                log.append((seq, e))
        if stop.is_set():
            return


async def _record_snapshots(c: Client, into: dict[str, list[ClusterSnapshot]]) -> Any:
    """Every snapshot inventory publishes from now on (and each cluster's latest), in order."""

    async def cb(msg: Any) -> None:
        with contextlib.suppress(Exception):
            snap = decode_snapshot(msg.data)
            into.setdefault(snap.cluster, []).append(snap)

    return await c.js.subscribe(c.names.inventory_all, cb=cb, ordered_consumer=True, deliver_policy=DeliverPolicy.LAST_PER_SUBJECT)


async def _watch_waits(log: list[tuple[int, Event]], snaps: Mapping[str, list[ClusterSnapshot]], found: dict[tuple[str, str], Violation], stop: asyncio.Event, figs: Figures) -> None:
    """Invariant 5 about once a second while the schedule runs (first violation per workload kept)."""
    while not stop.is_set():
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), timeout=1.0)  # the check's period, not a wait for a condition
        for v in check_waits(list(log), snaps, time.time(), tolerance=WAIT_TOLERANCE):
            found.setdefault((v.invariant, v.workload_id), v)
        figs.wait_checks += 1


def _running_by_cluster(proj: Projection) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for v in proj.workloads.values():
        for a in v.attempts.values():
            if a.status == "running" and a.cancel_confirmed is None and not a.fenced:
                out.setdefault(a.cluster, []).append(a.attempt_id)
    return out


async def store_manifests(system: System, wids: Iterable[str]) -> dict[str, dict[str, Manifest]]:
    """workload -> store -> the result manifest there, for every store the registry names."""
    from gpuorch.config import load_registry
    from gpuorch.stores import stores_of
    from gpuorch_fencer.publish import read_manifest

    st = system.settings
    stores = stores_of(st, load_registry(st.registry) if st.registry else None)
    out: dict[str, dict[str, Manifest]] = {}
    for wid in wids:
        for name in sorted(stores.configs):
            m = await read_manifest(stores[name], wid)
            if m is not None:
                out.setdefault(wid, {})[name] = m
    return out


async def run_schedule(system: System, seed: int, n_workloads: int, n_faults: int, horizon: float) -> tuple[Counter[str], list[Violation], Figures]:
    rng = random.Random(seed)
    s = system.settings
    faults: Counter[str] = Counter()
    injected: list[Fault] = []
    clusters = ["alpha", "beta"]
    lost_after = float(system.env_extra.get("GPUORCH_LOST_AFTER", "3"))
    async with Client(s.nats_url, s.names, creds=s.nats_creds) as c:
        wids = [await c.submit(workload(i, rng), idempotency_key=f"chaos-{seed}-{i}") for i in range(n_workloads)]
        proj = Projection()
        stop = asyncio.Event()
        log: list[tuple[int, Event]] = []
        snaps: dict[str, list[ClusterSnapshot]] = {}
        waits: dict[tuple[str, str], Violation] = {}
        figs = Figures()
        snap_sub = await _record_snapshots(c, snaps)
        follower = asyncio.create_task(_follow(c, proj, set(wids), stop, log))
        watcher = asyncio.create_task(_watch_waits(log, snaps, waits, stop, figs))
        t_end = time.monotonic() + horizon
        try:
            for _ in range(n_faults):
                await asyncio.sleep(rng.uniform(0.5, max(0.6, horizon / max(n_faults, 1))))  # chaos pacing, not a wait
                kind = rng.choice(["partition", "kill", "slow-api"])
                if kind == "partition":
                    # aim at a cluster that runs attempts now (waiting a little for one to start)
                    for _ in range(50):  # poll the followed projection, at most 5 s
                        if _running_by_cluster(proj):
                            break
                        await asyncio.sleep(0.1)
                    running = _running_by_cluster(proj)
                    cl = max(running, key=lambda k: len(running[k])) if running else rng.choice(clusters)
                    # mostly long enough to be declared lost; sometimes a blip that must not be
                    away = rng.uniform(lost_after + 1.0, lost_after + 4.0) if rng.random() < 0.75 else rng.uniform(0.3, lost_after / 2)
                    t0, _ = await asyncio.to_thread(inject, system, cl, "partition")
                    await asyncio.sleep(away)  # how long the cluster stays away
                    _, t1 = await asyncio.to_thread(inject, system, cl, "heal")
                    injected.append(Fault("partition", cl, t0, t1, tuple(running.get(cl, ()))))
                elif kind == "kill":
                    svc = rng.choice(SERVICES)
                    t0 = time.time()
                    await asyncio.to_thread(system.kill, svc)
                    await asyncio.to_thread(system.restart, svc)
                    injected.append(Fault("kill", svc, t0, time.time()))
                else:
                    cl = rng.choice(clusters)
                    t0, _ = await asyncio.to_thread(inject, system, cl, "slow-api", "0.5")
                    await asyncio.sleep(rng.uniform(0.5, 2.0))
                    _, t1 = await asyncio.to_thread(inject, system, cl, "slow-api", "0")
                    injected.append(Fault("slow-api", cl, t0, t1))
                faults[kind] += 1
                if time.monotonic() > t_end:
                    break
            deadline = time.monotonic() + 300
            for w in wids:  # one that never ends is reported by the invariants, not by a crash
                with contextlib.suppress(TimeoutError):
                    await c.wait(w, timeout=max(1.0, deadline - time.monotonic()))
        finally:
            stop.set()
            follower.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await follower
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await watcher
            with contextlib.suppress(Exception):
                await snap_sub.unsubscribe()
        events = [(seq, e) for seq, e in await c.events() if e.workload_id in set(wids)]
        # Jobs of finished workloads are removed asynchronously: give the fencer its grace period
        kube = make_clients(system.kubeconfig)
        deadline = time.monotonic() + 60
        while True:
            jobs: dict[str, list[tuple[str, str]]] = {}
            for name, cc in kube.items():
                listed = await asyncio.to_thread(cc.batch.list_namespaced_job, k8s.NAMESPACE, label_selector=k8s.MANAGED_SELECTOR, _request_timeout=(2, 5))
                present = []
                for j in listed.items:
                    labels = (j.metadata.labels if j.metadata else None) or {}
                    owner = str(labels.get(k8s.LABEL_WORKLOAD, ""))
                    if owner in wids:
                        present.append((owner, str(j.metadata.name if j.metadata else "")))
                jobs[name] = present
            violations = check(events, jobs=jobs, snapshots=snaps, now=time.time()) + list(waits.values())
            if not any(v.invariant == "no-orphans" for v in violations) or time.monotonic() > deadline:
                break
            await asyncio.sleep(1.0)  # poll until the orphan collector has run (bounded above)
        events = [(seq, e) for seq, e in await c.events() if e.workload_id in set(wids)]
    # invariant 8 over what the stores hold: every workload's manifests, read through the store port
    violations += check_manifests(events, await store_manifests(system, wids))
    final, resumed = await asyncio.to_thread(attempt_progress, events, system.state_dir)
    figs.extend(fault_figures(events, injected, final_step=final, resumed_step=resumed))
    return faults, violations, figs


def _stats(xs: list[float], fmt: str = ".2f") -> str:
    if not xs:
        return "n=0"
    return f"n={len(xs)} median={statistics.median(xs):{fmt}} max={max(xs):{fmt}}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m gpuorch.dev.chaos", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--schedules", type=int, default=3)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--workloads", type=int, default=4)
    ap.add_argument("--faults", type=int, default=4)
    ap.add_argument("--horizon", type=float, default=20.0, help="seconds of fault injection per schedule")
    ap.add_argument("--verbose", action="store_true", help="print every lost or failed attempt")
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
            figs.extend(f)
            print(f"schedule {i + 1}/{ns.schedules} seed={seed}: faults {dict(faults)}, violations {len(v)}, lost/failed attempts {len(f.attempts)}", flush=True)
            for x in v:
                print(f"  VIOLATION {x.invariant} {x.workload_id}: {x.detail}")
            if ns.verbose:
                for a in f.attempts:
                    print(f"  {a.attempt_id} {a.cause} on {a.cluster} fault={a.fault.kind if a.fault else '-'} detect={a.detect} fence={a.fence} replacement={a.replacement} ({a.replacement_mode}) redone_steps={a.redone_steps}")
    finally:
        system.stop()
    scale = 600.0
    print()
    print(f"schedules: {ns.schedules}  workloads: {ns.schedules * ns.workloads}  real time: {time.monotonic() - t0:.0f}s")
    print("faults injected: " + ", ".join(f"{k}={total[k]}" for k in ("partition", "kill", "slow-api")))
    print(f"invariant violations: {len(violations)}")
    n_waits = sum(1 for v in violations if v.invariant == "wait-reason-current")
    print(f"  every wait has a current reason (wait-reason-current): checked {figs.wait_checks} times during the schedules, then at the end; violations {n_waits}")
    unexplained = sum(1 for a in figs.attempts if a.fault is None)
    print(f"lost or failed attempts: {len(figs.attempts)} ({unexplained} not explained by an injected fault)")
    print("per attempt hit by a fault (real seconds; x600 for simulated):")
    print(f"  time to detect          {_stats(figs.detect)}")
    print(f"  time to fence           {_stats(figs.fence)}")
    print(f"  until replacement runs  {_stats(figs.replacement)}")
    print(f"  compute lost, real GPU-seconds       {_stats([x / scale for x in figs.lost_gpu_seconds])}")
    print(f"  compute lost, simulated GPU-seconds  {_stats(figs.lost_gpu_seconds, '.0f')}")
    return 1 if violations else 0


if __name__ == "__main__":
    raise SystemExit(main())
