"""Blips around LOST_AFTER, in virtual time: when does a cluster that stops answering for a while
make its attempts `lost`? (issue 27)

What runs is the production code's own rules, not copies: the informers' retry schedule
(:func:`gpuorch.informer.next_backoff`, capped at the probe interval), the liveness probe's
schedule (:func:`gpuorch.informer.probe_wait`), the group that coalesces the facts
(:class:`gpuorch.informer.ClusterInformers`, with a virtual clock and a probe that answers or not
as the simulated network says), and the dispatcher's rule (``liveness.contact``, ``liveness.answering``, ``liveness.silent_for``),
looked at on every tick and whenever a call fails (the dispatcher's `wake`). What is modelled is
only the network and the threads' timing: two informers (Jobs and pods), each with one watch open
that the server ends every `WATCH_SECONDS`, and the probe thread.

Two kinds of cut:

- ``refused``: calls fail at once (a reset or refused connection: the local clusters'
  ``partition``). An open watch breaks at the cut.
- ``hang``: calls made during the cut get no answer and fail at their read timeout (a real
  network partition). An open watch fails at its read timeout; a probe at the probe interval.

:func:`blip` runs one cut and reports when (if ever) the cluster was declared silent, and the
evidence: the failed call that proved it and when that call was made.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from gpuorch import liveness
from gpuorch.informer import (
    BACKOFF_MIN,
    PROBE_INTERVAL,
    READ_MARGIN,
    WATCH_SECONDS,
    ClusterInformers,
    next_backoff,
)
from gpuorch.informer import probe_wait as _probe_wait

TICK = 0.5  # GPUORCH_DISPATCH_INTERVAL


class Unanswered(Exception):
    """The simulated call got no answer."""


@dataclass
class Outcome:
    cut: float
    heal: float
    lost_at: float | None = None  # when the dispatcher declared the cluster silent
    evidence_at: float | None = None  # when the failed call that proved it was made
    reason: str = ""
    probes: int = 0

    @property
    def blip(self) -> float:
        return self.heal - self.cut


@dataclass(order=True)
class _Timer:
    at: float
    n: int
    what: Callable[[], None] = field(compare=False)


class _World:
    """Virtual time, the network's state and the timers of the threads being modelled."""

    def __init__(self, cut: float, heal: float, kind: str) -> None:
        self.now = 0.0
        self.cut, self.heal, self.kind = cut, heal, kind
        self._timers: list[_Timer] = []
        self._n: Iterator[int] = itertools.count()

    def up(self, t: float) -> bool:
        return not (self.cut <= t < self.heal)

    def at(self, t: float, what: Callable[[], None]) -> None:
        heapq.heappush(self._timers, _Timer(max(t, self.now), next(self._n), what))

    def run(self, until: float) -> None:
        while self._timers and self._timers[0].at <= until:
            t = heapq.heappop(self._timers)
            self.now = t.at
            t.what()


class _InformerModel:
    """One informer's thread (`Informer._run`): a watch open, ended by the server every
    WATCH_SECONDS (an answer, then opened again at once); a failed call is retried after a delay
    from BACKOFF_MIN, doubled by `next_backoff` up to the group's probe interval."""

    def __init__(self, w: _World, group: ClusterInformers, start: float) -> None:
        self.w, self.group = w, group
        self.delay = BACKOFF_MIN
        self.watch_id = 0
        w.at(start, self.open)

    def open(self) -> None:
        w = self.w
        if w.up(w.now):
            self.group.report(True, w.now, "")  # the server accepted the watch (headers)
            self.delay = BACKOFF_MIN
            self.watch_id += 1
            wid, opened = self.watch_id, w.now
            w.at(opened + WATCH_SECONDS, lambda: self.end(wid))
            if w.kind == "refused" and w.cut > opened:
                w.at(w.cut, lambda: self.broken(wid))  # reset by the cut
        elif w.kind == "refused":
            self.fail(w.now)
        else:  # the call hangs to its timeout; its answer was due when it was made
            began = w.now
            w.at(began + WATCH_SECONDS + READ_MARGIN, lambda: self.fail(began))

    def end(self, wid: int) -> None:
        w = self.w
        if wid != self.watch_id:
            return
        if w.kind == "hang" and not w.up(w.now):  # its end was due in the cut: a read timeout
            self.watch_id += 1
            due = w.now
            w.at(due + READ_MARGIN, lambda: self.fail(due))
            return
        self.group.report(True, w.now, "")
        self.open()

    def broken(self, wid: int) -> None:
        if wid == self.watch_id:
            self.watch_id += 1
            self.fail(self.w.now)

    def fail(self, due: float) -> None:
        w = self.w
        # dated when the missing answer was due (`Informer._contact`), reported when seen
        self.group.report(False, due, "unreachable")
        w.at(w.now + self.delay, self.open)
        self.delay = next_backoff(self.delay, self.group.probe_interval)


