"""NATS connection and JetStream topology (streams and KV buckets from `gpuorch_proto`).

`connect(url, name, creds=...)` authenticates with the identity's nkey seed file (see
`gpuorch.security`) and takes its replies on that identity's own inbox (`_INBOX.<public key>`);
`.creds` files (decentralized JWT) are passed as user credentials. A URL's user:password never
reaches a log line or an error (`redact_url`).

`ensure_topology` is idempotent and needs the admin identity (only it may create or update
streams and buckets): `gpuorch up` and the deployment's topology Job run it once at start-up.
Services only wait for the topology to exist (`await_topology`). JetStream answers a create with
an identical config with the existing stream; if a stream exists with a different config (an
older release's duplicate window, say) it is updated to the current one.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import ssl
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import nats
import nats.errors
import nats.js.errors
import structlog
from nats.aio.client import Client
from nats.js import JetStreamContext
from nats.js.api import DiscardPolicy, KeyValueConfig, RetentionPolicy, StorageType, StreamConfig

from gpuorch.config import Settings, Tuning
from gpuorch.security.bundle import public_key_of, read_seed
from gpuorch.security.model import inbox_prefix
from gpuorch_proto import Names, kv_buckets, streams
from gpuorch_proto.subjects import StreamSpec

log = structlog.get_logger("gpuorch.runtime.bus")

KV_HISTORY = 5  # revisions kept per key in the CAS buckets (for inspection; the log is the record)
_STREAM_NAME_IN_USE = 10058


def redact_url(url: str) -> str:
    """`nats://user:secret@host:4222,...` -> `nats://***@host:4222,...`: safe to log."""
    out = []
    for part in url.split(","):
        part = part.strip()
        try:
            u = urlsplit(part if "://" in part else f"nats://{part}")
        except ValueError:
            out.append("<unparseable url>")
            continue
        if u.username is not None or u.password is not None:
            host = u.hostname or ""
            netloc = f"***@{host}" + (f":{u.port}" if u.port else "")
            part = urlunsplit((u.scheme, netloc, u.path, u.query, u.fragment))
        out.append(part)
    return ",".join(out)


def tls_context(ca_file: str | None = None, cert_file: str | None = None, key_file: str | None = None) -> ssl.SSLContext:
    """A client TLS context: verify the server against `ca_file` (system CAs without it); present
    `cert_file`/`key_file` when the server requires client certificates."""
    ctx = ssl.create_default_context(cafile=ca_file)
    if cert_file:
        ctx.load_cert_chain(cert_file, key_file)
    return ctx


def auth_options(creds: str | os.PathLike[str] | None) -> dict[str, Any]:
    """nats-py connect options for an identity's credentials file (nkey seed or JWT `.creds`)."""
    if not creds:
        return {}
    path = Path(creds)
    if path.suffix == ".creds":
        return {"user_credentials": str(path)}
    try:
        public = public_key_of(read_seed(path))
    except Exception as exc:  # never echo the file's content
        raise ValueError(f"credentials file {path} is not an nkey seed ({type(exc).__name__})") from None
    return {"nkeys_seed": str(path), "inbox_prefix": inbox_prefix(public)}


async def connect_as(settings: Settings, name: str, **options: Any) -> Client:
    """A NATS connection as this process's identity: its creds and TLS from `settings`
    (GPUORCH_NATS_CREDS, GPUORCH_NATS_TLS_*), the URL its `nats_url`; `connect` for the rest."""
    tls = None
    if settings.nats_tls_ca or settings.nats_tls_cert:
        tls = tls_context(
            str(settings.nats_tls_ca) if settings.nats_tls_ca else None,
            str(settings.nats_tls_cert) if settings.nats_tls_cert else None,
            str(settings.nats_tls_key) if settings.nats_tls_key else None,
        )
    return await connect(settings.nats_url, name, creds=settings.nats_creds, tls=tls, **options)


