"""Pipelines and queues: the router's pure core for what happens *before* routing (issue 13).

State, event and `now` in; decisions with reasons and the events to emit out. No I/O, no clock,
no logging (checked by tests/test_layering.py). See docs/pipelines.md.

Why the router (DESIGN §1): the router owns the contract and the decision record, and it is the
only service that decides whether and when a workload is routed. "Is this stage ready?" and "is
this workload held or released?" are both "may it be routed now?", so they are decided here, in
front of `policy.route`. The dispatcher stays the only writer of attempts and the owner of
cancellation: a released child is routed, dispatched, fenced and promoted like any workload, and a
pipeline's cancel or a failed stage stops children through ordinary `cancel` commands for them.

* `expand`: a workload with `spec.stages` or `spec.sweep` becomes child workloads, with ids
  derived from the pipeline's id and the stage name (trials: `t0000`, `t0001`, ... in the sweep's
  order): the `pipeline-expanded` record and one `submitted` per child.
* `PipelineState`: the fold of the pipeline's and its children's events.
* `ready_stages`: stages whose every dependency is promoted, with those results by version.
* `blocked_by_failure`: stages that can never run (a dependency ended without a result), naming it.
* `cancel_all`: a cancel for every child that has not finished.
* `outcome`: the pipeline's end, once every child has finished.
* `admission` / `admit`: released or held (with the limit that holds it, `held: queue research at
  16 of 16 GPUs`) or refused, for limits at organisation, queue and pipeline level in running
  workloads and GPUs, and a queue's GPU-hour budget over a sliding window; `admit` takes
  candidates in order (queue priority, then workload priority, then submit time).
"""

from __future__ import annotations

import hashlib
import itertools
import sys
from collections import deque
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

import msgspec

from gpuorch_proto import Event, RoutingDecision, Workload, event_id
from gpuorch_proto import events as ev
from gpuorch_proto.jobenv import format_param
from gpuorch_proto.policy import AdmissionPolicy, QueuePolicy
from gpuorch_proto.subjects import valid_token
from gpuorch_proto.units import format_duration, parse_duration
from gpuorch_proto.validate import PLACEHOLDER
from gpuorch_proto.workload import DatasetInput, Limits, Metadata, ParamValue, Stage, Sweep, WorkloadSpecBody

from . import fairshare

SEP = ev.STAGE_SEP  # between a pipeline's id and a child's stage: `<pipeline>--<stage>`
LABEL_PIPELINE = "gpuorch.io/pipeline"
LABEL_STAGE = "gpuorch.io/stage"
LABEL_TRIAL = "gpuorch.io/trial"
_EPS = 1e-9


# ---- ids --------------------------------------------------------------------------------


def child_id(pipeline_id: str, stage: str) -> str:
    """`<pipeline>--<stage>`, or when that is no subject token (too long), a shortened form with a
    hash of both: deterministic, and distinct for distinct (pipeline, stage) pairs."""
    plain = f"{pipeline_id}{SEP}{stage}"
    if valid_token(plain):
        return plain
    digest = hashlib.sha256(f"{pipeline_id}/{stage}".encode()).hexdigest()[:12]
    head = pipeline_id[:30].rstrip("-") or "p"
    tail = stage[:16].strip("-")
    return f"{head}{SEP}{tail}-{digest}" if tail else f"{head}{SEP}{digest}"


def trial_name(index: int, count: int) -> str:
    """A trial's stage name: `t` and its index, zero-padded so names sort in the sweep's order."""
    return f"t{index:0{max(4, len(str(max(count - 1, 0))))}d}"


# ---- expansion --------------------------------------------------------------------------


def trials(sweep: Sweep) -> Iterator[dict[str, ParamValue]]:
    """Parameter sets in the sweep's order: a grid's combinations with the last parameter varying
    fastest (`itertools.product` over the parameters as declared), or the explicit list."""
    if sweep.trials:
        yield from (dict(t) for t in sweep.trials)
        return
    names = list(sweep.grid)
    for combo in itertools.product(*(sweep.grid[n] for n in names)):
        yield dict(zip(names, combo, strict=True))


def _substitute(text: str, params: Mapping[str, ParamValue]) -> str:
    return PLACEHOLDER.sub(
        lambda m: format_param(params[m.group(1)]) if m.group(1) in params else m.group(0), text
    )


@dataclass(frozen=True)
class Child:
    workload_id: str
    stage: str
    workload: Workload
    depends_on: tuple[str, ...] = ()
    trial: int | None = None
    parameters: Mapping[str, ParamValue] = field(default_factory=dict)


@dataclass(frozen=True)
class Expansion:
    pipeline_id: str
    children: tuple[Child, ...]
    events: tuple[Event, ...]  # `pipeline-expanded`, then one `submitted` per child, in order


def is_pipeline(wl: Workload) -> bool:
    return bool(wl.spec.stages) or wl.spec.sweep is not None


def _labels(wl: Workload, pipeline_id: str, stage: str, trial: int | None) -> dict[str, str]:
    labels = {**wl.metadata.labels, LABEL_PIPELINE: pipeline_id, LABEL_STAGE: stage}
    if trial is not None:
        labels[LABEL_TRIAL] = str(trial)
    return labels


def _stage_workload(wl: Workload, pipeline_id: str, st: Stage) -> Workload:
    spec = wl.spec
    body = msgspec.structs.replace(
        spec,
        image=st.image if st.image is not None else spec.image,
        command=list(st.command or spec.command),
        args=list(st.args if (st.command or st.args) else spec.args),
        env={**spec.env, **st.env},
        inputs=[*spec.inputs, *st.inputs],
        resources=st.resources,  # its own: never the pipeline's (a CPU stage holds no GPU)
        requirements=st.requirements if st.requirements is not None else spec.requirements,
        preferences=st.preferences if st.preferences is not None else spec.preferences,
        queue=st.queue if st.queue is not None else spec.queue,
        timeout=st.timeout if st.timeout is not None else spec.timeout,
        expected_runtime=st.expected_runtime,
        stages=[],
        sweep=None,
        limits=Limits(),
    )
    meta = Metadata(
        name=st.name,
        owner=wl.metadata.owner,
        labels=_labels(wl, pipeline_id, st.name, None),
        workload_class=f"{wl.metadata.workload_class or wl.metadata.name}/{st.name}",
    )
    return Workload(api_version=wl.api_version, metadata=meta, spec=body)


