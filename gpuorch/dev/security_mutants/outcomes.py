"""pytest plugin (`-p gpuorch.dev.security_mutants.outcomes --outcomes FILE`): every test's
outcome per phase (setup, call, teardown) as JSON, for the mutation runner to read: a test
that failed in its call or teardown killed the mutant; one whose setup failed says nothing."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

_outcomes: dict[str, dict[str, str]] = {}


def pytest_addoption(parser: Any) -> None:
    parser.addoption("--outcomes", default=None, help="write each test's phase outcomes to this JSON file")


def pytest_runtest_logreport(report: Any) -> None:
    _outcomes.setdefault(report.nodeid, {})[report.when] = report.outcome


def pytest_collectreport(report: Any) -> None:
    if report.failed:
        _outcomes.setdefault(report.nodeid or "<collection>", {})["collect"] = report.outcome


def pytest_sessionfinish(session: Any) -> None:
    path = session.config.getoption("outcomes")
    if path:
        Path(path).write_text(json.dumps(_outcomes, indent=1, sort_keys=True))
