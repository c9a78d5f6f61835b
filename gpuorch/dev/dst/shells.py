"""The four services' shells over the simulated bus: what the real shells do, calling the same cores.

Each class mirrors one ``services/*/service.py``: it folds the event log into a projection, calls
the same pure functions (``gpuorch_router.policy.route`` through ``gpuorch_router.core``,
``gpuorch_dispatcher.core``, ``gpuorch_fencer.core``, ``gpuorch_inventory.core``), publishes, then
acks. Where a real shell awaits (NATS, KV, the Kubernetes API), the generator yields: another task,
a fault or a crash may come in between. Where a real shell holds decision logic of its own (not in
a core), it is repeated here, marked ``# shell logic``, and listed in docs/simulation-testing.md.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import msgspec

from gpuorch import liveness
from gpuorch.invariants import Violation
from gpuorch.projection import AttemptView, Projection, WorkloadView, same_document
from gpuorch_dispatcher import core as dcore
from gpuorch_fencer import core as fcore
from gpuorch_inventory import core as icore
from gpuorch_proto import (
    ClusterSnapshot,
    Event,
    FenceRecord,
    InstanceLease,
    OwnerRecord,
    event_id,
    instance_key,
    workload_id_for,
)
from gpuorch_proto import events as ev
from gpuorch_proto.events import message_ref
from gpuorch_proto.k8s import NAMESPACE
from gpuorch_proto.storage import Manifest, StoreConfig, attempt_prefix
from gpuorch_proto.subjects import valid_token
from gpuorch_router import core as rcore
from gpuorch_router.pipeline import Gate
from gpuorch_router.policy import RoutingMemo, SnapshotIndex, build_index

from .bus import KVConflict, SimConsumer, SimKV, StoredMsg
from .cluster import SimCluster, Unreachable
from .runtime import Fetch, Gen, Reject, Retry, Sleep, Task, Until, default_backoff
from .world import EPOCH0, STREAM_CMD, STREAM_EVT, World


@dataclass(frozen=True)
class Incoming:
    event: Event
    stream: str
    stream_seq: int
    delivered: int
    msg_id: str


class Service:
    """One process: its tasks die with it; its durable consumers live on the server."""

    kind = "service"

    def __init__(self, w: World, name: str) -> None:
        self.w = w
        self.name = name
        self.alive = True
        self.tasks: list[Task] = []
        self.stalled_until = 0.0  # the `stall` fault: none of its tasks runs before then

    def spawn(self, name: str, gen: Gen) -> None:
        t = Task(f"{self.name}.{name}", self, gen)
        self.tasks.append(t)
        self.w.spawned.append(t)

    def start(self) -> Gen:
        """The start-up task: replay the log, then spawn the loops."""
        raise NotImplementedError
        yield

    def replay(self, fold: Callable[[Event, int], object]) -> Gen:
        """`replay()`: read the event stream up to its last sequence now (one step per 64 messages)."""
        last = self.w.evt.last_seq
        for m in self.w.evt.msgs[:last]:
            fold(m.data, m.seq)
            if m.seq % 64 == 0:
                yield None
        self.w.log(self.name, f"replayed {last} events")

    # --- the consume loop of gpuorch.runtime.shell --------------------------------------------
    def consume(self, consumer: SimConsumer, handler: Callable[[Incoming], Gen], max_deliver: int = 5) -> Gen:
        w = self.w
        stream = consumer.stream.name
        while True:
            yield Fetch(consumer)
            got = consumer.fetch(w.now, self)
            if got is None:
                continue
            msg, delivered = got
            w.log(self.name, f"deliver {stream}#{msg.seq} {ev.type_tag(msg.data)} {msg.msg_id} (delivery {delivered})")
            inc = Incoming(msg.data, stream, msg.seq, delivered, msg.msg_id)
            if delivered > max_deliver:
                yield from self.dead_letter(consumer, msg, f"did not complete in {max_deliver} deliveries")
                continue
            try:
                out = yield from handler(inc)
            except Reject as r:
                rej = ev.Rejected(
                    event_id=f"{message_ref(stream, msg.seq)}.rejected", workload_id=message_ref(stream, msg.seq), at=w.now,
                    reason=r.reason, source_sequence=msg.seq, source_stream=stream, idempotency_key=msg.msg_id or None,
                    claimed_workload_id=r.claimed_workload_id,
                )
                yield None
                w.publish(rej, self.name)
                consumer.term(msg.seq)
                continue
            except Exception as exc:  # Retry, an unreachable cluster, a KV conflict, a bug
                if delivered >= max_deliver:
                    yield from self.dead_letter(consumer, msg, f"failed {delivered} times; last error: {type(exc).__name__}: {exc}")
                    continue
                delay = exc.delay if isinstance(exc, Retry) else default_backoff(delivered)
                if not isinstance(exc, Retry | Unreachable | KVConflict):
                    w.loop_errors.append(f"{self.name} handler {type(exc).__name__}: {exc}")
                w.log(self.name, f"nak {stream}#{msg.seq} in {delay:g}s ({type(exc).__name__}: {exc})")
                consumer.nak(msg.seq, w.now, delay)
                continue
            for e in out:  # publish, then ack: a crash in between republishes the same ids
                yield None
                w.publish(e, self.name)
            yield None
            consumer.ack(msg.seq)

    def dead_letter(self, consumer: SimConsumer, msg: StoredMsg, why: str) -> Gen:
        stream = consumer.stream.name
        if not isinstance(msg.data, ev.Rejected):
            rej = ev.Rejected(
                event_id=f"{message_ref(stream, msg.seq)}.rejected.{consumer.durable}", workload_id=message_ref(stream, msg.seq),
                at=self.w.now, reason=f"handler on {consumer.durable} {why}", source_sequence=msg.seq, source_stream=stream,
                idempotency_key=msg.msg_id or None, claimed_workload_id=msg.data.workload_id or None,
            )
            yield None
            self.w.publish(rej, self.name)
        consumer.term(msg.seq)

    def every(self, interval: float, round_: Callable[[], Gen], name: str) -> Gen:
        """A periodic loop (`gpuorch.follow.every`): a tick that raises is logged, the next one runs."""
        while True:
            try:
                yield from round_()
            except Exception as exc:
                if not isinstance(exc, Unreachable | KVConflict):
                    self.w.loop_errors.append(f"{self.name}.{name} {type(exc).__name__}: {exc}")
                self.w.log(self.name, f"tick {name} failed: {type(exc).__name__}: {exc}")
            yield Sleep(self.w.now + interval)

    def api(self, cluster: SimCluster) -> Gen:
        """An API call's latency (raises after the client timeout)."""
        if cluster.latency > 0:
            yield Sleep(self.w.now + min(cluster.latency, 5.0))
        else:
            yield None
        cluster.call()


