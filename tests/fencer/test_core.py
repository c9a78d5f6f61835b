"""The fencer's pure rules: epochs only grow, exactly one promotion, never by a stale epoch."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuorch_fencer import core
from gpuorch_proto import FenceRecord
from gpuorch_proto import events as ev
from gpuorch_proto.storage import Manifest, attempt_prefix

W = "train-0123456789"
RESULT = f"file:///s/{W}/result/manifest.json"


def outputs(n: int, epoch: int) -> Manifest:
    """The manifest of a complete upload of attempt n (what `publish.prepare` gives)."""
    aid = f"{W}-a{n}"
    return Manifest(workload_id=W, attempt_id=aid, epoch=epoch, store="prod", prefix=attempt_prefix(W, aid), objects=[], total_bytes=0, created_at=0.0)


def promoting(rec: FenceRecord | None, n: int, epoch: int, got: Manifest | str | None = None) -> core.Decision:
    return core.on_promote_requested(rec, promote(n, epoch), 2.0, RESULT, outputs(n, epoch) if got is None else got)


def created(n: int, epoch: int) -> ev.AttemptCreated:
    return ev.AttemptCreated(
        workload_id=W, at=1.0, attempt_id=f"{W}-a{n}", epoch=epoch, cluster="primary", attempt_number=n,
        job_name=f"{W}-a{n}", output_path=f"/s/{W}/attempts/{W}-a{n}", checkpoint_path="/c",
    )


def fence(n: int, epoch: int) -> ev.FenceRequested:
    return ev.FenceRequested(workload_id=W, at=1.0, attempt_id=f"{W}-a{n}", epoch=epoch, cluster="primary", reason="lost")


def promote(n: int, epoch: int) -> ev.PromoteRequested:
    return ev.PromoteRequested(workload_id=W, at=1.0, attempt_id=f"{W}-a{n}", epoch=epoch, cluster="primary", output_path=f"/s/{W}/attempts/{W}-a{n}")


def test_first_attempt_creates_the_record_at_its_epoch() -> None:
    d = core.on_attempt_created(None, created(1, 1), 2.0)
    assert d.record == FenceRecord(epoch=1, current_attempt=f"{W}-a1")
    assert d.events == []


def test_fence_bumps_the_epoch_and_asks_for_deletion() -> None:
    rec = FenceRecord(epoch=1, current_attempt=f"{W}-a1")
    d = core.on_fence_requested(rec, fence(1, 1), 2.0)
    assert d.record is not None and d.record.epoch == 2 and d.record.current_attempt is None
    assert [type(e) for e in d.events] == [ev.Fenced]
    assert d.events[0].new_epoch == 2  # type: ignore[attr-defined]
    assert d.delete_job


def test_fence_of_an_already_stale_attempt_does_not_bump_again() -> None:
    rec = FenceRecord(epoch=3)
    d = core.on_fence_requested(rec, fence(1, 1), 2.0)
    assert d.record is None
    assert d.events[0].new_epoch == 3  # type: ignore[attr-defined]


def test_current_attempt_is_promoted_once_with_its_result_path() -> None:
    rec = FenceRecord(epoch=1, current_attempt=f"{W}-a1")
    d = promoting(rec, 1, 1)
    assert d.record is not None and d.record.promoted_attempt == f"{W}-a1" and d.record.result_path == RESULT
    assert d.promote == core.Publish(RESULT, outputs(1, 1))
    promoted = d.events[0]
    assert isinstance(promoted, ev.Promoted) and promoted.result_path == RESULT
    again = promoting(d.record, 1, 1)
    assert again.record is None and isinstance(again.events[0], ev.Promoted)  # idempotent re-emit
    assert again.promote == core.Publish(RESULT, outputs(1, 1)), "the manifest is written again (create-only: a no-op)"
    lost = promoting(d.record, 1, 1, "no upload record")
    assert lost.promote == core.Publish(RESULT, None) and isinstance(lost.events[0], ev.Promoted), "read back what is there"


def test_an_incomplete_upload_is_rejected_with_its_reason_and_fenced_so_a_replacement_may_start() -> None:
    rec = FenceRecord(epoch=1, current_attempt=f"{W}-a1")
    d = promoting(rec, 1, 1, "no upload record: the attempt's upload did not complete (nothing is published)")
    assert d.promote is None and d.delete_job
    assert d.record == FenceRecord(epoch=2, current_attempt=None), "the attempt can never publish: its epoch is over"
    assert [type(x) for x in d.events] == [ev.PromotionRejected, ev.Fenced, ev.ReplacementAllowed]
    assert "no upload record" in d.events[0].reason  # type: ignore[attr-defined]
    assert d.events[2].how == "stopped"  # type: ignore[attr-defined]
    # a stale request is refused for being stale, whatever its upload
    stale = promoting(FenceRecord(epoch=3), 1, 1, "no upload record")
    assert stale.record is None and "stale epoch 1" in stale.events[0].reason  # type: ignore[attr-defined]


def test_a_manifest_conflict_is_recorded_as_a_rejection_with_its_reason() -> None:
    e = core.manifest_conflict(promote(1, 1), 1, "it holds x-a9 at epoch 4", 2.0)
    assert isinstance(e, ev.PromotionRejected) and e.reason == "result manifest conflict: it holds x-a9 at epoch 4"
    assert e.event_id == f"{W}-a1.promotion-rejected"


def test_attempt_and_result_urls_are_the_stores_keys() -> None:
    assert core.attempt_url("s3://b/pfx", W, f"{W}-a1") == f"s3://b/pfx/{W}/attempts/{W}-a1"
    assert core.result_url("file:///var/stores/prod", W) == f"file:///var/stores/prod/{W}/result/manifest.json"
    assert core.attempt_url("s3://b/pfx", "..", f"{W}-a1") is None
    assert core.attempt_url("/not/a/url", W, f"{W}-a1") is None


@pytest.mark.parametrize(
    ("record", "attempt", "epoch", "why"),
    [
        pytest.param(FenceRecord(epoch=2), 1, 1, "stale epoch 1", id="stale-epoch-after-fence"),
        pytest.param(FenceRecord(epoch=2, promoted_attempt=f"{W}-a2", promoted_epoch=2), 1, 2, "already promoted", id="second-promotion"),
        pytest.param(FenceRecord(epoch=2, current_attempt=f"{W}-a2"), 3, 2, "is current", id="not-the-current-attempt"),
    ],
)
def test_promotion_rejected(record: FenceRecord, attempt: int, epoch: int, why: str) -> None:
    d = promoting(record, attempt, epoch)
    assert d.record is None and d.promote is None and d.delete_job
    assert isinstance(d.events[0], ev.PromotionRejected)
    assert why in d.events[0].reason


def test_attempt_born_stale_is_fenced() -> None:
    d = core.on_attempt_created(FenceRecord(epoch=3), created(2, 2), 2.0)
    assert d.record is None and d.delete_job and isinstance(d.events[0], ev.Fenced)


def test_orphan_rules() -> None:
    rec = FenceRecord(epoch=2, current_attempt=f"{W}-a2")
    assert core.is_orphan(rec, f"{W}-a1", 1, True) == "stale epoch 1 < 2"
    assert core.is_orphan(rec, f"{W}-a2", 2, True) is None
    assert core.is_orphan(None, "x-a1", 1, False) == "unknown attempt x-a1"


ops = st.lists(
    st.tuples(st.sampled_from(["create", "fence", "promote", "promote-cut"]), st.integers(1, 4), st.integers(1, 5)),
    max_size=40,
)


@settings(max_examples=300, deadline=None)
@given(ops)
def test_any_interleaving_promotes_at_most_one_attempt_and_never_a_stale_one(steps: list[tuple[str, int, int]]) -> None:
    rec: FenceRecord | None = None
    promoted: set[str] = set()
    epochs = [0]
    for op, n, epoch in steps:
        if op == "create":
            d = core.on_attempt_created(rec, created(n, epoch), 0.0)
        elif op == "fence":
            d = core.on_fence_requested(rec, fence(n, epoch), 0.0)
        else:
            before = rec
            d = promoting(rec, n, epoch, "upload cut" if op == "promote-cut" else None)
            if d.promote is not None:
                assert before is None or before.epoch == epoch or before.promoted_attempt == f"{W}-a{n}"
                promoted.add(f"{W}-a{n}")
        if d.record is not None:
            rec = d.record
            assert rec.epoch >= epochs[-1], "the epoch never goes back"
            epochs.append(rec.epoch)
    assert len(promoted) <= 1


def _reason(rec: FenceRecord | None = None, *, attempt: int = 1, epoch: int = 1, known_attempt: bool = False, known_workload: bool = False, age: float = 0.0, status: str | None = None) -> str | None:
    return core.orphan_reason(rec, f"{W}-a{attempt}", epoch, known_attempt=known_attempt, known_workload=known_workload, age=age, workload_status=status)


def test_a_job_of_a_workload_the_log_never_saw_goes_after_the_short_grace() -> None:
    assert _reason(age=core.ORPHAN_GRACE_UNKNOWN - 0.1) is None
    why = _reason(age=core.ORPHAN_GRACE_UNKNOWN)
    assert why is not None and why.startswith("unknown workload")


def test_an_unknown_attempt_of_a_known_workload_gets_the_long_grace() -> None:
    # its attempt-created may still be on its way from the dispatcher
    assert core.ORPHAN_GRACE > core.ORPHAN_GRACE_UNKNOWN
    assert _reason(known_workload=True, age=core.ORPHAN_GRACE_UNKNOWN + 1) is None
    assert _reason(known_workload=True, age=core.ORPHAN_GRACE) == f"unknown attempt {W}-a1 (30s old)"


def test_known_attempts_are_judged_by_epoch_and_by_the_workloads_end() -> None:
    rec = FenceRecord(epoch=2, current_attempt=f"{W}-a2")
    assert _reason(rec, attempt=2, epoch=2, known_attempt=True, known_workload=True, status="running") is None
    assert _reason(rec, attempt=1, epoch=1, known_attempt=True, known_workload=True, status="running") == "stale epoch 1 < 2"
    for status in ("cancelled", "completed", "failed"):
        assert _reason(rec, attempt=2, epoch=2, known_attempt=True, known_workload=True, status=status) == f"workload {status}"


def test_orphans_are_recorded_under_a_valid_workload_id() -> None:
    assert core.orphan_workload_id("ghost-123", "beta", "gpuorch", "ghost-123-a1") == "ghost-123"
    derived = core.orphan_workload_id("Not/A Token", "beta", "gpuorch", "x")
    assert derived.startswith("orphan-") and derived == core.orphan_workload_id("", "beta", "gpuorch", "x")
    assert derived != core.orphan_workload_id("", "alpha", "gpuorch", "x")
    evt = core.orphan_deleted(derived, "x", 0, "beta", "x", "unknown workload", 1.0)
    assert evt.event_id == f"{derived}.orphan-deleted.x"


def test_lease_after_a_restart_runs_from_the_fence_request_not_from_now() -> None:
    assert core.lease_expires_at(1000.0, "10h", 600) == 1000.0 + 60.0
    assert not core.cancellation_due(core.lease_expires_at(1000.0, "10h", 600), 1059.0)
    assert core.cancellation_due(core.lease_expires_at(1000.0, "10h", 600), 1060.0)


# ---- the fencer decides when a replacement may start (issue 10, item 3) ----------------------


@pytest.mark.parametrize(
    ("policy", "stopped", "at_bump"),
    [
        pytest.param("strict", False, None, id="strict-running-waits-for-confirmation"),
        pytest.param("fast", False, "fast", id="fast-may-start-at-the-bump"),
        pytest.param("strict", True, "stopped", id="stopped-pods-need-no-confirmation"),
        pytest.param("fast", True, "stopped", id="stopped-and-fast"),
    ],
)
def test_replacement_verdict_at_the_epoch_bump(policy: str, stopped: bool, at_bump: str | None) -> None:
    e = ev.FenceRequested(workload_id=W, at=1.0, attempt_id=f"{W}-a1", epoch=1, cluster="primary", reason="lost", policy=policy, stopped=stopped)  # type: ignore[arg-type]
    d = core.on_fence_requested(FenceRecord(epoch=1, current_attempt=f"{W}-a1"), e, 2.0)
    allowed = [x for x in d.events if isinstance(x, ev.ReplacementAllowed)]
    assert [x.how for x in allowed] == ([at_bump] if at_bump else [])
    assert isinstance(d.events[0], ev.Fenced)  # the bump comes first: a replacement never precedes it
    # strict, still running: the verdict comes with the confirmation, and only then
    evts = core.confirm(e, 3.0, "deleted", replacement_pending=at_bump is None)
    assert [type(x) for x in evts] == [ev.CancelConfirmed] + ([ev.ReplacementAllowed] if at_bump is None else [])


def test_lease_expiry_allows_the_strict_replacement_as_lease_expired() -> None:
    evts = core.confirm(fence(1, 1), 9.0, "lease-expired", replacement_pending=True)
    assert isinstance(evts[1], ev.ReplacementAllowed) and evts[1].how == "lease-expired"


# --- the pursuit rules (the shell and the simulation call these; neither keeps a copy) ---------


def _pursuit(**kw: object) -> core.Pursuit:
    base: dict[str, object] = dict(workload_id="w", attempt_id="w-a1", epoch=1, cluster="alpha", namespace="gpuorch",
                                   job_name="w-a1", lease_expires_at=100.0)
    base.update(kw)
    return core.Pursuit(**base)  # type: ignore[arg-type]


def test_an_unreachable_attempt_is_presumed_dead_only_after_its_lease() -> None:
    p = _pursuit(replacement_pending=True)
    assert core.pursuit_unreachable(p, False, now=99.0) == ([], p)  # lease still running
    assert core.pursuit_unreachable(p, True, now=200.0) == ([], p)  # its end is already on record
    assert core.pursuit_unreachable(p, None, now=200.0) == ([], p)  # not in the log's view
    evts, after = core.pursuit_unreachable(p, False, now=200.0)
    assert [type(e) for e in evts] == [ev.CancelConfirmed, ev.ReplacementAllowed]
    assert isinstance(evts[0], ev.CancelConfirmed) and evts[0].how == "lease-expired"
    assert after.orphan_reason == core.LEASE_EXPIRED_ORPHAN and not after.replacement_pending
    assert p.orphan_reason is None  # the input is not changed
    assert core.pursuit_unreachable(after, False, now=300.0) == ([], after)  # once


def test_a_confirmed_pursuit_records_the_attempt_or_the_orphan() -> None:
    evts = core.pursuit_confirmed(_pursuit(), "deleted", now=5.0)
    assert [type(e) for e in evts] == [ev.CancelConfirmed]
    orphan = core.pursuit_confirmed(_pursuit(orphan_reason="stale epoch", replacement_pending=True), "deleted", now=5.0)
    assert [type(e) for e in orphan] == [ev.OrphanDeleted, ev.ReplacementAllowed]
    assert isinstance(orphan[0], ev.OrphanDeleted) and orphan[0].reason == "stale epoch"


def test_a_found_job_is_read_from_its_labels() -> None:
    from gpuorch_proto.k8s import LABEL_ATTEMPT, LABEL_EPOCH, LABEL_WORKLOAD

    f = core.found_job({LABEL_WORKLOAD: "w", LABEL_ATTEMPT: "w-a2", LABEL_EPOCH: "3"}, "alpha", "gpuorch", "job")
    assert (f.workload_id, f.attempt_id, f.epoch) == ("w", "w-a2", 3)
    bad = core.found_job({LABEL_WORKLOAD: "w", LABEL_EPOCH: "three"}, "alpha", "gpuorch", "job")
    assert (bad.attempt_id, bad.epoch) == ("job", 0)  # no attempt label: the Job's name; bad epoch: the stalest


def test_after_a_restart_every_fenced_attempt_not_confirmed_gone_is_pursued_from_its_fence_request() -> None:
    from gpuorch.projection import Projection
    from tests.support.builders import make_workload

    wl = make_workload("train")
    wid = "w1"
    proj = Projection()
    base = dict(workload_id=wid, cluster="alpha")

    def created_(n: int) -> ev.AttemptCreated:
        return ev.AttemptCreated(**base, at=1.0, attempt_id=f"{wid}-a{n}", epoch=n, attempt_number=n,  # type: ignore[arg-type]
                                 job_name=f"{wid}-a{n}", output_path="/o", checkpoint_path="/c")

    evts: list[ev.Base] = [
        ev.Submitted(workload_id=wid, at=0.0, workload=wl), created_(1), created_(2),
        ev.FenceRequested(**base, at=50.0, attempt_id=f"{wid}-a1", epoch=1, reason="lost"),  # type: ignore[arg-type]
        ev.Fenced(**base, at=50.5, attempt_id=f"{wid}-a1", epoch=1, new_epoch=2),  # type: ignore[arg-type]
        ev.FenceRequested(**base, at=60.0, attempt_id=f"{wid}-a2", epoch=2, reason="cancel"),  # type: ignore[arg-type]
        ev.Fenced(**base, at=60.5, attempt_id=f"{wid}-a2", epoch=2, new_epoch=3),  # type: ignore[arg-type]
        ev.CancelConfirmed(**base, at=61.0, attempt_id=f"{wid}-a2", epoch=2),  # type: ignore[arg-type]
    ]
    for seq, e in enumerate(evts, 1):
        proj.apply(e, seq)
    got = core.pursuits_to_resume(proj.workloads.values(), time_scale=1.0)
    assert [p.attempt_id for p in got] == [f"{wid}-a1"]  # a2 is confirmed gone; a live attempt is not pursued
    (p,) = got
    assert p.lease_expires_at == core.lease_expires_at(50.0, wl.spec.lease, 1.0)  # from the request, not from now
    assert p.replacement_pending and p.orphan_reason is None
