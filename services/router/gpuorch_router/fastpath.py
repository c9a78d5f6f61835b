"""The routing fast path: the reference policy (``decision.route``) with memoisation, owned by an object.

:class:`RoutingMemo` gives the same decision records as :func:`gpuorch_router.decision.route`
(a property test compares them on random worlds), at the cost of a few dictionary lookups per
cluster for a stream of similar workloads. Every cache is an attribute of the memo object: the
router service, the deterministic simulation, the trace-replay simulator and the bench each own
one (``RoutingMemo()``); nothing is kept in module globals. Each cache is keyed on everything its
evaluation reads (``docs/routing.md`` lists them):

* ``index(snapshot)``: the :class:`SnapshotIndex` of a snapshot, by object identity;
* demand *signatures*: the workload's routing-relevant fields encoded once; an *eligibility*
  signature (what the checks read) and a full one (plus what only the estimate reads);
* per index (:class:`_IndexMemo`): the evaluation per full signature, the checks per eligibility
  signature, and parts of the checks by the demand fields they read (node filters, gang shape,
  registry checks with staging and resume, queue placement), so a new signature recomputes only
  what it changes; an ineligible cluster's verdict is shared by every signature with its checks;
  a cluster's next index shares the parts its inputs leave unchanged (node filters and gang
  shapes while it has the same node classes, registry checks while it has the same registry
  facts and queue owners): a republished snapshot mostly changes ages and queue waits only;
* per *world* (the mapping of snapshots, recognised by item identity): the last decision per
  signature with the interval of ``now`` over which it stays the same, and *plans* for decisions
  at new snapshot ages (every verdict prebuilt but its age and freshness check);
* freshness checks by (reachable, error, shown age, stale, max age), shared between clusters.

Caches are bounded (``memo_size`` entries each, cleared when full: ids keep counting, so an old
id never names another signature).

What it caches are the reference's own results: a cluster's checks are
``decision.eligibility`` (the one composition) over parts looked up in these memos (:class:`_Cached`,
a ``decision.Parts``), its estimate ``decision.evaluate``, and whether it is stale and eligible
``decision.standing``; an ineligible verdict is ``decision.ineligible_verdict``. What is its own:
which results to keep, for how long (the intervals of ``now``), and sharing records between them.
"""

from __future__ import annotations

import bisect
import itertools
import math
import operator
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final, TypeVar

import msgspec

from gpuorch_proto.inventory import ClusterSnapshot
from gpuorch_proto.resume import CheckpointRef
from gpuorch_proto.routing import Check, ClusterVerdict, RoutingDecision
from gpuorch_proto.workload import Workload

from .checks import NodePart, freshness
from .decision import (
    Evaluation,
    Parts,
    PlacementPart,
    RegistryPart,
    decide,
    eligibility,
    evaluate,
    ineligible_verdict,
    is_stale,
    pin_verdicts,
    shown_age,
    standing,
)
from .demand import Demand, checkpoint_store, parse_demand
from .estimate import Elig, build_terms, relative_speed
from .history import RoutingHistory, key_label, workload_key
from .index import NodeClass, SnapshotIndex

__all__ = ["RoutingMemo"]

_EPS: Final = 1e-6
_NO_EXCLUDE: Final[frozenset[str]] = frozenset()

VerdictKey = tuple[str, float, bool, bool, float]  # (cluster, shown age, stale, excluded, max age)


@dataclass(slots=True, eq=False)
class _Sig:
    """A demand with its signature ids and the keys of its partial memos."""

    d: Demand
    sig: int  # full signature id (memo of the evaluation with its estimate)
    elig_sig: int  # eligibility signature id (memo of the checks)
    node_key: tuple[object, ...]  # what the node-filter prefix reads (pool .. sharing)
    reg_key: tuple[object, ...]  # what the registry checks, data staging and resume read


