"""Nesting depth measured without recursion (gpuorch_proto.nesting): a document nested past
MAX_DEPTH is refused with the limit and the path where it was crossed, in JSON, msgpack and YAML,
before any decoder recurses; and no document of the contract comes near the limit."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import msgspec
import pytest
import yaml
from hypothesis import example, given, settings
from hypothesis import strategies as st

from gpuorch_proto import ContractError, decode_event, load_workload_yaml
from gpuorch_proto.codec import load_policy_yaml
from gpuorch_proto.nesting import (
    MAX_DEPTH,
    MAX_PATH,
    json_crossing,
    msgpack_crossing,
    render_path,
    yaml_crossing,
)
from gpuorch_proto.policy import PolicyError
from tests.runtime.helpers import workload_obj

SCHEMAS = Path(__file__).resolve().parents[2] / "proto" / "schemas"

# strings that look structural: brackets, braces, commas, colons, escaped quotes and backslashes
TRICKY = st.text(alphabet=st.sampled_from(list('ab[]{},:"\\ \n')) | st.characters(blacklist_categories=("Cs",)), max_size=8)
JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.floats(allow_nan=False, allow_infinity=False) | TRICKY,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(TRICKY, inner, max_size=3),
    max_leaves=40,
)


def depth(obj: Any) -> int:
    """The reference: containers nested, the root 1 (recursive; only for shallow test documents)."""
    if isinstance(obj, dict):
        return 1 + max((depth(v) for v in obj.values()), default=0)
    if isinstance(obj, list):
        return 1 + max((depth(v) for v in obj), default=0)
    return 0


def at(obj: Any, path: list[str | int]) -> Any:
    for seg in path:
        obj = obj[seg]
    return obj


def agrees(doc: Any, path: list[str | int] | None, limit: int) -> None:
    if depth(doc) <= limit:
        assert path is None, (path, depth(doc))
    else:
        assert path is not None and len(path) == limit, path
        assert isinstance(at(doc, path), dict | list)  # the container that opens at limit + 1


@settings(max_examples=300, deadline=None)
@given(doc=JSON_VALUES, limit=st.integers(0, 4))
@example(doc=["x", ["y", [1, [2]]]], limit=2)  # the crossing is the second item of each array
@example(doc=['"', [[[1]]], '\\"'], limit=2)  # escaped quotes around the deep part: still outside strings
@example(doc={'k"[': {"\\": [{"]": '"{'}]}}, limit=3)
def test_the_scans_agree_with_a_recursive_count_and_name_the_container_that_crosses(doc: Any, limit: int) -> None:
    agrees(doc, json_crossing(json.dumps(doc).encode(), limit), limit)
    agrees(doc, json_crossing(json.dumps(doc, ensure_ascii=False, indent=1).encode(), limit), limit)
    agrees(doc, msgpack_crossing(msgspec.msgpack.encode(doc), limit), limit)
    agrees(doc, yaml_crossing(yaml.safe_dump(doc), limit), limit)


def nested(levels: int, key: str = "a") -> Any:
    doc: Any = 1
    for _ in range(levels):
        doc = {key: doc}
    return doc


def deep_submit(levels: int) -> dict[str, Any]:
    """A submit whose `metadata.labels` nests `levels` objects deep (the issue's 40 submits)."""
    wl = workload_obj()
    wl["metadata"]["labels"] = nested(levels)
    return {"type": "submit", "schema_version": 1, "workload": wl}


@pytest.mark.parametrize("levels", [MAX_DEPTH, 1_000, 100_000], ids=lambda n: f"{n}-levels")
@pytest.mark.parametrize("fmt", ["json", "msgpack"])
def test_a_deep_submit_is_refused_with_the_limit_and_the_path_not_a_recursion_error(levels: int, fmt: str) -> None:
    # built as text: json.dumps / msgspec would recurse on the document themselves
    if fmt == "json":
        head = json.dumps(deep_submit(0)).encode().replace(b'"labels": 1', b'"labels": ' + b'{"a": ' * levels + b"1" + b"}" * levels)
        data = head
    else:
        inner = b"\x81\xa1a" * levels + b"\x01"  # {"a": {"a": ... 1}}
        data = msgspec.msgpack.encode(deep_submit(0)).replace(b"\xa6labels\x01", b"\xa6labels" + inner)
    with pytest.raises(ContractError) as caught:
        decode_event(data)
    assert caught.value.reason == "too deeply nested"
    [err] = caught.value.errors
    assert err.path == "workload.metadata.labels" + ".a" * (MAX_DEPTH - 3), err.path
    assert f"more than {MAX_DEPTH} levels" in err.message


def test_a_submit_as_deep_as_the_limit_is_not_refused_for_its_depth() -> None:
    doc = deep_submit(MAX_DEPTH - 3)  # the root, workload, metadata, and 29 of labels: 32
    with pytest.raises(ContractError) as caught:  # labels are strings: refused, but for that
        decode_event(json.dumps(doc).encode())
    assert caught.value.reason == "invalid message" and "Expected `str`" in str(caught.value), caught.value


def test_brackets_and_escaped_quotes_in_strings_are_not_nesting() -> None:
    cmd = ["python", "-c", '"[[[[" ' * 40, "\\" * 7 + '"{' * 40, "\\\\"]
    data = json.dumps({"type": "submit", "workload": {**workload_obj(), "spec": {**workload_obj()["spec"], "command": cmd}}}).encode()
    assert data.count(b"[") > MAX_DEPTH and json_crossing(data) is None
    assert decode_event(data).workload.spec.command == cmd  # type: ignore[union-attr]


@pytest.mark.parametrize("style", ["flow", "block"])
def test_a_deep_yaml_workload_is_refused_with_the_path_before_it_is_composed(style: str) -> None:
    text = yaml.safe_dump(workload_obj(), sort_keys=False)
    levels = 2_000 if style == "flow" else 600  # PyYAML's composer recursed past Python's limit at about 450
    if style == "flow":
        deep = "{a: " * levels + "1" + "}" * levels
        text = text.replace("  owner: team-a\n", f"  owner: team-a\n  labels: {deep}\n")
    else:
        deep = "".join("  " * (i + 2) + "a:\n" for i in range(levels)) + "  " * (levels + 2) + "b: 1\n"
        text = text.replace("  owner: team-a\n", f"  owner: team-a\n  labels:\n{deep}")
    with pytest.raises(ContractError) as caught:
        load_workload_yaml(text)
    [err] = caught.value.errors
    assert caught.value.reason == "too deeply nested"
    assert err.path == "metadata.labels" + ".a" * (MAX_DEPTH - 2), err.path


def test_a_deep_admission_policy_is_refused_with_the_path() -> None:
    with pytest.raises(PolicyError) as caught:
        load_policy_yaml("queues: " + "[" * 1_000 + "]" * 1_000)
    assert [e.path for e in caught.value.errors] == ["queues" + "[0]" * (MAX_DEPTH - 1)]


def test_a_long_path_is_cut_in_the_middle() -> None:
    path: list[str | int] = ["workload", "metadata", "labels", *(["k" * 60] * 30), 7, "end.x"]
    shown = render_path(path)
    assert len(shown) <= MAX_PATH + 30, shown
    assert shown.startswith("workload.metadata.labels.") and shown.endswith('[7]["end.x"]'), shown
    assert "more levels)…" in shown and "k" * 41 not in shown


def schema_depth(schema: Any, defs: dict[str, Any], seen: tuple[str, ...] = ()) -> float:
    """How deeply instances of a JSON Schema may nest (inf: a recursive schema)."""
    if not isinstance(schema, dict):
        return 0
    if "$ref" in schema:
        name = schema["$ref"].rsplit("/", 1)[-1]
        return float("inf") if name in seen else schema_depth(defs[name], defs, (*seen, name))
    best = max((schema_depth(s, defs, seen) for k in ("anyOf", "oneOf", "allOf") for s in schema.get(k, [])), default=0.0)
    types = schema.get("type") if isinstance(schema.get("type"), list) else [schema.get("type")]
    if "object" in types or "properties" in schema:
        subs = [*schema.get("properties", {}).values(), schema.get("additionalProperties")]
        best = max(best, 1 + max(schema_depth(s, defs, seen) for s in subs))
    if "array" in types or "items" in schema:
        best = max(best, 1 + schema_depth(schema.get("items"), defs, seen))
    return best


def test_no_document_of_the_contract_nests_anywhere_near_the_limit() -> None:
    depths = {}
    for f in sorted(SCHEMAS.glob("*.schema.json")):
        doc = json.loads(f.read_text())
        depths[f.name] = schema_depth(doc, doc.get("$defs", {}))
    assert depths["event.schema.json"] >= 8, depths  # the measure measures: a workload's stage's tolerations
    assert max(depths.values()) * 2 <= MAX_DEPTH, depths
