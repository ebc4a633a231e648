"""Running real clients against our nsqd and judging what they saw (see `scenarios.py`).

Clients written for asyncio (pynsq through tornado, ansq) run in a worker thread on their own
event loop while the nsqd under test runs in-process on the test's trio loop; clients in
other runtimes (gnsq under gevent, nsqjs under Node) run as scripts in a subprocess. Either
way the client, once it has every message it expects, stays connected until the server has
reached its final state (or SETTLE_DEADLINE passes), so that the test can then assert that
state — nothing queued, nothing in flight, Go's requeue and timeout counters — without
racing the client's last FINs.
"""

import asyncio
import json
import subprocess
import sys
from collections import Counter, defaultdict
from collections.abc import Callable
from pathlib import Path

import trio

from nsqpy.nsqd.server import NSQD
from tests.interop.scenarios import (
    CLIENT_DEADLINE,
    COUNTS,
    HEARTBEATS_BEFORE_PUBLISH,
    SETTLE_DEADLINE,
    Report,
    body_index,
    expected_attempts,
    expected_delivery_count,
    first_attempt_action,
    message_bodies,
    publish_plan,
)

INTEROP_DIR = Path(__file__).parent
REPO_ROOT = INTEROP_DIR.parent.parent

# -- judging a client's report --------------------------------------------------------


def delivery_problems(deliveries: list, scenario: str) -> list[str]:
    """A short account of how the deliveries differ from the scenario's plan; [] when none."""
    observed: dict[str, list[int]] = defaultdict(list)
    for body, attempts in deliveries:
        observed[body].append(attempts)
    expected = expected_attempts(scenario)
    problems = []
    missing = sorted(set(expected) - set(observed), key=body_index)
    if missing:
        problems.append(f"{len(missing)} bodies never delivered, e.g. {missing[:5]}")
    unexpected = sorted(set(observed) - set(expected))
    if unexpected:
        problems.append(f"{len(unexpected)} bodies never published, e.g. {unexpected[:5]}")
    wrong = [
        f"{body}: attempts {observed[body]}, expected {attempts}"
        for body, attempts in expected.items()
        if body in observed and observed[body] != attempts
    ]
    if wrong:
        problems.append(f"{len(wrong)} bodies with the wrong deliveries: {wrong[:5]}")
    return problems


def assert_report(report: dict, scenario: str) -> None:
    """The client's half of a scenario's verdict: exact deliveries and attempts, no errors."""
    assert report["errors"] == []
    assert report["publish_errors"] == []
    assert report["disconnects"] == 0
    assert report["published_ok"] == len(publish_plan(message_bodies(COUNTS[scenario])))
    assert delivery_problems(report["deliveries"], scenario) == []
    assert len(report["deliveries"]) == expected_delivery_count(scenario)
    if scenario == "heartbeat":
        assert report["heartbeats_before_publish"] >= HEARTBEATS_BEFORE_PUBLISH


# -- the server's half ------------------------------------------------------------------


def channel_state(nsqd: NSQD, topic: str, channel: str) -> dict:
    """Go's /stats fields for one channel: depth, in-flight and deferred counts, counters."""
    found = nsqd.topics.get(topic)
    found = found.channels.get(channel) if found else None
    if found is None:
        return {"exists": False}
    return {
        "exists": True,
        "depth": found.depth,
        "in_flight_count": len(found.in_flight),
        "deferred_count": len(found.deferred),
        "message_count": found.message_count,
        "requeue_count": found.requeue_count,
        "timeout_count": found.timeout_count,
    }


def expected_channel_state(scenario: str) -> dict:
    """After a scenario: nothing queued or in flight; one REQ per requeue, one timeout per hold."""
    bodies = message_bodies(COUNTS[scenario])
    actions = Counter(first_attempt_action(scenario, body) for body in bodies)
    return {
        "exists": True,
        "depth": 0,
        "in_flight_count": 0,
        "deferred_count": 0,
        "message_count": len(bodies),
        "requeue_count": actions["requeue"],
        "timeout_count": actions["hold"],
    }


def drained(nsqd: NSQD, topic: str, channel: str, scenario: str) -> Callable[[], bool]:
    """True once the channel has reached the scenario's final state."""
    expected = expected_channel_state(scenario)
    return lambda: channel_state(nsqd, topic, channel) == expected


def from_trio(predicate: Callable[[], bool]) -> Callable[[], bool]:
    """`predicate`, callable from a client's worker thread: it runs in the server's trio loop."""
    return lambda: trio.from_thread.run_sync(predicate)


def always() -> bool:
    return True


# -- clients on asyncio, in this process ------------------------------------------------


async def run_asyncio_client(session, report: Report, *args, deadline: float = CLIENT_DEADLINE):
    """Run `session(report, *args)` in a worker thread on its own asyncio loop."""

    def run() -> None:
        asyncio.run(asyncio.wait_for(session(report, *args), deadline))

    try:
        await trio.to_thread.run_sync(run)
    except TimeoutError:
        raise AssertionError(
            f"{report.client} did not finish in {deadline}s: {report.summary()}"
        ) from None


async def settle(settled: Callable[[], bool]) -> None:
    """For asyncio clients: give the server up to SETTLE_DEADLINE to reach its final state
    before the client disconnects; the test asserts that state afterwards."""
    loop = asyncio.get_running_loop()
    give_up = loop.time() + SETTLE_DEADLINE
    while not settled() and loop.time() < give_up:
        await asyncio.sleep(0.01)


# -- clients in scripts -----------------------------------------------------------------


async def run_client_script(
    argv: list[str],
    *,
    settled: Callable[[], bool],
    cwd: Path | None = None,
    deadline: float = CLIENT_DEADLINE + SETTLE_DEADLINE,
) -> dict:
    """Run a client script that prints its report as one JSON line, then waits for stdin.

    The script keeps its connections open until its stdin closes: we first wait (up to
    SETTLE_DEADLINE) for `settled` while the client is still connected, then close its
    stdin, and it closes its connections and exits 0.
    """
    stdout = bytearray()
    stderr = bytearray()
    line_or_eof = trio.Event()

    async def pump(stream, buffer: bytearray, event: trio.Event | None) -> None:
        async for chunk in stream:
            buffer.extend(chunk)
            if event is not None and b"\n" in buffer:
                event.set()
        if event is not None:
            event.set()

    def output() -> str:
        return (stdout[-2000:] + stderr[-6000:]).decode(errors="replace")

    process = await trio.lowlevel.open_process(
        argv,
        cwd=str(cwd or REPO_ROOT),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        with trio.fail_after(deadline):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(pump, process.stdout, stdout, line_or_eof)
                nursery.start_soon(pump, process.stderr, stderr, None)
                await line_or_eof.wait()
                if b"\n" not in stdout:
                    returncode = await process.wait()
                    raise AssertionError(f"{argv} exited {returncode} with no report:\n{output()}")
                report = json.loads(stdout.split(b"\n", 1)[0])
                with trio.move_on_after(SETTLE_DEADLINE):
                    while not settled():
                        await trio.sleep(0.01)
                await process.stdin.aclose()
                returncode = await process.wait()
    except trio.TooSlowError:
        raise AssertionError(f"{argv} did not finish in {deadline}s:\n{output()}") from None
    finally:
        if process.returncode is None:
            process.kill()
            with trio.CancelScope(shield=True):
                await process.wait()
    assert returncode == 0, output()
    return report


def python_module(module: str, *args: str) -> list[str]:
    return [sys.executable, "-m", module, *args]
