"""Deliberate bugs in the cores, to show that the simulation finds them (tests/dst/test_mutations.py).

``python -m gpuorch.dst --mutant NAME`` runs the schedules with one of them applied. Each replaces
one core function, in its module, for the duration of a ``with`` block; the sim shells look the
functions up in their modules at every call, as the real shells do.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from msgspec.structs import replace

from gpuorch_dispatcher import core as dcore
from gpuorch_fencer import core as fcore
from gpuorch_proto import FenceRecord, OwnerLease
from gpuorch_proto import events as ev


def promote_ignoring_epoch(rec: FenceRecord | None, e: ev.PromoteRequested, now: float, result_path: str) -> fcore.Decision:
    """`on_promote_requested` without its epoch comparison (`e.epoch != rec.epoch`)."""
    b = fcore._base(e, now)
    rejected_id = f"{e.attempt_id}.promotion-rejected"
    if rec is None:
        rec = FenceRecord(epoch=e.epoch, current_attempt=e.attempt_id)
    if rec.promoted_attempt == e.attempt_id:
        return fcore.Decision(None, [ev.Promoted(event_id=f"{e.attempt_id}.promoted", output_path=e.output_path, result_path=rec.result_path or result_path, **b)], promote=(e.output_path, rec.result_path or result_path))
    if rec.promoted_attempt is not None:
        reason = f"workload already promoted attempt {rec.promoted_attempt}"
        return fcore.Decision(None, [ev.PromotionRejected(event_id=rejected_id, current_epoch=rec.epoch, reason=reason, **b)], delete_job=True)
    if rec.current_attempt not in (None, e.attempt_id):
        reason = f"attempt {rec.current_attempt} is current at epoch {rec.epoch}"
        return fcore.Decision(None, [ev.PromotionRejected(event_id=rejected_id, current_epoch=rec.epoch, reason=reason, **b)], delete_job=True)
    new = replace(rec, current_attempt=e.attempt_id, promoted_attempt=e.attempt_id, promoted_epoch=e.epoch, result_path=result_path)
    return fcore.Decision(new, [ev.Promoted(event_id=f"{e.attempt_id}.promoted", output_path=e.output_path, result_path=result_path, **b)], promote=(e.output_path, result_path))


def replacement_without_confirmation(e: ev.FenceRequested) -> fcore.ReplacementHow | None:
    """`replacement_now` that lets a `strict` replacement start at the epoch bump, like `fast`."""
    return "stopped" if e.stopped else "fast"


def claim_always(current: OwnerLease | None, me: str, now: float, ttl: float) -> OwnerLease | None:
    """`claim` that grants ownership even while another dispatcher's lease runs."""
    return OwnerLease(owner=me, expires_at=now + ttl)


#: name -> (module, function name, replacement, the invariant it should break)
MUTANTS: dict[str, tuple[Any, str, Callable[..., Any], str]] = {
    "promote-ignores-epoch": (fcore, "on_promote_requested", promote_ignoring_epoch, "no-stale-promotion"),
    "strict-before-confirmation": (fcore, "replacement_now", replacement_without_confirmation, "replacement-after-fence"),
    "two-owners": (dcore, "claim", claim_always, "one-owner"),
}


@contextmanager
def applied(name: str | None) -> Iterator[None]:
    """Apply the mutant `name` (None: none) for the duration of the block."""
    if name is None:
        yield
        return
    module, attr, fn, _ = MUTANTS[name]
    original = getattr(module, attr)
    setattr(module, attr, fn)
    try:
        yield
    finally:
        setattr(module, attr, original)