async def connect(
    url: str,
    name: str,
    *,
    creds: str | os.PathLike[str] | None = None,
    tls: ssl.SSLContext | None = None,
    connect_timeout: float = 2.0,
    reconnect_time_wait: float = 0.25,
    initial_timeout: float = 30.0,
    **options: Any,
) -> Client:
    """Connect with endless reconnects; retries the first connect for up to `initial_timeout` s.

    `creds`: the identity's nkey seed file (or a JWT `.creds` file); `tls`: a client TLS context
    (`tls_context`). A `tls://` URL without `tls` uses the system's CAs.

    Errors, disconnects and reconnects are logged (`nats.error`, `nats.disconnected`,
    `nats.reconnected`, `nats.closed`). Close with `await nc.close()` (not `drain()`: after a
    timed-out pull fetch nats-py's drain can wait ~30 s for the dead pull request).
    """
    bound = log.bind(connection=name)
    safe_url = redact_url(url)

    async def error_cb(exc: Exception) -> None:
        bound.warning("nats.error", error=_redact_text(repr(exc), url))

    async def disconnected_cb() -> None:
        if not nc.is_closed:  # closing on purpose also "disconnects"
            bound.warning("nats.disconnected")

    async def reconnected_cb() -> None:
        bound.info("nats.reconnected", url=redact_url(nc.connected_url.geturl()) if nc.connected_url else None)

    async def closed_cb() -> None:
        bound.info("nats.closed")

    nc = Client()
    if tls is not None:
        options["tls"] = tls
    options.update(auth_options(creds))
    # With max_reconnect_attempts=-1 nats-py retries the *first* connect forever too (calling
    # error_cb each time); bound it so a wrong URL fails instead of hanging.
    try:
        await asyncio.wait_for(
            nc.connect(
                servers=[u.strip() for u in url.split(",") if u.strip()],  # a cluster: "nats://a:4222,nats://b:4222"
                name=name,
                connect_timeout=connect_timeout,  # type: ignore[arg-type]  # nats-py annotates int; floats work
                reconnect_time_wait=reconnect_time_wait,  # type: ignore[arg-type]
                max_reconnect_attempts=-1,
                allow_reconnect=True,
                error_cb=error_cb,
                disconnected_cb=disconnected_cb,
                reconnected_cb=reconnected_cb,
                closed_cb=closed_cb,
                **options,
            ),
            timeout=initial_timeout,
        )
    except TimeoutError:
        with contextlib.suppress(Exception):
            await nc.close()
        raise TimeoutError(f"could not connect to NATS at {safe_url} within {initial_timeout:g}s") from None
    except Exception as exc:
        with contextlib.suppress(Exception):
            await nc.close()
        raise ConnectionError(f"could not connect to NATS at {safe_url}: {_redact_text(str(exc), url)}") from None
    return nc


def _redact_text(text: str, url: str) -> str:
    """`text` without any user:password of `url` (nats-py errors may quote the URL)."""
    for part in url.split(","):
        with contextlib.suppress(ValueError):
            u = urlsplit(part.strip())
            for secret in (u.password, u.username):
                if secret:
                    text = text.replace(secret, "***")
    return text


async def await_topology(js: JetStreamContext, names: Names, timeout: float = 60.0) -> None:
    """Until every stream and bucket of `names` exists (the admin creates them at start-up);
    services may read stream info but not create streams."""
    wanted = [spec.name for spec in streams(names)] + [f"KV_{b}" for b in kv_buckets(names)]
    deadline = time.monotonic() + timeout
    missing: list[str] = wanted
    while True:
        still: list[str] = []
        for stream in missing:
            try:
                await js.stream_info(stream)
            except nats.js.errors.NotFoundError:
                still.append(stream)
        missing = still
        if not missing:
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"the topology is not there after {timeout:g}s (missing {', '.join(missing)}): "
                               "it is created by the admin identity (`gpuorch up`, the topology Job)")
        log.info("topology.waiting", missing=missing)
        await asyncio.sleep(0.25)


def replicas() -> int:
    """Stream and bucket replicas: 1 on one server, 3 (or 5) on a JetStream cluster."""
    return Tuning.from_env().replicas


MAX_MSG_SIZE = 1024 * 1024  # bytes, as the server's max_payload (gpuorch.security.bundle.MAX_PAYLOAD)
KV_MAX_VALUE = 64 * 1024  # bytes per KV value (fence records, leases, staged entries are small)
DAY = 86400.0


