"""What the router learns from measured attempt timelines (pure; DESIGN §5.2, §6).

The estimate model (:mod:`gpuorch_router.estimate`) has three terms that a plain declaration
cannot give well and measured timelines can:

* **run time** per workload key and GPU model, as a *distribution*: the most recent runs, each
  with what its workload declared, of which the estimate reads a quantile (:data:`RUN_QUANTILE`,
  the median) and how far runs and declared values have strayed from it (:meth:`RunStats.blend`
  for a class, :meth:`RunStats.calibrate` for a signature);
* **staging overlap** per cluster: the fraction of image and data staging that ran while the job
  was still waiting in the destination's queue (so it did not add to time to result);
* **output transfer** per cluster: finished → outputs promoted.

**The workload key** (:func:`workload_key`): ``metadata.workload_class`` when the workload names one
(a pipeline's stages and trials get one from the expansion: ``<pipeline class>/<stage>``); else a
signature of owner, image digest and command, which together say "the same program by the same
team" (the name does not: names are per submission). :func:`key_label` says which, for ``explain``.

**A history is a function of the set of timelines folded in, not of their order.** Each run is a
sample identified by its workload (one promoted attempt per workload) and ordered by when it
finished; the history keeps, per (key, GPU model), the :data:`RUN_SAMPLES` most recent, and per
bucket of keys (``crc32(key) % BUCKETS``) the :data:`BUCKET_SAMPLES` most recent of those (so
:data:`BUCKETS` x :data:`BUCKET_SAMPLES` samples, and as many keys, at most: the oldest go first).
Per cluster, the :data:`CLUSTER_SAMPLES` most recent timelines. Folding a timeline twice, or two
timelines in either order, gives equal histories: so a router that handles completions of
different workloads concurrently, a router restarted from its snapshot, and a second replica that
folds the same events all learn the same (``tests/router/test_learned_runs.py`` proves it over
random sequences, permutations and duplicates). The bucket hash is crc32, not Python's ``hash``,
which differs between processes.

A :class:`RoutingHistory` is immutable; :func:`update_history` returns a new one sharing every
bucket it did not touch. Histories hash and compare by identity (``eq=False``): the router
memoises per-cluster evaluations keyed on the history object, and a new history (a new object)
invalidates them.
"""

from __future__ import annotations

import bisect
import hashlib
import math
import zlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import NamedTuple, TypeVar

from gpuorch_proto.workload import Workload

# Fraction of staging assumed hidden behind the queue wait when nothing has been measured on a
# cluster. 0.0 = the conservative plain sum (queue + staging): the seed's "sequential phases".
DEFAULT_OVERLAP = 0.0
#: Which quantile of a class's runs is its learnt run time. The median: it minimises the expected
#: absolute error, so one run that hung or stopped early does not move it (a mean would follow
#: it), and an estimate that is as often long as short keeps the ranking of clusters by time to
#: result unbiased; a higher quantile would be the choice for deadlines, not for ranking.
RUN_QUANTILE = 0.5
#: Runs kept per (workload key, GPU model): the most recent.
RUN_SAMPLES = 32
#: Keys are spread over this many buckets; each keeps at most BUCKET_SAMPLES runs in all.
BUCKETS = 64
BUCKET_SAMPLES = 512
#: Timelines kept per cluster (overlap and output transfer): the most recent.
CLUSTER_SAMPLES = 64
#: A workload class longer than this is kept as a digest (keys are bounded in size too).
KEY_MAX = 200
#: The blend (:meth:`RunStats.blend`). How far (natural log) the next run of a class seen n times
#: may fall from what was seen, before its spread is known: PRIOR_CLASS_SIGMA**2 / n. How far a
#: declared run time is assumed off before any is measured (one pseudo-run at
#: PRIOR_DECLARED_SIGMA). The same (+-65 %): one run is worth one declaration until their errors
#: are measured. Scaling runs measured on another GPU model by the speed table adds SCALED_SIGMA
#: (the table's figures are coarse).
PRIOR_CLASS_SIGMA = 0.5
#: Runs needed before a learnt value moves a declared one (a spread needs two).
MIN_RUNS = 2
#: A declaration further from the learnt value than AGREE standard errors of the two (in log)
#: says this workload is unlike the runs learnt (e.g. a long job when only short ones finished):
#: the declared value stands.
AGREE = 2.0
#: A signature's runs correct its declarations only by a bias this many standard errors from none.
BIAS_SE = 3.0
PRIOR_DECLARED_SIGMA = 0.5
SCALED_SIGMA = 0.2

