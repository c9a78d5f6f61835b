"""Node packages for the tests that run JavaScript clients (nats.js, Ajv): `npm ci` once per lock.

Never skips: a machine without node/npm fails with what to install (.ci/run installs them).
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
NODE_CLIENT = ROOT / "examples" / "node-client"


def node_client_dir() -> Path:
    """examples/node-client with its node_modules installed from package-lock.json."""
    for tool in ("node", "npm"):
        assert shutil.which(tool), f"{tool} is needed: apt-get install -y nodejs npm (.ci/run does it)"
    lock = NODE_CLIENT / "package-lock.json"
    stamp = NODE_CLIENT / "node_modules" / ".package-lock.json"
    if not stamp.exists() or stamp.stat().st_mtime < lock.stat().st_mtime:
        p = subprocess.run(["npm", "ci", "--no-audit", "--no-fund", "--loglevel=error"], cwd=NODE_CLIENT,
                           capture_output=True, text=True, timeout=300)
        assert p.returncode == 0, f"npm ci failed in {NODE_CLIENT}:\n{p.stdout}\n{p.stderr}"
    return NODE_CLIENT