def _trial_workload(
    wl: Workload, pipeline_id: str, stage: str, index: int, params: Mapping[str, ParamValue]
) -> Workload:
    spec = wl.spec
    env = {k: _substitute(v, params) for k, v in spec.env.items()}
    body: WorkloadSpecBody = msgspec.structs.replace(
        spec,
        command=[_substitute(c, params) for c in spec.command],
        args=[_substitute(a, params) for a in spec.args],
        env=env,
        sweep=None,
        limits=Limits(),
    )
    meta = Metadata(
        name=wl.metadata.name,
        owner=wl.metadata.owner,
        labels=_labels(wl, pipeline_id, stage, index),
        workload_class=wl.metadata.workload_class or wl.metadata.name,  # trials learn run time together
    )
    return Workload(api_version=wl.api_version, metadata=meta, spec=body)


def expand(pipeline_id: str, wl: Workload, now: float) -> Expansion:
    """The children of a (validated) pipeline workload, and the events that record them.

    Deterministic: the same id and document always give the same children, ids and order (stages
    as declared; trials in the sweep's order). A workload with neither stages nor a sweep has no
    children (it is routed as itself).
    """
    children: list[Child] = []
    if wl.spec.stages:
        for st in wl.spec.stages:
            children.append(
                Child(
                    workload_id=child_id(pipeline_id, st.name),
                    stage=st.name,
                    workload=_stage_workload(wl, pipeline_id, st),
                    depends_on=tuple(st.depends_on),
                )
            )
    elif wl.spec.sweep is not None:
        sets = list(trials(wl.spec.sweep))
        for i, params in enumerate(sets):
            name = trial_name(i, len(sets))
            children.append(
                Child(
                    workload_id=child_id(pipeline_id, name),
                    stage=name,
                    workload=_trial_workload(wl, pipeline_id, name, i, params),
                    trial=i,
                    parameters=params,
                )
            )
    if not children:
        return Expansion(pipeline_id, (), ())
    record = ev.PipelineExpanded(
        event_id=event_id(pipeline_id, "pipeline-expanded"),
        workload_id=pipeline_id,
        at=now,
        children=[
            ev.PipelineChild(
                workload_id=c.workload_id,
                stage=c.stage,
                depends_on=list(c.depends_on),
                trial=c.trial,
                parameters=dict(c.parameters),
            )
            for c in children
        ],
    )
    submitted: list[Event] = [
        ev.Submitted(
            event_id=event_id(c.workload_id, "submitted"),
            workload_id=c.workload_id,
            at=now,
            workload=c.workload,
        )
        for c in children
    ]
    return Expansion(pipeline_id, tuple(children), (record, *submitted))


# ---- the pipeline's state ----------------------------------------------------------------

StageStatus = Literal["pending", "ready", "held", "released", "completed", "failed", "cancelled", "blocked"]
FINISHED: frozenset[str] = frozenset({"completed", "failed", "cancelled", "blocked"})
NO_RESULT: frozenset[str] = frozenset({"failed", "cancelled", "blocked"})  # finished without a result
WAITING: frozenset[str] = frozenset({"pending", "ready", "held"})  # not released yet


@dataclass
class StageState:
    name: str
    workload_id: str
    depends_on: tuple[str, ...] = ()
    status: StageStatus = "pending"
    reason: str = "waiting for its dependencies"
    attempt_id: str | None = None  # the promoted attempt: the version of its result
    result_path: str | None = None
    result_bytes: int = 0  # the promoted result's size (the fencer measures it)
    store: str = ""  # the artifact store its result is promoted to
    gpus: float = 0.0  # GPUs it holds while it runs (per worker x workers)
    gpu_hours: float = 0.0  # expected: gpus x its expected_runtime (0 = unknown)
    inputs: tuple[ev.StageInput, ...] = ()
    trial: int | None = None

    @property
    def promoted(self) -> bool:
        return self.attempt_id is not None and self.result_path is not None

    @property
    def finished(self) -> bool:
        return self.status in FINISHED


@dataclass
class PipelineState:
    """The fold of a pipeline's events: its `pipeline-expanded`, its cancel, and its children's
    lifecycle. Pure and in place, like `gpuorch.projection`; an event that changes nothing (a
    replay, or one about another workload) is ignored."""

    pipeline_id: str
    stages: dict[str, StageState] = field(default_factory=dict)  # by stage name, as declared
    by_workload: dict[str, str] = field(default_factory=dict)  # child workload id -> stage name
    cancel_requested: bool = False
    cancel_reason: str = ""
    finished: bool = False

    @classmethod
    def of(cls, pipeline_id: str, events: Iterable[Event]) -> PipelineState:
        s = cls(pipeline_id)
        for e in events:
            s.apply(e)
        return s

    def stage_of(self, workload_id: str) -> StageState | None:
        name = self.by_workload.get(workload_id)
        return self.stages[name] if name is not None else None

    def apply(self, e: Event) -> None:
        if e.workload_id == self.pipeline_id:
            match e:
                case ev.PipelineExpanded() if not self.stages:
                    for c in e.children:
                        self.stages[c.stage] = StageState(
                            c.stage, c.workload_id, tuple(c.depends_on), trial=c.trial
                        )
                        self.by_workload[c.workload_id] = c.stage
                        if not c.depends_on:
                            self.stages[c.stage].reason = "no dependencies"
                case ev.Cancel() | ev.CancelRequested():
                    if not self.cancel_requested:
                        self.cancel_requested, self.cancel_reason = True, e.reason
                case ev.PipelineFinished():
                    self.finished = True
                case _:
                    pass
            return
        st = self.stage_of(e.workload_id)
        if st is None:
            return
        match e:
            case ev.Submitted():
                shape = candidate(st.workload_id, e.workload, e.at)
                st.gpus, st.gpu_hours, st.store = shape.gpus, shape.gpu_hours, e.workload.spec.output.store
            case ev.StageReady() if st.status == "pending":
                st.status, st.inputs, st.reason = "ready", tuple(e.inputs), e.reason
            case ev.Held() if st.status in WAITING:
                st.status, st.reason = "held", e.reason
            case ev.Released() if st.status in WAITING:
                st.status, st.reason, st.gpus = "released", e.reason, e.gpus
            case ev.Promoted():
                st.attempt_id, st.result_path, st.result_bytes = e.attempt_id, e.result_path, e.result_bytes
            case ev.Completed() if not st.finished:
                st.status, st.reason = "completed", f"promoted {e.attempt_id} to {e.result_path}"
                if st.attempt_id is None:
                    st.attempt_id, st.result_path = e.attempt_id, e.result_path
            case ev.WorkloadFailed() if not st.finished:
                st.status, st.reason = "failed", e.reason
            case ev.Rejected() if e.decision is not None and not st.finished:
                st.status, st.reason = "failed", f"rejected: {e.reason}"
            case ev.Cancelled() if not st.finished:
                st.status, st.reason = "cancelled", e.reason
            case ev.StageBlocked() if not st.finished:
                st.status, st.reason = "blocked", e.reason
            case _:
                pass


