"""Checks the simulation adds to `gpuorch.invariants` (pure: the log and the owners bucket's writes).

* ``strict-after-confirmation`` (DESIGN §7.4): a `strict` workload's replacement attempt is created
  only once every earlier attempt is known stopped: confirmed gone (``cancel-confirmed``, whatever
  how, lease expiry included), collected as an orphan, or finished (its pods ended: succeeded or
  failed). Read from the event log alone, so it could move into `gpuorch.invariants`.
* ``one-owner`` (DESIGN §6, one dispatch owner per workload): no write to the owners bucket
  replaces another dispatcher's lease before that lease expired.
"""

from __future__ import annotations

from collections.abc import Iterable

from gpuorch.invariants import Violation
from gpuorch.projection import Projection
from gpuorch_proto import Event, OwnerLease
from gpuorch_proto import events as ev

from .bus import KVWrite


def check_strict(events: Iterable[tuple[int, Event]]) -> list[Violation]:
    p = Projection()
    out: list[Violation] = []
    for seq, e in events:
        if isinstance(e, ev.AttemptCreated):
            v = p.get(e.workload_id)
            if v is not None and v.workload is not None and v.workload.spec.fencing == "strict" and e.attempt_id not in v.attempts:
                for a in v.attempts.values():
                    stopped = a.cancel_confirmed is not None or a.orphan_deleted or a.status in ("succeeded", "failed")
                    if a.number < e.attempt_number and not stopped:
                        out.append(Violation(
                            "strict-after-confirmation", e.workload_id,
                            f"{e.attempt_id} created (seq {seq}) while {a.attempt_id} on {a.cluster} was {a.status}, not confirmed stopped",
                        ))
        p.apply(e, seq)
    return out


def check_owners(writes: Iterable[KVWrite]) -> list[Violation]:
    out: list[Violation] = []
    for w in writes:
        old, new = w.previous, w.value
        if isinstance(old, OwnerLease) and isinstance(new, OwnerLease) and old.owner != new.owner and old.expires_at > w.at:
            out.append(Violation(
                "one-owner", w.key,
                f"dispatcher {new.owner} took the workload while {old.owner}'s lease had {old.expires_at - w.at:.1f}s left",
            ))
    return out
