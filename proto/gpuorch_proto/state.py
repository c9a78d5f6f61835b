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


class OwnerLease(msgspec.Struct, frozen=True, kw_only=True):
    """Dispatcher ownership of one workload (key = workload id in the owners bucket)."""

    schema_version: int = 1
    owner: str
    expires_at: float
