"""Real clients discover nsqds through our nsqlookupd and consume from all of them.

One nsqlookupd and three nsqd processes (`-broadcast-address=127.0.0.1`, registered with the
lookupd) each get messages; a consumer given only the lookupd's HTTP address must receive every
one. Then a fourth nsqd starts, registers, gets messages, and the consumer, polling /lookup
every second, must find it and receive those too.

The consumers: pynsq's `nsq.Reader(lookupd_http_addresses=...)`, run on its own asyncio loop in
a thread as in tests/interop, and nsqjs's `Reader` with `lookupdHTTPAddresses`, run by
tests/interop/node/lookup_consume.js.
"""

import asyncio
import json
import shutil
import subprocess
import threading
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import nsq
import pytest

from tests.harness import DaemonProcess, start_nsqd, start_nsqlookupd
from tests.nsqlookupd.support import sync_lookup_producers
from tests.support.http import get_json, post
from tests.support.polling import poll

TOPIC = "discovery"
CHANNEL = "lookup"
PER_NSQD = 25
CONSUME_DEADLINE = 20.0
NODE_DIR = Path(__file__).resolve().parents[1] / "interop" / "node"


class Topology:
    """A lookupd and the nsqds registered with it; every process is killed at the end."""

    def __init__(self, tmp_path: Path) -> None:
        self.tmp_path = tmp_path
        self.lookupd = start_nsqlookupd()
        self.nsqds: list[DaemonProcess] = []

    @property
    def lookupd_http(self) -> str:
        return f"127.0.0.1:{self.lookupd.port('HTTP')}"

    def start_nsqds(self, count: int) -> list[DaemonProcess]:
        first = len(self.nsqds)
        directories = [self.tmp_path / f"nsqd{first + index}" for index in range(count)]
        for directory in directories:
            directory.mkdir()
        flags = (f"-lookupd-tcp-address=127.0.0.1:{self.lookupd.port('TCP')}",)
        with ThreadPoolExecutor(max_workers=count) as pool:
            started = list(
                pool.map(
                    lambda path: start_nsqd(path, *flags, "-broadcast-address=127.0.0.1"),
                    directories,
                )
            )
        self.nsqds.extend(started)
        nodes = len(self.nsqds)
        poll(
            lambda: len(get_json(self.lookupd.port("HTTP"), "/nodes")["producers"]) == nodes,
            f"{nodes} nsqds registered with the lookupd",
        )
        return started

    def producers(self) -> set[int]:
        """The nsqds /lookup lists for the topic; none while no nsqd has registered it yet
        (an HTTP publish is answered before nsqd's REGISTER reaches the lookupd)."""
        producers = sync_lookup_producers(self.lookupd.port("HTTP"), TOPIC) or []
        return {producer["tcp_port"] for producer in producers}

    def kill(self) -> None:
        for daemon in [*self.nsqds, self.lookupd]:
            daemon.kill()


@pytest.fixture
def topology(tmp_path):
    topology = Topology(tmp_path)
    try:
        topology.start_nsqds(3)
        yield topology
    finally:
        topology.kill()


def publish(nsqd: DaemonProcess, prefix: str) -> list[str]:
    """MPUB PER_NSQD bodies over HTTP (creating the topic there, so the nsqd registers it)."""
    bodies = [f"{prefix}-{index}" for index in range(PER_NSQD)]
    post(nsqd.port("HTTP"), f"/mpub?topic={TOPIC}", "\n".join(bodies).encode())
    return bodies


class PynsqConsumer:
    """pynsq's Reader on its own asyncio loop in a thread, knowing only the lookupd."""

    def __init__(self, lookupd_http: str) -> None:
        self.lookupd_http = lookupd_http
        self.bodies: list[str] = []
        self.errors: list[str] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> None:
        self._thread.start()
        assert self._ready.wait(10), "pynsq's loop did not start"

    def _run(self) -> None:
        try:
            asyncio.run(self._session())
        except BaseException as error:  # reported by stop()
            self.errors.append(repr(error))
            self._ready.set()

    def _handle(self, message: nsq.Message) -> bool:
        self.bodies.append(message.body.decode())
        return True  # FIN

    async def _session(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        reader = nsq.Reader(
            topic=TOPIC,
            channel=CHANNEL,
            message_handler=self._handle,
            lookupd_http_addresses=[self.lookupd_http],
            lookupd_poll_interval=1,
            max_in_flight=100,
        )
        self._ready.set()
        await self._stop.wait()
        reader.close()

    def stop(self) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)
        assert not self._thread.is_alive(), "pynsq did not stop"


