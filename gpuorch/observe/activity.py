"""Allocated is not productive: device activity, useful work and a diagnosis per attempt, stage
and owner (issue 31; docs/activity.md). Pure: facts in, figures and verdicts out; no I/O, no
clock. The facts are gathered by `gpuorch.observe.devices` (Prometheus or the dcgm-exporter, the
program's progress from the store, the destination's snapshot).

Three measurements, kept apart:

- **allocation**: GPUs x the time the attempt's pods held them (placed -> ended: the report's
  GPU-hours, `gpuorch.observe.timeline`);
- **device activity**: the mean of dcgm-exporter's `DCGM_FI_PROF_GR_ENGINE_ACTIVE` (else
  `DCGM_FI_DEV_GPU_UTIL` / 100) of the attempt's devices, over the held time and over the time the
  program stepped;
- **useful work**: the steps and samples the program reports (`gpuorch.observe.progress`).

The diagnosis, in this order (the first that holds is the verdict; later ones that hold too are
listed as `also`), each with the numbers behind it and a suggestion, as `condor_q
-better-analyze` gives its analysis:

| case | when | suggestion |
|---|---|---|
| (c) `shape` | unplaced; the free GPUs of the suitable nodes add up to the request, but no `per_node` fit on one node (the router's `free_slots`) | wait for a node to drain, or change the shape (explain's GPU_SHAPE hint) |
| (a) `never-used` | mean activity <= `NEVER_USED_ACTIVITY` and memory <= `NEVER_USED_FB_MIB` over the held time (at least `MIN_SAMPLES`), or the program says it ran on the CPU | split the stage: `resources.gpus: 0` |
| (b) `data-bound` | the program waited for input >= `DATA_BOUND_WAIT_SHARE` of its stepping time, and the devices were active < `DATA_BOUND_ACTIVITY` then (or not measured) | storage or staging, not placement |
| (d) `idle-allocation` | the pods held GPUs with no program stepping (before its first step, after its last) >= `IDLE_ALLOCATION_SHARE` of the held time | stage before the GPUs are held; keep the final upload short |
| (e) `healthy` | none of those, with activity or the program's account known | nothing to change |

and, outside the five: `waiting` (unplaced for want of GPUs, not their spread), `no-gpu` (holds no
GPU), `unknown` (not enough measured; the reasons say what is missing). Missing measurements are
`Unknown(reason)`: they never stop anything, they only make the verdict say less.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Literal

from gpuorch_proto.units import format_duration

#: mean device activity at or below this over the held time: the stage never used its GPUs
NEVER_USED_ACTIVITY: Final = 0.02
#: ... and no GPU held more device memory than this (MiB): a framework that only opened the device
NEVER_USED_FB_MIB: Final = 256.0
#: device activity below this while the program stepped counts as idle devices (0-1)
DATA_BOUND_ACTIVITY: Final = 0.6
#: share of its stepping time the program spent waiting for input from which it is data-bound
DATA_BOUND_WAIT_SHARE: Final = 0.3
#: share of the held time with no program stepping (before its first step, after its last)
IDLE_ALLOCATION_SHARE: Final = 0.25
#: samples (all devices) a mean needs before a verdict rests on it
MIN_SAMPLES: Final = 3
#: how many attempts the report names as worst offenders
WORST: Final = 5
#: the exported metrics name this many owners and stages (by allocated GPU-hours); the rest are `OTHER`
TOP_OWNERS: Final = 10
TOP_STAGES: Final = 10
OTHER: Final = "other"
NO_STAGE: Final = "-"  # the stage of a workload that is not a pipeline stage

Case = Literal["shape", "never-used", "data-bound", "idle-allocation", "healthy", "waiting", "no-gpu", "unknown"]
LETTERS: Final[Mapping[str, str]] = {
    "never-used": "a", "data-bound": "b", "shape": "c", "idle-allocation": "d", "healthy": "e",
}  # fmt: skip
TITLES: Final[Mapping[str, str]] = {
    "never-used": "holds GPUs it never uses",
    "data-bound": "data-bound: the devices idle while the program waits for input",
    "shape": "shape: the request does not fit the free GPUs as they are spread",
    "idle-allocation": "idle allocation: pods hold GPUs while no program steps",
    "healthy": "healthy",
    "waiting": "waiting for GPUs (not a shape problem)",
    "no-gpu": "holds no GPU",
    "unknown": "unknown",
}


@dataclass(frozen=True)
class Unknown:
    """A measurement that could not be made, and why (no exporter, Prometheus down, ...)."""

    reason: str


@dataclass(frozen=True)
class DeviceUse:
    """The attempt's devices over one window."""

    activity: float  # mean over the window and the devices, 0-1
    samples: int  # samples behind it, all devices together
    devices: int  # GPUs seen
    fb_used_mib: float  # most device memory one of them held in the window
    series: str  # DCGM_FI_PROF_GR_ENGINE_ACTIVE, or DCGM_FI_DEV_GPU_UTIL (read as percent / 100)
    source: str  # where it was read (a Prometheus URL, an exporter path)


