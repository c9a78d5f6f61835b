"""Which store is where, for a process of the control plane (issue 28, docs/storage.md).

The registry names every artifact/checkpoint store and data location by URL (`stores:`); a name
the clusters use that is not there is the embedded default: a file:// directory under the state
directory (`stores/<name>` for artifact stores, `data/<name>` for data locations). This module
only assembles that; the I/O is :mod:`gpuorch.objectstore`.
"""

from __future__ import annotations

from pathlib import Path

from gpuorch.config import Registry, Settings
from gpuorch.objectstore import Stores
from gpuorch_proto.storage import StoreConfig


def data_location_names(registry: Registry | None) -> set[str]:
    if registry is None:
        return set()
    return {loc for e in registry.clusters.values() for loc in (*e.data_locations, *e.bandwidth_mbps)}


def store_configs(settings: Settings, registry: Registry | None) -> dict[str, StoreConfig]:
    """Every store and data location the registry names, by name, with its URL."""
    out: dict[str, StoreConfig] = {}
    locations = data_location_names(registry)
    names: set[str] = set(locations)
    if registry is not None:
        for e in registry.clusters.values():
            names |= set(e.artifact_stores) | set(e.checkpoint_stores)
        names |= set(registry.stores)
    for name in sorted(names):
        given = registry.stores.get(name) if registry is not None else None
        if given is not None:
            out[name] = given
        else:
            root = settings.data_dir if name in locations else settings.stores_dir
            out[name] = StoreConfig(url=Path(root / name).resolve().as_uri())
    return out


def stores_of(settings: Settings, registry: Registry | None) -> Stores:
    """The stores this process reaches, with its own credentials (`Settings.store_env`)."""
    return Stores(store_configs(settings, registry), settings.stores_dir, settings.store_env)
