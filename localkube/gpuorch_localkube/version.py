"""The Kubernetes version a local cluster reports (`/version`, node info, the OpenAPI documents)."""

from __future__ import annotations

import platform

__all__ = ["KUBE_VERSION", "version_info"]

KUBE_VERSION = ("1", "37", "v1.37.0+localkube")


def version_info() -> dict[str, str]:
    machine = {"x86_64": "amd64", "aarch64": "arm64"}.get(platform.machine(), platform.machine())
    return {
        "major": KUBE_VERSION[0],
        "minor": KUBE_VERSION[1],
        "gitVersion": KUBE_VERSION[2],
        "gitCommit": "0000000000000000000000000000000000000000",
        "gitTreeState": "clean",
        "buildDate": "2026-01-01T00:00:00Z",
        "goVersion": f"python{platform.python_version()}",
        "compiler": "cpython",
        "platform": f"linux/{machine}",
    }
