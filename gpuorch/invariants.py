"""The safety invariants, checked from the event stream alone (plus the Jobs left on clusters).

1. At most one promoted attempt per workload.
2. No promotion by a stale epoch: an attempt promoted after its epoch was fenced is a violation.
3. Every submitted workload ends in a terminal state, or shows why it is waiting.
4. No orphaned Jobs after cancellation (or completion): no Job of a finished workload remains.

Pure: it takes events in stream order and returns violations with explanations.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from gpuorch.projection import Projection
from gpuorch_proto import Event
from gpuorch_proto import events as ev


@dataclass(frozen=True)
class Violation:
    invariant: str
    workload_id: str
    detail: str


def check(
    events: Iterable[tuple[int, Event]],
    *,
    jobs: Mapping[str, Iterable[tuple[str, str]]] | None = None,
    require_terminal: bool = True,
) -> list[Violation]:
    """`events`: (stream seq, event) in order; `jobs`: cluster -> (workload id, job name) still present."""
    out: list[Violation] = []
    promoted: dict[str, set[str]] = {}
    fenced: dict[str, set[str]] = {}  # workload -> attempts whose epoch went stale
    epoch: dict[str, int] = {}
    p = Projection()
    for seq, e in events:
        p.apply(e, seq)
        wid = e.workload_id
        if isinstance(e, ev.Fenced):
            fenced.setdefault(wid, set()).add(e.attempt_id)
            epoch[wid] = max(epoch.get(wid, 1), e.new_epoch)
        elif isinstance(e, ev.Promoted):
            s = promoted.setdefault(wid, set())
            s.add(e.attempt_id)
            if len(s) > 1:
                out.append(Violation("one-promotion", wid, f"attempts {sorted(s)} were all promoted"))
            if e.attempt_id in fenced.get(wid, set()) or e.epoch < epoch.get(wid, 1):
                out.append(Violation("no-stale-promotion", wid, f"{e.attempt_id} promoted at epoch {e.epoch} after the epoch moved to {epoch.get(wid, 1)}"))
    for wid, v in p.workloads.items():
        if v.workload is None and v.status != "rejected":
            continue  # events of a workload whose submit we did not see (another prefix)
        if require_terminal and not v.terminal:
            waiting_with_reason = v.status == "waiting" and bool(v.reason)
            if not waiting_with_reason:
                out.append(Violation("terminal-or-waiting", wid, f"status {v.status!r}: {v.reason or 'no reason given'}"))
    for cluster, present in (jobs or {}).items():
        for wid, job in present:
            owner = p.get(wid)
            if owner is None:
                out.append(Violation("no-orphans", wid, f"job {job} on {cluster} belongs to no known workload"))
            elif owner.terminal:
                out.append(Violation("no-orphans", wid, f"job {job} still on {cluster} after the workload {owner.status}"))
    return out
