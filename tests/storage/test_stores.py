"""The object store port (gpuorch.objectstore) against a real S3 server and a local directory:
one code path, the same answers."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from gpuorch.dev.seaweed import SeaweedS3
from gpuorch.objectstore import Store, Stores, StoreUnavailable, open_store
from gpuorch_proto.storage import StoreConfig, StoreError, parse_url
from tests.storage.conftest import file_store, s3_store


@pytest.fixture(params=["s3", "file"])
def store(request: pytest.FixtureRequest, s3: SeaweedS3, tmp_path: Path) -> Store:
    if request.param == "s3":
        return s3_store(s3, prefix=f"t-{tmp_path.name}")
    return file_store(tmp_path / "store")


async def test_put_get_list_and_create_only(store: Store) -> None:
    assert await store.get("w/a.txt") is None
    assert await store.put("w/a.txt", b"one")
    assert await store.put("w/sub/b.txt", b"twenty two")
    assert await store.get("w/a.txt") == b"one"
    listing = {o.key: o.size for o in await store.list("w")}
    assert listing == {"a.txt": 3, "sub/b.txt": 10}
    assert await store.list("nothing-here") == []
    # create-only: the second writer writes nothing
    assert await store.put("w/m.json", b"first", create_only=True) is True
    assert await store.put("w/m.json", b"second", create_only=True) is False
    assert await store.get("w/m.json") == b"first"


async def test_server_side_copy_and_files(store: Store, tmp_path: Path) -> None:
    src = tmp_path / "in.bin"
    src.write_bytes(b"x" * 100_000)
    await store.put_file("f/in.bin", src)
    await store.copy("f/in.bin", "f/copy.bin")
    out = tmp_path / "out.bin"
    assert await store.get_file("f/copy.bin", out) == 100_000 and out.read_bytes() == src.read_bytes()


async def test_two_writers_racing_create_only_one_wins_every_time(s3: SeaweedS3) -> None:
    """The property promotion rests on, against the real server: 100 races of two clients
    (separate connections), each race exactly one winner, and the object is the winner's."""
    a, b = s3_store(s3, prefix="race"), s3_store(s3, prefix="race")
    for i in range(100):
        won = await asyncio.gather(a.put(f"r{i}", b"a", create_only=True), b.put(f"r{i}", b"b", create_only=True))
        assert sorted(won) == [False, True], (i, won)
        assert await a.get(f"r{i}") == (b"a" if won[0] else b"b")


def test_urls_are_checked_with_the_field_and_the_reason() -> None:
    assert parse_url("s3://bucket/a/b/").join("w", "attempts") == "s3://bucket/a/b/w/attempts"
    assert parse_url("file:///var/gpuorch/stores/prod").join("x") == "file:///var/gpuorch/stores/prod/x"
    with pytest.raises(StoreError, match=r"stores.prod.url: unknown scheme ftp:// .* use s3://, gs://, az:// or file://"):
        parse_url("ftp://host/x", "stores.prod.url")
    with pytest.raises(StoreError, match="carries no credentials"):
        parse_url("s3://key:secret@bucket/x")
    with pytest.raises(StoreError, match="needs a bucket"):
        parse_url("s3:///x")
    with pytest.raises(StoreError, match="absolute directory"):
        parse_url("file://relative/dir")


async def test_an_unreachable_store_is_an_error_that_names_store_operation_and_key(tmp_path: Path) -> None:
    dead = open_store(
        "prod", StoreConfig(url="s3://gpuorch/x", endpoint="http://127.0.0.1:9", region="us-east-1"),
        {"GPUORCH_STORE_PROD_ACCESS_KEY_ID": "a", "GPUORCH_STORE_PROD_SECRET_ACCESS_KEY": "b"},
    )  # fmt: skip
    with pytest.raises(StoreUnavailable, match=r"store prod \(s3://gpuorch/x\): list 'w/': .*error sending request"):
        await asyncio.wait_for(dead.list("w"), 60)


async def test_wrong_credentials_are_refused_not_ignored(s3: SeaweedS3) -> None:
    bad = open_store(
        "prod", StoreConfig(url="s3://gpuorch/x", endpoint=s3.endpoint, region="us-east-1"),
        {"GPUORCH_STORE_PROD_ACCESS_KEY_ID": "nobody", "GPUORCH_STORE_PROD_SECRET_ACCESS_KEY": "wrong"},
    )  # fmt: skip
    with pytest.raises(StoreUnavailable, match="store prod"):
        await bad.put("w/a", b"x")
    with pytest.raises(StoreError, match="go together"):
        open_store("prod", StoreConfig(url="s3://gpuorch/x"), {"GPUORCH_STORE_PROD_ACCESS_KEY_ID": "a"})


def test_stores_by_name_default_to_a_directory_each(tmp_path: Path) -> None:
    stores = Stores({"prod": StoreConfig(url="s3://b/p", endpoint="http://127.0.0.1:1")}, tmp_path, {})
    assert stores.url("prod") == "s3://b/p"
    assert stores.url("scratch") == (tmp_path / "scratch").resolve().as_uri()
    with pytest.raises(StoreError, match="not in the registry's stores"):
        Stores({}, None, {}).config("prod")
