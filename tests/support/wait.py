"""Polling with a deadline: the only way tests wait for something asynchronous to happen."""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

T = TypeVar("T")


async def assert_eventually(
    predicate: Callable[[], T | Awaitable[T]],
    timeout: float = 10.0,
    interval: float = 0.05,
    message: str | Callable[[], str] | None = None,
) -> T:
    """Poll `predicate` (sync or async) until it returns a truthy value; return that value.

    A predicate may also assert: an AssertionError counts as "not yet" and the last one is
    re-raised (with its message) when `timeout` seconds have passed.
    """
    deadline = time.monotonic() + timeout
    last_error: AssertionError | None = None
    last_value: Any = None
    while True:
        try:
            value = predicate()
            if inspect.isawaitable(value):
                value = await value
            last_value = value
            if value:
                return value
        except AssertionError as exc:
            last_error = exc
        if time.monotonic() >= deadline:
            detail = message() if callable(message) else message
            if last_error is not None:
                raise AssertionError(
                    f"not true within {timeout:g}s: {detail or ''} {last_error}".strip()
                ) from last_error
            raise AssertionError(f"not true within {timeout:g}s: {detail or ''} (last value {last_value!r})")
        await asyncio.sleep(interval)
