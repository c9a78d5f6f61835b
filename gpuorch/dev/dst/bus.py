"""Simulated JetStream and KV (pure, no I/O): what the shells rely on, and nothing more.

* :class:`SimStream`: an ordered log (stream sequence from 1), de-duplication by message id
  (``Nats-Msg-Id``) within the stream's duplicate window, optional last-value-per-subject
  (the inventory stream: ``max_msgs_per_subject=1``).
* :class:`SimConsumer`: a durable pull consumer with explicit acks. At-least-once: a message
  delivered and not acked is redelivered once its ack deadline passes (``ack_wait``; a live
  holder keeps it in progress, as the shell's ``in_progress`` heartbeats do); ``nak(delay)``
  redelivers after the delay; the server allows ``max_deliver + 1`` deliveries. Its state lives
  on the "server": a crashed client's consumer resumes from its ack floor, and what it had in
  hand comes back after ``ack_wait``.
* :class:`SimKV`: a revision per key; ``create`` fails if the key exists, ``update(last=rev)``
  fails on a stale revision (compare-and-set). Every write is kept in ``writes`` for the checks.

Events are passed as the (immutable) msgspec Structs themselves: the real shells decode each
message once and the sim has nothing to decode.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


class KVConflict(Exception):
    """Wrong last sequence / key exists: someone else wrote first."""


@dataclass
class StoredMsg:
    seq: int
    msg_id: str
    subject_key: str  # last-value streams keep one message per subject_key
    data: Any
    at: float
    deleted: bool = False


@dataclass
class SimStream:
    name: str
    duplicate_window: float = 120.0
    last_per_subject: bool = False
    msgs: list[StoredMsg] = field(default_factory=list)
    ids: dict[str, tuple[int, float]] = field(default_factory=dict)
    last: dict[str, int] = field(default_factory=dict)  # subject_key -> seq (last-value streams)
    consumers: list[SimConsumer] = field(default_factory=list)

    @property
    def last_seq(self) -> int:
        return len(self.msgs)

    def publish(self, data: Any, now: float, msg_id: str = "", subject_key: str = "") -> tuple[int, bool]:
        """Store `data`; returns (seq, duplicate). A duplicate id within the window is not stored."""
        if msg_id:
            seen = self.ids.get(msg_id)
            if seen is not None and now - seen[1] < self.duplicate_window:
                return seen[0], True
        seq = len(self.msgs) + 1
        self.msgs.append(StoredMsg(seq, msg_id, subject_key, data, now))
        if msg_id:
            self.ids[msg_id] = (seq, now)
        if self.last_per_subject:
            old = self.last.get(subject_key)
            if old is not None:
                self.msgs[old - 1].deleted = True
            self.last[subject_key] = seq
        for c in self.consumers:
            c.notify(seq)
        return seq, False

    def get(self, seq: int) -> StoredMsg:
        return self.msgs[seq - 1]


@dataclass
class Pending:
    delivered: int
    deadline: float  # when it may be delivered (again)
    holder: object | None  # the client instance holding it (None: nobody, e.g. nak'ed)


@dataclass
class SimConsumer:
    stream: SimStream
    durable: str
    accepts: Callable[[Any], bool]
    ack_wait: float = 30.0
    max_deliver: int = 5  # the shell's limit; the server allows one more delivery
    next_seq: int = 1  # the next new message to consider
    pending: dict[int, Pending] = field(default_factory=dict)
    ack_floor: int = 0
    _new: bool = True  # a message at or after next_seq may match
    _ready: float | None = None  # cached ready_at (valid while not _dirty)
    _dirty: bool = True

    def __post_init__(self) -> None:
        self.stream.consumers.append(self)

    def notify(self, seq: int) -> None:
        self._new = True
        self._dirty = True

    def _scan_new(self) -> int | None:
        msgs = self.stream.msgs
        while self.next_seq <= len(msgs):
            m = msgs[self.next_seq - 1]
            if not m.deleted and self.accepts(m.data):
                return self.next_seq
            self.next_seq += 1
        self._new = False
        return None

    def ready_at(self, now: float) -> float | None:
        """When the next delivery is possible (now or later); None: nothing to deliver."""
        if not self._dirty:
            return self._ready
        self._ready = r = self._ready_at(now)
        self._dirty = False
        return r

    def _ready_at(self, now: float) -> float | None:
        if self._new and self._scan_new() is not None:
            return now
        best: float | None = None
        for p in self.pending.values():
            if p.holder is None or not getattr(p.holder, "alive", True):
                if best is None or p.deadline < best:
                    best = p.deadline
        return best

    def fetch(self, now: float, holder: object) -> tuple[StoredMsg, int] | None:
        """One message for `holder`: a due redelivery first, else the next new one."""
        self._dirty = True
        due = [(p.deadline, s) for s, p in self.pending.items() if p.deadline <= now and (p.holder is None or not getattr(p.holder, "alive", True))]
        if due:
            _, seq = min(due)
            p = self.pending[seq]
            if p.delivered >= self.max_deliver + 1:
                del self.pending[seq]  # the server stops delivering it
                return self.fetch(now, holder)
            p.delivered += 1
            p.holder = holder
            p.deadline = now + self.ack_wait
            return self.stream.get(seq), p.delivered
        if self._new:
            new = self._scan_new()
            if new is not None:
                self.next_seq = new + 1
                self.pending[new] = Pending(1, now + self.ack_wait, holder)
                return self.stream.get(new), 1
        return None

    def ack(self, seq: int) -> None:
        self._dirty = True
        self.pending.pop(seq, None)
        floor = self.next_seq - 1
        if self.pending:
            floor = min(floor, min(self.pending) - 1)
        self.ack_floor = floor

    term = ack

    def nak(self, seq: int, now: float, delay: float) -> None:
        self._dirty = True
        p = self.pending.get(seq)
        if p is not None:
            p.holder = None
            p.deadline = now + delay

    def release(self, holder: object, now: float) -> None:
        """`holder` died: what it held comes back after ack_wait (no more in-progress heartbeats)."""
        self._dirty = True
        for p in self.pending.values():
            if p.holder is holder:
                p.holder = None
                p.deadline = now + self.ack_wait


@dataclass
class KVWrite:
    key: str
    revision: int
    previous: Any
    value: Any
    at: float
    by: str


@dataclass
class SimKV:
    name: str
    data: dict[str, tuple[Any, int]] = field(default_factory=dict)  # key -> (value, revision)
    revision: int = 0
    writes: list[KVWrite] = field(default_factory=list)

    def get(self, key: str) -> tuple[Any, int] | None:
        return self.data.get(key)

    def create(self, key: str, value: Any, now: float, by: str = "") -> int:
        if key in self.data:
            raise KVConflict(f"{self.name}/{key}: key exists")
        return self._write(key, value, None, now, by)

    def update(self, key: str, value: Any, last: int, now: float, by: str = "") -> int:
        cur = self.data.get(key)
        if cur is None or cur[1] != last:
            raise KVConflict(f"{self.name}/{key}: wrong last sequence {last} (now {cur[1] if cur else 0})")
        return self._write(key, value, cur[0], now, by)

    def _write(self, key: str, value: Any, previous: Any, now: float, by: str) -> int:
        self.revision += 1
        self.data[key] = (value, self.revision)
        self.writes.append(KVWrite(key, self.revision, previous, value, now, by))
        return self.revision