def _inputs_of(state: PipelineState, st: StageState) -> list[ev.StageInput]:
    out = []
    for d in st.depends_on:
        dep = state.stages[d]
        assert dep.attempt_id is not None and dep.result_path is not None
        out.append(
            ev.StageInput(
                stage=d,
                workload_id=dep.workload_id,
                attempt_id=dep.attempt_id,
                result_path=dep.result_path,
                store=dep.store,
                size_bytes=dep.result_bytes,
            )
        )
    return out


def ready_stages(state: PipelineState, now: float) -> list[ev.StageReady]:
    """`stage-ready` for every pending stage whose every dependency is promoted (none while the
    pipeline is being cancelled). Its inputs are those results, by version (the promoted attempt)."""
    if state.cancel_requested:
        return []
    out = []
    for st in state.stages.values():
        if st.status != "pending" or not all(state.stages[d].promoted for d in st.depends_on):
            continue
        inputs = _inputs_of(state, st)
        reason = (
            "every dependency promoted: " + ", ".join(f"{i.stage} ({i.attempt_id})" for i in inputs)
            if inputs
            else "no dependencies"
        )
        out.append(
            ev.StageReady(
                event_id=event_id(st.workload_id, "stage-ready"),
                workload_id=st.workload_id,
                at=now,
                pipeline=state.pipeline_id,
                stage=st.name,
                inputs=inputs,
                reason=reason,
            )
        )
    return out


def _topological(state: PipelineState) -> list[StageState]:
    """Stages in dependency order (Kahn, O(V+E); declared order among equals)."""
    indegree = {n: len(s.depends_on) for n, s in state.stages.items()}
    dependents: dict[str, list[str]] = {n: [] for n in state.stages}
    for n, s in state.stages.items():
        for d in s.depends_on:
            dependents[d].append(n)
    todo = deque(n for n, k in indegree.items() if k == 0)
    out: list[StageState] = []
    while todo:
        n = todo.popleft()
        out.append(state.stages[n])
        for m in dependents[n]:
            indegree[m] -= 1
            if indegree[m] == 0:
                todo.append(m)
    return out


def _ended(st: StageState) -> str:
    verb = {"failed": "failed", "cancelled": "was cancelled", "blocked": "did not run"}[st.status]
    return f"{verb}: {st.reason}" if st.reason else verb


def blocked_by_failure(state: PipelineState, now: float) -> list[ev.StageBlocked]:
    """`stage-blocked` for every stage that can never run: a stage it depends on, directly or
    through others, finished without a result (failed, cancelled, or itself blocked). The event
    names the stage that failed. None while the pipeline is being cancelled (its cancel stops all)."""
    if state.cancel_requested:
        return []
    cause: dict[str, tuple[StageState, str]] = {}  # blocked now -> (the stage that ended, through)
    out = []
    for st in _topological(state):
        if st.status != "pending":
            continue
        for d in st.depends_on:
            dep = state.stages[d]
            if dep.status in NO_RESULT and dep.status != "blocked":
                cause[st.name] = (dep, d)
                break
            if d in cause or dep.status == "blocked":
                root = cause[d][0] if d in cause else dep
                cause[st.name] = (root, d)
                break
        if st.name not in cause:
            continue
        root, through = cause[st.name]
        via = f" (through {through})" if through != root.name else ""
        out.append(
            ev.StageBlocked(
                event_id=event_id(st.workload_id, "stage-blocked"),
                workload_id=st.workload_id,
                at=now,
                pipeline=state.pipeline_id,
                stage=st.name,
                failed_stage=root.name,
                reason=f"not run: it depends on stage {root.name}{via}, which {_ended(root)}",
            )
        )
    return out


def cancel_all(state: PipelineState, reason: str, now: float) -> list[ev.Cancel]:
    """A `cancel` for every child that has not finished: each is then cancelled like any workload
    (the dispatcher's `on_cancel`, in every state). Deterministic ids: a re-decided cancel is the
    same message."""
    return [
        ev.Cancel(
            event_id=event_id(st.workload_id, "cancel", "pipeline"),
            workload_id=st.workload_id,
            at=now,
            reason=f"pipeline {state.pipeline_id} cancelled: {reason}",
        )
        for st in state.stages.values()
        if not st.finished
    ]


def outcome(state: PipelineState, now: float) -> ev.PipelineFinished | None:
    """The pipeline's end, once every child has finished (and only once)."""
    if state.finished or not state.stages or not all(st.finished for st in state.stages.values()):
        return None
    counts: dict[str, int] = {}
    for st in state.stages.values():
        counts[st.status] = counts.get(st.status, 0) + 1
    n = len(state.stages)
    done = counts.get("completed", 0)
    if done == n:
        result: Literal["completed", "failed", "cancelled"] = "completed"
        reason = f"{n} of {n} stages completed"
    else:
        result = "cancelled" if state.cancel_requested else "failed"
        rest = ", ".join(f"{counts[k]} {k}" for k in ("failed", "blocked", "cancelled") if counts.get(k))
        first = next((st for st in state.stages.values() if st.status == "failed"), None)
        reason = f"{done} of {n} stages completed; {rest}"
        if result == "cancelled":
            reason = f"cancelled: {state.cancel_reason}; {reason}"
        elif first is not None:
            reason += f"; stage {first.name} failed: {first.reason}"
    return ev.PipelineFinished(
        event_id=event_id(state.pipeline_id, "pipeline-finished"),
        workload_id=state.pipeline_id,
        at=now,
        outcome=result,
        reason=reason,
        stages={st.name: st.status for st in state.stages.values()},
    )


def input_dataset(i: ev.StageInput) -> DatasetInput:
    """A dependency's promoted result as the routing checks read inputs: an immutable dataset
    `<stage>@<attempt>` (the attempt is its version) with one replica, in the store it was
    promoted to, of its measured size. Routing then applies the one staging rule
    (`checks.data_staging`) to it: read in place, copied over a link, or unreachable."""
    return DatasetInput(ref=f"{i.stage}@{i.attempt_id}", size_gb=i.size_bytes / 1e9, locations=[i.store] if i.store else [])


def with_stage_inputs(wl: Workload, inputs: Sequence[ev.StageInput]) -> Workload:
    """The workload the router routes for a released stage: its own `spec.inputs` and, after
    them, its dependencies' promoted results (`input_dataset`). The document in the log is
    unchanged (the dispatcher hands the results to the Job by path, `jobenv`)."""
    if not inputs:
        return wl
    extra = [input_dataset(i) for i in inputs]
    return msgspec.structs.replace(wl, spec=msgspec.structs.replace(wl.spec, inputs=[*wl.spec.inputs, *extra]))


