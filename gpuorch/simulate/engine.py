"""The discrete-event replay: trace arrivals and background load over the cluster models.

At each arrival the clock first applies every booked start and end up to then (so the observed
state is current), refreshes a cluster's view only when it changed and its last snapshot is at
least `World.snapshot_interval` old (inventory's staleness), asks the policy, and books the job on
the chosen cluster (`ClusterModel.plan` / `commit`). Background jobs go straight to their cluster's
queue. Same inputs and seed, same result: nothing reads a clock or a global random source.

The router learns as the router service does (`World.learn`, on by default): when a job it routed
has its outputs promoted, the replay folds the job's timeline, read by the router's own
`core.measured_timeline` from the view the log would give, into its `RoutingHistory`
(`history.update_history`); later decisions see it.

Pure: no I/O.
"""

from __future__ import annotations

import contextlib
import gc
import heapq
import math
import random
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import cast

from gpuorch.projection import AttemptView, WorkloadView
from gpuorch_proto.inventory import ClusterSnapshot, QueueInfo
from gpuorch_proto.policy import AdmissionPolicy
from gpuorch_proto.routing import RoutingDecision
from gpuorch_router import core as router_core
from gpuorch_router import fairshare
from gpuorch_router import pipeline as admission_core
from gpuorch_router.history import MeasuredTimeline, RoutingHistory, update_history
from gpuorch_router.policy import RoutingMemo, SnapshotIndex, build_index, relative_speed

from .generator import SimJob, family
from .model import ClusterModel, Work, node_info
from .policies import Choice, Policy, make_policy
from .world import World

_LEARN, _END, _START, _ARRIVE, _RETRY = -1, 0, 1, 2, 3
RETRY_SECONDS_MIN = 60.0
#: how snapshots estimate queue waits: `inventory` (default: inventory's own waits per request shape,
#: `gpuorch_inventory.core.shape_waits`, on the node layout in the cluster's admission order);
#: `pooled` (one wait, of a one-GPU request, over one pool of all GPUs: the default before waits
#: per shape); `oracle` publishes the true wait of a one-GPU request (an experiment: no inventory
#: can know it)
QUEUE_MODELS = ("inventory", "pooled", "oracle")

#: called after each trace arrival with (trace jobs arrived so far, trace jobs, simulated time):
#: `progress.Progress` shows it on a terminal; the engine itself does no I/O
ProgressCallback = Callable[[int, int, float], None]


@dataclass
class JobResult:
    index: int
    submit: float
    gpus: int
    cluster: str | None = None
    start: float = math.nan
    end: float = math.nan
    completion: float = math.nan  # outputs promoted
    staging_s: float = 0.0
    data_gb: float = 0.0
    cost: float = 0.0
    gpu_hours: float = 0.0
    never: str = ""  # why it could never run ("" = it ran)
    decisions: int = 0

    @property
    def jct(self) -> float:
        return self.completion - self.submit

    @property
    def wait(self) -> float:
        return self.start - self.submit


@dataclass
class RunResult:
    policy: str
    clusters: tuple[str, ...]
    jobs: list[JobResult]
    # per cluster: busy GPU-seconds per `bucket` seconds (trace and background work)
    bucket: float
    load: dict[str, list[float]] = field(default_factory=dict)
    capacity: dict[str, int] = field(default_factory=dict)
    decisions: int = 0
    snapshots_built: int = 0


@dataclass(frozen=True)
class Admission:
    """gpuorch's admission in front of routing (docs/pipelines.md): trace jobs wait (held) until
    the router's own `pipeline.admit` releases them under `policy`; with `fair_share`, in the
    order of `fairshare.FairOrder` over every cluster's capacity (the policy's queues say which
    have fair share). Released work is routed and booked as without admission."""

    policy: AdmissionPolicy
    fair_share: bool = True


@dataclass(frozen=True)
class BackgroundJob:
    cluster: int
    submit: float
    gpus: int
    run: float  # true
    declared: float