# =============================================================================== router


class RouterSim(Service):
    kind = "router"

    def __init__(self, w: World, name: str, consumers: dict[str, SimConsumer]) -> None:
        super().__init__(w, name)
        self.projection = Projection(retire=True, compact=True)  # as the services' (gpuorch.follow.Follower)
        self.state = rcore.RouterState()
        self.gate = Gate()  # the admission gate: every workload is released before it is routed
        self.policy = w.policy
        self.snapshots: dict[str, ClusterSnapshot] = {}
        self.indexes: dict[str, SnapshotIndex] = {}
        self.memo = RoutingMemo()  # the router's fast path, as the service owns one
        self.changed = False
        self.c = consumers
        self.inv = SimConsumer(w.inv, f"{name}-inventory", lambda s: True, ack_wait=1e9)  # ordered, last per subject

    def fold(self, e: Event, seq: int) -> None:
        self.projection.apply(e, seq)
        self.state.apply(e, seq)
        self.gate.apply(e, seq)

    def gate_round(self, now: float) -> list[Any]:  # the router's own round, not a copy
        r = rcore.gate_round(self.gate, self.policy, self.state, lambda wl, wid: self.decide(wl, wid, 1, now), now, time_scale=1.0)
        self.gate.confirm(r.cancels)  # the stages' cancels go out with the events (the command stream)
        return [*r.cancels, *r.events]

    def start(self) -> Gen:
        yield from self.replay(self.fold)
        self.spawn("submit", self.consume(self.c["submit"], self.on_command))
        self.spawn("events", self.consume(self.c["events"], self.on_event))
        self.spawn("inventory", self.follow_inventory())
        self.spawn("reevaluate", self.reevaluate())

    def decide(self, wl: Any, wid: str, n: int, now: float) -> Any:
        return rcore.decide(self.state, wl, wid, n, self.indexes, now, memo=self.memo)

    def on_command(self, msg: Incoming) -> Gen:
        e = msg.event
        if not isinstance(e, ev.Submit):
            return []
        key = msg.msg_id or e.idempotency_key or f"{msg.stream}-{msg.stream_seq}"
        wid = e.workload_id or workload_id_for(key, e.workload.metadata.name)
        view = self.projection.get(wid)
        if view is not None and view.workload is not None:  # shell logic: a re-send, or another body
            if not same_document(view, e.workload):
                raise Reject(f"submit names workload {wid}, which exists with a different body", claimed_workload_id=wid)
            return []
        now = self.w.now
        submitted = ev.Submitted(event_id=event_id(wid, "submitted"), workload_id=wid, at=now, workload=e.workload, idempotency_key=key, source_sequence=msg.stream_seq)
        accepted = self.gate.accept(self.policy, submitted, None, now)  # the router's own, not a copy
        out = self.gate_round(now)
        yield None
        return [*accepted, *out]

    def on_event(self, msg: Incoming) -> Gen:
        e = msg.event
        self.fold(e, msg.stream_seq)
        released = self.gate_round(self.w.now)
        if not isinstance(e, ev.RouteRequested):
            yield None
            return released
        view = self.projection.get(e.workload_id)
        if view is None or view.workload is None:
            raise Retry(0.5)
        if view.terminal or view.cancel_requested or e.attempt_number in view.routed_attempts:
            return []
        last = self.state.published.get(e.workload_id)
        if last is not None and last.attempt_number == e.attempt_number:
            return []  # shell logic: a redelivery, decided already
        now = self.w.now
        decision = self.decide(view.workload, e.workload_id, e.attempt_number, now)
        out = rcore.decision_events(e.workload_id, decision, e.attempt_number, now)
        self.state.note_published(out)
        yield None
        return [*released, *out]

    def follow_inventory(self) -> Gen:
        while True:
            yield Fetch(self.inv)
            got = self.inv.fetch(self.w.now, self)
            if got is None:
                continue
            self.inv.ack(got[0].seq)
            snap: ClusterSnapshot = got[0].data
            old = self.snapshots.get(snap.cluster)
            self.snapshots[snap.cluster] = snap
            self.indexes[snap.cluster] = build_index(snap)
            if old is None or old.reachable != snap.reachable or old.observed_at != snap.observed_at:
                self.changed = True

    def pending_attempt(self, wid: str) -> int | None:  # the router's own rule, not a copy
        return rcore.pending_attempt(self.projection.get(wid))

    def reevaluate(self) -> Gen:
        while True:
            yield Until(lambda: self.changed, self.w.now + 2.0)
            self.changed = False
            now = self.w.now
            for e in [*self.gate.overdue(now, 10.0), *self.gate_round(now)]:  # as the router's gate_once
                yield None
                self.w.publish(e, self.name)
            for wid, view in list(self.projection.workloads.items()):
                n = self.pending_attempt(wid)
                if n is None or view.workload is None:
                    continue
                now = self.w.now
                decision = self.decide(view.workload, wid, n, now)
                out = rcore.reevaluation(self.state, wid, n, decision, now)
                if not out:
                    continue
                for e in out:
                    yield None
                    self.w.publish(e, self.name)
                self.state.note_published(out)
            # preemption of checkpoint-safe work: the router's own round, not a copy
            for e in rcore.preemptions(self.state, self.projection.workloads.values(), self.snapshots.values(), self.w.now):
                yield None
                self.w.publish(e, self.name)


