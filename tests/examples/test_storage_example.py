"""examples/storage: the registry and the workload load with the code the services use, and they
say what docs/storage.md says: outputs to an s3:// store of the registry, credentials by Secret
name only for stores the registry gives by URL, a cache claim per cluster."""

from __future__ import annotations

from pathlib import Path

import yaml

from gpuorch.config import load_registry
from gpuorch_proto import load_workload_yaml
from gpuorch_proto.storage import SECRET_KEYS, parse_url

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "storage"


def test_the_workload_writes_to_an_s3_store_of_the_registry_and_reads_from_one() -> None:
    reg = load_registry(EXAMPLE / "clusters.yaml")
    wl = load_workload_yaml((EXAMPLE / "train-s3.yaml").read_text())
    out = wl.spec.output.store
    assert out in reg.stores, f"output store {out!r} is not in the registry's stores: {sorted(reg.stores)}"
    assert parse_url(reg.stores[out].url).scheme == "s3", (
        f"output store {out!r} is {reg.stores[out].url}, not s3://"
    )
    ck = wl.spec.checkpoint.store or out
    assert ck in reg.stores and parse_url(reg.stores[ck].url).scheme == "s3"
    assert wl.spec.checkpoint.portable
    for inp in wl.spec.inputs:
        assert inp.locations and all(
            parse_url(reg.stores[loc].url).scheme == "s3" for loc in inp.locations
        ), inp


def test_every_cluster_reaches_the_stores_and_names_only_secrets_of_stores_given_by_url() -> None:
    reg = load_registry(EXAMPLE / "clusters.yaml")
    wl = load_workload_yaml((EXAMPLE / "train-s3.yaml").read_text())
    assert len(reg.clusters) == 2 and reg.time_scale == 1
    for name, entry in reg.clusters.items():
        missing = set(entry.store_credentials) - set(reg.stores)
        assert not missing, f"{name}: store_credentials names stores not in stores: {sorted(missing)}"
        assert entry.cache_claim, f"{name}: no cache_claim"
        assert wl.spec.output.store in entry.artifact_stores, name
        for inp in wl.spec.inputs:
            assert any(loc in entry.bandwidth_mbps or loc in entry.data_locations for loc in inp.locations), (
                name
            )
        for store in (wl.spec.output.store, *(loc for i in wl.spec.inputs for loc in i.locations)):
            assert store in entry.store_credentials, f"{name} names no Secret for {store}"


def test_the_secrets_are_the_ones_the_registry_names_with_the_keys_of_their_scheme() -> None:
    reg = load_registry(EXAMPLE / "clusters.yaml")
    secrets = {
        d["metadata"]["name"]: d for d in yaml.safe_load_all((EXAMPLE / "secret.yaml").read_text()) if d
    }
    for name, entry in reg.clusters.items():
        for store, secret in entry.store_credentials.items():
            assert secret in secrets, f"{name}: Secret {secret!r} for {store} is not in secret.yaml"
            doc = secrets[secret]
            assert doc["kind"] == "Secret" and doc["metadata"]["namespace"] == "gpuorch"
            keys = SECRET_KEYS[parse_url(reg.stores[store].url).scheme]
            assert set(doc["stringData"]) == set(keys), (secret, sorted(doc["stringData"]))
            assert all(str(v).startswith("REPLACE-ME") for v in doc["stringData"].values()), (
                "placeholders only"
            )


def test_no_credential_is_in_the_registry() -> None:
    text = (EXAMPLE / "clusters.yaml").read_text()
    assert "REPLACE-ME" not in text and "secret_access_key" not in text
    for store in load_registry(EXAMPLE / "clusters.yaml").stores.values():
        assert "@" not in store.url.split("://", 1)[1].split("/", 1)[0]