@dataclass(slots=True, eq=False)
class _Elig(Elig):
    """`Elig` with the verdict records built from it (shared by every signature with its checks)."""

    # the last ineligible verdict built from these checks (it has no estimate, so every full
    # signature sharing these checks shares it)
    verdict_key: VerdictKey | None = None
    verdict: ClusterVerdict | None = None
    ineligible: _Eval | None = None  # the evaluation of every full signature, when not ok
    # the last freshness check and the verdict check list it heads: shared by the eligible
    # verdicts of every full signature (estimate) with these checks
    listed: tuple[Check, list[Check]] | None = None


@dataclass(slots=True, eq=False)
class _Eval(Evaluation):
    """`Evaluation` with its summary words and the last verdict built."""

    terms: str = ""
    verdict_key: VerdictKey | None = None
    verdict: ClusterVerdict | None = None


@dataclass(slots=True, eq=False)
class _IndexMemo:
    """The memos of one index (they read that snapshot only)."""

    memo: dict[int, _Eval] = field(default_factory=dict)  # full signature -> evaluation
    elig: dict[int, _Elig] = field(default_factory=dict)  # eligibility signature -> checks
    node: dict[tuple[object, ...], NodePart] = field(default_factory=dict)  # node_key -> filter prefix
    shape: dict[tuple[object, ...], NodePart] = field(default_factory=dict)  # classes left + shape -> tail
    place: dict[tuple[object, ...], PlacementPart] = field(default_factory=dict)  # -> queue, model, pools
    reg: dict[tuple[object, ...], RegistryPart] = field(default_factory=dict)  # reg_key -> registry part


K = TypeVar("K")
V = TypeVar("V")


def _put(cache: dict[K, V], key: K, value: V, size: int) -> V:
    """Keep `value` under `key` in a cache bounded to `size` entries (cleared when full)."""
    if len(cache) >= size:
        cache.clear()
    cache[key] = value
    return value


class _Cached(Parts):
    """The reference's parts of eligibility (``decision.Parts``), each looked up first in one
    index's memos by the demand fields it reads (the keys are the signature's, `_Sig`)."""

    __slots__ = ("im", "s", "size")

    def __init__(self, im: _IndexMemo, s: _Sig, size: int) -> None:
        self.im, self.s, self.size = im, s, size

    def filtered(self, idx: SnapshotIndex, classes: Sequence[NodeClass], d: Demand) -> NodePart:
        if classes is not idx.classes:  # regrouped by a hostname selector: not memoised
            return super().filtered(idx, classes, d)
        # the node-filter prefix (pool .. sharing) reads only these demand fields: memoised on
        # them, so a new CPU request, GPU count or registry need reuses it
        got = self.im.node.get(self.s.node_key)
        return got if got is not None else _put(self.im.node, self.s.node_key, super().filtered(idx, classes, d), self.size)

    def shaped(self, idx: SnapshotIndex, classes: Sequence[NodeClass], left: tuple[NodeClass, ...], d: Demand) -> NodePart:
        if classes is not idx.classes:
            return super().shaped(idx, classes, left, d)
        # the rest reads the classes left so far and the gang's shape only
        key = (left, d.per_worker, d.per_node, d.units, d.workers, d.same_node)
        got = self.im.shape.get(key)
        return got if got is not None else _put(self.im.shape, key, super().shaped(idx, classes, left, d), self.size)

    def registry(self, idx: SnapshotIndex, d: Demand) -> RegistryPart:
        got = self.im.reg.get(self.s.reg_key)
        return got if got is not None else _put(self.im.reg, self.s.reg_key, super().registry(idx, d), self.size)

    def placed(self, idx: SnapshotIndex, d: Demand, suitable: Sequence[NodeClass], queues: tuple[str, ...]) -> PlacementPart:
        key = (tuple(suitable), queues, d.per_node, d.units, d.per_worker, d.workers)
        got = self.im.place.get(key)
        return got if got is not None else _put(self.im.place, key, super().placed(idx, d, suitable, queues), self.size)