Measured = DeviceUse | Unknown


@dataclass(frozen=True)
class Progress:
    """What the program reported of its work in this attempt (its own clock)."""

    steps: int
    samples: int
    compute_seconds: float
    input_wait_seconds: float
    first_step_at: float | None
    last_step_at: float | None
    device: str = "gpu"
    done: bool = False

    @classmethod
    def of(cls, doc: Mapping[str, Any]) -> Progress:
        """From a progress document (`gpuorch.observe.progress.parse_work` checked its numbers)."""

        def t(k: str) -> float | None:
            v = doc.get(k)
            return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None

        return cls(
            steps=int(doc["steps"]), samples=int(doc["samples"]), compute_seconds=float(doc["compute_seconds"]),
            input_wait_seconds=float(doc["input_wait_seconds"]), first_step_at=t("first_step_at"),
            last_step_at=t("last_step_at"), device=str(doc.get("device") or "gpu"), done=doc.get("done") is True,
        )  # fmt: skip

    @property
    def wait_share(self) -> float | None:
        spent = self.compute_seconds + self.input_wait_seconds
        return self.input_wait_seconds / spent if spent > 0 else None

    @property
    def span(self) -> float | None:
        if self.first_step_at is None or self.last_step_at is None or self.last_step_at <= self.first_step_at:
            return None
        return self.last_step_at - self.first_step_at


@dataclass(frozen=True)
class Shape:
    """An unplaced request against the destination's free GPUs, from its latest snapshot and the
    router's own rules (`gpuorch.observe.devices.shape_of`)."""

    cluster: str
    per_node: int  # GPUs one node must offer
    units: int  # placements needed
    free_total: int  # free GPUs on the suitable Ready nodes
    free_slots: int  # placements of `per_node` free now
    free_by_node: tuple[int, ...]  # free GPUs of each suitable node that has any, most first
    scheduler: str = ""  # what the destination's scheduler says of the pods
    explain: tuple[str, ...] = ()  # what `gpuorch explain` says of that cluster
    hint: str = ""  # explain's hint for a shape that does not fit (GPU_SHAPE)

    @property
    def needed(self) -> int:
        return self.per_node * self.units

    @property
    def fragmented(self) -> bool:
        return self.free_slots < self.units and self.free_total >= self.needed


@dataclass(frozen=True)
class AttemptFacts:
    workload_id: str
    attempt_id: str
    cluster: str
    owner: str
    gpus: float  # GPUs it holds while its pods are placed
    held: tuple[float, float] | None  # placed -> ended (or now); None: its pods hold nothing (yet)
    outcome: str  # the timeline's outcome (promoted, failed, live, ...)
    progress: Progress | Unknown
    held_use: Measured  # device use over `held`
    compute_use: Measured  # device use while the program stepped
    stage: str | None = None  # the pipeline stage it runs, if any
    pipeline: str | None = None
    compute_started: float | None = None  # the `compute-started` mark (when no progress says it)
    shape: Shape | None = None  # its request against the destination's free GPUs, while unplaced


