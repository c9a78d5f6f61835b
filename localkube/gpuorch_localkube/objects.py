"""Validation and defaulting of Jobs and Pods, as the API server does on create and update."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from fractions import Fraction
from typing import Any

import msgspec

from .errors import JOBS, PODS, ApiError, Resource
from .quantity import QuantityError, parse_quantity
from .util import (
    DNS1123_LABEL,
    DNS1123_SUBDOMAIN,
    LABEL_VALUE,
    QUALIFIED_NAME,
    json_copy,
    new_uid,
    random_suffix,
    rfc3339,
)

__all__ = [
    "GPU",
    "JOB_LABELS",
    "check_type_meta",
    "get_condition",
    "pod_requests",
    "prepare_job",
    "prepare_pod",
    "set_condition",
]

GPU = "nvidia.com/gpu"
# Resources that cannot be overcommitted: requests must equal limits, and must be integers.
_EXTENDED_INTEGER = (GPU,)
JOB_LABELS = (
    "batch.kubernetes.io/controller-uid",
    "batch.kubernetes.io/job-name",
    "controller-uid",
    "job-name",
)

Causes = list[tuple[str, str, str]]


def check_type_meta(obj: Any, res: Resource, namespace: str | None) -> dict[str, Any]:
    if not isinstance(obj, dict):
        raise ApiError.bad_request(f"the body of the request was not a {res.kind} object")
    kind = obj.get("kind")
    api_version = obj.get("apiVersion")
    if kind not in (None, "", res.kind) or api_version not in (None, "", res.api_version):
        raise ApiError.bad_request(
            f"the API version in the data ({api_version}) does not match the expected API version ({res.api_version})"
            if api_version not in (None, "", res.api_version)
            else f"Kind in the body ({kind}) does not match {res.kind}"
        )
    meta = obj.get("metadata")
    if meta is None:
        meta = obj["metadata"] = {}
    if not isinstance(meta, dict):
        raise ApiError.bad_request("metadata must be an object")
    if namespace is not None:
        ns = meta.get("namespace")
        if ns not in (None, "", namespace):
            raise ApiError.bad_request(
                "the namespace of the provided object does not match the namespace sent on the request"
            )
    return obj


def _validate_name(meta: dict[str, Any], causes: Causes, max_len: int = 253) -> str:
    name = meta.get("name")
    gen = meta.get("generateName")
    if not name:
        if gen:
            name = str(gen)[: max_len - 5] + random_suffix()
            meta["name"] = name
        else:
            causes.append(("metadata.name", "FieldValueRequired", "Required value: name or generateName is required"))
            return ""
    if not isinstance(name, str) or not DNS1123_SUBDOMAIN.match(name) or len(name) > max_len:
        causes.append(
            (
                "metadata.name",
                "FieldValueInvalid",
                f'Invalid value: "{name}": a lowercase RFC 1123 subdomain must consist of lower case alphanumeric '
                f"characters, '-' or '.', and must start and end with an alphanumeric character"
                + (f" (at most {max_len} characters)" if max_len < 253 else ""),
            )
        )
    return str(name)


_GOOD_LABELS: set[tuple[str, str]] = set()  # (key, value) pairs known valid: Jobs repeat a few
_GOOD_LABELS_MAX = 4096


def _validate_labels(labels: Any, path: str, causes: Causes) -> None:
    if labels is None:
        return
    if not isinstance(labels, dict):
        causes.append((path, "FieldValueInvalid", "Invalid value: must be a map of strings"))
        return
    good = _GOOD_LABELS
    for k, v in labels.items():
        if isinstance(k, str) and isinstance(v, str) and (k, v) in good:
            continue
        ok = True
        if not isinstance(k, str) or not QUALIFIED_NAME.match(k.split("/")[-1] if "/" in k else k):
            ok = False
            causes.append((path, "FieldValueInvalid", f'Invalid value: "{k}": name part must consist of alphanumeric characters'))
        if not isinstance(v, str) or len(v) > 63 or not LABEL_VALUE.match(v):
            ok = False
            causes.append(
                (f"{path}", "FieldValueInvalid", f'Invalid value: "{v}": a valid label must be an empty string or consist of '
                 "alphanumeric characters, '-', '_' or '.' (at most 63 characters)")
            )
        if ok:
            if len(good) >= _GOOD_LABELS_MAX:
                good.clear()
            good.add((k, v))


def _validate_annotations(ann: Any, path: str, causes: Causes) -> None:
    if ann is None:
        return
    if not isinstance(ann, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in ann.items()):
        causes.append((path, "FieldValueInvalid", "Invalid value: annotations must be a map of strings to strings"))


def _normalise_quantities(values: Any, path: str) -> dict[str, str]:
    if values is None:
        return {}
    if not isinstance(values, dict):
        raise ApiError.bad_request(f"{path}: expected a map of resource quantities")
    out: dict[str, str] = {}
    for k, v in values.items():
        try:
            parse_quantity(v)
        except QuantityError as e:
            raise ApiError.bad_request(f"{path}[{k}]: {e}") from e
        out[str(k)] = v if isinstance(v, str) else (str(v) if isinstance(v, int) else repr(v))
    return out


def normalise_spec_quantities(pod_spec: Any) -> None:
    """Quantities written as numbers (`nvidia.com/gpu: 1`) become the strings the server stores ("1"),
    so that an update or patch that only restates a quantity changes nothing (as on an API server)."""
    if not isinstance(pod_spec, dict):
        return
    for key in ("containers", "initContainers"):
        for c in pod_spec.get(key) or []:
            res = c.get("resources") if isinstance(c, dict) else None
            if not isinstance(res, dict):
                continue
            for kind in ("limits", "requests"):
                vals = res.get(kind)
                if isinstance(vals, dict):
                    res[kind] = {k: (str(v) if isinstance(v, int) and not isinstance(v, bool) else v) for k, v in vals.items()}


_encode = msgspec.json.Encoder().encode
_decode = msgspec.json.Decoder().decode
_RESOURCES_SEEN: dict[bytes, tuple[bytes, Causes]] = {}  # what _check_resources made of a container's resources
_RESOURCES_SEEN_MAX = 1024


def _validate_resources(c: dict[str, Any], path: str, causes: Causes) -> None:
    """Validate and default `c["resources"]`.

    The outcome depends on the resources alone (and the path in the messages), and a burst of
    Jobs repeats a few shapes: it is remembered by their JSON (a bounded memo), so the quantities
    of a shape are parsed and compared once, not for every Job.
    """
    res = c.get("resources")
    if not isinstance(res, dict):
        _check_resources(c, path, causes)
        return
    key = b"%s|%s" % (path.encode(), _encode(res))
    hit = _RESOURCES_SEEN.get(key)
    if hit is None:
        mine: Causes = []
        _check_resources(c, path, mine)
        if len(_RESOURCES_SEEN) >= _RESOURCES_SEEN_MAX:
            _RESOURCES_SEEN.clear()
        hit = _RESOURCES_SEEN[key] = (_encode(c["resources"]), mine)
    else:
        c["resources"] = _decode(hit[0])
    causes.extend(hit[1])


def _check_resources(c: dict[str, Any], path: str, causes: Causes) -> None:
    res = c.get("resources")
    if res is None:
        c["resources"] = res = {}
    if not isinstance(res, dict):
        causes.append((f"{path}.resources", "FieldValueInvalid", "Invalid value: must be an object"))
        return
    limits = _normalise_quantities(res.get("limits"), f"{path}.resources.limits")
    requests = _normalise_quantities(res.get("requests"), f"{path}.resources.requests")
    for kind, values in (("limits", limits), ("requests", requests)):
        for k, v in values.items():
            q = parse_quantity(v)
            if q < 0:
                causes.append((f"{path}.resources.{kind}[{k}]", "FieldValueInvalid", f'Invalid value: "{v}": must be greater than or equal to 0'))
            if k in _EXTENDED_INTEGER and q.denominator != 1:
                causes.append((f"{path}.resources.{kind}[{k}]", "FieldValueInvalid", f'Invalid value: "{v}": must be an integer'))
    for k in _EXTENDED_INTEGER:
        if k in requests and k not in limits:
            causes.append((f"{path}.resources.limits", "FieldValueRequired", f"Required value: Limit must be set for non overcommitable resources ({k})"))
        elif k in requests and parse_quantity(requests[k]) != parse_quantity(limits[k]):
            causes.append(
                (f"{path}.resources.requests", "FieldValueInvalid", f'Invalid value: "{requests[k]}": must be equal to {k} limit of {limits[k]}')
            )
    for k in ("cpu", "memory"):
        if k in requests and k in limits and parse_quantity(requests[k]) > parse_quantity(limits[k]):
            causes.append(
                (f"{path}.resources.requests", "FieldValueInvalid", f'Invalid value: "{requests[k]}": must be less than or equal to {k} limit of {limits[k]}')
            )
    # defaulting: requests default to limits
    for k, v in limits.items():
        requests.setdefault(k, v)
    new_res: dict[str, Any] = {}
    if limits:
        new_res["limits"] = limits
    if requests:
        new_res["requests"] = requests
    for extra in res:
        if extra not in ("limits", "requests"):
            new_res[extra] = res[extra]
    c["resources"] = new_res


_VOLUME_SOURCES = ("emptyDir", "persistentVolumeClaim", "secret")
_INT_PROBE_FIELDS = (
    ("initialDelaySeconds", 0, 0),
    ("timeoutSeconds", 1, 1),
    ("periodSeconds", 1, 10),
    ("successThreshold", 1, 1),
    ("failureThreshold", 1, 3),
)


def _validate_volumes(spec: dict[str, Any], path: str, causes: Causes) -> set[str]:
    """`spec.volumes`: the sources a local cluster can give a pod (emptyDir, persistentVolumeClaim,
    secret); hostPath is refused, since a pod on a gpuorch local cluster shares no disk with the host.
    Returns the names declared."""
    vols = spec.get("volumes")
    names: set[str] = set()
    if vols is None:
        return names
    if not isinstance(vols, list):
        causes.append((f"{path}.volumes", "FieldValueInvalid", "Invalid value: must be a list"))
        return names
    for i, v in enumerate(vols):
        vp = f"{path}.volumes[{i}]"
        if not isinstance(v, dict):
            causes.append((vp, "FieldValueInvalid", "Invalid value: must be an object"))
            continue
        name = v.get("name")
        if not name:
            causes.append((f"{vp}.name", "FieldValueRequired", "Required value"))
        elif not isinstance(name, str) or not DNS1123_LABEL.match(name) or len(name) > 63:
            causes.append((f"{vp}.name", "FieldValueInvalid", f'Invalid value: "{name}": a lowercase RFC 1123 label must consist of lower case alphanumeric characters or \'-\''))
        elif name in names:
            causes.append((f"{vp}.name", "FieldValueDuplicate", f'Duplicate value: "{name}"'))
        else:
            names.add(name)
        sources = [k for k in v if k != "name" and v[k] is not None]
        if not sources:
            causes.append((vp, "FieldValueRequired", "Required value: must specify a volume type"))
            continue
        if len(sources) > 1:
            causes.append((vp, "FieldValueForbidden", f"Forbidden: may not specify more than 1 volume type (got {', '.join(sources)})"))
            continue
        kind = sources[0]
        src = v[kind]
        if kind == "hostPath":
            causes.append((
                f"{vp}.hostPath", "FieldValueForbidden",
                "Forbidden: hostPath volumes are not allowed on gpuorch local clusters: a pod shares no disk with "
                "the host or with other pods (use an emptyDir, a persistentVolumeClaim or a secret volume)",
            ))
            continue
        if kind not in _VOLUME_SOURCES:
            causes.append((
                f"{vp}.{kind}", "FieldValueNotSupported",
                f'Unsupported value: "{kind}": volume types supported by gpuorch local clusters: "emptyDir", "persistentVolumeClaim", "secret"',
            ))
            continue
        if not isinstance(src, dict):
            causes.append((f"{vp}.{kind}", "FieldValueInvalid", "Invalid value: must be an object"))
            continue
        if kind == "persistentVolumeClaim":
            claim = src.get("claimName")
            if not claim:
                causes.append((f"{vp}.persistentVolumeClaim.claimName", "FieldValueRequired", "Required value"))
            elif not isinstance(claim, str) or not DNS1123_SUBDOMAIN.match(claim) or len(claim) > 253:
                causes.append((f"{vp}.persistentVolumeClaim.claimName", "FieldValueInvalid", f'Invalid value: "{claim}": a lowercase RFC 1123 subdomain'))
        elif kind == "secret":
            secret = src.get("secretName")
            if not secret:
                causes.append((f"{vp}.secret.secretName", "FieldValueRequired", "Required value"))
            elif not isinstance(secret, str) or not DNS1123_SUBDOMAIN.match(secret):
                causes.append((f"{vp}.secret.secretName", "FieldValueInvalid", f'Invalid value: "{secret}": a lowercase RFC 1123 subdomain'))
            for j, item in enumerate(src.get("items") or []):
                ip = f"{vp}.secret.items[{j}]"
                if not isinstance(item, dict) or not item.get("key"):
                    causes.append((f"{ip}.key", "FieldValueRequired", "Required value"))
                    continue
                _check_relative(item.get("path"), f"{ip}.path", causes)
    return names


def _check_relative(p: Any, path: str, causes: Causes) -> None:
    if not p or not isinstance(p, str):
        causes.append((path, "FieldValueRequired", "Required value"))
    elif p.startswith("/"):
        causes.append((path, "FieldValueInvalid", f'Invalid value: "{p}": must be a relative path'))
    elif ".." in p.split("/"):
        causes.append((path, "FieldValueInvalid", f"Invalid value: \"{p}\": must not contain '..'"))


def _validate_mounts(c: dict[str, Any], path: str, causes: Causes, volumes: set[str]) -> None:
    mounts = c.get("volumeMounts")
    if mounts is None:
        return
    if not isinstance(mounts, list):
        causes.append((f"{path}.volumeMounts", "FieldValueInvalid", "Invalid value: must be a list"))
        return
    seen: list[str] = []
    for i, m in enumerate(mounts):
        mp = f"{path}.volumeMounts[{i}]"
        if not isinstance(m, dict):
            causes.append((mp, "FieldValueInvalid", "Invalid value: must be an object"))
            continue
        name = m.get("name")
        if not name:
            causes.append((f"{mp}.name", "FieldValueRequired", "Required value"))
        elif name not in volumes:
            causes.append((f"{mp}.name", "FieldValueNotFound", f'Not found: "{name}"'))
        target = m.get("mountPath")
        if not target or not isinstance(target, str):
            causes.append((f"{mp}.mountPath", "FieldValueRequired", "Required value"))
            continue
        norm = "/" + "/".join(p for p in target.split("/") if p and p != ".")
        if not target.startswith("/") or ".." in target.split("/") or norm == "/":
            causes.append((f"{mp}.mountPath", "FieldValueInvalid", f'Invalid value: "{target}": must be an absolute path below "/" without \'..\''))
            continue
        for other in seen:
            if norm == other:
                causes.append((f"{mp}.mountPath", "FieldValueInvalid", f'Invalid value: "{target}": must be unique'))
            elif norm.startswith(other + "/") or other.startswith(norm + "/"):
                causes.append((
                    f"{mp}.mountPath", "FieldValueInvalid",
                    f'Invalid value: "{target}": nested in the mount at "{other}" (or it in this one): gpuorch local '
                    "clusters do not support mounts inside mounts",
                ))
        seen.append(norm)
        if m.get("subPath") not in (None, ""):
            _check_relative(m["subPath"], f"{mp}.subPath", causes)


def _validate_probe(c: dict[str, Any], key: str, path: str, causes: Causes) -> None:
    probe = c.get(key)
    if probe is None:
        return
    pp = f"{path}.{key}"
    if not isinstance(probe, dict):
        causes.append((pp, "FieldValueInvalid", "Invalid value: must be an object"))
        return
    handlers = [h for h in ("exec", "httpGet", "tcpSocket", "grpc") if probe.get(h) is not None]
    if not handlers:
        causes.append((pp, "FieldValueRequired", "Required value: must specify a handler type"))
    elif len(handlers) > 1:
        causes.append((pp, "FieldValueForbidden", "Forbidden: may not specify more than 1 handler type"))
    elif handlers[0] != "exec":
        causes.append((f"{pp}.{handlers[0]}", "FieldValueNotSupported",
                       f'Unsupported value: "{handlers[0]}": gpuorch local clusters run "exec" probes only'))
    else:
        cmd = probe["exec"].get("command") if isinstance(probe["exec"], dict) else None
        if not cmd or not isinstance(cmd, list) or not all(isinstance(x, str) for x in cmd):
            causes.append((f"{pp}.exec.command", "FieldValueRequired", "Required value: a non-empty list of strings"))
    for fld, minimum, default in _INT_PROBE_FIELDS:
        v = probe.get(fld)
        if v is None:
            probe[fld] = default
        elif isinstance(v, bool) or not isinstance(v, int) or v < minimum:
            causes.append((f"{pp}.{fld}", "FieldValueInvalid", f"Invalid value: {v!r}: must be an integer >= {minimum}"))
    if key == "startupProbe" and probe.get("successThreshold") not in (None, 1):
        causes.append((f"{pp}.successThreshold", "FieldValueInvalid", "Invalid value: must be 1"))


def _validate_container(c: Any, path: str, causes: Causes, names: set[str], volumes: set[str], init: bool) -> None:
    if not isinstance(c, dict):
        causes.append((path, "FieldValueInvalid", "Invalid value: must be an object"))
        return
    name = c.get("name")
    if not name:
        causes.append((f"{path}.name", "FieldValueRequired", "Required value"))
    elif not isinstance(name, str) or not DNS1123_LABEL.match(name) or len(name) > 63:
        causes.append((f"{path}.name", "FieldValueInvalid", f'Invalid value: "{name}": a lowercase RFC 1123 label must consist of lower case alphanumeric characters or \'-\''))
    elif name in names:
        causes.append((f"{path}.name", "FieldValueDuplicate", f'Duplicate value: "{name}"'))
    else:
        names.add(name)
    for fld in ("command", "args"):
        v = c.get(fld)
        if v is not None and (not isinstance(v, list) or not all(isinstance(x, str) for x in v)):
            causes.append((f"{path}.{fld}", "FieldValueInvalid", "Invalid value: must be a list of strings"))
    env = c.get("env")
    if env is not None:
        if not isinstance(env, list):
            causes.append((f"{path}.env", "FieldValueInvalid", "Invalid value: must be a list"))
        else:
            for j, e in enumerate(env):
                if not isinstance(e, dict) or not e.get("name"):
                    causes.append((f"{path}.env[{j}].name", "FieldValueRequired", "Required value"))
                elif "value" in e and e.get("valueFrom") is not None:
                    causes.append((f"{path}.env[{j}].valueFrom", "FieldValueInvalid", "Invalid value: may not be specified when `value` is not empty"))
    _validate_mounts(c, path, causes, volumes)
    rp = c.get("restartPolicy")
    if init and rp not in (None, "Always"):
        causes.append((f"{path}.restartPolicy", "FieldValueNotSupported", f'Unsupported value: "{rp}": supported values: "Always"'))
    elif not init and rp is not None:
        causes.append((f"{path}.restartPolicy", "FieldValueForbidden", "Forbidden: may not be set for non-init containers"))
    if init and rp != "Always" and c.get("startupProbe") is not None:
        causes.append((f"{path}.startupProbe", "FieldValueForbidden", "Forbidden: may not be set for init containers without restartPolicy=Always"))
    else:
        _validate_probe(c, "startupProbe", path, causes)
    c.setdefault("image", "")
    c.setdefault("imagePullPolicy", "IfNotPresent")
    c.setdefault("terminationMessagePath", "/dev/termination-log")
    c.setdefault("terminationMessagePolicy", "File")
    _validate_resources(c, path, causes)


def _validate_toleration(t: Any, path: str, causes: Causes) -> None:
    if not isinstance(t, dict):
        causes.append((path, "FieldValueInvalid", "Invalid value: must be an object"))
        return
    op = t.get("operator") or "Equal"
    if op not in ("Equal", "Exists"):
        causes.append((f"{path}.operator", "FieldValueNotSupported", f'Unsupported value: "{op}": supported values: "Equal", "Exists"'))
    if op == "Exists" and t.get("value"):
        causes.append((f"{path}.operator", "FieldValueInvalid", 'Invalid value: "Exists": value must be empty when `operator` is \'Exists\''))
    if not t.get("key") and op != "Exists":
        causes.append((f"{path}.operator", "FieldValueInvalid", f'Invalid value: "{op}": operator must be Exists when `key` is empty'))
    eff = t.get("effect") or ""
    if eff not in ("", "NoSchedule", "PreferNoSchedule", "NoExecute"):
        causes.append((f"{path}.effect", "FieldValueNotSupported", f'Unsupported value: "{eff}": supported values: "NoSchedule", "PreferNoSchedule", "NoExecute"'))


def validate_pod_spec(spec: Any, path: str, causes: Causes, restart_policies: tuple[str, ...]) -> None:
    if not isinstance(spec, dict):
        causes.append((path, "FieldValueRequired", "Required value"))
        return
    containers = spec.get("containers")
    if not containers or not isinstance(containers, list):
        causes.append((f"{path}.containers", "FieldValueRequired", "Required value"))
        containers = []
    names: set[str] = set()
    volumes = _validate_volumes(spec, path, causes)
    for i, c in enumerate(containers):
        _validate_container(c, f"{path}.containers[{i}]", causes, names, volumes, init=False)
    inits = spec.get("initContainers") or []
    if not isinstance(inits, list):
        causes.append((f"{path}.initContainers", "FieldValueInvalid", "Invalid value: must be a list"))
        inits = []
    for i, c in enumerate(inits):
        _validate_container(c, f"{path}.initContainers[{i}]", causes, names, volumes, init=True)
    rp = spec.get("restartPolicy")
    if rp is None and "Always" in restart_policies:
        rp = spec["restartPolicy"] = "Always"
    if rp not in restart_policies:
        quoted = ", ".join(f'"{p}"' for p in restart_policies)
        msg = "Required value: valid values: " + quoted if rp is None else f'Unsupported value: "{rp}": supported values: {quoted}'
        causes.append((f"{path}.restartPolicy", "FieldValueRequired" if rp is None else "FieldValueNotSupported", msg))
    ns = spec.get("nodeSelector")
    if ns is not None and (not isinstance(ns, dict) or not all(isinstance(v, str) for v in ns.values())):
        causes.append((f"{path}.nodeSelector", "FieldValueInvalid", "Invalid value: must be a map of strings"))
    tols = spec.get("tolerations") or []
    if not isinstance(tols, list):
        causes.append((f"{path}.tolerations", "FieldValueInvalid", "Invalid value: must be a list"))
        tols = []
    for i, t in enumerate(tols):
        _validate_toleration(t, f"{path}.tolerations[{i}]", causes)
    for fld in ("terminationGracePeriodSeconds", "activeDeadlineSeconds", "priority"):
        v = spec.get(fld)
        if v is not None and (isinstance(v, bool) or not isinstance(v, int)):
            causes.append((f"{path}.{fld}", "FieldValueInvalid", f"Invalid value: {v!r}: must be an integer"))
    tgp = spec.get("terminationGracePeriodSeconds")
    if isinstance(tgp, int) and tgp < 0:
        causes.append((f"{path}.terminationGracePeriodSeconds", "FieldValueInvalid", "Invalid value: must be >= 0"))
    spec.setdefault("terminationGracePeriodSeconds", 30)
    spec.setdefault("dnsPolicy", "ClusterFirst")
    spec.setdefault("schedulerName", "default-scheduler")
    spec.setdefault("securityContext", {})
    spec.setdefault("serviceAccountName", "default")


def _base_meta(meta: dict[str, Any], namespace: str | None) -> None:
    meta.pop("resourceVersion", None)
    meta["uid"] = new_uid()
    meta["creationTimestamp"] = rfc3339()
    meta["generation"] = 1
    if namespace is not None:
        meta["namespace"] = namespace
    meta.pop("deletionTimestamp", None)
    meta.pop("deletionGracePeriodSeconds", None)


def _int_field(spec: dict[str, Any], fld: str, causes: Causes, minimum: int, path: str = "spec") -> int | None:
    v = spec.get(fld)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int):
        causes.append((f"{path}.{fld}", "FieldValueInvalid", f"Invalid value: {v!r}: must be an integer"))
        return None
    if v < minimum:
        word = "greater than or equal to" if minimum == 0 else "greater than"
        causes.append((f"{path}.{fld}", "FieldValueInvalid", f"Invalid value: {v}: must be {word} {0 if minimum == 0 else minimum - 1}"))
    return v


def prepare_job(body: Any, namespace: str, owned: bool = False) -> dict[str, Any]:
    """Validate and default a Job on create (raises ApiError 400/422).

    The body is copied first (YAML dates become strings, as kubectl sends them), unless `owned`:
    a body just decoded from JSON belongs to nobody else and is used as it is.
    """
    job = check_type_meta(body if owned else json_copy(body), JOBS, namespace)
    job["apiVersion"], job["kind"] = "batch/v1", "Job"
    meta = job["metadata"]
    causes: Causes = []
    name = _validate_name(meta, causes, max_len=63)
    _validate_labels(meta.get("labels"), "metadata.labels", causes)
    _validate_annotations(meta.get("annotations"), "metadata.annotations", causes)
    spec = job.get("spec")
    if not isinstance(spec, dict):
        spec = job["spec"] = {}
    tmpl = spec.get("template")
    if not isinstance(tmpl, dict):
        causes.append(("spec.template", "FieldValueRequired", "Required value"))
        tmpl = {}
    tmeta = tmpl.setdefault("metadata", {}) or {}
    tmpl["metadata"] = tmeta
    _validate_labels(tmeta.get("labels"), "spec.template.metadata.labels", causes)
    _validate_annotations(tmeta.get("annotations"), "spec.template.metadata.annotations", causes)
    if "spec" not in tmpl and isinstance(spec.get("template"), dict):
        causes.append(("spec.template.spec.containers", "FieldValueRequired", "Required value"))
    else:
        validate_pod_spec(tmpl.get("spec"), "spec.template.spec", causes, ("OnFailure", "Never"))
    mode = spec.setdefault("completionMode", "NonIndexed")
    if mode not in ("NonIndexed", "Indexed"):
        causes.append(("spec.completionMode", "FieldValueNotSupported", f'Unsupported value: "{mode}": supported values: "NonIndexed", "Indexed"'))
    parallelism = _int_field(spec, "parallelism", causes, 0)
    completions = _int_field(spec, "completions", causes, 0)
    _int_field(spec, "backoffLimit", causes, 0)
    _int_field(spec, "activeDeadlineSeconds", causes, 1)
    _int_field(spec, "ttlSecondsAfterFinished", causes, 0)
    if mode == "Indexed" and completions is None:
        causes.append(("spec.completions", "FieldValueRequired", "Required value: when completion mode is Indexed"))
    if parallelism is None:
        spec["parallelism"] = 1
    if completions is None and parallelism is None:
        spec["completions"] = 1
    spec.setdefault("backoffLimit", 6)
    spec.setdefault("suspend", False)
    spec.setdefault("podReplacementPolicy", "TerminatingOrFailed")
    if spec.get("selector") is not None and not spec.get("manualSelector"):
        causes.append(("spec.selector", "FieldValueInvalid", "Invalid value: `selector` will be auto-generated"))
    susp = spec.get("suspend")
    if not isinstance(susp, bool):
        causes.append(("spec.suspend", "FieldValueInvalid", f"Invalid value: {susp!r}: must be a boolean"))
    if causes:
        raise ApiError.invalid(JOBS, name, causes)
    _base_meta(meta, namespace)
    uid = meta["uid"]
    labels = dict(tmeta.get("labels") or {})
    labels.update({
        "batch.kubernetes.io/controller-uid": uid,
        "batch.kubernetes.io/job-name": name,
        "controller-uid": uid,
        "job-name": name,
    })
    tmeta["labels"] = labels
    spec["selector"] = {"matchLabels": {"batch.kubernetes.io/controller-uid": uid}}
    job["status"] = {}
    return job


def prepare_pod(body: Any, namespace: str) -> dict[str, Any]:
    """Validate and default a Pod on create (raises ApiError 400/422)."""
    pod = check_type_meta(copy.deepcopy(body), PODS, namespace)
    pod["apiVersion"], pod["kind"] = "v1", "Pod"
    meta = pod["metadata"]
    causes: Causes = []
    name = _validate_name(meta, causes)
    _validate_labels(meta.get("labels"), "metadata.labels", causes)
    _validate_annotations(meta.get("annotations"), "metadata.annotations", causes)
    validate_pod_spec(pod.get("spec"), "spec", causes, ("Always", "OnFailure", "Never"))
    if causes:
        raise ApiError.invalid(PODS, name, causes)
    _base_meta(meta, namespace)
    pod["status"] = {"phase": "Pending", "qosClass": qos_class(pod["spec"])}
    return pod


def prepare_owned_pod(pod: dict[str, Any], namespace: str) -> dict[str, Any]:
    """Default a pod that a controller builds from an already validated template (no copy).

    The Job's template passed `validate_pod_spec` when the Job was created and cannot change
    (`spec.template` is immutable), so its pods are not validated again, as the Job controller's
    pods are not re-validated beyond admission on a real API server either.
    """
    pod["apiVersion"], pod["kind"] = "v1", "Pod"
    _base_meta(pod["metadata"], namespace)
    pod["status"] = {"phase": "Pending", "qosClass": qos_class(pod["spec"])}
    return pod


def _resources_key(spec: Mapping[str, Any]) -> tuple[Any, ...] | None:
    """The containers' resources as a hashable key (None if they are not plain string maps)."""
    out: list[Any] = []
    for key in ("containers", "initContainers"):
        out.append(key)
        for c in spec.get(key) or ():
            res = c.get("resources") or {} if isinstance(c, dict) else None
            if not isinstance(res, dict):
                return None
            for kind in ("limits", "requests"):
                vals = res.get(kind) or {}
                if not isinstance(vals, dict) or not all(isinstance(v, str) for v in vals.values()):
                    return None
                out.append(tuple(vals.items()))
    return tuple(out)


