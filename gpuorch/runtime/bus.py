"""NATS connection and JetStream topology (streams and KV buckets from `gpuorch_proto`).

`ensure_topology` is idempotent: every service calls it at start (possibly four at once, and
again after a restart). JetStream answers a create with an identical config with the existing
stream; if a stream exists with a different config (an older release's duplicate window, say)
it is updated to the current one.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from typing import Any

import nats
import nats.errors
import nats.js.errors
import structlog
from nats.aio.client import Client
from nats.js import JetStreamContext
from nats.js.api import DiscardPolicy, KeyValueConfig, RetentionPolicy, StorageType, StreamConfig

from gpuorch_proto import Names, kv_buckets, streams
from gpuorch_proto.subjects import StreamSpec

log = structlog.get_logger("gpuorch.runtime.bus")

KV_HISTORY = 5  # revisions kept per key in the CAS buckets (for inspection; the log is the record)
_STREAM_NAME_IN_USE = 10058


async def connect(
    url: str,
    name: str,
    *,
    connect_timeout: float = 2.0,
    reconnect_time_wait: float = 0.25,
    initial_timeout: float = 30.0,
    **options: Any,
) -> Client:
    """Connect with endless reconnects; retries the first connect for up to `initial_timeout` s.

    Errors, disconnects and reconnects are logged (`nats.error`, `nats.disconnected`,
    `nats.reconnected`, `nats.closed`). Close with `await nc.close()` (not `drain()`: after a
    timed-out pull fetch nats-py's drain can wait ~30 s for the dead pull request).
    """
    bound = log.bind(connection=name)

    async def error_cb(exc: Exception) -> None:
        bound.warning("nats.error", error=repr(exc))

    async def disconnected_cb() -> None:
        if not nc.is_closed:  # closing on purpose also "disconnects"
            bound.warning("nats.disconnected")

    async def reconnected_cb() -> None:
        bound.info("nats.reconnected", url=str(nc.connected_url.netloc) if nc.connected_url else None)

    async def closed_cb() -> None:
        bound.info("nats.closed")

    nc = Client()
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
        raise TimeoutError(f"could not connect to NATS at {url} within {initial_timeout:g}s") from None
    return nc


def replicas() -> int:
    """Stream and bucket replicas: 1 on one server, 3 (or 5) on a JetStream cluster."""
    return max(1, int(os.environ.get("GPUORCH_REPLICAS", "1")))


def _stream_config(spec: StreamSpec) -> StreamConfig:
    return StreamConfig(
        num_replicas=replicas(),
        name=spec.name,
        subjects=list(spec.subjects),
        retention=RetentionPolicy.LIMITS,
        storage=StorageType.FILE,
        discard=DiscardPolicy.OLD,
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


async def ensure_kv(js: JetStreamContext, bucket: str, history: int = KV_HISTORY) -> None:
    """Create the KV bucket (idempotent; an existing bucket with another config is updated)."""
    cfg = KeyValueConfig(bucket=bucket, history=history, storage=StorageType.FILE, replicas=replicas())
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
    await asyncio.gather(*(ensure_kv(js, bucket) for bucket in kv_buckets(names)))


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