SIGNATURE_PREFIX = "sig:"
STAGE_LABEL = "gpuorch.io/stage"  # set on a pipeline's stages and trials (pipeline.LABEL_STAGE)
TRIAL_LABEL = "gpuorch.io/trial"  # (pipeline.LABEL_TRIAL)

_EMPTY: Mapping[str, float] = MappingProxyType({})
_S = TypeVar("_S", "RunSample", "ClusterSample")


def _digest(*parts: object) -> str:
    return hashlib.blake2b(repr(parts).encode(), digest_size=8).hexdigest()


def workload_key(wl: Workload) -> str:
    """What runs are learnt together under: the workload class, else owner + image + command."""
    cls = wl.metadata.workload_class
    if cls:
        return cls if len(cls) <= KEY_MAX else f"class#{_digest(cls)}"
    return SIGNATURE_PREFIX + _digest(wl.metadata.owner, wl.spec.image, tuple(wl.spec.command))


def key_label(wl: Workload) -> str:
    """The key in words, for the estimate's source (``explain``)."""
    key = workload_key(wl)
    if key.startswith(SIGNATURE_PREFIX):
        return f"{wl.metadata.owner}'s image and command (no class given)"
    labels = wl.metadata.labels
    if TRIAL_LABEL in labels:
        return f"trials of {key}"
    return f"{'stage' if STAGE_LABEL in labels else 'class'} {key}"


class RunSample(NamedTuple):
    """One measured run. Ordered by (finished, uid): recency, then identity."""

    at: float  # when the run finished
    uid: int  # digest of the workload id: the same run folded twice is one sample
    seconds: float  # the run, on its entry's GPU model
    declared: float = 0.0  # what the workload declared for that model (0: nothing declared)


class ClusterSample(NamedTuple):
    at: float
    uid: int
    overlap: float | None  # fraction of staging hidden in the queue (None: not measured)
    output: float | None  # finished → promoted, s (None: not measured)


