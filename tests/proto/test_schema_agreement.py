"""One corpus of workload documents, good and bad, fed to the published JSON Schema (Python's
jsonschema, Draft 2020-12, and Ajv in Node, default strict mode) and to the server's validation
(`workload_from_obj`, what the router and the CLI run). They must agree on every rule a schema can
express; the rules it cannot (stage names unique, dependencies naming a stage, no cycles) are listed
and must be the server's alone.
"""

from __future__ import annotations

import copy
import json
import subprocess
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from gpuorch_proto import ContractError, workload_from_obj
from tests.support.node import node_client_dir

SCHEMAS = Path(__file__).resolve().parents[2] / "proto" / "schemas"
DIGEST = "registry.example.com/train@sha256:" + "ab" * 32

GOOD: dict[str, Any] = {
    "apiVersion": "gpuorch/v1",
    "kind": "Workload",
    "metadata": {"name": "train-imagenet", "owner": "vision-team"},
    "spec": {
        "image": DIGEST,
        "command": ["python", "train.py"],
        "resources": {"gpus": 8, "gpu_memory_gib": 80, "cpu": "16", "memory": "128Gi", "same_node": True},
        "inputs": [{"ref": "imagenet@v3", "size_gb": 1350, "locations": ["primary-nfs"]}],
        "output": {"store": "prod"},
        "timeout": "4h",
        "retry": {"budget": 2, "backoff": "30s"},
    },
}


def doc(**changes: Any) -> dict[str, Any]:
    """GOOD with dotted-path changes (`spec.resources.gpus=-3`); a value of ... deletes the key."""
    d = copy.deepcopy(GOOD)
    for dotted, value in changes.items():
        *parents, last = dotted.split("__")
        node = d
        for p in parents:
            node = node.setdefault(p, {})
        if value is ...:
            node.pop(last, None)
        else:
            node[last] = value
    return d


