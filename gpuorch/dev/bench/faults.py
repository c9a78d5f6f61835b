"""Fault bench: what each kind of fault costs, measured end to end on the embedded system.

One ``System`` (nats-server, the two local clusters of ``tests/e2e/clusters.yaml``, the four
services as processes, default service settings) runs the scenarios one after the other, each
repeated (``--quick``: once), with a real training run (``gpuorch.workloads.train``: 2 GPUs,
60 simulated seconds per step, a checkpoint every 5 steps; at time scale 600 a step is 0.1 real
seconds):

* ``partition strict`` / ``partition fast``: the cluster running the attempt stops answering;
  healed as soon as the replacement runs. ``strict`` replaces after cancel-confirmed or lease
  expiry (lease 10 simulated minutes = 1 real second), ``fast`` right after the epoch bump.
* ``lose-node``: the node under the running attempt disappears (its pod becomes Failed/NodeLost);
  the attempt fails and is retried. The node is added back afterwards.
* ``exit-code``: the trainer exits 3 a few steps after a checkpoint (``--fail-at-step``); the
  attempt fails and is retried from its checkpoint.
* ``kill <service>``: ``kill -9`` of one service mid-run, then a restart. No replacement is
  expected: the pod never notices.
* ``no fault``: the same run undisturbed, for the baseline of the lifecycle lag.

Figures, from the event stream (each event's ``at``) and the moment the fault was in effect
(the fault call returned; for ``exit-code`` the last write to the failing pod's log):

* time to detect: fault -> ``lost`` / ``failed``;
* time to fence: ``lost`` / ``failed`` -> ``fenced``;
* until the replacement runs: fault -> the next attempt's ``running``;
* compute lost: the old attempt's last step minus the step the replacement resumed from
  (``resumed_from_step`` in the promoted result's metrics.json), x step seconds x GPUs; real
  GPU-seconds (/ time scale) and simulated ones. The old attempt's last step is exact when it
  checkpointed on SIGTERM or on its injected exit; after a SIGKILL (lost node) it is estimated
  from its last checkpoint file's mtime and the step length, sampled every 10 ms.
* for kills: service back (kill -> ready), next checkpoint after the kill (the workload kept
  progressing), and completion lag (the trainer's exit -> ``completed``).

``quick``: one repetition, and a run with a replacement is cancelled as soon as the replacement
has logged the step it resumed from (instead of running to completion and promotion).
``python -m gpuorch.dev.bench.faults [--quick] [--reps N] [--markdown] [--timeline]`` runs it alone
and prints every repetition. See docs/faults.md.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import os
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpuorch.client import Client
from gpuorch.config import load_registry
from gpuorch.dev.bench.rows import Row
from gpuorch.dev.chaos import (
    CLUSTERS,
    Fault,
    LostAttempt,
    checkpoint_step,
    fault_figures,
    inject,
    pod_log,
    resumed_from,
)
from gpuorch.invariants import check
from gpuorch.kube import ClusterClient, make_clients
from gpuorch.projection import AttemptView, Projection, WorkloadView
from gpuorch.system import SERVICES, System
from gpuorch_proto import Event, Workload, k8s, workload_from_obj
from gpuorch_proto import events as ev

DIGEST = "example.org/gpuorch/train@sha256:" + "fb" * 32
STEP_SECONDS = 60.0  # simulated seconds per training step
EVERY = 5  # --checkpoint-every
GPUS = 2
FIRST_CHECKPOINT = 10  # faults hit after this checkpoint, at a spread offset into the next interval
# the services' defaults (docs/operations.md), spelled out so the figures say what they measured
SETTINGS = {
    "GPUORCH_LOST_AFTER": "3",
    "GPUORCH_DISPATCH_INTERVAL": "0.5",
    "GPUORCH_FENCE_INTERVAL": "0.5",
    "GPUORCH_ORPHAN_GRACE": "10",
}
TIMEOUT = 90.0  # any single wait; a scenario that hangs fails the bench instead of the machine




@dataclass
class Sample:
    """One repetition of one scenario: figure name -> value, plus what it saw."""

    scenario: str
    figures: dict[str, float] = field(default_factory=dict)
    violations: list[str] = field(default_factory=list)
    detail: str = ""
    timeline: str = ""  # every event of the workload, seconds after the fault (or the submit)


def train(name: str, steps: int, fencing: str = "strict", lease: str = "10m", extra: Sequence[str] = ()) -> Workload:
    args = ["--input", "mnist@v1", "--steps", str(steps), "--step-seconds", f"{STEP_SECONDS:g}", "--checkpoint-every", str(EVERY), *extra]
    return workload_from_obj({
        "metadata": {"name": name, "owner": "bench"},
        "spec": {
            "image": DIGEST,
            "command": ["python", "-m", "gpuorch.workloads.train"],
            "args": args,
            "inputs": [{"ref": "mnist@v1", "size_gb": 10, "locations": ["alpha-nfs"]}],
            "resources": {"gpus": GPUS, "gpu_memory_gib": 80, "cpu": "4", "memory": "16Gi"},
            "expected_runtime": f"{int(steps * STEP_SECONDS)}s",
            "reference_accelerator": "NVIDIA-A100-SXM4-80GB",
            "checkpoint": {"path": "ckpt", "portable": True, "store": "prod"},
            "output": {"store": "prod"},
            "fencing": fencing,
            "lease": lease,
        },
    })


class Progress(threading.Thread):
    """Samples attempts' checkpoint files and pod logs every 10 ms: when each checkpoint was
    written (mtime) at which step, and the last write to the pod's log."""

    def __init__(self, state_dir: Path) -> None:
        super().__init__(name="bench-progress", daemon=True)
        self.state_dir = state_dir
        self.lock = threading.Lock()
        self.tracked: dict[str, tuple[str, str]] = {}  # attempt -> (cluster, checkpoint dir)
        self.checkpoints: dict[str, list[tuple[float, int]]] = {}  # attempt -> [(mtime, step)]
        self.logs: dict[str, Path] = {}
        self.log_mtime: dict[str, float] = {}
        self.halt = threading.Event()

    def track(self, attempt_id: str, cluster: str, checkpoint_dir: str) -> None:
        with self.lock:
            self.tracked.setdefault(attempt_id, (cluster, checkpoint_dir))

    def run(self) -> None:
        n = 0
        while not self.halt.wait(0.01):
            n += 1
            with self.lock:
                items = list(self.tracked.items())
            for att, (cluster, ckdir) in items:
                self._sample(att, cluster, ckdir, find_log=n % 10 == 0)

    def _sample(self, att: str, cluster: str, ckdir: str, find_log: bool) -> None:
        with contextlib.suppress(OSError):
            mtime = os.stat(Path(ckdir) / "ckpt.npz").st_mtime
            seen = self.checkpoints.get(att, [])
            if not seen or seen[-1][0] != mtime:
                step = checkpoint_step(ckdir)
                if step is not None and (not seen or step != seen[-1][1]):
                    with self.lock:
                        self.checkpoints.setdefault(att, []).append((mtime, step))
        if att not in self.logs and find_log:
            found = pod_log(self.state_dir, cluster, att)
            if found is not None:
                self.logs[att] = found
        if att in self.logs:
            with contextlib.suppress(OSError):
                self.log_mtime[att] = os.stat(self.logs[att]).st_mtime

    def last(self, att: str) -> tuple[float, int] | None:
        with self.lock:
            seen = self.checkpoints.get(att)
            return seen[-1] if seen else None

    def step_at(self, att: str, t: float, step_real: float, total: int) -> int | None:
        """Steps the attempt had completed at `t`: its last checkpoint before `t` plus the whole
        steps since (capped below the next checkpoint, which had not been seen by `t`)."""
        with self.lock:
            before = [(m, s) for m, s in self.checkpoints.get(att, []) if m <= t]
        if not before:
            return None
        m, s = before[-1]
        return min(total, s + EVERY - 1, s + int((t - m) / step_real))

    def first_after(self, att: str, t: float) -> float | None:
        with self.lock:
            return next((m for m, _ in self.checkpoints.get(att, []) if m > t), None)


