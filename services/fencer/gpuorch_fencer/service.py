"""The fencer's shell: epochs and promotion in a KV bucket by compare-and-set, cancellation
pursued until confirmed, orphaned Jobs garbage-collected (DESIGN §7).

What it costs per workload does not grow with the backlog:

* managed Jobs are followed by an informer per cluster (``gpuorch.informer``: list once, watch
  from the list's resourceVersion, re-list on 410 Gone); the orphan collector judges the
  informer's cache, it does not list every Job of every cluster at each round;
* the fence records this replica last read or wrote are kept (`Records`): the collector reads a
  record from the bucket only the first time it needs it, and a compare-and-set writes with the
  revision it knows (one round trip, not a read and a write); when another replica wrote in
  between, the write fails and the usual read-decide-write runs on what is there now.
"""

from __future__ import annotations

import asyncio
import heapq
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import msgspec
import structlog
from kubernetes.client.exceptions import ApiException
from nats.js.errors import KeyWrongLastSequenceError, NotFoundError

from gpuorch.config import Registry, Settings, load_registry
from gpuorch.follow import Follower, every, run_until_stopped
from gpuorch.informer import PROBE_INTERVAL, ClusterInformers
from gpuorch.kube import TIMEOUT, ClusterClient, make_clients, unreachable
from gpuorch.liveness import answering
from gpuorch.objectstore import Stores, StoreUnavailable
from gpuorch.resync import Resync
from gpuorch.runtime import bus, kv
from gpuorch.runtime.shell import Incoming, Publisher, Reject, Retry, consume, run_service
from gpuorch.runtime.snapshot import Snapshots, follower_body, restore_follower
from gpuorch.security.model import events_durable, snapshot_owner
from gpuorch.stores import stores_of
from gpuorch_proto import FenceRecord, decode_fence, encode
from gpuorch_proto import events as ev
from gpuorch_proto.k8s import LABEL_WORKLOAD, MANAGED_SELECTOR, NAMESPACE
from gpuorch_proto.subjects import valid_token

from . import core, publish

log = structlog.get_logger("gpuorch.fencer")

#: orphan rounds: every 10th judges every Job, changed or not (a resync; at most, `gpuorch.resync`:
#: a costly one puts the next off)
FULL_COLLECT_EVERY = 10
LABEL_JOB_NAME = "job-name"  # set on a Job's pods by the Job controller (every Kubernetes version)


def _registry_stores(registry: Registry | None) -> list[str] | None:
    """Every artifact and checkpoint store of the registry (None without a registry)."""
    if registry is None:
        return None
    return sorted({st for c in registry.clusters.values() for st in (*c.artifact_stores, *c.checkpoint_stores)} | set(registry.stores))


def informers_for(cc: ClusterClient, probe_interval: float = PROBE_INTERVAL) -> ClusterInformers:
    """gpuorch's Jobs of one cluster (its label, its namespace), list-then-watch: what the
    orphan collector judges."""
    group = ClusterInformers(cc.name, probe=cc.probe, probe_interval=probe_interval, heartbeat=False)
    group.add("jobs", cc.batch.list_namespaced_job, namespace=NAMESPACE, label_selector=MANAGED_SELECTOR, index=LABEL_WORKLOAD)
    return group


@dataclass(frozen=True)
class SeenJob:
    """What the orphan collector reads of one version of a managed Job (its cache entry)."""

    name: str
    namespace: str
    deleting: bool  # deletionTimestamp set: already going
    found: core.FoundJob  # the workload, attempt and epoch its labels claim
    created: float | None  # creationTimestamp, unix seconds

    @staticmethod
    def of(cluster: str, job: dict[str, Any]) -> SeenJob:
        meta = job["metadata"]
        name, ns = meta["name"], meta.get("namespace", NAMESPACE)
        stamp = meta.get("creationTimestamp")
        return SeenJob(
            name=name, namespace=ns, deleting=bool(meta.get("deletionTimestamp")),
            found=core.found_job(meta.get("labels") or {}, cluster, ns, name),
            created=datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp() if stamp else None,
        )


