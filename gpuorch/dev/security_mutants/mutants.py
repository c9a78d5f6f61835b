"""Each protection of docs/security.md removed on its own, to show the attack suite notices.

A mutant replaces one or two functions, in their modules, in the processes it names, for the
duration of a ``with applied(name, process)`` block (as ``gpuorch.dev.dst.mutants`` does for the
simulation). The processes:

* ``tests``: the process that writes the nats-server config, i.e. the pytest process, whose
  embedded system calls ``gpuorch.security.generate`` before it starts the server. The
  permission mutants wrap ``gpuorch.security.bundle.permissions`` (the one name the bundle
  builds every identity's permissions with) or ``bundle.server_config``;
* ``router``, ``dispatcher``, ``fencer``: that service's process (the receivers' checks).

``python -m gpuorch.dev.security_mutants`` sets ``GPUORCH_SECURITY_MUTANT=<name>`` (test-only) and
runs pytest through ``launch``; the embedded system then starts every service through ``launch``
too (``gpuorch.system.service_argv``). Nothing else reads the variable, and no production module
knows of this one: the control plane may not import ``gpuorch.dev`` (.importlinter).
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpuorch.security import model
from gpuorch.security.model import EVENT_PUBLISHERS, SERVICES, Perms, durables
from gpuorch_proto import Names

ATTACKS = "tests/security/test_attacks.py::"
INPUT = "tests/security/test_workload_input.py::"

#: (module, attribute (``Class.method`` for a method), replacement built from the original)
Patch = tuple[str, str, Callable[[Any], Any]]


@dataclass(frozen=True)
class Mutant:
    removes: str  # the protection, in the words of docs/security.md
    processes: tuple[str, ...]  # where it is applied: "tests" or a service's name
    patches: tuple[Patch, ...]
    tests: tuple[str, ...]  # pytest node ids: each must fail with the mutant applied


# -- the permission model ---------------------------------------------------------------------------


def _editing(roles: Iterable[str], edit: Callable[[Perms, Names], None]) -> Patch:
    """A patch of `bundle.permissions`: the real permissions of each of `roles`, then `edit`ed."""
    wanted = frozenset(roles)

    def factory(original: Callable[..., Perms]) -> Callable[..., Perms]:
        def permissions(role: str, names: Names, public_key: str, **kw: Any) -> Perms:
            p = original(role, names, public_key, **kw)
            if role in wanted:
                edit(p, names)
            return p

        return permissions

    return ("gpuorch.security.bundle", "permissions", factory)


def _granting(roles: Iterable[str], grant: Callable[[Names], Iterable[str]]) -> Patch:
    """`roles` may also publish on `grant(names)`."""

    def edit(p: Perms, names: Names) -> None:
        p.pub_allow += list(grant(names))

    return _editing(roles, edit)


def _every_event_type(names: Names) -> list[str]:
    return [names.evt_kind(t) for t in [*EVENT_PUBLISHERS, "rejected"]]


def _drop_denials(keep: Callable[[str], bool]) -> Patch:
    def edit(p: Perms, names: Names) -> None:
        p.pub_deny = [d for d in p.pub_deny if keep(d)]

    return _editing(("router", "dispatcher", "fencer", "inventory", "client"), edit)


def _client_reads_commands(p: Perms, names: Names) -> None:
    on_cmd = [d for d in durables(names) if d.stream == names.stream_cmd]
    model._named_reader(p, names.stream_cmd, on_cmd, on_cmd)  # as it reads the events: under names of its own


def _client_creates_nameless(p: Perms, names: Names) -> None:
    model._ordered_reader(p, names.stream_evt)  # as on the snapshots' stream, where no durable reads


def _server_config(edit: Callable[[dict[str, Any], Mapping[str, Mapping[str, Any]]], None]) -> Patch:
    def factory(original: Callable[..., dict[str, Any]]) -> Callable[..., dict[str, Any]]:
        def server_config(
            names: Names, identities: Mapping[str, Mapping[str, Any]], **kw: Any
        ) -> dict[str, Any]:
            conf = original(names, identities, **kw)
            edit(conf, identities)
            return conf

        return server_config

    return ("gpuorch.security.bundle", "server_config", factory)


def _anonymous_is_client(conf: dict[str, Any], identities: Mapping[str, Mapping[str, Any]]) -> None:
    conf["no_auth_user"] = next(i["public_key"] for i in identities.values() if i["role"] == "client")


def _no_users(conf: dict[str, Any], identities: Mapping[str, Mapping[str, Any]]) -> None:
    del conf["accounts"], conf["authorization"]  # one account, no user list: nobody is authenticated


def _seeds_readable(original: Callable[[Path, str], None]) -> Callable[[Path, str], None]:
    def write(path: Path, text: str) -> None:
        original(path, text)
        if path.parent.name == "creds":
            os.chmod(path, 0o644)
            os.chmod(path.parent, 0o755)

    return write


# -- the receivers --------------------------------------------------------------------------------


def _any_subject(original: Callable[..., Any]) -> Callable[..., Any]:
    return lambda names, subject, event: None


def _snapshot_of_any_cluster(original: Callable[..., Any]) -> Callable[..., Any]:
    def trusted(snap: Any, subject: str, names: Names, registry: Mapping[str, Any] | None) -> Any:
        return original(
            snap, subject, names, registry if registry is None or snap.cluster in registry else None
        )

    return trusted


def _snapshot_on_any_subject(original: Callable[..., Any]) -> Callable[..., Any]:
    def trusted(snap: Any, subject: str, names: Names, registry: Mapping[str, Any] | None) -> Any:
        return original(snap, names.inventory(snap.cluster), names, registry)

    return trusted


def _any_output_path(original: Callable[..., str | None]) -> Callable[..., str | None]:
    def problem(e: Any, facts: Any, expected_dir: str | None) -> str | None:
        return original(e, facts, e.output_path.rstrip("/") if expected_dir is not None else None)

    return problem


def _source_from_the_event(original: Callable[..., Any]) -> Callable[..., Any]:
    def source(self: Any, e: Any) -> tuple[str | None, str | None]:
        store, problem = original(self, e)
        where = self.stores.locate(e.output_path) if problem is None else None
        return (where[0] if where is not None else store), problem

    return source


def _identity_from_the_header(original: Callable[..., Any]) -> Callable[..., Any]:
    from gpuorch.security.identity import IDENTITY_HEADER, Unauthenticated

    def caller(self: Any, subject: str, msg_id: str | None, headers: Mapping[str, str], body: bytes) -> Any:
        try:
            return original(self, subject, msg_id, headers, body)
        except Unauthenticated:
            claimed = self._by_key.get(headers.get(IDENTITY_HEADER, ""))
            if claimed is None:
                raise
            return claimed  # the signature is not checked: whoever the header names

    return caller


def _always(value: Any) -> Callable[[Any], Callable[..., Any]]:
    return lambda original: lambda *a, **kw: value


SERVICE_TEST = ATTACKS + "test_each_service_publishes_only_its_own_event_types[{}]"

MUTANTS: dict[str, Mutant] = {
    # identities
    "anonymous-allowed": Mutant(
        "there is no anonymous user (no `no_auth_user`)",
        ("tests",),
        (_server_config(_anonymous_is_client),),
        (ATTACKS + "test_an_anonymous_connection_is_refused",),
    ),
    "authentication-off": Mutant(
        "a connection authenticates with an nkey the server config names",
        ("tests",),
        (_server_config(_no_users),),
        (
            ATTACKS + "test_an_anonymous_connection_is_refused",
            ATTACKS + "test_a_seed_the_server_does_not_know_is_refused",
        ),
    ),
    "seeds-readable": Mutant(
        "each seed is a 0600 file in a 0700 directory",
        ("tests",),
        (("gpuorch.security.bundle", "_write_private", _seeds_readable),),
        (ATTACKS + "test_credentials_are_private_files",),
    ),
    # one publisher per event type
    "client-publishes-events": Mutant(
        "a client publishes no lifecycle event",
        ("tests",),
        (_granting(["client"], lambda n: [f"{n.prefix}.evt.>"]),),
        (ATTACKS + "test_a_client_may_publish_no_lifecycle_event_and_no_snapshot",),
    ),
    "client-publishes-snapshots": Mutant(
        "a client publishes no snapshot",
        ("tests",),
        (_granting(["client"], lambda n: [n.inventory("*")]),),
        (ATTACKS + "test_a_client_may_publish_no_lifecycle_event_and_no_snapshot",),
    ),
    **{
        f"{s}-publishes-any-event": Mutant(
            f"the {s} publishes only its own event types",
            ("tests",),
            (_granting([s], _every_event_type),),
            (SERVICE_TEST.format(s),),
        )
        for s in SERVICES
    },
    "inventory-publishes-any-snapshot": Mutant(
        "inventory publishes snapshots of the registry's clusters only",
        ("tests",),
        (_granting(["inventory"], lambda n: [n.inventory("*")]),),
        (ATTACKS + "test_inventory_publishes_snapshots_only_of_registered_clusters",),
    ),
    # state only its owner writes
    "dispatcher-writes-fence": Mutant(
        "only the fencer writes the fence bucket",
        ("tests",),
        (_granting(["dispatcher"], lambda n: [f"$KV.{n.kv_fence}.>"]),),
        (ATTACKS + "test_only_the_fencer_writes_fencing_state_and_only_dispatchers_leases",),
    ),
    "fencer-writes-owners": Mutant(
        "only dispatchers write the owners bucket (ownership, instance leases)",
        ("tests",),
        (_granting(["fencer"], lambda n: [f"$KV.{n.kv_owners}.>"]),),
        (ATTACKS + "test_only_the_fencer_writes_fencing_state_and_only_dispatchers_leases",),
    ),
    "dispatcher-writes-admission": Mutant(
        "only routers write the admission bucket (the admission leader's lease)",
        ("tests",),
        (_granting(["dispatcher"], lambda n: [f"$KV.{n.kv_admission}.>"]),),
        (ATTACKS + "test_only_routers_write_the_admission_lease_and_only_its_one_key",),
    ),
    "router-writes-any-admission-key": Mutant(
        "a router writes only the admission bucket's `leader` key",
        ("tests",),
        (_granting(["router"], lambda n: [f"$KV.{n.kv_admission}.>"]),),
        (ATTACKS + "test_only_routers_write_the_admission_lease_and_only_its_one_key",),
    ),
    # the topology belongs to the admin
    "streams-purgeable": Mutant(
        "nobody but the admin purges a stream",
        ("tests",),
        (_granting(SERVICES, lambda n: [f"{model.API}.STREAM.PURGE.*"]),),
        (ATTACKS + "test_nobody_but_the_admin_purges_deletes_or_reconfigures",),
    ),
    "durables-deletable": Mutant(
        "nobody but the admin deletes a durable",
        ("tests",),
        (_drop_denials(lambda d: ".CONSUMER.DELETE." not in d),),
        (ATTACKS + "test_nobody_but_the_admin_purges_deletes_or_reconfigures",),
    ),
    "others-durables-open": Mutant(
        "another identity's durable is denied by name (create, pull, info)",
        ("tests",),
        (_drop_denials(lambda d: ".CONSUMER.DELETE." in d),),
        (ATTACKS + "test_nobody_pulls_from_or_rewrites_another_identitys_durable",),
    ),
    "client-reads-commands": Mutant(
        "no client reads the command stream",
        ("tests",),
        (_editing(["client"], _client_reads_commands),),
        (ATTACKS + "test_nobody_pulls_from_or_rewrites_another_identitys_durable",),
    ),
    "nameless-create-on-events": Mutant(
        "no name-less CONSUMER.CREATE on a stream durables read",
        ("tests",),
        (_editing(["client"], _client_creates_nameless),),
        (ATTACKS + "test_nobody_pulls_from_or_rewrites_another_identitys_durable",),
    ),
    # receivers check what they trust
    "subject-unchecked": Mutant(
        "receivers check the subject against the body",
        ("router", "dispatcher", "fencer"),
        (("gpuorch.runtime.shell", "subject_problem", _any_subject),),
        (ATTACKS + "test_an_event_moved_to_a_subject_its_body_does_not_name_is_refused",),
    ),
    "readers-fold-moved-events": Mutant(
        "readers of the log (a client's view, a service's catch-up) skip what the receivers refused",
        ("tests",),
        (("gpuorch.runtime.shell", "moved", _always(False)), ("gpuorch.client", "moved", _always(False))),
        (ATTACKS + "test_an_event_moved_to_a_subject_its_body_does_not_name_is_refused",),
    ),
    "snapshot-of-any-cluster": Mutant(
        "a snapshot only of a cluster of the router's registry",
        ("router",),
        (("gpuorch_router.service", "trusted_snapshot", _snapshot_of_any_cluster),),
        (ATTACKS + "test_snapshots_of_unregistered_clusters_or_on_another_clusters_subject_are_refused",),
    ),
    "snapshot-on-any-subject": Mutant(
        "a snapshot only on its own cluster's subject",
        ("router",),
        (("gpuorch_router.service", "trusted_snapshot", _snapshot_on_any_subject),),
        (ATTACKS + "test_snapshots_of_unregistered_clusters_or_on_another_clusters_subject_are_refused",),
    ),
    "promotion-path-unchecked": Mutant(
        "the promotion's output path must be exactly the attempt's directory",
        ("fencer",),
        (("gpuorch_fencer.core", "promotion_problem", _any_output_path),),
        (ATTACKS + "test_a_promotion_whose_path_escapes_the_attempt_directory_is_refused",),
    ),
    "promotion-trusts-event-path": Mutant(
        "the fencer reads the attempt its records name, never a store an event's path names",
        ("fencer",),
        (
            ("gpuorch_fencer.core", "promotion_problem", _any_output_path),
            ("gpuorch_fencer.service", "Fencer.promotion_source", _source_from_the_event),
        ),
        (ATTACKS + "test_a_promotion_whose_path_escapes_the_attempt_directory_is_refused",),
    ),
    # who the submitter is decides what it may do
    "submit-owner-unchecked": Mutant(
        "a submit only as an owner the signing identity may use",
        ("router",),
        (("gpuorch.security.identity", "Caller.may_submit_as", _always(True)),),
        (ATTACKS + "test_a_submit_as_an_owner_the_identity_may_not_use_is_refused",),
    ),
    "signature-unverified": Mutant(
        "a command's signature is verified against the identity it names",
        ("router",),
        (("gpuorch.security.identity", "Verifier.caller", _identity_from_the_header),),
        (ATTACKS + "test_a_submit_as_an_owner_the_identity_may_not_use_is_refused",),
    ),
    "cancel-by-anyone": Mutant(
        "a cancel only by the admin, the router (a pipeline's stages), or an identity that may use the owner",
        ("dispatcher",),
        (("gpuorch.security.identity", "Caller.may_cancel", _always(True)),),
        (ATTACKS + "test_a_cancel_by_an_identity_that_may_not_use_the_owner_is_refused",),
    ),
    "router-cancels-any": Mutant(
        "the router cancels only the stages of a pipeline (`<pipeline>--<stage>`), no other workload",
        ("dispatcher",),
        (("gpuorch.security.identity", "is_stage_id", _always(True)),),
        (ATTACKS + "test_a_cancel_by_the_router_of_a_workload_that_is_no_pipelines_stage_is_refused",),
    ),
    # what a workload may ask for
    "tolerations-unchecked": Mutant(
        "tolerations and node selectors only where the queue allows them",
        ("router",),
        (("gpuorch_router.service", "node_constraint_errors", _always([])),),
        (INPUT + "test_a_toleration_the_queue_does_not_allow_is_refused_with_path_and_reason",),
    ),
    "secret-values-accepted": Mutant(
        "a submit carrying a secret value is refused",
        ("router",),
        (("gpuorch_proto.validate", "literal_secret_errors", _always([])),),
        (INPUT + "test_a_named_credential_reaches_the_pod_from_a_secret_and_never_the_bus",),
    ),
    "submit-size-unchecked": Mutant(
        "a submit body over MAX_SUBMIT_BYTES is refused",
        ("router",),
        (("gpuorch_router.service", "body_size_error", _always(None)),),
        (INPUT + "test_an_oversized_body_is_refused_naming_its_size_and_the_limit",),
    ),
}

#: Attack tests no mutant needs to fail, and why.
NOT_A_PROTECTION: dict[str, str] = {
    ATTACKS + "test_a_client_reads_events_through_a_consumer_of_its_own":
        "the permissions are not too tight: what a client may do (it fails when the client's reader is removed)",
}  # fmt: skip


def process_of(module: str) -> str:
    """The mutant process a `python -m <module>` is: `gpuorch_router` -> router, pytest -> tests."""
    return module.removeprefix("gpuorch_") if module.startswith("gpuorch_") else "tests"


def _target(module: str, attr: str) -> tuple[Any, str]:
    owner: Any = importlib.import_module(module)
    *path, last = attr.split(".")
    for part in path:
        owner = getattr(owner, part)
    getattr(owner, last)  # it exists: a mutant of nothing would survive for the wrong reason
    return owner, last


@contextmanager
def applied(name: str | None, process: str) -> Iterator[list[str]]:
    """Apply mutant `name` (None: none) in this process, `process`, for the block; yields the
    patched `module:attribute`s (none where the mutant is not applied in `process`)."""
    if name is None:
        yield []
        return
    mutant = MUTANTS[name]  # an unknown name is an error, never a silent run without a mutant
    done: list[tuple[Any, str, Any]] = []
    try:
        if process in mutant.processes:
            for module, attr, factory in mutant.patches:
                owner, last = _target(module, attr)
                original = getattr(owner, last)
                setattr(owner, last, factory(original))
                done.append((owner, last, original))
        yield [f"{module}:{attr}" for module, attr, _ in mutant.patches] if done else []
    finally:
        for owner, last, original in reversed(done):
            setattr(owner, last, original)