def blip(
    cut: float,
    length: float,
    *,
    kind: str = "refused",
    lost_after: float = 3.0,
    probe_interval: float = PROBE_INTERVAL,
    tick: float = TICK,
    phases: tuple[float, float, float] = (0.0, 0.0, 0.0),
    horizon: float | None = None,
) -> Outcome:
    """One cut of `length` seconds at `cut`; `phases`: when the two informers and the dispatcher's
    ticks started (each under its own period), so sweeps can try every alignment."""
    w = _World(cut, cut + length, kind)
    out = Outcome(cut=cut, heal=cut + length)
    state: dict[str, liveness.Contact | None] = {"contact": None}
    failures: list[float] = []  # when each failed call the group reported was made

    def probe(timeout: float) -> None:
        if kind == "hang" and not w.up(w.now):
            raise Unanswered("timed out")  # (its time is accounted for by `run_probe`)
        if not w.up(w.now):
            raise Unanswered("connection refused")

    group = ClusterInformers("sim", probe=probe, probe_interval=probe_interval, clock=lambda: w.now)

    def look() -> None:  # the dispatcher's tick (`Dispatcher.watch`): fold, then the rule
        for answered, at, _ in group.contacts():
            state["contact"] = liveness.contact(state["contact"], answered, at)
            if not answered:
                failures.append(at)
        c = state["contact"]
        if out.lost_at is None and not liveness.answering(failing=group.failing, synced=group.synced):
            why = liveness.silent_for(c, w.now, lost_after)
            if why is not None and c is not None:  # (never heard from: not silent yet)
                out.lost_at, out.evidence_at, out.reason = w.now, c.last_failed, why

    group.on_failure = lambda: w.at(w.now, look)  # the dispatcher's wake

    def ticks() -> None:
        look()
        w.at(w.now + tick, ticks)

    last_probe: dict[str, float | None] = {"at": None}

    def run_probe() -> None:  # the probe thread (`ClusterInformers._probe_run`)
        wait = _probe_wait(group.failing, group.last_ok, last_probe["at"], w.now, probe_interval)
        if wait > 0:
            w.at(w.now + wait, run_probe)
            return
        last_probe["at"] = began = w.now
        if kind == "hang" and not w.up(began):
            out.probes += 1

            def timed_out() -> None:
                group.report(False, began, "timed out")  # a failure at the time the call was made
                run_probe()

            w.at(began + probe_interval, timed_out)
            return
        out.probes += 1
        group.probes += 1
        try:
            probe(probe_interval)
        except Unanswered as exc:
            group.report(False, began, str(exc))
        else:
            group.report(True, w.now, "")
        run_probe()

    _InformerModel(w, group, phases[0])
    _InformerModel(w, group, phases[1])
    w.at(phases[2], ticks)
    w.at(0.0, run_probe)
    w.run(horizon if horizon is not None else cut + length + lost_after + 4 * probe_interval + WATCH_SECONDS + 2 * READ_MARGIN)
    return out


def sweep(
    lengths: list[float], *, kind: str = "refused", lost_after: float = 3.0, probe_interval: float = PROBE_INTERVAL, alignments: int = 12
) -> list[Outcome]:
    """Every blip length, each under `alignments` different alignments of the cut with the
    informers' watches, the probe and the ticks."""
    out = []
    for length in lengths:
        for i in range(alignments):
            f = i / alignments
            phases = (f * WATCH_SECONDS, ((f * 7) % 1) * WATCH_SECONDS, ((f * 3) % 1) * TICK)
            cut = 20.0 + f * probe_interval
            out.append(blip(cut, length, kind=kind, lost_after=lost_after, probe_interval=probe_interval, phases=phases))
    return out


def table(outcomes: list[Outcome], lost_after: float) -> str:
    """One line per blip length: how many alignments lost it, the detection delays."""
    rows = ["blip (s)  lost/runs  detected after the cut (s): min / max   evidence before heal"]
    by: dict[float, list[Outcome]] = {}
    for o in outcomes:
        by.setdefault(round(o.blip, 3), []).append(o)
    for length, os_ in sorted(by.items()):
        lost = [o for o in os_ if o.lost_at is not None]
        delays = [o.lost_at - o.cut for o in lost if o.lost_at is not None]
        before = all(o.evidence_at is not None and o.evidence_at < o.heal for o in lost)
        span = f"{min(delays):.2f} / {max(delays):.2f}" if delays else "-"
        rows.append(f"{length:8.2f}  {len(lost):4d}/{len(os_):<4d}  {span:>37}   {'yes' if before else 'NO'}")
    rows.append(f"(LOST_AFTER {lost_after:g} s)")
    return "\n".join(rows)


def main() -> None:
    lengths = [round(0.5 + 0.25 * i, 2) for i in range(19)]  # 0.5 .. 5.0 s
    for kind in ("refused", "hang"):
        print(f"cut kind: {kind}")
        print(table(sweep(lengths, kind=kind), 3.0))
        print()


if __name__ == "__main__":
    main()