def stopped_at(a: AttemptView) -> float | None:
    """When an attempt's pods were confirmed gone (a lease expiry confirms nothing of the kind)."""
    if a.orphan_deleted:
        return a.times.get("orphan-deleted")
    if a.cancel_confirmed in ("deleted", "already-gone"):
        return a.times.get("cancel-confirmed")
    return None


class Bench:
    def __init__(self, system: System, client: Client, quick: bool) -> None:
        self.system = system
        self.client = client
        self.quick = quick
        self.proj = Projection()
        self.events: dict[str, list[tuple[int, Event]]] = {}
        self.progress = Progress(system.state_dir)
        self.time_scale = load_registry(system.clusters_file).time_scale
        self.step_real = STEP_SECONDS / self.time_scale
        self.kube: dict[str, ClusterClient] = {}
        self.inject_seconds: list[float] = []
        self._n = 0

    async def follow(self) -> None:
        async for seq, e in self.client.follow(None, from_start=False):
            self.events.setdefault(e.workload_id, []).append((seq, e))
            self.proj.apply(e, seq)
            if isinstance(e, ev.AttemptCreated):
                self.progress.track(e.attempt_id, e.cluster, e.checkpoint_path)

    # --- waiting ---------------------------------------------------------------------------------
    async def until(self, pred: Callable[[], Any], what: str, wid: str | None = None, timeout: float = TIMEOUT) -> Any:
        deadline = time.monotonic() + timeout
        while True:
            value = pred()
            if value:
                return value
            if time.monotonic() > deadline:
                trail = " ".join(f"{ev.type_tag(e)}({getattr(e, 'attempt_id', '')})" for _, e in self.events.get(wid or "", []))
                raise TimeoutError(f"faults bench: no {what} within {timeout:.0f}s; events: {trail}")
            await asyncio.sleep(0.01)  # poll the followed projection and the progress sampler

    def view(self, wid: str) -> WorkloadView:
        v = self.proj.get(wid)
        return v if v is not None else WorkloadView(wid)

    def attempt(self, wid: str, number: int) -> AttemptView | None:
        return next((a for a in self.view(wid).attempts.values() if a.number == number), None)

    async def submit(self, name: str, wl: Workload) -> str:
        self._n += 1
        return await self.client.submit(wl, idempotency_key=f"bench-faults-{os.getpid()}-{self._n}-{name}")

    async def running_with_checkpoint(self, wid: str, frac: float, min_step: int = FIRST_CHECKPOINT) -> AttemptView:
        """Wait until attempt 1 runs and has checkpointed step >= `min_step`; then wait `frac` of
        a checkpoint interval more (so the fault lands at a spread offset)."""

        def ok() -> AttemptView | None:
            a = self.attempt(wid, 1)
            if a is None or a.status != "running":
                return None
            last = self.progress.last(a.attempt_id)
            return a if last is not None and last[1] >= min_step else None

        a: AttemptView = await self.until(ok, "attempt 1 running with a checkpoint", wid)
        last = self.progress.last(a.attempt_id)
        assert last is not None
        delay = last[0] + frac * EVERY * self.step_real - time.time()
        if delay > 0:
            await asyncio.sleep(delay)
        return a

    async def terminal(self, wid: str) -> WorkloadView:
        return await self.until(lambda: self.view(wid).terminal and self.view(wid), "terminal state", wid)  # type: ignore[no-any-return]

    async def settled(self, wid: str) -> None:
        """Every attempt is finished and, unless promoted, confirmed gone (bounded)."""

        def ok() -> bool:
            v = self.view(wid)
            return v.terminal and all(stopped_at(a) is not None or a.promoted for a in v.attempts.values())

        with contextlib.suppress(TimeoutError):
            await self.until(ok, "every old attempt confirmed gone", wid, timeout=30)

    async def finish(self, wid: str) -> WorkloadView:
        """The rest of the run: completed (full mode), or in quick mode cancelled as soon as the
        replacement has said which step it resumed from; then every old attempt stopped."""
        if self.quick:
            a = self.attempt(wid, 2)
            if a is not None and a.mode == "resume":

                def said() -> bool:
                    return self.view(wid).terminal or resumed_from(a.output_path, self.progress.logs.get(a.attempt_id)) is not None

                await self.until(said, "the replacement's resumed step", wid)
            if not self.view(wid).terminal:
                await self.client.cancel(wid, "faults bench --quick: figures measured")
        v = await self.terminal(wid)
        await self.settled(wid)
        return v

    def outcome(self, wid: str) -> list[str]:
        """Invariant violations, and (full mode) anything but a completed workload."""
        v = self.view(wid)
        bad = [] if v.status == "completed" or (self.quick and v.status == "cancelled") else [f"ended {v.status}: {v.reason}"]
        return self.violations(wid) + bad

    async def fault(self, cluster: str, *args: str) -> float:
        """Inject through the localkube admin endpoint; returns when the request was sent (the
        fault takes effect within the call, which lasts a few milliseconds; a heal returns when
        the cluster answers again)."""
        sent, done = await asyncio.to_thread(inject, self.system, cluster, *args)
        self.inject_seconds.append(done - sent)
        return done if args[0] == "heal" else sent

    def timeline(self, wid: str, t0: float) -> str:
        return " ".join(f"{ev.type_tag(e)}({getattr(e, 'attempt_id', '')[-2:]})@{e.at - t0:+.2f}" for _, e in self.events.get(wid, []))

    def violations(self, wid: str) -> list[str]:
        return [f"{v.invariant}: {v.detail}" for v in check(self.events.get(wid, []))]

    def lost_figures(self, wid: str, fault: Fault, final: dict[str, int]) -> LostAttempt:
        v = self.view(wid)
        resumed: dict[str, int] = {}
        for a in v.attempts.values():
            r = resumed_from(a.output_path, self.progress.logs.get(a.attempt_id))
            if r is not None:
                resumed[a.attempt_id] = r
        figs = fault_figures(self.events.get(wid, []), [fault], final_step=final, resumed_step=resumed)
        hit = [x for x in figs.attempts if x.attempt_id in fault.attempts or x.attempt_id == fault.target]
        if not hit:
            raise RuntimeError(f"faults bench: {fault.kind} left no lost or failed attempt in {wid}")
        return hit[0]

    def record(self, s: Sample, la: LostAttempt) -> None:
        for name in ("detect", "fence", "replacement"):
            value = getattr(la, name)
            if value is not None:
                s.figures[name] = value
        if la.redone_steps is not None:
            s.figures["redone steps"] = la.redone_steps
            s.figures["lost real"] = la.redone_steps * la.step_seconds * la.gpus / self.time_scale
            s.figures["lost sim"] = la.redone_steps * la.step_seconds * la.gpus
        s.detail = f"{la.attempt_id} {la.cause} on {la.cluster}; replacement {la.replacement_id} ({la.replacement_mode}"
        base = resumed_from(self.view(la.workload_id).attempts[la.replacement_id].output_path, self.progress.logs.get(la.replacement_id)) if la.replacement_id else None
        s.detail += f" from step {base})" if base is not None else ")"

    # --- scenarios -------------------------------------------------------------------------------
    async def partition(self, fencing: str, frac: float) -> Sample:
        s = Sample(f"partition {fencing}")
        wid = await self.submit(f"part-{fencing}", train(f"bench-part-{fencing}", 100, fencing=fencing))
        a1 = await self.running_with_checkpoint(wid, frac)
        t0 = await self.fault(a1.cluster, "partition")
        try:
            await self.until(lambda: (a := self.attempt(wid, 2)) is not None and "running" in a.times, "replacement running", wid)
        finally:
            t_heal = await self.fault(a1.cluster, "heal")
        await self.finish(wid)
        old = self.view(wid).attempts[a1.attempt_id]
        last = self.progress.last(a1.attempt_id)
        final = {a1.attempt_id: last[1]} if last else {}  # SIGTERM checkpoint, or the finished run
        la = self.lost_figures(wid, Fault("partition", a1.cluster, t0, t_heal, (a1.attempt_id,)), final)
        self.record(s, la)
        stopped = stopped_at(old)
        if stopped is not None:
            s.figures["heal to old stopped"] = stopped - t_heal
            a2 = self.attempt(wid, 2)
            if a2 is not None and "running" in a2.times:
                s.figures["overlap"] = max(0.0, stopped - a2.times["running"])
        s.detail += f"; old attempt {old.cancel_confirmed or ''}{' orphan-deleted' if old.orphan_deleted else ''} at step {final.get(a1.attempt_id)}"
        s.timeline = self.timeline(wid, t0)
        s.violations = self.outcome(wid)
        return s

    async def lose_node(self, frac: float) -> Sample:
        s = Sample("lose-node")
        steps = 60
        wid = await self.submit("node", train("bench-node", steps))
        a1 = await self.running_with_checkpoint(wid, frac)
        cc = self.kube[a1.cluster]
        pods = await asyncio.to_thread(cc.core.list_namespaced_pod, k8s.NAMESPACE, label_selector=f"{k8s.LABEL_ATTEMPT}={a1.attempt_id}", _request_timeout=(2, 5))
        node = next(p.spec.node_name for p in pods.items if p.spec and p.spec.node_name)
        t0 = await self.fault(a1.cluster, "lose-node", node)
        try:
            await self.until(lambda: (a := self.attempt(wid, 2)) is not None and "running" in a.times, "replacement running", wid)
            await self.finish(wid)
        finally:
            await self.fault(a1.cluster, "add-node", node)
        step = self.progress.step_at(a1.attempt_id, t0, self.step_real, steps)
        final = {a1.attempt_id: step} if step is not None else {}
        la = self.lost_figures(wid, Fault("lose-node", a1.cluster, t0, None, (a1.attempt_id,)), final)
        self.record(s, la)
        s.detail += f"; node {node}; old attempt at step ~{step} when killed"
        s.timeline = self.timeline(wid, t0)
        s.violations = self.outcome(wid)
        return s

    async def exit_code(self, frac: float) -> Sample:
        s = Sample("exit-code")
        # right after a checkpoint: an injected exit between checkpoints would hit the resumed run again
        fail_at = FIRST_CHECKPOINT + EVERY * int(frac * 3)
        wid = await self.submit("exit", train("bench-exit", 40, extra=["--fail-at-step", str(fail_at), "--exit-code", "3"]))
        a1v: AttemptView = await self.until(lambda: (a := self.attempt(wid, 1)) is not None and a.status == "failed" and a, "attempt 1 failed", wid)
        await self.until(lambda: (a := self.attempt(wid, 2)) is not None and "running" in a.times, "replacement running", wid)
        await self.finish(wid)
        t0 = self.progress.log_mtime.get(a1v.attempt_id)
        if t0 is None:  # the log was never found: the last checkpoint plus the steps after it
            last = self.progress.last(a1v.attempt_id)
            assert last is not None
            t0 = last[0] + (fail_at - last[1]) * self.step_real
        la = self.lost_figures(wid, Fault("exit", a1v.attempt_id, t0, None, (a1v.attempt_id,)), {a1v.attempt_id: fail_at})
        self.record(s, la)
        s.detail += f"; exit code {a1v.exit_code} after step {fail_at}"
        s.timeline = self.timeline(wid, t0)
        s.violations = self.outcome(wid)
        return s

    def _done_at(self, wid: str, v: WorkloadView) -> float | None:
        """When the promoted attempt's trainer exited: the last write to its pod log."""
        att = v.promoted_attempt or ""
        return self.progress.log_mtime.get(att)

    async def kill(self, service: str, frac: float) -> Sample:
        s = Sample(f"kill {service}")
        steps = 25
        wid = await self.submit(f"kill-{service}", train(f"bench-kill-{service}", steps))
        # in the last checkpoint interval: the run ends while the service is down or restarting
        a1 = await self.running_with_checkpoint(wid, frac * 0.6, min_step=steps - EVERY)
        t0 = time.time()
        await asyncio.to_thread(self.system.kill, service)
        await asyncio.to_thread(self.system.restart, service)
        s.figures["service back"] = time.time() - t0
        v = await self.terminal(wid)
        await self.settled(wid)
        nxt = self.progress.first_after(a1.attempt_id, t0)
        if nxt is not None:
            s.figures["next checkpoint"] = nxt - t0
        done = self._done_at(wid, v)
        if done is not None and "completed" in v.times:
            s.figures["completion lag"] = v.times["completed"] - done
        s.figures["replacements"] = len(v.attempts) - 1
        s.detail = f"{v.status}; attempts {sorted(v.attempts)}"
        s.timeline = self.timeline(wid, t0)
        s.violations = self.outcome(wid)
        return s

    async def baseline(self) -> Sample:
        s = Sample("no fault")
        wid = await self.submit("base", train("bench-base", 25))
        v = await self.terminal(wid)
        await self.settled(wid)
        a = next(iter(v.attempts.values()))
        if "running" in a.times and "submitted" in v.times:
            s.figures["submit to running"] = a.times["running"] - v.times["submitted"]
        done = self._done_at(wid, v)
        if done is not None and "completed" in v.times:
            s.figures["completion lag"] = v.times["completed"] - done
        s.figures["replacements"] = len(v.attempts) - 1
        s.detail = f"{v.status} on {a.cluster}"
        s.timeline = self.timeline(wid, v.times.get("submitted", 0.0))
        s.violations = self.outcome(wid)
        return s


