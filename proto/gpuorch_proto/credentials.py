"""Named credentials (DESIGN §3: "credentials by name, never the secret itself"; issue 11).

A workload names the credentials it needs (`spec.requirements.credentials: [wandb]`). Each
cluster's registry entry says which it has (`credentials`) and where each lives there
(`credential_refs: {wandb: {secret: wandb-key, key: token, env: WANDB_API_KEY}}`): a key of a
Kubernetes Secret in the workload namespace. The dispatcher writes that into the Job as
``valueFrom.secretKeyRef`` (`secret_env`), so the value is read by the kubelet on the cluster and
never passes through gpuorch: not in a submit, an event, a log line or a manifest.

A submit that carries a secret *value* instead is refused (`literal_secret_errors`): a
credential "name" that is not a name, or an env variable whose name says it is a secret
(``*_TOKEN``, ``*_PASSWORD``, ``*_API_KEY``, ...) or whose value looks like one (a private key, a
cloud access key, a provider token). The messages never repeat the value.
"""

from __future__ import annotations

import re
from typing import Any

from .events import FieldError
from .inventory import ClusterRegistryEntry

#: A credential's name: what the registry maps, never a value.
CREDENTIAL_NAME = re.compile(r"^[a-z0-9]([a-z0-9._-]{0,61}[a-z0-9])?$")
#: Env variable names that say their value is a secret.
SECRET_ENV_NAME = re.compile(
    r"(^|_)(TOKEN|SECRET|SECRET_KEY|PASSWORD|PASSWD|API_?KEY|ACCESS_KEY|PRIVATE_KEY|CREDENTIALS?)$"
)
#: Values that are secrets whatever the variable is called (the well-known formats).
SECRET_VALUE = re.compile(
    r"-----BEGIN [A-Z ]*PRIVATE KEY-----"  # PEM private keys
    r"|\bAKIA[0-9A-Z]{16}\b"  # AWS access key id
    r"|\bgh[pousr]_[A-Za-z0-9]{30,}"  # GitHub tokens
    r"|\bglpat-[A-Za-z0-9_-]{20,}"  # GitLab
    r"|\bxox[abprs]-[A-Za-z0-9-]{10,}"  # Slack
    r"|\bhf_[A-Za-z0-9]{30,}"  # Hugging Face
    r"|\bsk-[A-Za-z0-9_-]{20,}"  # OpenAI-style API keys
    r"|\beyJ[A-Za-z0-9_-]{10,}\.[A-Za-z0-9_-]{10,}\.[A-Za-z0-9_-]{10,}"  # a JWT
    r"|://[^/\s:@]+:[^/\s@]+@"  # a URL with user:password
)
ENV_PREFIX = "GPUORCH_CREDENTIAL_"


def env_name(credential: str) -> str:
    """The variable a credential is seen as when its registry entry names none."""
    return ENV_PREFIX + "".join(c if c.isalnum() else "_" for c in credential).upper()


def credential_errors(names: list[str], at: str) -> list[FieldError]:
    """`requirements.credentials` must be names (what the registry maps), never values."""
    out = []
    for i, name in enumerate(names):
        if not CREDENTIAL_NAME.match(name):
            out.append(FieldError(
                path=f"{at}[{i}]",
                message=(
                    f"is not a credential name ({len(name)} characters; a-z, 0-9, '.', '_', '-'): name a credential "
                    "the cluster registry maps to a Secret (credential_refs), never the secret itself"
                ),
            ))  # fmt: skip
    return out


def literal_secret_errors(env: dict[str, str], at: str) -> list[FieldError]:
    """Env entries that carry a secret value: by their name (non-empty) or by their value's format."""
    out = []
    for key, value in env.items():
        by_name = bool(value) and SECRET_ENV_NAME.search(key.upper()) is not None
        if by_name or SECRET_VALUE.search(value):
            why = "its name says it holds a secret" if by_name else "its value has the format of a secret"
            out.append(FieldError(
                path=f"{at}.{key[:80]}",
                message=(
                    f"{why}: secret values may not be part of a workload (they would be stored in the event log); "
                    "name a credential in spec.requirements.credentials and the cluster supplies it from a Secret"
                ),
            ))  # fmt: skip
    return out


def secret_env(credentials: list[str], entry: ClusterRegistryEntry) -> list[dict[str, Any]]:
    """The Job's env entries for the workload's named credentials on one cluster.

    A credential the entry maps (`credential_refs`) becomes ``valueFrom.secretKeyRef`` to that
    Secret's key, under the variable the ref names (or `env_name`). One the cluster has without a
    ref is supplied some other way (workload identity, a mounted file) and adds nothing here.
    """
    out: list[dict[str, Any]] = []
    for name in dict.fromkeys(credentials):
        ref = entry.credential_refs.get(name)
        if ref is None:
            continue
        out.append({"name": ref.env or env_name(name), "valueFrom": {"secretKeyRef": {"name": ref.secret, "key": ref.key}}})
    return out


def registry_errors(entry: ClusterRegistryEntry, at: str) -> list[FieldError]:
    """A registry entry's refs: each names a credential the cluster has, a Secret name and a key."""
    out = []
    for name, ref in entry.credential_refs.items():
        where = f"{at}.credential_refs.{name}"
        if name not in entry.credentials:
            out.append(FieldError(path=where, message=f"{name!r} is not one of this cluster's credentials {sorted(entry.credentials)}"))
        if not re.match(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$", ref.secret):
            out.append(FieldError(path=f"{where}.secret", message=f"{ref.secret!r} is not a Secret name"))
        if not re.match(r"^[-._a-zA-Z0-9]{1,253}$", ref.key):
            out.append(FieldError(path=f"{where}.key", message=f"{ref.key!r} is not a Secret key"))
        if ref.env is not None and not re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", ref.env):
            out.append(FieldError(path=f"{where}.env", message=f"{ref.env!r} is not an environment variable name"))
    return out
