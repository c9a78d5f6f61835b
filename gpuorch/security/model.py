"""Who may do what on the bus: one permission model, built from `Names` and nothing else.

Pure (no I/O): `permissions(role, ...)` is the NATS publish/subscribe permission block of one
identity; `gpuorch.security.bundle` turns it into a server config with one nkey per identity.
The same function serves the embedded system, the test suite and production.

Identities (`ROLES`):

| identity | may publish | may read |
|---|---|---|
| `admin` | everything (creates the topology at start-up; operators) | everything |
| `router` | `evt.*.{submitted,routed,unroutable,rejected,admission-term,...}`; KV `admission` key `leader` only | its durables `router_submit` (cmd), `router_events` (evt); snapshots; KV `admission` |
| `dispatcher` | `evt.*.<attempt lifecycle>`, `evt.*.rejected`; KV `owners`, `staged` | its durables (evt per instance, cancel, command guard); KV `owners`, `staged` |
| `fencer` | `evt.*.{fenced,promoted,...}`, `evt.*.rejected`; KV `fence` | its durable `fencer_events`; KV `fence` |
| `inventory` | `inventory.<registered cluster>` | KV `staged` |
| `client` | `cmd.submit`, `cmd.cancel` | events and snapshots through consumers it creates |

`rejected`: NATS permissions match whole subject tokens, and a rejection bound to a message is
filed under one token (`msg-<stream>-<seq>`), so `evt.*.rejected` cannot be split into "message
records" and "workload verdicts". Every service that consumes (router, dispatcher, fencer) may
publish `evt.*.rejected`; the projection binds a rejection to an accepted workload only when it
carries the router's routing `decision` (`projection.rejection_binds`). Inventory consumes
nothing and publishes no rejection.

JetStream API subjects are scoped to a stream and a consumer name (`$JS.API.CONSUMER.MSG.NEXT.
<stream>.<durable>`); nobody but the admin has a `STREAM.CREATE/UPDATE/DELETE/PURGE`,
`MSG.DELETE` or the name-less `CONSUMER.CREATE.<stream>` (which can rewrite any consumer of the
stream named in its body). Readers of the event stream create consumers under a name of their
own (`CONSUMER.CREATE.<stream>.<name>...`), with every other identity's durable denied by name.
Replies come back on a per-identity inbox (`_INBOX.<public key>.>`), so no identity sees
another's replies (pull deliveries included).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Literal

from gpuorch_proto import ADMISSION_LEADER_KEY, Names, kv_buckets

Role = Literal["admin", "router", "dispatcher", "fencer", "inventory", "client"]
SERVICES: tuple[Role, ...] = ("router", "dispatcher", "fencer", "inventory")
ROLES: tuple[Role, ...] = ("admin", *SERVICES, "client")

# Every lifecycle event type has exactly one publishing service.
EVENT_PUBLISHERS: dict[str, Role] = {
    "submitted": "router",
    "routed": "router",
    "unroutable": "router",
    # pipelines and admission (issue 13, docs/pipelines.md): the router's
    "pipeline-expanded": "router",
    "stage-ready": "router",
    "stage-blocked": "router",
    "pipeline-finished": "router",
    "held": "router",
    "released": "router",
    "route-requested": "dispatcher",
    "attempt-created": "dispatcher",
    "admitted": "dispatcher",
    "running": "dispatcher",
    "unschedulable": "dispatcher",
    "succeeded": "dispatcher",
    "failed": "dispatcher",
    "lost": "dispatcher",
    "fence-requested": "dispatcher",
    "promote-requested": "dispatcher",
    "completed": "dispatcher",
    "cancel-requested": "dispatcher",
    "cancelled": "dispatcher",
    "workload-failed": "dispatcher",
    "fenced": "fencer",
    "cancel-confirmed": "fencer",
    "replacement-allowed": "fencer",
    "promoted": "fencer",
    "promotion-rejected": "fencer",
    "orphan-deleted": "fencer",
    "compute-started": "dispatcher",  # the program's first step, seen by the dispatcher (issue 14)
    # preemption of checkpoint-safe work (issue 13, docs/pipelines.md): the router decides it
    "preemption-planned": "router",
    "preemption-requested": "router",
    # admission leadership (docs/operations.md): the marker a router's admission term starts with
    "admission-term": "router",
}
# `rejected`: see the module doc.
REJECTION_PUBLISHERS: tuple[Role, ...] = ("router", "dispatcher", "fencer")
DEFAULT_DISPATCHER_IDS: tuple[str, ...] = ("0", "1", "2")

API = "$JS.API"


def inbox_prefix(public_key: str) -> str:
    """The reply subject prefix of one identity (nats-py `inbox_prefix`)."""
    return f"_INBOX.{public_key}"


@dataclass(frozen=True)
class Durable:
    owner: Role
    stream: str
    name: str


def events_durable(names: Names, role: Role, instance: str) -> str:
    """The events consumer of one router or fencer replica: every replica folds every event
    (its own durable; effects are deduplicated by event id and compare-and-set, docs/operations.md),
    replica "0" keeps the plain name."""
    return names.durable(role, "events" if instance == "0" else f"events-{instance}")


def snapshot_owner(role: Role, instance: str) -> str:
    """The state-snapshot owner key of one router or fencer replica (inside the role's keys)."""
    return role if instance == "0" else f"{role}.{instance}"


def durables(names: Names, dispatcher_ids: Sequence[str] = DEFAULT_DISPATCHER_IDS) -> list[Durable]:
    """Every durable consumer of the services (the names the services use). `dispatcher_ids`
    are the replica ids of the router and fencer too."""
    out = [
        Durable("router", names.stream_cmd, names.durable("router", "submit")),
        Durable("router", names.stream_evt, names.durable("router", "events")),
        Durable("fencer", names.stream_evt, names.durable("fencer", "events")),
        Durable("dispatcher", names.stream_cmd, names.durable("dispatcher", "cancel")),
        Durable("dispatcher", names.stream_cmd, names.durable("guard", "commands")),
    ]
    out += [Durable("dispatcher", names.stream_evt, names.durable("dispatcher", f"events-{i}")) for i in dispatcher_ids]
    out += [Durable(r, names.stream_evt, events_durable(names, r, i)) for r in ("router", "fencer") for i in dispatcher_ids if i != "0"]
    return out


@dataclass
class Perms:
    pub_allow: list[str] = field(default_factory=list)
    pub_deny: list[str] = field(default_factory=list)
    sub_allow: list[str] = field(default_factory=list)
    sub_deny: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, dict[str, list[str]]]:
        def block(allow: list[str], deny: list[str]) -> dict[str, list[str]]:
            out = {"allow": _unique(allow)}
            if deny:
                out["deny"] = _unique(deny)
            return out

        return {"publish": block(self.pub_allow, self.pub_deny), "subscribe": block(self.sub_allow, self.sub_deny)}


