"""The object store port: every byte of workload data the control plane (and gpuorch's agent in
a pod) reads or writes goes through here, by URL, through one library: obstore (issue 28).

Why obstore (docs/storage.md has the comparison): create-only writes are native for every scheme
(``put(mode="create")``: ``If-None-Match: *`` on S3, the same precondition on GCS and Azure, an
exclusive create on a local directory), so one code path publishes a manifest on all of them; a
listing is a stream of pages with size and entity tag (no per-object HEAD); the calls have
asyncio twins (the services' loops); server-side copy; one Rust HTTP client with timeouts and
retries, no boto stack. fsspec/s3fs have none of create-only across schemes (s3fs raises
``OSError(EINVAL)`` for a failed ``If-None-Match``), and async only through aiobotocore.

Pure rules (keys, listings, manifests) are in :mod:`gpuorch_proto.storage`.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

import obstore
from obstore.exceptions import AlreadyExistsError, NotFoundError, PreconditionError
from obstore.store import AzureStore, GCSStore, LocalStore, S3Store

if TYPE_CHECKING:  # typed dicts of the stubs only
    from obstore.store import ClientConfig, RetryConfig

from gpuorch_proto.storage import ObjectInfo, StoreConfig, StoreError, StoreURL, credential_env, parse_url

#: Each request's limits: a store that answers slowly or not at all is an error with a reason,
#: never a hung service loop.
CLIENT_OPTIONS: ClientConfig = {"connect_timeout": "5s", "timeout": "30s"}
RETRY: RetryConfig = {"max_retries": 3, "retry_timeout": timedelta(seconds=20)}


class StoreUnavailable(Exception):
    """The store did not do what was asked (unreachable, refused, 5xx after retries): the
    message says which store, which operation, which key and why."""


@dataclass
class Store:
    """One named store: its URL, and the obstore client rooted at it."""

    name: str
    url: StoreURL
    client: Any

    def url_of(self, key: str) -> str:
        return self.url.join(key)

    def _fail(self, op: str, key: str, exc: BaseException) -> StoreUnavailable:
        text = str(exc).splitlines()[0][:300] if str(exc) else type(exc).__name__
        return StoreUnavailable(f"store {self.name} ({self.url.join('')}): {op} {key!r}: {type(exc).__name__}: {text}")

    async def list(self, prefix: str) -> list[ObjectInfo]:
        """Every object under `prefix` (a "directory": its keys relative to it), page by page."""
        base = prefix.strip("/") + "/"
        out: list[ObjectInfo] = []
        try:
            async for page in obstore.list(self.client, prefix=base, chunk_size=1000):
                for o in page:
                    path = str(o["path"])
                    if path.startswith(base):
                        out.append(ObjectInfo(path[len(base) :], int(o["size"]), o.get("e_tag")))
        except (NotFoundError, FileNotFoundError):
            return []
        except Exception as exc:
            raise self._fail("list", base, exc) from exc
        return out

    async def get(self, key: str) -> bytes | None:
        """The object's bytes, or None when there is none."""
        try:
            got = await obstore.get_async(self.client, key)
            return bytes(await got.bytes_async())
        except (NotFoundError, FileNotFoundError):
            return None
        except Exception as exc:
            raise self._fail("get", key, exc) from exc

    async def put(self, key: str, data: bytes, *, create_only: bool = False) -> bool:
        """Store `data` at `key`. `create_only`: only if no object is there (the store's own
        compare-and-set); False when one already was (nothing written)."""
        try:
            await obstore.put_async(self.client, key, data, mode="create" if create_only else "overwrite")
            return True
        except (AlreadyExistsError, PreconditionError, FileExistsError):
            if create_only:
                return False
            raise
        except Exception as exc:
            raise self._fail("put", key, exc) from exc

    async def put_file(self, key: str, path: Path) -> None:
        """Upload a local file (streamed, multipart when large)."""
        try:
            await obstore.put_async(self.client, key, path)
        except Exception as exc:
            raise self._fail("put", key, exc) from exc

    async def get_file(self, key: str, path: Path) -> int:
        """Download an object into a local file (streamed); its size."""
        return (await self._get_file(key, path, None))[0]

    async def get_file_sha256(self, key: str, path: Path) -> tuple[int, str]:
        """Download an object into a local file (streamed), hashing the bytes as they arrive
        (no second read of the file): its size and sha256 (hex)."""
        size, digest = await self._get_file(key, path, hashlib.sha256())
        return size, digest

    async def _get_file(self, key: str, path: Path, hasher: Any) -> tuple[int, str]:
        size = 0
        try:
            got = await obstore.get_async(self.client, key)
            with path.open("wb") as f:
                async for chunk in got:
                    f.write(chunk)
                    if hasher is not None:
                        hasher.update(chunk)
                    size += len(chunk)
        except Exception as exc:
            raise self._fail("get", key, exc) from exc
        return size, hasher.hexdigest() if hasher is not None else ""

    async def copy(self, src: str, dst: str) -> None:
        """Server-side copy (no bytes through this process)."""
        try:
            await obstore.copy_async(self.client, src, dst)
        except Exception as exc:
            raise self._fail("copy", f"{src} -> {dst}", exc) from exc

    async def delete(self, key: str) -> None:
        try:
            await obstore.delete_async(self.client, key)
        except (NotFoundError, FileNotFoundError):
            return
        except Exception as exc:
            raise self._fail("delete", key, exc) from exc