@dataclass(frozen=True)
class Work:
    """Allocation, activity and useful work of one attempt, in the clusters' time (x time_scale)."""

    held_seconds: float
    allocated_gpu_hours: float
    active_gpu_hours: float | None  # allocated x mean activity over the held time
    activity_held: float | None
    activity_stepping: float | None
    idle_before_seconds: float | None  # held before the program's first step
    idle_after_seconds: float | None  # held after its last step (it finished)
    steps: int | None
    samples: int | None
    steps_per_hour: float | None  # over its stepping time
    samples_per_hour: float | None
    gpu_hours_per_1k_steps: float | None
    wait_share: float | None  # of its stepping time, waiting for input (the program's account)

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def work_of(f: AttemptFacts, time_scale: float = 1.0) -> Work:
    k = time_scale
    held = (f.held[1] - f.held[0]) if f.held is not None else 0.0
    allocated = f.gpus * held * k / 3600.0
    hu = f.held_use if isinstance(f.held_use, DeviceUse) else None
    cu = f.compute_use if isinstance(f.compute_use, DeviceUse) else None
    p = f.progress if isinstance(f.progress, Progress) else None
    first = p.first_step_at if p is not None and p.first_step_at is not None else f.compute_started
    before = after = None
    if f.held is not None and first is not None:
        before = max(0.0, min(first, f.held[1]) - f.held[0]) * k
    if f.held is not None and p is not None and p.done and p.last_step_at is not None and f.outcome != "live":
        after = max(0.0, f.held[1] - max(p.last_step_at, f.held[0])) * k
    span = p.span * k if p is not None and p.span is not None else None
    steps = p.steps if p is not None else None
    return Work(
        held_seconds=held * k, allocated_gpu_hours=allocated,
        active_gpu_hours=allocated * hu.activity if hu is not None else None,
        activity_held=hu.activity if hu is not None else None, activity_stepping=cu.activity if cu is not None else None,
        idle_before_seconds=before, idle_after_seconds=after, steps=steps, samples=p.samples if p is not None else None,
        steps_per_hour=p.steps / span * 3600.0 if p is not None and span else None,
        samples_per_hour=p.samples / span * 3600.0 if p is not None and span else None,
        gpu_hours_per_1k_steps=allocated / steps * 1000.0 if steps else None,
        wait_share=p.wait_share if p is not None else None,
    )  # fmt: skip


@dataclass(frozen=True)
class Diagnosis:
    case: Case
    summary: str  # one line, with the numbers
    evidence: tuple[str, ...]  # the numbers behind it, one per line
    suggestion: str
    also: tuple[Case, ...] = ()  # later cases that hold too
    unknown: tuple[str, ...] = ()  # what could not be measured, and why
    numbers: Mapping[str, Any] = field(default_factory=dict)

    @property
    def letter(self) -> str:
        return LETTERS.get(self.case, "")

    @property
    def title(self) -> str:
        return TITLES[self.case]

    def as_dict(self) -> dict[str, Any]:
        return {
            "case": self.case, "letter": self.letter or None, "title": self.title, "summary": self.summary,
            "evidence": list(self.evidence), "suggestion": self.suggestion, "also": list(self.also),
            "unknown": list(self.unknown), "numbers": dict(self.numbers),
        }  # fmt: skip


def _pct(x: float | None) -> str:
    return "?" if x is None else f"{100 * x:.0f}%"


def _d(seconds: float | None) -> str:
    return "?" if seconds is None else ("0s" if seconds <= 0 else format_duration(seconds))


def unknowns(f: AttemptFacts) -> tuple[str, ...]:
    out = []
    for what, m in (("device activity over the held time", f.held_use), ("device activity while stepping", f.compute_use),
                    ("the program's progress", f.progress)):  # fmt: skip
        if isinstance(m, Unknown):
            out.append(f"{what}: unknown ({m.reason})")
    return tuple(dict.fromkeys(out))