def render_graph(state: PipelineState) -> str:
    """The graph as `gpuorch get` shows it: each stage in dependency order, its status, what it
    waits for or why it ended, and its result by version."""
    order = _topological(state)
    done = sum(1 for s in order if s.status == "completed")
    head = f"pipeline {state.pipeline_id}: {done} of {len(order)} stages completed"
    if state.cancel_requested:
        head += f" (cancelling: {state.cancel_reason})"
    width = max([len(s.name) for s in order] + [5])
    lines = [head]
    for s in order:
        after = f" after {', '.join(s.depends_on)}" if s.depends_on else ""
        if s.status == "pending" and s.depends_on:
            missing = [d for d in s.depends_on if not state.stages[d].promoted]
            note = f"waiting for {', '.join(missing)}"
        elif s.status == "completed":
            note = f"result {s.result_path} ({s.attempt_id})"
        else:
            note = s.reason
        gpus = f"{s.gpus:g} GPU" if s.gpus else "no GPU"
        lines.append(f"  {s.name:<{width}}  {s.status:<9}  {gpus:<8} {s.workload_id}{after}: {note}")
    return "\n".join(lines)


# ---- admission: concurrency that is not capacity, queues as policy --------------------------


@dataclass(frozen=True)
class Candidate:
    """A workload that may be released: its queue, owner, shape and place in the order."""

    workload_id: str
    owner: str = "anonymous"
    queue: str | None = None  # spec.policy_queue; None = the policy's default queue
    gpus: float = 0.0  # per worker x workers (a CPU stage: 0)
    priority: int = 0
    submitted_at: float = 0.0
    pipeline: str | None = None
    pipeline_limits: Limits = field(default_factory=Limits)
    gpu_hours: float = 0.0  # expected: gpus x expected_runtime (0 = unknown)
    index: int = 0  # its place in its pipeline


def candidate(
    workload_id: str,
    wl: Workload,
    submitted_at: float,
    pipeline: str | None = None,
    pipeline_limits: Limits | None = None,
    index: int = 0,
) -> Candidate:
    r = wl.spec.resources
    gpus = r.gpus * r.workers
    hours = parse_duration(wl.spec.expected_runtime) / 3600.0 if wl.spec.expected_runtime else 0.0
    return Candidate(
        workload_id=workload_id,
        owner=wl.metadata.owner,
        queue=wl.spec.policy_queue,
        gpus=gpus,
        priority=wl.spec.priority,
        submitted_at=submitted_at,
        pipeline=pipeline,
        pipeline_limits=pipeline_limits or Limits(),
        gpu_hours=gpus * hours,
        index=index,
    )


@dataclass(frozen=True, slots=True)
class Running:
    """Released work that has not finished: it holds its slot (and GPUs) until it does."""

    workload_id: str
    queue: str
    gpus: float = 0.0
    pipeline: str | None = None


@dataclass(frozen=True)
class GpuSpan:
    """GPU time a queue's work used (`end` None: still running)."""

    queue: str
    gpus: float
    start: float
    end: float | None = None


def spent_gpu_hours(
    spans: Iterable[GpuSpan], queue: str, window: float, now: float, time_scale: float = 1.0
) -> float:
    """GPU-hours of the queue's work inside the sliding window, in the budget's unit: the
    workload's own clock (simulated at `time_scale` > 1, as `expected_runtime` is). `window` is
    the budget's (simulated seconds); the spans and `now` are the events' clock. So the window is
    `(now - clock_seconds(window), now]` and each span's seconds count `time_scale` times
    (`fairshare.clock_seconds`, `fairshare.simulated_seconds`: the one conversion)."""
    lo = now - fairshare.clock_seconds(window, time_scale)
    total = 0.0
    for s in spans:
        if s.queue != queue:
            continue
        a, b = max(s.start, lo), min(now if s.end is None else s.end, now)
        if b > a:
            total += s.gpus * (b - a)
    return fairshare.simulated_seconds(total, time_scale) / 3600.0


@dataclass
class Tally:
    """What released, unfinished work holds, per scope: workloads and GPUs."""

    running: dict[tuple[str, str], int] = field(default_factory=dict)  # (scope, name) -> workloads
    gpus: dict[tuple[str, str], float] = field(default_factory=dict)
    committed_hours: dict[str, float] = field(default_factory=dict)  # queue -> released this round

    @classmethod
    def of(cls, running: Iterable[Running]) -> Tally:
        t = cls()
        for r in running:
            t.add(r.queue, r.pipeline, r.gpus)
        return t

    def add(self, queue: str, pipeline: str | None, gpus: float, hours: float = 0.0) -> None:
        for key in _scopes(queue, pipeline):
            self.running[key] = self.running.get(key, 0) + 1
            self.gpus[key] = self.gpus.get(key, 0.0) + gpus
        if hours:
            self.committed_hours[queue] = self.committed_hours.get(queue, 0.0) + hours

    def remove(self, r: Running) -> None:
        """Released work that finished: its slot and GPUs are free again."""
        for key in _scopes(r.queue, r.pipeline):
            n = self.running.get(key, 0) - 1
            g = self.gpus.get(key, 0.0) - r.gpus
            if n <= 0:
                self.running.pop(key, None)
                self.gpus.pop(key, None)
            else:
                self.running[key], self.gpus[key] = n, max(g, 0.0)

    def copy(self) -> Tally:
        return Tally(dict(self.running), dict(self.gpus), dict(self.committed_hours))


def _scopes(queue: str, pipeline: str | None) -> list[tuple[str, str]]:
    keys = [("organisation", ""), ("queue", queue)]
    if pipeline is not None:
        keys.append(("pipeline", pipeline))
    return keys


def _label(scope: str, name: str) -> str:
    return "organisation" if scope == "organisation" else f"{scope} {name}"


def _n(x: float) -> str:
    return f"{round(x, 1):g}"


@dataclass(frozen=True)
class Released:
    workload_id: str
    queue: str
    reason: str
    gpus: float = 0.0
    pipeline: str | None = None

    def event(self, now: float) -> ev.Released:
        return ev.Released(
            event_id=event_id(self.workload_id, "released"),
            workload_id=self.workload_id,
            at=now,
            reason=self.reason,
            queue=self.queue,
            pipeline=self.pipeline,
            gpus=self.gpus,
        )