def _unique(items: Iterable[str]) -> list[str]:
    return list(dict.fromkeys(items))


def _kv_stream(bucket: str) -> str:
    return f"KV_{bucket}"


def _stream_info(p: Perms, *streams: str) -> None:
    p.pub_allow += [f"{API}.STREAM.INFO.{s}" for s in streams]


def _own_durable(p: Perms, d: Durable) -> None:
    s, n = d.stream, d.name
    p.pub_allow += [
        f"{API}.CONSUMER.CREATE.{s}.{n}",
        f"{API}.CONSUMER.CREATE.{s}.{n}.>",
        f"{API}.CONSUMER.INFO.{s}.{n}",
        f"{API}.CONSUMER.MSG.NEXT.{s}.{n}",
        f"$JS.ACK.{s}.{n}.>",
    ]


def _named_reader(p: Perms, stream: str, others: Sequence[Durable], all_on_stream: Sequence[Durable]) -> None:
    """Consumers under names of one's own on `stream` (replay, follow), never another's durable."""
    p.pub_allow += [
        f"{API}.CONSUMER.CREATE.{stream}.*",
        f"{API}.CONSUMER.CREATE.{stream}.*.>",
        f"{API}.CONSUMER.INFO.{stream}.*",
        f"{API}.CONSUMER.MSG.NEXT.{stream}.*",
        f"{API}.CONSUMER.DELETE.{stream}.*",
    ]
    for d in others:
        p.pub_deny += [
            f"{API}.CONSUMER.CREATE.{stream}.{d.name}",
            f"{API}.CONSUMER.CREATE.{stream}.{d.name}.>",
            f"{API}.CONSUMER.MSG.NEXT.{stream}.{d.name}",
            f"{API}.CONSUMER.INFO.{stream}.{d.name}",
        ]
    p.pub_deny += [f"{API}.CONSUMER.DELETE.{stream}.{d.name}" for d in all_on_stream]  # nobody deletes a durable


