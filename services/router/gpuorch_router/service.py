"""The router's shell: submits and route requests in, decisions out (DESIGN §5).

It validates the workload contract (decoding does that), derives the workload id
from the idempotency key, asks the pure policy for a decision and publishes it.
Waiting work is re-evaluated whenever inventory changes, and a waiting decision is
re-published when its reasons change (`core.reevaluation`). Exclusions of clusters where an
attempt was lost come from the log and end (`core.exclusions`). It never talks to a cluster.
Admission (the gate's rounds) is decided by one router at a time, the holder of the admission
lease (`lease`; docs/operations.md *Admission leadership*).
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import msgspec
import structlog
import yaml
from nats.js.api import DeliverPolicy
from nats.js.errors import KeyWrongLastSequenceError

from gpuorch.config import Settings, load_registry
from gpuorch.follow import Follower, every, run_until_stopped
from gpuorch.projection import WorkloadView, same_document
from gpuorch.runtime import bus, kv
from gpuorch.runtime.shell import (
    Fenced,
    Incoming,
    Publisher,
    Reject,
    Retry,
    consume,
    replay,
    run_service,
    submit_key,
    workload_key,
)
from gpuorch.runtime.snapshot import Snapshots, ack_floor, follower_body, no_gc, restore_follower, settle_heap
from gpuorch.security.bundle import load_identities
from gpuorch.security.identity import Unauthenticated, Verifier, sign_headers
from gpuorch.security.model import events_durable, snapshot_owner
from gpuorch.security.receive import trusted_snapshot
from gpuorch_proto import (
    ADMISSION_LEADER_KEY,
    ClusterSnapshot,
    Event,
    RoutingDecision,
    Workload,
    decode_admission_lease,
    decode_snapshot,
    encode,
    event_id,
    idempotency_key,
    key_conflict,
    workload_id_for,
)
from gpuorch_proto import events as ev
from gpuorch_proto.codec import load_policy_yaml
from gpuorch_proto.policy import AdmissionPolicy, PolicyError, node_constraint_errors
from gpuorch_proto.validate import body_size_error

from . import core, fairshare, lease
from . import pipeline as pl
from .core import decision_events
from .history import RoutingHistory
from .policy import RoutingMemo, SnapshotIndex, build_index

log = structlog.get_logger("gpuorch.router")

GATE_RESEND_AFTER = 10.0  # seconds: a gate decision not seen in the log by then is published again
CATCH_UP_POLL = 0.05  # seconds between reads of the events durable's ack floor while a new term catches up


def pipeline_key(msg: Any) -> str:
    """The events consumer's order: one pipeline's events (its stages', `<pipeline>--<stage>`,
    with its own) one after the other, other workloads' at once. So the gate folds a stage's
    events after its pipeline's expansion also in a router that did not accept the submit (and
    so did not note the expansion): a stage is never taken for a plain workload, whose release
    no pipeline limit counts."""
    return workload_key(msg).partition(ev.STAGE_SEP)[0]


@dataclasses.dataclass(frozen=True)
class Fence:
    """What a gate round's events are published with: the term that decided them and its
    headers (`lease.fence_headers`; empty outside `Router.run`, where no other router decides)."""

    term: int
    headers: Mapping[str, str]


def admission_policy_path(registry: Path) -> Path | None:
    """The admission policy file the clusters file names (`admission_policy: <file>`, relative to
    it); None: it names none. `gpuorch queues` reads the same file."""
    doc = yaml.safe_load(registry.read_text()) or {}
    name = doc.get("admission_policy") if isinstance(doc, dict) else None
    return (registry.parent / str(name)).resolve() if name else None


def load_admission_policy(registry: Path) -> AdmissionPolicy:
    """The admission policy (docs/pipelines.md) named next to the cluster registry
    (`admission_policy_path`). None named: one `default` queue open to everyone, no limits. A bad
    policy stops the router with what is wrong and where."""
    path = admission_policy_path(registry)
    if path is None:
        return AdmissionPolicy()
    try:
        return load_policy_yaml(path.read_text())
    except (OSError, PolicyError, yaml.YAMLError) as exc:
        raise SystemExit(f"router: admission policy {path}: {exc}") from None


class Router:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.names = settings.names
        self.follower = Follower.of(settings.tuning)  # finished workloads retired (gpuorch.projection)
        self.snapshots: dict[str, ClusterSnapshot] = {}
        self.indexes: dict[str, SnapshotIndex] = {}  # built once per snapshot, not per decision
        self.memo = RoutingMemo()  # the policy's fast path: its caches are this router's
        self.state = core.RouterState()  # route requests and published decisions, folded from the log
        self.history: RoutingHistory | None = None  # learnt from measured attempt timelines
        registry = load_registry(settings.registry) if settings.registry else None
        self.time_scale = registry.time_scale if registry else 1.0
        self.registry = registry.clusters if registry else None  # the router's own registry (None: tests)
        self.inventory_changed = asyncio.Event()
        self.republish_min_interval = core.REPUBLISH_MIN_INTERVAL  # per workload, between re-published waits
        # submits (by idempotency key) and events (by workload) handled this many at a time, one
        # workload's in order: decisions are per workload (the policy reserves nothing across them)
        self.concurrency = settings.tuning.router_concurrency
        self.publisher: Publisher | None = None
        self.verifier = Verifier(load_identities(settings.identities)) if settings.identities else None
        # pipelines and admission (docs/pipelines.md): the policy next to the cluster registry
        self.policy = load_admission_policy(settings.registry) if settings.registry else AdmissionPolicy()
        self.gate = pl.Gate()  # what may be routed yet: pipelines, held and released work, folded from the log
        # admission leadership (`lease`): one router decides admission at a time. None outside
        # `run` (tests, benches: no other router, it decides alone)
        self.me = settings.tuning.instance
        self.leadership: lease.Leadership | None = None
        self.admission_ttl = settings.tuning.admission_ttl
        self.margin = lease.margin(self.admission_ttl)
        self.kv_admission: Any = None
        self.js: Any = None
        # re-evaluation's work list (`awaiting_decision`): workloads changed since its last round,
        # and those awaiting a decision (None: not built yet, every workload is looked at)
        self.touched: set[str] = set()
        self.awaiting: dict[str, None] | None = None
        # workloads with a priority above 0 not finished: the only ones preemption plans for
        self.prioritized: dict[str, None] = {}  # (a dict: in the order they came, as the projection's)
        self.seed = settings.nats_creds.read_text() if settings.nats_creds and settings.nats_creds.suffix != ".creds" else None

    # --- pure-ish helpers -------------------------------------------------------------
    def decide(self, wl: Workload, wid: str, attempt_number: int, now: float) -> RoutingDecision:
        return core.decide(self.state, wl, wid, attempt_number, self.indexes, now, history=self.history, memo=self.memo)

    def own_id(self, e: Event) -> None:
        """The event's workload id as the string the gate already holds (the id this router made
        when it accepted the submit, which its own events carry), until the workload has a view:
        the projection's view, then every table keyed by the event's id, share that one string
        (after it, the projection sets its own into each event: `gpuorch.projection`)."""
        wid = e.workload_id
        if wid and wid not in self.follower.projection.workloads:
            held = self.gate.waiting.get(wid) or self.gate.running.get(wid)
            if held is not None and held.workload_id is not wid:
                msgspec.structs.force_setattr(e, "workload_id", held.workload_id)

    def fold(self, e: Event, seq: int) -> None:
        """One event of the replay at start-up: as `on_event` folds it (and learns from it), by
        `core.fold` (which `gpuorch submit --dry-run` replays with too: `core.replay`)."""
        if isinstance(e, ev.AdmissionTerm):  # about no workload (`lead_once`)
            return
        self.own_id(e)
        view, self.history = core.fold(self.follower.projection, self.state, self.history, e, seq, self.time_scale)
        self.touched.add(e.workload_id)
        self.note_priority(e.workload_id, view)
        self.gate.apply(e, seq)

    def note_priority(self, workload_id: str, view: WorkloadView | None) -> None:
        """Keep `prioritized` (what preemption looks at) as the workload's view now stands."""
        if view is None:
            return
        if view.terminal or view.workload is None or view.workload.spec.priority <= 0:
            self.prioritized.pop(workload_id, None)
        else:
            self.prioritized.setdefault(workload_id)

    def fence(self, now: float) -> Fence | None:
        """What this router's gate decisions are published with now; None: it decides no
        admission now (another router leads, or its term has not folded the log up to its marker).
        Two routers each releasing into the same free slot from a different view of the log would
        pass a limit: only the lease's holder decides, and the stream refuses its releases once
        a later term began (`lease`)."""
        if self.leadership is None:
            return Fence(0, {})
        if not self.leadership.admits(now, self.margin):
            return None
        return Fence(self.leadership.term, lease.fence_headers(self.leadership.marker, self.marker_subject))

    @property
    def marker_subject(self) -> str:
        return self.names.evt(ev.ADMISSION_REF, ev.type_tag(ev.AdmissionTerm))

    def gate_round(self, now: float, *, force: bool = False) -> pl.GateRound:
        """The gate's round (`core.gate_round`), released work routed at once, when this router
        decides admission (`fence`). The others fold the same events, so a router that takes the
        lease over starts from what the log holds."""
        if self.fence(now) is None:
            return pl.GateRound()
        usage = None  # fair share's: computed only when the round may admit (it reads every workload)
        if self.gate.may_admit(force):
            p = self.follower.projection
            usage = fairshare.usage_of(p.workloads, self.policy, self.snapshots.values(), p.retired.values(), self.time_scale)  # None: no fair share
        r = core.gate_round(
            self.gate, self.policy, self.state, lambda wl, wid: self.decide(wl, wid, 1, now), now,
            force=force, usage=usage, time_scale=self.time_scale,
        )  # fmt: skip
        for e in r.events:
            if isinstance(e, ev.Released | ev.Held | ev.StageBlocked | ev.PipelineFinished | ev.Rejected):
                log.info("workload.gate", workload=e.workload_id, type=ev.type_tag(e), reason=getattr(e, "reason", ""))
        return r

    async def publish_round(
        self, r: pl.GateRound, fence: Fence | None, context: Any, before: Sequence[ev.Base] = ()
    ) -> list[ev.Base]:
        """Publish what a handler's gate round decided (`fence`: what `fence` said for that round,
        taken with no await in between): `before` (the submit's own events) first, then the
        round's events (`publish_decided`), then its cancels; nothing is left to return. With no
        publisher (tests, benches) the events are returned for the caller to publish."""
        if not r.events and not r.cancels:
            return list(before)
        assert fence is not None, "a round decided without a fence"
        if self.publisher is None:
            return [*before, *r.events]
        if before:
            await self.publisher.publish(list(before), context=context)
        if await self.publish_decided(r.events, fence, context):  # the reasons (stage-blocked, ...) before the cancels
            await self.send_cancels(r.cancels)
        return []

    async def publish_decided(self, events: Sequence[ev.Base], fence: Fence, context: Any) -> bool:
        """Publish gate decisions in order, with their term's fence (`lease`); False, and that
        term ends here, when the stream refused one (a later `admission-term` is in the log)."""
        assert self.publisher is not None
        if not fence.headers:  # outside `run`: no other router decides
            await self.publisher.publish(list(events), context=context)
            return True
        try:
            await self.publisher.publish_fenced(events, fence.headers, context=context)
        except Fenced as exc:
            self.step_down(f"the stream refused a decision of term {fence.term}: {exc}", fence.term)
            return False
        return True

    def step_down(self, why: str, term: int) -> None:
        """Term `term` of this router ends (if it is the one it leads): it releases nothing until
        it takes the lease again, and its releases the log does not have are forgotten
        (`Gate.retract`): decided again by whoever leads, from the log."""
        if self.leadership is None or term == 0 or self.leadership.term != term:
            return
        retracted = self.gate.retract()
        self.leadership = lease.Leadership()
        log.warning("admission.term_ended", instance=self.me, term=term, why=why, retracted=len(retracted))

    async def lead(self, stop: asyncio.Event) -> None:
        await every(stop, self.admission_ttl / 3, self.lead_once, name="admission")

    async def lead_once(self) -> None:
        """One pass of admission leadership (`lease`): renew or take the lease by compare-and-set;
        a new term publishes its `admission-term` marker first, then releases nothing before the
        events durable's ack floor has reached the marker (every release the stream stored before
        it is folded into the gate's counts). That wait is polled within the pass, up to the next
        renewal."""
        assert self.leadership is not None
        now = time.time()
        await self.claim_lease(now)
        if self.leadership.lease is not None and self.leadership.marker == 0:
            await self.begin_term()
        due = now + self.admission_ttl / 3
        durable = events_durable(self.names, "router", self.me)
        while (held := self.leadership).lease is not None and held.marker and not held.caught_up:
            folded = await ack_floor(self.js, self.names.stream_evt, durable)
            if self.leadership is not held:  # the term ended meanwhile
                return
            self.leadership = dataclasses.replace(held, folded=folded)
            if self.leadership.caught_up:
                log.info("admission.leading", instance=self.me, term=held.term, marker=held.marker, folded=folded)
                self.gate.dirty = True  # the first round looks at everything waiting
                self.inventory_changed.set()  # and runs now (`reevaluate`)
                return
            if time.time() >= due:
                return
            await asyncio.sleep(CATCH_UP_POLL)

    async def claim_lease(self, now: float) -> None:
        """Read the `leader` record and write what `lease.claim` says (compare-and-set); a term
        this router held ends when another router holds the lease or wrote it first."""
        assert self.leadership is not None
        value, rev = await kv.read(self.kv_admission, ADMISSION_LEADER_KEY)
        current = decode_admission_lease(value) if value is not None else None
        term = self.leadership.term
        want = lease.claim(current, self.me, term, now, self.admission_ttl, self.margin)
        if want is None:
            if current is not None:
                self.step_down(f"router {current.instance} holds term {current.term}", term)
            return
        try:
            await (
                self.kv_admission.create(ADMISSION_LEADER_KEY, encode(want))
                if rev == 0
                else self.kv_admission.update(ADMISSION_LEADER_KEY, encode(want), last=rev)
            )
        except KeyWrongLastSequenceError:
            self.step_down("another router wrote the lease first", term)
            return
        if want.term != term:
            self.step_down(f"term {want.term} begins", term)
        self.leadership = self.leadership.written(want)

    async def begin_term(self) -> None:
        """Publish the term's `admission-term` marker (its id the term's: a retry is the same
        message) and note its stream sequence; first forget this router's releases of an earlier
        term that the log does not have (those the stream stored before the marker are folded
        from the log; after it, the stream refuses them)."""
        assert self.leadership is not None and self.publisher is not None
        held = self.leadership
        assert held.lease is not None
        retracted = self.gate.retract()
        marker = ev.AdmissionTerm(
            event_id=event_id(ev.ADMISSION_REF, ev.type_tag(ev.AdmissionTerm), held.term),
            workload_id=ev.ADMISSION_REF, at=time.time(), term=held.term, instance=self.me,
        )  # fmt: skip
        ack = (await self.publisher.publish([marker]))[0]
        if self.leadership is held:
            self.leadership = dataclasses.replace(held, marker=int(ack.seq))
            log.info("admission.term", instance=self.me, term=held.term, marker=ack.seq, retracted=len(retracted))

    async def resign(self) -> None:
        """At a clean stop: the lease ends now (compare-and-set), so another router need not wait
        for it to run out."""
        held = self.leadership.lease if self.leadership is not None else None
        if held is None or self.kv_admission is None:
            return
        try:
            value, rev = await kv.read(self.kv_admission, ADMISSION_LEADER_KEY)
            if value is not None and decode_admission_lease(value) == held:
                await self.kv_admission.update(ADMISSION_LEADER_KEY, encode(lease.resigned(held)), last=rev)
                log.info("admission.resigned", instance=self.me, term=held.term)
        except Exception as exc:  # it runs out by itself
            log.warning("admission.resign_failed", error=type(exc).__name__)

    async def send_cancels(self, cancels: Sequence[ev.Cancel]) -> None:
        """The cancels of a pipeline's stages, signed as the router (the dispatcher checks who
        may cancel: docs/security.md); the dispatcher then cancels each like any workload."""
        if not cancels:
            return
        assert self.publisher is not None
        for c in cancels:
            body, msg_id = encode(c), c.event_id
            headers = sign_headers(self.seed, self.names.cmd_cancel, msg_id, body) if self.seed else {}
            await self.publisher.publish_raw(self.names.cmd_cancel, body, msg_id, headers, context=self.follower.context(c.workload_id))
            self.gate.confirm([c])
            log.info("workload.cancel_sent", workload=c.workload_id, reason=c.reason)

    def learn(self, view: WorkloadView) -> None:
        """Fold a completed workload's promoted attempt into the routing history (`core.learnt`)."""
        self.history = core.learnt(self.history, view, self.time_scale)

    def awaiting_decision(self) -> list[str]:
        """The workloads waiting for a routing decision (`pending_attempt` not None), kept as a
        set: only those whose events were folded since the last round are looked at again
        (`touched`), not every workload ever seen; all of them in the first round."""
        views = self.follower.projection.workloads
        if self.awaiting is None:
            self.awaiting, self.touched = dict.fromkeys(views), set()
        for wid in self.touched:
            self.awaiting.setdefault(wid)  # (a dict: the order they came in, as the projection's)
        self.touched = set()
        for wid in [w for w in self.awaiting if core.pending_attempt(views.get(w)) is None]:
            del self.awaiting[wid]
        return list(self.awaiting)

    def pending_attempt(self, wid: str) -> int | None:
        """The attempt number this workload waits a decision for (None = none): `core.pending_attempt`."""
        return core.pending_attempt(self.follower.projection.get(wid))

    def authorize_submit(self, msg: Incoming, e: ev.Submit) -> str | None:
        """Who signed this submit decides which owners it may submit as (docs/security.md);
        a submit nobody known signed is refused. Without an identities file (unit tests) every
        submit is taken as it is. Returns the identity that signed it (None: no identities)."""
        if self.verifier is None:
            return None
        try:
            caller = self.verifier.caller(msg.subject, msg.msg_id, msg.headers, msg.data)
        except Unauthenticated as exc:
            raise Reject(str(exc)) from None
        owner = e.workload.metadata.owner
        if not caller.may_submit_as(owner):
            raise Reject(
                f"identity {caller.identity!r} may not submit as owner {owner[:80]!r}",
                [ev.FieldError(path="workload.metadata.owner", message=f"{caller.identity!r} may submit as {', '.join(caller.owners) or 'no owner'}")],
            )
        return caller.identity

    # --- handlers -----------------------------------------------------------------------
    async def on_command(self, msg: Incoming) -> Sequence[ev.Base]:
        e = msg.event
        if not isinstance(e, ev.Submit):
            return []
        if (big := body_size_error(len(msg.data))) is not None:  # its `submitted` must fit in one message
            raise Reject(f"submit refused: {big.message}", [big])
        identity = self.authorize_submit(msg, e)  # the signature covers both places a key may be
        if (conflict := key_conflict(msg.msg_id, e.idempotency_key)) is not None:
            raise Reject(f"submit refused: {conflict.message}", [conflict])
        key = idempotency_key(msg.msg_id, e.idempotency_key)
        if not key:  # a retried submit without one would be a second workload
            raise Reject("a submit needs an idempotency key: a Nats-Msg-Id header or idempotency_key in the body",
                         [ev.FieldError(path="idempotency_key", message="missing (and no Nats-Msg-Id header)")])  # fmt: skip
        # the id is the router's, from the key and the name: a client-chosen workload_id is ignored
        wid = workload_id_for(key, e.workload.metadata.name)
        if ev.is_stage_id(wid):  # `<pipeline>--<stage>` names a pipeline's child: never a submit's (docs/security.md)
            raise Reject(f"workload id {wid} contains {pl.SEP!r}, which marks a pipeline's stage",
                         [ev.FieldError(path="workload.metadata.name", message=f"must not contain {pl.SEP!r} (reserved for a pipeline's stages)")])  # fmt: skip
        if bad := node_constraint_errors(self.policy, e.workload):  # tolerations/selectors its queue does not allow
            raise Reject(f"workload {wid}: node constraints its queue does not allow", bad, claimed_workload_id=wid)
        view = self.follower.projection.get(wid)
        if view is not None and view.workload is not None:
            if not same_document(view, e.workload):  # not a re-send: a message never changes an existing workload
                raise Reject(f"submit names workload {wid}, which exists with a different body", [ev.FieldError(path="workload", message=f"differs from the accepted submit of {wid}; that workload is not changed")], claimed_workload_id=wid)
            log.info("submit.duplicate", workload=wid, idempotency_key=key)
            return []
        now = time.time()
        self.follower.remember(wid, msg.headers)
        submitted = ev.Submitted(event_id=event_id(wid, "submitted"), workload_id=wid, at=now, workload=e.workload, idempotency_key=key, source_sequence=msg.stream_seq)
        accepted = self.gate.accept(self.policy, submitted, identity, now)  # refused, expanded, or as it is
        if isinstance(accepted[-1], ev.Rejected):
            log.info("workload.refused", workload=wid, reason=accepted[-1].reason)
            return accepted
        if len(accepted) > 1:
            log.info("pipeline.expanded", workload=wid, children=len(accepted) - 2)
        fence = self.fence(now)  # (the round's, taken with it: no await in between)
        r = self.gate_round(now)
        return await self.publish_round(r, fence, msg.context, before=accepted)

    async def on_event(self, msg: Incoming) -> Sequence[ev.Base]:
        e = msg.event
        if isinstance(e, ev.AdmissionTerm):  # a term began: if not this router's, its own has ended
            if self.leadership is not None and self.leadership.superseded_by(msg.stream_seq, e.term, e.instance):
                self.step_down(f"router {e.instance} began term {e.term}", self.leadership.term)
            return []
        before = self.follower.projection.get(e.workload_id)
        fresh = before is None or msg.stream_seq > before.last_seq  # per workload: folded out of global order
        self.own_id(e)
        view = self.follower.projection.apply(e, msg.stream_seq)
        self.touched.add(e.workload_id)  # re-evaluation looks at it again (`awaiting_decision`)
        self.note_priority(e.workload_id, view)
        self.state.apply(e, msg.stream_seq)
        self.follower.remember(e.workload_id, msg.headers)
        self.gate.apply(e, msg.stream_seq)
        if isinstance(e, ev.Completed) and fresh and view is not None:
            self.learn(view)
        now = time.time()
        fence = self.fence(now)
        r = self.gate_round(now)  # level-triggered: a slot freed, a stage promoted, ...
        # what the round decided goes out now; if this handler fails, the gate still has it as
        # unconfirmed and the re-evaluation loop publishes it (same ids)
        return [*await self.publish_round(r, fence, msg.context), *self.on_route_requested(e)]

    def on_route_requested(self, e: Event) -> list[ev.Base]:
        if not isinstance(e, ev.RouteRequested):
            return []
        view = self.follower.projection.get(e.workload_id)
        if view is None or view.workload is None:
            raise Retry(0.5)  # the submitted event has not reached us yet
        if view.terminal or view.cancel_requested or e.attempt_number in view.routed_attempts:
            return []
        last = self.state.published.get(e.workload_id)
        if last is not None and last.attempt_number == e.attempt_number:
            return []  # a redelivery: decided already; re-evaluation publishes any change (new id)
        now = time.time()
        decision = self.decide(view.workload, e.workload_id, e.attempt_number, now)
        out = decision_events(e.workload_id, decision, e.attempt_number, now)
        self.state.note_published(out)
        return out

    async def reevaluate(self, stop: asyncio.Event) -> None:
        """Waiting work is re-evaluated when inventory changes (and at least every few seconds)."""
        while not stop.is_set():
            try:
                await asyncio.wait_for(self.inventory_changed.wait(), timeout=2.0)
            except TimeoutError:
                pass
            self.inventory_changed.clear()
            await self.reevaluate_once()
            await self.gate_once()

    async def gate_once(self) -> None:
        """The gate's periodic round: budget windows move with time (a forced round when a queue
        has a budget), and what a failed handler decided but never published is published again
        (the gate's own decisions only by the router that decides admission now, fenced)."""
        assert self.publisher is not None
        now = time.time()
        fence = self.fence(now)
        r = self.gate_round(now, force=pl.has_budget(self.policy))
        decided = {x.event_id for x in (*r.events, *r.cancels)}
        late = [e for e in self.gate.overdue(now, GATE_RESEND_AFTER) if e.event_id not in decided]
        if fence is None:  # not deciding admission: the gate's decisions wait for a term of this router
            late = [e for e in late if not isinstance(e, pl.DECIDED)]
        if late:
            log.warning("gate.resend", events=len(late))
        # one at a time, each in its workload's trace; the accepted submits as they are, the
        # gate's decisions fenced; before the cancels they explain
        for e in late:
            if not isinstance(e, ev.Cancel | pl.DECIDED):
                await self.publisher.publish([e], context=self.follower.context(e.workload_id))
        for e in [*(e for e in late if isinstance(e, pl.DECIDED)), *r.events]:
            assert fence is not None
            if not await self.publish_decided([e], fence, self.follower.context(e.workload_id)):
                return
        await self.send_cancels([*r.cancels, *(e for e in late if isinstance(e, ev.Cancel))])

    async def reevaluate_once(self) -> int:
        """One round over the work awaiting a decision: publish what `core.reevaluation` says
        (routed, rejected, or waiting for other reasons than the last published decision);
        an unchanged decision publishes nothing. Returns how many workloads published."""
        assert self.publisher is not None
        published = 0
        for wid in self.awaiting_decision():
            view = self.follower.projection.get(wid)
            n = self.pending_attempt(wid)
            if n is None or view is None or view.workload is None:
                continue
            now = time.time()
            decision = self.decide(view.workload, wid, n, now)
            out = core.reevaluation(self.state, wid, n, decision, now, self.republish_min_interval)
            if not out:
                continue
            log.info("workload.reevaluated", workload=wid, outcome=decision.outcome, cluster=decision.cluster, attempt=n, event_id=out[0].event_id)
            await self.publisher.publish(out, context=self.follower.context(wid))
            self.state.note_published(out)
            published += 1
        # preemption of checkpoint-safe work for waiting or queued work with a priority (gpuorch_router.preempt)
        views = self.follower.projection.workloads
        pre = core.preemptions(self.state, views.values(), self.snapshots.values(), time.time(),
                               candidates=[views[w] for w in self.prioritized if w in views])  # fmt: skip
        if pre:
            log.info("workload.preemption", events=[e.event_id for e in pre])
            await self.publisher.publish(pre)
        return published

    def dump_snapshot(self) -> bytes:
        """The router's state snapshot: projection, trace contexts, `RouterState`, the pipeline
        gate and the learnt routing history (gpuorch.runtime.snapshot)."""
        return follower_body(self.follower.projection, self.follower.traceparents, core.dump_router(self.state, self.gate, self.history))

    async def on_snapshot(self, msg: Any) -> None:
        try:
            snap = decode_snapshot(msg.data)
        except Exception as exc:  # a bad snapshot must not stop routing
            log.warning("snapshot.undecodable", subject=msg.subject, error=str(exc))
            return
        trusted, refused = trusted_snapshot(snap, msg.subject, self.names, self.registry)  # registry facts are ours
        if trusted is None:
            log.warning("snapshot.refused", subject=msg.subject[:200], reason=refused)
            return
        snap = trusted
        old = self.snapshots.get(snap.cluster)
        self.snapshots[snap.cluster] = snap
        self.indexes[snap.cluster] = build_index(snap, self.indexes.get(snap.cluster))
        if old is None or old.reachable != snap.reachable or old.observed_at != snap.observed_at:
            self.inventory_changed.set()

    async def catch_up(self, js: Any, start_seq: int = 0) -> int:
        """Replay the log (from `start_seq`, after a restored snapshot) into the projection and
        the router's state (`Follower.catch_up` + fold)."""
        n = 0
        with no_gc():  # nothing folded is garbage: see gpuorch.runtime.snapshot.no_gc
            async for evt, _subject, seq, headers in replay(js, self.names.stream_evt, self.names.evt_all, start_seq=start_seq):
                if evt is None:
                    continue
                self.fold(evt, seq)
                self.follower.remember(evt.workload_id, headers)
                n += 1
        settle_heap()
        return n

    async def run(self, stop: asyncio.Event) -> None:
        nc = await bus.connect_as(self.settings, "gpuorch-router")  # its own identity (GPUORCH_NATS_CREDS)
        try:
            js = self.js = nc.jetstream()
            await bus.await_topology(js, self.names)  # created by the admin identity
            self.publisher = Publisher(js, self.names)
            self.kv_admission = await js.key_value(self.names.kv_admission)
            self.leadership = lease.Leadership()  # on the bus: admission only in a term of its own
            me = self.settings.tuning.instance  # a replica folds every event through its own durable
            snapshots = Snapshots(js, self.names, snapshot_owner("router", me), events_durable(self.names, "router", me), self.dump_snapshot, interval=self.settings.tuning.snapshot_interval, inputs=[(self.names.stream_cmd, self.names.durable("router", "submit"))])
            start, folded = await restore_follower(snapshots, self.follower, core.load_router)
            if folded is not None:
                self.state, self.gate, self.history = folded
            n = await self.catch_up(js, start)  # learns from what completed after the snapshot
            for wid, view in self.follower.projection.workloads.items():  # (a snapshot restores no fold)
                self.note_priority(wid, view)
            log.info("router.caught_up", events=n)
            sub = await js.subscribe(
                self.names.inventory_all, cb=self.on_snapshot, ordered_consumer=True,
                deliver_policy=DeliverPolicy.LAST_PER_SUBJECT,
            )
            await run_until_stopped("router", stop, [
                consume(js, stream=self.names.stream_cmd, durable=self.names.durable("router", "submit"), filter_subject=self.names.cmd_submit, handler=self.on_command, publisher=self.publisher, names=self.names, stop=stop, concurrency=self.concurrency, key=submit_key),
                consume(js, stream=self.names.stream_evt, durable=events_durable(self.names, "router", me), filter_subject=self.names.evt_all, handler=self.on_event, publisher=self.publisher, names=self.names, stop=stop, concurrency=self.concurrency, key=pipeline_key),
                self.reevaluate(stop),
                self.lead(stop),
                snapshots.run(stop),
            ])
            await self.resign()
            await snapshots.final()  # the consumers have drained: what they folded is acked
            await sub.unsubscribe()
        finally:
            await nc.close()


def main() -> None:
    settings = Settings.for_service("router")
    run_service("router", Router(settings).run)