@dataclass(frozen=True)
class Held:
    workload_id: str
    queue: str
    holds: tuple[ev.Hold, ...]
    pipeline: str | None = None

    @property
    def reason(self) -> str:
        return "held: " + "; ".join(h.message for h in self.holds)

    @property
    def signature(self) -> tuple[tuple[str, str, str], ...]:
        """What holds it, without the numbers: re-publish `held` only when this changes."""
        return tuple((h.scope, h.name, h.kind) for h in self.holds)

    def event(self, now: float, k: int = 1) -> ev.Held:
        """The k-th `held` of this workload (k = its `held` events in the log + 1)."""
        return ev.Held(
            event_id=event_id(self.workload_id, "held", k),
            workload_id=self.workload_id,
            at=now,
            reason=self.reason,
            holds=list(self.holds),
            queue=self.queue,
            pipeline=self.pipeline,
        )


@dataclass(frozen=True)
class Refused:
    """It can never be released as it is (unknown queue, not allowed, larger than a limit)."""

    workload_id: str
    reason: str


Verdict = Released | Held | Refused


def _limit_holds(
    scope: ev.HoldScope, name: str, limits: Limits, c: Candidate, tally: Tally
) -> tuple[list[ev.Hold], str | None, list[str]]:
    """Holds of one scope's limits, a refusal if the candidate can never fit, and the usage after it."""
    holds: list[ev.Hold] = []
    label = _label(scope, name)
    key = (scope, name)
    n, g = tally.running.get(key, 0), tally.gpus.get(key, 0.0)
    after: list[str] = []
    if limits.max_gpus is not None and c.gpus > limits.max_gpus + _EPS:
        return [], f"needs {_n(c.gpus)} GPUs; {label} allows {_n(limits.max_gpus)} at once", []
    if limits.max_running is not None:
        if n + 1 > limits.max_running:
            holds.append(
                ev.Hold(
                    scope=scope,
                    name=name,
                    kind="running",
                    used=n,
                    limit=limits.max_running,
                    needs=1,
                    message=f"{label} at {n} of {limits.max_running} running workloads",
                )
            )
        else:
            after.append(f"{label} at {n + 1} of {limits.max_running} running workloads")
    if limits.max_gpus is not None and c.gpus > 0:
        if g + c.gpus > limits.max_gpus + _EPS:
            short = "" if g >= limits.max_gpus - _EPS else f", needs {_n(c.gpus)}"
            holds.append(
                ev.Hold(
                    scope=scope,
                    name=name,
                    kind="gpus",
                    used=g,
                    limit=limits.max_gpus,
                    needs=c.gpus,
                    message=f"{label} at {_n(g)} of {_n(limits.max_gpus)} GPUs{short}",
                )
            )
        else:
            after.append(f"{label} at {_n(g + c.gpus)} of {_n(limits.max_gpus)} GPUs")
    return holds, None, after


def _budget_hold(
    q: QueuePolicy, c: Candidate, tally: Tally, spans: Sequence[GpuSpan], now: float, time_scale: float
) -> ev.Hold | str | None:
    """Every figure in GPU-hours of the workload's own clock (simulated at `time_scale` > 1): the
    budget, what its spans used (`spent_gpu_hours`), what this round committed and the candidate's
    estimate (GPUs x `expected_runtime`); the window as the budget says it (simulated)."""
    b = q.budget
    if b is None or c.gpus <= 0:  # a CPU-only workload costs no GPU-hours
        return None
    window = parse_duration(b.window)
    if c.gpu_hours > b.gpu_hours + _EPS:
        return (
            f"needs ~{_n(c.gpu_hours)} GPU-hours; queue {q.name}'s budget is {_n(b.gpu_hours)} "
            f"GPU-hours per {format_duration(window)}"
        )
    used = spent_gpu_hours(spans, q.name, window, now, time_scale) + tally.committed_hours.get(q.name, 0.0)
    over = used + c.gpu_hours > b.gpu_hours + _EPS if c.gpu_hours else used >= b.gpu_hours - _EPS
    if not over:
        return None
    needs = f", needs ~{_n(c.gpu_hours)}" if c.gpu_hours else ""
    return ev.Hold(
        scope="queue",
        name=q.name,
        kind="budget",
        used=used,
        limit=b.gpu_hours,
        needs=c.gpu_hours,
        message=f"queue {q.name} spent {_n(used)} of {_n(b.gpu_hours)} GPU-hours in the last {format_duration(window)}{needs}",
    )


def may_submit(q: QueuePolicy, owner: str) -> bool:
    return "*" in q.owners or owner in q.owners


def admission(
    policy: AdmissionPolicy,
    tally: Tally,
    spans: Sequence[GpuSpan],
    c: Candidate,
    now: float,
    time_scale: float = 1.0,
) -> Verdict:
    """Released, held (every limit that holds it, widest scope first) or refused, for one candidate
    against what released work holds now (`tally`) and the queue's GPU time (`spans`, timed by the
    events' clock; `time_scale`: the registry's simulated seconds per second of it, for budgets).

    A limit counts released work that has not finished, in workloads and in GPUs (per worker x
    workers); a workload without GPUs is never held by a GPU limit or a GPU-hour budget.
    """
    q = policy.queue(c.queue)
    if q is None:
        names = ", ".join(x.name for x in policy.queues)
        return Refused(
            c.workload_id, f"queue {c.queue or policy.default_queue!r} does not exist (queues: {names})"
        )
    if not may_submit(q, c.owner):
        return Refused(
            c.workload_id, f"{c.owner} may not submit to queue {q.name} (owners: {', '.join(q.owners)})"
        )
    holds: list[ev.Hold] = []
    after: list[str] = []
    scopes: list[tuple[ev.HoldScope, str, Limits]] = [
        ("organisation", "", policy.organisation),
        ("queue", q.name, q.limits),
    ]
    if c.pipeline is not None:
        scopes.append(("pipeline", c.pipeline, c.pipeline_limits))
    for scope, name, limits in scopes:
        h, refused, a = _limit_holds(scope, name, limits, c, tally)
        if refused is not None:
            return Refused(c.workload_id, refused)
        holds += h
        after += a
        if scope == "queue":
            b = _budget_hold(q, c, tally, spans, now, time_scale)
            if isinstance(b, str):
                return Refused(c.workload_id, b)
            if b is not None:
                holds.append(b)
    if holds:
        return Held(c.workload_id, q.name, tuple(holds), c.pipeline)
    reason = "released: " + ("; ".join(after) if after else "no limit applies")
    return Released(c.workload_id, q.name, reason, c.gpus, c.pipeline)


def order_key(policy: AdmissionPolicy, c: Candidate) -> tuple[int, int, float, str, int, str]:
    """Queue priority (higher first), then workload priority (higher first), then submit time
    (earlier first); a pipeline's children in their order; the id breaks the last ties."""
    q = policy.queue(c.queue)
    return (
        -(q.priority if q else 0),
        -c.priority,
        c.submitted_at,
        c.pipeline or c.workload_id,
        c.index,
        c.workload_id,
    )


