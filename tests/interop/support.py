"""What the interop tests share: the scenarios every client plays, and how they are judged.

Each client (pynsq, ansq, gnsq, nsqjs) plays the same four scenarios against our nsqd and
reports what it saw as one JSON-able dict (see `Report`); the tests then judge the report and
the server's own counters the same way for every client:

- ``pubsub``: 10,000 messages published as 2,000 PUBs and 80 MPUBs of 100 (rounds of 25 PUBs
  then one MPUB), then consumed with max_in_flight 200; every body is delivered exactly once,
  with attempts 1, and FIN'd.
- ``requeue``: 20 messages; on its first delivery every message with an even index is
  requeued with no delay (REQ <id> 0); those come back exactly once more, with attempts 2.
- ``timeout``: 3 messages and a 1 s message timeout; the handler never answers the first
  delivery of msg-0, which nsqd must time out and deliver again with attempts 2.
- ``heartbeat``: the consumer IDENTIFYs a 1 s heartbeat interval and sits idle, answering
  heartbeats, until it has seen 3 (the connection is idle past Go's read deadline of two
  intervals); only then is one message published, and it must still arrive.

The scripts under this folder (`gnsq_client.py`, `node/pubsub.js`) implement the same plan
and print the report as one line of JSON; keep them in step with `publish_plan` and
`first_attempt_action`.
"""

import asyncio
import json
import subprocess
import sys
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import trio

from nsqd.server import NSQD

INTEROP_DIR = Path(__file__).parent
REPO_ROOT = INTEROP_DIR.parent.parent

MAX_IN_FLIGHT = 200
PUBS_PER_ROUND = 25
MPUB_SIZE = 100
MSG_TIMEOUT_MS = 1000  # Go's minimum IDENTIFY msg_timeout
HEARTBEAT_INTERVAL_MS = 1000  # Go's minimum IDENTIFY heartbeat_interval
HEARTBEATS_BEFORE_PUBLISH = 3

COUNTS = {"pubsub": 10_000, "requeue": 20, "timeout": 3, "heartbeat": 1}
SCENARIOS = tuple(COUNTS)

# Each scenario must finish well inside this, the whole client run included.
CLIENT_DEADLINE = 45.0
SETTLE_DEADLINE = 10.0


def message_bodies(count: int) -> list[str]:
    return [f"msg-{index}" for index in range(count)]


def body_index(body: str) -> int:
    return int(body.rsplit("-", 1)[1])


def publish_plan(bodies: list[str]) -> list[tuple[str, list[str]]]:
    """("pub", [body]) and ("mpub", [bodies...]) commands: rounds of 25 PUBs then an MPUB."""
    commands: list[tuple[str, list[str]]] = []
    position = 0
    while position < len(bodies):
        for body in bodies[position : position + PUBS_PER_ROUND]:
            commands.append(("pub", [body]))
        position += PUBS_PER_ROUND
        batch = bodies[position : position + MPUB_SIZE]
        if batch:
            commands.append(("mpub", batch))
        position += len(batch)
    return commands


def first_attempt_action(scenario: str, body: str) -> str:
    """What a handler does with a message on its first attempt: finish, requeue or hold."""
    index = body_index(body)
    if scenario == "requeue" and index % 2 == 0:
        return "requeue"
    if scenario == "timeout" and index == 0:
        return "hold"
    return "finish"


def handler_action(scenario: str, body: str, attempts: int) -> str:
    return first_attempt_action(scenario, body) if attempts == 1 else "finish"


def expected_attempts(scenario: str) -> dict[str, list[int]]:
    """Every delivery each body should get, as its attempts values in order."""
    expected = {}
    for body in message_bodies(COUNTS[scenario]):
        first = first_attempt_action(scenario, body)
        expected[body] = [1] if first == "finish" else [1, 2]
    return expected


def expected_delivery_count(scenario: str) -> int:
    return sum(len(attempts) for attempts in expected_attempts(scenario).values())


@dataclass
class Report:
    """What a client saw; the same shape from every client and script."""

    client: str = ""
    published_ok: int = 0
    publish_errors: list[str] = field(default_factory=list)
    deliveries: list[tuple[str, int]] = field(default_factory=list)
    identify: dict | None = None
    heartbeats: int = 0
    heartbeats_before_publish: int = 0
    errors: list[str] = field(default_factory=list)
    disconnects: int = 0

    def to_json(self) -> dict:
        return asdict(self)

    def summary(self) -> str:
        """The report without the list of deliveries, for failure messages."""
        fields = {k: v for k, v in self.to_json().items() if k != "deliveries"}
        attempts = Counter(attempts for _body, attempts in self.deliveries)
        return f"{fields} deliveries={len(self.deliveries)} by attempts={dict(attempts)}"


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


