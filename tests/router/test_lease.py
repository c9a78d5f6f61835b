"""Admission leadership by lease (`gpuorch_router.lease`, `pipeline.Gate.retract`): pure, no broker.

The rules in tables (who may take the lease, when a router may release), then two routers over
one log through a handover, many schedules: the limit holds at every point of the log, even
when the old leader's clock lags and it goes on deciding after its successor's term began.
The stream's part there is JetStream's expected-last-subject-sequence check on the marker
subject, modelled in `Stream` (tests/e2e/test_admission_lease.py runs the real server).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import pytest

from gpuorch_proto import RoutingDecision, Workload, event_id
from gpuorch_proto import events as ev
from gpuorch_proto.state import AdmissionLease
from gpuorch_router import core, lease
from gpuorch_router import pipeline as pl
from tests.pipeline.builders import NOW, make_policy, make_sweep, research

TTL = 6.0
M = lease.margin(TTL)


def held_by(instance: str, term: int, expires_at: float) -> AdmissionLease:
    return AdmissionLease(instance=instance, term=term, expires_at=expires_at)


@pytest.mark.parametrize(
    ("current", "me", "term", "now", "want"),
    [
        (None, "0", 0, NOW, (1, NOW + TTL)),  # nobody ever led: the first term
        (held_by("0", 4, NOW + 1), "0", 4, NOW, (4, NOW + TTL)),  # its own term: renewed
        (held_by("0", 4, NOW - 30), "0", 4, NOW, (4, NOW + TTL)),  # ran out, nobody took it: still term 4
        (held_by("0", 4, NOW + 5), "0", 0, NOW, (5, NOW + TTL)),  # a restart of "0" (leads nothing): the next term
        (held_by("1", 4, NOW + 0.5), "0", 0, NOW, None),  # another's live lease
        (held_by("1", 4, NOW - M / 2), "0", 0, NOW, None),  # ran out, but not by the clock margin yet
        (held_by("1", 4, NOW - M), "0", 0, NOW, (5, NOW + TTL)),  # ran out by the margin: taken, the next term
        (held_by("1", 4, 0.0), "0", 0, NOW, (5, NOW + TTL)),  # resigned at a clean stop
        (held_by("1", 4, NOW + 1), "0", 4, NOW, None),  # "0" believes it leads term 4, but "1" holds it
    ],
    ids=[
        "no-record-first-term", "holder-renews", "holder-renews-after-running-out", "own-restart-next-term",
        "other-live", "other-within-margin", "other-ran-out", "other-resigned", "same-term-other-holder",
    ],
)  # fmt: skip
def test_who_may_write_the_lease(current: AdmissionLease | None, me: str, term: int, now: float, want: tuple[int, float] | None) -> None:
    got = lease.claim(current, me, term, now, TTL, M)
    assert (None if got is None else (got.term, got.expires_at)) == want
    assert got is None or got.instance == me


def test_the_margin_is_the_clock_margin_and_at_most_a_sixth_of_the_ttl() -> None:
    assert lease.margin(6.0) == lease.CLOCK_MARGIN == 1.0
    assert lease.margin(60.0) == 1.0
    assert lease.margin(1.5) == 0.25  # the holder, renewing every 0.5 s, always has a term to release in
    assert lease.ran_out(lease.resigned(held_by("0", 2, NOW + 100)), NOW, M)


def test_a_router_releases_only_in_its_term_before_its_end_and_once_caught_up_to_its_marker() -> None:
    lead = lease.Leadership().written(held_by("0", 3, NOW + TTL))
    assert lead.term == 3 and lead.marker == 0 and not lead.admits(NOW, M), "no marker yet"
    lead = lease.Leadership(lead.lease, marker=120, folded=119)
    assert not lead.admits(NOW, M), "the log not folded up to the marker"
    lead = lease.Leadership(lead.lease, marker=120, folded=120)
    assert lead.caught_up and lead.admits(NOW, M)
    assert not lead.admits(NOW + TTL - M, M), "it stops a clock margin before the lease ends"
    renewed = lead.written(held_by("0", 3, NOW + 2 * TTL))
    assert (renewed.marker, renewed.folded) == (120, 120) and renewed.admits(NOW + TTL, M), "a renewal keeps the term"
    again = lead.written(held_by("0", 4, NOW + 2 * TTL))
    assert again.term == 4 and again.marker == 0, "a new term starts with no marker"
    # a marker after its own ends its term; its own, or one before it, does not
    assert lead.superseded_by(121, 4, "1") and lead.superseded_by(121, 4, "0")
    assert not lead.superseded_by(120, 3, "0") and not lead.superseded_by(90, 2, "1")
    assert not lease.Leadership().superseded_by(5, 1, "1")


def test_the_fence_names_the_marker_and_its_subject() -> None:
    assert lease.fence_headers(120, "gpuorch.evt.admission.admission-term") == {
        "Nats-Expected-Last-Subject-Sequence": "120",
        "Nats-Expected-Last-Subject-Sequence-Subject": "gpuorch.evt.admission.admission-term",
    }


# --- the gate's releases that may not reach the log ------------------------------------------


def test_a_noted_release_counts_at_once_and_a_retracted_one_waits_again() -> None:
    policy = make_policy()
    gate = pl.Gate()
    wl = make_sweep(grid={"i": list(range(4))}, limits={"max_running": 2})
    sub = ev.Submitted(event_id=event_id("s", "submitted"), workload_id="s", at=NOW, workload=wl)
    gate.accept(policy, sub, None, NOW)
    r = gate.step(policy, NOW)
    released = [e.workload_id for e in r.events if isinstance(e, ev.Released)]
    assert released == ["s--t0000", "s--t0001"] and set(gate.releasing) == set(released)
    assert gate.tally().running[("pipeline", "s")] == 2, "counted against the limit before the log has them"
    assert not [e for e in gate.step(policy, NOW, force=True).events if isinstance(e, ev.Released)]
    assert gate.retract() == released
    assert gate.tally().running.get(("pipeline", "s"), 0) == 0 and not gate.releasing
    assert not [e for e in gate.overdue(NOW + 100, 10) if isinstance(e, ev.Released)], "never published again"
    again = [e.workload_id for e in gate.step(policy, NOW + 1).events if isinstance(e, ev.Released)]
    assert again == released, "decided anew"
    dumped = core.load_gate(core.dump_gate(gate))
    assert not dumped.releasing and set(released) <= set(dumped.waiting), "a snapshot holds only what the log holds"
    seq = 100
    for e in [x for x in r.events if isinstance(x, ev.Released)]:  # the log's echo: running, counted once
        seq += 1
        gate.apply(e, seq)
    assert set(gate.running) == set(released) and not gate.releasing
    assert gate.tally() == pl.Tally.of(gate.running.values())


# --- two routers over one log ----------------------------------------------------------------

K = 3  # the queue's limit
N = 14  # trials of the first sweep; a second one, of higher priority, comes during the handover


def routed(wl: Workload, wid: str) -> RoutingDecision:
    return RoutingDecision(workload_id=wid, decided_at=NOW, outcome="routed", cluster="primary", summary="primary")


class Stream:
    """The event stream: messages in order; de-duplication by id; a message with an expected
    last sequence of the marker subject is stored only if the last marker has that sequence."""

    def __init__(self) -> None:
        self.log: list[ev.Base] = []
        self.ids: set[str] = set()
        self.last_marker = 0

    def publish(self, e: ev.Base, expect: int | None = None) -> bool:
        if expect is not None and expect != self.last_marker:
            return False
        if e.event_id not in self.ids:
            self.ids.add(e.event_id)
            self.log.append(e)
            if isinstance(e, ev.AdmissionTerm):
                self.last_marker = len(self.log)
        return True


@dataclass
class Router:
    name: str
    skew: float = 0.0  # its clock minus the true one
    gate: pl.Gate = field(default_factory=pl.Gate)
    state: core.RouterState = field(default_factory=core.RouterState)
    lead: lease.Leadership = field(default_factory=lease.Leadership)
    folded: int = 0
    inflight: list[tuple[ev.Base, int]] = field(default_factory=list)  # decided, not yet published, with its fence

    def fold(self, stream: Stream, upto: int) -> None:
        while self.folded < min(upto, len(stream.log)):
            self.folded += 1
            e = stream.log[self.folded - 1]
            if isinstance(e, ev.AdmissionTerm):
                if self.lead.superseded_by(self.folded, e.term, e.instance):
                    self.step_down()
                continue
            self.gate.apply(e, self.folded)  # type: ignore[arg-type]
            self.state.apply(e, self.folded)  # type: ignore[arg-type]
        self.lead = lease.Leadership(self.lead.lease, self.lead.marker, self.folded) if self.lead.lease else self.lead

    def step_down(self) -> None:
        self.gate.retract()
        self.lead = lease.Leadership()

    def begin(self, written: AdmissionLease, stream: Stream) -> None:
        self.lead = self.lead.written(written)
        self.gate.retract()
        marker = ev.AdmissionTerm(event_id=event_id(ev.ADMISSION_REF, "admission-term", written.term), workload_id=ev.ADMISSION_REF,
                                  at=NOW, term=written.term, instance=self.name)  # fmt: skip
        stream.publish(marker)
        self.lead = lease.Leadership(written, marker=stream.last_marker, folded=self.folded)

    def round(self, t: float) -> None:
        if not self.lead.admits(t + self.skew, M):
            return
        r = core.gate_round(self.gate, POLICY, self.state, routed, t)
        self.inflight += [(e, self.lead.marker) for e in r.events]

    def deliver(self, stream: Stream, n: int) -> None:
        for e, fence in self.inflight[:n]:
            if not stream.publish(e, fence) and fence == self.lead.marker:
                self.step_down()  # the stream refused this term's decision
        del self.inflight[:n]


POLICY = research(max_gpus=None, max_running=K)


def accepted(wid: str, wl: Workload, at: float) -> list[ev.Base]:
    """What a router accepting the submit publishes (`Gate.accept`): its `submitted`, expanded."""
    sub = ev.Submitted(event_id=event_id(wid, "submitted"), workload_id=wid, at=at, workload=wl)
    return list(pl.Gate().accept(POLICY, sub, None, at))


def over_the_limit(stream: Stream, ids: set[str]) -> int:
    """The most of `ids` released and not finished at once, anywhere in the log."""
    live: set[str] = set()
    most = 0
    for e in stream.log:
        if e.workload_id not in ids:
            continue
        if isinstance(e, ev.Released):
            live.add(e.workload_id)
        elif isinstance(e, ev.Completed):
            live.discard(e.workload_id)
        most = max(most, len(live))
    return most


@pytest.mark.parametrize("seed", range(100))
def test_two_routers_through_a_handover_never_release_past_the_limit(seed: int) -> None:
    rng = random.Random(seed)
    stream = Stream()
    a, b = Router("0", skew=-rng.choice([0.0, 2.0, 10.0])), Router("1")  # a's clock may lag: a zombie
    for e in accepted("s", make_sweep(grid={"i": list(range(N))}, policy_queue="research"), NOW):
        stream.publish(e)
    urgent = make_sweep(grid={"j": list(range(4))}, policy_queue="research", priority=10)
    record: AdmissionLease | None = None
    t = NOW
    handover = rng.randrange(5, 40)
    urgent_at = handover + rng.randrange(0, 30)  # a view the old leader may never fold: the two decide differently
    # how fast each folds the log (events per step, at most) and how often its publishes go out
    pace = {r.name: (rng.choice([2, 4, 8]), rng.choice([0.15, 0.5, 1.0])) for r in (a, b)}

    def take(r: Router) -> None:
        nonlocal record
        want = lease.claim(record, r.name, r.lead.term, t + r.skew, TTL, M)
        if want is not None:
            new_term = want.term != r.lead.term
            record = want
            if new_term:
                r.begin(want, stream)
            else:
                r.lead = r.lead.written(want)

    def finish_one() -> None:
        live = [w for w in ids if w in {e.workload_id for e in stream.log if isinstance(e, ev.Released)}
                and w not in {e.workload_id for e in stream.log if isinstance(e, ev.Completed)}]  # fmt: skip
        if live:
            w = rng.choice(sorted(live))
            stream.publish(ev.Completed(event_id=event_id(w, "completed"), workload_id=w, at=t, attempt_id=f"{w}-a1", result_path=f"/r/{w}"))

    for step in range(400):
        t += 0.5
        if step == urgent_at:
            for e in accepted("u", urgent, t):
                stream.publish(e)
        ids = {c.workload_id for e in stream.log if isinstance(e, ev.PipelineExpanded) for c in e.children}
        if step < handover:
            take(a)  # a renews; b sees a live lease
        elif step >= handover + 2:
            take(b)  # a stalled: b takes the lease once it ran out by b's clock
        for r in (a, b):
            r.fold(stream, r.folded + rng.randrange(0, pace[r.name][0]))
            if rng.random() < 0.7:
                r.round(t)
            if rng.random() < pace[r.name][1]:  # its publishes may lag behind its decisions
                r.deliver(stream, rng.randrange(1, 5))
        if rng.random() < 0.5:
            finish_one()
        assert over_the_limit(stream, ids) <= K, f"step {step}: past the limit"
    # b leads and the log settles: every trial finishes, within the limit
    for _ in range(200):
        t += 0.5
        take(b)
        b.fold(stream, len(stream.log))
        b.round(t)
        b.deliver(stream, len(b.inflight))
        finish_one()
    a.fold(stream, len(stream.log))
    done = {e.workload_id for e in stream.log if isinstance(e, ev.Completed)}
    assert done == ids, f"{len(ids - done)} trials never finished"
    assert 1 <= over_the_limit(stream, ids) <= K
    assert any(isinstance(e, ev.AdmissionTerm) and e.instance == "1" for e in stream.log), "b took over"
    for r in (a, b):
        assert not r.gate.releasing and r.gate.tally() == pl.Tally.of(r.gate.running.values()), r.name