SCENARIO_ORDER = ["no fault", "partition strict", "partition fast", "lose-node", "exit-code", *(f"kill {x}" for x in SERVICES)]
LOST_METRICS = [
    ("detect", "time to detect", "s", 1.0),
    ("fence", "time to fence", "s", 1.0),
    ("replacement", "until replacement runs", "s", 1.0),
    ("lost real", "compute lost (real)", "GPU-s", 1.0),
    ("lost sim", "compute lost (simulated)", "GPU-min", 1 / 60),
]
OTHER_METRICS = [
    ("heal to old stopped", "heal -> old attempt stopped", "s", 1.0),
    ("overlap", "old and replacement both running", "s", 1.0),
    ("service back", "kill -> service ready", "s", 1.0),
    ("next checkpoint", "kill -> next checkpoint", "s", 1.0),
    ("submit to running", "submit -> running", "s", 1.0),
    ("completion lag", "trainer exit -> completed", "s", 1.0),
    ("replacements", "replacement attempts", "", 1.0),
]


async def _run_all(system: System, reps: int, quick: bool, only: Sequence[str] = ()) -> list[Sample]:
    s = system.settings
    samples: list[Sample] = []
    async with Client(s.nats_url, s.names, creds=s.nats_creds) as client:
        b = Bench(system, client, quick)
        b.kube = make_clients(system.kubeconfig)
        b.progress.start()
        follower = asyncio.create_task(b.follow())
        await asyncio.sleep(0.2)  # the ordered consumer is subscribed before the first submit
        try:
            plan: list[tuple[str, Callable[[float], Any]]] = [
                ("no fault", lambda f: b.baseline()),
                ("partition strict", lambda f: b.partition("strict", f)),
                ("partition fast", lambda f: b.partition("fast", f)),
                ("lose-node", b.lose_node),
                ("exit-code", b.exit_code),
                *((f"kill {svc}", functools.partial(b.kill, svc)) for svc in SERVICES),
            ]
            for r in range(reps):
                frac = (r + 0.5) / reps  # where in a checkpoint interval the fault lands
                for name, fn in plan:
                    if only and not any(o in name for o in only):
                        continue
                    t = time.monotonic()
                    sample: Sample = await fn(frac)
                    samples.append(sample)
                    figs = " ".join(f"{k}={v:.2f}" for k, v in sample.figures.items())
                    bad = f" VIOLATIONS {sample.violations}" if sample.violations else ""
                    print(f"#   faults rep {r + 1}/{reps} {name}: {figs} [{sample.detail}] ({time.monotonic() - t:.1f}s){bad}", file=sys.stderr, flush=True)
            if b.inject_seconds:
                print(f"#   faults: {len(b.inject_seconds)} fault calls took at most {max(b.inject_seconds) * 1000:.0f} ms", file=sys.stderr)
        finally:
            follower.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await follower
            b.progress.halt.set()
    return samples


