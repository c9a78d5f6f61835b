"""Admission leadership by lease: which router releases work (docs/operations.md, *Admission
leadership*). Pure: no I/O, no clock; the shell (`service.Router.lead_once`) reads and writes.

Any router may decide admission, one at a time. The admission bucket holds one record, `leader`
(`AdmissionLease{instance, term, expires_at}`), written only by compare-and-set on the revision
read: its holder renews it every TTL/3 (the same term); another router takes it once it ran out
(`claim`: the next term). A router that wins a term publishes an `admission-term` message to the
event log and releases nothing before it has folded the log up to that message (`Leadership.admits`).
Each release it then publishes is stored only while that message is still the last
`admission-term` in the stream (`fence_headers`: JetStream's expected-last-subject-sequence check,
made by the stream when it stores the message). So every release the stream holds was decided
by the router whose marker was the last before it, after it had folded every release before its
marker: its counts were at least the log's, and a limit holds exactly whatever the clocks say.
The clocks (and `margin`) decide only how soon a dead leader's successor starts.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Final

import msgspec

from gpuorch_proto.state import AdmissionLease

#: Seconds between two routers' clocks that a lease allows for: the holder stops releasing this
#: long before its lease ends by its clock, another router takes it this long after (at most a
#: sixth of the TTL: `margin`).
CLOCK_MARGIN: Final = 1.0

#: JetStream's publish headers: store the message only if the last one on the named subject has
#: this stream sequence (refused otherwise: `gpuorch.runtime.shell.Fenced`).
EXPECTED_LAST_SUBJECT_SEQUENCE: Final = "Nats-Expected-Last-Subject-Sequence"
EXPECTED_LAST_SUBJECT_SEQUENCE_SUBJECT: Final = "Nats-Expected-Last-Subject-Sequence-Subject"


def margin(ttl: float) -> float:
    """The clock margin for a lease of `ttl` seconds: `CLOCK_MARGIN`, at most a sixth of it (so the
    holder, renewing every third, always has a term it may release in)."""
    return min(CLOCK_MARGIN, ttl / 6)


def ran_out(lease: AdmissionLease, now: float, margin: float) -> bool:
    """Has `lease` run out by this clock (`now`), `margin` seconds ago or more?"""
    return lease.expires_at + margin <= now


def claim(
    current: AdmissionLease | None, me: str, term: int, now: float, ttl: float, margin: float
) -> AdmissionLease | None:
    """The record router `me` writes by compare-and-set on the revision it read `current` at, or
    None: another router leads. `term` is the term `me` leads (0: none).

    * `current` is `me`'s own term `term`: renewed for `ttl` (the same term, even if it ran out:
      nobody took it, so nobody released in between);
    * no record, a record naming `me` at another term (a restart of `me`, or a term it gave up),
      or one that ran out `margin` seconds ago: the next term, `me`'s;
    * else (another router's live lease): None."""
    if current is None:
        return AdmissionLease(instance=me, term=1, expires_at=now + ttl)
    if current.instance == me and term > 0 and current.term == term:
        return msgspec.structs.replace(current, expires_at=now + ttl)
    if current.instance == me or ran_out(current, now, margin):
        return AdmissionLease(instance=me, term=current.term + 1, expires_at=now + ttl)
    return None


def resigned(lease: AdmissionLease) -> AdmissionLease:
    """`lease` ended by its holder (a clean stop): run out for every clock, so the next router
    need not wait for it."""
    return msgspec.structs.replace(lease, expires_at=0.0)


@dataclass(frozen=True)
class Leadership:
    """What a router knows of its own admission term.

    `lease`: as it last wrote it (None: it leads no term); `marker`: the stream sequence of the
    term's `admission-term` (0: not published yet); `folded`: the stream sequence at and below
    which it has folded every event (its events durable's ack floor, as last read)."""

    lease: AdmissionLease | None = None
    marker: int = 0
    folded: int = 0

    @property
    def term(self) -> int:
        return self.lease.term if self.lease is not None else 0

    @property
    def caught_up(self) -> bool:
        """Has it folded the log up to its term's marker (every release stored before it)?"""
        return self.marker > 0 and self.folded >= self.marker

    def admits(self, now: float, margin: float) -> bool:
        """May it release work now: it holds a term whose lease does not end within `margin` by
        its clock, and has folded the log up to the term's marker."""
        return self.lease is not None and now < self.lease.expires_at - margin and self.caught_up

    def written(self, lease: AdmissionLease) -> Leadership:
        """After it wrote `lease`: the same term renewed, or a new term (no marker yet)."""
        if self.lease is not None and lease.term == self.lease.term and lease.instance == self.lease.instance:
            return replace(self, lease=lease)
        return Leadership(lease=lease)

    def superseded_by(self, seq: int, term: int, instance: str) -> bool:
        """Does an `admission-term` at stream sequence `seq` end this router's term? Any marker
        after its own that is not its own: from then on the stream refuses its releases."""
        if self.lease is None or self.marker == 0:
            return False
        mine = instance == self.lease.instance and term == self.lease.term
        return not mine and seq > self.marker


def fence_headers(marker: int, marker_subject: str) -> Mapping[str, str]:
    """The headers of a release in the term whose marker is at `marker` on `marker_subject`: the
    stream stores it only while that marker is the last there."""
    return {
        EXPECTED_LAST_SUBJECT_SEQUENCE: str(marker),
        EXPECTED_LAST_SUBJECT_SEQUENCE_SUBJECT: marker_subject,
    }
