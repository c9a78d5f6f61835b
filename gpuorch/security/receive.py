"""What receivers check before they trust a message (pure; DESIGN §11).

A snapshot is accepted only for a cluster of the receiver's own registry, on that cluster's
own subject; the facts the registry owns (queues and who may use them, stores, connections,
credentials, prices, admission, data locations, bandwidth, images) are the receiver's, never the
snapshot's. What the inventory observes (nodes, free GPUs, queue lengths and waits, datasets
gpuorch staged) comes from the snapshot.
"""

from __future__ import annotations

from collections.abc import Mapping

import msgspec

from gpuorch_proto import ClusterRegistryEntry, ClusterSnapshot, Names

DEFAULT_QUEUE = "default"


def trusted_snapshot(
    snap: ClusterSnapshot,
    subject: str,
    names: Names,
    registry: Mapping[str, ClusterRegistryEntry] | None,
) -> tuple[ClusterSnapshot | None, str | None]:
    """(the snapshot as the receiver may use it, None) or (None, why it is refused).
    `registry=None`: a receiver without a registry (tests) checks the subject only."""
    if subject != names.inventory(snap.cluster):
        return None, f"a snapshot of cluster {snap.cluster[:80]!r} on {subject[:200]}: snapshots go on {names.prefix}.inventory.<their cluster>"
    if registry is None:
        return snap, None
    entry = registry.get(snap.cluster)
    if entry is None:
        return None, f"cluster {snap.cluster[:80]!r} is not in this receiver's registry"
    owners = {q.name: list(q.owners) for q in entry.queues}
    known = [*owners] if DEFAULT_QUEUE in owners else [*owners, DEFAULT_QUEUE]
    queues = [
        msgspec.structs.replace(q, owners=owners.get(q.name, ["*"])) for q in snap.queues if q.name in known
    ]
    staged = [d for d in snap.registry.datasets_cached if d not in entry.datasets_cached]
    facts = msgspec.structs.replace(entry, datasets_cached=[*entry.datasets_cached, *staged])
    return msgspec.structs.replace(snap, queues=queues, registry=facts), None
