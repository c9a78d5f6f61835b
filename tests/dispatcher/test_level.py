"""Level-triggered (issue 29 item 2): the dispatcher's event path only folds; every effect is
decided by `core.reconcile` from the folded view. Each rule that moved out of the old per-event
handler is checked here on the pure core: what the fold must keep for it (a preemption request,
the fencer's verdict), the effect `reconcile` then asks for, and that it is asked once: an effect
re-asked before its echo is folded keeps its event id, so the bus drops it."""

from __future__ import annotations

import msgspec
import pytest

from gpuorch.projection import Projection, WorkloadView, dump_projection, load_projection
from gpuorch_dispatcher import core
from gpuorch_proto import events as ev
from tests.dispatcher.test_core import (
    W,
    _allowed,
    _confirmed,
    _created,
    _emitted,
    _failed,
    _fence_req,
    _fenced,
    _lost,
    env,
    routed,
    wl,
)

A1 = f"{W}-a1"
BASE = {"workload_id": W, "attempt_id": A1, "epoch": 1, "cluster": "primary"}


class Log:
    """The event stream as the dispatcher sees it: a projection it folds each event into before it
    asks `reconcile`, and the bus's de-duplication by event id (`Nats-Msg-Id`)."""

    def __init__(self, *events: ev.Base, **spec: object) -> None:
        self.p = Projection()
        self.stored: list[ev.Base] = []
        self.asked: dict[str, list[ev.Base]] = {}  # event id -> every publish of it
        self.publish(ev.Submitted(workload_id=W, at=0.0, workload=wl(**spec)), *events)

    @property
    def view(self) -> WorkloadView:
        return self.p.workloads[W]

    def publish(self, *events: ev.Base) -> None:
        for e in events:
            if e.event_id:
                self.asked.setdefault(e.event_id, []).append(e)
                if len(self.asked[e.event_id]) > 1:
                    continue  # a duplicate id: the bus drops it
            self.stored.append(e)
            self.p.apply(e, len(self.stored))  # type: ignore[arg-type]

    def handle(self, e: ev.Base, now: float) -> list[core.Action]:
        """The shell's event path: `e` is folded (published), then `reconcile` decides."""
        self.publish(e)
        return core.reconcile(self.view, now, env())

    def kinds(self) -> list[type]:
        return [type(e) for e in self.stored]


def _preemption(at: float = 3.0) -> ev.PreemptionRequested:
    return ev.PreemptionRequested(
        at=at, preemptor="hi", preemptor_priority=10, priority=0, reason="preempted by hi (priority 10) on primary", **BASE
    )  # type: ignore[arg-type]


def _running() -> ev.Running:
    return ev.Running(at=2.0, **BASE)  # type: ignore[arg-type]


INTERRUPTIBLE = {"preemptible": True, "checkpoint": {"path": "ckpt", "portable": True}}


# ---- preemption-requested: folded on the attempt, fenced by reconcile ------------------------------


def test_a_preemption_request_is_folded_on_the_live_attempt_and_reconcile_fences_it_once() -> None:
    log = Log(routed(1), _created(1, 1), _running(), **INTERRUPTIBLE)
    assert core.reconcile(log.view, 2.5, env()) == []
    acts = log.handle(_preemption(), 3.0)
    a = log.view.attempts[A1]
    assert a.times["preemption-requested"] == 3.0 and a.reason == _preemption().reason
    (fence,) = _emitted(acts)
    assert isinstance(fence, ev.FenceRequested) and fence.reason == _preemption().reason and not fence.stopped
    log.publish(fence)
    assert core.reconcile(log.view, 3.5, env()) == [], "asked once"


def test_a_preemption_request_for_an_attempt_that_ended_changes_nothing_of_it() -> None:
    log = Log(routed(1), _created(1, 1), _running(), _failed(1, at=2.5), _fence_req(1), **INTERRUPTIBLE)
    log.handle(_preemption(), 3.0)
    a = log.view.attempts[A1]
    assert "preemption-requested" not in a.times and a.reason == "boom", "its failure stays its reason"