# (id, document, valid): each bad one breaks one rule
CORPUS: list[tuple[str, dict[str, Any], bool]] = [
    ("good", doc(), True),
    ("minimal", {"metadata": {"name": "m"}, "spec": {"image": DIGEST, "command": ["true"]}}, True),
    ("cpu-only", doc(spec__resources={"cpu": "500m", "memory": "1Gi"}), True),
    ("shared-half-gpu", doc(spec__resources={"gpus": 0.5, "sharing": {"mechanism": "time-slicing"}}), True),
    ("mig-with-profile", doc(spec__resources={"gpus": 0.5, "sharing": {"mechanism": "mig", "profile": "1g.10gb"}}), True),
    ("stages-no-command", doc(spec__command=..., spec__stages=[{"name": "prep", "command": ["x"]}]), True),
    ("preemptible-with-checkpoint", doc(spec__preemptible=True, spec__checkpoint={"path": "ckpt"}), True),
    ("pinned-queue", doc(spec__queue="primary/train"), True),
    ("duration-forms", doc(spec__timeout="1h30m", spec__lease="600", spec__expected_runtime="90s"), True),
    # pipelines and queues (issue 13)
    ("sweep-grid", doc(spec__sweep={"grid": {"lr": [0.1, 0.01], "batch": [32, 64]}}, spec__limits={"max_gpus": 16}), True),
    ("sweep-trials", doc(spec__sweep={"trials": [{"lr": 0.1, "opt": "adam"}, {"lr": 0.01, "opt": "sgd"}]}), True),
    ("policy-queue", doc(spec__policy_queue="research", spec__limits={"max_running": 4}), True),
    ("stage-own-routing", doc(spec__stages=[{"name": "prep", "resources": {"cpu": "4"}, "queue": "primary/cpu",
                                             "image": DIGEST, "expected_runtime": "1h"}]), True),
    # the examples
    ("negative-gpus", doc(spec__resources={"gpus": -3}), False),
    ("half-gpu-no-sharing", doc(spec__resources={"gpus": 0.5}), False),
    ("zero-workers", doc(spec__resources={"gpus": 1, "workers": 0}), False),
    ("memory-lots", doc(spec__resources={"memory": "lots"}), False),
    ("api-version-v9", doc(apiVersion="gpuorch/v9"), False),
    # every other rule the schema can say
    ("shared-above-one", doc(spec__resources={"gpus": 1.5, "sharing": {"mechanism": "mps"}}), False),
    ("mig-without-profile", doc(spec__resources={"gpus": 0.5, "sharing": {"mechanism": "mig"}}), False),
    ("unknown-sharing", doc(spec__resources={"gpus": 0.5, "sharing": {"mechanism": "vgpu"}}), False),
    ("zero-gpu-memory", doc(spec__resources={"gpus": 1, "gpu_memory_gib": 0}), False),
    ("zero-cpu", doc(spec__resources={"cpu": "0"}), False),
    ("cpu-as-number", doc(spec__resources={"cpu": 16}), False),
    ("zero-memory", doc(spec__resources={"memory": "0Gi"}), False),
    ("kind-other", doc(kind="Job"), False),
    ("name-uppercase", doc(metadata__name="Train"), False),
    ("name-too-long", doc(metadata__name="a" * 41), False),
    ("name-reserved", doc(metadata__name="msg-gpuorch-cmd-1"), False),
    ("name-missing", doc(metadata={"owner": "x"}), False),
    ("image-tag", doc(spec__image="registry.example.com/train:latest"), False),
    ("no-command", doc(spec__command=[]), False),
    ("input-unversioned", doc(spec__inputs=[{"ref": "imagenet"}]), False),
    ("input-negative-size", doc(spec__inputs=[{"ref": "imagenet@v3", "size_gb": -1}]), False),
    ("queue-malformed", doc(spec__queue="primary"), False),
    ("timeout-malformed", doc(spec__timeout="soon"), False),
    ("backoff-malformed", doc(spec__retry={"backoff": "5 minutes"}), False),
    ("negative-budget", doc(spec__retry={"budget": -1}), False),
    ("preemptible-no-checkpoint", doc(spec__preemptible=True), False),
    ("negative-weight", doc(spec__preferences={"cost_weight": -1}), False),
    ("stage-name-bad", doc(spec__stages=[{"name": "Prep", "command": ["x"]}]), False),
    ("stage-negative-gpus", doc(spec__stages=[{"name": "prep", "resources": {"gpus": -1}}]), False),
    ("toleration-operator", doc(spec__requirements={"tolerations": [{"key": "k", "operator": "In"}]}), False),
    ("sweep-empty", doc(spec__sweep={}), False),
    ("sweep-grid-and-trials", doc(spec__sweep={"grid": {"lr": [0.1]}, "trials": [{"lr": 0.2}]}), False),
    ("sweep-param-name-bad", doc(spec__sweep={"grid": {"Learning-Rate": [0.1]}}), False),
    ("sweep-param-no-values", doc(spec__sweep={"grid": {"lr": []}}), False),
    ("sweep-value-object", doc(spec__sweep={"grid": {"lr": [{"x": 1}]}}), False),
    ("sweep-trial-empty", doc(spec__sweep={"trials": [{}]}), False),
    ("limits-zero-running", doc(spec__limits={"max_running": 0}), False),
    ("limits-negative-gpus", doc(spec__limits={"max_gpus": -1}), False),
    ("policy-queue-bad", doc(spec__policy_queue="Research/Team"), False),
    ("stage-image-tag", doc(spec__stages=[{"name": "prep", "image": "train:latest"}]), False),
    ("stage-queue-malformed", doc(spec__stages=[{"name": "prep", "queue": "primary"}]), False),
    ("stage-runtime-malformed", doc(spec__stages=[{"name": "prep", "expected_runtime": "soon"}]), False),
    ("unknown-sweep-field", doc(spec__sweep={"grid": {"lr": [0.1]}, "random": 5}), False),
    # closed objects: a typo is an error, not a no-op
    ("unknown-top-field", doc(status={}), False),
    ("unknown-spec-field", doc(spec__gpu=8), False),
    ("unknown-resources-field", doc(spec__resources={"gpus": 1, "gpu_count": 8}), False),
    ("unknown-input-field", doc(spec__inputs=[{"ref": "imagenet@v3", "sizeGB": 1}]), False),
]