def measure(reps: int, quick: bool = False, only: Sequence[str] = (), state_dir: Path | None = None) -> list[Sample]:
    with tempfile.TemporaryDirectory(prefix="gpuorch-bench-faults-") as tmp:
        system = System(state_dir=state_dir or Path(tmp), clusters_file=CLUSTERS, env_extra=dict(SETTINGS))
        try:
            system.start()
            return asyncio.run(_run_all(system, reps, quick, only))
        finally:
            system.stop()


def rows(samples: Sequence[Sample]) -> list[Row]:
    out: list[Row] = []
    for scenario in SCENARIO_ORDER:
        group = [s for s in samples if s.scenario == scenario]
        if not group:
            continue
        case = f"{scenario} (n={len(group)})"
        for key, label, unit, factor in LOST_METRICS + OTHER_METRICS:
            values = [s.figures[key] * factor for s in group if key in s.figures]
            if not values:
                continue
            if key == "replacements":
                out.append(Row("faults", case, f"{label}, max", max(values), unit))
                continue
            out.append(Row("faults", case, f"{label}, median", statistics.median(values), unit))
            out.append(Row("faults", case, f"{label}, max", max(values), unit))
        out.append(Row("faults", case, "invariant violations", float(sum(len(s.violations) for s in group)), ""))
    return out


