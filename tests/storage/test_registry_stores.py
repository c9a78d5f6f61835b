"""The registry's stores (issue 28): given by URL with the names of the Secrets each cluster
holds; what is wrong with them is refused at load, naming the field."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from gpuorch.config import load_registry

S3 = {"url": "s3://bucket/prod", "endpoint": "https://s3.example.org", "region": "eu-west-1"}


def write(tmp: Path, registry: dict[str, Any], stores: dict[str, Any] | None) -> Path:
    doc: dict[str, Any] = {"clusters": [{"name": "east", "registry": registry}]}
    if stores is not None:
        doc["stores"] = stores
    p = tmp / "clusters.yaml"
    p.write_text(yaml.safe_dump(doc))
    return p


def test_stores_by_url_and_credentials_by_secret_name(tmp_path: Path) -> None:
    reg = load_registry(write(tmp_path, {"artifact_stores": ["prod"], "store_credentials": {"prod": "s3-prod"}, "cache_claim": "datasets"}, {"prod": S3}))
    assert reg.stores["prod"].url == "s3://bucket/prod" and reg.stores["prod"].endpoint == S3["endpoint"]
    assert reg.clusters["east"].store_credentials == {"prod": "s3-prod"} and reg.clusters["east"].cache_claim == "datasets"


def test_the_embedded_default_names_no_store(tmp_path: Path) -> None:
    reg = load_registry(write(tmp_path, {"artifact_stores": ["prod"], "data_locations": ["nfs"]}, None))
    assert reg.stores == {}


@pytest.mark.parametrize(
    ("registry", "stores", "says"),
    [
        pytest.param({"artifact_stores": ["prod", "scratch"]}, {"prod": S3}, "clusters[0].registry.artifact_stores: 'scratch' is not in stores", id="a-store-left-out"),
        pytest.param({"artifact_stores": ["prod"], "bandwidth_mbps": {"lake": 100}}, {"prod": S3}, "bandwidth_mbps: 'lake' is not in stores", id="a-location-left-out"),
        pytest.param({"artifact_stores": ["prod"], "store_credentials": {"lake": "x"}}, {"prod": S3}, "store_credentials.lake: no store 'lake'", id="credentials-for-no-store"),
        pytest.param({"artifact_stores": ["prod"]}, {"prod": {"url": "ftp://host/x"}}, "stores.prod", id="an-unknown-scheme"),
        pytest.param({"artifact_stores": ["prod"]}, {"prod": {"url": "s3://b/p", "secret_key": "x"}}, "stores.prod", id="an-unknown-field"),
    ],
)
def test_what_is_wrong_is_refused_naming_the_field(tmp_path: Path, registry: dict[str, Any], stores: dict[str, Any], says: str) -> None:
    with pytest.raises(ValueError, match=None) as exc:
        load_registry(write(tmp_path, registry, stores))
    assert says in str(exc.value), str(exc.value)
