"""Export the contract as JSON Schema files: `python -m gpuorch_proto.schema [--check] DIR`."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import msgspec

from .events import Event
from .inventory import ClusterRegistryEntry, ClusterSnapshot
from .policy import AdmissionPolicy
from .routing import RoutingDecision
from .state import AdmissionLease, FenceRecord, InstanceLease, OwnerRecord
from .workload import Workload

EXPORTS: dict[str, Any] = {
    "workload.schema.json": Workload,
    "event.schema.json": Event,
    "cluster-snapshot.schema.json": ClusterSnapshot,
    "cluster-registry-entry.schema.json": ClusterRegistryEntry,
    "routing-decision.schema.json": RoutingDecision,
    "fence-record.schema.json": FenceRecord,
    "owner-record.schema.json": OwnerRecord,
    "instance-lease.schema.json": InstanceLease,
    "admission-lease.schema.json": AdmissionLease,
    "admission-policy.schema.json": AdmissionPolicy,
}


# Documents people write are closed (DESIGN §11: strict for people, unknown fields included); the
# messages services exchange stay open, so that old readers skip new fields (EVOLUTION rule 1).
WORKLOAD_DEFS = (
    "Workload", "Metadata", "WorkloadSpecBody", "Resources", "Sharing", "Toleration", "Requirements",
    "Preferences", "DatasetInput", "RetryPolicy", "CheckpointPolicy", "OutputPolicy", "Stage",
    "Sweep", "Limits",
    # the admission policy (gpuorch_proto.policy) is written by people too
    "AdmissionPolicy", "QueuePolicy", "Budget", "FairShare",
)

_SUFFIX = "(Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E)?"
# gpuorch_proto.units: a positive quantity ("16", "500m", "128Gi") and a duration ("90", "90s", "1h30m")
POSITIVE_QUANTITY = rf"^\s*(?!0+(\.0+)?{_SUFFIX}\s*$)[0-9]+(\.[0-9]+)?{_SUFFIX}\s*$"
DURATION = r"^\s*([0-9]+(\.[0-9]+)?|([0-9]+(\.[0-9]+)?(ms|s|m|h|d))+)\s*$"
NAME = r"^[a-z0-9]([a-z0-9-]{0,38}[a-z0-9])?$"
PARAM_NAME = r"^[a-z_][a-z0-9_]{0,62}$"
PARAM_VALUE = {"anyOf": [{"type": "string"}, {"type": "integer"}, {"type": "number"}, {"type": "boolean"}]}

# What a schema can say of gpuorch_proto.validate's rules, per definition and property. The rules
# it cannot say (stage names unique, depends_on naming a stage, no cycles) stay the server's alone.
_RULES: dict[str, dict[str, dict[str, Any]]] = {
    "Workload": {
        "apiVersion": {"const": "gpuorch/v1", "description": "only gpuorch/v1 is known"},
        "kind": {"const": "Workload"},
    },
    "Metadata": {
        "name": {"pattern": r"^(?!msg-)" + NAME[1:], "minLength": 1, "maxLength": 40,
                 "description": "1-40 characters of a-z, 0-9 and '-', starting and ending alphanumeric; "
                                "the prefix msg- is reserved for records of messages"},
    },
    "WorkloadSpecBody": {
        "image": {"pattern": r"^[^@\s]+@sha256:[0-9a-f]{64}$", "description": "pinned by digest: repo@sha256:<64 hex>"},
        "queue": {"pattern": r"^[a-z0-9][a-z0-9-]*/[a-z0-9][a-z0-9-]*$", "description": "<agent>/<queue>"},
        "timeout": {"pattern": DURATION},
        "expected_runtime": {"pattern": DURATION},
        "lease": {"pattern": DURATION},
        "policy_queue": {"pattern": NAME, "description": "a queue of the admission policy; None = its default queue"},
    },
    "Resources": {
        "gpus": {"minimum": 0, "description": "GPUs per worker: whole numbers unless `sharing` names a mechanism; "
                                             "a shared request is at most 1"},
        "gpu_memory_gib": {"exclusiveMinimum": 0, "description": "minimum memory per GPU, GiB"},
        "workers": {"minimum": 1},
        "cpu": {"pattern": POSITIVE_QUANTITY, "description": "a positive Kubernetes quantity: 16, 500m"},
        "memory": {"pattern": POSITIVE_QUANTITY, "description": "a positive Kubernetes quantity: 128Gi"},
    },
    "DatasetInput": {
        "ref": {"pattern": r"^[A-Za-z0-9][A-Za-z0-9._/-]*@[A-Za-z0-9][A-Za-z0-9._-]*$", "description": "name@version"},
        "size_gb": {"minimum": 0},
    },
    "Stage": {"name": {"pattern": NAME}, "timeout": {"pattern": DURATION},
              "image": {"pattern": r"^[^@\s]+@sha256:[0-9a-f]{64}$", "description": "pinned by digest; None = spec.image"},
              "queue": {"pattern": r"^[a-z0-9][a-z0-9-]*/[a-z0-9][a-z0-9-]*$", "description": "<agent>/<queue>"},
              "expected_runtime": {"pattern": DURATION}},
    "Sweep": {
        "grid": {"propertyNames": {"pattern": PARAM_NAME},
                 "additionalProperties": {"type": "array", "minItems": 1, "items": PARAM_VALUE},
                 "description": "every combination of these values, the last parameter varying fastest"},
        "trials": {"maxItems": 10_000,
                   "items": {"type": "object", "minProperties": 1, "propertyNames": {"pattern": PARAM_NAME},
                             "additionalProperties": PARAM_VALUE},
                   "description": "an explicit list of parameter sets, in order"},
    },
    "Limits": {"max_running": {"minimum": 1}, "max_gpus": {"minimum": 0}},
    "QueuePolicy": {"name": {"pattern": NAME}},
    "Budget": {"gpu_hours": {"exclusiveMinimum": 0}, "window": {"pattern": DURATION}},
    "FairShare": {"weights": {"additionalProperties": {"type": "number", "exclusiveMinimum": 0}},
                  "default_weight": {"exclusiveMinimum": 0}, "window": {"pattern": DURATION},
                  "quantum": {"pattern": DURATION}},
    "RetryPolicy": {"budget": {"minimum": 0}, "backoff": {"pattern": DURATION}},
    "CheckpointPolicy": {"interval": {"pattern": DURATION}},
    "Preferences": {"time_weight": {"minimum": 0}, "cost_weight": {"minimum": 0}},
}
# rules across properties of one object
_OBJECT_RULES: dict[str, dict[str, Any]] = {
    "Resources": {"anyOf": [
        {"properties": {"gpus": {"type": "number", "multipleOf": 1}}},
        {"required": ["sharing"], "properties": {"sharing": {"type": "object"}, "gpus": {"type": "number", "maximum": 1}}},
    ]},
    "Sharing": {"if": {"required": ["mechanism"], "properties": {"mechanism": {"const": "mig"}}},
                "then": {"required": ["profile"], "properties": {"profile": {"type": "string", "minLength": 1}}}},
    "Sweep": {"anyOf": [
        {"required": ["grid"], "properties": {"grid": {"type": "object", "minProperties": 1},
                                              "trials": {"type": "array", "maxItems": 0}}},
        {"required": ["trials"], "properties": {"trials": {"type": "array", "minItems": 1},
                                                "grid": {"type": "object", "maxProperties": 0}}},
    ]},
    "WorkloadSpecBody": {"allOf": [
        {"anyOf": [{"required": ["command"], "properties": {"command": {"type": "array", "minItems": 1}}},
                   {"required": ["stages"], "properties": {"stages": {"type": "array", "minItems": 1}}}]},
        {"if": {"required": ["preemptible"], "properties": {"preemptible": {"const": True}}},
         "then": {"required": ["checkpoint"], "properties": {"checkpoint": {
             "type": "object", "required": ["path"], "properties": {"path": {"type": "string", "minLength": 1}}}}}},
    ]},
}


def _constrain(prop: dict[str, Any], rule: dict[str, Any]) -> dict[str, Any]:
    """Put a rule on a property, inside its non-null branch when it is optional (X | None)."""
    rule = dict(rule)
    desc = rule.pop("description", None)
    out = dict(prop)
    branches = out.get("anyOf")
    if isinstance(branches, list):
        out["anyOf"] = [dict(b, **rule) if b.get("type") != "null" else b for b in branches]
    else:
        out.update(rule)
    if desc:
        out["description"] = desc
    return out


def _strict(schema: dict[str, Any]) -> dict[str, Any]:
    """Validators' default modes accept it: no OpenAPI-only keywords (Ajv strict refuses `discriminator`)."""
    if isinstance(schema, dict):
        return {k: _strict(v) for k, v in schema.items() if not (k == "discriminator" and isinstance(v, dict))}
    if isinstance(schema, list):
        return [_strict(v) for v in schema]
    return schema


