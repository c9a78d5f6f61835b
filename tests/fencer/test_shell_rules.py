"""Rules the fencer's shell used to decide itself, now pure in `gpuorch_fencer.core` (issue 29):
defer or refuse a promotion (`promotion_source`, `promotion_gate`), the record a promotion is
decided on when the bucket has none yet (`registered`, `decide_promotion`), what a pursuit's
answers mean (`confirm_how`) and what a decision that deletes a Job pursues (`pursuit_after`)."""

from __future__ import annotations

import pytest

from gpuorch.projection import Projection, WorkloadView
from gpuorch_fencer import core
from gpuorch_proto import FenceRecord
from gpuorch_proto import events as ev
from tests.fencer.test_core import RESULT, W, created, outputs, promote
from tests.support.builders import make_workload

A1 = f"{W}-a1"
STORE_URL = "file:///s"  # the store `prod`'s root URL in these tests (the attempt prefix: /s/<w>/attempts/<a>)


def url_of(store: str) -> str:
    return {"prod": STORE_URL}[store]


def view(*events: ev.Base, store: str = "prod") -> WorkloadView:
    p = Projection()
    p.apply(ev.Submitted(workload_id=W, at=0.0, workload=make_workload(output_store=store)), 1)
    for i, e in enumerate(events, start=2):
        p.apply(e, i)  # type: ignore[arg-type]
    return p.workloads[W]


def succeeded(n: int = 1, epoch: int = 1) -> ev.Succeeded:
    return ev.Succeeded(workload_id=W, at=3.0, attempt_id=f"{W}-a{n}", epoch=epoch, cluster="primary", output_path=f"file:///s/{W}/attempts/{W}-a{n}")


def request(n: int = 1, epoch: int = 1, path: str | None = None) -> ev.PromoteRequested:
    e = promote(n, epoch)
    return ev.PromoteRequested(
        workload_id=W, at=4.0, attempt_id=e.attempt_id, epoch=epoch, cluster="primary",
        output_path=path if path is not None else f"file:///s/{W}/attempts/{W}-a{n}",
    )  # fmt: skip


def gate(v: WorkloadView | None, e: ev.PromoteRequested, known: set[str] | None = None) -> tuple[core.PromotionGate, str | None]:
    store, problem = core.promotion_source(v, e, url_of, {"prod"} if known is None else known)
    return core.promotion_gate(v, e, store, problem), problem


def test_a_promotion_on_record_goes_ahead() -> None:
    assert gate(view(created(1, 1), succeeded()), request()) == ("promote", None)


def test_a_promotion_before_its_attempt_created_waits() -> None:
    """The dispatcher may publish `attempt-created` after the attempt's first events."""
    verdict, problem = gate(view(), request())
    assert verdict == "defer" and problem is not None and "no attempt-created" in problem
    assert gate(None, request())[0] == "defer"  # nor the workload yet


@pytest.mark.parametrize(
    ("events", "e", "known", "why"),
    [
        pytest.param((created(1, 1),), request(), None, "has not succeeded", id="not-succeeded"),
        pytest.param((created(1, 1), succeeded()), request(epoch=2), None, "created at epoch 1, not 2", id="another-epoch"),
        pytest.param((created(1, 1), succeeded()), request(path=f"file:///s/{W}/attempts/other"), None, "is not the attempt's prefix", id="path-elsewhere"),
        pytest.param((created(1, 1), succeeded()), request(), set(), "not in the registry", id="store-not-registered"),
    ],
)
def test_a_promotion_its_records_contradict_is_refused(events: tuple[ev.Base, ...], e: ev.PromoteRequested, known: set[str] | None, why: str) -> None:
    verdict, problem = gate(view(*events), e, known)
    assert verdict == "refuse" and problem is not None and why in problem


