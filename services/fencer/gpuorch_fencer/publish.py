"""Promotion's I/O on the object store (issue 28): what the fencer reads of an attempt, the one
object it writes, and how every reader resolves a result.

The fencer never moves an output's bytes. It lists the attempt's prefix and reads the agent's
upload record (`prepare`), and, once its compare-and-set in the fence bucket made the attempt the
promoted one, writes the result's **manifest** create-only at ``<workload>/result/manifest.json``
(`publish`): the store's own compare-and-set, so two fencers racing write one manifest, and one
already there (a retried promotion's, or one written by hand) is never overwritten. A reader
(`gpuorch result`, a dependent stage's inputs) resolves a result URL to its manifest
(`resolve_result`) and reads the objects it names under the attempt's prefix.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import BinaryIO, Literal

import msgspec
import obstore
from obstore.exceptions import NotFoundError

from gpuorch.objectstore import Store, Stores, StoreUnavailable
from gpuorch_proto.storage import (
    UPLOAD_RECORD,
    Manifest,
    ManifestObject,
    StoreError,
    UploadRecord,
    attempt_prefix,
    decode_manifest,
    decode_upload_record,
    manifest_for,
    manifest_key,
    same_result,
)


class ResultError(Exception):
    """A result that cannot be read: no manifest (yet) at its URL, not a gpuorch manifest, a URL
    in none of the stores, an object the manifest does not name. The message says which."""


async def prepare(store: Store, workload_id: str, attempt_id: str, epoch: int, now: float) -> Manifest | str:
    """The manifest of an attempt's outputs as the store holds them now, or why there is none
    (`gpuorch_proto.storage.manifest_for`: no upload record, an object missing or of another
    size, a record that is not gpuorch's). Raises `StoreUnavailable` when the store does not
    answer (retried later: not a reason to refuse the attempt)."""
    prefix = attempt_prefix(workload_id, attempt_id)
    listing = await store.list(prefix)
    record_key = f"{prefix}/{UPLOAD_RECORD}"
    raw = await store.get(record_key)
    record: UploadRecord | None = None
    if raw is not None:
        try:
            record = decode_upload_record(raw, store.url_of(record_key))
        except StoreError as exc:
            return str(exc)
    return manifest_for(workload_id, attempt_id, epoch, store.name, listing, record, now)


def encode_manifest(m: Manifest) -> bytes:
    return msgspec.json.encode(m)


Outcome = Literal["created", "same", "conflict"]


@dataclass(frozen=True)
class Published:
    """What `publish` found: it wrote the manifest (`created`), this attempt's was already there
    (`same`: a retried promotion, or another replica's), or another one is (`conflict`, with
    the reason; never overwritten). `manifest`: the manifest now in the store (None when what is
    there is not one)."""

    outcome: Outcome
    manifest: Manifest | None
    url: str
    reason: str = ""


async def read_manifest(store: Store, workload_id: str) -> Manifest | None:
    """The workload's result manifest in `store` (None: none there). Raises `StoreError` when
    the object there is not a gpuorch manifest, `StoreUnavailable` when the store does not answer."""
    key = manifest_key(workload_id)
    raw = await store.get(key)
    return decode_manifest(raw, store.url_of(key)) if raw is not None else None


async def publish(store: Store, workload_id: str, attempt_id: str, epoch: int, manifest: Manifest | None) -> Published:
    """Write `manifest` create-only at the workload's manifest key; if one is there, read it:
    this attempt's at this epoch is a retried promotion (done), anything else is a conflict that
    is never overwritten. `manifest` None: only read what is there (a redelivered promotion whose
    outputs could not be read again). Raises `StoreUnavailable` when the store does not answer."""
    key = manifest_key(workload_id)
    url = store.url_of(key)
    for _ in range(3):  # created, or read back; a manifest deleted in between is created again
        if manifest is not None and await store.put(key, encode_manifest(manifest), create_only=True):
            return Published("created", manifest, url)
        raw = await store.get(key)
        if raw is None:
            if manifest is None:
                return Published("conflict", None, url, f"no manifest at {url}, and attempt {attempt_id}'s outputs are not all in the store any more")
            continue
        try:
            existing = decode_manifest(raw, url)
        except StoreError as exc:
            return Published("conflict", None, url, f"{exc}; it is never overwritten")
        if existing.workload_id == workload_id and same_result(existing, attempt_id, epoch):
            return Published("same", existing, url)
        return Published(
            "conflict", existing, url,
            f"{url} already holds the manifest of {existing.workload_id}/{existing.attempt_id} at epoch {existing.epoch}, "
            f"not of {attempt_id} at epoch {epoch} (written by hand, or by something that bypassed the fence); it is never overwritten",
        )  # fmt: skip
    raise StoreUnavailable(f"store {store.name}: put {key!r}: the manifest kept disappearing between a create-only write and its read")


# --- readers ---------------------------------------------------------------------------------------


def result_store(stores: Stores, result_url: str) -> tuple[Store, str]:
    """(store, key) of a result URL (a `promoted.result_path`), or `ResultError`."""
    where = stores.locate(result_url)
    if where is None:
        raise ResultError(f"{result_url[:300]!r} is in none of the registry's stores")
    return stores[where[0]], where[1]


async def resolve_result(stores: Stores, result_url: str) -> Manifest:
    """The manifest a result URL names (what every reader of a result goes through), or
    `ResultError` (no manifest there, not a gpuorch manifest); `StoreUnavailable` when its store
    does not answer."""
    store, key = result_store(stores, result_url)
    raw = await store.get(key)
    if raw is None:
        raise ResultError(f"no result manifest at {result_url}")
    try:
        return decode_manifest(raw, result_url)
    except StoreError as exc:
        raise ResultError(str(exc)) from None


def manifest_object(m: Manifest, key: str) -> ManifestObject:
    for o in m.objects:
        if o.key == key:
            return o
    raise ResultError(f"the result of {m.workload_id} (attempt {m.attempt_id}) has no object {key!r}")


def object_key(m: Manifest, key: str) -> str:
    """The store key of one of the manifest's objects (under the attempt's prefix)."""
    return f"{m.prefix.rstrip('/')}/{manifest_object(m, key).key}"


async def read_object(stores: Stores, m: Manifest, key: str) -> bytes:
    """One object of a result, whole (small ones: metrics, parameters)."""
    store = stores[m.store]
    data = await store.get(object_key(m, key))
    if data is None:
        raise ResultError(f"{store.url_of(object_key(m, key))} is named by the result's manifest but not in the store")
    return data


async def copy_object_to(stores: Stores, m: Manifest, key: str, out: BinaryIO) -> int:
    """Stream one object of a result into `out` (never whole in memory); its size."""
    store = stores[m.store]
    path = object_key(m, key)
    size = 0
    try:
        got = await obstore.get_async(store.client, path)
        async for chunk in got:
            out.write(chunk)
            size += len(chunk)
    except (BrokenPipeError, ResultError):
        raise
    except (NotFoundError, FileNotFoundError):
        raise ResultError(f"{store.url_of(path)} is named by the result's manifest but not in the store") from None
    except Exception as exc:
        raise StoreUnavailable(f"store {store.name} ({store.url_of('')}): get {path!r}: {type(exc).__name__}: {str(exc)[:300]}") from exc
    return size