def refine(schema: dict[str, Any]) -> dict[str, Any]:
    schema = _strict(schema)
    defs = schema.get("$defs") or {}
    for name in WORKLOAD_DEFS:
        d = defs.get(name)
        if d is None:
            continue
        d["additionalProperties"] = False
        for prop, rule in _RULES.get(name, {}).items():
            d["properties"][prop] = _constrain(d["properties"][prop], rule)
        d.update(_OBJECT_RULES.get(name, {}))
    return schema


def render() -> dict[str, str]:
    out = {}
    for fname, tp in EXPORTS.items():
        schema = refine(msgspec.json.schema(tp))
        schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
        schema["$id"] = f"https://gpuorch.dev/schemas/v1/{fname}"
        out[fname] = json.dumps(schema, indent=2, sort_keys=True) + "\n"
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("dir", type=Path)
    ap.add_argument("--check", action="store_true", help="fail if the files differ from the contract")
    ns = ap.parse_args(argv)
    rendered = render()
    if ns.check:
        bad = [f for f, text in rendered.items() if not (ns.dir / f).exists() or (ns.dir / f).read_text() != text]
        if bad:
            print(f"schema drift in {bad}: run `make schemas` and commit", file=sys.stderr)
            return 1
        return 0
    ns.dir.mkdir(parents=True, exist_ok=True)
    for f, text in rendered.items():
        (ns.dir / f).write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