def stream_limits(spec: StreamSpec) -> dict[str, Any]:
    """Caps of each stream: commands expire (`GPUORCH_CMD_MAX_AGE`, default 7 days, never below
    the duplicate window), sizes capped (`GPUORCH_<CMD|EVT|INVENTORY>_MAX_BYTES`), every
    message at most MAX_MSG_SIZE. The event log is the record: it does not expire by age."""
    t = Tuning.from_env()
    kind = spec.name.rsplit("_", 1)[-1]
    max_bytes = {"CMD": t.cmd_max_bytes, "EVT": t.evt_max_bytes, "INVENTORY": t.inventory_max_bytes}.get(kind, t.cmd_max_bytes)
    limits: dict[str, Any] = {"max_msg_size": MAX_MSG_SIZE, "max_bytes": max_bytes}
    if kind == "CMD":
        limits["max_age"] = max(t.cmd_max_age, spec.duplicate_window_s)
    return limits


def discard_policy(spec: StreamSpec) -> DiscardPolicy:
    """What a full stream does. The event log refuses new events (`NEW`: the publisher gets an
    error, retries, and the operator is told) rather than dropping old ones, which state that no
    snapshot covers may still need (docs/operations.md, "Retention"); commands and inventory
    snapshots are only wanted while fresh, so they drop the oldest."""
    return DiscardPolicy.NEW if spec.name.endswith("_EVT") else DiscardPolicy.OLD


def _stream_config(spec: StreamSpec) -> StreamConfig:
    return StreamConfig(
        **stream_limits(spec),
        num_replicas=replicas(),
        name=spec.name,
        subjects=list(spec.subjects),
        retention=RetentionPolicy.LIMITS,
        storage=StorageType.FILE,
        discard=discard_policy(spec),
        max_msgs_per_subject=spec.max_msgs_per_subject,
        duplicate_window=spec.duplicate_window_s,
        allow_direct=True,
    )


async def ensure_stream(js: JetStreamContext, config: StreamConfig) -> None:
    """Create the stream, or bring an existing one with a different config up to `config`."""
    try:
        await js.add_stream(config)
        return
    except nats.js.errors.BadRequestError as exc:
        if exc.err_code != _STREAM_NAME_IN_USE:
            raise
    log.info("topology.stream_update", stream=config.name)
    await js.update_stream(config)


SNAPSHOT_MAX_VALUE = MAX_MSG_SIZE - 64 * 1024  # a chunk of a state snapshot and its headers
SNAPSHOT_MAX_BYTES = 4 << 30  # two slots of each owner's snapshot (gpuorch.runtime.snapshot)


async def ensure_kv(
    js: JetStreamContext,
    bucket: str,
    history: int = KV_HISTORY,
    *,
    max_value_size: int = KV_MAX_VALUE,
    max_bytes: int = 64 << 20,
) -> None:
    """Create the KV bucket (idempotent; an existing bucket with another config is updated)."""
    cfg = KeyValueConfig(
        bucket=bucket, history=history, storage=StorageType.FILE, replicas=replicas(),
        max_value_size=max_value_size, max_bytes=max_bytes,
    )  # fmt: skip
    try:
        await js.create_key_value(cfg)
        return
    except nats.js.errors.BadRequestError as exc:
        if exc.err_code != _STREAM_NAME_IN_USE:
            raise
    # Exists with another config (e.g. different history): keep it, it is usable as a bucket.
    kv = await js.key_value(bucket)
    log.info("topology.kv_exists", bucket=bucket, stream=kv._stream)


async def ensure_topology(js: JetStreamContext, names: Names) -> None:
    """Every stream in `streams(names)` and every bucket in `kv_buckets(names)`, idempotently."""
    await asyncio.gather(*(ensure_stream(js, _stream_config(spec)) for spec in streams(names)))
    await asyncio.gather(*(ensure_kv(js, bucket) for bucket in kv_buckets(names) if bucket != names.kv_snapshots))
    await ensure_kv(js, names.kv_snapshots, 1, max_value_size=SNAPSHOT_MAX_VALUE, max_bytes=SNAPSHOT_MAX_BYTES)


async def delete_topology(js: JetStreamContext, names: Names) -> None:
    """Remove the streams and buckets of `names` (tests; tearing down a prefix). Ignores missing."""
    for spec in streams(names):
        try:
            await js.delete_stream(spec.name)
        except nats.js.errors.NotFoundError:
            pass
    for bucket in kv_buckets(names):
        try:
            await js.delete_key_value(bucket)
        except nats.js.errors.NotFoundError:
            pass