_ZERO = Fraction(0)
_BY_RESOURCES: dict[tuple[Any, ...], tuple[str, dict[str, Fraction]]] = {}  # key -> (QoS class, requests)
_BY_RESOURCES_MAX = 1024


def _from_resources(spec: Mapping[str, Any]) -> tuple[str, dict[str, Fraction]]:
    """QoS class and effective requests of a pod spec, computed once per shape of its resources
    (a burst of pods repeats a few: parsing quantities and adding Fractions was a good part of a
    pod's cost). The requests are shared: callers must not change them."""
    key = _resources_key(spec)
    hit = _BY_RESOURCES.get(key) if key is not None else None
    if hit is None:
        hit = (_qos_class(spec), _pod_requests(spec))
        if key is not None:
            if len(_BY_RESOURCES) >= _BY_RESOURCES_MAX:
                _BY_RESOURCES.clear()
            _BY_RESOURCES[key] = hit
    return hit


def qos_class(spec: Mapping[str, Any]) -> str:
    return _from_resources(spec)[0]


def _qos_class(spec: Mapping[str, Any]) -> str:
    containers = list(spec.get("containers") or []) + list(spec.get("initContainers") or [])
    any_set = False
    guaranteed = True
    for c in containers:
        res = c.get("resources") or {}
        lim, req = res.get("limits") or {}, res.get("requests") or {}
        if lim or req:
            any_set = True
        for k in ("cpu", "memory"):
            if k not in lim or parse_quantity(req.get(k, lim[k])) != parse_quantity(lim[k]):
                guaranteed = False
    if not any_set:
        return "BestEffort"
    return "Guaranteed" if guaranteed else "Burstable"


