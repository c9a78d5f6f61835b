"""What the simulation checks beyond `gpuorch.invariants` (pure: the owners bucket's writes).

* ``one-owner`` (DESIGN §6, one dispatch owner per workload): no write to the owners bucket
  replaces another dispatcher's lease before that lease expired. The event log cannot show this
  (two owners publish the same deterministic ids, and JetStream keeps one of each); the KV
  history can.
"""

from __future__ import annotations

from collections.abc import Iterable

from gpuorch.invariants import Violation
from gpuorch_proto import OwnerLease

from .bus import KVWrite


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