@dataclass(slots=True, eq=False)
class _Shared:
    """A cluster's last index memos, with what they read: node classes and registry facts."""

    classes: tuple[NodeClass, ...]
    node_count: int
    cpu_reported: bool
    reachable: bool
    node: dict[tuple[object, ...], NodePart]
    shape: dict[tuple[object, ...], NodePart]
    facts: tuple[object, ...]
    owners: dict[str, tuple[str, ...]]
    reg: dict[tuple[object, ...], RegistryPart]


# name, index, its memos, their evaluation memo (looked up once per cluster: the hot loop), observed_at, reachable, error
Row = tuple[str, SnapshotIndex, _IndexMemo, dict[int, _Eval], float, bool, str | None]
Candidate = tuple[float, str, Evaluation]


@dataclass(slots=True, eq=False)
class _Result:
    """A decision for one signature in one world, valid while `now` is in (lo, hi]."""

    lo: float
    hi: float
    exclude: frozenset[str]
    max_age: float
    decision: RoutingDecision


Family = dict[int, tuple[float, list[Check]]]  # whole seconds shown -> (age, [freshness check])


@dataclass(slots=True, eq=False)
class _Plan:
    """One signature in one world, exclusion and max age, prepared for decisions at new `now`.

    Valid while every snapshot age stays positive and no cluster's staleness changes: then every
    verdict differs from the plan's only in its shown age and freshness check, and the eligible
    clusters, their ranking and (when routed) the whole decision but its ages stay the same.
    Per cluster, in name order: observed_at, a verdict with a placeholder age and check list, the
    checks after freshness, the freshness family, the index and whether it is stale.
    """

    exclude: frozenset[str]
    max_age: float
    floor: float  # the youngest snapshot's observed_at: valid only for `now` above it
    # observed_at of the oldest reachable fresh snapshot and of the youngest reachable stale one:
    # staleness is monotonic in observed_at, so these two tell whether any cluster's flipped
    fresh_oldest: float | None
    stale_youngest: float | None
    limits: list[float]  # sorted observed_at + max age of every cluster (the memo interval)
    bases: list[float]
    templates: list[ClusterVerdict]
    tails: list[list[Check]]
    families: list[Family]
    indexes: list[SnapshotIndex]
    stale: list[bool]
    eligible: list[Candidate]
    routed: RoutingDecision | None  # the decision when routed (its summary does not show ages)
    last: tuple[list[int], list[ClusterVerdict]] | None = None  # whole seconds and verdicts last built


@dataclass(slots=True, eq=False)
class _World:
    """The clusters of one snapshots mapping, resolved to indexes and sorted by name."""

    names: tuple[str, ...]  # the mapping's keys and values, in its order (to recognise it)
    values: tuple[ClusterSnapshot | SnapshotIndex, ...]
    entries: list[tuple[str, SnapshotIndex]]
    rows: list[Row]
    results: dict[int, _Result] = field(default_factory=dict)
    plans: dict[int, _Plan] = field(default_factory=dict)


