"""Progress of a long replay on a terminal: jobs replayed / total, simulated day, ETA.

The engine calls `Simulation(progress=...)` with (jobs replayed, total, simulated time) after each
trace arrival; it does no I/O. `Progress` turns those calls into one status line, at most every
`interval` seconds of wall time, through a `write` it is given, on a `clock` it is given (the CLI
passes `sys.stderr.write` and `time.monotonic`, and only when stderr is a terminal and the output
is not JSON). So this module is pure too: the tests drive it with a fake clock.

The ETA is for the replay in progress (policies differ a lot in speed: gpuorch's router is the
slow one), from the rate over the last `window` seconds of wall time: a replay slows down as its
queues grow, and the recent rate follows that better than the average since the start.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

from gpuorch_proto.units import format_duration

#: ANSI: back to the line's start, erase to its end (every terminal the CLI meets understands it)
CLEAR = "\r\x1b[K"


class Eta:
    """Remaining wall time of a replay from its recent rate (jobs per wall second)."""

    def __init__(self, window: float = 30.0) -> None:
        self.window = window
        self.samples: deque[tuple[float, int]] = deque()  # (wall, done), oldest first

    def add(self, wall: float, done: int) -> None:
        self.samples.append((wall, done))
        while len(self.samples) > 2 and wall - self.samples[1][0] >= self.window:
            self.samples.popleft()  # keep one sample at least `window` old as the rate's start

    def remaining(self, total: int) -> float | None:
        """Seconds left, or None while there is no rate yet (nothing done, or no time passed)."""
        if len(self.samples) < 2:
            return None
        (w0, d0), (w1, d1) = self.samples[0], self.samples[-1]
        if d1 >= total:
            return 0.0
        if d1 <= d0 or w1 <= w0:
            return None
        return (total - d1) * (w1 - w0) / (d1 - d0)


def line(label: str, done: int, total: int, sim_seconds: float, span_seconds: float, elapsed: float,
         eta: float | None) -> str:
    """`gpuorch (1/7): 12,345/69,351 jobs 17.8 %, day 10.4 of 60.1, 1m2s, ETA 4m48s`."""
    pct = 100.0 * done / total if total else 100.0
    day = f"day {sim_seconds / 86400:.1f} of {span_seconds / 86400:.1f}"
    left = "ETA ?" if eta is None else f"ETA {format_duration(eta)}"
    return f"{label}: {done:,}/{total:,} jobs {pct:.1f} %, {day}, {format_duration(elapsed)}, {left}"


class Progress:
    """One replay's status line, rewritten in place at most every `interval` seconds."""

    def __init__(self, write: Callable[[str], object], clock: Callable[[], float], *, interval: float = 0.5,
                 window: float = 30.0) -> None:
        self.write = write
        self.clock = clock
        self.interval = interval
        self.window = window
        self.label = ""
        self.span = 0.0
        self.started = 0.0
        self.last = -float("inf")
        self.eta = Eta(window)
        self.shown = False

    def start(self, label: str, span_seconds: float) -> Callable[[int, int, float], None]:
        """Begin a replay (label, e.g. `gpuorch (1/7)`; the trace's span); returns the engine's callback."""
        self.label, self.span = label, span_seconds
        self.started = self.clock()
        self.last = self.started  # the first line after `interval`: by then there is a rate for the ETA
        self.eta = Eta(self.window)  # its rate starts at the first arrival, not at the replay's set-up
        return self.update

    def update(self, done: int, total: int, sim_seconds: float) -> None:
        now = self.clock()
        if now - self.last < self.interval:
            return
        self.last = now
        self.eta.add(now, done)
        self.write(CLEAR + line(self.label, done, total, sim_seconds, self.span, now - self.started,
                                self.eta.remaining(total)))
        self.shown = True

    def finish(self) -> None:
        """Erase the line, so the table that follows starts on a clean one."""
        if self.shown:
            self.write(CLEAR)
            self.shown = False
