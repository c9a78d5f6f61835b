"""Label selectors (string and structured forms) and the field selectors localkube serves."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from gpuorch_proto.kubesem import requirement_matches, selector_term_matches

from .errors import ApiError

__all__ = [
    "LabelSelector",
    "Requirement",
    "match_node_selector_term",
    "parse_field_selector",
    "parse_label_selector",
    "selector_from_struct",
]

_KEY = r"(?:[A-Za-z0-9][-A-Za-z0-9_./]*)?[A-Za-z0-9]"
_VALUE = r"(?:(?:[A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?"
_TOKEN = re.compile(
    rf"""\s*(?:
        (?P<notexists>!\s*(?P<nk>{_KEY}))
      | (?P<set>(?P<sk>{_KEY})\s+(?P<op>in|notin)\s*\((?P<vals>[^)]*)\))
      | (?P<eq>(?P<ek>{_KEY})\s*(?P<eop>==|!=|=)\s*(?P<ev>{_VALUE}))
      | (?P<exists>(?P<xk>{_KEY}))
    )\s*(?:,|$)""",
    re.VERBOSE,
)


@dataclass(frozen=True)
class Requirement:
    key: str
    op: str  # "in", "notin", "exists", "!", "gt", "lt"
    values: tuple[str, ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        return requirement_matches(self.key, _KUBE_OPS.get(self.op, ""), self.values, labels)


@dataclass(frozen=True)
class LabelSelector:
    requirements: tuple[Requirement, ...] = ()

    def matches(self, labels: Mapping[str, str] | None) -> bool:
        labels = labels or {}
        return all(r.matches(labels) for r in self.requirements)

    def equalities(self) -> list[tuple[str, str]]:
        """The `key=value` requirements (what a label index can answer)."""
        return [(r.key, r.values[0]) for r in self.requirements if r.op == "in" and len(r.values) == 1]

    @property
    def empty(self) -> bool:
        return not self.requirements


def parse_label_selector(text: str | None) -> LabelSelector:
    """Parse `a=b,c!=d,e in (x,y),f notin (z),g,!h` (Kubernetes label selector syntax)."""
    if not text or not text.strip():
        return LabelSelector()
    reqs: list[Requirement] = []
    pos = 0
    text = text.strip()
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if not m or m.end() == pos:
            raise ApiError.bad_request(f"unable to parse requirement: invalid label selector {text!r}")
        if m.group("notexists"):
            reqs.append(Requirement(m.group("nk"), "!"))
        elif m.group("set"):
            vals = tuple(v.strip() for v in m.group("vals").split(",") if v.strip())
            reqs.append(Requirement(m.group("sk"), m.group("op"), vals))
        elif m.group("eq"):
            op = "notin" if m.group("eop") == "!=" else "in"
            reqs.append(Requirement(m.group("ek"), op, (m.group("ev"),)))
        else:
            reqs.append(Requirement(m.group("xk"), "exists"))
        pos = m.end()
    return LabelSelector(tuple(reqs))


_STRUCT_OPS = {"In": "in", "NotIn": "notin", "Exists": "exists", "DoesNotExist": "!", "Gt": "gt", "Lt": "lt"}
_KUBE_OPS = {v: k for k, v in _STRUCT_OPS.items()}


def selector_from_struct(sel: Mapping[str, Any] | None) -> LabelSelector:
    """A metav1.LabelSelector (matchLabels + matchExpressions)."""
    if not sel:
        return LabelSelector()
    reqs = [Requirement(k, "in", (str(v),)) for k, v in (sel.get("matchLabels") or {}).items()]
    for expr in sel.get("matchExpressions") or []:
        op = _STRUCT_OPS.get(str(expr.get("operator")), "")
        reqs.append(Requirement(str(expr.get("key")), op, tuple(str(v) for v in expr.get("values") or ())))
    return LabelSelector(tuple(reqs))


def match_node_selector_term(term: Mapping[str, Any], labels: Mapping[str, str], name: str) -> bool:
    """One NodeSelectorTerm of required node affinity (matchExpressions AND matchFields)."""
    return selector_term_matches(term, labels, name)


def _involved(key: str) -> Callable[[dict[str, Any]], str]:
    return lambda o: str((o.get("involvedObject") or {}).get(key) or "")


_FIELDS: dict[str, dict[str, Callable[[dict[str, Any]], str]]] = {
    "pods": {
        "metadata.name": lambda o: o["metadata"].get("name", ""),
        "metadata.namespace": lambda o: o["metadata"].get("namespace", ""),
        "spec.nodeName": lambda o: o.get("spec", {}).get("nodeName") or "",
        "spec.schedulerName": lambda o: o.get("spec", {}).get("schedulerName") or "",
        "spec.restartPolicy": lambda o: o.get("spec", {}).get("restartPolicy") or "",
        "status.phase": lambda o: o.get("status", {}).get("phase") or "",
    },
    "jobs": {
        "metadata.name": lambda o: o["metadata"].get("name", ""),
        "metadata.namespace": lambda o: o["metadata"].get("namespace", ""),
        "status.successful": lambda o: str(o.get("status", {}).get("succeeded") or 0),
    },
    "events": {
        "metadata.name": lambda o: o["metadata"].get("name", ""),
        "metadata.namespace": lambda o: o["metadata"].get("namespace", ""),
        **{f"involvedObject.{k}": _involved(k)
           for k in ("kind", "namespace", "name", "uid", "apiVersion", "resourceVersion", "fieldPath")},
        "reason": lambda o: o.get("reason") or "",
        "reportingComponent": lambda o: o.get("reportingComponent") or "",
        "source": lambda o: (o.get("source") or {}).get("component") or "",
        "type": lambda o: o.get("type") or "",
    },
    "nodes": {
        "metadata.name": lambda o: o["metadata"].get("name", ""),
        "spec.unschedulable": lambda o: "true" if o.get("spec", {}).get("unschedulable") else "false",
    },
}


def parse_field_selector(resource: str, text: str | None) -> Callable[[dict[str, Any]], bool]:
    """Field selectors supported per resource (`a=b`, `a==b`, `a!=b`, comma-separated)."""
    if not text or not text.strip():
        return lambda _o: True
    known = _FIELDS.get(resource, {})
    checks: list[tuple[Callable[[dict[str, Any]], str], bool, str]] = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        m = re.match(r"^([A-Za-z0-9_.]+)\s*(==|!=|=)\s*(.*)$", part)
        if not m:
            raise ApiError.bad_request(f"invalid field selector: {part!r}")
        field, op, value = m.group(1), m.group(2), m.group(3).strip()
        if field not in known:
            raise ApiError.bad_request(f'field label not supported: {field}')
        checks.append((known[field], op == "!=", value))

    def match(obj: dict[str, Any]) -> bool:
        for getter, negate, value in checks:
            if (getter(obj) == value) == negate:
                return False
        return True

    return match