def _ordered_reader(p: Perms, stream: str) -> None:
    """nats-py ordered push consumers (snapshots, KV watch). Only on streams no durable reads:
    the name-less create can rewrite any consumer of its stream."""
    p.pub_allow += [
        f"{API}.CONSUMER.CREATE.{stream}",
        f"{API}.CONSUMER.CREATE.{stream}.>",
        f"{API}.CONSUMER.INFO.{stream}.*",
        f"{API}.CONSUMER.DELETE.{stream}.*",
        f"$JS.FC.{stream}.>",
    ]


SNAPSHOT_OWNERS = ("router", "dispatcher", "fencer")  # who folds the log and snapshots it (gpuorch.runtime.snapshot)


def _kv_read(p: Perms, bucket: str) -> None:
    s = _kv_stream(bucket)
    _stream_info(p, s)
    p.pub_allow += [f"{API}.DIRECT.GET.{s}", f"{API}.DIRECT.GET.{s}.>", f"{API}.STREAM.MSG.GET.{s}"]


def _kv_write(p: Perms, bucket: str) -> None:
    _kv_read(p, bucket)
    p.pub_allow.append(f"$KV.{bucket}.>")


def permissions(
    role: Role,
    names: Names,
    public_key: str,
    *,
    clusters: Sequence[str] = (),
    dispatcher_ids: Sequence[str] = DEFAULT_DISPATCHER_IDS,
) -> Perms:
    """The NATS permissions of one identity (see the module doc). `clusters`: the registry's
    cluster names (inventory may publish only their snapshots); `dispatcher_ids`: the dispatcher
    instances (`GPUORCH_DISPATCHER_ID`) whose durables exist."""
    p = Perms()
    if role == "admin":
        p.pub_allow, p.sub_allow = [">"], [">"]
        return p
    p.sub_allow.append(f"{inbox_prefix(public_key)}.>")
    p.pub_allow.append(f"{API}.INFO")
    all_durables = durables(names, dispatcher_ids)
    mine = [d for d in all_durables if d.owner == role]
    on_evt = [d for d in all_durables if d.stream == names.stream_evt]
    others_evt = [d for d in on_evt if d.owner != role]
    evt_types = [t for t, who in EVENT_PUBLISHERS.items() if who == role]
    p.pub_allow += [names.evt_kind(t) for t in evt_types]
    if role in REJECTION_PUBLISHERS:
        p.pub_allow.append(names.evt_kind("rejected"))
    for d in mine:
        _own_durable(p, d)

    if role in ("router", "dispatcher", "fencer", "client"):
        _stream_info(p, names.stream_evt)
        p.pub_allow.append(f"{API}.STREAM.NAMES")
        _named_reader(p, names.stream_evt, others_evt, on_evt)
    if role in SERVICES:  # every service waits for the whole topology at start (`bus.await_topology`)
        _stream_info(p, names.stream_cmd, names.stream_evt, names.stream_inventory)
        _stream_info(p, *(_kv_stream(b) for b in kv_buckets(names)))
    if role in SNAPSHOT_OWNERS:  # its own state snapshots: read, and write only its own keys
        _kv_read(p, names.kv_snapshots)
        p.pub_allow.append(f"$KV.{names.kv_snapshots}.{role}.>")
    if role in ("dispatcher", "fencer"):
        p.pub_allow.append(f"{API}.STREAM.MSG.GET.{names.stream_evt}")  # last `submitted` of a workload
    if role in ("router", "client", "inventory"):
        _stream_info(p, names.stream_inventory)
    if role in ("router", "client"):
        _ordered_reader(p, names.stream_inventory)
    if role == "fencer":
        _kv_write(p, names.kv_fence)
    elif role == "dispatcher":
        _kv_write(p, names.kv_owners)
        _kv_write(p, names.kv_staged)
    elif role == "inventory":
        _kv_read(p, names.kv_staged)
        _ordered_reader(p, _kv_stream(names.kv_staged))
        p.pub_allow += [names.inventory(c) for c in clusters]
    elif role == "client":
        p.pub_allow += [names.cmd_submit, names.cmd_cancel]
    if role == "router":  # cancelling a pipeline cancels each of its stages (docs/pipelines.md)
        p.pub_allow.append(names.cmd_cancel)
        # admission leadership: read the bucket, write its one key (compare-and-set; gpuorch_router.lease)
        _kv_read(p, names.kv_admission)
        p.pub_allow.append(f"$KV.{names.kv_admission}.{ADMISSION_LEADER_KEY}")
    return p