# =============================================================================== dispatcher


class DispatcherSim(Service):
    kind = "dispatcher"
    interval = 0.5  # GPUORCH_DISPATCH_INTERVAL
    lost_after = 3.0  # GPUORCH_LOST_AFTER
    owner_ttl = 6.0  # GPUORCH_OWNER_TTL
    reconcile_every = 1.0  # GPUORCH_RECONCILE_INTERVAL
    unschedulable_grace = 10.0  # GPUORCH_UNSCHEDULABLE_AFTER (60 s by default)
    # the requeue rule (defaults 4x, 300 s, 1 day): bounds shorter here, as simulated jobs run seconds
    requeue = dcore.Requeue(factor=dcore.REQUEUE_FACTOR, floor=30.0, most=120.0)

    def __init__(self, w: World, name: str, me: str, consumers: dict[str, SimConsumer]) -> None:
        super().__init__(w, name)
        self.me = me
        self.c = consumers
        self.projection = Projection(retire=True, compact=True)  # as the services' (gpuorch.follow.Follower)
        self.contacts: dict[str, liveness.Contact] = {}
        self.lease: InstanceLease | None = None  # ours, as last written
        self.lease_rev = 0
        self._owned: dict[str, int] = {}
        self.records: dict[str, OwnerRecord] = {}  # workload -> its owner record, as last read or written
        self.leases: dict[str, InstanceLease | None] = {}  # other instance -> its lease, as last read
        self.busy: dict[str, int] = {}
        self.created: dict[str, set[str]] = {}
        self.created_rv: dict[str, int] = {}  # attempt -> the cluster's version after our create (the service's resourceVersion)
        self.kv: SimKV = w.owners

    def environment(self, attempts: Sequence[AttemptView] = ()) -> dcore.Environment:
        reg = self.w.registry
        names = {s for e in reg.values() for s in (*e.artifact_stores, *e.checkpoint_stores, *e.data_locations, *e.bandwidth_mbps)}
        return dcore.Environment(
            registry=reg,
            stores={s: StoreConfig(url=sim_store_url(s)) for s in sorted(names)},
            time_scale=1.0,
            checkpoints={a.attempt_id: ck for a in attempts if (ck := self.w.checkpoints.get(a.attempt_id))},
        )

    def start(self) -> Gen:
        yield from self.replay(self.projection.apply)
        yield from self.start_ownership()
        for wid, view in list(self.projection.workloads.items()):
            if dcore.needs_owner(view):
                prev = yield from self._claim(wid)
                if prev is not None:
                    try:
                        yield from self.redrive(view)  # whatever a crash interrupted
                    except (Unreachable, RuntimeError):
                        pass  # as the service: logged, and the reconcile loop retries
        self.spawn("events", self.consume(self.c["events"], self.on_event))
        self.spawn("cancel", self.consume(self.c["cancel"], self.on_command, max_deliver=40))
        self.spawn("renew", self.every(self.owner_ttl / 3, self.renew, "renew"))
        self.spawn("take-over", self.every(self.owner_ttl / 2, self.take_over, "take-over"))
        self.spawn("reconcile", self.every(self.reconcile_every, self.reconcile_owned, "reconcile"))
        self.spawn("watch", self.every(self.interval, self.watch, "watch"))

    # --- actions -------------------------------------------------------------------------
    def execute(self, actions: Sequence[dcore.Action], workload_id: str) -> Gen:
        out: list[ev.Base] = []
        for act in actions:
            if isinstance(act, dcore.Emit):
                out.append(act.event)
            elif isinstance(act, dcore.CreateJob):
                cl = self.w.clusters.get(act.cluster)
                if cl is None:
                    raise RuntimeError(f"routed to unknown cluster {act.cluster!r}")
                yield from self.api(cl)
                seconds, code = self.w.outcome(act.created.attempt_id, act.manifest)
                made = cl.create_job(act.manifest, self.w.now, seconds, code)
                self.created_rv[act.created.attempt_id] = cl.version
                self.w.log(self.name, f"job {'created' if made else 'exists'} {act.cluster}/{act.manifest['metadata']['name']}")
                self.created.setdefault(workload_id, set()).add(act.created.attempt_id)
                out.append(act.created)
            elif isinstance(act, dcore.DeleteJob):
                cl = self.w.clusters.get(act.cluster)
                if cl is None:
                    continue
                try:
                    yield from self.api(cl)
                    cl.delete_job(act.job_name, self.w.now)
                except Unreachable:
                    pass
            elif isinstance(act, dcore.RefuseMessage):
                raise Reject(act.reason, act.claimed_workload_id)
        return out

    def publish(self, events: Sequence[ev.Base]) -> Gen:
        for e in events:
            yield None
            self.w.publish(e, self.name)

    # --- ownership: a record per workload, a lease per instance (as the service) ---------------
    @property
    def generation(self) -> int:
        return self.lease.generation if self.lease is not None else 0

    @property
    def owned(self) -> dict[str, int]:
        return self._owned if dcore.instance_alive(self.lease, self.w.now) else {}

    def _over(self, instance: str, generation: int) -> bool:
        lease = self.lease if instance == self.me else self.leases.get(instance)
        return dcore.generation_over(lease, generation)

    def owns(self, wid: str) -> Gen:
        if not dcore.instance_alive(self.lease, self.w.now):
            return False
        if wid in self._owned:
            return True
        if dcore.claim(self.records.get(wid), self.me, self.generation, self._over) is None:
            return False  # its owner is alive as far as we know: no round trip
        prev = yield from self._claim(wid)
        return prev is not None

    def _claim(self, wid: str) -> Gen:
        if not dcore.instance_alive(self.lease, self.w.now):
            return None
        generation = self.generation
        got = self.kv.get(wid)
        yield None
        current, rev = (got[0], got[1]) if got else (None, 0)
        record = dcore.claim(current, self.me, generation, self._over)
        if record is None:
            if current is not None:
                self.records[wid] = current
            return None
        new_rev = rev
        if record != current:
            yield None
            try:
                if rev == 0:
                    new_rev = self.kv.create(wid, record, self.w.now, self.name)
                else:
                    new_rev = self.kv.update(wid, record, rev, self.w.now, self.name)
            except KVConflict:
                self.records.pop(wid, None)
                return None
        if self.generation != generation:
            return None
        self.records[wid] = record
        self._owned[wid] = new_rev
        self.w.log(self.name, f"owns {wid} (previous {f'{current.owner}/{current.generation}' if current else '-'})")
        return current.owner if current else ""

    def start_ownership(self) -> Gen:
        while True:
            got = self.kv.get(instance_key(self.me))
            yield None
            current, rev = (got[0], got[1]) if got else (None, 0)
            if (yield from self._write_lease(dcore.renewed(current, self.me, self.w.now, self.owner_ttl), rev)):
                return

    def _write_lease(self, lease: InstanceLease, rev: int) -> Gen:
        key = instance_key(self.me)
        yield None
        try:
            new_rev = self.kv.create(key, lease, self.w.now, self.name) if rev == 0 else self.kv.update(key, lease, rev, self.w.now, self.name)
        except KVConflict:
            return False
        if self.lease is not None and lease.generation != self.lease.generation:
            self.w.log(self.name, f"lease ended: generation {lease.generation}, forgets {len(self._owned)} owned")
            self._owned.clear()
            self.records = {w: r for w, r in self.records.items() if r.owner != self.me}
        self.lease, self.lease_rev = lease, new_rev
        return True

    def renew(self) -> Gen:
        for wid in [w for w in self.records if (v := self.projection.get(w)) is not None and v.terminal]:
            self.records.pop(wid, None)
            self._owned.pop(wid, None)
        if self.lease is None:
            yield from self.start_ownership()
            return
        if not (yield from self._write_lease(dcore.renewed(self.lease, self.me, self.w.now, self.owner_ttl), self.lease_rev)):
            yield from self.start_ownership()

    def take_over(self) -> Gen:
        generations: dict[str, int] = {}
        for r in self.records.values():
            if r.owner != self.me:
                generations[r.owner] = max(generations.get(r.owner, 0), r.generation)
        for instance, generation in sorted(generations.items()):
            key = instance_key(instance)
            got = self.kv.get(key)
            yield None
            lease, rev = (got[0], got[1]) if got else (None, 0)
            end = dcore.end_lapsed(lease, instance, generation, self.w.now)
            if end is not None:
                yield None
                try:
                    if rev == 0:
                        self.kv.create(key, end, self.w.now, self.name)
                    else:
                        self.kv.update(key, end, rev, self.w.now, self.name)
                    self.w.log(self.name, f"ended the lease of {instance}/{end.generation}")
                    lease = end
                except KVConflict:
                    pass
            self.leases[instance] = lease
        for wid, view in list(self.projection.workloads.items()):
            if not dcore.needs_owner(view) or wid in self._owned:
                continue
            if dcore.claim(self.records.get(wid), self.me, self.generation, self._over) is None:
                continue
            prev = yield from self._claim(wid)
            if prev is None:
                continue
            try:
                yield from self.redrive(view)
            except (Unreachable, RuntimeError):
                pass  # the reconcile loop retries

    def reconcile_owned(self) -> Gen:
        for wid in list(self.owned):
            view = self.projection.get(wid)
            if view is None or view.terminal or view.workload is None or self.busy.get(wid):
                continue
            try:
                yield from self.redrive(view)
            except (Unreachable, RuntimeError):
                pass  # next round

    def redrive(self, view: WorkloadView) -> Gen:
        now = self.w.now
        actions = dcore.reconcile(view, now, self.environment(list(view.attempts.values())))
        mine = self.created.get(view.workload_id, set())
        actions = [a for a in actions if not (isinstance(a, dcore.CreateJob) and a.created.attempt_id in mine)]
        if actions:
            out = yield from self.execute(actions, view.workload_id)
            yield from self.publish(out)

    # --- handlers -------------------------------------------------------------------------
    def on_event(self, msg: Incoming) -> Gen:
        wid = msg.event.workload_id
        self.busy[wid] = self.busy.get(wid, 0) + 1
        try:
            return (yield from self._on_event(msg))
        finally:
            self.busy[wid] -= 1
            if not self.busy[wid]:
                del self.busy[wid]

    def _on_event(self, msg: Incoming) -> Gen:
        e = msg.event
        view = self.projection.apply(e, msg.stream_seq)
        if view is None:
            return []
        now, routed = self.w.now, isinstance(e, ev.Routed)
        # as the service: the event folded, `reconcile` decides (with the checkpoints the service
        # reads when it needs them)
        actions = dcore.reconcile(view, now, self.environment(list(view.attempts.values())))
        if not routed:
            mine = self.created.get(e.workload_id, set())
            actions = [a for a in actions if not (isinstance(a, dcore.CreateJob) and a.created.attempt_id in mine)]
        if not actions:
            return []
        if not (yield from self.owns(e.workload_id)):
            return []
        try:
            return (yield from self.execute(actions, e.workload_id))
        except Unreachable as exc:
            creates = [a for a in actions if isinstance(a, dcore.CreateJob)]
            if not creates:
                raise
            if not routed:
                return []  # the routed event's redelivery (and the upkeep) try the create again
            out: list[ev.Base] = []
            for c in creates:
                evs = dcore.create_unanswered(c, now, str(exc), unreachable=True, delivered=msg.delivered)
                if evs is None:
                    raise Retry(1.0) from exc
                out.extend(evs)
            return out

    def on_command(self, msg: Incoming) -> Gen:
        e = msg.event
        if not isinstance(e, ev.Cancel):
            return []
        wid = e.workload_id
        view = self.projection.get(wid)
        mine = self.created.get(wid, set())
        unrecorded = mine - set(view.attempts) if view is not None else mine
        creating = bool(self.busy.get(wid) or unrecorded)
        in_log = False
        if not creating and (view is None or view.workload is None):
            yield None
            in_log = wid in self.w.submitted  # the stream has its `submitted`
        wait = dcore.cancel_wait(view, creating=creating, in_log=in_log, delivered=msg.delivered)
        if wait is not None:
            raise Retry(wait.delay, wait.reason)
        actions = dcore.on_cancel(view, wid, e.reason, self.w.now)
        return (yield from self.execute(actions, wid))

    # --- watching the clusters ----------------------------------------------------------------
    def watch(self) -> Gen:
        """`Dispatcher.watch` with a list per tick for the informers' caches (`cached_jobs`: a
        create reaches the cache `World.cache_lag` seconds late; its resourceVersion and
        completeness time say so); the same rules judge the answers (`answering`, `silent_for`,
        `absent_for_sure`). A Job the rule calls missing that the cluster has is a violation
        (`absent-means-gone`): the attempt would be failed as disappeared while its pods run."""
        for cluster, items in dcore.watched(self.projection.workloads.values(), self.owned).items():
            cl = self.w.clusters.get(cluster)
            if cl is None:
                continue
            failed: Unreachable | None = None
            try:
                yield from self.api(cl)
                jobs, listed_rv, complete_at = cl.cached_jobs(self.w.now, self.w.cache_lag)
            except Unreachable as exc:
                failed = exc
            now = self.w.now
            c = self.contacts[cluster] = liveness.contact(self.contacts.get(cluster), failed is None, now)
            if not liveness.answering(failing=failed is not None, synced=True):
                why = liveness.silent_for(c, now, self.lost_after)
                if why is not None:
                    for view, a in items:
                        acts = dcore.lost(view, a, now, f"{cluster} {why} ({type(failed).__name__})")
                        out = yield from self.execute(acts, view.workload_id)
                        yield from self.publish(out)
                continue
            for view, a in items:
                job = jobs.get(a.job_name)
                if job is None:
                    if not dcore.absent_for_sure(
                        a, created_rv=self.created_rv.get(a.attempt_id), cache_rv=listed_rv, complete_at=complete_at
                    ):
                        continue  # created a moment ago (by us, or a dispatcher we took over from): next tick
                    there = cl.jobs.get(a.job_name)
                    if there is not None and not there.deleting:
                        self.w.violations.append(Violation(
                            "absent-means-gone", view.workload_id,
                            f"{self.name} took {cluster}/{a.job_name} (created {there.created - EPOCH0:.3f}s, version {there.version}) "
                            f"for gone from a cache at version {listed_rv}, complete up to {complete_at - EPOCH0:.3f}s",
                        ))  # fmt: skip
                        self.w.log(self.name, f"VIOLATION absent-means-gone {a.job_name}")
                obs = cl.observe(job) if job else dcore.JobObservation(exists=False)
                acts = dcore.on_observation(
                    view, a, obs, now, unschedulable_grace=self.unschedulable_grace, requeue=self.requeue, time_scale=1.0
                )
                if acts:
                    out = yield from self.execute(acts, view.workload_id)
                    yield from self.publish(out)
                if a.status in ("succeeded", "failed") or a.gone:
                    self.created_rv.pop(a.attempt_id, None)


