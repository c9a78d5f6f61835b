"""Named credentials, never secret values (issue 11): the contract's rules, pure.

A workload names credentials; the registry maps each to a Secret key per cluster; a submit that
carries a value is refused without the value appearing in the refusal. The Job side is in
tests/dispatcher/test_core.py; the running system in tests/security/test_workload_input.py.
"""

from __future__ import annotations

import pytest

from gpuorch_proto import ClusterRegistryEntry, workload_from_obj
from gpuorch_proto.codec import ContractError
from gpuorch_proto.credentials import registry_errors
from gpuorch_proto.inventory import SecretKeyRef

DIGEST = "example.org/train@sha256:" + "ab" * 32
AWS = "AKIA" + "ABCDEFGHIJKLMNOP"  # split so no scanner takes this file for a leak
PEM = "-----BEGIN RSA " + "PRIVATE KEY-----\nMIIE..."


def submit(**spec: object) -> None:
    workload_from_obj({"metadata": {"name": "w"}, "spec": {"image": DIGEST, "command": ["true"], **spec}})


@pytest.mark.parametrize(
    ("spec", "path"),
    [
        pytest.param({"env": {"WANDB_API_KEY": "0123456789abcdef"}}, "spec.env.WANDB_API_KEY", id="secret-by-its-name"),
        pytest.param({"env": {"HF_TOKEN": "hf_x"}}, "spec.env.HF_TOKEN", id="token-by-its-name"),
        pytest.param({"env": {"DB_PASSWORD": "hunter2"}}, "spec.env.DB_PASSWORD", id="password-by-its-name"),
        pytest.param({"env": {"SETTINGS": AWS}}, "spec.env.SETTINGS", id="aws-key-by-its-format"),
        pytest.param({"env": {"KEYFILE": PEM}}, "spec.env.KEYFILE", id="pem-by-its-format"),
        pytest.param({"env": {"DB": "postgres://app:s3cr3t@db:5432/x"}}, "spec.env.DB", id="url-with-password"),
        pytest.param({"requirements": {"credentials": ["wandb=0123456789abcdef"]}}, "spec.requirements.credentials[0]", id="value-in-place-of-a-name"),
        pytest.param({"stages": [{"name": "a", "command": ["true"], "env": {"API_KEY": "x1"}}]}, "spec.stages[0].env.API_KEY", id="in-a-stage"),
    ],
)
def test_a_submit_carrying_a_secret_value_is_refused_without_repeating_it(spec: dict, path: str) -> None:
    with pytest.raises(ContractError) as err:
        submit(**spec)
    errors = [e for e in err.value.errors if e.path == path]
    assert errors, err.value.errors
    text = str(err.value) + " ".join(e.message for e in err.value.errors)
    for secret in ("0123456789abcdef", "hunter2", AWS, "MIIE", "s3cr3t"):
        assert secret not in text


@pytest.mark.parametrize(
    "env",
    [
        pytest.param({"TOKENIZERS_PARALLELISM": "false", "MAX_TOKENS": "512", "SINGLE_PASS": "1", "OAUTH": "off"}, id="names-that-only-contain-token-or-pass"),
        pytest.param({"WANDB_API_KEY": ""}, id="empty-secret-name-is-a-placeholder"),
        pytest.param({"DATA_URL": "https://example.org/data"}, id="url-without-credentials"),
    ],
)
def test_ordinary_env_passes(env: dict[str, str]) -> None:
    submit(env=env, requirements={"credentials": ["wandb", "s3-prod"]})


def test_registry_refs_name_a_credential_of_the_cluster_a_secret_and_a_key() -> None:
    good = ClusterRegistryEntry(credentials=["wandb"], credential_refs={"wandb": SecretKeyRef(secret="wandb-key", key="token", env="WANDB_API_KEY")})
    assert registry_errors(good, "r") == []
    bad = ClusterRegistryEntry(credentials=[], credential_refs={"wandb": SecretKeyRef(secret="Not_A_Name", key="a b", env="1X")})
    assert sorted(e.path for e in registry_errors(bad, "r")) == [
        "r.credential_refs.wandb", "r.credential_refs.wandb.env", "r.credential_refs.wandb.key", "r.credential_refs.wandb.secret",
    ]