def admit(
    policy: AdmissionPolicy,
    running: Iterable[Running] | Tally,
    spans: Sequence[GpuSpan],
    candidates: Iterable[Candidate],
    now: float,
    usage: fairshare.Usage | None = None,
    *,
    time_scale: float = 1.0,
) -> list[Verdict]:
    """Every waiting candidate's verdict, taken in order; each release counts against the limits
    of those after it. Level-triggered: call it whenever released work finishes (a slot frees),
    a candidate arrives or the budget window moves, and publish the changes.

    Best effort within the order: a candidate too large for what is left is held, and a smaller
    one after it may still be released.

    Fair share (`usage` given, queues with `fair_share`): the order is `fairshare.FairOrder`'s,
    the owner with the lowest weighted dominant share across all clusters next, each release
    charged to its owner before the next choice.

    `running` may be given as its `Tally` (the gate keeps one up to date: a round then costs the
    candidates, not every released workload); it is copied, never changed. `time_scale`: the
    registry's simulated seconds per second of the events' clock, for budgets (`admission`).
    """
    tally = running.copy() if isinstance(running, Tally) else Tally.of(running)
    out: list[Verdict] = []
    order = fairshare.FairOrder(policy, candidates, usage, now, key=lambda c: order_key(policy, c))
    for c in order:
        v = admission(policy, tally, spans, c, now, time_scale)
        if isinstance(v, Released):
            tally.add(v.queue, c.pipeline, c.gpus, c.gpu_hours if c.gpus > 0 else 0.0)
            order.charge(c)
        elif isinstance(v, Held) and order.reserve(c, v.holds):
            tally.add(v.queue, c.pipeline, c.gpus)  # its room is kept: fair share must not starve it
        out.append(v)
    return out


def running_of(state: PipelineState, queue: str) -> list[Running]:
    """The pipeline's released, unfinished children: what they hold against the limits."""
    return [
        Running(st.workload_id, queue, st.gpus, state.pipeline_id)
        for st in state.stages.values()
        if st.status == "released"
    ]


def candidates_of(state: PipelineState, pipeline: Workload, submitted_at: float) -> list[Candidate]:
    """The pipeline's ready (or held) children, as candidates for `admit`: the pipeline's queue,
    owner, priority, submit time and `spec.limits`; each child's own GPUs."""
    if state.cancel_requested:
        return []
    return [
        Candidate(
            workload_id=st.workload_id,
            owner=pipeline.metadata.owner,
            queue=pipeline.spec.policy_queue,
            gpus=st.gpus,
            priority=pipeline.spec.priority,
            submitted_at=submitted_at,
            pipeline=state.pipeline_id,
            pipeline_limits=pipeline.spec.limits,
            gpu_hours=st.gpu_hours,
            index=i,
        )
        for i, st in enumerate(state.stages.values())
        if st.status in ("ready", "held")
    ]


# ---- the gate: the router's fold for what comes before routing ------------------------------


def submit_refusal(policy: AdmissionPolicy, wl: Workload, identity: str | None = None) -> str | None:
    """Why this submit may never be admitted as it is (None: it may): its queue does not exist,
    or the submitter may not use it. `identity` is who signed the submit (DESIGN §11); it has
    already been checked to be allowed to submit as `metadata.owner`, so the queue's `owners`
    are matched against that owner or the identity's own name."""
    q = policy.queue(wl.spec.policy_queue)
    if q is None:
        names = ", ".join(x.name for x in policy.queues)
        return f"queue {wl.spec.policy_queue or policy.default_queue!r} does not exist (queues: {names})"
    if may_submit(q, wl.metadata.owner) or (identity is not None and identity in q.owners):
        return None
    who = f"identity {identity!r} (owner {wl.metadata.owner})" if identity else wl.metadata.owner
    return f"{who} may not submit to queue {q.name} (owners: {', '.join(q.owners)})"


@dataclass
class _Span:
    queue: str
    gpus: float
    start: float
    end: float | None = None


#: A stage's events that can change what its pipeline decides (readiness, blocking, outcome).
_PROGRESS = (ev.Promoted, ev.Completed, ev.WorkloadFailed, ev.Cancelled, ev.Rejected, ev.StageBlocked)

#: The event types only a gate round decides (`Gate.step`): the admission leader's, published
#: fenced by its term (docs/operations.md *Admission leadership*).
DECIDED = (ev.Released, ev.Held, ev.StageReady, ev.StageBlocked, ev.PipelineFinished)


@dataclass
class GateRound:
    """What one round decides: events to publish, cancel commands to send, workloads released
    now (to be routed at once)."""

    events: list[Event] = field(default_factory=list)
    cancels: list[ev.Cancel] = field(default_factory=list)
    released: list[str] = field(default_factory=list)