# =============================================================================== fencer


Pursuit = fcore.Pursuit


def sim_store_url(store: str) -> str:
    """An artifact store's URL in the simulation (the dispatcher's `store_roots`, the fencer's
    `stores.url`)."""
    return f"file:///sim/stores/{store}"


def sim_outputs(e: ev.PromoteRequested, store: str, now: float) -> Manifest:
    """What the simulated store holds of a succeeded attempt: its upload is always complete."""
    return Manifest(workload_id=e.workload_id, attempt_id=e.attempt_id, epoch=e.epoch, store=store,
                    prefix=attempt_prefix(e.workload_id, e.attempt_id), objects=[], total_bytes=0, created_at=now)


class FencerSim(Service):
    kind = "fencer"
    interval = 0.5  # GPUORCH_FENCE_INTERVAL
    orphan_grace = fcore.ORPHAN_GRACE
    orphan_grace_unknown = fcore.ORPHAN_GRACE_UNKNOWN

    def __init__(self, w: World, name: str, consumers: dict[str, SimConsumer]) -> None:
        super().__init__(w, name)
        self.c = consumers
        self.projection = Projection(retire=True, compact=True)  # as the services' (gpuorch.follow.Follower)
        self.pursuits: dict[str, Pursuit] = {}
        self.kv = w.fence

    def start(self) -> Gen:
        yield from self.replay(self.projection.apply)
        self.resume_pursuits()
        self.spawn("events", self.consume(self.c["events"], self.on_event))
        self.spawn("pursue", self.every(self.interval, self.pursue_loop, "pursue"))
        self.spawn("orphans", self.every(max(2.0, self.interval * 4), self.collect_orphans, "orphans"))

    def cas(self, wid: str, decide: Callable[[FenceRecord | None], fcore.Decision]) -> Gen:
        while True:
            got = self.kv.get(wid)
            yield None
            rec, rev = (got[0], got[1]) if got else (None, 0)
            d = decide(rec)
            if d.record is None:
                return d
            try:
                if rev == 0:
                    self.kv.create(wid, d.record, self.w.now, self.name)
                else:
                    self.kv.update(wid, d.record, rev, self.w.now, self.name)
                return d
            except KVConflict:
                continue

    def pursue(self, p: Pursuit | None) -> None:
        """`Fencer.pursue`: what `fcore.pursuit_after` / `pursuit_of` give, once per attempt."""
        if p is not None:
            self.pursuits.setdefault(p.attempt_id, p)

    def on_event(self, msg: Incoming) -> Gen:
        e = msg.event
        self.projection.apply(e, msg.stream_seq)
        now = self.w.now
        if isinstance(e, ev.AttemptCreated):
            d = yield from self.cas(e.workload_id, lambda r: fcore.on_attempt_created(r, e, now))
            self.pursue(fcore.pursuit_after(self.projection.get(e.workload_id), e, d, now))
            waiting = self.deferred_promotion(e)
            later = (yield from self.promote(waiting, now)) if waiting is not None else []
            return [*d.events, *later]
        if isinstance(e, ev.FenceRequested):
            d = yield from self.cas(e.workload_id, lambda r: fcore.on_fence_requested(r, e, now))
            self.pursue(fcore.pursuit_after(self.projection.get(e.workload_id), e, d, now))
            return d.events
        if isinstance(e, ev.PromoteRequested):
            return (yield from self.promote(e, now))
        return []

    def promote(self, e: ev.PromoteRequested, now: float) -> Gen:
        """Fencer.promote: from the fencer's own records (the attempt as its projection has it,
        the store's URL from its settings); refused as a message when they contradict the
        request, deferred while its `attempt-created` is not on record yet; after the
        compare-and-set, the manifest written create-only (the world's `manifests`)."""
        view = self.projection.get(e.workload_id)
        store, problem = fcore.promotion_source(view, e, sim_store_url, None)  # (no registry to check stores against)
        gate = fcore.promotion_gate(view, e, store, problem)
        if gate == "defer":
            return []  # promoted once its attempt-created is folded (`deferred_promotion`)
        if gate == "refuse" or store is None:
            raise Reject(f"promotion refused: {problem}", claimed_workload_id=e.workload_id)
        created_epoch = fcore.attempt_facts(view, e.attempt_id).created_epoch
        result = fcore.result_url(sim_store_url(store), e.workload_id) or ""
        outputs = sim_outputs(e, store, now)
        yield None  # the listing and the upload record
        d = yield from self.cas(e.workload_id, lambda r: fcore.decide_promotion(r, e, now, result, outputs, created_epoch=created_epoch))
        events = list(d.events)
        if d.promote is not None:
            yield None  # the create-only write
            mine = (e.attempt_id, e.epoch)
            there = self.w.manifests.setdefault(d.promote.result_path, mine)
            if there != mine:
                rec = self.kv.get(e.workload_id)
                epoch = rec[0].epoch if rec else e.epoch
                events = [fcore.manifest_conflict(e, epoch, f"{d.promote.result_path} holds {there[0]} at epoch {there[1]}", now)]
                self.pursue(fcore.pursuit_of(view, e, now, fcore.REJECTED_ORPHAN + "result manifest conflict"))
        self.pursue(fcore.pursuit_after(self.projection.get(e.workload_id), e, d, now))
        return events

    def deferred_promotion(self, e: ev.AttemptCreated) -> ev.PromoteRequested | None:
        return fcore.deferred_promotion(self.projection.get(e.workload_id), e)

    def pursue_loop(self) -> Gen:
        for key, p in list(self.pursuits.items()):
            try:
                yield from self.pursue_one(key, p)
            except Exception as exc:  # never let one pursuit stop the others
                self.w.loop_errors.append(f"{self.name}.pursue {type(exc).__name__}: {exc}")

    def _delete_and_check(self, cl: SimCluster, p: Pursuit) -> Gen:
        """`Fencer._delete_and_check`: the calls here, their meaning `fcore.confirm_how`."""
        yield from self.api(cl)
        if cl.delete_job(p.job_name, self.w.now):
            p.deleted = True
        yield from self.api(cl)
        left = [x for x in cl.pods_of(p.job_name) if x.deleting_at is None or x.deleting_at > self.w.now]
        exists: bool | None = None
        if not left:
            yield from self.api(cl)
            exists = cl.read_job(p.job_name) is not None
        return fcore.confirm_how(deleted=p.deleted, pods_left=len(left), job_exists=exists)

    def pursue_one(self, key: str, p: Pursuit) -> Gen:
        cl = self.w.clusters.get(p.cluster)
        how: Any = None
        try:
            if cl is None:
                how = fcore.confirm_how(deleted=False, pods_left=0, job_exists=None, cluster_known=False)
            else:
                how = yield from self._delete_and_check(cl, p)
        except Unreachable:
            now = self.w.now
            view = self.projection.get(p.workload_id)
            a = view.attempts.get(p.attempt_id) if view else None
            expired, after = fcore.pursuit_unreachable(p, None if a is None else a.cancel_confirmed is not None, now)
            for x in expired:
                yield None
                self.w.publish(x, self.name)
            if expired:
                self.pursuits[key] = after
            return
        if how is None:
            return
        now = self.w.now
        for x in fcore.pursuit_confirmed(p, how, now):
            yield None
            self.w.publish(x, self.name)
        self.pursuits.pop(key, None)

    def collect_orphans(self) -> Gen:
        for name in sorted(self.w.clusters):
            cl = self.w.clusters[name]
            try:
                yield from self.api(cl)
                jobs = cl.list_jobs()
            except Unreachable:
                continue
            for j in jobs.values():
                yield from self.judge(name, j.name, j.labels, j.created, j.deleting)

    def judge(self, cluster: str, name: str, labels: dict[str, str], created: float, deleting: bool) -> Gen:
        if deleting:
            return
        found = fcore.found_job(labels, cluster, NAMESPACE, name)
        wid, aid, epoch = found.workload_id, found.attempt_id, found.epoch
        if aid in self.pursuits:
            return
        now = self.w.now
        view = self.projection.get(wid)
        known_attempt = view is not None and aid in view.attempts
        known_workload = known_attempt or (view is not None and view.workload is not None) or (valid_token(wid) and wid in self.w.submitted)
        rec = None
        if known_workload:
            got = self.kv.get(wid)
            yield None
            rec = got[0] if got else None
        reason = fcore.orphan_reason(
            rec, aid, epoch, known_attempt=known_attempt, known_workload=known_workload, age=now - created,
            workload_status=view.status if view is not None else None, grace=self.orphan_grace, grace_unknown=self.orphan_grace_unknown,
        )
        if reason is None:
            return
        self.w.log(self.name, f"orphan {cluster}/{name}: {reason}")
        self.pursuits[aid] = Pursuit(wid, aid, epoch, cluster, NAMESPACE, name, now, reason)

    def resume_pursuits(self) -> None:  # the fencer core's rule, as the shell calls it
        for p in fcore.pursuits_to_resume(self.projection.workloads.values(), 1.0):
            self.pursuits.setdefault(p.attempt_id, p)


