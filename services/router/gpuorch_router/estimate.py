"""Time to result and cost of an eligible cluster (DESIGN §5.2), in simulated seconds (reference).

``total = queue wait + image + data staging - staging hidden in the queue + startup + run
- run saved by resuming + output transfer``; ``cost = GPUs x (startup + run - saved) x price``;
``score = time_weight x hours + cost_weight x cost``, nudged by the soft preferences. The terms:

* queue wait (:func:`queue_wait`): inventory's wait for the published request shape nearest the
  gang (:func:`shape_wait`); from a snapshot without waits per shape, the queue's single estimate,
  else the GPU backlog ahead over the suitable GPUs, in mean job lengths; zero when the gang fits
  now and nobody is ahead. The router never models the queue itself: inventory owns that;
* staging: image pull unless cached, data copies (``checks.data_staging``), a measured fraction of
  which overlaps the queue wait (``history.overlap_for``);
* run (:func:`run_seconds`): the learnt distribution of the workload's runs (a quantile, blended
  with the declared value while runs are few or scattered: ``history.RunStats.blend``), else
  declared, else a default, scaled by :data:`RELATIVE_SPEED` to the slowest suitable GPU model;
  ``Estimate.run_source`` says which;
* resume: a cluster that can resume the latest checkpoint (``gpuorch_proto.resume``) saves the run
  the checkpoint holds; when that amount is not known, a small score nudge (:data:`RESUME_FACTOR`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Final

from gpuorch_proto.inventory import ShapeWait
from gpuorch_proto.placement import Placement
from gpuorch_proto.resume import ResumeVerdict
from gpuorch_proto.routing import Check, Estimate

from .checks import Staging, dur, free_slots
from .demand import Demand
from .history import SIGNATURE_PREFIX, RunStats
from .index import NodeClass, SnapshotIndex

__all__ = [
    "DEFAULT_IMAGE_PULL_SECONDS",
    "DEFAULT_OUTPUT_TRANSFER_SECONDS",
    "DEFAULT_RUN_SECONDS",
    "MEAN_JOB_SECONDS",
    "PREFERRED_CLUSTER_FACTOR",
    "PREFERRED_POOL_FACTOR",
    "RELATIVE_SPEED",
    "RESUME_FACTOR",
    "Elig",
    "build_terms",
    "declared_seconds",
    "estimate",
    "placement_terms",
    "queue_wait",
    "relative_speed",
    "run_seconds",
    "shape_wait",
]

#: Throughput relative to an A100 (= 1.0), by GPU family token in the GFD product name. Coarse
#: figures for mixed-precision training; a workload class's measured history overrides them.
RELATIVE_SPEED: Final[Mapping[str, float]] = {
    "B200": 4.0,
    "GH200": 2.4,
    "H200": 2.4,
    "H100": 2.0,
    "H800": 2.0,
    "MI300X": 2.0,
    "A100": 1.0,
    "A800": 1.0,
    "MI250X": 0.9,
    "L40S": 0.9,
    "L40": 0.7,
    "A40": 0.6,
    "A6000": 0.6,
    "V100": 0.5,
    "A10G": 0.45,
    "A10": 0.45,
    "L4": 0.35,
    "T4": 0.15,
}
#: Run time assumed when neither the workload nor history says (seconds on a speed-1.0 GPU).
DEFAULT_RUN_SECONDS: Final = 3600.0
#: Image pull when the image digest is not in the cluster's ``images_cached``.
DEFAULT_IMAGE_PULL_SECONDS: Final = 120.0
#: Output transfer (finished → promoted) when history has no measurement for the cluster.
DEFAULT_OUTPUT_TRANSFER_SECONDS: Final = 60.0
#: Mean GPU job length used to turn a GPU backlog into a wait when the queue has no measured estimate.
MEAN_JOB_SECONDS: Final = 3600.0
#: Score multipliers for soft preferences (lower score wins): a small nudge, never a hard rule.
PREFERRED_CLUSTER_FACTOR: Final = 0.95
PREFERRED_POOL_FACTOR: Final = 0.98
#: A cluster that can resume a checkpoint whose run time is not known: a nudge, as a preference.
RESUME_FACTOR: Final = 0.97


@dataclass(slots=True, eq=False)
class Elig:
    """One cluster's checks (everything but freshness), with what the estimate needs."""

    checks: list[Check]
    ok: bool
    staging: Staging
    resume: ResumeVerdict | None = None  # can this cluster resume the latest checkpoint
    queue_wait: float = 0.0
    queue_basis: str = ""  # what the queue wait is (`queue_wait`'s why)
    queue: str = ""  # "" = the cluster has no admission queues
    product: str | None = None  # GPU model the run time is scaled to
    only_model: bool = False  # every suitable node has that model (the run can land on no other)
    pools: frozenset[str] = frozenset()  # pools of the suitable nodes (for the pool preference)
    placement: Placement | None = None  # the Job's node constraints here, when eligible