class RoutingMemo:
    """The fast path's caches, and ``route`` over them (the same records as ``decision.route``).

    Construct one per owner (the router, a simulation, a bench) and keep it: decisions reuse
    what earlier decisions computed. Decisions share their immutable parts (checks, estimates,
    verdicts) with other decisions: treat a decision as read-only.
    """

    def __init__(self, *, memo_size: int = 4096, index_cache: int = 512, worlds: int = 4) -> None:
        self.memo_size = memo_size
        self.index_cache = index_cache
        self.max_worlds = worlds
        self.indexes: dict[int, tuple[ClusterSnapshot, SnapshotIndex]] = {}
        self.index_memos: dict[int, tuple[SnapshotIndex, _IndexMemo]] = {}
        self.shared: dict[str, _Shared] = {}  # cluster -> its last index's memos (`_share`)
        self.sig_ids = itertools.count(1)
        self.enc = msgspec.msgpack.Encoder()
        # (eligibility bytes, estimate bytes, history, resume) -> signature; equal keys, equal demand
        self.by_sig: dict[tuple[bytes, bytes, RoutingHistory | None, CheckpointRef | None], _Sig] = {}
        self.elig_ids: dict[tuple[bytes, CheckpointRef | None], int] = {}
        self.by_id: dict[int, tuple[Workload, RoutingHistory | None, CheckpointRef | None, _Sig]] = {}
        self.fresh: dict[tuple[bool, str | None, float, bool, float], Check] = {}
        # freshness checks by (reachable, error, stale, max age), then whole seconds shown: a plan's
        # clusters hold their family; an entry's list is never mutated (a verdict's checks are
        # that list + the rest)
        self.families: dict[tuple[bool, str | None, bool, float], Family] = {}
        self.worlds: list[_World] = []
        self.speeds: dict[str | None, float] = {}

    # ---- indexes and signatures ----------------------------------------------------------------

    def index(self, snapshot: ClusterSnapshot) -> SnapshotIndex:
        """The index of `snapshot`, by identity (a new snapshot object gets a new index)."""
        entry = self.indexes.get(id(snapshot))
        if entry is not None and entry[0] is snapshot:
            return entry[1]
        index = SnapshotIndex(snapshot)
        if len(self.indexes) >= self.index_cache:
            del self.indexes[next(iter(self.indexes))]
        self.indexes[id(snapshot)] = (snapshot, index)
        return index

    def _index_memo(self, idx: SnapshotIndex) -> _IndexMemo:
        entry = self.index_memos.get(id(idx))
        if entry is not None and entry[0] is idx:
            return entry[1]
        im = _IndexMemo()
        self._share(idx, im)
        if len(self.index_memos) >= self.index_cache:
            del self.index_memos[next(iter(self.index_memos))]
        self.index_memos[id(idx)] = (idx, im)
        return im

    def _share(self, idx: SnapshotIndex, im: _IndexMemo) -> None:
        """Give `im` the memos of the cluster's last index that read only what is unchanged: the
        node filters and gang shapes read the node classes (shared by the index when every node
        is equal, `SnapshotIndex(previous=...)`), the registry checks the registry's facts, the
        cluster's name and its queue owners (the registry facts are one tuple for indexes that share
        them: `SnapshotIndex.registry_facts`)."""
        facts = idx.registry_facts
        last = self.shared.get(idx.cluster)
        if last is not None:
            nodes = (
                last.classes is idx.classes
                and last.node_count == idx.node_count
                and last.cpu_reported == idx.cpu_reported
                and last.reachable == idx.reachable
            )
            registry = last.facts is facts and last.owners == idx.queue_owners
            if nodes:
                im.node, im.shape = last.node, last.shape
            if registry:
                im.reg = last.reg
        elif len(self.shared) >= self.index_cache:
            del self.shared[next(iter(self.shared))]
        self.shared[idx.cluster] = _Shared(
            classes=idx.classes, node_count=idx.node_count, cpu_reported=idx.cpu_reported, reachable=idx.reachable,
            node=im.node, shape=im.shape, facts=facts, owners=dict(idx.queue_owners), reg=im.reg,
        )

    def _signature(self, wl: Workload, history: RoutingHistory | None, resume: CheckpointRef | None) -> _Sig:
        """The workload's demand, shared by every workload with the same routing-relevant fields."""
        cached = self.by_id.get(id(wl))
        if cached is not None and cached[0] is wl and cached[1] is history and cached[2] == resume:
            return cached[3]
        spec, meta = wl.spec, wl.metadata
        elig = self.enc.encode(
            (
                spec.resources,
                spec.requirements,
                spec.inputs,
                spec.output.store,
                checkpoint_store(wl),
                spec.checkpoint.portable,
                spec.queue,
                meta.owner,
            )
        )
        est = self.enc.encode(
            (
                spec.image,
                spec.expected_runtime,
                spec.reference_accelerator,
                workload_key(wl),
                key_label(wl),
                spec.preferences,
            )
        )
        key = (elig, est, history, resume)
        s = self.by_sig.get(key)
        if s is None:
            d = parse_demand(wl, history, resume)
            if len(self.by_sig) >= 4 * self.memo_size:
                self.by_sig.clear()  # ids keep counting, so an old id never names another signature
                self.elig_ids.clear()
            elig_key = (elig, resume)
            elig_id = self.elig_ids.get(elig_key)
            if elig_id is None:
                elig_id = self.elig_ids[elig_key] = next(self.sig_ids)
            s = self.by_sig[key] = _Sig(
                d=d,
                sig=next(self.sig_ids),
                elig_sig=elig_id,
                node_key=(
                    d.pools,
                    d.selector,
                    d.tolerations,
                    d.per_worker == 0,
                    d.accelerators,
                    d.gpu_memory_mib,
                    d.sharing,
                    d.fractional,
                    d.gpus if (d.sharing is not None or d.fractional) else None,
                ),
                reg_key=(
                    d.connections,
                    d.credentials,
                    d.output_store,
                    self.enc.encode(d.inputs) if d.inputs else b"",
                    d.checkpoint_store,
                    d.resume,
                    d.portable,
                    d.pin,
                    d.owner,
                ),
            )
        if len(self.by_id) >= 1024:
            del self.by_id[next(iter(self.by_id))]
        self.by_id[id(wl)] = (wl, history, resume, s)
        return s

    def _speed(self, product: str | None) -> float:
        speed = self.speeds.get(product)
        if speed is None:
            speed = self.speeds[product] = relative_speed(product)
        return speed

    # ---- per-cluster evaluation ----------------------------------------------------------------

    def _evaluate(self, idx: SnapshotIndex, im: _IndexMemo, s: _Sig) -> _Eval:
        """``decision.evaluate`` with the checks from the eligibility memo, their parts cached."""
        elig = im.elig.get(s.elig_sig)
        if elig is None:
            made: _Elig = eligibility(idx, s.d, _Cached(im, s, self.memo_size), _Elig)  # type: ignore[assignment]
            elig = _put(im.elig, s.elig_sig, made, self.memo_size)
        if elig.ok:
            ev: _Eval = evaluate(idx, s.d, elig, self._speed(elig.product), _Eval)  # type: ignore[assignment]
        else:  # no estimate: one evaluation serves every full signature with these checks
            ev = elig.ineligible or _Eval(elig=elig)
            elig.ineligible = ev
        if len(im.memo) >= self.memo_size:
            im.memo.clear()
        im.memo[s.sig] = ev
        return ev

    @staticmethod
    def _terms(ev: Evaluation, d: Demand) -> str:
        """The estimate in a few words, built once per evaluation (for the winner and runner-up)."""
        assert isinstance(ev, _Eval) and ev.estimate is not None
        if not ev.terms:
            ev.terms = build_terms(ev.estimate, ev.elig, d)
        return ev.terms

    def _fresh_check(self, idx: SnapshotIndex, shown: float, stale: bool, max_age: float) -> Check:
        """The CLUSTER_UNREACHABLE check, memoised (clusters of equal age share it)."""
        check = freshness(idx, shown, stale, max_age)
        if len(self.fresh) >= self.memo_size:
            self.fresh.clear()
        self.fresh[(idx.reachable, idx.error, shown, stale, max_age)] = check
        return check

    # ---- worlds, sweeps and plans --------------------------------------------------------------

    def _world(self, snapshots: Mapping[str, ClusterSnapshot | SnapshotIndex]) -> _World:
        """The last few worlds are remembered by item identity (the service re-sends the same objects)."""
        values = tuple(snapshots.values())
        names = tuple(snapshots)
        for world in self.worlds:
            # tuple equality tries identity first: snapshots are not compared field by field
            if world.values == values and world.names == names:
                return world
        entries = [
            (n, i if isinstance(i, SnapshotIndex) else self.index(i)) for n, i in zip(names, values, strict=True)
        ]
        entries.sort(key=lambda e: e[0])
        rows = [(n, i, im, im.memo, i.observed_at, i.reachable, i.error) for n, i in entries for im in (self._index_memo(i),)]
        world = _World(names=names, values=values, entries=entries, rows=rows)
        self.worlds.insert(0, world)
        del self.worlds[self.max_worlds :]
        return world

    def _sweep(
        self, s: _Sig, rows: Iterable[Row], now: float, ex: frozenset[str], max_age: float
    ) -> tuple[list[ClusterVerdict], list[Candidate], float, float]:
        """Every cluster's verdict at `now`, the eligible ones, and the interval (lo, hi] of `now` over
        which every verdict stays the same.

        The hot loop of a decision that is not memoised as a whole: checks and estimates come from
        the per-index memos, so what is left per cluster is the snapshot age and the verdict record
        (built again only when its age, staleness or exclusion changed; an ineligible verdict is
        shared by every workload with the same checks).
        """
        verdicts: list[ClusterVerdict] = []
        eligible: list[Candidate] = []
        lo, hi = -math.inf, math.inf
        sig = s.sig
        ceil = math.ceil
        append = verdicts.append
        fresh_get = self.fresh.get
        for name, idx, im, memo, base, reachable, error in rows:
            ev = memo.get(sig)
            if ev is None:
                ev = self._evaluate(idx, im, s)
            age = now - base
            # the record shows whole seconds, rounded up (decision.shown_age)
            if age > 0:
                shown = float(ceil(age))
                t = base + shown - 1 + _EPS
                if t > lo:
                    lo = t
                t = base + shown - _EPS
                if t < hi:
                    hi = t
            else:
                shown = 0.0
                if base < hi:
                    hi = base
            limit = base + max_age
            if now <= limit:
                if limit < hi:
                    hi = limit
            else:
                t = limit + _EPS
                if t > lo:
                    lo = t
            excluded = name in ex if ex else False
            elig: _Elig = ev.elig  # type: ignore[assignment]  # this memo builds only _Elig
            stale, now_eligible = standing(elig.ok, reachable, age, excluded, max_age)
            key = (name, shown, stale, excluded, max_age)
            if now_eligible:  # the verdict carries the estimate
                verdict = ev.verdict
                if verdict is None or ev.verdict_key != key:
                    fresh = fresh_get((reachable, error, shown, False, max_age))
                    if fresh is None:
                        fresh = self._fresh_check(idx, shown, False, max_age)
                    listed = elig.listed
                    if listed is None or listed[0] is not fresh:
                        listed = elig.listed = (fresh, [fresh, *elig.checks])
                    verdict = ev.verdict = ClusterVerdict(
                        cluster=name, eligible=True, checks=listed[1], estimate=ev.estimate, snapshot_age=shown
                    )
                    ev.verdict_key = key
                append(verdict)
                eligible.append((ev.score, name, ev))
            else:  # ineligible: no estimate, so the verdict depends on the checks only
                verdict = elig.verdict
                if verdict is None or elig.verdict_key != key:
                    fresh = fresh_get((reachable, error, shown, stale, max_age))
                    if fresh is None:
                        fresh = self._fresh_check(idx, shown, stale, max_age)
                    verdict = elig.verdict = ineligible_verdict(name, shown, fresh, elig.checks, excluded)
                    elig.verdict_key = key
                append(verdict)
        return verdicts, eligible, lo, hi

    def _pinned(
        self,
        s: _Sig,
        world: _World,
        snapshots: Mapping[str, ClusterSnapshot | SnapshotIndex],
        now: float,
        ex: frozenset[str],
        max_age: float,
    ) -> tuple[list[ClusterVerdict], list[Candidate], float, float]:
        """`_sweep` for a pinned workload: the pinned cluster is the only candidate."""
        names = [name for name, _ in world.entries]
        others = pin_verdicts(s.d, names, snapshots)
        verdicts: list[ClusterVerdict] = []
        eligible: list[Candidate] = []
        lo, hi = -math.inf, math.inf
        rows = {row[0]: row for row in world.rows}
        for name in sorted({*names, *others}):
            if name in others:
                verdicts.append(others[name])
                continue
            (verdict,), eligible, lo, hi = self._sweep(s, (rows[name],), now, ex, max_age)
            verdicts.append(verdict)
        return verdicts, eligible, lo, hi

    def _plan(self, s: _Sig, world: _World, now: float, ex: frozenset[str], max_age: float) -> _Plan:
        """The plan of `s` in `world` with the staleness each cluster has at `now` (ages positive)."""
        plan = _Plan(
            exclude=ex,
            max_age=max_age,
            floor=max((row[4] for row in world.rows), default=-math.inf),
            fresh_oldest=None,
            stale_youngest=None,
            limits=sorted(row[4] + max_age for row in world.rows),
            bases=[],
            templates=[],
            tails=[],
            families=[],
            indexes=[],
            stale=[],
            eligible=[],
            routed=None,
        )
        sig = s.sig
        for name, idx, im, memo, base, reachable, error in world.rows:
            ev = memo.get(sig)
            if ev is None:
                ev = self._evaluate(idx, im, s)
            excluded = name in ex if ex else False
            stale, now_eligible = standing(ev.elig.ok, reachable, now - base, excluded, max_age)
            if reachable:
                if stale:
                    old = plan.stale_youngest
                    plan.stale_youngest = base if old is None else max(old, base)
                else:
                    old = plan.fresh_oldest
                    plan.fresh_oldest = base if old is None else min(old, base)
            fam_key = (reachable, error, stale, max_age)
            fam = self.families.get(fam_key)
            if fam is None:
                if len(self.families) >= self.memo_size:
                    self.families.clear()
                fam = self.families[fam_key] = {}
            if now_eligible:
                verdict = ClusterVerdict(cluster=name, eligible=True, estimate=ev.estimate)
                tail = list(ev.elig.checks)
                plan.eligible.append((ev.score, name, ev))
            else:  # its verdict at `now`: a decision at another age replaces its age and freshness
                shown = shown_age(now, base)
                verdict = ineligible_verdict(name, shown, freshness(idx, shown, stale, max_age), ev.elig.checks, excluded)
                tail = verdict.checks[1:]
            plan.bases.append(base)
            plan.templates.append(verdict)
            plan.tails.append(tail)
            plan.families.append(fam)
            plan.indexes.append(idx)
            plan.stale.append(stale)
        return plan

    def _planned(
        self, s: _Sig, plan: _Plan, workload_id: str, now: float
    ) -> tuple[RoutingDecision, list[ClusterVerdict], float, float]:
        """The decision at `now` from a valid plan, its verdicts, and the interval (lo, hi] of `now`
        over which it stays the same (as `_sweep` computes it). Loops run in C where they can."""
        bases = plan.bases
        # whole seconds, rounded up (every age is positive here)
        whole = list(map(math.ceil, map(operator.sub, itertools.repeat(now, len(bases)), bases)))
        try:
            fresh = list(map(operator.getitem, plan.families, whole))
        except KeyError:  # a new age: build the missing checks (usually a few clusters)
            families = plan.families
            missing = list(
                itertools.compress(range(len(bases)), map(operator.not_, map(operator.contains, families, whole)))
            )
            full = [families[i] for i in missing if len(families[i]) >= self.memo_size]
            if full:  # bounded: cleared, then every cluster of those families is missing too
                for fam in full:
                    fam.clear()
                missing = list(
                    itertools.compress(
                        range(len(bases)), map(operator.not_, map(operator.contains, families, whole))
                    )
                )
            for i in missing:
                fam, n = families[i], whole[i]
                if n not in fam:
                    shown = float(n)
                    fam[n] = (shown, [freshness(plan.indexes[i], shown, plan.stale[i], plan.max_age)])
            fresh = list(map(operator.getitem, families, whole))
        replace = msgspec.structs.replace
        last = plan.last
        if last is not None and any(map(operator.eq, whole, last[0])):
            # clusters still showing the age of the plan's last decision keep its verdict record
            verdicts = [
                old if n == m else replace(tmpl, checks=head + tail, snapshot_age=shown)
                for tmpl, tail, (shown, head), n, m, old in zip(
                    plan.templates, plan.tails, fresh, whole, last[0], last[1], strict=True
                )
            ]
        else:
            verdicts = [
                replace(tmpl, checks=head + tail, snapshot_age=shown)
                for tmpl, tail, (shown, head) in zip(plan.templates, plan.tails, fresh, strict=True)
            ]
        plan.last = (whole, verdicts)
        # the interval, as `_sweep` computes it: float + int adds exactly as float + float(int)
        ticks = list(map(operator.add, bases, whole))
        lo = max(ticks) - 1 + _EPS
        hi = min(ticks) - _EPS
        limits = plan.limits
        i = bisect.bisect_left(limits, now)  # limits[i:] >= now: fresh side; limits[:i] < now: stale
        if i < len(limits) and limits[i] < hi:
            hi = limits[i]
        if i and limits[i - 1] + _EPS > lo:
            lo = limits[i - 1] + _EPS
        routed = plan.routed
        if routed is not None:
            decision = replace(routed, workload_id=workload_id, decided_at=now, verdicts=verdicts)
        else:
            decision = decide(s.d, workload_id, now, verdicts, plan.eligible, self._terms)
            if decision.outcome == "routed":  # the summary names estimates and counts, not ages
                plan.routed = decision
        return decision, verdicts, lo, hi

    # ---- the entry point -----------------------------------------------------------------------

    def route(
        self,
        workload: Workload,
        workload_id: str,
        snapshots: Mapping[str, ClusterSnapshot | SnapshotIndex],
        now: float,
        *,
        history: RoutingHistory | None = None,
        exclude: Collection[str] = (),
        max_snapshot_age: float = 120.0,
        resume: CheckpointRef | None = None,
    ) -> RoutingDecision:
        """``decision.route`` over this memo's caches: the same arguments, the same record."""
        s = self._signature(workload, history, resume)
        world = self._world(snapshots)
        ex = frozenset(exclude) if exclude else _NO_EXCLUDE
        res = world.results.get(s.sig)
        if res is not None and res.lo < now <= res.hi and res.exclude == ex and res.max_age == max_snapshot_age:
            return msgspec.structs.replace(
                res.decision, workload_id=workload_id, decided_at=now, verdicts=list(res.decision.verdicts)
            )
        if s.d.pin is not None:
            verdicts, eligible, lo, hi = self._pinned(s, world, snapshots, now, ex, max_snapshot_age)
            decision = decide(s.d, workload_id, now, verdicts, eligible, self._terms)
        else:
            plan = world.plans.get(s.sig)
            if (
                plan is not None
                and plan.exclude == ex
                and plan.max_age == max_snapshot_age
                and now > plan.floor
                # no reachable cluster's staleness flipped (`decision.standing`; monotonic in age)
                and (plan.fresh_oldest is None or not is_stale(True, now - plan.fresh_oldest, max_snapshot_age))
                and (plan.stale_youngest is None or is_stale(True, now - plan.stale_youngest, max_snapshot_age))
            ):
                decision, verdicts, lo, hi = self._planned(s, plan, workload_id, now)
            else:
                verdicts, eligible, lo, hi = self._sweep(s, world.rows, now, ex, max_snapshot_age)
                decision = decide(s.d, workload_id, now, verdicts, eligible, self._terms)
                if res is not None and now >= res.hi + 1 and now > max(r[4] for r in world.rows):
                    # decided again a second or more after the last decision's ages changed, so every
                    # cluster shows a new age (no verdict record to reuse): prepare for more such
                    if len(world.plans) >= self.memo_size:
                        world.plans.clear()
                    world.plans[s.sig] = self._plan(s, world, now, ex, max_snapshot_age)
        if lo < now <= hi:
            if len(world.results) >= self.memo_size:
                world.results.clear()
            world.results[s.sig] = _Result(lo=lo, hi=hi, exclude=ex, max_age=max_snapshot_age, decision=decision)
        return msgspec.structs.replace(decision, verdicts=list(verdicts))
