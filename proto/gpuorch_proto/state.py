"""Authoritative per-workload records kept in JetStream KV, written only by compare-and-set."""

from __future__ import annotations

import msgspec


class FenceRecord(msgspec.Struct, frozen=True, kw_only=True):
    """The fencer's record for one workload (key = workload id in the fence bucket)."""

    schema_version: int = 1
    epoch: int = 0
    current_attempt: str | None = None  # the attempt allowed to publish at `epoch`
    promoted_attempt: str | None = None
    promoted_epoch: int | None = None
    result_path: str | None = None


INSTANCE_KEY_PREFIX = "instance."


def instance_key(instance: str) -> str:
    """The owners bucket's key of a dispatcher instance's lease. Workload ids are `[a-z0-9-]`,
    so a key with a dot never names a workload."""
    return f"{INSTANCE_KEY_PREFIX}{instance}"


class OwnerRecord(msgspec.Struct, frozen=True, kw_only=True):
    """Which dispatcher instance owns one workload (key = workload id in the owners bucket).

    Written once, by compare-and-set, when the workload is claimed, and never renewed: whether
    the owner is alive is its `InstanceLease`, one per instance. `generation` is the owner's lease
    generation at the claim; a record whose generation is over may be claimed again (0: written
    by a dispatcher older than instance leases, which renewed a per-workload lease instead).
    """

    schema_version: int = 2
    owner: str
    generation: int = 0


class InstanceLease(msgspec.Struct, frozen=True, kw_only=True):
    """One dispatcher instance's liveness (key `instance.<id>` in the owners bucket).

    Renewed by compare-and-set by its instance every owner_ttl/3. Once it has run out, another
    dispatcher marks it `ended` (compare-and-set too) before taking over the workloads it owned:
    that generation never acts again, and the instance, on its next renewal, starts the next one.
    """

    schema_version: int = 1
    instance: str
    generation: int = 1
    expires_at: float
    ended: bool = False


#: The one key of the admission bucket (`Names.kv_admission`): the router that decides admission.
ADMISSION_LEADER_KEY = "leader"


class AdmissionLease(msgspec.Struct, frozen=True, kw_only=True):
    """Which router decides admission (key `leader` in the admission bucket; docs/operations.md
    *Admission leadership*). Written only by compare-and-set: renewed by its holder every
    admission_ttl/3 (same `term`), taken by another router once it ran out (`term` + 1).
    The rules are `gpuorch_router.lease`."""

    schema_version: int = 1
    instance: str
    term: int = 1
    expires_at: float