@dataclass
class Gate:
    """The router's fold of everything that decides whether a workload may be routed yet.

    Pipelines (their `PipelineState`s), the work waiting to be released (plain workloads from
    their `submitted`, a pipeline's children from their `stage-ready`), what released work holds
    (until it finishes) and the GPU time it used (for budgets), and the last `held` of each.

    Idempotent per workload by stream sequence (the router folds different workloads' events
    concurrently, each workload's in order), and what the router publishes itself is noted at
    once (`note`, sequence 0): the log's echo then changes nothing. The expansion of a pipeline
    is noted when the router decides it, so a child's events are never mistaken for a plain
    workload's, whatever order they are folded in.

    A release is the one decision that may not be in the log after all (the admission leader's
    term ended and the stream refused it: docs/operations.md *Admission leadership*). Noted, it
    is `releasing`: counted against the limits at once, its workload still `waiting` (a round
    skips it); the log's echo makes it `running`. `retract` forgets every release the log does
    not have, so a router's counts are never above the log's for long, and a snapshot (which
    leaves `releasing` out) holds only what the log holds.
    """

    pipelines: dict[str, PipelineState] = field(default_factory=dict)
    docs: dict[str, tuple[Workload, float]] = field(default_factory=dict)  # pipelines: document, submit time
    parent_of: dict[str, str] = field(default_factory=dict)  # child -> pipeline
    index_of: dict[str, int] = field(default_factory=dict)  # child -> its place in the pipeline
    waiting: dict[str, Candidate] = field(default_factory=dict)  # not released, not finished
    running: dict[str, Running] = field(default_factory=dict)  # released, not finished
    releasing: dict[str, Running] = field(default_factory=dict)  # released by this router, not in the log yet
    finished: set[str] = field(default_factory=set)
    workloads: dict[str, Workload] = field(default_factory=dict)  # every submitted document, by id
    spans: dict[str, _Span] = field(default_factory=dict)  # attempt -> its GPU time
    held: dict[str, tuple[tuple[tuple[str, str, str], ...], set[str]]] = field(default_factory=dict)
    commands: set[str] = field(default_factory=set)  # cancel commands sent (event ids)
    cancelling: set[str] = field(default_factory=set)  # cancel requested: never released
    seqs: dict[str, int] = field(default_factory=dict)  # per workload: the last sequence folded
    # noted but not yet seen in the log (events) or not yet acked (commands): re-sent if overdue
    unconfirmed: dict[str, tuple[Event, float]] = field(default_factory=dict)
    dirty: bool = True  # something changed that may change a verdict
    dirty_pipelines: set[str] = field(default_factory=set)

    # -- fold --------------------------------------------------------------------------------
    def note_expansion(self, x: Expansion, wl: Workload, now: float) -> None:
        """The router expanded a pipeline (before it publishes it)."""
        if x.pipeline_id in self.pipelines:
            return
        self.docs[x.pipeline_id] = (wl, now)
        self.note(x.events, now)

    def accept(
        self, policy: AdmissionPolicy, submitted: ev.Submitted, identity: str | None, now: float
    ) -> list[Event]:
        """What accepting a submit publishes before any round, noted at once: `submitted` and a
        `rejected` when its queue does not exist or the submitter may not use it
        (`submit_refusal`); `submitted` and the expansion of a pipeline (`pipeline-expanded`, one
        `submitted` per child; the pipeline itself is never routed); `submitted` alone otherwise.
        The router's service and the deterministic simulation both call this."""
        wl, wid = submitted.workload, submitted.workload_id
        refused = submit_refusal(policy, wl, identity)
        if refused is not None:  # accepted as a record, and refused: the workload's own verdict
            out: list[Event] = [submitted, refusal_event(Refused(wid, refused), now)]
            self.note(out, now)
            return out
        self.note([submitted], now)
        if not is_pipeline(wl):
            return [submitted]
        x = expand(wid, wl, now)
        self.note_expansion(x, wl, now)
        return [submitted, *x.events]

    def note(self, events: Iterable[ev.Base], now: float = 0.0) -> None:
        """What the router is publishing, before the log echoes it back. Each stays
        `unconfirmed` until the log has it (a command: until `confirm`)."""
        for e in events:
            if e.event_id:
                self.unconfirmed[e.event_id] = (e, now)  # type: ignore[assignment]
            if isinstance(e, ev.Cancel):
                self.commands.add(e.event_id)
            else:
                self.apply(e)  # type: ignore[arg-type]

    def confirm(self, events: Iterable[ev.Base]) -> None:
        for e in events:
            self.unconfirmed.pop(e.event_id, None)

    def overdue(self, now: float, after: float) -> list[ev.Base]:
        """What was noted `after` seconds ago or more and is still not in the log (its publish
        failed, or the handler that decided it failed): to publish again, under the same ids."""
        return [e for e, at in self.unconfirmed.values() if now - at >= after]

    def apply(self, e: Event, seq: int = 0) -> None:
        wid = e.workload_id
        if seq:
            if seq <= self.seqs.get(wid, 0):
                return
            self.seqs[wid] = seq
            if e.event_id and self.unconfirmed.pop(e.event_id, None) is not None and not isinstance(e, ev.Released):
                if isinstance(e, ev.Submitted) and wid in self.workloads:
                    self.workloads[wid] = e.workload  # the log's copy (equal), which the projection shares
                return  # its own decision coming back: applied when noted, and it changes nothing
        pid = self.parent_of.get(wid)
        match e:
            case ev.PipelineExpanded():
                if wid not in self.pipelines:
                    ps = self.pipelines[wid] = PipelineState(wid)
                    ps.apply(e)
                    for i, c in enumerate(e.children):
                        self.parent_of[c.workload_id] = wid
                        self.index_of[c.workload_id] = i
                    self.dirty_pipelines.add(wid)
                return
            case ev.Submitted():
                if seq or wid not in self.workloads:  # the log's copy: the projection's, shared (gpuorch.projection)
                    self.workloads[wid] = e.workload
                if pid is None and is_pipeline(e.workload):
                    self.docs.setdefault(wid, (e.workload, e.at))
                elif pid is None and not ev.is_stage_id(wid) and wid not in self.finished and wid not in self.running:
                    # (a stage's, folded before its pipeline's expansion, is never a plain workload)
                    self.waiting.setdefault(wid, candidate(wid, e.workload, e.at))
                    self.dirty = True
            case ev.StageReady() if pid is not None:
                self._ready(wid, pid, e)
            case ev.Held():
                sig = tuple((h.scope, h.name, h.kind) for h in e.holds)
                ids = self.held.get(wid, ((), set()))[1]
                self.held[wid] = (sig, ids | {e.event_id})
            case ev.Released() if not seq:  # this router's release: counted, folded once the log has it
                if wid not in self.finished and wid not in self.running and wid not in self.releasing:
                    self.releasing[wid] = Running(wid, sys.intern(e.queue), e.gpus, e.pipeline)
                    if (t := self.__dict__.get("_tally")) is not None:
                        t.add(e.queue, e.pipeline, e.gpus)
                self.dirty = True
                return
            case ev.Released():
                self.waiting.pop(wid, None)
                mine = self.releasing.pop(wid, None)
                t = self.__dict__.get("_tally")
                if wid not in self.finished and wid not in self.running:
                    self.running[wid] = Running(wid, sys.intern(e.queue), e.gpus, e.pipeline)
                    if t is not None:
                        t.add(e.queue, e.pipeline, e.gpus)
                if mine is None:
                    self.dirty = True
                elif t is not None:
                    t.remove(mine)  # its own release back from the log: counted once, as running now
            case ev.Completed() | ev.WorkloadFailed() | ev.Cancelled():
                self._finish(wid)
            case ev.Rejected() if e.decision is not None:
                self._finish(wid)
            case ev.CancelRequested() | ev.Cancel():
                self.cancelling.add(wid)
                if self.waiting.pop(wid, None) is not None:
                    self.dirty = True
            case ev.Running():
                r = self.running.get(wid)
                if r is not None and r.gpus > 0 and e.attempt_id not in self.spans:
                    self.spans[e.attempt_id] = _Span(r.queue, r.gpus, e.at)
                    self.dirty = True
            case ev.Succeeded() | ev.Failed() | ev.CancelConfirmed():
                s = self.spans.get(e.attempt_id)
                if s is not None and s.end is None:
                    s.end = e.at
            case _:
                pass
        if pid is not None and pid in self.pipelines:
            self.pipelines[pid].apply(e)
            if isinstance(e, _PROGRESS):  # may make a stage ready or blocked, or end the pipeline
                self.dirty_pipelines.add(pid)
        elif wid in self.pipelines:
            self.pipelines[wid].apply(e)
            self.dirty_pipelines.add(wid)

    def _ready(self, wid: str, pid: str, e: ev.StageReady) -> None:
        ps, doc = self.pipelines.get(pid), self.docs.get(pid)
        if ps is None or doc is None or wid in self.finished or wid in self.running or wid in self.cancelling:
            return
        st = ps.stage_of(wid)
        if st is None:
            return
        wl, at = doc
        self.waiting.setdefault(wid, Candidate(
            workload_id=wid, owner=wl.metadata.owner, queue=wl.spec.policy_queue, gpus=st.gpus,
            priority=wl.spec.priority, submitted_at=at, pipeline=pid, pipeline_limits=wl.spec.limits,
            gpu_hours=st.gpu_hours, index=self.index_of.get(wid, 0),
        ))  # fmt: skip
        self.dirty = True

    def _finish(self, wid: str) -> None:
        self.finished.add(wid)
        self.waiting.pop(wid, None)
        for r in (self.running.pop(wid, None), self.releasing.pop(wid, None)):
            if r is not None and (t := self.__dict__.get("_tally")) is not None:
                t.remove(r)
        self.workloads.pop(wid, None)  # a finished workload is never released again: keep its id only
        self.held.pop(wid, None)
        self.dirty = True

    def retract(self) -> list[str]:
        """Forget this router's releases that the log does not have (yet): each counts no more
        and its workload waits again, to be decided anew. Called when its admission term ends or
        a new one begins (docs/operations.md *Admission leadership*); a retracted release the
        stream did store is folded from the log like another router's. Returns their ids."""
        gone = list(self.releasing)
        t = self.__dict__.get("_tally")
        for wid in gone:
            r = self.releasing.pop(wid)
            self.unconfirmed.pop(event_id(wid, "released"), None)  # never published again
            if t is not None:
                t.remove(r)
        if gone:
            self.dirty = True
        return gone

    # -- decide ------------------------------------------------------------------------------
    def may_admit(self, force: bool = False) -> bool:
        """Could a round admit anything now (work waiting and something changed, or a pipeline's
        stages may become ready)? False: the round decides no release, so what admission needs
        (fair share's usage) need not be computed."""
        return bool(self.dirty_pipelines) or (bool(self.waiting) and (self.dirty or force))

    def tally(self) -> Tally:
        """What released, unfinished work holds (`Tally.of` running and releasing), kept up to
        date as work is released and finishes. Not a field: derived, so a snapshot never carries it."""
        t: Tally | None = self.__dict__.get("_tally")
        if t is None:
            t = self.__dict__["_tally"] = Tally.of(itertools.chain(self.running.values(), self.releasing.values()))
        return t

    def is_child(self, wid: str) -> bool:
        return wid in self.parent_of

    def gpu_spans(self, policy: AdmissionPolicy, now: float, time_scale: float = 1.0) -> list[GpuSpan]:
        """GPU time inside the longest budget window (older spans are dropped: they count nowhere).
        The windows are simulated seconds: `time_scale` times shorter on the events' clock."""
        windows = (
            fairshare.clock_seconds(q.budget.window, time_scale)
            for q in policy.queues
            if q.budget is not None
        )
        horizon = now - max(windows, default=0.0)
        for k in [k for k, s in self.spans.items() if s.end is not None and s.end <= horizon]:
            del self.spans[k]
        return [GpuSpan(s.queue, s.gpus, s.start, s.end) for s in self.spans.values()]

    def step(
        self,
        policy: AdmissionPolicy,
        now: float,
        *,
        force: bool = False,
        usage: fairshare.Usage | None = None,
        time_scale: float = 1.0,
    ) -> GateRound:
        """One round, level-triggered: pipelines' progress (stages ready, blocked, the pipeline's
        end; a cancelled pipeline's cancels), then admission of everything waiting (`admit`, the
        one ordering; `usage`: fair share's, passed through; `time_scale`: the registry's, for
        budgets). Everything it decides is noted at once. `force`: decide even if nothing changed
        (the budget window moves with time)."""
        out = GateRound()
        for pid in sorted(self.dirty_pipelines):
            ps = self.pipelines[pid]
            if ps.finished:
                continue
            if ps.cancel_requested:
                out.cancels += [c for c in cancel_all(ps, ps.cancel_reason, now) if c.event_id not in self.commands]
            else:
                ready = ready_stages(ps, now)
                self.note(ready, now)
                out.events += ready
                blocked = blocked_by_failure(ps, now)
                self.note(blocked, now)
                out.events += blocked
                out.cancels += [
                    ev.Cancel(event_id=event_id(b.workload_id, "cancel", "blocked"), workload_id=b.workload_id, at=now, reason=b.reason)
                    for b in blocked
                ]  # fmt: skip
            end = outcome(ps, now)
            if end is not None:
                self.note([end], now)
                out.events.append(end)
        self.dirty_pipelines.clear()
        self.note(out.cancels, now)
        if not (self.dirty or force) or not self.waiting:
            self.dirty = False
            self.dirty_pipelines.clear()  # what this round noted of them is decided already
            return out
        spans = self.gpu_spans(policy, now, time_scale) if has_budget(policy) else []
        waiting = [c for c in self.waiting.values() if c.workload_id not in self.releasing]
        verdicts = admit(policy, self.tally(), spans, waiting, now, usage, time_scale=time_scale)
        decided: list[Event] = []
        for v in verdicts:
            if isinstance(v, Released):
                decided.append(v.event(now))
                out.released.append(v.workload_id)
            elif isinstance(v, Held):
                sig, ids = self.held.get(v.workload_id, ((), set()))
                if v.signature != sig:
                    decided.append(v.event(now, len(ids) + 1))
            else:
                decided.append(refusal_event(v, now))
        self.note(decided, now)
        out.events += decided
        self.dirty = False
        self.dirty_pipelines.clear()  # releases and holds change no stage's readiness or the outcome
        return out


def has_budget(policy: AdmissionPolicy) -> bool:
    return any(q.budget is not None for q in policy.queues)


def refusal_event(v: Refused, now: float) -> ev.Rejected:
    """A refusal is the router's verdict on the workload's own submit: `rejected`, terminal,
    with a decision that says so (as for work no cluster could ever run)."""
    return ev.Rejected(
        event_id=event_id(v.workload_id, "rejected", "admission"),
        workload_id=v.workload_id,
        at=now,
        reason=f"not admitted: {v.reason}",
        decision=RoutingDecision(workload_id=v.workload_id, decided_at=now, outcome="rejected", summary=f"not admitted: {v.reason}"),
    )
