"""`gpuorch submit --dry-run`: the decision the router would make now, by the router's own path.

The CLI reads the event log and the latest snapshot of every cluster (with the subject each came
on) and calls :func:`dry_run`, which builds what the router's decision reads the way the router
builds it and then calls what the router calls:

* each snapshot taken as the router takes it: ``gpuorch.security.receive.trusted_snapshot`` with
  the router's registry (the registry's facts, never the snapshot's; a cluster not in it refused);
* the log folded as the router folds it (``core.replay``, by ``core.fold``, the function
  ``Router.fold`` folds with): ``RouterState`` (route requests with their exclusions and
  checkpoint, a stage's promoted inputs, preemptions), the projection, and the routing history
  learnt from completed workloads (from the log alone, as the router learns);
* the decision by ``core.decide`` through a ``RoutingMemo``, as ``Router.decide`` makes it: the
  exclusions of a lost attempt, the checkpoint to resume, a stage's inputs, a replacement
  yielding to its preemptor and the history all apply.

Which decision: a workload id the log does not know (a new submit) gets its first attempt's; one
it knows (``--key`` names the same workload) gets the attempt it waits a decision for
(``core.pending_attempt``), or none when it waits for none (routed, running, finished, held).
A document that differs from the known one's is what the router refuses.

Not in it: admission (``pipeline.Gate``: queue limits, fair share, holds), which releases a new
workload before its first decision. And what only a router's memory holds can differ: the log
from a state snapshot on, when retention has dropped older events (the CLI may not read the
router's state snapshot), or a history learnt while a cluster had other GPU models than now.
Pure: no I/O, no clock (``now`` is an argument).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from gpuorch.projection import Projection, same_document
from gpuorch.security.receive import trusted_snapshot
from gpuorch_proto import ClusterRegistryEntry, ClusterSnapshot, Event, Names, RoutingDecision, Workload

from . import core
from .policy import RoutingMemo, build_index

__all__ = ["DryRun", "dry_run", "trusted_snapshots"]


@dataclass(frozen=True)
class DryRun:
    """What the router would do with a submit of `workload_id` now."""

    workload_id: str
    attempt: int | None  # the attempt decided (None: none waits a decision)
    decision: RoutingDecision | None  # None: the router would decide nothing now (`note` says why)
    note: str  # in words: which workload, which attempt, or why nothing
    refused: bool = False  # the router refuses this submit (the id names another document)


def trusted_snapshots(
    messages: Iterable[tuple[str, ClusterSnapshot]],
    names: Names,
    registry: Mapping[str, ClusterRegistryEntry] | None,
) -> dict[str, ClusterSnapshot]:
    """The snapshots as the router takes them (`Router.on_snapshot`): by cluster, the later one
    of a cluster replacing an earlier, each through `trusted_snapshot` (refused ones left out)."""
    out: dict[str, ClusterSnapshot] = {}
    for subject, snap in messages:
        trusted, _ = trusted_snapshot(snap, subject, names, registry)
        if trusted is not None:
            out[trusted.cluster] = trusted
    return out


def dry_run(
    workload: Workload,
    workload_id: str,
    events: Iterable[tuple[int, Event]],
    snapshots: Mapping[str, ClusterSnapshot],
    now: float,
    *,
    projection: Projection,
    time_scale: float = 1.0,
) -> DryRun:
    """The router's decision for a submit of `workload` as `workload_id` at `now` (module doc).

    `events`: the log, (stream sequence, event); `snapshots`: as the router takes them
    (`trusted_snapshots`); `projection`: empty, built as the router builds its own
    (`Follower.of(tuning).projection`); `time_scale`: the registry's."""
    books = core.replay(events, projection, time_scale)
    view = books.projection.get(workload_id)
    wl, attempt = workload, 1
    note = f"a new workload {workload_id}: its first routing decision (once admission releases it)"
    if view is not None and view.workload is not None:
        if not same_document(view, workload):
            why = f"workload {workload_id} exists with a different body: the router refuses this submit (a message never changes an existing workload)"  # fmt: skip
            return DryRun(workload_id, None, None, why, refused=True)
        pending = core.pending_attempt(view)
        if pending is None:
            why = f"workload {workload_id} exists ({view.status}) and waits for no routing decision: the router decides nothing for it now; its last decision: `gpuorch explain {workload_id}`"  # fmt: skip
            return DryRun(workload_id, None, None, why)
        wl, attempt = view.workload, pending
        note = f"workload {workload_id} exists ({view.status}): attempt {attempt}, as the router decides it now"
    indexes = {name: build_index(snap) for name, snap in snapshots.items()}
    decision = core.decide(books.state, wl, workload_id, attempt, indexes, now, history=books.history, memo=RoutingMemo())
    return DryRun(workload_id, attempt, decision, note)
