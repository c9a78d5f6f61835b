"""One dispatch owner per workload: the pure rules (a record per workload, a lease per instance)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from gpuorch_dispatcher import core
from gpuorch_proto import InstanceLease, OwnerRecord, decode_owner

NOW = 1_700_000_000.0
TTL = 6.0


def lease(instance: str = "1", generation: int = 1, left: float = 3.0, ended: bool = False) -> InstanceLease:
    return InstanceLease(instance=instance, generation=generation, expires_at=NOW + left, ended=ended)


def over_by(**leases: InstanceLease | None) -> Callable[[str, int], bool]:
    return lambda instance, generation: core.generation_over(leases.get(instance), generation)


@pytest.mark.parametrize(
    ("current", "leases", "expected"),
    [
        pytest.param(None, {}, OwnerRecord(owner="0", generation=2), id="no-record-claimed"),
        pytest.param(OwnerRecord(owner="0", generation=2), {}, OwnerRecord(owner="0", generation=2), id="ours-already-nothing-to-write"),
        pytest.param(OwnerRecord(owner="0", generation=1), {"0": lease("0", 2)}, OwnerRecord(owner="0", generation=2), id="our-earlier-generation-claimed-again"),
        pytest.param(OwnerRecord(owner="1", generation=1), {"1": lease()}, None, id="live-owner-keeps-it"),
        pytest.param(OwnerRecord(owner="1", generation=1), {"1": lease(left=-1.0)}, None, id="ran-out-but-not-ended-yet-waits"),
        pytest.param(OwnerRecord(owner="1", generation=1), {}, None, id="owners-lease-not-read-waits"),
        pytest.param(OwnerRecord(owner="1", generation=1), {"1": lease(left=-1.0, ended=True)}, OwnerRecord(owner="0", generation=2), id="ended-owner-taken-over"),
        pytest.param(OwnerRecord(owner="1", generation=1), {"1": lease(generation=2)}, OwnerRecord(owner="0", generation=2), id="owner-restarted-as-a-later-generation"),
        pytest.param(OwnerRecord(owner="1", generation=3), {"1": lease(generation=2)}, None, id="lease-read-before-the-record-waits"),
        pytest.param(OwnerRecord(owner="1", generation=0), {}, OwnerRecord(owner="0", generation=2), id="record-from-before-instance-leases"),
    ],
)
def test_claim(current: OwnerRecord | None, leases: dict[str, InstanceLease], expected: OwnerRecord | None) -> None:
    leases.setdefault("0", lease("0", 2))
    assert core.claim(current, "0", 2, over_by(**leases)) == expected


def test_a_record_from_an_older_dispatcher_decodes_without_a_generation() -> None:
    old = decode_owner(b'{"schema_version": 1, "owner": "1", "expires_at": 1e12}')
    assert old.generation == 0 and core.claim(old, "0", 1, over_by()) == OwnerRecord(owner="0", generation=1)


def test_alive_until_it_runs_out_or_is_ended() -> None:
    assert core.instance_alive(lease(left=0.1), NOW)
    assert not core.instance_alive(lease(left=0.0), NOW)
    assert not core.instance_alive(lease(left=5.0, ended=True), NOW)
    assert not core.instance_alive(None, NOW)


def test_only_a_lease_that_ran_out_is_ended_and_only_once() -> None:
    assert core.end_lapsed(lease(left=1.0), "1", 1, NOW) is None
    ended = core.end_lapsed(lease(left=-0.5), "1", 1, NOW)
    assert ended == lease(left=-0.5, ended=True)
    assert core.end_lapsed(ended, "1", 1, NOW) is None
    # missing while records name it: ended at the generation they name (none to end for old records)
    assert core.end_lapsed(None, "1", 4, NOW) == InstanceLease(instance="1", generation=4, expires_at=NOW, ended=True)
    assert core.end_lapsed(None, "1", 0, NOW) is None


def test_renewal_keeps_the_generation_until_it_was_ended() -> None:
    assert core.renewed(None, "0", NOW, TTL) == InstanceLease(instance="0", generation=1, expires_at=NOW + TTL)
    assert core.renewed(lease("0", 3, left=-2.0), "0", NOW, TTL).generation == 3  # ran out, nobody ended it
    nxt = core.renewed(lease("0", 3, ended=True), "0", NOW, TTL)
    assert (nxt.generation, nxt.ended, nxt.expires_at) == (4, False, NOW + TTL)
    # the generation it left is over for everyone, so its records can be claimed again (by compare-and-set)
    assert core.generation_over(nxt, 3) and not core.generation_over(nxt, 4)
