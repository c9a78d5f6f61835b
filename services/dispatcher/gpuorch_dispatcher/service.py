"""The dispatcher's shell: the only writer of attempts (DESIGN §6).

Consumes routing decisions and lifecycle events, creates each attempt's Job through
the official Kubernetes client, watches the Jobs, and publishes what it sees. All
decisions come from `core`; this module only does I/O.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hashlib
import heapq
import json
import math
import time
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import msgspec
import structlog
from kubernetes.client.exceptions import ApiException
from nats.js.errors import KeyWrongLastSequenceError, NotFoundError

from gpuorch import liveness
from gpuorch.config import Settings, load_registry
from gpuorch.follow import Follower, every, run_until_stopped
from gpuorch.informer import PROBE_INTERVAL, ClusterInformers, Informer
from gpuorch.kube import TIMEOUT, ClusterClient, make_clients, unreachable
from gpuorch.objectstore import StoreUnavailable
from gpuorch.observe import progress, spans
from gpuorch.projection import AttemptView, WorkloadView
from gpuorch.resync import Resync
from gpuorch.runtime import bus, kv
from gpuorch.runtime.shell import Incoming, Publisher, Reject, Retry, consume, guard_commands, run_service
from gpuorch.runtime.snapshot import Snapshots, follower_body, restore_follower
from gpuorch.security.bundle import load_identities
from gpuorch.security.identity import Verifier, cancel_refusal
from gpuorch.stores import store_configs, stores_of
from gpuorch_proto import (
    InstanceLease,
    OwnerRecord,
    decode_instance_lease,
    decode_owner,
    encode,
    instance_key,
    k8s,
)
from gpuorch_proto import events as ev
from gpuorch_proto.storage import MARKER, latest_checkpoint
from gpuorch_proto.subjects import valid_token

from . import core

log = structlog.get_logger("gpuorch.dispatcher")


def staged_key(cluster: str, ref: str) -> str:
    """KV key for "gpuorch staged dataset `ref` on `cluster`" (KV keys cannot hold '@')."""
    return f"{cluster}.{hashlib.sha256(ref.encode()).hexdigest()[:16]}"


def observe(job: dict[str, Any], pods: list[dict[str, Any]]) -> core.JobObservation:
    spec, status = job.get("spec") or {}, job.get("status") or {}
    conds = {c.get("type"): c for c in status.get("conditions") or [] if c.get("status") == "True"}
    workers = int(spec.get("parallelism") or 1)
    scheduled = sum(1 for p in pods if (p.get("spec") or {}).get("nodeName"))
    running = sum(1 for p in pods if (p.get("status") or {}).get("phase") in ("Running", "Succeeded"))
    exit_code = None
    init_failed = ""  # a gpuorch agent's init container (stage-N, fetch, input-N) that failed: why
    for p in pods:
        st = p.get("status") or {}
        for cs in st.get("containerStatuses") or []:
            term = (cs.get("state") or {}).get("terminated")
            if term and term.get("exitCode"):
                exit_code = int(term["exitCode"])
        sidecars = {c.get("name") for c in (p.get("spec") or {}).get("initContainers") or [] if c.get("restartPolicy") == "Always"}
        for cs in st.get("initContainerStatuses") or []:
            term = (cs.get("state") or {}).get("terminated")
            if cs.get("name") in sidecars or not term or not term.get("exitCode"):
                continue
            # the agent's exit codes are the contract's: 1 retry, 2 permanent (docs/storage.md)
            exit_code = int(term["exitCode"])
            said = str(term.get("message") or term.get("reason") or "").strip().replace("\n", " ")[:300]
            init_failed = init_failed or f"init container {cs.get('name')} exited {exit_code}" + (f": {said}" if said else "")
    failed = conds.get("Failed")
    reason = ""
    if failed:
        reason = f"{failed.get('reason', 'Failed')}: {failed.get('message', '')}".strip(": ")
        if init_failed:
            reason += f"; {init_failed}"
        elif exit_code is not None:
            reason += f" (exit code {exit_code})"
    unschedulable = ""
    for p in pods:
        if (p.get("spec") or {}).get("nodeName"):
            continue
        for c in (p.get("status") or {}).get("conditions") or []:
            if (
                c.get("type") == "PodScheduled"
                and c.get("status") == "False"
                and c.get("reason") == "Unschedulable"
            ):
                unschedulable = unschedulable or str(c.get("message") or "Unschedulable")
    return core.JobObservation(
        exists=True,
        workers=workers,
        scheduled=scheduled,
        running=running,
        complete="Complete" in conds,
        failed=failed is not None,
        exit_code=exit_code,
        reason=reason,
        unschedulable=unschedulable,
    )


def informers_for(cc: ClusterClient, probe_interval: float = PROBE_INTERVAL) -> ClusterInformers:
    """gpuorch's Jobs and pods of one cluster (its label, its namespace), list-then-watch."""
    group = ClusterInformers(cc.name, probe=cc.probe, probe_interval=probe_interval)
    group.add(
        "jobs", cc.batch.list_namespaced_job, namespace=k8s.NAMESPACE, label_selector=k8s.MANAGED_SELECTOR
    )
    group.add(
        "pods", cc.core.list_namespaced_pod, namespace=k8s.NAMESPACE, label_selector=k8s.MANAGED_SELECTOR,
        index=k8s.LABEL_ATTEMPT,
    )  # fmt: skip
    return group