def _shape(s: Shape) -> Diagnosis:
    spread = ", ".join(str(n) for n in s.free_by_node[:8]) + (", ..." if len(s.free_by_node) > 8 else "")
    numbers = {"cluster": s.cluster, "needs_per_node": s.per_node, "placements": s.units, "free_gpus": s.free_total,
               "free_placements": s.free_slots, "free_by_node": list(s.free_by_node)}  # fmt: skip
    evidence = [
        f"it needs {s.per_node} GPUs on one node" + (f", {s.units} times" if s.units > 1 else ""),
        f"{s.cluster} has {s.free_total} GPUs free on {len(s.free_by_node)} suitable nodes ({spread} per node): "
        f"{s.free_slots} of the {s.units} placements fit now",
    ]
    if s.scheduler:
        evidence.append(f"the scheduler says: {s.scheduler}")
    evidence += [f"explain: {line}" for line in s.explain]
    if s.fragmented:
        return Diagnosis(
            "shape", f"{s.free_total} GPUs free on {s.cluster} but at most {max(s.free_by_node, default=0)} on one node; "
            f"it needs {s.per_node} on one node", tuple(evidence),
            "placement, not capacity: it starts when a node drains (the router's estimate counts it), or change "
            f"the shape: {s.hint or 'fewer GPUs per node'}; `gpuorch explain` has the routing's view",
            numbers=numbers,
        )  # fmt: skip
    return Diagnosis(
        "waiting", f"{s.free_total} GPUs free on {s.cluster}, {s.needed} needed: it waits for capacity, not for a shape",
        tuple(evidence), "capacity, not shape: it starts as GPUs free up; `gpuorch explain` says where else it could run",
        numbers=numbers,
    )  # fmt: skip


def diagnose(f: AttemptFacts, time_scale: float = 1.0) -> Diagnosis:
    """The verdict on one attempt, with the numbers behind it (module docstring: the table)."""
    missing = unknowns(f)
    if f.held is None and f.shape is not None:
        d = _shape(f.shape)
        return Diagnosis(d.case, d.summary, d.evidence, d.suggestion, unknown=(), numbers=d.numbers)
    if f.gpus <= 0:
        return Diagnosis("no-gpu", "it holds no GPU", (), "nothing to diagnose on GPUs")
    if f.held is None:
        return Diagnosis("unknown", "its pods hold no GPUs yet", (), "look again once it is placed", unknown=missing)
    w = work_of(f, time_scale)
    hu = f.held_use if isinstance(f.held_use, DeviceUse) else None
    cu = f.compute_use if isinstance(f.compute_use, DeviceUse) else None
    p = f.progress if isinstance(f.progress, Progress) else None
    numbers: dict[str, Any] = {"gpus": f.gpus, **w.as_dict()}
    if hu is not None:
        numbers.update(fb_used_mib=hu.fb_used_mib, device_samples=hu.samples, devices=hu.devices, series=hu.series)
    held_line = (
        f"{f.gpus:g} GPUs held {_d(w.held_seconds)} = {w.allocated_gpu_hours:.2f} GPU-hours; device activity "
        + (f"{_pct(hu.activity)} (at most {hu.fb_used_mib:.0f} MiB used; {hu.samples} samples of {hu.series})" if hu else "unknown")
    )  # fmt: skip
    found: list[tuple[Case, str, list[str], str]] = []
    # (a) holds GPUs it never uses
    measured_idle = hu is not None and hu.samples >= MIN_SAMPLES and hu.activity <= NEVER_USED_ACTIVITY and hu.fb_used_mib <= NEVER_USED_FB_MIB
    if measured_idle or (hu is None and p is not None and p.device == "cpu"):
        why = [held_line] + ([f"the program says it computed on the {p.device}"] if p is not None and p.device != "gpu" else [])
        found.append(("never-used", f"{f.gpus:g} GPUs held {_d(w.held_seconds)} at {_pct(hu.activity if hu else None)} activity",
                      why, "split its resources: run this stage with resources.gpus: 0 (a CPU stage) and keep the GPUs "
                      "for the stage that computes on them"))  # fmt: skip
    # (b) data-bound
    share = p.wait_share if p is not None else None
    if share is not None and share >= DATA_BOUND_WAIT_SHARE and (cu is None or cu.activity < DATA_BOUND_ACTIVITY):
        found.append(("data-bound", f"devices {_pct(cu.activity if cu else None)} active while the program waited "
                      f"{_pct(share)} of its time for input",
                      [f"the program: {p.steps} steps, {_d(p.compute_seconds * time_scale)} computing, "  # type: ignore[union-attr]
                       f"{_d(p.input_wait_seconds * time_scale)} waiting for input ({_pct(share)})",  # type: ignore[union-attr]
                       f"device activity while it stepped: {_pct(cu.activity) if cu else 'unknown'}"],
                      "storage or staging, not placement: feed it faster (stage the dataset into the cluster's cache, "
                      "a location with more bandwidth, more reader workers, prefetch); more GPUs or another "
                      "cluster would idle the same way"))  # fmt: skip
    # (d) idle allocation
    idle = (w.idle_before_seconds or 0.0) + (w.idle_after_seconds or 0.0)
    idle_share = idle / w.held_seconds if w.held_seconds > 0 else None
    if w.idle_before_seconds is None and p is None and f.compute_started is None and f.outcome != "live":
        idle_share, idle = 1.0, w.held_seconds  # held to the end and never stepped
    if idle_share is not None and idle_share >= IDLE_ALLOCATION_SHARE:
        found.append(("idle-allocation", f"pods held {f.gpus:g} GPUs {_d(idle)} ({_pct(idle_share)} of {_d(w.held_seconds)}) "
                      "with no program stepping",
                      [f"before its first step: {_d(w.idle_before_seconds)} (image pull, staging inside the pod, start-up)",
                       f"after its last step: {_d(w.idle_after_seconds)} (final upload, teardown)"],
                      "stage inputs before the pods hold GPUs (the cluster's cache, a staging stage without GPUs) and "
                      "keep what runs after the program short"))  # fmt: skip
    if found:
        case, summary, evidence, suggestion = found[0]
        if case != "never-used":
            evidence = [held_line, *evidence]
        return Diagnosis(case, summary, tuple(evidence), suggestion, tuple(c for c, *_ in found[1:]), missing, numbers)
    if cu is None and hu is None and p is None:
        return Diagnosis("unknown", "neither device activity nor the program's progress is known", (held_line,),
                         "see why below: give the registry a metrics source (registry.metrics) and report progress",
                         unknown=missing, numbers=numbers)  # fmt: skip
    act = cu.activity if cu is not None else (hu.activity if hu is not None else None)
    rate = f", {w.steps_per_hour:.0f} steps/h" if w.steps_per_hour else ""
    return Diagnosis(
        "healthy", f"devices {_pct(act)} active while it stepped{rate}",
        (held_line, f"waiting for input: {_pct(share)}; held with no program stepping: {_pct(idle_share)}"),
        "nothing to change", (), missing, numbers,
    )  # fmt: skip


