"""API errors as Kubernetes `Status` objects."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["EVENTS", "JOBS", "NAMESPACES", "NODES", "PODS", "RESOURCES", "SECRETS", "ApiError", "Resource"]


@dataclass(frozen=True)
class Resource:
    plural: str
    kind: str
    group: str
    namespaced: bool

    @property
    def api_version(self) -> str:
        return f"{self.group}/v1" if self.group else "v1"

    @property
    def qualified(self) -> str:
        """`jobs.batch`, `pods`: how the API server names the resource in messages."""
        return f"{self.plural}.{self.group}" if self.group else self.plural

    @property
    def qualified_kind(self) -> str:
        return f"{self.kind}.{self.group}" if self.group else self.kind


PODS = Resource("pods", "Pod", "", True)
NODES = Resource("nodes", "Node", "", False)
JOBS = Resource("jobs", "Job", "batch", True)
NAMESPACES = Resource("namespaces", "Namespace", "", False)
EVENTS = Resource("events", "Event", "", True)
SECRETS = Resource("secrets", "Secret", "", True)
RESOURCES = {r.plural: r for r in (PODS, NODES, JOBS, NAMESPACES, EVENTS, SECRETS)}


class ApiError(Exception):
    """An error the API server answers with (a `Status` with code, reason, message)."""

    def __init__(self, code: int, reason: str, message: str, details: dict[str, Any] | None = None):
        super().__init__(message)
        self.code = code
        self.reason = reason
        self.message = message
        self.details = details

    def status(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        }
        if self.details is not None:
            out["details"] = self.details
        return out

    @classmethod
    def not_found(cls, res: Resource, name: str) -> ApiError:
        return cls(
            404,
            "NotFound",
            f'{res.qualified} "{name}" not found',
            {"name": name, "group": res.group, "kind": res.plural},
        )

    @classmethod
    def already_exists(cls, res: Resource, name: str) -> ApiError:
        return cls(
            409,
            "AlreadyExists",
            f'{res.qualified} "{name}" already exists',
            {"name": name, "group": res.group, "kind": res.plural},
        )

    @classmethod
    def conflict(cls, res: Resource, name: str, why: str) -> ApiError:
        return cls(
            409,
            "Conflict",
            f'Operation cannot be fulfilled on {res.qualified} "{name}": {why}',
            {"name": name, "group": res.group, "kind": res.plural},
        )

    @classmethod
    def invalid(cls, res: Resource, name: str, causes: list[tuple[str, str, str]]) -> ApiError:
        """causes: (field, cause type e.g. FieldValueRequired, message)."""
        parts = [f"{field}: {msg}" for field, _t, msg in causes]
        joined = parts[0] if len(parts) == 1 else "[" + ", ".join(parts) + "]"
        return cls(
            422,
            "Invalid",
            f'{res.qualified_kind} "{name}" is invalid: {joined}',
            {
                "name": name,
                "group": res.group,
                "kind": res.kind,
                "causes": [{"reason": t, "message": m, "field": f} for f, t, m in causes],
            },
        )

    @classmethod
    def bad_request(cls, message: str) -> ApiError:
        return cls(400, "BadRequest", message)

    @classmethod
    def method_not_allowed(cls, message: str = "the server does not allow this method on the requested resource") -> ApiError:
        return cls(405, "MethodNotAllowed", message)

    @classmethod
    def path_not_found(cls) -> ApiError:
        return cls(404, "NotFound", "the server could not find the requested resource", {})

    @classmethod
    def unsupported_media_type(cls, ctype: str, accepted: str) -> ApiError:
        return cls(415, "UnsupportedMediaType",
                   f"the body of the request was in an unknown format ({ctype}) - accepted media types include: {accepted}")

    @classmethod
    def gone(cls, message: str) -> ApiError:
        return cls(410, "Expired", message)
