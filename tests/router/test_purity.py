"""The policy is a functional core: importing it pulls in no I/O, async, logging or tracing library."""

from __future__ import annotations

import subprocess
import sys

FORBIDDEN = ("nats", "kubernetes", "asyncio", "structlog", "opentelemetry")


def test_policy_and_explain_import_no_io_libraries() -> None:
    code = (
        "import sys, gpuorch_router.policy, gpuorch_router.explain, gpuorch_router.history\n"
        f"print(sorted(m for m in sys.modules if m.split('.')[0] in {FORBIDDEN!r}))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