def pod_requests(pod: Mapping[str, Any]) -> dict[str, Fraction]:
    """Effective requests: max(sum over containers, max over init containers), per resource.

    Shared between pods of one shape of resources: do not change the answer."""
    return _from_resources(pod.get("spec") or {})[1]


def _pod_requests(spec: Mapping[str, Any]) -> dict[str, Fraction]:
    total: dict[str, Fraction] = {}
    for c in spec.get("containers") or []:
        for k, v in ((c.get("resources") or {}).get("requests") or {}).items():
            total[k] = total.get(k, _ZERO) + parse_quantity(v)
    for c in spec.get("initContainers") or []:
        for k, v in ((c.get("resources") or {}).get("requests") or {}).items():
            q = parse_quantity(v)
            if q > total.get(k, _ZERO):
                total[k] = q
    return total


def get_condition(obj: Mapping[str, Any], ctype: str) -> dict[str, Any] | None:
    for c in (obj.get("status") or {}).get("conditions") or []:
        if c.get("type") == ctype:
            return dict(c)
    return None


def set_condition(
    status: dict[str, Any], ctype: str, value: str, reason: str | None = None, message: str | None = None,
    *, probe: bool = True,
) -> None:
    """Set a condition by type, keeping lastTransitionTime when the status does not change."""
    conds: list[dict[str, Any]] = status.setdefault("conditions", [])
    now = rfc3339()
    for c in conds:
        if c.get("type") == ctype:
            if c.get("status") != value:
                c["lastTransitionTime"] = now
                if probe:
                    c["lastProbeTime"] = now
            c["status"] = value
            for key, v in (("reason", reason), ("message", message)):
                if v is None:
                    c.pop(key, None)
                else:
                    c[key] = v
            return
    cond: dict[str, Any] = {"type": ctype, "status": value, "lastTransitionTime": now}
    if probe:
        cond["lastProbeTime"] = now
    if reason is not None:
        cond["reason"] = reason
    if message is not None:
        cond["message"] = message
    conds.append(cond)


GANG_ANNOTATION = "gpuorch.io/gang"


def desired_active(job: dict[str, Any]) -> int:
    """How many pods the Job wants running at once now."""
    spec, st = job.get("spec") or {}, job.get("status") or {}
    if spec.get("suspend"):
        return 0
    par = int(spec.get("parallelism", 1) or 0)
    comp = spec.get("completions")
    succ = int(st.get("succeeded") or 0)
    if comp is None:
        return par if succ == 0 else 0
    return max(0, min(par, int(comp) - succ))