def quantile(sorted_values: list[float], q: float) -> float:
    """Linear interpolation between order statistics (numpy's default)."""
    pos = q * (len(sorted_values) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


@dataclass(frozen=True, slots=True)
class RunStats:
    """The recent runs of one workload key on one GPU model, and what the estimate reads of them."""

    samples: tuple[RunSample, ...]  # oldest first
    value: float  # the quantile of the runs (seconds)
    spread: float  # mean squared log error of `value` as a prediction of each run
    declared_n: int  # runs that had a declared value
    declared_error: float  # mean squared log error of those declared values
    ratio: float  # the median of run / declared over those runs (1.0: none)
    ratio_se: float  # the standard error of log(ratio)

    @property
    def n(self) -> int:
        return len(self.samples)

    @classmethod
    def of(cls, samples: tuple[RunSample, ...], q: float) -> RunStats:
        runs = sorted(s.seconds for s in samples)
        value = quantile(runs, q)
        lv = math.log(value)
        spread = sum((math.log(s) - lv) ** 2 for s in runs) / len(runs)
        logs = sorted(math.log(s.seconds / s.declared) for s in samples if s.declared > 0)
        if not logs:
            return cls(samples, value, spread, 0, 0.0, 1.0, math.inf)
        mid = quantile(logs, 0.5)
        # a median's standard error: sqrt(pi/2) x the spread around it / sqrt(n)
        se = math.sqrt(math.pi / 2 * sum((x - mid) ** 2 for x in logs) / len(logs) / len(logs))
        return cls(samples, value, spread, len(logs), sum(x * x for x in logs) / len(logs), math.exp(mid), se)

    def calibrate(self, declared: float | None) -> tuple[float, float]:
        """(run seconds, factor applied) for a workload of a *signature* (no class given) that
        declares `declared` (None: the runs' quantile, as `blend`).

        A signature (owner + image + command) says "the same program by the same team", not
        "runs of the same length" (the arguments may differ, a generic entrypoint may run
        anything): what carries over is how this team's declarations err. The declared value is
        multiplied by the median of run / declared over the signature's runs, when that median is
        more than BIAS_SE standard errors from 1 (a bias the runs show, not noise); else it stands
        exactly."""
        if declared is None or declared <= 0:
            return self.value, 1.0
        if self.declared_n < MIN_RUNS or abs(math.log(self.ratio)) <= BIAS_SE * self.ratio_se:
            return declared, 1.0
        return declared * self.ratio, self.ratio

    def blend(self, declared: float | None, scaled: bool = False) -> tuple[float, float]:
        """(run seconds, weight of the learnt value) for a workload that declares `declared`
        (on this entry's model; None: nothing declared: the learnt value as it is), `scaled`: the
        caller scales the result to another GPU model.

        Each of the two predictions has an error, measured on this class's runs in log space:
        the learnt quantile's ``var_learnt = spread x (1 + 1/n) + PRIOR_CLASS_SIGMA**2 / n`` (plus
        ``SCALED_SIGMA**2`` when scaled), the declared value's ``var_declared``: its mean squared
        error over the runs that declared one, with one prior pseudo-run at PRIOR_DECLARED_SIGMA.
        The estimate is ``exp(w log learnt + (1 - w) log declared)`` with
        ``w = max(0, 1 - var_learnt / var_declared)``: the share of the declaration's error that
        the learnt value removes. A class seen once barely moves a declared value; a tight class
        seen often replaces it; a class whose runs scatter more than its declarations err (a
        signature over different programs) leaves the declared value exactly as it is.

        Not inverse-variance weights, which give such a class a small weight: its median on each
        GPU model is the median of what the router happened to send there (short jobs where it
        sent short jobs), so even a small weight skews the comparison of clusters (on the ITP
        trace, +9 % mean JCT). With runs of one fixed length T and a fixed declaration, the
        estimate is within a factor exp(sqrt(2/n) x PRIOR_CLASS_SIGMA) of T after n >= MIN_RUNS
        runs (n <= RUN_SAMPLES; tests/router/test_learned_runs.py).
        """
        if declared is None or declared <= 0:
            return self.value, 1.0
        n = self.n
        if n < MIN_RUNS:  # no spread measured yet: nothing says the class's runs agree
            return declared, 0.0
        var_learnt = self.spread * (1.0 + 1.0 / n) + PRIOR_CLASS_SIGMA**2 / n + (SCALED_SIGMA**2 if scaled else 0.0)
        var_declared = (self.declared_error * self.declared_n + PRIOR_DECLARED_SIGMA**2) / (self.declared_n + 1)
        w = 1.0 - var_learnt / var_declared
        gap = math.log(declared / self.value)
        if w <= 0.0 or gap * gap > AGREE**2 * (var_learnt + var_declared):
            return declared, 0.0
        return math.exp(w * math.log(self.value) + (1.0 - w) * math.log(declared)), w


class _Ref(NamedTuple):
    """Where a run is, in its bucket's recency order."""

    at: float
    uid: int
    key: str
    model: str


@dataclass(frozen=True, slots=True)
class _Bucket:
    entries: Mapping[str, Mapping[str, RunStats]]  # key -> GPU model ("" unknown) -> runs
    order: tuple[_Ref, ...]  # every run held, oldest first

    @property
    def size(self) -> int:
        return len(self.order)


_NO_RUNS: Mapping[str, RunStats] = MappingProxyType({})
_EMPTY_BUCKET = _Bucket(MappingProxyType({}), ())


@dataclass(frozen=True, slots=True, eq=False)
class RoutingHistory:
    """Measured facts per cluster / workload key. Immutable; hash and equality are identity."""

    runs: tuple[_Bucket, ...] = ()  # BUCKETS buckets of keys (() = nothing learnt)
    clusters: Mapping[str, tuple[ClusterSample, ...]] = field(default_factory=lambda: MappingProxyType({}))
    overlap: Mapping[str, float] = field(default_factory=lambda: _EMPTY)  # cluster -> mean fraction hidden
    output_seconds: Mapping[str, float] = field(default_factory=lambda: _EMPTY)  # cluster -> median s
    default_overlap: float = DEFAULT_OVERLAP
    quantile: float = RUN_QUANTILE

    def overlap_for(self, cluster: str) -> tuple[float, bool]:
        """(fraction, measured?) for `cluster`."""
        value = self.overlap.get(cluster)
        if value is None:
            return self.default_overlap, False
        return value, True

    def runs_of(self, key: str) -> Mapping[str, RunStats]:
        """GPU model ("" = unknown) -> the runs learnt for `key` on it."""
        if not self.runs:
            return _NO_RUNS
        return self.runs[_bucket(key)].entries.get(key, _NO_RUNS)

    @property
    def samples(self) -> Mapping[str, int]:
        """Timelines held per cluster."""
        return MappingProxyType({c: len(s) for c, s in self.clusters.items()})

    def run_count(self) -> int:
        return sum(b.size for b in self.runs)

    def key_count(self) -> int:
        return sum(len(b.entries) for b in self.runs)


@dataclass(frozen=True, slots=True)
class MeasuredTimeline:
    """One finished attempt's lifecycle timestamps (unix or simulated seconds; one clock).

    ``routed_at`` is when the attempt left the orchestration queue, ``admitted_at`` when the
    destination admitted it (end of the destination queue wait). Staging is the interval during
    which gpuorch pulled the image and copied inputs. Missing stamps skip the terms that need them.
    """

    cluster: str
    workload_key: str  # workload_key(workload)
    gpu_product: str | None = None  # the model the run was on (None: not known)
    routed_at: float | None = None
    admitted_at: float | None = None
    staging_started_at: float | None = None
    staging_finished_at: float | None = None
    compute_started_at: float | None = None
    finished_at: float | None = None
    promoted_at: float | None = None
    workload_id: str = ""  # the sample's identity ("" : the timeline's own stamps)
    declared_seconds: float | None = None  # the declared run time on `gpu_product` (estimate.declared_seconds)


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


def _bucket(key: str) -> int:
    return zlib.crc32(key.encode()) % BUCKETS


def _uid(t: MeasuredTimeline) -> int:
    ident = t.workload_id or repr((t.cluster, t.workload_key, t.gpu_product, t.routed_at, t.finished_at, t.promoted_at))
    return int.from_bytes(hashlib.blake2b(ident.encode(), digest_size=8).digest(), "big")


def _insert(window: tuple[_S, ...], s: _S, cap: int) -> tuple[_S, ...] | None:
    """`window` (sorted) with `s`, keeping the `cap` most recent; None: unchanged."""
    uid = s[1]
    if any(x[1] == uid for x in window):
        return None
    if len(window) >= cap and s < window[0]:
        return None
    out = list(window)
    bisect.insort(out, s)
    return tuple(out[-cap:])


def _drop_oldest(entries: dict[str, Mapping[str, RunStats]], order: list[_Ref], q: float) -> None:
    """Remove the oldest run of a bucket being rebuilt (`entries` and `order`, both copies)."""
    ref = order.pop(0)
    models = dict(entries[ref.key])
    rest = models[ref.model].samples[1:]
    if rest:
        models[ref.model] = RunStats.of(rest, q)
    else:
        del models[ref.model]
    if models:
        entries[ref.key] = MappingProxyType(models)
    else:
        del entries[ref.key]


def _with_run(bucket: _Bucket, key: str, model: str, s: RunSample, q: float) -> _Bucket:
    per_model = bucket.entries.get(key, _NO_RUNS)
    old = per_model.get(model)
    window = _insert(old.samples if old else (), s, RUN_SAMPLES)
    if window is None:
        return bucket
    entries = dict(bucket.entries)
    entries[key] = MappingProxyType({**per_model, model: RunStats.of(window, q)})
    order = list(bucket.order)
    if old is not None and old.samples[0] not in window:  # the entry's oldest made room
        gone = old.samples[0]
        del order[bisect.bisect_left(order, _Ref(gone.at, gone.uid, key, model))]
    bisect.insort(order, _Ref(s.at, s.uid, key, model))
    if len(order) > BUCKET_SAMPLES:  # the bucket's oldest run goes (it may be the one just added)
        _drop_oldest(entries, order, q)
    return _Bucket(MappingProxyType(entries), tuple(order))


def _summaries(clusters: Mapping[str, tuple[ClusterSample, ...]]) -> tuple[dict[str, float], dict[str, float]]:
    overlap: dict[str, float] = {}
    output: dict[str, float] = {}
    for c, window in clusters.items():
        fractions = [s.overlap for s in window if s.overlap is not None]
        if fractions:
            overlap[c] = sum(fractions) / len(fractions)
        outs = sorted(s.output for s in window if s.output is not None)
        if outs:
            output[c] = quantile(outs, 0.5)
    return overlap, output


def _build(
    h: RoutingHistory, runs: tuple[_Bucket, ...], clusters: Mapping[str, tuple[ClusterSample, ...]], changed: str | None = None
) -> RoutingHistory:
    """`h` with `runs` and `clusters`; `changed`: the one cluster whose window differs from `h`'s
    (the others keep their summaries: the same as summarising them again, in the same order)."""
    if clusters is h.clusters:
        overlap, output = dict(h.overlap), dict(h.output_seconds)
    elif changed is not None:
        new_overlap, new_output = _summaries({changed: clusters[changed]})
        overlap, output = {}, {}
        for c in clusters:
            have_overlap, have_output = (new_overlap, new_output) if c == changed else (h.overlap, h.output_seconds)
            if c in have_overlap:
                overlap[c] = have_overlap[c]
            if c in have_output:
                output[c] = have_output[c]
    else:
        overlap, output = _summaries(clusters)
    return RoutingHistory(
        runs=runs, clusters=MappingProxyType(dict(clusters)), overlap=MappingProxyType(overlap),
        output_seconds=MappingProxyType(output), default_overlap=h.default_overlap, quantile=h.quantile,
    )  # fmt: skip


def update_history(history: RoutingHistory | None, measured: MeasuredTimeline) -> RoutingHistory:
    """A new history with `measured` folded in (pure: `history` is not modified). Folding the same
    timeline again changes nothing; the order in which timelines are folded does not matter."""
    h = history if history is not None else RoutingHistory()
    uid = _uid(measured)
    runs = h.runs
    if measured.compute_started_at is not None and measured.finished_at is not None:
        seconds = measured.finished_at - measured.compute_started_at
        if seconds > 0:
            declared = measured.declared_seconds if measured.declared_seconds and measured.declared_seconds > 0 else 0.0
            sample = RunSample(measured.finished_at, uid, seconds, declared)
            b = _bucket(measured.workload_key)
            runs = runs or (_EMPTY_BUCKET,) * BUCKETS
            bucket = _with_run(runs[b], measured.workload_key, measured.gpu_product or "", sample, h.quantile)
            runs = runs if bucket is runs[b] else (*runs[:b], bucket, *runs[b + 1 :])
    output = None
    if measured.finished_at is not None and measured.promoted_at is not None and measured.promoted_at >= measured.finished_at:
        output = measured.promoted_at - measured.finished_at
    frac = measured_overlap(measured)
    clusters: Mapping[str, tuple[ClusterSample, ...]] = h.clusters
    changed = None
    if frac is not None or output is not None:
        stamps = [t for t in (measured.promoted_at, measured.finished_at, measured.admitted_at, measured.routed_at) if t is not None]
        cs = ClusterSample(max(stamps, default=0.0), uid, frac, output)
        window = _insert(h.clusters.get(measured.cluster, ()), cs, CLUSTER_SAMPLES)
        if window is not None:
            clusters = {**h.clusters, measured.cluster: window}
            changed = measured.cluster
    if runs is h.runs and clusters is h.clusters:
        return h
    return _build(h, runs, clusters, changed)


# ---- snapshot form -------------------------------------------------------------------------


def history_parts(h: RoutingHistory) -> tuple[dict[str, dict[str, list[RunSample]]], dict[str, list[ClusterSample]]]:
    """Everything a history holds, as plain containers (the router's snapshot: core.dump_history)."""
    runs = {k: {m: list(s.samples) for m, s in ms.items()} for b in h.runs for k, ms in b.entries.items()}
    return runs, {c: list(w) for c, w in h.clusters.items()}


def history_from(
    runs: Mapping[str, Mapping[str, Iterable[RunSample]]],
    clusters: Mapping[str, Iterable[ClusterSample]],
    *,
    default_overlap: float = DEFAULT_OVERLAP,
    quantile: float = RUN_QUANTILE,
) -> RoutingHistory:
    """The history `history_parts` took apart (bounds applied again: a smaller build keeps the
    most recent)."""
    h = RoutingHistory(default_overlap=default_overlap, quantile=quantile)
    buckets: list[dict[str, dict[str, RunStats]]] = [{} for _ in range(BUCKETS)]
    for key, models in runs.items():
        for model, samples in models.items():
            window = tuple(sorted(RunSample(*s) for s in samples))[-RUN_SAMPLES:]
            if window:
                buckets[_bucket(key)].setdefault(key, {})[model] = RunStats.of(window, quantile)
    built: list[_Bucket] = []
    for per_key in buckets:
        entries: dict[str, Mapping[str, RunStats]] = {k: MappingProxyType(ms) for k, ms in per_key.items()}
        order = sorted(_Ref(x.at, x.uid, k, m) for k, ms in per_key.items() for m, st in ms.items() for x in st.samples)
        while len(order) > BUCKET_SAMPLES:  # (only when the bounds shrank since the snapshot)
            _drop_oldest(entries, order, quantile)
        built.append(_Bucket(MappingProxyType(entries), tuple(order)))
    windows = {c: tuple(sorted(ClusterSample(*s) for s in w))[-CLUSTER_SAMPLES:] for c, w in clusters.items()}
    return _build(h, tuple(built) if any(b.size for b in built) else (), {c: w for c, w in windows.items() if w})