def _tokens(text: str) -> tuple[str, ...]:
    return tuple(t for t in text.upper().replace("_", "-").replace(" ", "-").split("-") if t)


def relative_speed(product: str | None) -> float:
    """Throughput of `product` relative to an A100; unknown models (and CPU) are 1.0."""
    if not product:
        return 1.0
    for token in _tokens(product):
        speed = RELATIVE_SPEED.get(token)
        if speed is not None:
            return speed
    return 1.0


def _on_suitable(idx: SnapshotIndex, suitable: Sequence[NodeClass], wait: ShapeWait) -> bool:
    """Whether every GPU node the shape's wait counts is one the gang may use (and there is one)."""
    counted = [c for c in idx.classes if c.allocatable > 0 and wait.shape.counts(c.product, c.pool)]
    if not counted:
        return False
    mine = {id(c) for c in suitable}
    if all(id(c) in mine for c in counted):
        return True
    names = {n.name for c in suitable for n in c.members}  # classes regrouped (a hostname selector)
    return all(n.name in names for c in counted for n in c.members)


def shape_wait(
    idx: SnapshotIndex, d: Demand, suitable: Sequence[NodeClass], waits: Sequence[ShapeWait]
) -> tuple[ShapeWait, bool] | None:
    """The published wait for the gang's shape (docs/routing.md, *Queue wait*), and whether that
    shape covers the gang. Of the shapes whose nodes the gang may all use, the smallest (in GPUs,
    then GPUs per worker) at least as large as the gang, per worker and in all; of equal ones the
    earliest (the gang starts wherever a place frees first). None covers it: the largest of them
    (an optimistic wait). None on nodes it may use (a gang narrower than any shape, a snapshot
    without shapes): None, and the caller uses the queue's single estimate."""
    usable = [w for w in waits if _on_suitable(idx, suitable, w)]
    if not usable:
        return None
    need = d.per_node * d.units
    covering = [w for w in usable if w.shape.gpus >= d.per_node and w.shape.gpus * w.shape.workers >= need]
    if covering:
        smallest = min((w.shape.gpus * w.shape.workers, w.shape.gpus) for w in covering)
        same = [w for w in covering if (w.shape.gpus * w.shape.workers, w.shape.gpus) == smallest]
        return min(same, key=lambda w: w.seconds), True
    return max(usable, key=lambda w: (w.shape.gpus * w.shape.workers, w.shape.gpus, -w.seconds)), False