@dataclass(frozen=True)
class Judged:
    """One attempt with its figures and its verdict, computed once for every view of it."""

    facts: AttemptFacts
    work: Work
    diagnosis: Diagnosis


def judge(facts: Iterable[AttemptFacts], time_scale: float = 1.0) -> list[Judged]:
    return [Judged(f, work_of(f, time_scale), diagnose(f, time_scale)) for f in facts]


def work_line(w: Work) -> str | None:
    """The useful-work line `explain` and the web view show (None: the program reported nothing)."""
    if w.steps is None:
        return None
    per = f"; {w.gpu_hours_per_1k_steps:.3f} GPU-hours per 1,000 steps" if w.gpu_hours_per_1k_steps else ""
    rate = f" ({w.steps_per_hour:.0f} steps/h, {w.samples_per_hour:.0f} samples/h)" if w.steps_per_hour and w.samples_per_hour else ""
    return f"useful work: {w.steps} steps, {w.samples} samples{rate}{per}"


def account(j: Judged) -> dict[str, Any]:
    """One attempt's section as `explain -o json` (`activity`) and the web view give it: who, the
    figures, the verdict and the useful-work line."""
    f, d = j.facts, j.diagnosis
    return {
        "workload_id": f.workload_id, "attempt_id": f.attempt_id, "cluster": f.cluster, "stage": f.stage,
        "outcome": f.outcome, "work": j.work.as_dict(), "diagnosis": d.as_dict(), "work_line": work_line(j.work),
        "also_titles": [TITLES[c] for c in d.also],
    }  # fmt: skip


