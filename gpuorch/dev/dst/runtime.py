"""The sim's runtime: services as sets of tasks (generators), stepped one await point at a time.

A real service is one asyncio process running several loops (its consumers, its timers); they
interleave at their ``await`` points. Here each loop is a generator and every ``yield`` is such a
point: the scheduler resumes one task by one step at a time, so any other task, fault or crash
may come in between. A task yields what it waits for:

* ``None``: nothing (a step boundary: an await that returns at once, e.g. a publish);
* :class:`Sleep`: the virtual clock reaching a time;
* :class:`Fetch`: a message a consumer can deliver;
* :class:`Until`: a condition, or a time, whichever comes first.
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from dataclasses import dataclass
from typing import Any

from .bus import SimConsumer


@dataclass(frozen=True)
class Sleep:
    until: float


@dataclass(frozen=True)
class Fetch:
    consumer: SimConsumer


@dataclass(frozen=True)
class Until:
    cond: Callable[[], bool]
    until: float


Wait = Sleep | Fetch | Until | None
Gen = Generator[Wait, None, Any]


class Task:
    __slots__ = ("alive", "gen", "name", "owner", "wait")

    def __init__(self, name: str, owner: Any, gen: Gen) -> None:
        self.name = name
        self.owner = owner
        self.gen = gen
        self.wait: Wait = None
        self.alive = True

    def ready_at(self, now: float) -> float | None:
        """When this task can run (<= now: now); None: not before something else happens."""
        w = self.wait
        if w is None:
            return now
        if isinstance(w, Sleep):
            return w.until
        if isinstance(w, Fetch):
            return w.consumer.ready_at(now)
        return now if w.cond() else w.until


class Retry(Exception):
    """nak with a delay (gpuorch.runtime.shell.Retry)."""

    def __init__(self, delay: float, reason: str = "") -> None:
        super().__init__(reason)
        self.delay = delay


class Reject(Exception):
    """Refuse the message: record it (bound to the message) and terminate it."""

    def __init__(self, reason: str, claimed_workload_id: str | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.claimed_workload_id = claimed_workload_id


def default_backoff(delivered: int) -> float:
    """The shell's nak delay after a handler error: 0.5 s, 1 s, 2 s ... at most 30 s."""
    return float(min(30.0, 0.5 * 2 ** max(0, delivered - 1)))