def queue_wait(idx: SnapshotIndex, d: Demand, suitable: Sequence[NodeClass], queue: str) -> tuple[float, str]:
    """(seconds, why) until the gang could start here, for one queue."""
    n_free = sum(free_slots(c, d.per_node, d.units) for c in suitable)
    fits_now = n_free >= d.units
    info = idx.queue_info.get(queue) if queue else None
    ahead = info.pending_gpus if info is not None else idx.pending_gpus
    if fits_now and ahead <= 0:
        return 0.0, "fits now, nothing pending ahead"
    if info is not None and info.shape_waits and d.per_node > 0:
        found = shape_wait(idx, d, suitable, info.shape_waits)
        if found is not None:
            w, covers = found
            why = f"queue {queue}: inventory's wait for {w.shape.describe()} ({w.source})"
            return w.seconds, why if covers else why + ", the largest shape published on its nodes: it asks for more"
    if info is not None and info.estimated_wait_seconds > 0:
        return info.estimated_wait_seconds, f"queue {queue}: inventory's single estimate (one GPU)"
    if d.per_node <= 0:
        return 0.0, "no GPU"
    capacity = sum(c.ready * c.allocatable for c in suitable)
    free = sum(f * n for c in suitable for f, n in c.free_hist)
    need = d.per_worker * d.workers
    backlog = float(ahead + need - free)
    if not fits_now:
        backlog = max(backlog, float(d.per_node))  # fragmented: a node must drain first
    if backlog <= 0 or capacity <= 0:
        return 0.0, "fits now"
    return MEAN_JOB_SECONDS * backlog / capacity, f"{backlog:g} GPUs backlog on {capacity} suitable GPUs"


def declared_seconds(d: Demand, speed: float) -> float | None:
    """The run time the workload declares (on its reference GPU), on a GPU of relative `speed`."""
    if d.declared_run is None:
        return None
    return d.declared_run * relative_speed(d.reference) / speed


def _source_model(learnt: Mapping[str, RunStats]) -> str:
    """Which model's runs to read when `product` has none: the most runs, then a known model."""
    return max(learnt, key=lambda m: (learnt[m].n, m != "", m))


def run_seconds(d: Demand, product: str | None, speed: float | None = None) -> tuple[float, str]:
    """(seconds, source) of the run on `product` (`speed`: its relative speed, if known).

    Learnt runs of the workload's key (`history.workload_key`) on `product` if there are any, else
    on the model with the most runs scaled by the speed table: for a class, their p50 blended
    with the declared value (`history.RunStats.blend`); for a signature, the declared value
    corrected by the bias its runs show (`history.RunStats.calibrate`). Else declared; else a
    default. The source says which, in words (`Estimate.run_source`, shown by ``explain``)."""
    target = relative_speed(product) if speed is None else speed
    declared = declared_seconds(d, target)
    learnt = d.history.runs_of(d.key) if d.history is not None else None
    if learnt:
        model = product or ""
        src = model if model in learnt else _source_model(learnt)
        stats = learnt[src]
        scale = 1.0 if src == model else relative_speed(src or None) / target
        q = round(d.history.quantile * 100) if d.history is not None else 50
        runs = f"{stats.n} run{'s' if stats.n != 1 else ''} of {d.key_label}"
        if src != model:  # (on `product` itself, explain names it already)
            runs += f" on {src or 'an unknown GPU'}, scaled x{scale:.2g} to {product or 'no GPU'}"
        if declared is not None and d.key.startswith(SIGNATURE_PREFIX):  # how this team's declarations err
            seconds, factor = stats.calibrate(declared)
            if factor == 1.0:
                return declared, f"declared {dur(declared)}; {runs}: run/declared p50 {stats.ratio:.2f}, within noise"
            return seconds, f"declared {dur(declared)} x {factor:.2f}, the p50 of run/declared of {runs}"
        seconds, weight = stats.blend(declared / scale if declared is not None else None, scaled=src != model)
        text = f"p{q} {dur(stats.value)} of {runs}"
        if declared is not None and weight <= 0:  # the declared value, exactly as without history
            return declared, f"declared {dur(declared)}; {text} (weight 0: they scatter more than declarations err)"
        if declared is not None:
            text += f" (weight {weight:.2f}); declared {dur(declared)}"
        return seconds * scale, text
    if declared is not None:
        return declared, f"declared {dur(declared)}" + (f" on {d.reference}" if d.reference and d.reference != product else "") + "; no runs learnt"
    return DEFAULT_RUN_SECONDS / target, f"default {dur(DEFAULT_RUN_SECONDS / target)}: nothing declared, no runs learnt"