def render(facts: Sequence[AttemptFacts], time_scale: float = 1.0) -> list[str]:
    """`gpuorch explain`'s section: per attempt, allocation vs activity vs useful work, and the verdict."""
    lines = ["Allocated vs productive (docs/activity.md):"]
    for j in judge(facts, time_scale):
        f, d = j.facts, j.diagnosis
        tag = f"({d.letter}) " if d.letter else ""
        lines.append(f"  {f.attempt_id} on {f.cluster} [{f.outcome}]: {tag}{d.title}")
        lines.append(f"    {d.summary}")
        lines += [f"    - {e}" for e in d.evidence]
        if (line := work_line(j.work)) is not None:
            lines.append(f"    - {line}")
        lines.append(f"    -> {d.suggestion}")
        if d.also:
            lines.append("    also: " + "; ".join(TITLES[c] for c in d.also))
        lines += [f"    ? {u}" for u in d.unknown]
    return lines


@dataclass
class Group:
    """The sums of a set of attempts (a report row, a metrics cell); GPU-hours in the clusters' time."""

    attempts: int = 0
    allocated: float = 0.0
    active: float = 0.0
    known: float = 0.0  # allocated GPU-hours whose activity is known
    steps: int = 0
    samples: int = 0
    stepping_hours: float = 0.0
    results: int = 0
    cases: dict[str, int] = field(default_factory=dict)

    def add(self, f: AttemptFacts, w: Work, d: Diagnosis) -> None:
        self.attempts += 1
        self.allocated += w.allocated_gpu_hours
        if w.active_gpu_hours is not None:
            self.active += w.active_gpu_hours
            self.known += w.allocated_gpu_hours
        if w.steps is not None and w.steps_per_hour:
            self.steps += w.steps
            self.samples += w.samples or 0
            self.stepping_hours += w.steps / w.steps_per_hour
        self.results += f.outcome == "promoted"
        self.cases[d.case] = self.cases.get(d.case, 0) + 1

    def as_dict(self, key: str) -> dict[str, Any]:
        return {
            "key": key, "attempts": self.attempts, "allocated_gpu_hours": self.allocated,
            "active_gpu_hours": self.active if self.known else None,
            "activity": self.active / self.known if self.known else None,
            "activity_known_gpu_hours": self.known,
            "steps": self.steps, "samples": self.samples,
            "steps_per_hour": self.steps / self.stepping_hours if self.stepping_hours else None,
            "samples_per_hour": self.samples / self.stepping_hours if self.stepping_hours else None,
            "gpu_hours_per_1k_steps": self.allocated / self.steps * 1000.0 if self.steps else None,
            "results": self.results,
            "gpu_hours_per_result": self.allocated / self.results if self.results else None,
            "active_gpu_hours_per_result": self.active / self.results if self.results and self.known else None,
            "cases": dict(sorted(self.cases.items())),
        }  # fmt: skip


def report(facts: Iterable[AttemptFacts], time_scale: float = 1.0) -> dict[str, Any]:
    """Per destination, owner and pipeline stage: allocated vs active GPU-hours, useful
    throughput, GPU-hours per 1,000 steps and per result, the verdicts' counts; and the worst
    offenders (most GPU-hours held without activity)."""
    return report_of(judge(facts, time_scale))


def report_of(judged: Iterable[Judged]) -> dict[str, Any]:
    """`report` of attempts already judged (the web view judges each attempt once per round)."""
    groups: dict[str, dict[str, Group]] = {"destination": {}, "owner": {}, "stage": {}}
    offenders = []
    for j in judged:
        f, w, d = j.facts, j.work, j.diagnosis
        for by, key in (("destination", f.cluster), ("owner", f.owner), ("stage", f.stage or NO_STAGE)):
            groups[by].setdefault(key, Group()).add(f, w, d)
        wasted = w.allocated_gpu_hours - w.active_gpu_hours if w.active_gpu_hours is not None else None
        if d.case not in ("healthy", "no-gpu") and w.allocated_gpu_hours > 0:
            offenders.append({
                "attempt_id": f.attempt_id, "workload_id": f.workload_id, "cluster": f.cluster, "owner": f.owner,
                "stage": f.stage, "case": d.case, "letter": d.letter or None, "summary": d.summary,
                "allocated_gpu_hours": w.allocated_gpu_hours, "idle_gpu_hours": wasted, "suggestion": d.suggestion,
            })  # fmt: skip

    def badness(o: Mapping[str, Any]) -> tuple[float, str]:
        idle = o["idle_gpu_hours"] if o["idle_gpu_hours"] is not None else o["allocated_gpu_hours"]
        return (-float(idle), str(o["attempt_id"]))

    offenders.sort(key=badness)
    return {
        **{f"by_{by}": [g.as_dict(k) for k, g in sorted(gs.items())] for by, gs in groups.items()},
        "worst": offenders[:WORST],
    }