# =============================================================================== inventory


@dataclass
class ClusterState:
    name: str
    last_ok: ClusterSnapshot | None = None
    last_published: ClusterSnapshot | None = None
    last_published_at: float = float("-inf")
    seen_started: frozenset[str] = frozenset()
    version: int = -1  # the cluster version last observed (skip rebuilding an unchanged cluster)


class InventorySim(Service):
    kind = "inventory"
    interval = 1.0  # GPUORCH_INVENTORY_INTERVAL
    heartbeat = 5.0  # GPUORCH_INVENTORY_HEARTBEAT

    def __init__(self, w: World, name: str) -> None:
        super().__init__(w, name)
        self.history = icore.QueueHistory()
        self.states = {c: ClusterState(c) for c in sorted(w.clusters)}

    def start(self) -> Gen:
        yield None
        for c in sorted(self.w.clusters):
            self.spawn(f"poll-{c}", self.every(self.interval, partial(self.poll, c), f"poll-{c}"))

    def poll(self, name: str) -> Gen:
        state, cl = self.states[name], self.w.clusters[name]
        entry = self.w.registry[name]
        snap: ClusterSnapshot | None = None
        due = self.w.now - state.last_published_at >= self.heartbeat
        quiet = not cl.partitioned and cl.latency == 0 and state.last_published is not None and state.last_published.reachable
        if quiet and cl.version == state.version and state.last_ok is not None and not due:
            return  # nothing changed since the last observation: the same snapshot, not due (a sim shortcut)
        try:
            yield from self.api(cl)
            nodes, pods = cl.list_nodes_pods()
            state.version = cl.version
            now = self.w.now
            starts, state.seen_started = icore.observe_pod_starts(pods, entry, time_scale=1.0, seen=state.seen_started)
            for s in starts:
                if s.gpus > 0:
                    self.history = icore.observe(self.history, name, s.queue, s.delay_s)
            snap = icore.build_snapshot(name, nodes, pods, entry, now=now, observed_at=now, time_scale=1.0, history=self.history)
            state.last_ok = snap
        except Unreachable as exc:
            snap = icore.unreachable_snapshot(state.last_ok, name, entry, self.w.now, f"unreachable: {exc}", time_scale=1.0)
            state.version = -1
        yield None
        due = self.w.now - state.last_published_at >= self.heartbeat
        if snap is None:
            if not due or state.last_published is None:
                return
            snap = state.last_published
        elif not (due or icore.snapshot_changed(state.last_published, snap)):
            return
        snap = msgspec.structs.replace(snap, published_at=self.w.now)
        self.w.publish_snapshot(snap, self.name)
        state.last_published, state.last_published_at = snap, self.w.now


