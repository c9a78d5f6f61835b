"""Deliberate bugs in the cores, to show that the simulation finds them (tests/dst/test_mutations.py).

``python -m gpuorch.dev.dst --mutant NAME`` runs the schedules with one of them applied. Each replaces
one core function, in its module, for the duration of a ``with`` block; the sim shells look the
functions up in their modules at every call, as the real shells do.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from msgspec.structs import replace

from gpuorch_dispatcher import core as dcore
from gpuorch_fencer import core as fcore
from gpuorch_proto import FenceRecord, InstanceLease, OwnerRecord
from gpuorch_proto import events as ev
from gpuorch_proto.storage import Manifest


def promote_ignoring_epoch(rec: FenceRecord | None, e: ev.PromoteRequested, now: float, result_path: str, outputs: Manifest | str) -> fcore.Decision:
    """`on_promote_requested` without its epoch comparison: the real function, shown the request's
    own epoch as the record's (the record it writes keeps the real epoch)."""
    if rec is None:
        return _ORIGINAL_PROMOTE(rec, e, now, result_path, outputs)
    d = _ORIGINAL_PROMOTE(replace(rec, epoch=e.epoch), e, now, result_path, outputs)
    if d.record is not None:
        d = dataclasses.replace(d, record=replace(d.record, epoch=rec.epoch))
    return d


def publish_even_when_refused(rec: FenceRecord | None, e: ev.PromoteRequested, now: float, result_path: str, outputs: Manifest | str) -> fcore.Decision:
    """`on_promote_requested` that hands the shell the attempt's manifest to publish even when the
    gate refuses it (the bug of writing the result before, or apart from, the epoch check): the
    events still say `promotion-rejected`, only the store shows it (invariant 8)."""
    d = _ORIGINAL_PROMOTE(rec, e, now, result_path, outputs)
    if d.promote is None and isinstance(outputs, Manifest) and any(isinstance(x, ev.PromotionRejected) for x in d.events):
        return dataclasses.replace(d, promote=fcore.Publish(result_path=result_path, manifest=outputs))
    return d


def replacement_without_confirmation(e: ev.FenceRequested) -> fcore.ReplacementHow | None:
    """`replacement_now` that lets a `strict` replacement start at the epoch bump, like `fast`."""
    return "stopped" if e.stopped else "fast"


def claim_always(current: OwnerRecord | None, me: str, generation: int, over: Callable[[str, int], bool]) -> OwnerRecord | None:
    """`claim` that grants ownership even while the owner's instance lease runs."""
    return OwnerRecord(owner=me, generation=generation)


def renew_after_end(lease: InstanceLease | None, me: str, now: float, ttl: float) -> InstanceLease:
    """`renewed` that keeps the generation of a lease another dispatcher ended (which then
    claimed its workloads): the old owner goes on as if nothing happened."""
    if lease is None:
        return InstanceLease(instance=me, generation=1, expires_at=now + ttl)
    return InstanceLease(instance=me, generation=lease.generation, expires_at=now + ttl)


_ORIGINAL_PROMOTE = fcore.on_promote_requested

#: name -> (module, function name, replacement, the invariant it should break)
MUTANTS: dict[str, tuple[Any, str, Callable[..., Any], str]] = {
    "promote-ignores-epoch": (fcore, "on_promote_requested", promote_ignoring_epoch, "no-stale-promotion"),
    "publish-when-refused": (fcore, "on_promote_requested", publish_even_when_refused, "manifest-agrees"),
    "strict-before-confirmation": (fcore, "replacement_now", replacement_without_confirmation, "replacement-after-fence"),
    "two-owners": (dcore, "claim", claim_always, "one-owner"),
    "renew-after-end": (dcore, "renewed", renew_after_end, "one-owner"),
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