class Records:
    """Fence records by compare-and-set, remembering each one this replica last read or wrote.

    Every change of a record is made while a fencer handles an event, and every replica handles
    every event (each folds the log through its own durable), so what is remembered is never
    ahead of the bucket, only behind it until this replica handles the next event of that
    workload. Two uses, neither of which needs more:

    * `cas` decides first on the remembered record (or on none, for a workload never seen) and
      writes with the revision it was read or written at (``create`` when none): if that write
      lands, nobody wrote in between, so the decision was taken on the current record, which is
      what compare-and-set means; if it does not, or the decision writes nothing (which needs
      the current record to be sure), the usual read-decide-write (`gpuorch.runtime.kv`) runs;
    * `known` gives the orphan collector the remembered record, read from the bucket only the
      first time. A record behind the bucket can only make a Job look less orphaned (epochs only
      grow, a promotion is never undone): such a Job is judged again at the next round, after
      this replica has handled the event that moved the record.
    """

    def __init__(self, bucket: Any) -> None:
        self.bucket = bucket
        self._known: dict[str, tuple[FenceRecord | None, int]] = {}  # workload -> (record, revision; 0 = none)

    async def read(self, workload_id: str) -> FenceRecord | None:
        """The record in the bucket now (and remembered)."""
        value, rev = await kv.read(self.bucket, workload_id)
        rec = decode_fence(value) if value is not None else None
        self._known[workload_id] = (rec, rev)
        return rec

    async def known(self, workload_id: str) -> FenceRecord | None:
        """The record as this replica last read or wrote it (read now if it never did)."""
        got = self._known.get(workload_id)
        return got[0] if got is not None else await self.read(workload_id)

    async def cas(self, workload_id: str, decide: Callable[[FenceRecord | None], core.Decision]) -> core.Decision:
        rec, rev = self._known.get(workload_id, (None, 0))
        first = decide(rec)
        if first.record is not None:
            new = encode(first.record)
            try:
                written = await (self.bucket.create(workload_id, new) if rev == 0 else self.bucket.update(workload_id, new, last=rev))
            except KeyWrongLastSequenceError:
                pass  # written since (by another replica, or before a restart): decide on what is there
            else:
                self._known[workload_id] = (first.record, int(written))
                return first
        seen: list[FenceRecord | None] = []

        def step(value: bytes | None) -> tuple[core.Decision, bytes | None]:
            current = decode_fence(value) if value is not None else None
            seen.append(current)
            d = decide(current)
            return d, (encode(d.record) if d.record is not None else None)

        w = await kv.compare_and_set(self.bucket, workload_id, step)
        d = w.decision
        self._known[workload_id] = (d.record if w.value is not None else seen[-1], w.revision)
        return d