def open_store(name: str, config: StoreConfig, env: Mapping[str, str]) -> Store:
    """The client of a store, with the credentials this process holds for it (its environment:
    ``GPUORCH_STORE_<NAME>_*``, `credential_env`); none for file://."""
    url = parse_url(config.url, f"stores.{name}.url")
    e = env
    pre = credential_env(name)
    opts: ClientConfig = {**CLIENT_OPTIONS}
    client: Any
    if url.scheme == "file":
        Path(url.prefix).mkdir(parents=True, exist_ok=True)
        client = LocalStore(url.prefix, mkdir=True)
    elif url.scheme == "s3":
        kw: dict[str, Any] = {"region": config.region or "us-east-1"}
        if config.endpoint:
            kw["endpoint"] = config.endpoint
            kw["virtual_hosted_style_request"] = False
            opts["allow_http"] = config.endpoint.startswith("http://")
        key, secret = e.get(pre + "ACCESS_KEY_ID"), e.get(pre + "SECRET_ACCESS_KEY")
        if key and secret:
            kw.update(access_key_id=key, secret_access_key=secret)
        elif key or secret:
            raise StoreError(f"stores.{name}: {pre}ACCESS_KEY_ID and {pre}SECRET_ACCESS_KEY go together")
        client = S3Store(url.bucket, prefix=url.prefix or None, client_options=opts, retry_config=RETRY, **kw)
    elif url.scheme == "gs":
        gkw: dict[str, Any] = {}
        if sa := e.get(pre + "SERVICE_ACCOUNT"):
            gkw["service_account_key"] = sa
        client = GCSStore(url.bucket, prefix=url.prefix or None, client_options=opts, retry_config=RETRY, **gkw)
    else:
        akw: dict[str, Any] = {}
        if acct := e.get(pre + "ACCOUNT_NAME"):
            akw["account_name"] = acct
        if akey := e.get(pre + "ACCOUNT_KEY"):
            akw["account_key"] = akey
        client = AzureStore(url.bucket, prefix=url.prefix or None, client_options=opts, retry_config=RETRY, **akw)
    return Store(name, url, client)


class Stores:
    """The stores this process knows, by name: the registry's (`stores:`), and for any other
    name the embedded default, a file:// directory under `default_root` (one per name)."""

    def __init__(self, configs: Mapping[str, StoreConfig], default_root: Path | None, env: Mapping[str, str]) -> None:
        self.configs = dict(configs)
        self.default_root = default_root
        self.env = env
        self._open: dict[str, Store] = {}

    def config(self, name: str) -> StoreConfig:
        c = self.configs.get(name)
        if c is not None:
            return c
        if self.default_root is None:
            raise StoreError(f"store {name!r} is not in the registry's stores")
        return StoreConfig(url=(self.default_root / name).resolve().as_uri())

    def __getitem__(self, name: str) -> Store:
        s = self._open.get(name)
        if s is None:
            s = self._open[name] = open_store(name, self.config(name), self.env)
        return s

    def url(self, name: str) -> str:
        """The store's root URL (what a Job and the events name)."""
        return parse_url(self.config(name).url, f"stores.{name}.url").join("")

    def locate(self, url: str) -> tuple[str, str] | None:
        """(store name, key) of a URL inside one of these stores (the longest root that holds it),
        or None: how a URL an event carries is read back through the store it names."""
        best: tuple[str, str] | None = None
        for name in self.configs:
            root = self.url(name).rstrip("/") + "/"
            if url.startswith(root) and (best is None or len(root) > len(self.url(best[0]))):
                best = (name, url[len(root) :])
        return best