@dataclass(frozen=True)
class Cell:
    """One (destination, owner, stage) of the metrics gpuorch exports (`gpuorch.observe.metrics`)."""

    destination: str
    owner: str
    stage: str
    group: Group


def cells(judged: Iterable[Judged], top_owners: int = TOP_OWNERS, top_stages: int = TOP_STAGES) -> list[Cell]:
    """The figures per (destination, owner, stage), for labelled metrics with a bounded number of
    series: the `top_owners` owners and `top_stages` stages with the most allocated GPU-hours keep
    their names, the others are summed as `OTHER` (destinations are the registry's clusters)."""
    js = list(judged)
    alloc_owner: dict[str, float] = {}
    alloc_stage: dict[str, float] = {}
    for j in js:
        alloc_owner[j.facts.owner] = alloc_owner.get(j.facts.owner, 0.0) + j.work.allocated_gpu_hours
        stage = j.facts.stage or NO_STAGE
        alloc_stage[stage] = alloc_stage.get(stage, 0.0) + j.work.allocated_gpu_hours

    def top(alloc: Mapping[str, float], n: int) -> set[str]:
        return {k for k, _ in sorted(alloc.items(), key=lambda kv: (-kv[1], kv[0]))[:n]}

    owners, stages = top(alloc_owner, top_owners), top(alloc_stage, top_stages) | {NO_STAGE}
    out: dict[tuple[str, str, str], Group] = {}
    for j in js:
        stage = j.facts.stage or NO_STAGE
        key = (j.facts.cluster, j.facts.owner if j.facts.owner in owners else OTHER, stage if stage in stages else OTHER)
        out.setdefault(key, Group()).add(j.facts, j.work, j.diagnosis)
    return [Cell(d, o, s, g) for (d, o, s), g in sorted(out.items())]


def render_report(r: Mapping[str, Any]) -> list[str]:
    """The activity part of `gpuorch report`, as tables a person reads."""

    def n(v: float | None, fmt: str = "{:.2f}") -> str:
        return "-" if v is None else fmt.format(v)

    lines: list[str] = []
    head = ["", "ATTEMPTS", "ALLOC GPU-H", "ACTIVE GPU-H", "ACTIVITY", "STEPS/H", "GPU-H/1K STEPS", "GPU-H/RESULT", "VERDICTS"]
    for by in ("destination", "owner", "stage"):
        rows = [[g["key"], str(g["attempts"]), n(g["allocated_gpu_hours"]), n(g["active_gpu_hours"]), _pct(g["activity"]),
                 n(g["steps_per_hour"], "{:.0f}"), n(g["gpu_hours_per_1k_steps"], "{:.3f}"), n(g["gpu_hours_per_result"]),
                 ", ".join(f"{c} {k}" for c, k in g["cases"].items())] for g in r[f"by_{by}"]]  # fmt: skip
        cols = [by.upper(), *head[1:]]
        widths = [max(len(cols[i]), *(len(row[i]) for row in rows)) if rows else len(cols[i]) for i in range(len(cols))]
        lines += ["", "  ".join(c.ljust(widths[i]) for i, c in enumerate(cols))]
        lines += ["  ".join(c.ljust(widths[i]) for i, c in enumerate(row)) for row in rows]
    if r["worst"]:
        lines += ["", "worst offenders (GPU-hours held without activity):"]
        for o in r["worst"]:
            tag = f"({o['letter']}) " if o["letter"] else ""
            idle = n(o["idle_gpu_hours"]) if o["idle_gpu_hours"] is not None else f"{o['allocated_gpu_hours']:.2f} held, activity unknown"
            lines.append(f"  {o['attempt_id']} on {o['cluster']} ({o['owner']}): {tag}{o['case']}, {idle} idle GPU-hours: {o['summary']}")
            lines.append(f"    -> {o['suggestion']}")
    return lines
