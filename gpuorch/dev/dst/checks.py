"""What the simulation checks beyond `gpuorch.invariants` (pure: the owners bucket's writes).

* ``one-owner`` (DESIGN §6, one dispatch owner per workload): a workload's owner record changes
  owner (or generation) only once the generation it named is over: that instance's lease, at the
  time of the write, had run out (expired, or marked ended), or had moved on to a later
  generation. And the leases themselves: nobody marks a lease ended while it still runs, and a
  generation once ended is never renewed again. The event log cannot show two owners (they
  publish the same deterministic ids, and JetStream keeps one of each); the KV history can.
"""

from __future__ import annotations

from collections.abc import Iterable

from gpuorch.invariants import Violation
from gpuorch_proto import INSTANCE_KEY_PREFIX, InstanceLease, OwnerRecord

from .bus import KVWrite


def check_owners(writes: Iterable[KVWrite]) -> list[Violation]:
    out: list[Violation] = []
    leases: dict[str, InstanceLease] = {}  # instance -> its lease, as the bucket holds it at this write
    for w in writes:
        old, new = w.previous, w.value
        if w.key.startswith(INSTANCE_KEY_PREFIX) and isinstance(new, InstanceLease):
            instance = w.key[len(INSTANCE_KEY_PREFIX):]
            if isinstance(old, InstanceLease) and not old.ended and new.ended and old.expires_at > w.at:
                out.append(Violation(
                    "one-owner", w.key,
                    f"{w.by} ended {instance}'s lease (generation {old.generation}) with {old.expires_at - w.at:.1f}s left",
                ))
            if isinstance(old, InstanceLease) and old.ended and not new.ended and new.generation <= old.generation:
                out.append(Violation(
                    "one-owner", w.key, f"{w.by} renewed generation {new.generation} of {instance} after it was ended",
                ))
            leases[instance] = new
        elif isinstance(old, OwnerRecord) and isinstance(new, OwnerRecord) and (old.owner, old.generation) != (new.owner, new.generation):
            lease = leases.get(old.owner)
            if lease is not None and lease.generation == old.generation and not lease.ended and lease.expires_at > w.at:
                out.append(Violation(
                    "one-owner", w.key,
                    f"dispatcher {new.owner} took the workload while {old.owner}'s lease "
                    f"(generation {old.generation}) had {lease.expires_at - w.at:.1f}s left",
                ))
    return out
