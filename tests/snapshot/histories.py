"""Random event histories for the snapshot property tests: a few workloads, each a random run of
lifecycle events (any order: the folds must take whatever the log holds), interleaved at random
with each workload's own events in order, as the stream has them."""

from __future__ import annotations

from collections.abc import Callable

from hypothesis import strategies as st

from gpuorch_proto import Event, RoutingDecision, event_id, k8s
from gpuorch_proto import events as ev
from gpuorch_router.core import RouterState, decide
from gpuorch_router.policy import build_index
from tests.support.builders import NOW, make_node, make_snapshot, make_workload

WORKLOADS = [make_workload("train", gpus=1), make_workload("big", gpus=8, gpu_memory_gib=80), make_workload("huge", gpus=64)]
_INDEXES = {c: build_index(make_snapshot(c, nodes=[make_node(f"{c}-0")])) for c in ("east", "west")}


def _decision(wid: str, wl_index: int, attempt: int) -> RoutingDecision:
    """A real policy decision (verdicts, checks, estimates), as the router publishes."""
    return decide(RouterState(), WORKLOADS[wl_index], wid, attempt, _INDEXES, NOW)


Maker = Callable[[str, int, int, float], Event]  # (workload id, workload index, attempt number, at)


def _aid(wid: str, n: int) -> str:
    return k8s.attempt_id(wid, n)


def _extra(kind: type[ev.AttemptEvent], wid: str, n: int) -> dict[str, object]:
    """The fields of each attempt event beyond the common ones."""
    out = f"/out/{wid}/{n}"
    return {
        ev.Unschedulable: {"message": "0/3 nodes are available", "permanent": bool(n % 2)},
        ev.Succeeded: {"output_path": out},
        ev.Failed: {"reason": "exit 1", "exit_code": 1, "placement": n == 2},
        ev.Lost: {"reason": "cluster unreachable"},
        ev.FenceRequested: {"reason": "lost"},
        ev.Fenced: {"new_epoch": n + 1},
        ev.CancelConfirmed: {"how": "deleted"},
        ev.PromoteRequested: {"output_path": out},
        ev.Promoted: {"output_path": out, "result_path": f"/res/{wid}"},
        ev.PromotionRejected: {"current_epoch": n + 1, "reason": "stale epoch"},
        ev.OrphanDeleted: {"job_name": f"job-{wid}-{n}", "reason": "stale"},
    }.get(kind, {})


def _attempt(kind: type[ev.AttemptEvent]) -> Maker:
    def make(wid: str, w: int, n: int, at: float) -> Event:
        cluster = "east" if n % 2 else "west"
        return kind(workload_id=wid, at=at, attempt_id=_aid(wid, n), epoch=n, cluster=cluster, **_extra(kind, wid, n))  # type: ignore[arg-type]

    return make


def _created(wid: str, w: int, n: int, at: float) -> Event:
    """Attempts 1 and 3 with the dispatcher's paths (`_attempt_paths`: a compact view derives them
    from the store root and the ids) and its job name (the attempt id); attempt 2 with others."""
    aid = _aid(wid, n)
    if n == 2:
        out, ckpt, job = f"/out/{wid}/{n}", f"/ckpt/{wid}", f"job-{wid}-{n}"
    else:
        out, ckpt, job = f"/store/prod/{wid}/attempts/{aid}", f"/store/ckpt/{wid}/attempts/{aid}/checkpoints", aid
    return ev.AttemptCreated(
        workload_id=wid, at=at, attempt_id=aid, epoch=n, cluster="east" if n % 2 else "west", attempt_number=n,
        job_name=job, output_path=out, checkpoint_path=ckpt,
    )  # fmt: skip


MAKERS: dict[str, Maker] = {
    "submitted": lambda wid, w, n, at: ev.Submitted(event_id=event_id(wid, "submitted"), workload_id=wid, at=at, workload=WORKLOADS[w], idempotency_key=f"key-{wid}"),
    "route-requested": lambda wid, w, n, at: ev.RouteRequested(workload_id=wid, at=at, attempt_number=n, exclude=["east"] if n > 1 else []),
    "routed": lambda wid, w, n, at: ev.Routed(workload_id=wid, at=at, decision=_decision(wid, w, n), attempt_number=n),
    "unroutable": lambda wid, w, n, at: ev.Unroutable(workload_id=wid, at=at, decision=_decision(wid, w, n), attempt_number=n),
    "rejected": lambda wid, w, n, at: ev.Rejected(workload_id=wid, at=at, reason="no cluster", decision=_decision(wid, w, n) if n % 2 else None),
    "attempt-created": _created,
    "unschedulable": _attempt(ev.Unschedulable),
    "admitted": _attempt(ev.Admitted),
    "running": _attempt(ev.Running),
    "succeeded": _attempt(ev.Succeeded),
    "failed": _attempt(ev.Failed),
    "lost": _attempt(ev.Lost),
    "fence-requested": _attempt(ev.FenceRequested),
    "fenced": _attempt(ev.Fenced),
    "cancel-confirmed": _attempt(ev.CancelConfirmed),
    "promote-requested": _attempt(ev.PromoteRequested),
    "orphan-deleted": _attempt(ev.OrphanDeleted),
    "promoted": _attempt(ev.Promoted),
    "promotion-rejected": _attempt(ev.PromotionRejected),
    "completed": lambda wid, w, n, at: ev.Completed(workload_id=wid, at=at, attempt_id=_aid(wid, n), result_path=f"/res/{wid}"),
    "cancel-requested": lambda wid, w, n, at: ev.CancelRequested(workload_id=wid, at=at, reason="user"),
    "cancelled": lambda wid, w, n, at: ev.Cancelled(workload_id=wid, at=at, reason="user"),
    "workload-failed": lambda wid, w, n, at: ev.WorkloadFailed(workload_id=wid, at=at, reason="retry budget spent"),
}

_step = st.tuples(st.sampled_from(sorted(MAKERS)), st.integers(1, 3))


@st.composite
def histories(draw: st.DrawFn, max_workloads: int = 5, max_events: int = 14) -> list[tuple[int, Event]]:
    """`(stream sequence, event)` pairs, sequences 1..n, each workload's events in its order."""
    n_wl = draw(st.integers(1, max_workloads))
    runs: list[list[Event]] = []
    for i in range(n_wl):
        wid = f"w{i}-{draw(st.sampled_from(['a', 'b']))}"
        w = draw(st.integers(0, len(WORKLOADS) - 1))
        steps = draw(st.lists(_step, max_size=max_events))
        if draw(st.booleans()):
            steps = [("submitted", 1), *steps]
        runs.append([MAKERS[kind](wid, w, n, NOW + j) for j, (kind, n) in enumerate(steps)])
    order = draw(st.permutations([i for i, run in enumerate(runs) for _ in run]))
    cursors = [0] * len(runs)
    out: list[tuple[int, Event]] = []
    for i in order:
        out.append((len(out) + 1, runs[i][cursors[i]]))
        cursors[i] += 1
    return out