def run(quick: bool = False) -> list[Row]:
    """Every scenario once (``quick``) or three times; see the module docstring."""
    return rows(measure(1 if quick else 3, quick))


def markdown(samples: Sequence[Sample], time_scale: float = 600.0) -> str:
    """The figures table of docs/faults.md: median / max per scenario."""

    def cell(group: list[Sample], key: str, fmt: str = ".2f", factor: float = 1.0) -> str:
        values = [s.figures[key] * factor for s in group if key in s.figures]
        if not values:
            return "–"
        return f"{statistics.median(values):{fmt}} / {max(values):{fmt}}"

    lines = [
        "| scenario | n | time to detect (s) | time to fence (s) | until replacement runs (s) | compute lost, real GPU-s | compute lost, simulated GPU-min |",
        "|---|---|---|---|---|---|---|",
    ]
    for scenario in SCENARIO_ORDER:
        group = [s for s in samples if s.scenario == scenario]
        if not group or scenario.startswith("kill") or scenario == "no fault":
            continue
        lines.append(
            f"| {scenario} | {len(group)} | {cell(group, 'detect')} | {cell(group, 'fence')} | {cell(group, 'replacement')} "
            f"| {cell(group, 'lost real')} | {cell(group, 'lost sim', '.0f', 1 / 60)} |"
        )
    lines += [
        "",
        "| scenario | n | kill -> service ready (s) | kill -> next checkpoint (s) | trainer exit -> completed (s) | replacement attempts (max) |",
        "|---|---|---|---|---|---|",
    ]
    for scenario in SCENARIO_ORDER:
        group = [s for s in samples if s.scenario == scenario]
        if not group or not (scenario.startswith("kill") or scenario == "no fault"):
            continue
        repl = max((s.figures.get("replacements", 0) for s in group), default=0)
        lines.append(
            f"| {scenario} | {len(group)} | {cell(group, 'service back')} | {cell(group, 'next checkpoint')} "
            f"| {cell(group, 'completion lag')} | {repl:.0f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m gpuorch.dev.bench.faults", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="one repetition")
    ap.add_argument("--reps", type=int, default=None, help="repetitions of every scenario (default 3)")
    ap.add_argument("--only", action="append", default=[], help="only scenarios whose name contains this")
    ap.add_argument("--markdown", action="store_true", help="print the docs/faults.md tables")
    ap.add_argument("--timeline", action="store_true", help="print every run's events, seconds after its fault")
    ap.add_argument("--state-dir", type=Path, default=None, help="keep the system's state and logs here")
    ns = ap.parse_args(argv)
    reps = ns.reps or (1 if ns.quick else 3)
    t0 = time.monotonic()
    samples = measure(reps, ns.quick, ns.only, ns.state_dir)
    for s in samples:
        figs = " ".join(f"{k}={v:.3f}" for k, v in s.figures.items())
        print(f"{s.scenario}: {figs} [{s.detail}]" + (f" VIOLATIONS {s.violations}" if s.violations else ""))
        if ns.timeline:
            print(f"    {s.timeline}")
    print()
    for r in rows(samples):
        print(f"{r.case:28s} {r.metric:44s} {r.value:10.3f} {r.unit}")
    if ns.markdown:
        print()
        print(markdown(samples))
    print(f"\n{len(samples)} runs in {time.monotonic() - t0:.0f}s", file=sys.stderr)
    return 1 if any(s.violations for s in samples) else 0


if __name__ == "__main__":
    raise SystemExit(main())