@pytest.mark.parametrize(
    ("spec", "cancel", "fenced_as"),
    [
        pytest.param({"preemptible": False}, False, None, id="not-interruptible"),
        pytest.param(INTERRUPTIBLE, True, "cancel: user", id="cancel-under-way"),
    ],
)
def test_a_preemption_request_fences_only_interruptible_work_outside_a_cancel(
    spec: dict, cancel: bool, fenced_as: str | None
) -> None:
    log = Log(routed(1), _created(1, 1), _running(), **spec)  # type: ignore[arg-type]
    if cancel:
        log.publish(ev.CancelRequested(workload_id=W, at=2.8, reason="user"))
    acts = log.handle(_preemption(), 3.0)
    assert [e.reason for e in _emitted(acts) if isinstance(e, ev.FenceRequested)] == ([fenced_as] if fenced_as else [])


# ---- lost and failed: fenced whatever the workload's state ----------------------------------------


def test_a_lost_attempt_is_fenced_with_its_loss_even_after_the_workload_ended() -> None:
    log = Log(routed(1), _created(1, 1), _running(), ev.WorkloadFailed(workload_id=W, at=2.5, reason="x"))
    (fence,) = _emitted(log.handle(_lost(1), 3.0))
    assert isinstance(fence, ev.FenceRequested) and fence.reason == "lost: partition"


@pytest.mark.parametrize("ended", ["completed", "failed"])
def test_an_attempt_created_after_the_workload_ended_is_fenced(ended: str) -> None:
    end: ev.Base = (
        ev.Completed(workload_id=W, at=5.0, attempt_id=f"{W}-a0", result_path="/r")
        if ended == "completed"
        else ev.WorkloadFailed(workload_id=W, at=5.0, reason="budget")
    )
    log = Log(routed(1), end)
    (fence,) = _emitted(log.handle(_created(1, 1), 6.0))
    assert isinstance(fence, ev.FenceRequested) and fence.reason == f"cancel: attempt created after the workload was {ended}"


# ---- the cancel's end: whichever event confirmed the last attempt ---------------------------------


@pytest.mark.parametrize("last", ["cancel-confirmed", "orphan-deleted", "promotion-rejected"])
def test_a_cancel_ends_once_reconcile_sees_every_attempt_gone(last: str) -> None:
    succeeded = ev.Succeeded(at=2.0, output_path="/o", **BASE)  # type: ignore[arg-type]
    log = Log(routed(1), _created(1, 1), succeeded, ev.PromoteRequested(at=2.1, output_path="/o", **BASE))  # type: ignore[arg-type]
    log.publish(ev.CancelRequested(workload_id=W, at=3.0, reason="user"), _fence_req(1, at=3.0))
    assert core.reconcile(log.view, 3.5, env()) == [], "the succeeded attempt could still publish"
    end = {
        "cancel-confirmed": _confirmed(1),
        "orphan-deleted": ev.OrphanDeleted(at=4.0, job_name=A1, reason="stale", **BASE),  # type: ignore[arg-type]
        "promotion-rejected": ev.PromotionRejected(at=4.0, current_epoch=2, reason="stale", **BASE),  # type: ignore[arg-type]
    }[last]
    (cancelled,) = _emitted(log.handle(end, 4.0))
    assert isinstance(cancelled, ev.Cancelled) and cancelled.event_id == f"{W}.cancelled"
    assert cancelled.reason == "cancelled; every attempt confirmed gone"


# ---- a burst before the echo: the same ids again, dropped by the bus -------------------------------