def background_jobs(world: World, seed: int, horizon: float) -> list[BackgroundJob]:
    """Other tenants' work, per cluster: Poisson arrivals, exponential run times (seeded)."""
    out: list[BackgroundJob] = []
    for ci, c in enumerate(world.clusters):
        bg = c.background
        if bg.utilization <= 0 or not c.nodes:
            continue
        gpus = min(bg.gpus, max(n.gpus for n in c.nodes))
        rate = bg.utilization * c.gpus / (gpus * bg.mean_seconds)  # jobs per second
        rng = random.Random(f"{seed}:background:{c.name}")
        t = rng.expovariate(rate)
        while t < horizon:
            run = rng.expovariate(1.0 / bg.mean_seconds)
            out.append(BackgroundJob(ci, t, gpus, run, run * math.exp(rng.gauss(0.0, 0.4))))
            t += rng.expovariate(rate)
    out.sort(key=lambda b: (b.submit, b.cluster))
    return out


def capacity_snapshot(model: ClusterModel) -> ClusterSnapshot:
    """The cluster empty and idle: what hard eligibility is judged on by the non-router policies."""
    return ClusterSnapshot(
        cluster=model.name, reachable=True, observed_at=0.0, published_at=0.0,
        nodes=[node_info(n, n.gpus) for n in model.spec.nodes],
        queues=[QueueInfo(name="default")], registry=model.spec.registry,
    )


