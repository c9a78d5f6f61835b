"""Kubernetes scheduling semantics, written once: taints and tolerations, node selectors, phases.

Pure functions over the JSON shapes of the Kubernetes API (``{"key": ..., "operator": ...}``), as
the local clusters store them and as the official client's ``to_dict()`` / a snapshot hold them.
Any argument that is not a mapping is read by attribute instead (a msgspec Struct such as
``gpuorch_proto.inventory.Taint``), so the router, inventory and the local clusters share these
rules without converting. The semantics are kube-scheduler's:

- A toleration with an empty ``effect`` matches every effect; ``operator`` defaults to ``Equal``;
  an empty ``key`` is only valid with ``Exists`` and then tolerates every taint; ``Equal``
  compares values (missing and empty are the same).
- Scheduling is blocked by untolerated ``NoSchedule`` and ``NoExecute`` taints;
  ``PreferNoSchedule`` only lowers a node's score.
- ``nodeSelector``: every pair must be a label of the node, with that value.
- A ``nodeSelectorTerm`` matches when all its ``matchExpressions`` and ``matchFields`` do, and an
  empty term matches nothing; required node affinity is satisfied by any one of its terms.
  ``Gt`` / ``Lt`` compare integers, with exactly one value; a label that is not an integer fails.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

__all__ = [
    "BLOCKING_EFFECTS",
    "NODE_SELECTOR_OPERATORS",
    "TAINT_EFFECTS",
    "TERMINAL_JOB_CONDITIONS",
    "TERMINAL_POD_PHASES",
    "UNSCHEDULABLE_TAINT",
    "affinity_terms",
    "blocking_taints",
    "job_finished",
    "node_affinity_matches",
    "node_selector_matches",
    "pod_is_terminal",
    "requirement_matches",
    "selector_term_matches",
    "tolerates",
    "toleration_matches",
    "untolerated_taints",
]

TAINT_EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")
BLOCKING_EFFECTS = ("NoSchedule", "NoExecute")
NODE_SELECTOR_OPERATORS = ("In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt")
TERMINAL_POD_PHASES = ("Succeeded", "Failed")
TERMINAL_JOB_CONDITIONS = ("Complete", "Failed")
UNSCHEDULABLE_TAINT: Mapping[str, str] = {"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"}


def _get(obj: Any, name: str) -> Any:
    if isinstance(obj, Mapping):
        return obj.get(name)
    return getattr(obj, name, None)


# ---- taints and tolerations ----------------------------------------------------------------------


def toleration_matches(toleration: Any, taint: Any) -> bool:
    """Does this one toleration tolerate this one taint?"""
    effect = _get(toleration, "effect") or ""
    if effect and effect != (_get(taint, "effect") or ""):
        return False
    op = _get(toleration, "operator") or "Equal"
    key = _get(toleration, "key") or ""
    if not key:
        return op == "Exists"
    if key != (_get(taint, "key") or ""):
        return False
    if op == "Exists":
        return True
    if op != "Equal":
        return False
    return (_get(toleration, "value") or "") == (_get(taint, "value") or "")


def tolerates(tolerations: Iterable[Any] | None, taint: Any) -> bool:
    """Does any of the tolerations tolerate the taint?"""
    return any(toleration_matches(t, taint) for t in tolerations or ())


def untolerated_taints(
    tolerations: Iterable[Any] | None, taints: Iterable[Any] | None, effects: Sequence[str] = BLOCKING_EFFECTS,
) -> list[Any]:
    """The node's taints with one of `effects` that no toleration tolerates, in the node's order."""
    tols = list(tolerations or ())
    return [t for t in taints or () if (_get(t, "effect") or "") in effects and not tolerates(tols, t)]


def blocking_taints(tolerations: Iterable[Any] | None, taints: Iterable[Any] | None) -> list[Any]:
    """The taints that keep a pod with these tolerations off the node (NoSchedule, NoExecute)."""
    return untolerated_taints(tolerations, taints, BLOCKING_EFFECTS)


# ---- node selection ------------------------------------------------------------------------------


def requirement_matches(key: str, operator: str, values: Sequence[Any] | None, labels: Mapping[str, str]) -> bool:
    """One NodeSelectorRequirement (In, NotIn, Exists, DoesNotExist, Gt, Lt) against labels.

    An unknown operator matches nothing (the API server would have refused it).
    """
    vals = [str(v) for v in values or ()]
    present = key in labels
    if operator == "Exists":
        return present
    if operator == "DoesNotExist":
        return not present
    if operator == "In":
        return present and labels[key] in vals
    if operator == "NotIn":
        return not present or labels[key] not in vals
    if operator in ("Gt", "Lt"):
        if not present or len(vals) != 1:
            return False
        try:
            have, want = int(labels[key]), int(vals[0])
        except ValueError:
            return False
        return have > want if operator == "Gt" else have < want
    return False


def node_selector_matches(selector: Mapping[str, Any] | None, labels: Mapping[str, str] | None) -> bool:
    """`spec.nodeSelector`: every key present with exactly that value."""
    labels = labels or {}
    return all(k in labels and labels[k] == str(v) for k, v in (selector or {}).items())


def _expressions_match(exprs: Iterable[Any], labels: Mapping[str, str]) -> bool:
    return all(
        requirement_matches(str(_get(e, "key") or ""), str(_get(e, "operator") or ""), _get(e, "values"), labels) for e in exprs
    )


def selector_term_matches(term: Any, labels: Mapping[str, str] | None, node_name: str = "") -> bool:
    """One NodeSelectorTerm: all matchExpressions (labels) and matchFields (`metadata.name`)."""
    exprs = list(_get(term, "matchExpressions") or _get(term, "match_expressions") or ())
    fields = list(_get(term, "matchFields") or _get(term, "match_fields") or ())
    if not exprs and not fields:
        return False
    return _expressions_match(exprs, labels or {}) and _expressions_match(fields, {"metadata.name": node_name})


def affinity_terms(affinity: Mapping[str, Any] | None) -> list[Any]:
    """The nodeSelectorTerms of a pod's required node affinity (empty: no requirement)."""
    node_affinity = (affinity or {}).get("nodeAffinity") or {}
    required = node_affinity.get("requiredDuringSchedulingIgnoredDuringExecution") or {}
    return list(required.get("nodeSelectorTerms") or ())


def node_affinity_matches(terms: Iterable[Any] | None, labels: Mapping[str, str] | None, node_name: str = "") -> bool:
    """Required node affinity: no terms means no requirement, otherwise any one term must match."""
    terms = list(terms or ())
    return not terms or any(selector_term_matches(t, labels, node_name) for t in terms)


# ---- phases ---------------------------------------------------------------------------------------


def pod_is_terminal(pod_or_phase: Mapping[str, Any] | str | None) -> bool:
    """A pod (or its phase) that will never run again: Succeeded or Failed."""
    if isinstance(pod_or_phase, Mapping):
        pod_or_phase = (pod_or_phase.get("status") or {}).get("phase")
    return pod_or_phase in TERMINAL_POD_PHASES


def job_finished(job: Mapping[str, Any]) -> str | None:
    """`Complete` or `Failed` when the Job has that condition with status True, else None."""
    conditions = (job.get("status") or {}).get("conditions") or ()
    for ctype in TERMINAL_JOB_CONDITIONS:
        for c in conditions:
            if c.get("type") == ctype and c.get("status") == "True":
                return ctype
    return None