def test_a_burst_of_events_before_the_echo_stores_each_effect_once() -> None:
    """Attempt 1 fails for good; before the dispatcher's own fence request and `workload-failed`
    come back, more events of the workload arrive (its first-step marker, a late `running`, the
    preemption the router had planned). Each is folded and `reconcile` asks again what the view
    does not show yet: with the same event ids, so the stream stores each effect once, as first
    decided; once the echoes are folded nothing more is asked."""
    log = Log(routed(1), _created(1, 1), _running(), retry={"budget": 0}, **INTERRUPTIBLE)
    burst: list[ev.Base] = [
        _failed(1, at=10.0, code=1),
        ev.ComputeStarted(at=10.1, started_at=10.05, **BASE),  # type: ignore[arg-type]
        ev.Running(at=10.2, **BASE),  # type: ignore[arg-type]
        _preemption(at=10.3),
    ]
    decided: list[list[ev.Base]] = []
    for i, e in enumerate(burst):  # every event of the burst is in the stream before any echo
        log.publish(e)
        decided.append(_emitted(core.reconcile(log.view, 11.0 + i, env())))
    for out in decided:
        log.publish(*out)
    assert log.kinds().count(ev.FenceRequested) == 1 and log.kinds().count(ev.WorkloadFailed) == 1
    first = decided[0]
    assert [type(e) for e in first] == [ev.FenceRequested, ev.WorkloadFailed]
    stored = [e for e in log.stored if isinstance(e, ev.FenceRequested | ev.WorkloadFailed)]
    assert stored == first, "the first decision is the one on record"
    for out in decided[1:]:  # the later asks: the same ids, the same reasons
        assert [(e.event_id, type(e), getattr(e, "reason", "")) for e in out] == [
            (e.event_id, type(e), getattr(e, "reason", "")) for e in first
        ]
    assert core.reconcile(log.view, 20.0, env()) == []
    assert sum(len(v) - 1 for v in log.asked.values()) == 2 * (len(burst) - 1)  # what the bus dropped


# ---- the fold's additions are compatible with the snapshot format ---------------------------------


def test_the_folds_additions_survive_a_snapshot_and_an_older_snapshot_loads_without_them() -> None:
    log = Log(routed(1), _created(1, 1), _failed(1, code=1), _fence_req(1), _fenced(1), _allowed(1, how="fast"))
    assert log.view.attempts[A1].replacement_reason == "fast"
    cancelled = Log(ev.CancelRequested(workload_id=W, at=1.0, reason="mine"), ev.CancelRequested(workload_id=W, at=2.0, reason="again"))
    assert cancelled.view.cancel_reason == "mine", "the first cancel's reason"
    assert load_projection(dump_projection(cancelled.p)).workloads[W].cancel_reason == "mine"
    restored = load_projection(dump_projection(log.p))
    assert restored.workloads[W].attempts[A1].replacement_reason == "fast"
    older = msgspec.msgpack.decode(dump_projection(log.p))
    del older["workloads"][W]["cancel_reason"]  # as a release before these fields wrote them
    for a in older["workloads"][W]["attempts"].values():
        del a["replacement_reason"]
    loaded = load_projection(msgspec.msgpack.encode(older))
    assert loaded.workloads[W].attempts[A1].replacement_reason == "" and loaded.workloads[W].cancel_reason == ""
    assert core.reconcile(loaded.workloads[W], 500.0, env())  # the replacement is still asked, with a plain reason
    (rr,) = [e for e in _emitted(core.reconcile(loaded.workloads[W], 500.0, env())) if isinstance(e, ev.RouteRequested)]
    assert f"replacing {A1} (failed): allowed by the fencer;" in rr.reason


# ---- a cancel under way needs an owner, as a routed workload does -----------------------------------


def test_a_workload_needs_an_owner_while_routed_or_cancelling_and_not_once_it_ended() -> None:
    """The cancel's end is `reconcile`'s to record, by the owner: a workload cancelled before it
    was routed is claimed at start-up and taken over from a dead owner too (`needs_owner`)."""
    log = Log()
    assert not core.needs_owner(log.view), "submitted: the router's, nothing of the dispatcher's yet"
    (asked,) = _emitted(core.on_cancel(log.view, W, "user", 1.0))
    log.publish(asked)
    assert core.needs_owner(log.view)
    log.publish(*_emitted(core.reconcile(log.view, 1.5, env())))
    assert log.view.status == "cancelled" and not core.needs_owner(log.view)
    assert core.needs_owner(Log(routed(1)).view)
