"""Decoding what people and other systems send: errors name the field path and the rule."""

from __future__ import annotations

import msgspec
import pytest

from gpuorch_proto import ContractError, Workload, decode_event, encode, load_workload_yaml, workload_from_obj
from gpuorch_proto.events import Cancel, Submit
from tests.proto.conftest import VALID_YAML


def yaml_with(old: str, new: str) -> str:
    assert old in VALID_YAML
    return VALID_YAML.replace(old, new)


def test_the_example_is_valid(valid_workload: Workload) -> None:
    assert valid_workload.metadata.name == "train-llm"
    assert valid_workload.spec.resources.gpus == 8


@pytest.mark.parametrize(
    ("text", "path", "message"),
    [
        pytest.param(
            yaml_with("gpus: 8", "gpus: 0.5"),
            "spec.resources.gpus",
            "0.5 is not a whole number; fractional GPUs need a sharing mechanism",
            id="half-gpu-without-sharing",
        ),
        pytest.param(
            yaml_with("gpus: 8", "gpus: -1"), "spec.resources.gpus", "-1 is negative", id="negative-gpus"
        ),
        pytest.param(
            yaml_with("gpus: 8", "gpus: eight"),
            "spec.resources.gpus",
            "Expected `float`, got `str`",
            id="gpus-text",
        ),
        pytest.param(
            yaml_with("memory: 256Gi", "memory: lots"),
            "spec.resources.memory",
            "is not a quantity",
            id="memory",
        ),
        pytest.param(
            yaml_with("workers: 2", "workers: 0"),
            "spec.resources.workers",
            "must be at least 1",
            id="workers",
        ),
        pytest.param(
            yaml_with("@sha256:aaaaaaaa", ":latest#"),
            "spec.image",
            "is not pinned by digest",
            id="image-not-pinned",
        ),
        pytest.param(
            yaml_with("tokens@v3", "tokens"), "spec.inputs[0].ref", "not an immutable", id="input-unversioned"
        ),
        pytest.param(
            yaml_with("expected_runtime: 4h", "expected_runtime: soon"),
            "spec.expected_runtime",
            "not a duration",
            id="duration",
        ),
        pytest.param(
            yaml_with("  name: train-llm\n", ""),
            "metadata",
            "missing required field `name`",
            id="missing-name",
        ),
        pytest.param("- just\n- a list\n", "$", "expected a mapping", id="not-a-mapping"),
    ],
)
def test_yaml_errors_name_the_field_path_and_rule(text: str, path: str, message: str) -> None:
    with pytest.raises(ContractError) as err:
        load_workload_yaml(text)
    assert [e.path for e in err.value.errors] == [path]
    assert message in err.value.errors[0].message
    assert f"{path}: " in str(err.value)


def test_the_message_for_a_fractional_gpu_reads_as_documented() -> None:
    with pytest.raises(ContractError) as err:
        load_workload_yaml(yaml_with("gpus: 8", "gpus: 0.5"))
    assert "spec.resources.gpus: 0.5 is not a whole number" in str(err.value)


def test_a_fractional_gpu_with_a_mig_profile_is_valid() -> None:
    wl = load_workload_yaml(
        yaml_with("gpus: 8", "gpus: 0.5\n    sharing:\n      mechanism: mig\n      profile: 1g.10gb")
    )
    assert wl.spec.resources.sharing is not None and wl.spec.resources.gpus == 0.5


def test_every_broken_rule_is_reported_not_just_the_first() -> None:
    text = (
        yaml_with("gpus: 8", "gpus: 0.5").replace("tokens@v3", "tokens").replace("workers: 2", "workers: 0")
    )
    with pytest.raises(ContractError) as err:
        load_workload_yaml(text)
    assert {e.path for e in err.value.errors} == {
        "spec.resources.gpus",
        "spec.resources.workers",
        "spec.inputs[0].ref",
    }


def test_invalid_yaml_is_a_contract_error() -> None:
    with pytest.raises(ContractError, match="invalid YAML"):
        load_workload_yaml("metadata: [unclosed")


def test_an_unknown_tag_is_rejected() -> None:
    with pytest.raises(ContractError) as err:
        decode_event(b'{"type": "teleport", "workload_id": "w-1", "at": 1}')
    assert [(e.path, e.message) for e in err.value.errors] == [("type", "Invalid value 'teleport'")]
    with pytest.raises(ContractError):
        decode_event(msgspec.msgpack.encode({"type": "teleport", "workload_id": "w-1", "at": 1}))


def test_a_message_without_a_tag_is_rejected() -> None:
    with pytest.raises(ContractError) as err:
        decode_event(b'{"workload_id": "w-1", "at": 1}')
    assert "type" in str(err.value)


@pytest.mark.parametrize("content_type", [None, "application/msgpack", "application/json"])
def test_json_and_msgpack_submits_decode_to_the_same_command(
    valid_workload: Workload, content_type: str | None
) -> None:
    submit = Submit(workload=valid_workload, idempotency_key="client-42")
    fmt = "msgpack" if content_type == "application/msgpack" else "json"
    data = encode(submit, fmt)
    assert decode_event(data, content_type=content_type) == submit
    # another system's hand-written document, not produced by our encoder
    doc = msgspec.to_builtins(submit)
    raw = msgspec.msgpack.encode(doc) if fmt == "msgpack" else msgspec.json.encode(doc)
    assert decode_event(raw, content_type=content_type) == submit


def test_an_invalid_workload_inside_a_msgpack_submit_names_the_field(valid_workload: Workload) -> None:
    doc = msgspec.to_builtins(Submit(workload=valid_workload))
    doc["workload"]["spec"]["resources"]["gpus"] = 0.25
    with pytest.raises(ContractError) as err:
        decode_event(msgspec.msgpack.encode(doc))
    assert [e.path for e in err.value.errors] == ["spec.resources.gpus"]


def test_a_command_decodes_with_its_defaults() -> None:
    assert decode_event(b'{"type": "cancel", "workload_id": "w-1"}') == Cancel(workload_id="w-1")


def test_workload_from_obj_and_yaml_agree(valid_workload: Workload) -> None:
    assert workload_from_obj(msgspec.to_builtins(valid_workload)) == valid_workload