def test_without_a_record_the_registration_on_its_way_is_what_the_promotion_is_decided_on() -> None:
    e = request()
    d = core.decide_promotion(None, e, 5.0, RESULT, outputs(1, 1), created_epoch=1)
    assert [type(x) for x in d.events] == [ev.Promoted]
    assert d.record == FenceRecord(epoch=1, current_attempt=A1, promoted_attempt=A1, promoted_epoch=1, result_path=RESULT)
    # the record it stands in for is the one `on_attempt_created` writes
    assert core.registered(None, e, 1) == core.on_attempt_created(None, created(1, 1), 5.0).record
    never = core.decide_promotion(None, e, 5.0, RESULT, outputs(1, 1), created_epoch=None)
    assert [type(x) for x in never.events] == [ev.PromotionRejected] and never.record is None
    # a record in the bucket is the one decided on, whatever the projection says
    rec = FenceRecord(epoch=2)
    assert core.registered(rec, e, 1) is rec
    stale = core.decide_promotion(rec, e, 5.0, RESULT, outputs(1, 1), created_epoch=1)
    assert [type(x) for x in stale.events] == [ev.PromotionRejected] and "stale epoch" in stale.events[0].reason  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("deleted", "pods_left", "job_exists", "known", "how"),
    [
        pytest.param(True, 0, False, True, "deleted", id="our-delete-took-it"),
        pytest.param(False, 0, False, True, "already-gone", id="never-there-for-us"),
        pytest.param(True, 2, None, True, None, id="pods-still-terminating"),
        pytest.param(True, 0, True, True, None, id="job-still-there"),
        pytest.param(True, 0, None, True, None, id="job-not-read"),
        pytest.param(False, 0, None, False, "already-gone", id="cluster-without-a-client"),
    ],
)
def test_what_confirmed_gone_means(deleted: bool, pods_left: int, job_exists: bool | None, known: bool, how: str | None) -> None:
    assert core.confirm_how(deleted=deleted, pods_left=pods_left, job_exists=job_exists, cluster_known=known) == how


def test_a_fence_pursues_until_its_lease_with_the_strict_verdict_pending() -> None:
    v = view(created(1, 1))
    strict = ev.FenceRequested(workload_id=W, at=1.0, attempt_id=A1, epoch=1, cluster="primary", reason="lost", lease_expires_at=99.0)
    d = core.on_fence_requested(FenceRecord(epoch=1, current_attempt=A1), strict, 2.0)
    p = core.pursuit_after(v, strict, d, 2.0)
    assert p is not None and (p.lease_expires_at, p.replacement_pending, p.orphan_reason, p.job_name) == (99.0, True, None, A1)
    stopped = ev.FenceRequested(workload_id=W, at=1.0, attempt_id=A1, epoch=1, cluster="primary", reason="failed", stopped=True)
    d = core.on_fence_requested(FenceRecord(epoch=1, current_attempt=A1), stopped, 2.0)
    after = core.pursuit_after(v, stopped, d, 2.0)
    assert after is not None and not after.replacement_pending  # the bump gave the verdict


def test_a_refused_promotion_pursues_the_job_as_an_orphan_with_the_reasons() -> None:
    e = request()
    d = core.on_promote_requested(FenceRecord(epoch=2), e, 5.0, RESULT, outputs(1, 1))
    p = core.pursuit_after(view(created(1, 1), succeeded()), e, d, 5.0)
    assert p is not None and p.orphan_reason == "promotion rejected: stale epoch 1: the workload's epoch is 2"


def test_nothing_is_pursued_when_no_job_is_to_be_deleted_and_an_unseen_attempt_by_its_id() -> None:
    d = core.on_attempt_created(None, created(1, 1), 2.0)
    assert core.pursuit_after(view(), created(1, 1), d, 2.0) is None
    born_stale = core.on_attempt_created(FenceRecord(epoch=3), created(1, 1), 2.0)  # its Job goes at once
    p = core.pursuit_after(None, created(1, 1), born_stale, 2.0)  # (the projection has not seen it)
    assert p is not None and (p.job_name, p.namespace, p.lease_expires_at, p.orphan_reason) == (A1, "gpuorch", 2.0, None)