def assert_report(report: dict, scenario: str, *, published_commands: int | None = None) -> None:
    """The client-side half of every scenario's verdict."""
    if published_commands is None:
        published_commands = len(publish_plan(message_bodies(COUNTS[scenario])))
    assert report["publish_errors"] == []
    assert report["published_ok"] == published_commands
    assert delivery_problems(report["deliveries"], scenario) == []
    assert len(report["deliveries"]) == expected_delivery_count(scenario)
    attempts = Counter(attempts for _body, attempts in report["deliveries"])
    assert set(attempts) <= {1, 2}, attempts
    assert report["errors"] == []
    assert report["disconnects"] == 0
    if scenario == "heartbeat":
        assert report["heartbeats_before_publish"] >= HEARTBEATS_BEFORE_PUBLISH


# -- the server's side ------------------------------------------------------------------


def channel_state(nsqd: NSQD, topic: str, channel: str) -> dict:
    """Go's /stats fields for one channel: depth, in_flight_count, deferred_count, counters."""
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
    """After a scenario: nothing left queued or in flight, and Go's counters."""
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
    """A predicate for the trio thread: the channel has reached its final state."""
    expected = expected_channel_state(scenario)
    return lambda: channel_state(nsqd, topic, channel) == expected


def from_trio(predicate: Callable[[], bool]) -> Callable[[], bool]:
    """`predicate`, callable from a client's worker thread: it runs in the server's trio loop."""
    return lambda: trio.from_thread.run_sync(predicate)


def always() -> bool:
    return True


# -- clients in this process ---------------------------------------------------------


async def run_asyncio_client(session, report: Report, *args, deadline: float = CLIENT_DEADLINE):
    """Run `session(report, *args)` in a worker thread on its own asyncio loop.

    The server stays on the test's trio loop; `from_trio` lets the session poll it.
    """

    def run() -> None:
        asyncio.run(asyncio.wait_for(session(report, *args), deadline))

    try:
        await trio.to_thread.run_sync(run)
    except TimeoutError:
        raise AssertionError(
            f"{report.client} did not finish in {deadline}s: {report.summary()}"
        ) from None


async def until(predicate: Callable[[], bool], what: str, timeout: float = CLIENT_DEADLINE):
    """For asyncio clients: poll `predicate` until true; fail after `timeout`."""
    loop = asyncio.get_running_loop()
    give_up = loop.time() + timeout
    while not predicate():
        if loop.time() > give_up:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.005)


async def settle(settled: Callable[[], bool]) -> None:
    """For asyncio clients: give the server up to SETTLE_DEADLINE to reach its final state
    before the client disconnects; the test then asserts that state."""
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
    deadline: float = CLIENT_DEADLINE,
) -> dict:
    """Run a client script that prints its report as one JSON line and then waits.

    The script keeps its connections open until its stdin closes, so that we can first
    wait (up to SETTLE_DEADLINE) for `settled` — the server having processed every FIN —
    while the client is still connected; then we close its stdin and it closes cleanly.
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
                    raise AssertionError(
                        f"{argv[:2]} exited {returncode} without a report:\n"
                        + stderr.decode(errors="replace")
                    )
                report = json.loads(stdout.split(b"\n", 1)[0])
                with trio.move_on_after(SETTLE_DEADLINE):
                    while not settled():
                        await trio.sleep(0.01)
                await process.stdin.aclose()
                returncode = await process.wait()
    except BaseException as error:
        if isinstance(error, trio.TooSlowError):
            raise AssertionError(
                f"{argv[:2]} did not finish in {deadline}s:\n"
                + stdout.decode(errors="replace")[-2000:]
                + stderr.decode(errors="replace")[-4000:]
            ) from None
        raise
    finally:
        if process.returncode is None:
            process.kill()
            with trio.CancelScope(shield=True):
                await process.wait()
    assert returncode == 0, stderr.decode(errors="replace")
    return report


def python_script(name: str, *args: str) -> list[str]:
    return [sys.executable, str(INTEROP_DIR / name), *args]