class Fencer:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.names = settings.names
        self.follower = Follower.of(settings.tuning)  # finished workloads retired (gpuorch.projection)
        self.clients: dict[str, ClusterClient] = make_clients(settings.kubeconfig) if settings.kubeconfig else {}
        self.pursuits: dict[str, core.Pursuit] = {}
        self.kv: Any = None
        self.records: Records | None = None
        self.informers: dict[str, ClusterInformers] = {
            name: informers_for(cc, settings.tuning.probe_interval) for name, cc in self.clients.items()
        }
        #: (cluster, namespace, job) confirmed gone -> when: the informer's cache may still hold
        #: it for a moment after; it is not judged again until the cache is complete past then
        self.gone: dict[tuple[str, str, str], float] = {}
        #: cluster -> (namespace, job) -> (resourceVersion, what was read of it)
        self.seen_jobs: dict[str, dict[tuple[str, str], tuple[str | None, SeenJob]]] = {}
        # what the orphan round judges next (`to_judge`): workloads whose events were folded,
        # the jobs cache generation read per cluster, (time, cluster, namespace, job) of Jobs
        # left for their grace, and the round that judges every Job again
        self.judge_dirty: set[str] = set()
        self.judged_generation: dict[str, int] = {}
        self.judge_due: list[tuple[float, str, str, str]] = []
        self.collect_resync = Resync(FULL_COLLECT_EVERY)  # when a round judges every Job
        self.publisher: Publisher | None = None
        self.interval = settings.tuning.fence_interval
        self.orphan_grace = settings.tuning.orphan_grace
        self.orphan_grace_unknown = settings.tuning.orphan_grace_unknown
        registry = load_registry(settings.registry) if settings.registry else None
        self.time_scale = registry.time_scale if registry is not None else 1.0
        self.js: Any = None
        #: the event subjects it reads (`core.READS`: the types it decides anything from)
        self.reads = [self.names.evt_kind(t) for t in core.READS]
        self.store_names: list[str] | None = _registry_stores(registry)  # None: no registry to check against
        #: the artifact stores by name, with this process's credentials: promotion reads each
        #: attempt's listing and upload record there and writes the result's manifest
        self.stores: Stores = stores_of(settings, registry)
        self.store_retry = 5.0  # seconds before a promotion whose store did not answer is tried again

    # --- compare-and-set on the fence record ------------------------------------------------
    async def cas(self, workload_id: str, decide: Callable[[FenceRecord | None], core.Decision]) -> core.Decision:
        """The fence record changes only by compare-and-set (`Records.cas`)."""
        assert self.records is not None
        return await self.records.cas(workload_id, decide)

    async def record(self, workload_id: str) -> FenceRecord | None:
        """The record as this replica last read or wrote it (`Records.known`)."""
        assert self.records is not None
        return await self.records.known(workload_id)

    async def in_log(self, workload_id: str) -> bool:
        """Does the event log hold this workload's `submitted`? (True when it cannot tell: the
        cautious answer, it keeps the long grace.)"""
        if not valid_token(workload_id):
            return False
        try:
            await self.js.get_last_msg(self.names.stream_evt, self.names.evt(workload_id, "submitted"))
            return True
        except NotFoundError:
            return False
        except Exception as exc:
            log.warning("orphan.log_lookup_failed", workload=workload_id, error=str(exc))
            return True

    async def promote(self, e: ev.PromoteRequested, now: float) -> list[ev.Base]:
        """Publish an attempt's result, from the fencer's own records only (docs/security.md):
        a request its records contradict is refused as a message (a `rejected` record, the
        attempt untouched); one whose `attempt-created` is not on record yet waits for it.

        Then, in this order: what the store holds of the attempt (its listing and upload
        record: a manifest, or why there is none); the compare-and-set on the fence record
        (`core.on_promote_requested`, the gate); the manifest written create-only at the
        workload's result key (`publish.publish`, the store's own compare-and-set). Only the
        manifest is written: no output's bytes pass through here. A store that does not answer
        is tried again later (`Retry`), before or after the compare-and-set (a redelivered
        promotion of the promoted attempt publishes the same manifest)."""
        store, problem = self.promotion_source(e)
        view = self.follower.projection.get(e.workload_id)
        gate = core.promotion_gate(view, e, store, problem)
        if gate == "defer":
            log.info("promotion.deferred", workload=e.workload_id, attempt=e.attempt_id, reason=problem)
            return []
        if gate == "refuse" or store is None:
            log.warning("promotion.refused", workload=e.workload_id, attempt=e.attempt_id, reason=problem)
            raise Reject(f"promotion refused: {problem}", claimed_workload_id=e.workload_id)
        created_epoch = core.attempt_facts(view, e.attempt_id).created_epoch
        result = core.result_url(self.stores.url(store), e.workload_id) or ""
        try:
            outputs = await publish.prepare(self.stores[store], e.workload_id, e.attempt_id, e.epoch, now)
        except StoreUnavailable as exc:
            log.warning("promotion.store_unavailable", workload=e.workload_id, attempt=e.attempt_id, error=str(exc))
            raise Retry(self.store_retry, f"promotion of {e.attempt_id} waits for its store: {exc}") from exc

        d = await self.cas(
            e.workload_id, lambda rec: core.decide_promotion(rec, e, now, result, outputs, created_epoch=created_epoch)
        )
        events = list(d.events)
        if d.promote is not None:
            events = await self.publish_result(e, store, d, now)
        elif isinstance(outputs, str):
            log.warning("promotion.rejected", workload=e.workload_id, attempt=e.attempt_id, reason=outputs)
        self.pursue(core.pursuit_after(self.follower.projection.get(e.workload_id), e, d, now))
        return events

    async def publish_result(self, e: ev.PromoteRequested, store: str, d: core.Decision, now: float) -> list[ev.Base]:
        """After the compare-and-set: the manifest, create-only (`publish.publish`). This
        attempt's manifest in the store (written now or before) gives `promoted` with its size;
        another manifest there is never overwritten: the conflict is recorded for the operators
        (`core.manifest_conflict`), the fence record keeps the promotion."""
        assert d.promote is not None
        try:
            done = await publish.publish(self.stores[store], e.workload_id, e.attempt_id, e.epoch, d.promote.manifest)
        except StoreUnavailable as exc:
            log.warning("promotion.store_unavailable", workload=e.workload_id, attempt=e.attempt_id, error=str(exc))
            raise Retry(self.store_retry, f"the manifest of {e.attempt_id} waits for its store: {exc}") from exc
        if done.outcome == "conflict":
            log.error("promotion.manifest_conflict", workload=e.workload_id, attempt=e.attempt_id, manifest=done.url, reason=done.reason)
            rec = await self.record(e.workload_id)
            # its Job has no use left
            self.pursue(core.pursuit_of(self.follower.projection.get(e.workload_id), e, now, core.REJECTED_ORPHAN + "result manifest conflict"))
            return [core.manifest_conflict(e, rec.epoch if rec is not None else e.epoch, done.reason, now)]
        assert done.manifest is not None
        size = done.manifest.total_bytes  # what a dependent stage reads
        log.info("promotion.done", workload=e.workload_id, attempt=e.attempt_id, result=d.promote.result_path, bytes=size, manifest=done.outcome)
        return [msgspec.structs.replace(x, result_bytes=size) if isinstance(x, ev.Promoted) else x for x in d.events]

    def deferred_promotion(self, e: ev.AttemptCreated) -> ev.PromoteRequested | None:
        """The promotion request of this attempt that arrived before its `attempt-created` (`core.deferred_promotion`)."""
        return core.deferred_promotion(self.follower.projection.get(e.workload_id), e)

    def promotion_source(self, e: ev.PromoteRequested) -> tuple[str | None, str | None]:
        """(store, problem) of a promotion (`core.promotion_source`), with this fencer's
        projection, its stores' URLs and the registry's store names."""
        known = set(self.store_names) if self.store_names is not None else None
        return core.promotion_source(self.follower.projection.get(e.workload_id), e, self.stores.url, known)

    def pursue(self, p: core.Pursuit | None) -> None:
        """Pursue `p` (`core.pursuit_after`, `core.pursuit_of`), unless its attempt is pursued already."""
        if p is not None:
            self.pursuits.setdefault(p.attempt_id, p)

    # --- handler --------------------------------------------------------------------------------
    async def on_event(self, msg: Incoming) -> Sequence[ev.Base]:
        e = msg.event
        self.follower.projection.apply(e, msg.stream_seq)
        self.follower.remember(e.workload_id, msg.headers)
        self.judge_dirty.add(e.workload_id)  # its Jobs are judged again in the next orphan round
        now = time.time()
        if isinstance(e, ev.AttemptCreated):
            d = await self.cas(e.workload_id, lambda r: core.on_attempt_created(r, e, now))
            self.pursue(core.pursuit_after(self.follower.projection.get(e.workload_id), e, d, now))
            waiting = self.deferred_promotion(e)
            return [*d.events, *(await self.promote(waiting, now) if waiting is not None else [])]
        if isinstance(e, ev.FenceRequested):
            d = await self.cas(e.workload_id, lambda r: core.on_fence_requested(r, e, now))
            self.pursue(core.pursuit_after(self.follower.projection.get(e.workload_id), e, d, now))
            log.info("fence.bumped", workload=e.workload_id, attempt=e.attempt_id, events=len(d.events))
            return d.events
        if isinstance(e, ev.PromoteRequested):
            return await self.promote(e, now)
        return []

    # --- cancellation pursuit and orphan collection --------------------------------------------
    def _delete_and_check(self, cc: ClusterClient, p: core.Pursuit) -> core.ConfirmHow | None:
        """Delete the Job, and any pod of it left behind; what the answers mean is `core.confirm_how`
        (the Job is read only once no pod is left: until then it is not confirmed anyway)."""
        try:
            cc.batch.delete_namespaced_job(p.job_name, p.namespace, propagation_policy="Foreground", grace_period_seconds=5, _request_timeout=TIMEOUT)
            p.deleted = True
        except ApiException as exc:
            if exc.status != 404:
                raise
        pods = cc.sanitize(cc.core.list_namespaced_pod(p.namespace, label_selector=f"{LABEL_JOB_NAME}={p.job_name}", _request_timeout=TIMEOUT))
        left = pods.get("items") or []
        for pod in left:  # a pod left behind by an orphan-propagation delete
            try:
                cc.core.delete_namespaced_pod(pod["metadata"]["name"], p.namespace, grace_period_seconds=5, _request_timeout=TIMEOUT)
            except ApiException as exc:
                if exc.status != 404:
                    raise
        exists: bool | None = None
        if not left:
            try:
                cc.batch.read_namespaced_job(p.job_name, p.namespace, _request_timeout=TIMEOUT)
                exists = True
            except ApiException as exc:
                if exc.status != 404:
                    raise
                exists = False
        return core.confirm_how(deleted=p.deleted, pods_left=len(left), job_exists=exists)

    async def pursue_loop(self, stop: asyncio.Event) -> None:
        async def tick() -> None:
            for key, p in list(self.pursuits.items()):
                try:
                    await self.pursue_one(key, p)
                except Exception as exc:  # never let one pursuit stop the others: try again next round
                    log.warning("pursuit.failed", attempt=p.attempt_id, error=str(exc))
        await every(stop, self.interval, tick, name="pursue_loop")

    async def pursue_one(self, key: str, p: core.Pursuit) -> None:
        assert self.publisher is not None
        cc = self.clients.get(p.cluster)
        now = time.time()
        how: core.ConfirmHow | None = None
        try:
            if cc is None:
                how = core.confirm_how(deleted=False, pods_left=0, job_exists=None, cluster_known=False)
            else:
                how = await asyncio.to_thread(self._delete_and_check, cc, p)
        except Exception as exc:
            if not unreachable(exc):
                log.warning("pursuit.error", attempt=p.attempt_id, error=str(exc))
            view = self.follower.projection.get(p.workload_id)
            a = view.attempts.get(p.attempt_id) if view else None
            expired, after = core.pursuit_unreachable(p, None if a is None else a.cancel_confirmed is not None, now)
            if expired:
                await self.publisher.publish(expired, context=self.follower.context(p.workload_id))
                self.pursuits[key] = after  # still pursued: deleted as an orphan once the cluster answers
            return
        if how is None:
            return
        evts = core.pursuit_confirmed(p, how, now)
        log.info("pursuit.confirmed", attempt=p.attempt_id, how=how, orphan=bool(p.orphan_reason))
        await self.publisher.publish(evts, context=self.follower.context(p.workload_id))
        if p.cluster in self.informers:
            self.gone[(p.cluster, p.namespace, p.job_name)] = now
        self.pursuits.pop(key, None)  # only once it is on record

    async def collect_orphans(self, stop: asyncio.Event) -> None:
        """When a cluster answers, every Job of a stale epoch, an unknown attempt or a finished
        workload is deleted (and recorded as `orphan-deleted`). The Jobs are the informers'
        caches (no list call per round), each read once per resourceVersion (`SeenJob`); a
        cluster whose latest call failed is skipped."""
        await every(stop, max(2.0, self.interval * 4), self.collect_once, name="collect_orphans")

    async def collect_once(self) -> None:
        """One round of `collect_orphans`: the Jobs whose verdict may have changed (`to_judge`),
        every Job every FULL_COLLECT_EVERY rounds (`collect_resync`)."""
        began, now = time.perf_counter(), time.time()
        full = self.collect_resync.full(now)
        dirty, self.judge_dirty = self.judge_dirty, set()
        due: set[tuple[str, str, str]] = set()
        while self.judge_due and self.judge_due[0][0] <= now:
            due.add(heapq.heappop(self.judge_due)[1:])
        if full:
            self.judge_due.clear()
        for cluster, inf in self.informers.items():
            if not answering(failing=inf.failing, synced=inf.synced):
                continue
            jobs = inf["jobs"]
            self.forget_gone(cluster, jobs.complete_at)
            gen, changes = jobs.changes_since(self.judged_generation.get(cluster, -1))
            self.judged_generation[cluster] = gen
            if full or changes is None:
                await self.judge_all(cluster, jobs.items(), now)
                continue
            keys = {c.key for c in changes}
            keys |= {(ns, name) for c, ns, name in due if c == cluster}
            picked = [j for k in keys if (j := jobs.get(k[1], k[0])) is not None]
            seen = {(j["metadata"].get("namespace", NAMESPACE), j["metadata"]["name"]) for j in picked}
            picked += [j for w in dirty for j in jobs.by_index(w) if (j["metadata"].get("namespace", NAMESPACE), j["metadata"]["name"]) not in seen]
            await self.judge_all(cluster, picked, now, every_job=False)
        if full:  # the next full round waits for its share of the time
            self.collect_resync.took(now, time.perf_counter() - began)

    @property
    def rounds(self) -> int:
        """Orphan rounds so far."""
        return self.collect_resync.passes

    async def judge_all(self, cluster: str, jobs: Iterable[dict[str, Any]], now: float, *, every_job: bool = True) -> None:
        """Judge these Jobs of the cluster, each read once per resourceVersion (`SeenJob`);
        `every_job`: they are all the cluster has (what is read of the others is forgotten)."""
        before = self.seen_jobs.get(cluster, {})
        now_seen: dict[tuple[str, str], tuple[str | None, SeenJob]] = {} if every_job else before
        self.seen_jobs[cluster] = now_seen
        for j in jobs:
            try:
                meta = j["metadata"]
                key, rv = (meta.get("namespace", NAMESPACE), meta["name"]), meta.get("resourceVersion")
                hit = before.get(key)
                seen = hit[1] if hit is not None and rv is not None and hit[0] == rv else SeenJob.of(cluster, j)
                now_seen[key] = (rv, seen)
                await self.judge(cluster, seen, now)
            except Exception as exc:
                log.warning("orphan.judge_failed", cluster=cluster, job=(j.get("metadata") or {}).get("name"), error=str(exc))

    def forget_gone(self, cluster: str, complete_at: float | None) -> None:
        """Jobs confirmed gone before the cache was last complete: if the cache still holds one,
        it is a new Job of that name, to be judged as any other."""
        if complete_at is None:
            return
        for k in [k for k, at in self.gone.items() if k[0] == cluster and at < complete_at]:
            del self.gone[k]

    async def judge(self, cluster: str, job: SeenJob, now: float) -> None:
        """One managed Job found on a cluster: leave it, or start pursuing it as an orphan."""
        name, ns, found = job.name, job.namespace, job.found
        if job.deleting:
            return  # already going
        if (cluster, ns, name) in self.gone:
            return  # confirmed gone: the cache has not seen its deletion yet
        wid, aid, epoch = found.workload_id, found.attempt_id, found.epoch
        if aid in self.pursuits:
            return
        view = self.follower.projection.get(wid)
        known_attempt = view is not None and aid in view.attempts
        known_workload = known_attempt or (view is not None and view.workload is not None) or await self.in_log(wid)
        created = job.created if job.created is not None else now
        reason = core.orphan_reason(
            await self.record(wid) if known_attempt else None, aid, epoch,  # (the record matters only then)
            known_attempt=known_attempt, known_workload=known_workload, age=now - created,
            workload_status=view.status if view is not None else None,
            grace=self.orphan_grace, grace_unknown=self.orphan_grace_unknown,
        )
        if reason is None:
            if not known_attempt:  # within its grace: judged again when it ends
                grace = self.orphan_grace if known_workload else self.orphan_grace_unknown
                heapq.heappush(self.judge_due, (created + grace, cluster, ns, name))
            return
        log.info("orphan.found", cluster=cluster, job=name, workload=wid, reason=reason)
        self.pursuits[aid] = core.Pursuit(wid, aid, epoch, cluster, ns, name, now, reason)

    def resume_pursuits(self) -> None:
        """After a restart: every fenced attempt not yet confirmed gone is pursued again (`core.pursuits_to_resume`)."""
        for p in core.pursuits_to_resume(self.follower.projection.workloads.values(), self.time_scale):
            self.pursuits.setdefault(p.attempt_id, p)

    async def run(self, stop: asyncio.Event) -> None:
        nc = await bus.connect_as(self.settings, "gpuorch-fencer")  # its own identity (GPUORCH_NATS_CREDS)
        try:
            js = self.js = nc.jetstream()
            await bus.await_topology(js, self.names)  # created by the admin identity
            self.kv = await js.key_value(self.names.kv_fence)
            self.records = Records(self.kv)
            self.publisher = Publisher(js, self.names)
            me = self.settings.tuning.instance  # a replica folds every event through its own durable
            snapshots = Snapshots(js, self.names, snapshot_owner("fencer", me), events_durable(self.names, "fencer", me), lambda: follower_body(self.follower.projection, self.follower.traceparents), interval=self.settings.tuning.snapshot_interval)
            start, _ = await restore_follower(snapshots, self.follower)
            n = await self.follower.catch_up(js, self.names.stream_evt, self.reads, start_seq=start)
            self.resume_pursuits()
            log.info("fencer.caught_up", events=n, pursuits=len(self.pursuits))
            for inf in self.informers.values():
                inf.start()
            await run_until_stopped("fencer", stop, [
                # never dead-lettered (max_deliver 0: unlimited): a promotion waiting out a store
                # outage, or a fence request, is retried for as long as it takes, never dropped
                consume(js, stream=self.names.stream_evt, durable=events_durable(self.names, "fencer", me), filter_subject=self.reads, handler=self.on_event, publisher=self.publisher, names=self.names, stop=stop, max_deliver=0),
                self.pursue_loop(stop),
                self.collect_orphans(stop),
                snapshots.run(stop),
            ], clusters=sorted(self.clients))
            await snapshots.final()
        finally:
            for inf in self.informers.values():
                await asyncio.to_thread(inf.stop)
            await nc.close()


def main() -> None:
    run_service("fencer", Fencer(Settings.for_service("fencer")).run)
