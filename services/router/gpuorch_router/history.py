"""What the router learns from measured attempt timelines (pure; DESIGN §5.2, §6).

The estimate model in :mod:`gpuorch_router.policy` has three terms that a plain declaration cannot
give well and measured timelines can:

* **staging overlap** per cluster: the fraction of image and data staging that ran while the job
  was still waiting in the destination's queue (so it did not add to time to result);
* **run time** per workload key (``metadata.workload_class``, else ``metadata.name``) and GPU model;
* **output transfer** per cluster: finished → outputs promoted.

A :class:`RoutingHistory` is immutable; :func:`update_history` returns a new one. Every learnt value
is an exponentially weighted moving average (weight :data:`EWMA_ALPHA` for the newest sample; the
first sample is taken as is), so one odd attempt moves the estimate but does not own it.

Histories hash and compare by identity (``eq=False``): the router memoises per-cluster evaluations
keyed on the history object, and a new history (a new object) invalidates them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

# Fraction of staging assumed hidden behind the queue wait when nothing has been measured on a
# cluster. 0.0 = the conservative plain sum (queue + staging): the seed's "sequential phases".
DEFAULT_OVERLAP = 0.0
# Weight of the newest sample in every moving average.
EWMA_ALPHA = 0.3

_EMPTY: Mapping[str, float] = MappingProxyType({})
_EMPTY_RUN: Mapping[str, Mapping[str, float]] = MappingProxyType({})


@dataclass(frozen=True, slots=True, eq=False)
class RoutingHistory:
    """Measured facts per cluster / workload key. Immutable; hash and equality are identity."""

    overlap: Mapping[str, float] = field(
        default_factory=lambda: _EMPTY
    )  # cluster -> fraction of staging hidden
    run_seconds: Mapping[str, Mapping[str, float]] = field(
        default_factory=lambda: _EMPTY_RUN
    )  # key -> gpu model -> s
    output_seconds: Mapping[str, float] = field(
        default_factory=lambda: _EMPTY
    )  # cluster -> finished..promoted s
    samples: Mapping[str, int] = field(default_factory=lambda: MappingProxyType({}))  # per cluster
    default_overlap: float = DEFAULT_OVERLAP

    def overlap_for(self, cluster: str) -> tuple[float, bool]:
        """(fraction, measured?) for `cluster`."""
        value = self.overlap.get(cluster)
        if value is None:
            return self.default_overlap, False
        return value, True


@dataclass(frozen=True, slots=True)
class MeasuredTimeline:
    """One finished attempt's lifecycle timestamps (unix or simulated seconds; one clock).

    ``routed_at`` is when the attempt left the orchestration queue, ``admitted_at`` when the
    destination admitted it (end of the destination queue wait). Staging is the interval during
    which gpuorch pulled the image and copied inputs. Missing stamps skip the terms that need them.
    """

    cluster: str
    workload_key: str  # metadata.workload_class, else metadata.name
    gpu_product: str | None = None
    routed_at: float | None = None
    admitted_at: float | None = None
    staging_started_at: float | None = None
    staging_finished_at: float | None = None
    compute_started_at: float | None = None
    finished_at: float | None = None
    promoted_at: float | None = None


def measured_overlap(t: MeasuredTimeline) -> float | None:
    """Fraction of the staging interval that lay inside the queue interval, or None if unknown."""
    if None in (t.routed_at, t.admitted_at, t.staging_started_at, t.staging_finished_at):
        return None
    assert t.routed_at is not None and t.admitted_at is not None
    assert t.staging_started_at is not None and t.staging_finished_at is not None
    staging = t.staging_finished_at - t.staging_started_at
    if staging <= 0:
        return None
    hidden = min(t.staging_finished_at, t.admitted_at) - max(t.staging_started_at, t.routed_at)
    return min(1.0, max(0.0, hidden / staging))


def _ewma(old: float | None, new: float) -> float:
    return new if old is None else (1.0 - EWMA_ALPHA) * old + EWMA_ALPHA * new


def update_history(history: RoutingHistory | None, measured: MeasuredTimeline) -> RoutingHistory:
    """A new history with `measured` folded in (pure: `history` is not modified)."""
    h = history if history is not None else RoutingHistory()
    overlap = dict(h.overlap)
    run = {k: dict(v) for k, v in h.run_seconds.items()}
    output = dict(h.output_seconds)
    samples = dict(h.samples)

    frac = measured_overlap(measured)
    if frac is not None:
        overlap[measured.cluster] = _ewma(overlap.get(measured.cluster), frac)
    if measured.compute_started_at is not None and measured.finished_at is not None:
        seconds = measured.finished_at - measured.compute_started_at
        if seconds > 0:
            per_model = run.setdefault(measured.workload_key, {})
            product = measured.gpu_product or ""
            per_model[product] = _ewma(per_model.get(product), seconds)
    if measured.finished_at is not None and measured.promoted_at is not None:
        seconds = measured.promoted_at - measured.finished_at
        if seconds >= 0:
            output[measured.cluster] = _ewma(output.get(measured.cluster), seconds)
    samples[measured.cluster] = samples.get(measured.cluster, 0) + 1
    return RoutingHistory(
        overlap=MappingProxyType(overlap),
        run_seconds=MappingProxyType({k: MappingProxyType(v) for k, v in run.items()}),
        output_seconds=MappingProxyType(output),
        samples=MappingProxyType(samples),
        default_overlap=h.default_overlap,
    )
