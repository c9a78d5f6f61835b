"""Object stores by URL, attempt prefixes, upload records and result manifests (issue 28).

Pure: no I/O. The control plane and the pods share no disk (DESIGN §6): an attempt writes under
``<store>/<workload>/attempts/<attempt>/`` in an object store named by URL in the registry, and a
result is published by writing one **manifest** object create-only at
``<store>/<workload>/result/manifest.json``: the store's own compare-and-set, so two fencers
racing publish one result and no object's bytes pass through the fencer.

An attempt's prefix holds:

- its outputs (any keys the program wrote, uploaded by gpuorch's agent);
- ``checkpoints/``: the program's checkpoints, uploaded as they appear (a resume on another
  cluster lists them, `latest_checkpoint`);
- ``.gpuorch/upload.json``: the agent's **upload record**, written last, after every output
  object is stored: each object's key, size and sha256. Only an upload with a record counts
  (`manifest_for`): an upload cut in the middle has none, so it is never promoted.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Final, Literal
from urllib.parse import urlsplit

import msgspec

from .subjects import valid_token

#: The schemes a store URL may have, and what each is.
SCHEMES: Final = {"s3": "Amazon S3 or any S3 API (endpoint)", "gs": "Google Cloud Storage", "az": "Azure Blob Storage", "file": "a local directory (the embedded default)"}

#: Inside an attempt's prefix: what gpuorch itself writes (never an output).
META_DIR: Final = ".gpuorch"
UPLOAD_RECORD: Final = f"{META_DIR}/upload.json"
MARKER: Final = f"{META_DIR}/started.json"  # the program's first step (gpuorch.observe.progress)
PROGRESS: Final = f"{META_DIR}/progress.json"  # the program's useful work so far (gpuorch.observe.progress)
CHECKPOINTS: Final = "checkpoints"
MANIFEST: Final = "manifest.json"

Scheme = Literal["s3", "gs", "az", "file"]


class StoreError(ValueError):
    """A store named or configured wrongly: says what and where."""


class StoreConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """One artifact or checkpoint store, as the clusters file names it (`stores: {name: ...}`).

    Credentials are never here: the control plane reads its own from its environment
    (`credential_env`), and each cluster names the Secret its pods read (`store_credentials` in
    its registry entry)."""

    url: str  # s3://bucket/prefix, gs://bucket/prefix, az://container/prefix, file:///abs/dir
    endpoint: str | None = None  # S3 API endpoint (MinIO, SeaweedFS, R2...); None: the cloud's own
    region: str | None = None


class StoreURL(msgspec.Struct, frozen=True):
    scheme: Scheme
    bucket: str  # bucket or container; "" for file://
    prefix: str  # inside the bucket, without leading or trailing "/"; for file:// the directory

    def join(self, *keys: str) -> str:
        """The URL of a key (relative to the store's root)."""
        parts = [p.strip("/") for p in (self.prefix, *keys) if p.strip("/")]
        if self.scheme == "file":
            return "file:///" + "/".join(parts)
        return f"{self.scheme}://{self.bucket}/" + "/".join(parts)


def parse_url(url: str, at: str = "url") -> StoreURL:
    """A store's URL, checked: a known scheme, a bucket, no credentials, no query."""
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme not in SCHEMES:
        names = [f"{s}://" for s in SCHEMES]
        known = ", ".join(names[:-1]) + " or " + names[-1]
        raise StoreError(f"{at}: unknown scheme {parts.scheme + '://' if parts.scheme else '(none)'} in {url[:200]!r}: use {known}")
    if parts.username or parts.password:
        raise StoreError(f"{at}: a store URL carries no credentials (name a Secret in the cluster's store_credentials)")
    if parts.query or parts.fragment:
        raise StoreError(f"{at}: a store URL has no query or fragment: {url[:200]!r}")
    if scheme == "file":
        if parts.netloc not in ("", "localhost") or not parts.path.startswith("/"):
            raise StoreError(f"{at}: a file:// store is an absolute directory (file:///dir): {url[:200]!r}")
        return StoreURL("file", "", parts.path.rstrip("/") or "/")
    if not parts.netloc:
        raise StoreError(f"{at}: {scheme}:// needs a bucket: {url[:200]!r}")
    return StoreURL(scheme, parts.netloc, parts.path.strip("/"))  # type: ignore[arg-type]


def credential_env(store: str) -> str:
    """The prefix of the variables that carry a store's credentials to a process (the control
    plane's services, gpuorch's agent in a pod): ``GPUORCH_STORE_<NAME>_``, then
    ``ACCESS_KEY_ID`` / ``SECRET_ACCESS_KEY`` (s3), ``SERVICE_ACCOUNT`` (gs),
    ``ACCOUNT_NAME`` / ``ACCOUNT_KEY`` (az)."""
    return "GPUORCH_STORE_" + "".join(c if c.isalnum() else "_" for c in store).upper() + "_"


#: The keys a store credential Secret holds, per scheme (the agent reads them as env variables).
SECRET_KEYS: Final[dict[str, tuple[str, ...]]] = {
    "s3": ("access_key_id", "secret_access_key"),
    "gs": ("service_account",),
    "az": ("account_name", "account_key"),
    "file": (),
}


# --- keys ---------------------------------------------------------------------------------------


def attempt_prefix(workload_id: str, attempt_id: str) -> str:
    """An attempt's prefix inside its store (ids are checked tokens: no "/" or ".." in them)."""
    if not (valid_token(workload_id) and valid_token(attempt_id)):
        raise StoreError(f"not a workload/attempt id: {workload_id[:80]!r}/{attempt_id[:80]!r}")
    return f"{workload_id}/attempts/{attempt_id}"


def checkpoints_prefix(workload_id: str, attempt_id: str) -> str:
    return f"{attempt_prefix(workload_id, attempt_id)}/{CHECKPOINTS}"


def manifest_key(workload_id: str) -> str:
    if not valid_token(workload_id):
        raise StoreError(f"not a workload id: {workload_id[:80]!r}")
    return f"{workload_id}/result/{MANIFEST}"


# --- what the store lists ------------------------------------------------------------------------


class ObjectInfo(msgspec.Struct, frozen=True):
    """One object as a listing says: its key relative to the listed prefix, size, entity tag."""

    key: str
    size: int
    etag: str | None = None


def latest_checkpoint(listing: list[ObjectInfo]) -> str | None:
    """The newest checkpoint under a checkpoints prefix: the greatest complete name (programs
    write a temporary name and rename, or upload whole objects; ``*.tmp`` and dot-files are
    partial), by the name's natural order (``ckpt-9`` before ``ckpt-10``)."""
    names = [o.key for o in listing if "/" not in o.key and not o.key.endswith(".tmp") and not o.key.startswith(".")]
    return max(names, key=_natural, default=None)


def _natural(name: str) -> list[tuple[int, int | str]]:
    return [(0, int(t)) if t.isdigit() else (1, t) for t in re.split(r"(\d+)", name) if t]


# --- the agent's upload record -------------------------------------------------------------------


class UploadedObject(msgspec.Struct, frozen=True):
    key: str  # relative to the attempt's prefix
    size: int
    sha256: str


class UploadRecord(msgspec.Struct, frozen=True, kw_only=True):
    """What gpuorch's agent uploaded of an attempt's outputs, written last (`UPLOAD_RECORD`)."""

    schema_version: int = 1
    workload_id: str
    attempt_id: str
    objects: list[UploadedObject]
    completed_at: float


# --- the result manifest -------------------------------------------------------------------------


class ManifestObject(msgspec.Struct, frozen=True):
    key: str  # relative to the manifest's `prefix`
    size: int
    sha256: str
    etag: str | None = None


class Manifest(msgspec.Struct, frozen=True, kw_only=True):
    """A workload's result: which attempt (and epoch) published which objects. Written once,
    create-only, by the fencer; what every reader resolves a result through."""

    schema_version: int = 1
    kind: Literal["gpuorch.result"] = "gpuorch.result"
    workload_id: str
    attempt_id: str
    epoch: int
    store: str  # the store's name in the registry
    prefix: str  # the attempt's prefix in that store: the objects are under it
    objects: list[ManifestObject]
    total_bytes: int
    created_at: float


def manifest_for(
    workload_id: str, attempt_id: str, epoch: int, store: str, listing: list[ObjectInfo], record: UploadRecord | None, now: float
) -> Manifest | str:
    """The manifest of an attempt's outputs, or why there is none (a recorded reason).

    `listing`: the attempt's prefix as the store lists it now (keys relative to it). Only what
    the agent's record names is published, and only if every object it names is there with its
    size: an upload cut in the middle, an object deleted since, or a record for another attempt
    publishes nothing."""
    if record is None:
        return "no upload record: the attempt's upload did not complete (nothing is published)"
    if (record.workload_id, record.attempt_id) != (workload_id, attempt_id):
        return f"the upload record is for {record.workload_id}/{record.attempt_id}, not this attempt"
    sizes = {o.key: o for o in listing}
    objects: list[ManifestObject] = []
    for u in record.objects:
        if u.key.startswith(f"{META_DIR}/") or u.key.startswith("/") or ".." in u.key.split("/"):
            return f"the upload record names {u.key[:200]!r}, outside the attempt's outputs"
        seen = sizes.get(u.key)
        if seen is None:
            return f"{u.key[:200]!r} is in the upload record but not in the store"
        if seen.size != u.size:
            return f"{u.key[:200]!r} is {seen.size} bytes in the store, {u.size} in the upload record"
        objects.append(ManifestObject(u.key, u.size, u.sha256, seen.etag))
    return Manifest(
        workload_id=workload_id, attempt_id=attempt_id, epoch=epoch, store=store,
        prefix=attempt_prefix(workload_id, attempt_id), objects=sorted(objects, key=lambda o: o.key),
        total_bytes=sum(o.size for o in objects), created_at=now,
    )  # fmt: skip


def same_result(existing: Manifest, attempt_id: str, epoch: int) -> bool:
    """Is a manifest already in the store this attempt's (a retried promotion: done), or
    another's (a race lost, or a manifest someone wrote by hand: never overwritten)?"""
    return existing.attempt_id == attempt_id and existing.epoch == epoch


_manifest_decoder = msgspec.json.Decoder(Manifest)
_record_decoder = msgspec.json.Decoder(UploadRecord)


def decode_manifest(data: bytes, at: str) -> Manifest:
    try:
        return _manifest_decoder.decode(data)
    except msgspec.DecodeError as exc:
        raise StoreError(f"{at}: not a gpuorch result manifest: {exc}") from None


def decode_upload_record(data: bytes, at: str) -> UploadRecord:
    try:
        return _record_decoder.decode(data)
    except msgspec.DecodeError as exc:
        raise StoreError(f"{at}: not a gpuorch upload record: {exc}") from None


# --- a store as a pod sees it ---------------------------------------------------------------------


def pod_store_env(name: str, config: StoreConfig, secret: str | None) -> list[dict[str, object]]:
    """The env entries that give gpuorch's agent in a pod one store: its URL, endpoint and region
    as values, its credentials as `secretKeyRef`s into the cluster's Secret `secret` (the keys of
    `SECRET_KEYS`; `optional` so a pod on a cluster that reaches the store without keys, through
    its node's identity, still starts). gpuorch's records hold only the Secret's name."""
    pre = credential_env(name)
    url = parse_url(config.url, f"stores.{name}.url")
    out: list[dict[str, object]] = [{"name": pre + "URL", "value": config.url}]
    if config.endpoint:
        out.append({"name": pre + "ENDPOINT", "value": config.endpoint})
    if config.region:
        out.append({"name": pre + "REGION", "value": config.region})
    if secret:
        for key in SECRET_KEYS[url.scheme]:
            ref = {"name": secret, "key": key, "optional": True}
            out.append({"name": pre + key.upper(), "valueFrom": {"secretKeyRef": ref}})
    return out


def config_from_env(name: str, env: Mapping[str, str]) -> StoreConfig:
    """A store's config as `pod_store_env` handed it to a process (gpuorch's agent)."""
    pre = credential_env(name)
    get = env.get
    url = get(pre + "URL")
    if not url:
        raise StoreError(f"store {name!r}: {pre}URL is not set: the Job names no such store")
    parse_url(url, pre + "URL")
    return StoreConfig(url=url, endpoint=get(pre + "ENDPOINT") or None, region=get(pre + "REGION") or None)