class NsqjsConsumer:
    """tests/interop/node/lookup_consume.js in a Node process."""

    def __init__(self, lookupd_http: str) -> None:
        node = shutil.which("node")
        assert node, "Node.js is needed for the nsqjs tests: install node and npm"
        assert (NODE_DIR / "node_modules" / "nsqjs").is_dir(), (
            "nsqjs is not installed: run `make install` (npm ci --prefix tests/interop/node)"
        )
        self.argv = [
            node,
            str(NODE_DIR / "lookup_consume.js"),
            f"--lookupd={lookupd_http}",
            f"--topic={TOPIC}",
            f"--channel={CHANNEL}",
        ]
        self.bodies: list[str] = []
        self.errors: list[str] = []
        self.connected: list[str] = []
        self.stderr: list[str] = []
        self.process: subprocess.Popen | None = None

    def start(self) -> None:
        self.process = subprocess.Popen(
            self.argv,
            cwd=NODE_DIR,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        threading.Thread(target=self._read_events, daemon=True).start()
        threading.Thread(target=self._read_stderr, daemon=True).start()

    def _read_events(self) -> None:
        for line in self.process.stdout:
            event = json.loads(line)
            if "body" in event:
                self.bodies.append(event["body"])
            elif "connected" in event:
                self.connected.append(event["connected"])
            else:
                self.errors.append(event.get("error", line))

    def _read_stderr(self) -> None:
        self.stderr.extend(self.process.stderr)

    def stop(self) -> None:
        try:
            self.process.stdin.close()
            returncode = self.process.wait(10)
        finally:
            if self.process.poll() is None:
                self.process.kill()
                self.process.wait()
        assert returncode == 0, "".join(self.stderr)


def received(consumer, bodies: list[str]):
    wanted = set(bodies)
    return lambda: wanted <= set(consumer.bodies)


def discover_and_consume(topology: Topology, consumer) -> None:
    published = [publish(nsqd, f"nsqd{index}") for index, nsqd in enumerate(topology.nsqds)]
    ports = {nsqd.port("TCP") for nsqd in topology.nsqds}
    poll(lambda: topology.producers() == ports, "the topic on all three nsqds in /lookup")
    consumer.start()
    try:
        for index, bodies in enumerate(published):
            poll(
                received(consumer, bodies), f"the messages of nsqd{index}", timeout=CONSUME_DEADLINE
            )

        # A fourth nsqd comes up later: once it has registered, it gets messages.
        (fourth,) = topology.start_nsqds(1)
        late = publish(fourth, "nsqd3")
        poll(lambda: fourth.port("TCP") in topology.producers(), "the fourth nsqd in /lookup")
        poll(received(consumer, late), "the fourth nsqd's messages", timeout=CONSUME_DEADLINE)
    finally:
        consumer.stop()
    assert consumer.errors == []
    counts = Counter(consumer.bodies)
    assert set(counts) == {body for bodies in [*published, late] for body in bodies}
    assert [body for body, count in counts.items() if count != 1] == []


def test_pynsq_reader_discovers_every_nsqd_through_lookupd(topology):
    discover_and_consume(topology, PynsqConsumer(topology.lookupd_http))


def test_nsqjs_reader_discovers_every_nsqd_through_lookupd(topology):
    consumer = NsqjsConsumer(topology.lookupd_http)
    discover_and_consume(topology, consumer)
    ports = {f"127.0.0.1:{nsqd.port('TCP')}" for nsqd in topology.nsqds}
    assert set(consumer.connected) == ports