def resource_version(obj: Any) -> int | None:
    try:
        return int(obj.metadata.resource_version)
    except (AttributeError, TypeError, ValueError):
        return None


class _Meta(msgspec.Struct):
    resource_version: str | None = msgspec.field(default=None, name="resourceVersion")


class _Created(msgspec.Struct):
    """The one part of a create's response the dispatcher reads."""

    metadata: _Meta = msgspec.field(default_factory=_Meta)


_decode_created = msgspec.json.Decoder(_Created).decode


def created_resource_version(raw: bytes) -> int | None:
    """The resourceVersion in a raw create response (None where it has none)."""
    try:
        rv = _decode_created(raw).metadata.resource_version
        return int(rv) if rv is not None else None
    except (msgspec.DecodeError, ValueError):
        return None


#: upkeep passes: every 30th re-checks every owned workload, quiet or not (at most, `gpuorch.resync`:
#: a costly one puts the next off)
FULL_RECONCILE_EVERY = 30
FULL_PRUNE_EVERY = 10  # lease renewals: every 10th looks at every record for finished workloads
#: watch ticks: every 20th looks at every live attempt, changed or not (a resync; at most,
#: `gpuorch.resync`: a costly one puts the next off)
FULL_WATCH_EVERY = 20


class Dispatcher:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.names = settings.names
        self._env_base: core.Environment | None = None
        #: the event subjects it reads (`core.READS`: the types it decides anything from)
        self.reads = [self.names.evt_kind(t) for t in core.READS]
        self.follower = Follower.of(settings.tuning)  # finished workloads retired (gpuorch.projection)
        self.registry = load_registry(settings.registry) if settings.registry else None
        self.stores = stores_of(settings, self.registry)  # where attempts' checkpoints and markers are read
        self.clients: dict[str, ClusterClient] = (
            make_clients(settings.kubeconfig) if settings.kubeconfig else {}
        )
        self.contacts: dict[str, liveness.Contact] = {}  # cluster -> its answers to our list calls
        self.interval = settings.tuning.dispatch_interval
        self.lost_after = settings.tuning.lost_after
        # real seconds a pod may stay unplaceable (no node could ever take it) before its attempt fails
        self.unschedulable_grace = settings.tuning.unschedulable_after
        # an attempt queued unplaced far past the router's estimate is requeued elsewhere (core.Requeue)
        t = settings.tuning
        self.requeue = core.Requeue(factor=t.requeue_factor, floor=t.requeue_after, most=t.requeue_max)
        self.publisher: Publisher | None = None
        self.kv_staged: Any = None
        self.kv_owners: Any = None
        self.me = settings.tuning.dispatcher_id
        self.verifier = (
            Verifier(load_identities(settings.identities)) if settings.identities else None
        )  # who may cancel
        self.owner_ttl = settings.tuning.owner_ttl
        # ownership (core.claim): our instance lease as we last wrote it, and its revision
        self.lease: InstanceLease | None = None
        self.lease_rev = 0
        self._owned: dict[str, int] = {}  # workload id -> revision of its record naming us
        self.records: dict[str, OwnerRecord] = {}  # workload id -> its owner record, as last read or written
        self.leases: dict[str, InstanceLease | None] = {}  # other instance -> its lease, as last read
        self.busy: dict[str, int] = {}  # workload id -> handlers now acting on it (creating its Job, ...)
        self.reconcile_every = settings.tuning.reconcile_interval
        self.js: Any = None
        self.created: dict[str, set[str]] = {}  # workload id -> attempts whose Job this process created
        # workloads handled at once (each workload's events still in order): Job creates in flight
        self.concurrency = settings.tuning.dispatch_concurrency
        self.kube_pool = ThreadPoolExecutor(
            max_workers=settings.tuning.kube_threads, thread_name_prefix="kube"
        )
        # each cluster's gpuorch Jobs and pods, followed by list-then-watch (gpuorch.informer)
        self.informers: dict[str, ClusterInformers] = {
            name: informers_for(cc, settings.tuning.probe_interval) for name, cc in self.clients.items()
        }
        self.created_rv: dict[str, int] = {}  # attempt id -> resourceVersion of the Job we created
        # workload id -> (the last_seq that `reconcile` asked nothing for, until when that holds)
        self.quiet: dict[str, tuple[int, float]] = {}
        # what the upkeep looks at next (`upkeep_list`): workloads with new events (or claimed) since
        # their last look, and (time, workload) of quiet ones whose answer the clock changes then
        self.upkeep_dirty: set[str] = set()
        self.upkeep_due: list[tuple[float, str]] = []
        self.ended: set[str] = set()  # workloads seen finished since the last renewal (their records go)
        self.renewals = 0
        # what the watch looks at next (`to_look_at`): workloads with new events, (time, workload)
        # whose observation clock or marker look is due, the informers' generations read, and
        # when everything is looked at again
        self.dirty: set[str] = set()
        self.due: list[tuple[float, str]] = []
        self.due_at: dict[str, float] = {}
        self.seen_generation: dict[tuple[str, str], int] = {}
        self.watch_resync = Resync(FULL_WATCH_EVERY)  # when the watch looks at every live attempt
        self.upkeep_resync = Resync(FULL_RECONCILE_EVERY)  # when the upkeep looks at every owned workload

    def environment(self) -> core.Environment:
        """Where things live, for the core: the registry's clusters and stores (resolved once)."""
        if self._env_base is None:
            s = self.settings
            self._env_base = core.Environment(
                registry=self.registry.clusters if self.registry else {},
                stores=store_configs(s, self.registry),
                time_scale=self.registry.time_scale if self.registry else 1.0,
                agent_image=s.tuning.agent_image,
            )
        return self._env_base

    async def checkpointed(self, attempts: Iterable[AttemptView]) -> core.Environment:
        """The environment with the latest complete checkpoint of the newest of these attempts
        that has one, found by listing its checkpoints prefix in the store (the pod uploaded it;
        nothing of it is on this process's disk). One listing per attempt, newest first."""
        base = self.environment()
        for a in sorted(attempts, key=lambda a: a.number, reverse=True):
            url = await self.latest_checkpoint(a)
            if url is not None:
                return dataclasses.replace(base, checkpoints={a.attempt_id: url})
        return base

    async def latest_checkpoint(self, a: AttemptView) -> str | None:
        where = self.stores.locate(a.checkpoint_path) if a.checkpoint_path else None
        if where is None:
            return None
        store = self.stores[where[0]]
        try:
            name = latest_checkpoint(await store.list(where[1]))
        except StoreUnavailable as exc:
            log.warning("checkpoint.lookup_failed", attempt=a.attempt_id, error=str(exc))
            return None
        return None if name is None else store.url_of(f"{where[1].rstrip('/')}/{name}")

    async def marker(self, a: AttemptView) -> bytes | None:
        """The attempt's first-step marker, as its agent uploaded it (None: none yet, or the store
        did not answer: looked for again later)."""
        where = self.stores.locate(a.output_path) if a.output_path else None
        if where is None:
            return None
        try:
            return await self.stores[where[0]].get(f"{where[1].rstrip('/')}/{MARKER}")
        except StoreUnavailable as exc:
            log.warning("marker.lookup_failed", attempt=a.attempt_id, error=str(exc))
            return None

    # --- executing actions ---------------------------------------------------------------
    async def execute(self, actions: Sequence[core.Action], workload_id: str) -> list[ev.Base]:
        """Run the I/O an action needs; return the events to publish once it is done."""
        out: list[ev.Base] = []
        for act in actions:
            if isinstance(act, core.Emit):
                out.append(act.event)
            elif isinstance(act, core.CreateJob):
                await self.create_job(act)
                self.created.setdefault(workload_id, set()).add(act.created.attempt_id)
                out.append(act.created)
            elif isinstance(act, core.DeleteJob):
                await self.delete_job(act)
            elif isinstance(act, core.RefuseMessage):
                raise Reject(act.reason, claimed_workload_id=act.claimed_workload_id)
        return out

    async def create_job(self, act: core.CreateJob) -> None:
        cc = self.clients.get(act.cluster)
        if cc is None:
            raise RuntimeError(f"routed to unknown cluster {act.cluster!r} (not in the kubeconfig)")
        loop, name = asyncio.get_running_loop(), act.manifest["metadata"]["name"]
        try:
            # the response read raw (only its resourceVersion is needed), the body not made a model
            raw = await loop.run_in_executor(
                self.kube_pool, lambda: cc.create_job(act.namespace, act.manifest, TIMEOUT)
            )
            rv = created_resource_version(raw)
            log.info("job.created", cluster=act.cluster, job=name)
        except ApiException as exc:
            if exc.status != 409:
                raise
            log.info("job.exists", cluster=act.cluster, job=name)
            try:  # rare: its resourceVersion, so the watch cache is not read before it holds the Job
                job = await loop.run_in_executor(
                    self.kube_pool,
                    lambda: cc.batch.read_namespaced_job(name, act.namespace, _request_timeout=TIMEOUT),
                )
            except Exception:
                return
            rv = resource_version(job)
        if rv is not None:
            self.created_rv[act.created.attempt_id] = rv

    async def delete_job(self, act: core.DeleteJob) -> None:
        cc = self.clients.get(act.cluster)
        if cc is None:
            return
        try:
            await asyncio.to_thread(
                cc.batch.delete_namespaced_job,
                act.job_name,
                act.namespace,
                propagation_policy="Background",
                _request_timeout=TIMEOUT,
            )
        except ApiException as exc:
            if exc.status != 404:
                log.warning("job.delete_failed", cluster=act.cluster, job=act.job_name, status=exc.status)
        except Exception as exc:
            log.warning("job.delete_unreachable", cluster=act.cluster, job=act.job_name, error=str(exc))

    # --- one dispatch owner per workload: a record per workload, a lease per instance (core.claim)
    @property
    def generation(self) -> int:
        return self.lease.generation if self.lease is not None else 0

    @property
    def owned(self) -> dict[str, int]:
        """The workloads we own and may act on: none while our instance lease is not live (it ran
        out, say the event loop stalled; another dispatcher may be about to take them over)."""
        return self._owned if core.instance_alive(self.lease, time.time()) else {}

    def _over(self, instance: str, generation: int) -> bool:
        lease = self.lease if instance == self.me else self.leases.get(instance)
        return core.generation_over(lease, generation)

    async def owns(self, workload_id: str, *, fresh: bool = False) -> bool:
        """Do we own this workload? Claims it when it has no owner or its owner's generation is
        over. A workload whose record we know names a live other instance costs no round trip.
        `fresh`: its first routing decision, so it most likely has no record yet (`_claim`)."""
        if not core.instance_alive(self.lease, time.time()):
            return False
        if workload_id in self._owned:
            return True
        if core.claim(self.records.get(workload_id), self.me, self.generation, self._over) is None:
            return False
        return await self._claim(workload_id, fresh=fresh) is not None

    async def _claim(self, workload_id: str, *, fresh: bool = False) -> str | None:
        """Try to claim on the record as it is now; returns the previous owner ("" if none) on
        success, None otherwise. Writes only when the record does not name us already. `fresh`
        (and no record known): create the record without reading first (`likely_absent`)."""
        if not core.instance_alive(self.lease, time.time()):
            return None
        me, generation = self.me, self.generation

        def step(value: bytes | None) -> tuple[tuple[OwnerRecord | None, OwnerRecord | None], bytes | None]:
            current = decode_owner(value) if value is not None else None
            record = core.claim(current, me, generation, self._over)
            return (current, record), (encode(record) if record is not None and record != current else None)

        try:  # one try: a lost race means another dispatcher owns it now
            w = await kv.compare_and_set(
                self.kv_owners, workload_id, step, attempts=1, likely_absent=fresh and workload_id not in self.records
            )
        except KeyWrongLastSequenceError:
            log.info("ownership.lost_race", workload=workload_id)
            self.records.pop(workload_id, None)  # read again next time
            return None
        except Exception as exc:  # the bucket did not answer: not ours for now, asked again later
            log.warning("ownership.claim_failed", workload=workload_id, error=type(exc).__name__)
            return None
        current, record = w.decision
        if record is None:
            if current is not None:
                self.records[workload_id] = current
            return None
        if self.generation != generation:  # our lease was ended meanwhile: this claim is void
            return None
        self.records[workload_id] = record
        self._owned[workload_id] = w.revision
        self.dirty.add(workload_id)  # ours now: the watch looks at its attempts
        self.upkeep_dirty.add(workload_id)  # and the upkeep at what it still needs
        previous = current.owner if current else ""
        if previous and previous != me:
            log.info("ownership.takeover", workload=workload_id, previous=previous)
        return previous

    async def start_ownership(self) -> None:
        """Our instance lease, before any claim: the same generation renewed when nobody ended
        it (a restart picks its own workloads up again without a write), the next one if ended."""
        while True:
            value, rev = await kv.read(self.kv_owners, instance_key(self.me))
            current = decode_instance_lease(value) if value is not None else None
            if await self._write_lease(core.renewed(current, self.me, time.time(), self.owner_ttl), rev):
                log.info("ownership.lease", instance=self.me, generation=self.generation)
                return

    async def _write_lease(self, lease: InstanceLease, rev: int) -> bool:
        """Write our lease by compare-and-set on `rev`; False on a conflict. A new generation
        forgets every workload we owned: each is claimed again, by compare-and-set."""
        key = instance_key(self.me)
        try:
            new_rev = await (
                self.kv_owners.create(key, encode(lease))
                if rev == 0
                else self.kv_owners.update(key, encode(lease), last=rev)
            )
        except KeyWrongLastSequenceError:
            return False
        if self.lease is not None and lease.generation != self.lease.generation:
            log.warning(
                "ownership.lease_ended", instance=self.me, generation=lease.generation, owned=len(self._owned)
            )
            self._owned.clear()
            self.records = {w: r for w, r in self.records.items() if r.owner != self.me}
        self.lease, self.lease_rev = lease, int(new_rev)
        return True

    async def renew(self, stop: asyncio.Event) -> None:
        await every(stop, self.owner_ttl / 3, self.renew_once, name="renew")

    async def renew_once(self) -> None:
        """One write per period whatever we own: our instance lease (compare-and-set; on a
        conflict someone ended it, and the next generation starts)."""
        self.renewals += 1
        # the workloads seen finishing since the last renewal; now and then every record (a
        # workload finished by a snapshot or replay, not by an event handled here)
        ended = self.records if self.renewals % FULL_PRUNE_EVERY == 1 else self.ended
        for wid in [w for w in ended if self._done(w)]:
            self.records.pop(wid, None)
            self._owned.pop(wid, None)
        self.ended = set()
        if self.lease is None:
            await self.start_ownership()
            return
        try:
            if not await self._write_lease(
                core.renewed(self.lease, self.me, time.time(), self.owner_ttl), self.lease_rev
            ):
                await self.start_ownership()  # ended by someone who saw it run out: the next generation
        except Exception as exc:  # the bucket did not answer: `owned` empties when the lease runs out
            log.warning("ownership.renew_failed", instance=self.me, error=type(exc).__name__)

    def _done(self, workload_id: str) -> bool:
        view = self.follower.projection.get(workload_id)
        return view is not None and view.terminal

    async def take_over(self, stop: asyncio.Event) -> None:
        await every(stop, self.owner_ttl / 2, self.take_over_once, name="take_over")

    async def take_over_once(self) -> None:
        """Workloads whose owner's generation is over (it died) are claimed and re-driven.

        One read per other instance our records name (and a compare-and-set ending a lease that
        ran out); a workload costs a round trip only when its record is not known yet (once) or
        its owner's generation is over."""
        now = time.time()
        generations: dict[str, int] = {}
        for r in self.records.values():
            if r.owner != self.me:
                generations[r.owner] = max(generations.get(r.owner, 0), r.generation)
        for instance, generation in sorted(generations.items()):
            await self._check_instance(instance, generation, now)
        views = self.follower.projection.workloads
        for wid in list(views.keys() - self._owned.keys()):  # (a set difference: not a look at every view)
            view = views.get(wid)
            if view is None or not core.needs_owner(view):
                continue
            if core.claim(self.records.get(wid), self.me, self.generation, self._over) is None:
                continue
            if await self._claim(wid) is None:
                continue
            try:
                await self.redrive(view)
            except Exception as exc:  # e.g. a cluster that does not answer: the reconcile loop retries
                log.warning("redrive.failed", workload=wid, error=str(exc))

    async def _check_instance(self, instance: str, generation: int, now: float) -> None:
        """Read another instance's lease; if it ran out, end it (compare-and-set: it races with
        that instance's own renewal, and one of the two wins)."""
        key = instance_key(instance)
        value, rev = await kv.read(self.kv_owners, key)
        lease = decode_instance_lease(value) if value is not None else None
        end = core.end_lapsed(lease, instance, generation, now)
        if end is not None:
            try:
                await (
                    self.kv_owners.create(key, encode(end))
                    if rev == 0
                    else self.kv_owners.update(key, encode(end), last=rev)
                )
                log.info("ownership.instance_ended", instance=instance, generation=end.generation)
                lease = end
            except KeyWrongLastSequenceError:
                pass  # renewed (or ended by another) in between: read again next period
        self.leases[instance] = lease

    async def reconcile_owned(self, stop: asyncio.Event) -> None:
        """Level-triggered upkeep of the workloads we own: whatever is due by time alone (a
        replacement once its retry backoff has passed) or was missed. `core.reconcile` asks for
        nothing the state already shows, so this is a no-op for a workload that is on track."""

        async def tick() -> None:
            # the first pass and now and then every owned workload, quiet or not
            now, began = time.time(), time.perf_counter()
            full = self.upkeep_resync.full(now)
            owned = self.owned
            for wid in self.upkeep_list(now, full):
                if wid not in owned:
                    continue
                view = self.follower.projection.get(wid)
                if view is None or view.terminal or view.workload is None:
                    self.quiet.pop(wid, None)
                    continue
                if self.busy.get(wid):  # its handler is at it: looked at again next pass
                    self.quiet.pop(wid, None)
                    self.upkeep_dirty.add(wid)
                    continue
                seen = self.quiet.get(wid)
                if not full and seen is not None and seen[0] == view.last_seq and now < seen[1]:
                    continue  # this state asked for nothing, and the clock cannot change that yet
                try:
                    await self.redrive(view)
                except Exception as exc:  # e.g. a cluster that does not answer a create: next round
                    log.warning("reconcile.failed", workload=wid, error=str(exc))
                    self.upkeep_dirty.add(wid)
            if full:
                self.upkeep_resync.took(now, time.perf_counter() - began)

        await every(stop, self.reconcile_every, tick, name="reconcile_owned")

    def upkeep_list(self, now: float, full: bool) -> list[str]:
        """The owned workloads the upkeep looks at: all of them on a full pass; otherwise those
        with new events (or newly ours) since their last look, and the quiet ones whose answer the
        clock may change by now (`core.reconcile_due`). A workload neither lists is quiet at the
        `last_seq` it was last looked at, before its due time: the full pass would skip it too."""
        if full:
            self.upkeep_dirty, self.upkeep_due = set(), []
            return list(self.owned)
        todo = dict.fromkeys(self.upkeep_dirty)
        self.upkeep_dirty = set()
        while self.upkeep_due and self.upkeep_due[0][0] <= now:
            todo.setdefault(heapq.heappop(self.upkeep_due)[1])
        return list(todo)

    async def redrive(self, view: WorkloadView) -> None:
        assert self.publisher is not None
        now, tp = time.time(), self.follower.traceparent(view.workload_id)
        seq, env = view.last_seq, self.environment()
        actions = core.reconcile(view, now, env, tp)
        if core.needs_checkpoints(actions):  # only then read the checkpoints (file I/O)
            actions = core.reconcile(view, now, await self.checkpointed(view.attempts.values()), tp)
        # an attempt we created ourselves is on its way to our projection: never create it twice
        mine = self.created.get(view.workload_id, set())
        actions = [a for a in actions if not (isinstance(a, core.CreateJob) and a.created.attempt_id in mine)]
        if not actions:  # on track: skip it until its state changes or `reconcile_due` comes
            due = core.reconcile_due(view, env)
            self.quiet[view.workload_id] = (seq, due)
            if due != math.inf:
                heapq.heappush(self.upkeep_due, (due, view.workload_id))
            return
        self.quiet.pop(view.workload_id, None)
        self.upkeep_dirty.add(view.workload_id)  # looked at again next pass, until it is on track
        log.info("workload.redriven", workload=view.workload_id, actions=len(actions))
        await self.publisher.publish(
            await self.execute(actions, view.workload_id), context=self.follower.context(view.workload_id)
        )

    # --- handlers --------------------------------------------------------------------------
    async def on_event(self, msg: Incoming) -> Sequence[ev.Base]:
        wid = msg.event.workload_id
        self.busy[wid] = self.busy.get(wid, 0) + 1
        try:
            return await self._on_event(msg)
        finally:
            self.busy[wid] -= 1
            if not self.busy[wid]:
                del self.busy[wid]

    async def _on_event(self, msg: Incoming) -> Sequence[ev.Base]:
        e = msg.event
        view = self.follower.projection.apply(e, msg.stream_seq)
        self.follower.remember(e.workload_id, msg.headers)
        self.dirty.add(e.workload_id)  # the watch looks at it again (`to_look_at`)
        self.upkeep_dirty.add(e.workload_id)  # and so does the upkeep (`upkeep_list`)
        if isinstance(e, ev.AttemptCreated) and (mine := self.created.get(e.workload_id)) is not None:
            mine.discard(e.attempt_id)  # in the projection now: what `created` bridged until it was
            if not mine:
                del self.created[e.workload_id]
            if (rv := self.created_rv.pop(e.attempt_id, None)) is not None:
                self.created_rv[e.attempt_id] = rv  # keyed by the projection's string of the id
        if view is None:
            return []
        if view.terminal:
            self.ended.add(e.workload_id)  # its owner record is dropped at the next renewal
        if e.workload_id in self.owned:
            spans.record_attempt(view, e, msg.context)  # an attempt that ended: its span and its phases
        if isinstance(e, ev.Running) and e.workload_id in self.owned:
            await self.record_staged(view, e)
        # the event is folded: what the workload's state needs now is `core.reconcile`'s to say, as
        # for the upkeep and a take-over (one decision function; each effect with its event id)
        now, tp, routed = time.time(), self.follower.traceparent(e.workload_id), isinstance(e, ev.Routed)
        # a routed attempt's Job names the latest checkpoint (`choose_mode`): read it before deciding
        env = await self.checkpointed(view.attempts.values()) if routed else self.environment()
        actions = core.reconcile(view, now, env, tp)
        if not routed and core.needs_checkpoints(actions):  # a route request names the latest checkpoint
            actions = core.reconcile(view, now, await self.checkpointed(view.attempts.values()), tp)
        if not routed:  # an attempt we created ourselves is on its way to our projection: not twice
            mine = self.created.get(e.workload_id, set())
            actions = [a for a in actions if not (isinstance(a, core.CreateJob) and a.created.attempt_id in mine)]
        fresh = isinstance(e, ev.Routed) and e.attempt_number == 1 and not view.attempts  # (a claim hint)
        if not actions or not await self.owns(e.workload_id, fresh=fresh):
            return []
        try:
            return await self.execute(actions, e.workload_id)
        except Exception as exc:
            creates = [a for a in actions if isinstance(a, core.CreateJob)]
            if not creates:
                raise
            if not routed:  # the routed event's redelivery (and the upkeep) try the create again
                log.warning("job.create_failed", workload=e.workload_id, error=str(exc))
                self.upkeep_dirty.add(e.workload_id)
                return []
            out: list[ev.Base] = []
            for c in creates:
                evs = core.create_unanswered(c, now, str(exc), unreachable=unreachable(exc), delivered=msg.delivered)
                if evs is None:
                    log.warning("job.create_failed", workload=e.workload_id, error=str(exc), delivered=msg.delivered)
                    raise Retry(1.0) from exc
                out.extend(evs)
            return out

    async def on_command(self, msg: Incoming) -> Sequence[ev.Base]:
        e = msg.event
        if not isinstance(e, ev.Cancel):
            return []
        wid = e.workload_id
        view = self.follower.projection.get(wid)
        creating = bool(self.busy.get(wid) or self.unrecorded(view, wid))
        known = view is not None and view.workload is not None
        in_log = not creating and not known and await self.in_log(wid)  # asked only when it matters
        wait = core.cancel_wait(view, creating=creating, in_log=in_log, delivered=msg.delivered)
        if wait is not None:
            raise Retry(wait.delay, wait.reason)
        if view is not None and view.workload is not None:  # who may cancel it (docs/security.md)
            refused = cancel_refusal(
                self.verifier, msg.subject, msg.msg_id, msg.headers, msg.data, view.workload.metadata.owner
            )
            if refused is not None:
                raise Reject(f"cancel refused: {refused}", claimed_workload_id=wid)
        actions = core.on_cancel(view, wid, e.reason, time.time())
        return await self.execute(actions, wid)

    def unrecorded(self, view: WorkloadView | None, workload_id: str) -> set[str]:
        """Attempts whose Job we created but whose `attempt-created` our projection has not applied yet."""
        mine = self.created.get(workload_id, set())
        return mine - set(view.attempts) if view is not None else set(mine)

    async def in_log(self, workload_id: str) -> bool:
        """Does the event log hold this workload's `submitted` (whatever our projection has seen)?"""
        if self.js is None or not valid_token(workload_id):
            return False
        try:
            await self.js.get_last_msg(self.names.stream_evt, self.names.evt(workload_id, "submitted"))
            return True
        except NotFoundError:
            return False

    async def record_staged(self, view: WorkloadView, e: ev.Running) -> None:
        """After an attempt's staging init containers ran, its inputs are cached on that cluster.
        A copy (not a cache hit) also records its measurement, from the stage container's
        termination message (`core.stage_measurements`): inventory turns those into the
        cluster's measured bandwidth per location. A hit never overwrites a measurement."""
        if view.workload is None or self.kv_staged is None:
            return
        entry = self.registry.clusters.get(e.cluster) if self.registry else None
        refs = [inp.ref for inp in view.workload.spec.inputs]
        attempt = view.attempts.get(e.attempt_id)
        measured: dict[str, core.StageMeasurement] = {}
        if refs and attempt is not None and e.cluster in self.informers:
            measured = core.stage_measurements(self.observed(e.cluster, attempt)[1], refs)
        for ref in refs:
            m = measured.get(ref)
            key = staged_key(e.cluster, ref)
            if m is None:
                if entry and ref in entry.datasets_cached:
                    continue  # the registry's already
                with contextlib.suppress(KeyWrongLastSequenceError):  # staged before: keep its measurement
                    await self.kv_staged.create(key, json.dumps({"cluster": e.cluster, "ref": ref, "at": e.at}).encode())
                continue
            value = {"cluster": e.cluster, "ref": ref, "at": e.at, **m.doc()}
            await self.kv_staged.put(key, json.dumps(value).encode())
            log.info("staging.measured", workload=e.workload_id, cluster=e.cluster, ref=ref, **m.doc())

    # --- watching the clusters ---------------------------------------------------------------
    def observed(self, cluster: str, a: AttemptView) -> tuple[dict[str, Any] | None, list[dict[str, Any]]]:
        """The attempt's Job and pods from the cluster's informers' caches (no API call)."""
        inf = self.informers[cluster]
        return inf["jobs"].get(a.job_name, a.namespace or None), inf["pods"].by_index(a.attempt_id)

    def to_look_at(self, now: float) -> Iterable[WorkloadView] | None:
        """The workloads the watch looks at this tick, as client-go's controllers take keys from
        a work queue fed by event handlers: those whose events were folded (`dirty`), whose Job
        or pods changed (the informers' `changes_since`), whose clock is due (`due`, from
        `core.observation_due`, and running ones whose next look for their first-step marker is
        due: `progress.next_look`). None:
        everything, on the resync period (`watch_resync`) or when a cache was re-listed."""
        wids, self.dirty = self.dirty, set()
        relisted = False
        for cluster, inf in self.informers.items():
            for name in ("jobs", "pods"):
                gen, changes = inf[name].changes_since(self.seen_generation.get((cluster, name), -1))
                self.seen_generation[(cluster, name)] = gen
                if changes is None:
                    relisted = True
                    continue
                wids.update(w for c in changes if (w := c.labels.get(k8s.LABEL_WORKLOAD)))
        while self.due and self.due[0][0] <= now:
            at, wid = heapq.heappop(self.due)
            if self.due_at.get(wid) == at:  # (an entry a later push replaced is skipped)
                del self.due_at[wid]
                wids.add(wid)
        views = self.follower.projection.workloads
        if relisted:
            self.watch_resync.again()
        if self.watch_resync.full(now):
            self.due.clear()
            self.due_at.clear()
            return None
        return [views[w] for w in wids if w in views]

    def look_again(self, workload_id: str, at: float) -> None:
        """The watch looks at the workload again at `at` (the earliest time asked for wins)."""
        if self.due_at.get(workload_id, float("inf")) <= at:
            return
        self.due_at[workload_id] = at
        heapq.heappush(self.due, (at, workload_id))

    def absent_for_sure(self, jobs: Informer, a: AttemptView) -> bool:
        """May a Job missing from the cache be called missing (`core.absent_for_sure`, with what
        this process created and what the cache has seen)?"""
        return core.absent_for_sure(
            a, created_rv=self.created_rv.get(a.attempt_id), cache_rv=jobs.resource_version, complete_at=jobs.complete_at
        )

    def fold_contacts(self) -> None:
        """The informers' facts (each call answered or not, with its time) through `liveness.contact`."""
        for cluster, inf in self.informers.items():
            for answered, at, _ in inf.contacts():
                self.contacts[cluster] = liveness.contact(self.contacts.get(cluster), answered, at)

    async def watch(self, stop: asyncio.Event) -> None:
        """Each tick, what the informers' caches say about our live attempts (no list calls:
        the API cost does not grow with the attempts), and `lost` for clusters that went silent."""
        assert self.publisher is not None

        async def tick() -> None:
            assert self.publisher is not None
            self.fold_contacts()
            now = time.time()
            # a cluster that went silent: every attempt there is looked at (lost, when it is)
            everything = any(not liveness.answering(failing=inf.failing, synced=inf.synced) for inf in self.informers.values())
            began, looked = time.perf_counter(), self.to_look_at(now)
            views = self.follower.projection.workloads.values() if looked is None or everything else looked
            for cluster, items in core.watched(views, self.owned).items():
                inf = self.informers.get(cluster)
                if inf is None:
                    continue
                now = time.time()
                if not liveness.answering(failing=inf.failing, synced=inf.synced):
                    why = liveness.silent_for(self.contacts.get(cluster), now, self.lost_after)
                    if why is not None:
                        for view, a in items:
                            acts = core.lost(view, a, now, f"{cluster} {why} ({inf.error or 'not synced'})")
                            await self.publisher.publish(
                                await self.execute(acts, view.workload_id),
                                context=self.follower.context(view.workload_id),
                            )
                    continue
                job_cache = inf["jobs"]
                clocks = {
                    "unschedulable_grace": self.unschedulable_grace,
                    "requeue": self.requeue,
                    "time_scale": self.registry.time_scale if self.registry else 1.0,
                }
                for view, a in items:
                    job, pods = self.observed(cluster, a)
                    if job is None and not self.absent_for_sure(job_cache, a):
                        # created a moment ago (by us, or by a dispatcher we took over from): not in the cache yet
                        self.look_again(view.workload_id, now)
                        continue
                    obs = observe(job, pods) if job else core.JobObservation(exists=False)
                    acts = core.on_observation(view, a, obs, now, **clocks)  # type: ignore[arg-type]
                    if not acts and (due := core.observation_due(view, a, obs, **clocks)) is not None:  # type: ignore[arg-type]
                        self.look_again(view.workload_id, due)
                    if a.status == "running" and progress.KIND not in a.times:
                        # its marker is an object in the store: looked for again soon, less often the longer it runs
                        # without one (most programs never write it; its time is the program's own)
                        self.look_again(view.workload_id, progress.next_look(a.times.get("running"), now, self.interval))
                    # the program's first step, if reported: only where pods run or ran (the marker
                    # is written from inside one), not for every attempt still queued
                    seen = (
                        progress.compute_started(view.workload_id, a, await self.marker(a), now)
                        if (acts or a.status == "running") and progress.KIND not in a.times
                        else []
                    )
                    if acts or seen:
                        wid = view.workload_id
                        await self.publisher.publish(
                            [*seen, *await self.execute(acts, wid)], context=self.follower.context(wid)
                        )
                    if a.status in ("succeeded", "failed") or a.gone:
                        self.created_rv.pop(a.attempt_id, None)
            if looked is None:  # a full pass: the next one waits for its share of the time
                self.watch_resync.took(now, time.perf_counter() - began)

        # a failed call wakes the tick: loss is declared on the failure that proves it, not up
        # to an interval later (docs/faults.md)
        wake, loop = asyncio.Event(), asyncio.get_running_loop()

        def woken() -> None:
            loop.call_soon_threadsafe(wake.set)

        for inf in self.informers.values():
            inf.on_failure = woken
        await every(stop, self.interval, tick, name="watch", wake=wake)

    async def run(self, stop: asyncio.Event) -> None:
        nc = await bus.connect_as(self.settings, "gpuorch-dispatcher")  # its own identity (GPUORCH_NATS_CREDS)
        for inf in self.informers.values():
            inf.start()
        try:
            js = self.js = nc.jetstream()
            await bus.await_topology(js, self.names)  # created by the admin identity
            self.kv_staged = await js.key_value(self.names.kv_staged)
            self.kv_owners = await js.key_value(self.names.kv_owners)
            self.publisher = Publisher(js, self.names)
            durable = self.names.durable("dispatcher", f"events-{self.me}")
            snapshots = Snapshots(
                js,
                self.names,
                f"dispatcher.{self.me}",
                durable,
                lambda: follower_body(self.follower.projection, self.follower.traceparents),
                interval=self.settings.tuning.snapshot_interval,
            )
            start, _ = await restore_follower(snapshots, self.follower)
            n = await self.follower.catch_up(js, self.names.stream_evt, self.reads, start_seq=start)
            log.info("dispatcher.caught_up", events=n, instance=self.me, from_seq=start)
            await self.start_ownership()
            for wid, view in list(self.follower.projection.workloads.items()):
                if core.needs_owner(view) and await self._claim(wid) is not None:
                    try:
                        await self.redrive(view)  # whatever a crash interrupted
                    except (
                        Exception
                    ) as exc:  # e.g. a cluster that does not answer: the reconcile loop retries
                        log.warning("redrive.failed", workload=wid, error=str(exc))
            await run_until_stopped(
                "dispatcher",
                stop,
                [
                    self.renew(stop),
                    self.take_over(stop),
                    self.reconcile_owned(stop),
                    consume(
                        js,
                        stream=self.names.stream_evt,
                        durable=self.names.durable("dispatcher", f"events-{self.me}"),
                        filter_subject=self.reads,
                        handler=self.on_event,
                        publisher=self.publisher,
                        names=self.names,
                        stop=stop,
                        concurrency=self.concurrency,
                    ),
                    consume(
                        js,
                        stream=self.names.stream_cmd,
                        durable=self.names.durable("dispatcher", "cancel"),
                        filter_subject=self.names.cmd_cancel,
                        handler=self.on_command,
                        publisher=self.publisher,
                        names=self.names,
                        stop=stop,
                        max_deliver=40,
                    ),
                    guard_commands(
                        js, names=self.names, publisher=self.publisher, stop=stop
                    ),  # unknown cmd.* subjects get a rejection
                    self.watch(stop),
                    snapshots.run(stop),
                ],
                clusters=sorted(self.clients),
                instance=self.me,
            )
            await snapshots.final()
        finally:
            for inf in self.informers.values():
                await asyncio.to_thread(inf.stop)
            await nc.close()


def main() -> None:
    run_service("dispatcher", Dispatcher(Settings.for_service("dispatcher")).run)