def placement_terms(
    idx: SnapshotIndex, d: Demand, suitable: Sequence[NodeClass], queues: Sequence[str]
) -> tuple[float, str, str | None, frozenset[str], bool, str]:
    """(queue wait, queue, GPU model assumed, pools of the suitable nodes, is that model the only
    suitable one, what the wait is) of an eligible cluster: the best queue, and the slowest suitable
    model (the destination places the gang: routing is not placement)."""
    best_wait, best_queue, basis = math.inf, "", ""
    for q in queues:
        wait, why = queue_wait(idx, d, suitable, q)
        if (wait, q) < (best_wait, best_queue):
            best_wait, best_queue, basis = wait, q, why
    products = sorted({c.product for c in suitable if c.allocatable > 0 and c.product}, key=relative_speed)
    product = products[0] if (products and d.per_worker > 0) else None
    pools = frozenset(c.pool for c in suitable if c.pool)
    return best_wait, best_queue, product, pools, len(products) == 1, basis


def estimate(idx: SnapshotIndex, d: Demand, elig: Elig, speed: float | None = None) -> Estimate:
    """Every term of the time to result on this eligible cluster, its cost and its score
    (`speed`: ``relative_speed(elig.product)``, when the caller has it)."""
    wait, product, staging = elig.queue_wait, elig.product, elig.staging
    image = 0.0 if d.image in idx.images_cached else DEFAULT_IMAGE_PULL_SECONDS
    data = staging.seconds
    overlap, _ = d.history.overlap_for(idx.cluster) if d.history is not None else (0.0, False)
    hidden = min(wait, max(0.0, min(1.0, overlap)) * (image + data))
    run, source = run_seconds(d, product, speed)
    resumes = elig.resume is not None and elig.resume.ok
    saved = min(run, max(0.0, d.resume.run_seconds)) if (resumes and d.resume is not None) else 0.0
    output = DEFAULT_OUTPUT_TRANSFER_SECONDS
    if d.history is not None:
        output = d.history.output_seconds.get(idx.cluster, output)
    startup = idx.startup
    total = wait + image + data - hidden + startup + run - saved + output
    cost = d.gpus * d.workers * (startup + run - saved) / 3600.0 * idx.price
    score = d.time_weight * total / 3600.0 + d.cost_weight * cost
    if idx.cluster in d.prefer_clusters:
        score *= PREFERRED_CLUSTER_FACTOR
    if d.prefer_pools and not d.prefer_pools.isdisjoint(elig.pools):
        score *= PREFERRED_POOL_FACTOR
    if resumes and saved <= 0:
        score *= RESUME_FACTOR
    return Estimate(
        queue_wait=wait,
        image_staging=image,
        data_staging=data,
        staging_overlap=hidden,
        startup=startup,
        run=run,
        output_transfer=output,
        total=total,
        cost=cost,
        score=score,
        resume_saved=saved,
        run_source=source,
        gpu_model=(product or "") if elig.only_model else "",
        queue_basis=elig.queue_basis,
    )


def build_terms(est: Estimate, elig: Elig, d: Demand) -> str:
    """The estimate in a few words, for the summary."""
    terms = [f"queue {dur(est.queue_wait)}" if est.queue_wait > 0 else "starts now"]
    if d.inputs:
        terms.append(f"copy {dur(est.data_staging)}" if est.data_staging > 0 else elig.staging.idle)
    if est.image_staging > 0:
        terms.append(f"image pull {dur(est.image_staging)}")
    if est.staging_overlap > 0:
        terms.append(f"{dur(est.staging_overlap)} staging hidden in queue")
    terms.append(f"run {dur(est.run)}" + (f" on {elig.product}" if elig.product else ""))
    if elig.resume is not None:
        if elig.resume.ok:
            saved = f", saves {dur(est.resume_saved)}" if est.resume_saved > 0 else ""
            terms.append(elig.resume.reason + saved)
        else:
            terms.append("restarts from scratch")
    return ", ".join(terms)