def consumers_for(w: World) -> dict[str, dict[str, SimConsumer]]:
    """The durable consumers of every service (they live on the server, across restarts)."""
    def is_submit(e: Any) -> bool:
        return isinstance(e, ev.Submit)

    def is_cancel(e: Any) -> bool:
        return isinstance(e, ev.Cancel)

    def every(e: Any) -> bool:
        return True

    def fencer_reads(e: Any) -> bool:  # its durable's filter (gpuorch_fencer.core.READS)
        return ev.type_tag(e) in fcore.READS

    def dispatcher_reads(e: Any) -> bool:  # (gpuorch_dispatcher.core.READS)
        return ev.type_tag(e) in dcore.READS

    assert w.cmd.name == STREAM_CMD and w.evt.name == STREAM_EVT
    return {
        "router": {"submit": SimConsumer(w.cmd, "router_submit", is_submit), "events": SimConsumer(w.evt, "router_events", every)},
        "dispatcher": {"cancel": SimConsumer(w.cmd, "dispatcher_cancel", is_cancel, max_deliver=40)},
        "dispatcher-0": {"events": SimConsumer(w.evt, "dispatcher_events_0", dispatcher_reads)},
        "dispatcher-1": {"events": SimConsumer(w.evt, "dispatcher_events_1", dispatcher_reads)},
        "fencer": {"events": SimConsumer(w.evt, "fencer_events", fencer_reads)},
    }
