"""`make demo`: the seed's scenario end to end; exits 0 and leaves no process behind."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e


def test_demo_runs_the_seed_scenario_and_stops_everything() -> None:
    out = subprocess.run([sys.executable, "-m", "gpuorch.cli", "demo"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    text = out.stdout
    state = re.search(r"state in (\S+);", text)
    assert state, text
    labels = {"train-imagenet", "train-imagenet-40g", "finetune-40g", "eval-short", "fractional", "pinned-ineligible"}
    rows = {f[0]: f for f in (line.split() for line in text.splitlines()) if len(f) > 3 and f[0] in labels and f[1] != "->"}
    assert set(rows) == labels, text
    assert rows["train-imagenet-40g"][1:4] == ["primary", "1", "completed"], "2 h queue + 1 h run beats a 3 h copy + 1 h run"
    assert rows["finetune-40g"][1] == "spare" and rows["eval-short"][1] == "short"
    assert rows["fractional"][3] == "rejected" and rows["pinned-ineligible"][3] == "rejected"
    assert "spec.resources.gpus: 0.5 is not a whole number" in text
    assert "copy 3h" in text
    leftovers = subprocess.run(["pgrep", "-f", state.group(1)], capture_output=True, text=True)
    assert leftovers.stdout.strip() == "", f"processes left behind: {leftovers.stdout}"
    assert Path(state.group(1)).exists()
