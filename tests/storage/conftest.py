"""A real S3 server (SeaweedFS) for the storage tests: one per test module."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuorch.dev.seaweed import REGION, SeaweedS3
from gpuorch.objectstore import Store, open_store
from gpuorch_proto.storage import StoreConfig


@pytest.fixture(scope="module")
def s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SeaweedS3]:
    with SeaweedS3(tmp_path_factory.mktemp("seaweed"), buckets=("gpuorch", "other")) as server:
        yield server


def s3_store(server: SeaweedS3, name: str = "prod", prefix: str = "results") -> Store:
    return open_store(name, StoreConfig(url=f"s3://gpuorch/{prefix}", endpoint=server.endpoint, region=REGION), server.env(name))


def file_store(root: Path, name: str = "prod") -> Store:
    return open_store(name, StoreConfig(url=root.resolve().as_uri()), {})
