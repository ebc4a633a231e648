"""Waiting for a condition that no event announces: call it until it holds, with a deadline.

`poll` blocks (tests driving daemons in processes or threads); `wait_until` awaits, on trio or
asyncio, whichever runs it. Both return the condition's first true value and fail with an
AssertionError naming `what` when the deadline passes: a deadline only bounds a failure, so
it is generous and never a measurement.
"""

import inspect
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

import sniffio

T = TypeVar("T")

# Seconds before a condition that never holds fails the test.
DEFAULT_TIMEOUT = 20.0


def poll(
    check: Callable[[], T],
    what: str | Callable[[], str] = "",
    *,
    timeout: float = DEFAULT_TIMEOUT,
    interval: float = 0.01,
) -> T:
    """Call `check` every `interval` until it returns something true, and return that."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(_timed_out(check, what, timeout))
        time.sleep(interval)


async def wait_until(
    check: Callable[[], T] | Callable[[], Awaitable[T]],
    what: str | Callable[[], str] = "",
    *,
    timeout: float = DEFAULT_TIMEOUT,
    interval: float = 0.005,
) -> T:
    """`poll` for async tests: sleeps on the running event loop (trio or asyncio); `check`
    may be a coroutine function too."""
    if sniffio.current_async_library() == "trio":
        import trio

        clock, sleep = trio.current_time, trio.sleep
    else:
        import asyncio

        clock, sleep = asyncio.get_running_loop().time, asyncio.sleep
    deadline = clock() + timeout
    while True:
        value = check()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return value
        if clock() > deadline:
            raise AssertionError(_timed_out(check, what, timeout))
        await sleep(interval)


def _timed_out(check: Callable, what: str | Callable[[], str], timeout: float) -> str:
    text = what() if callable(what) else what
    return f"timed out after {timeout:g}s waiting for {text or check}"
