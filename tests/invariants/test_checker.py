"""The invariant checker finds each kind of violation (and passes a clean history)."""

from __future__ import annotations

import pytest

from gpuorch.invariants import check, check_manifests
from gpuorch_proto import RoutingDecision, workload_from_obj
from gpuorch_proto import events as ev
from gpuorch_proto.storage import Manifest

W = "w-0000000001"
WL = workload_from_obj({"metadata": {"name": "w"}, "spec": {"image": "x@sha256:" + "0" * 64, "command": ["true"]}})


def a(n: int, epoch: int) -> dict[str, object]:
    return {"workload_id": W, "at": float(n), "attempt_id": f"{W}-a{n}", "epoch": epoch, "cluster": "c"}


def base() -> list[ev.Base]:
    d = RoutingDecision(workload_id=W, decided_at=0.0, outcome="routed", cluster="c", summary="s")
    return [ev.Submitted(workload_id=W, at=0.0, workload=WL), ev.Routed(workload_id=W, at=0.0, decision=d)]


def seq(events: list[ev.Base]) -> list[tuple[int, ev.Base]]:
    return list(enumerate(events, start=1))


def test_clean_history_has_no_violation() -> None:
    h = [*base(), ev.Promoted(output_path="/o", result_path="/r", **a(1, 1)), ev.Completed(workload_id=W, at=3.0, attempt_id=f"{W}-a1", result_path="/r")]
    assert check(seq(h)) == []


def test_two_promotions_are_a_violation() -> None:
    h = [*base(), ev.Promoted(output_path="/o", result_path="/r", **a(1, 1)), ev.Promoted(output_path="/o", result_path="/r", **a(2, 1)),
         ev.Completed(workload_id=W, at=3.0, attempt_id=f"{W}-a1", result_path="/r")]
    assert [v.invariant for v in check(seq(h))] == ["one-promotion"]


def test_promotion_after_fence_is_a_violation() -> None:
    h = [*base(), ev.Fenced(new_epoch=2, **a(1, 1)), ev.Promoted(output_path="/o", result_path="/r", **a(1, 1)),
         ev.Completed(workload_id=W, at=3.0, attempt_id=f"{W}-a1", result_path="/r")]
    assert [v.invariant for v in check(seq(h))] == ["no-stale-promotion"]


def test_workload_neither_terminal_nor_waiting_is_a_violation() -> None:
    h = [*base(), ev.AttemptCreated(attempt_number=1, job_name="j", output_path="/o", checkpoint_path="/c", **a(1, 1))]
    assert [v.invariant for v in check(seq(h))] == ["terminal-or-waiting"]
    d = RoutingDecision(workload_id=W, decided_at=0.0, outcome="waiting", summary="all clusters unreachable")
    waiting = [ev.Submitted(workload_id=W, at=0.0, workload=WL), ev.Unroutable(workload_id=W, at=0.0, decision=d)]
    assert check(seq(waiting)) == []


def test_job_left_after_cancellation_is_an_orphan() -> None:
    h = [*base(), ev.Cancelled(workload_id=W, at=2.0)]
    assert [v.invariant for v in check(seq(h), jobs={"c": [(W, f"{W}-a1")]})] == ["no-orphans"]
    assert check(seq(h), jobs={"c": []}) == []


def _replaced(policy: str, *, stopped: bool, confirmed: bool, fenced: bool = True) -> list[ev.Base]:
    created = lambda n, e: ev.AttemptCreated(attempt_number=n, job_name="j", output_path="/o", checkpoint_path="/c", **a(n, e))  # noqa: E731
    h: list[ev.Base] = [*base(), created(1, 1), ev.FenceRequested(reason="lost", policy=policy, stopped=stopped, **a(1, 1))]  # type: ignore[arg-type]
    if fenced:
        h.append(ev.Fenced(new_epoch=2, **a(1, 1)))
    if confirmed:
        h.append(ev.CancelConfirmed(how="lease-expired", **a(1, 1)))
    h += [created(2, 2), ev.Promoted(output_path="/o", result_path="/r", **a(2, 2)), ev.Completed(workload_id=W, at=9.0, attempt_id=f"{W}-a2", result_path="/r")]
    return h


def test_a_strict_replacement_before_confirmation_is_a_violation() -> None:
    assert [v.invariant for v in check(seq(_replaced("strict", stopped=False, confirmed=False)))] == ["replacement-after-fence"]
    assert check(seq(_replaced("strict", stopped=False, confirmed=True))) == []
    assert check(seq(_replaced("strict", stopped=True, confirmed=False))) == [], "its pods had ended"
    assert check(seq(_replaced("fast", stopped=False, confirmed=False))) == [], "fast: the bump is enough"


def test_a_replacement_of_an_unfenced_attempt_is_two_current_attempts() -> None:
    (v,) = check(seq(_replaced("fast", stopped=False, confirmed=False, fenced=False)))
    assert v.invariant == "replacement-after-fence" and "two current attempts" in v.detail


# --- 8. the stores' manifests agree with the promotions ------------------------------------------


def manifest(n: int, epoch: int, wid: str = W) -> Manifest:
    return Manifest(workload_id=wid, attempt_id=f"{W}-a{n}", epoch=epoch, store="prod", prefix=f"{W}/attempts/{W}-a{n}",
                    objects=[], total_bytes=0, created_at=0.0)  # fmt: skip


def promoted_history() -> list[tuple[int, ev.Base]]:
    return seq([*base(), ev.Fenced(new_epoch=2, **a(1, 1)), ev.Promoted(output_path="/o", result_path="/r", **a(2, 2)),
                ev.Completed(workload_id=W, at=3.0, attempt_id=f"{W}-a2", result_path="/r")])  # fmt: skip


def test_the_promoted_attempts_manifest_agrees() -> None:
    assert check_manifests(promoted_history(), {W: {"prod": manifest(2, 2)}}) == []


@pytest.mark.parametrize(
    ("manifests", "says"),
    [
        pytest.param({W: {"prod": manifest(1, 1)}}, "whose epoch was fenced", id="the-stale-attempts"),
        pytest.param({W: {"prod": manifest(2, 2), "other": manifest(2, 2)}}, "published once", id="two-stores"),
        pytest.param({W: {"prod": manifest(2, 1)}}, "the promotion", id="another-epoch"),
        pytest.param({}, "no store holds its manifest", id="none"),
        pytest.param({W: {"prod": manifest(2, 2, wid="x")}}, "x's", id="another-workloads"),
    ],
)
def test_a_manifest_that_disagrees_is_a_violation(manifests: dict, says: str) -> None:
    found = check_manifests(promoted_history(), manifests)
    assert found and all(v.invariant == "manifest-agrees" for v in found) and says in found[0].detail, found


def test_a_cancelled_workloads_manifest_is_a_violation() -> None:
    h = seq([*base(), ev.CancelRequested(workload_id=W, at=1.0), ev.Cancelled(workload_id=W, at=2.0, reason="asked")])
    assert check_manifests(h, {}) == []
    [v] = check_manifests(h, {W: {"prod": manifest(1, 1)}})
    assert "never promoted" in v.detail