class Simulation:
    """One replay of `jobs` under one policy. Implements `policies.Context`."""

    def __init__(self, world: World, jobs: Sequence[SimJob], policy: str | Policy, *, seed: int = 0,
                 bucket: float = 3600.0, background: Sequence[BackgroundJob] | None = None,
                 queue_model: str = "inventory", admission: Admission | None = None,
                 progress: ProgressCallback | None = None) -> None:
        if queue_model not in QUEUE_MODELS:
            raise ValueError(f"unknown queue model {queue_model!r}; one of {', '.join(QUEUE_MODELS)}")
        self.queue_model = queue_model
        self.world = world
        self.jobs = jobs
        self.policy_name = policy if isinstance(policy, str) else getattr(policy, "__name__", "custom")
        self.policy: Policy = make_policy(policy) if isinstance(policy, str) else policy
        self.seed = seed
        self.rng = random.Random(f"{seed}:policy")
        self.models = [ClusterModel(c) for c in world.clusters]
        self.names = tuple(m.name for m in self.models)
        self.by_name = {m.name: i for i, m in enumerate(self.models)}
        self.bucket = bucket
        horizon = max((j.submit for j in jobs), default=0.0)
        self.background = list(background_jobs(world, seed, horizon) if background is None else background)
        self.static = {m.name: build_index(capacity_snapshot(m)) for m in self.models}
        self._elig: dict[tuple[object, ...], tuple[tuple[int, ...], str]] = {}
        # views: what the last published snapshot said
        self.view_at = [-math.inf] * len(self.models)
        self.view_version = [-1] * len(self.models)
        self.view_free = [0] * len(self.models)
        self.indexes: dict[str, SnapshotIndex] = {}
        self.memo = RoutingMemo()  # the router's fast path, owned by this replay
        # the baselines read free GPUs only; the router (and any custom policy) gets full snapshots
        self.need_snapshots = not (isinstance(policy, str) and policy != "gpuorch")
        self.router_state = router_core.RouterState()
        self.history: RoutingHistory | None = None  # what the router learnt (World.learn)
        self.routed: dict[int, tuple[float, RoutingDecision]] = {}  # routed, not yet learnt from
        self.snapshots_built = 0
        self.decisions = 0
        self.heap: list[tuple[float, int, int, object]] = []
        self.seq = 0
        self.load: dict[str, list[float]] = {m.name: [] for m in self.models}
        self.ref_speed = relative_speed(jobs[0].workload.spec.reference_accelerator) if jobs else 1.0
        # admission (None: every arrival is routed at once)
        self.admission = admission
        self.held: list[int] = []  # trace jobs waiting for admission, in arrival order
        self.released: dict[int, fairshare.Use] = {}  # released, unfinished: its use (start = booked start)
        self.finished_uses: list[fairshare.Use] = []
        self.capacity = fairshare.Vec(gpus=float(sum(m.spec.gpus for m in self.models)))
        self.progress = progress

    # ---- Context ---------------------------------------------------------------------------
    def eligible(self, job: SimJob) -> tuple[tuple[int, ...], str]:
        """Clusters the router's hard checks accept (judged on idle clusters), else why none."""
        s = job.workload.spec
        key = (job.workers, job.node_demand, s.output.store, s.checkpoint.store, job.dataset.ref if job.dataset else None, s.image)
        got = self._elig.get(key)
        if got is None:
            d = self.memo.route(job.workload, "eligibility", self.static, 1.0, max_snapshot_age=math.inf)
            ok = tuple(sorted(self.by_name[v.cluster] for v in d.verdicts if v.eligible))
            got = (ok, "" if ok else never_reason(d))
            self._elig[key] = got
        return got

    def free_view(self, i: int) -> int:
        return self.view_free[i]

    def decide(self, job: SimJob, now: float) -> Choice:
        d = router_core.decide(self.router_state, job.workload, f"trace-{job.index}", 1, self.indexes, now,
                               history=self.history, memo=self.memo)
        self.decisions += 1
        if d.outcome == "routed":
            assert d.cluster is not None
            if self.world.learn:
                self.routed[job.index] = (now, d)
            return Choice(self.by_name[d.cluster])
        return Choice(None, d.outcome, d.summary if d.outcome == "waiting" else never_reason(d))

    def true_completion(self, job: SimJob, i: int, now: float) -> float:
        m = self.models[i]
        w = self._work(job, m, now)
        plan = m.plan(w, now)
        if plan is None:
            return math.inf
        image_s, data_s, _ = m.staging(job.dataset, job.workload.spec.image, plan.start)
        return plan.start + image_s + data_s + m.spec.registry.startup_seconds + self._run(job, m, plan.nodes) + m.output_seconds

    # ---- mechanics ---------------------------------------------------------------------------
    def _push(self, t: float, kind: int, item: object) -> None:
        self.seq += 1
        heapq.heappush(self.heap, (t, kind, self.seq, item))

    def _work(self, job: SimJob, m: ClusterModel, now: float) -> Work:
        suitable = m.suitable(*job.node_demand)
        expected = job.declared_run * self.ref_speed / m.slowest_speed(suitable)
        return Work(key=job.index, workers=job.workers, per_worker=job.per_worker, suitable=suitable, submit=now,
                    expected_run=expected, trace_index=job.index)

    def _run(self, job: SimJob, m: ClusterModel, nodes: Sequence[int]) -> float:
        slowest = min(nodes, key=lambda i: m.speed[i])
        product = m.spec.nodes[slowest].product
        return job.trace.duration * self.ref_speed / m.speed[slowest] * job.true_factor.get(family(product), 1.0)

    def _refresh(self, now: float) -> None:
        interval = self.world.snapshot_interval
        for i, m in enumerate(self.models):
            # inventory observes every cluster all the time and publishes at least every
            # `interval` (a heartbeat moves `observed_at`), so a snapshot is never older than that
            if now - self.view_at[i] >= interval or (interval <= 0 and m.version != self.view_version[i]):
                self.view_at[i], self.view_version[i] = now, m.version
                self.view_free[i] = m.free_gpus()
                if self.need_snapshots:
                    self.indexes[m.name] = build_index(m.snapshot(now, queue_model=self.queue_model), self.indexes.get(m.name))
                    self.snapshots_built += 1

    def _add_load(self, m: ClusterModel, w: Work) -> None:
        series = self.load[m.name]
        b = self.bucket
        k, t = int(w.start // b), w.start
        while t < w.end:
            nxt = min(w.end, (k + 1) * b)
            if k >= len(series):
                series.extend([0.0] * (k + 1 - len(series)))
            series[k] += (nxt - t) * w.gpus
            t, k = nxt, k + 1

    def _book(self, job: SimJob, i: int, now: float, res: JobResult) -> None:
        m = self.models[i]
        w = self._work(job, m, now)
        plan = m.plan(w, now)
        if plan is None:  # eligibility promised a fit; a world that breaks that is reported, not hidden
            res.never = "no node fits (simulator)"
            self.routed.pop(job.index, None)
            return
        image_s, data_s, gb = m.staging(job.dataset, job.workload.spec.image, plan.start)
        w.image_s, w.data_s, w.data_gb = image_s, data_s, gb
        w.startup_s = m.spec.registry.startup_seconds
        w.run_s = self._run(job, m, plan.nodes)
        m.commit(w, plan, image_s + data_s + w.startup_s + w.run_s)
        if gb > 0 and job.dataset is not None:
            m.note_staged(job.dataset.ref, plan.start + image_s + data_s)
        self._push(w.start, _START, (i, w))
        self._push(w.end, _END, (i, w))
        self._add_load(m, w)
        price = m.spec.registry.price_per_gpu_hour
        res.cluster, res.start, res.end = m.name, w.start, w.end
        res.completion = w.end + m.output_seconds
        res.staging_s, res.data_gb = image_s + data_s, gb
        res.gpu_hours = w.gpus * w.hold / 3600.0
        res.cost = res.gpu_hours * price
        if job.index in self.routed:  # learnt from when its outputs are promoted
            self._push(res.completion, _LEARN, self._timeline(job, w, res.completion))

    def _timeline(self, job: SimJob, w: Work, completion: float) -> MeasuredTimeline | None:
        """What the router service would learn when this routed job completes: its timeline as
        the log records it, read by the router's own `core.measured_timeline`."""
        routed_at, decision = self.routed.pop(job.index)
        wid = f"trace-{job.index}"
        running = w.start + w.image_s + w.data_s + w.startup_s
        attempt = AttemptView(attempt_id=f"{wid}-a1", number=1, epoch=1, cluster=decision.cluster or "", status="succeeded",
                              promoted=True, times={"admitted": w.start, "running": running, "finished": w.end, "promoted": completion})
        view = WorkloadView(wid, workload=job.workload, status="completed", decision=decision, promoted_attempt=attempt.attempt_id,
                            attempts={attempt.attempt_id: attempt}, times={"routed": routed_at})
        return router_core.measured_timeline(view)

    def _queue_of(self, job: SimJob) -> str:
        assert self.admission is not None
        q = self.admission.policy.queue(job.workload.spec.policy_queue)
        return q.name if q is not None else (job.workload.spec.policy_queue or self.admission.policy.default_queue)

    def _admit(self, t: float, results: list[JobResult]) -> list[int]:
        """One level-triggered round of the router's admission: the jobs it releases now."""
        assert self.admission is not None
        if not self.held:
            return []
        cands = [admission_core.candidate(f"trace-{k}", self.jobs[k].workload, self.jobs[k].submit, index=k) for k in self.held]
        running = [admission_core.Running(f"trace-{k}", u.queue, u.vec.gpus) for k, u in self.released.items()]
        usage = None
        if self.admission.fair_share:
            usage = fairshare.Usage([*self.finished_uses, *self.released.values()], self.capacity)
        out: list[int] = []
        for v in admission_core.admit(self.admission.policy, running, [], cands, t, usage):
            if isinstance(v, admission_core.Released):
                k = int(v.workload_id.removeprefix("trace-"))
                job = self.jobs[k]
                self.released[k] = fairshare.Use(job.workload.metadata.owner, self._queue_of(job), fairshare.Vec(gpus=float(job.gpus)),
                                                 start=t, expected=job.declared_run)
                out.append(k)
            elif isinstance(v, admission_core.Refused):
                k = int(v.workload_id.removeprefix("trace-"))
                results[k].never = f"refused: {v.reason}"
                self.held.remove(k)
        released = set(out)
        self.held = [k for k in self.held if k not in released]
        return out

    def _finish(self, k: int, w: Work) -> None:
        u = self.released.pop(k, None)
        if u is not None:
            self.finished_uses.append(fairshare.Use(u.owner, u.queue, u.vec, w.start, w.end, u.expected))

    def _decide_and_book(self, k: int, t: float, results: list[JobResult]) -> None:
        job, res = self.jobs[k], results[k]
        self._refresh(t)
        choice = self.policy(job, self, t)
        res.decisions += 1
        if choice.cluster is not None:
            self._book(job, choice.cluster, t, res)
            u = self.released.get(k)
            if u is not None and not math.isnan(res.start):  # its use runs from when it really starts
                self.released[k] = fairshare.Use(u.owner, u.queue, u.vec, res.start, None, u.expected)
            elif u is not None:
                self.released.pop(k)  # booking failed: it will never run, so it holds nothing
        elif choice.outcome == "waiting":  # capacity-only: decide again when inventory has news
            self._push(t + max(RETRY_SECONDS_MIN, self.world.snapshot_interval), _RETRY, k)
        else:
            res.never = choice.reason or "rejected"
            self.released.pop(k, None)

    def run(self) -> RunResult:
        with rare_collections():
            return self._replay()

    def _replay(self) -> RunResult:
        results = [JobResult(index=j.index, submit=j.submit, gpus=j.gpus) for j in self.jobs]
        for k, j in enumerate(self.jobs):
            self._push(j.submit, _ARRIVE, k)
        for b in self.background:
            self._push(b.submit, _ARRIVE, b)
        bg_key = len(self.jobs) + 10**9
        arrived, total, progress = 0, len(self.jobs), self.progress
        while self.heap:
            t, kind, _, item = heapq.heappop(self.heap)
            if kind == _LEARN:
                if item is not None:
                    self.history = update_history(self.history, cast(MeasuredTimeline, item))
            elif kind == _START or kind == _END:
                ci, booked = cast(tuple[int, Work], item)
                if kind == _START:
                    self.models[ci].apply_start(booked)
                else:
                    self.models[ci].apply_end(booked)
                    if self.admission is not None and booked.trace_index >= 0:
                        self._finish(booked.trace_index, booked)  # a slot frees: admission again
                        for r in self._admit(t, results):
                            self._decide_and_book(r, t, results)
            elif isinstance(item, BackgroundJob):
                m = self.models[item.cluster]
                bg_key += 1
                w = Work(key=bg_key, workers=1, per_worker=item.gpus, suitable=m.suitable(0.0, (), item.gpus), submit=t,
                         expected_run=item.declared, run_s=item.run, startup_s=0.0)
                plan = m.plan(w, t)
                if plan is not None:
                    m.commit(w, plan, item.run)
                    self._push(w.start, _START, (item.cluster, w))
                    self._push(w.end, _END, (item.cluster, w))
                    self._add_load(m, w)
            else:
                k = cast(int, item)
                if kind == _ARRIVE and progress is not None:
                    arrived += 1
                    progress(arrived, total, t)
                if self.admission is not None and kind == _ARRIVE:
                    self.held.append(k)  # held until the router's admission releases it
                    for r in self._admit(t, results):
                        self._decide_and_book(r, t, results)
                    continue
                self._decide_and_book(k, t, results)
        return RunResult(policy=self.policy_name, clusters=self.names, jobs=results, bucket=self.bucket, load=self.load,
                         capacity={m.name: m.spec.gpus for m in self.models}, decisions=self.decisions,
                         snapshots_built=self.snapshots_built)


@contextlib.contextmanager
def rare_collections(gen0: int = 100_000) -> Iterator[None]:
    """The cyclic collector run rarely during a replay: a replay makes millions of short-lived
    objects and next to no cycles, while what it reads (the trace, the world) lives throughout, so
    each frequent pass rescans it for nothing (about a quarter of the replay's CPU). What exists
    on entry is frozen out of the collector's generations (`gc.freeze`); on exit both are undone.
    Results do not depend on it: nothing in a replay reads the collector."""
    thresholds = gc.get_threshold()
    gc.freeze()
    gc.set_threshold(gen0, *thresholds[1:])
    try:
        yield
    finally:
        gc.set_threshold(*thresholds)
        gc.unfreeze()


def never_reason(decision: object) -> str:
    """Why no cluster could ever run it: each permanent failed check code, with how many clusters."""
    counts: dict[str, int] = {}
    for v in getattr(decision, "verdicts", []):
        if v.eligible:
            continue
        code = next((c.code for c in v.checks if not c.ok and not c.capacity_only and c.code != "GPU_CAPACITY"), None)
        if code is not None:
            counts[code] = counts.get(code, 0) + 1
    return ", ".join(f"{code} ({n})" for code, n in sorted(counts.items())) or "rejected"


def simulate(world: World, jobs: Sequence[SimJob], policy: str | Policy, *, seed: int = 0, bucket: float = 3600.0,
             queue_model: str = "inventory", admission: Admission | None = None,
             background: Sequence[BackgroundJob] | None = None, progress: ProgressCallback | None = None) -> RunResult:
    return Simulation(world, jobs, policy, seed=seed, bucket=bucket, queue_model=queue_model, admission=admission,
                      background=background, progress=progress).run()
