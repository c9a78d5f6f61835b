"""The exported JSON Schema in proto/schemas is the contract; drift is caught."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from gpuorch_proto import schema

ROOT = Path(__file__).resolve().parents[2]
SCHEMAS = ROOT / "proto" / "schemas"


def check(directory: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gpuorch_proto.schema", "--check", str(directory)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )


def test_committed_schemas_match_the_contract() -> None:
    result = check(SCHEMAS)
    assert result.returncode == 0, result.stderr
    assert sorted(p.name for p in SCHEMAS.glob("*.schema.json")) == sorted(schema.EXPORTS)


def _drop_a_property(text: str) -> str:
    doc = json.loads(text)
    submit = doc["$defs"]["Submit"]["properties"]
    del submit["idempotency_key"]
    return json.dumps(doc, indent=2, sort_keys=True) + "\n"


@pytest.mark.parametrize(
    ("fname", "change"),
    [
        pytest.param("event.schema.json", _drop_a_property, id="property-removed"),
        pytest.param(
            "workload.schema.json", lambda t: t.replace('"gpus"', '"gpu_count"', 1), id="field-renamed"
        ),
        pytest.param("fence-record.schema.json", lambda t: t + " ", id="whitespace-only"),
    ],
)
def test_a_changed_schema_is_detected(tmp_path: Path, fname: str, change: object) -> None:
    copy = tmp_path / "schemas"
    shutil.copytree(SCHEMAS, copy)
    target = copy / fname
    original = target.read_text()
    changed = change(original)  # type: ignore[operator]
    assert changed != original
    target.write_text(changed)
    result = check(copy)
    assert result.returncode == 1
    assert fname in result.stderr


def test_a_missing_schema_file_is_detected(tmp_path: Path) -> None:
    copy = tmp_path / "schemas"
    shutil.copytree(SCHEMAS, copy)
    (copy / "instance-lease.schema.json").unlink()
    result = check(copy)
    assert result.returncode == 1 and "instance-lease.schema.json" in result.stderr


def test_event_schema_is_a_tagged_union_of_every_event() -> None:
    doc = json.loads((SCHEMAS / "event.schema.json").read_text())
    from gpuorch_proto import EVENT_TYPES, type_tag

    # an anyOf of one definition per event, each pinning `type` (no OpenAPI `discriminator`: Ajv's
    # strict mode refuses that keyword)
    def keys(node: object) -> set[str]:
        if isinstance(node, dict):
            return set(node) | {k for v in node.values() for k in keys(v)}
        return {k for v in node for k in keys(v)} if isinstance(node, list) else set()

    assert "discriminator" not in keys({k: v for k, v in doc.items() if k != "$defs"} | {
        n: {k: v for k, v in d.items() if k != "properties"} for n, d in doc["$defs"].items()})
    tags = []
    for branch in doc["anyOf"]:
        d = doc["$defs"][branch["$ref"].rsplit("/", 1)[1]]
        t = d["properties"]["type"]
        tags.append(t["const"] if "const" in t else t["enum"][0])
        assert "type" in d["required"]
    assert sorted(tags) == sorted(type_tag(c) for c in EVENT_TYPES)
