"""When a periodic full pass (a resync) is due: every `every` passes, or less often after a costly one.

The services follow what changed (informer changes, folded events, due clocks) and, as
client-go's informers do with their resync period, now and then look at everything anyway: a
safety net for whatever the change tracking could miss. A full pass costs what the state
holds: at 10,000 pending workloads the dispatcher's watch took tens of seconds per full pass
and, at every 20 ticks, was doing one nearly all the time (docs/performance.md). So, as the state
snapshots do (`gpuorch.runtime.snapshot`, with this same `COST_SHARE`), the next full pass waits at least
`share` times as long as the last one took: its cost stays within about 1/share of the time,
and a small state (tests, a quiet system) keeps the period it always had.

Pure (counts, times in, a decision out); the service measures how long its pass took.
"""

from __future__ import annotations

from dataclasses import dataclass

COST_SHARE = 30.0  # a full pass (a state snapshot too) waits at least this many times as long as the last one took


@dataclass
class Resync:
    """The pacing of one loop's full passes. `every`: passes from one full pass to the next at
    least (the first pass is full); `share`: see the module doc."""

    every: int
    share: float = COST_SHARE
    passes: int = 0  # passes so far
    last_full: int = 0  # the pass number of the latest full pass (0: none yet)
    not_before: float = 0.0  # no full pass before this time (set from the last one's cost)

    def full(self, now: float) -> bool:
        """Count a pass starting at `now`; True when it is to be a full one."""
        self.passes += 1
        if self.last_full == 0 or (self.passes - self.last_full >= self.every and now >= self.not_before):
            self.last_full = self.passes
            return True
        return False

    def took(self, started: float, seconds: float) -> None:
        """The full pass that started at `started` took `seconds`: the next waits for its share."""
        self.not_before = started + self.share * max(0.0, seconds)

    def again(self) -> None:
        """Make the next pass a full one (a cache was re-listed, a cluster came back)."""
        self.last_full, self.not_before = 0, 0.0
