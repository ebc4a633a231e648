"""Waiting for a condition that no event announces: call it until it holds, with a deadline.

`poll` blocks (tests driving daemons in processes or threads); `wait_until` awaits, on trio or
asyncio, whichever runs it. Both return the condition's first true value and fail with an
AssertionError naming `what` when the deadline passes: a deadline only bounds a failure, so
it is generous and never a measurement.

The pause between two checks starts short and grows to `MAX_INTERVAL`: a condition that holds
at once is seen at once, and one that takes seconds (an election, a catch-up) is not asked
hundreds of times meanwhile; each ask is often an HTTP request to a daemon, which on CI's two
cores takes its time from the daemons the test waits for.
"""

import inspect
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

import sniffio

T = TypeVar("T")

# Seconds before a condition that never holds fails the test.
DEFAULT_TIMEOUT = 20.0
# The longest pause between two checks, and how the pause grows to it.
MAX_INTERVAL = 0.1
GROWTH = 1.25


def poll(
    check: Callable[[], T],
    what: str | Callable[[], str] = "",
    *,
    timeout: float = DEFAULT_TIMEOUT,
    interval: float = 0.01,
) -> T:
    """Call `check` until it returns something true, and return that: after `interval`, then
    after pauses growing to `MAX_INTERVAL`."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(_timed_out(check, what, timeout))
        time.sleep(interval)
        interval = min(interval * GROWTH, max(interval, MAX_INTERVAL))


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
        interval = min(interval * GROWTH, max(interval, MAX_INTERVAL))


def _timed_out(check: Callable, what: str | Callable[[], str], timeout: float) -> str:
    text = what() if callable(what) else what
    return f"timed out after {timeout:g}s waiting for {text or check}"