# rules no JSON Schema can state: the server rejects, the schema accepts
SERVER_ONLY: list[tuple[str, dict[str, Any]]] = [
    ("stage-names-twice", doc(spec__stages=[{"name": "a", "command": ["x"]}, {"name": "a", "command": ["y"]}])),
    ("depends-on-unknown", doc(spec__stages=[{"name": "a", "depends_on": ["b"], "command": ["x"]}])),
    ("dependency-cycle", doc(spec__stages=[{"name": "a", "depends_on": ["b"], "command": ["x"]},
                                           {"name": "b", "depends_on": ["a"], "command": ["y"]}])),
    ("stage-nothing-to-run", doc(spec__command=..., spec__stages=[{"name": "a", "command": ["x"]}, {"name": "b"}])),
    ("sweep-with-stages", doc(spec__sweep={"grid": {"lr": [0.1]}}, spec__stages=[{"name": "a"}])),
    ("sweep-grid-too-large", doc(spec__sweep={"grid": {f"p{i}": list(range(10)) for i in range(5)}})),
    ("sweep-value-twice", doc(spec__sweep={"grid": {"lr": [0.1, 0.1]}})),
    ("sweep-trials-differ", doc(spec__sweep={"trials": [{"lr": 0.1}, {"batch": 32}]})),
    ("sweep-placeholder-unknown", doc(spec__args=["--lr", "{{learning_rate}}"], spec__sweep={"grid": {"lr": [0.1]}})),
]


def server_accepts(d: dict[str, Any]) -> bool:
    try:
        workload_from_obj(copy.deepcopy(d))
    except ContractError:
        return False
    return True


@pytest.fixture(scope="module")
def validator() -> jsonschema.Draft202012Validator:
    schema = json.loads((SCHEMAS / "workload.schema.json").read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


@pytest.mark.parametrize(("name", "document", "valid"), CORPUS, ids=[c[0] for c in CORPUS])
def test_schema_and_server_agree(validator: jsonschema.Draft202012Validator, name: str, document: dict[str, Any], valid: bool) -> None:
    schema_ok = validator.is_valid(document)
    server_ok = server_accepts(document)
    assert (schema_ok, server_ok) == (valid, valid), (
        f"{name}: schema {'accepts' if schema_ok else 'rejects'}, server {'accepts' if server_ok else 'rejects'}; "
        f"schema errors: {[e.message for e in validator.iter_errors(document)]}"
    )


@pytest.mark.parametrize(("name", "document"), SERVER_ONLY, ids=[c[0] for c in SERVER_ONLY])
def test_rules_only_the_server_can_check(validator: jsonschema.Draft202012Validator, name: str, document: dict[str, Any]) -> None:
    assert validator.is_valid(document) and not server_accepts(document)


def test_every_schema_is_draft_2020_12() -> None:
    for f in sorted(SCHEMAS.glob("*.schema.json")):
        schema = json.loads(f.read_text())
        assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
        jsonschema.Draft202012Validator.check_schema(schema)


AJV = """
import Ajv2020 from "ajv/dist/2020.js";
import fs from "node:fs";
const [dir, corpusFile] = process.argv.slice(2);
const warnings = [];
const logger = { log() {}, warn: (m) => warnings.push(String(m)), error: (m) => warnings.push(String(m)) };
const compiled = {};
for (const f of fs.readdirSync(dir).filter((f) => f.endsWith(".schema.json")).sort()) {
  compiled[f] = new Ajv2020({ logger }).compile(JSON.parse(fs.readFileSync(`${dir}/${f}`, "utf8")));  // default strict mode
}
const corpus = JSON.parse(fs.readFileSync(corpusFile, "utf8"));
const verdicts = corpus.map((d) => compiled["workload.schema.json"](d));
console.log(JSON.stringify({ compiled: Object.keys(compiled), warnings, verdicts }));
"""


def test_ajv_strict_compiles_every_schema_and_agrees(tmp_path: Path) -> None:
    cwd = node_client_dir()
    script = cwd / ".ajv-check.mjs"  # inside the package, so `ajv` resolves from its node_modules
    corpus = tmp_path / "corpus.json"
    corpus.write_text(json.dumps([d for _, d, _ in CORPUS]))
    script.write_text(AJV)
    try:
        p = subprocess.run(["node", str(script), str(SCHEMAS), str(corpus)], cwd=cwd, capture_output=True, text=True, timeout=60)
    finally:
        script.unlink()
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    assert sorted(out["compiled"]) == sorted(f.name for f in SCHEMAS.glob("*.schema.json"))
    assert out["warnings"] == []  # not even strictTypes notes
    disagree = [name for (name, _, valid), ajv_ok in zip(CORPUS, out["verdicts"], strict=True) if ajv_ok != valid]
    assert disagree == []
