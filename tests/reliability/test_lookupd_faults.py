"""nsqlookupd killed (`kill -9`) and restarted under load (issue #10).

One nsqlookupd and two nsqd processes, started as harnesses start them (console scripts,
single-dash flags, port 0; every nsqd given `-lookupd-tcp-address` and
`-broadcast-address=127.0.0.1`). A publisher thread streams numbered messages to both nsqds
(PUB, alternating, RATE a second); consumers are pynsq 0.9.1 Readers, a real third-party client,
that find the nsqds only through nsqlookupd's HTTP `/lookup` (polled every second), each on its
own asyncio/tornado loop in a worker thread.

While the stream runs nsqlookupd is killed, kept dead for a number of published messages (and
until the consumer's own lookupd polls have failed), then started again on the same TCP and
HTTP ports. The tests then prove that the consumer kept its connections and received every
published message, that both nsqds register again by themselves (`/lookup` and `/nodes`), and
that a consumer started afterwards discovers both nsqds. Every wait polls with a deadline.
"""

import asyncio
import logging
import random
import socket
import struct
import threading
import time
from collections import Counter
from dataclasses import dataclass

import nsq
import pytest

from tests.harness import DaemonProcess, V2Connection, start_nsqd, start_nsqlookupd
from tests.support.http import get_json, post, request
from tests.support.polling import poll
from tests.support.ports import restartable_port

TOPIC = "faults"
RATE = 300  # messages published a second, in all, alternating between the two nsqds
OUTAGE_MESSAGES = 660  # nsqlookupd stays dead while this many are published (2.2 s at RATE)
LOOKUPD_POLL_FAILURES = 2  # ... and until the consumer's lookupd polls failed this often
# Generous: nsqd reconnects with a back-off of at most 5 s, and the machine is shared.
REGISTER_DEADLINE = 30.0
DELIVERY_DEADLINE = 60.0
CONSUMER_DEADLINE = 30.0
SEED = 10


def lookup_state(http_port: int) -> tuple[set[int], set[str], set[int]] | None:
    """(producers' tcp ports and channels of /lookup?topic=TOPIC, tcp ports of the /nodes
    hosting TOPIC); None while nsqlookupd does not answer or does not know the topic."""
    try:
        reply = request(http_port, "GET", f"/lookup?topic={TOPIC}")
        if reply.status != 200:
            return None
        nodes = get_json(http_port, "/nodes")["producers"]
    except OSError:
        return None
    document = reply.json()
    producers = {producer["tcp_port"] for producer in document["producers"]}
    hosting = {node["tcp_port"] for node in nodes if TOPIC in node["topics"]}
    return producers, set(document["channels"]), hosting


def producer_ports(http_port: int, topic: str) -> set[int] | None:
    reply = request(http_port, "GET", f"/lookup?topic={topic}")
    if reply.status != 200:
        return None
    return {producer["tcp_port"] for producer in reply.json()["producers"]}


def refuses_connections(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=5.0).close()
    except ConnectionRefusedError:
        return True
    return False


# -- the publisher ----------------------------------------------------------------------------


class Publisher:
    """A thread PUBlishing message n (body `n`) to nsqd n % 2, RATE a second, each one counted
    as published once nsqd answered OK."""

    def __init__(self, tcp_ports: list[int]) -> None:
        self.tcp_ports = tcp_ports
        self.published: list[int] = []
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="publisher", daemon=True)

    @property
    def count(self) -> int:
        return len(self.published)

    def __enter__(self) -> "Publisher":
        self._thread.start()
        return self

    def __exit__(self, exc_type, *exc_info) -> None:
        self.stop(check=exc_type is None)

    def stop(self, check: bool = True) -> None:
        self._stop.set()
        self._thread.join(30.0)
        assert not check or not self._thread.is_alive(), "the publisher did not stop"

    def _run(self) -> None:
        connections: list[V2Connection] = []
        try:
            connections.extend(V2Connection(port) for port in self.tcp_ports)
            start = time.monotonic()
            number = 0
            while not self._stop.is_set():
                body = str(number).encode()
                connection = connections[number % len(connections)]
                connection.send(f"PUB {TOPIC}\n".encode() + struct.pack(">I", len(body)) + body)
                reply = connection.read_response().data
                if reply != b"OK":
                    self.errors.append(f"PUB {number}: {reply!r}")
                    return
                self.published.append(number)
                number += 1
                # Pacing, not waiting for a condition: message n leaves at start + n / RATE.
                self._stop.wait(max(0.0, start + number / RATE - time.monotonic()))
        except Exception as error:  # reported by the test through `errors`
            self.errors.append(repr(error))
        finally:
            for connection in connections:
                connection.close()


# -- a pynsq consumer -------------------------------------------------------------------------


class RecordingReader(nsq.Reader):
    """pynsq's Reader, recording the nsqds it subscribed to and the connections it lost."""

    def __init__(self, consumer: "Consumer", **kwargs) -> None:
        self.consumer = consumer
        self.closing = False
        super().__init__(**kwargs)

    def _on_connection_ready(self, conn, **kwargs) -> None:
        super()._on_connection_ready(conn, **kwargs)
        if self.conns.get(conn.id) is conn:
            self.consumer.subscribed.add(conn.port)

    def _on_connection_close(self, conn, **kwargs) -> None:
        if not self.closing:
            self.consumer.closes.append(conn.id)
        super()._on_connection_close(conn, **kwargs)


class _PollFailures(logging.Handler):
    """Counts pynsq's "lookupd ... query error" warnings of one Reader (by its name)."""

    def __init__(self, reader_name: str) -> None:
        super().__init__(logging.WARNING)
        self.reader_name = reader_name
        self.count = 0

    def emit(self, record: logging.LogRecord) -> None:
        if "query error" in str(record.msg) and record.args and record.args[0] == self.reader_name:
            self.count += 1


class Consumer:
    """A pynsq Reader on `channel` that knows only nsqlookupd's HTTP address, in a worker
    thread on its own asyncio loop. `lookupd_failures` counts its failed lookupd polls, from
    pynsq's own warnings (connection refused while nsqlookupd is dead, 404 until the topic is
    registered again)."""

    def __init__(self, channel: str, lookupd_http_port: int) -> None:
        self.channel = channel
        self.lookupd_http_port = lookupd_http_port
        self.bodies: list[int] = []
        self.subscribed: set[int] = set()
        self.closes: list[str] = []
        self._poll_failures = _PollFailures(f"{TOPIC}:{channel}")  # pynsq's Reader name
        self._ready = threading.Event()
        self._failure: BaseException | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._thread = threading.Thread(target=self._run, name=channel, daemon=True)

    @property
    def lookupd_failures(self) -> int:
        return self._poll_failures.count

    def __enter__(self) -> "Consumer":
        logging.getLogger("nsq.reader").addHandler(self._poll_failures)
        self._thread.start()
        assert self._ready.wait(CONSUMER_DEADLINE), "the pynsq consumer did not start"
        return self

    def __exit__(self, exc_type, *exc_info) -> None:
        self.stop(check=exc_type is None)

    def stop(self, check: bool = True) -> None:
        """Close the Reader's connections and end its loop; `check=False` while a failure is
        being reported already."""
        if self._loop is not None and self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(CONSUMER_DEADLINE)
        logging.getLogger("nsq.reader").removeHandler(self._poll_failures)
        if not check:
            return
        assert not self._thread.is_alive(), "the pynsq consumer did not stop"
        assert self._failure is None, f"the pynsq consumer failed: {self._failure!r}"

    def _run(self) -> None:
        try:
            asyncio.run(self._main())
        except BaseException as error:
            self._failure = error
            self._ready.set()

    async def _main(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()

        def handle(message: nsq.Message) -> bool:
            self.bodies.append(int(message.body))
            return True  # FIN

        reader = RecordingReader(
            self,
            topic=TOPIC,
            channel=self.channel,
            message_handler=handle,
            lookupd_http_addresses=[f"http://127.0.0.1:{self.lookupd_http_port}"],
            lookupd_poll_interval=1,
            lookupd_poll_jitter=0.0,
            lookupd_connect_timeout=2,
            lookupd_request_timeout=5,
            max_in_flight=100,
        )
        self._ready.set()
        await self._stop.wait()
        reader.closing = True
        reader.close()
        await asyncio.sleep(0.05)  # let the closes reach the sockets before the loop ends

    def received_from(self, nsqd_index: int) -> int:
        return sum(1 for body in list(self.bodies) if body % 2 == nsqd_index)


# -- the cluster ------------------------------------------------------------------------------


@dataclass
class Cluster:
    lookupd: DaemonProcess
    nsqds: list[DaemonProcess]
    lookupd_tcp_port: int
    lookupd_http_port: int
    restarts: int = 0

    @property
    def nsqd_ports(self) -> set[int]:
        return {nsqd.port("TCP") for nsqd in self.nsqds}

    def kill_lookupd(self) -> None:
        assert self.lookupd.kill() == -9
        assert refuses_connections(self.lookupd_http_port)
        assert refuses_connections(self.lookupd_tcp_port)

    def restart_lookupd(self) -> None:
        """Start nsqlookupd again on the ports it had (SO_REUSEADDR), knowing nothing."""
        self.lookupd = start_nsqlookupd(
            tcp_port=self.lookupd_tcp_port, http_port=self.lookupd_http_port
        )
        assert self.lookupd.port("TCP") == self.lookupd_tcp_port
        assert self.lookupd.port("HTTP") == self.lookupd_http_port
        self.restarts += 1

    def wait_for_registration(self, channels: set[str]) -> None:
        """Both nsqds listed by /lookup?topic=TOPIC (with at least `channels`) and /nodes."""
        ports = self.nsqd_ports

        def registered_fully() -> bool:
            state = lookup_state(self.lookupd_http_port)
            return (
                state is not None
                and (state[0], state[2]) == (ports, ports)
                and (channels <= state[1])
            )

        poll(
            registered_fully,
            lambda: (
                f"both nsqds {sorted(ports)} with channels {sorted(channels)} in /lookup "
                f"and /nodes after {self.restarts} restart(s); lookupd has "
                f"{lookup_state(self.lookupd_http_port)}\n" + self.nsqd_lookup_logs()
            ),
            timeout=REGISTER_DEADLINE,
        )

    def nsqd_lookup_logs(self) -> str:
        lines = [line for nsqd in self.nsqds for line in nsqd.lines if "LOOKUPD" in line]
        return "\n".join(lines[-40:])


@pytest.fixture
def cluster(tmp_path):
    lookupd = start_nsqlookupd()
    tcp_port, http_port = lookupd.port("TCP"), lookupd.port("HTTP")
    nsqds: list[DaemonProcess] = []
    cluster = Cluster(lookupd, nsqds, tcp_port, http_port)
    try:
        for index in range(2):
            directory = tmp_path / f"nsqd{index}"
            directory.mkdir()
            nsqds.append(
                start_nsqd(
                    directory,
                    f"-lookupd-tcp-address=127.0.0.1:{tcp_port}",
                    "-broadcast-address=127.0.0.1",
                )
            )
        # The topic and the first consumer's channel exist on both nsqds before anything is
        # published, so the channel gets every message.
        for nsqd in nsqds:
            post(nsqd.port("HTTP"), f"/topic/create?topic={TOPIC}")
            post(nsqd.port("HTTP"), f"/channel/create?topic={TOPIC}&channel=steady")
        cluster.wait_for_registration({"steady"})
        yield cluster
    finally:
        for daemon in [*nsqds, cluster.lookupd]:
            daemon.kill()


def assert_received_everything(consumer: Consumer, publisher: Publisher, context: str) -> None:
    """Every published message reached the consumer, exactly once (nothing failed between
    them: no connection was lost and no message timed out), and nothing else did."""
    published = set(publisher.published)
    poll(
        lambda: published <= set(consumer.bodies),
        lambda: (
            f"{len(published - set(consumer.bodies))} of {len(published)} published "
            f"messages to reach the consumer ({context}), e.g. "
            f"{sorted(published - set(consumer.bodies))[:10]}"
        ),
        timeout=DELIVERY_DEADLINE,
    )
    received = Counter(consumer.bodies)
    assert set(received) == published, f"never published: {sorted(set(received) - published)}"
    duplicates = {body: count for body, count in received.items() if count > 1}
    assert duplicates == {}, f"delivered more than once ({context}): {list(duplicates)[:10]}"


def assert_new_consumer_discovers_both(cluster: Cluster, publisher: Publisher) -> None:
    """A Reader started now finds both nsqds through the restarted lookupd and gets messages
    from each (its channel is new: it sees only what is published after it subscribed)."""
    with Consumer("late", cluster.lookupd_http_port) as late:
        poll(
            lambda: late.subscribed == cluster.nsqd_ports,
            lambda: f"the new consumer to subscribe to both nsqds, has {late.subscribed}",
            timeout=CONSUMER_DEADLINE,
        )
        poll(
            lambda: late.received_from(0) >= 10 and late.received_from(1) >= 10,
            lambda: (
                f"the new consumer to receive from both nsqds: "
                f"{late.received_from(0)} and {late.received_from(1)}"
            ),
            timeout=CONSUMER_DEADLINE,
        )
        assert publisher.errors == []
    assert late.closes == []


def test_lookupd_killed_and_restarted_under_load(cluster):
    """kill -9 under a steady stream; dead for OUTAGE_MESSAGES; restarted on its ports. The
    consumer consumes through the outage and gets every message once, keeping its two
    connections; both nsqds register again, including what was made during the outage; a
    new consumer finds both."""
    with Publisher(sorted(cluster.nsqd_ports)) as publisher:
        with Consumer("steady", cluster.lookupd_http_port) as consumer:
            poll(
                lambda: consumer.subscribed == cluster.nsqd_ports,
                lambda: f"the consumer to find both nsqds, has {consumer.subscribed}",
                timeout=CONSUMER_DEADLINE,
            )
            poll(
                lambda: consumer.received_from(0) and consumer.received_from(1),
                "the consumer to receive from both nsqds",
                timeout=CONSUMER_DEADLINE,
            )

            cluster.kill_lookupd()
            killed_at = publisher.count
            failures_before = consumer.lookupd_failures
            # Made while nsqlookupd is dead: nsqd can tell nobody now, it must tell the new one.
            first, second = cluster.nsqds
            post(second.port("HTTP"), f"/channel/create?topic={TOPIC}&channel=outage")
            post(first.port("HTTP"), "/topic/create?topic=outage_topic")
            # Dead while OUTAGE_MESSAGES are published and until the consumer's own lookupd
            # polls have failed; messages published during the outage are consumed in it.
            poll(
                lambda: (
                    publisher.count >= killed_at + OUTAGE_MESSAGES
                    and consumer.lookupd_failures >= failures_before + LOOKUPD_POLL_FAILURES
                ),
                lambda: (
                    f"{OUTAGE_MESSAGES} messages published and {LOOKUPD_POLL_FAILURES} "
                    f"failed lookupd polls: {publisher.count - killed_at} and "
                    f"{consumer.lookupd_failures - failures_before}; {publisher.errors}"
                ),
                timeout=DELIVERY_DEADLINE,
            )
            during_outage = set(range(killed_at, killed_at + OUTAGE_MESSAGES))
            poll(
                lambda: during_outage <= set(consumer.bodies),
                "the messages published during the outage to be consumed during it",
                timeout=DELIVERY_DEADLINE,
            )
            assert refuses_connections(cluster.lookupd_http_port)

            cluster.restart_lookupd()
            cluster.wait_for_registration({"steady", "outage"})
            poll(
                lambda: (
                    producer_ports(cluster.lookupd_http_port, "outage_topic") == {first.port("TCP")}
                ),
                "the topic made during the outage in /lookup",
                timeout=REGISTER_DEADLINE,
            )
            assert_new_consumer_discovers_both(cluster, publisher)
            cluster.wait_for_registration({"steady", "late"})

            publisher.stop()
            assert publisher.errors == []
            assert publisher.count > killed_at + OUTAGE_MESSAGES
            assert_received_everything(consumer, publisher, "one restart")
            # The consumer never lost a connection: it kept consuming from the nsqds it knew.
            assert consumer.closes == []
            assert consumer.subscribed == cluster.nsqd_ports


@pytest.mark.parametrize(
    "cycles", [5, pytest.param(40, marks=pytest.mark.slow, id="soak-40")], ids=str
)
def test_lookupd_restarted_again_and_again(cluster, cycles):
    """Seeded cycles: dead for a random number of messages, then restarted on the same ports;
    either killed again soon (before or while the nsqds register again) or left up until
    both are registered. After the last cycle everything is registered and discovered."""
    rng = random.Random(SEED + cycles)
    with Publisher(sorted(cluster.nsqd_ports)) as publisher:
        with Consumer("steady", cluster.lookupd_http_port) as consumer:
            poll(
                lambda: consumer.subscribed == cluster.nsqd_ports,
                lambda: f"the consumer to find both nsqds, has {consumer.subscribed}",
                timeout=CONSUMER_DEADLINE,
            )
            plan = []
            for cycle in range(cycles):
                dead = rng.randint(30, 240)
                hurry = cycle < cycles - 1 and rng.random() < 0.4
                alive = rng.randint(0, 60) if hurry else rng.randint(0, 90)
                plan.append((dead, hurry, alive))
                cluster.kill_lookupd()
                mark = publisher.count
                poll(
                    lambda mark=mark, dead=dead: publisher.count >= mark + dead,
                    lambda: f"publishing while lookupd is dead: {publisher.errors}",
                    timeout=DELIVERY_DEADLINE,
                )
                cluster.restart_lookupd()
                if not hurry:
                    cluster.wait_for_registration({"steady"})
                mark = publisher.count
                poll(
                    lambda mark=mark, alive=alive: publisher.count >= mark + alive,
                    lambda: f"publishing while lookupd is up: {publisher.errors}",
                    timeout=DELIVERY_DEADLINE,
                )

            cluster.wait_for_registration({"steady"})
            assert_new_consumer_discovers_both(cluster, publisher)
            publisher.stop()
            assert publisher.errors == []
            context = f"seed {SEED + cycles}, plan (dead, hurry, alive) {plan}"
            assert_received_everything(consumer, publisher, context)
            assert consumer.closes == [], context
            assert consumer.subscribed == cluster.nsqd_ports


class SilentLookupd:
    """A TCP server that accepts and reads everything but never answers: an nsqlookupd that
    hangs. Nothing else in nsqd may wait for it."""

    def __init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.accepted = threading.Event()
        self._connections: list[socket.socket] = []
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                connection, _ = self.listener.accept()
            except OSError:
                return
            self._connections.append(connection)
            self.accepted.set()
            threading.Thread(target=self._drain, args=(connection,), daemon=True).start()

    @staticmethod
    def _drain(connection: socket.socket) -> None:
        try:
            while connection.recv(65536):
                pass
        except OSError:
            pass

    def close(self) -> None:
        self.listener.close()
        for connection in self._connections:
            connection.close()


def test_unreachable_lookupd_at_startup_does_not_block_nsqd(tmp_path):
    """nsqd is given one nsqlookupd that is not running yet (connection refused) and one that
    accepts but never answers. It serves PUB and SUB at once, and registers with the first
    as soon as it is started, whatever the silent one does."""
    # The ports of a lookupd that starts later: outside the kernel's ephemeral range, where
    # a connection of another test could take one meanwhile (one did).
    tcp_port, http_port = restartable_port(), restartable_port()
    silent = SilentLookupd()
    nsqd = lookupd = None
    try:
        nsqd = start_nsqd(
            tmp_path,
            f"-lookupd-tcp-address=127.0.0.1:{tcp_port}",
            f"-lookupd-tcp-address=127.0.0.1:{silent.port}",
            "-broadcast-address=127.0.0.1",
        )
        # Serving at once: HTTP, PUB and SUB.
        assert request(nsqd.port("HTTP"), "GET", "/ping").body == b"OK"
        subscriber = V2Connection(nsqd.port("TCP"))
        publisher = V2Connection(nsqd.port("TCP"))
        try:
            subscriber.send(f"SUB {TOPIC} steady\n".encode())
            assert subscriber.read_response().data == b"OK"
            subscriber.send(b"RDY 10\n")
            for number in range(5):
                body = str(number).encode()
                publisher.send(f"PUB {TOPIC}\n".encode() + struct.pack(">I", len(body)) + body)
                assert publisher.read_response().data == b"OK"
            bodies = [message.body for message in subscriber.read_messages(5)]
            assert bodies == [str(number).encode() for number in range(5)]
        finally:
            subscriber.close()
            publisher.close()

        # Meanwhile nsqd was refused by one lookupd and connected to the silent one.
        nsqd.wait_for_log(rf"LOOKUPD\(127\.0\.0\.1:{tcp_port}\): error")
        assert silent.accepted.wait(20.0), "nsqd never connected to the silent lookupd"
        assert request(nsqd.port("HTTP"), "GET", "/ping").body == b"OK"

        # The lookupd appears: nsqd registers its topic and channel there by itself.
        lookupd = start_nsqlookupd(tcp_port=tcp_port, http_port=http_port)
        cluster = Cluster(lookupd, [nsqd], tcp_port, http_port)
        cluster.wait_for_registration({"steady"})
        nodes = get_json(http_port, "/nodes")["producers"]
        assert [node["tcp_port"] for node in nodes] == [nsqd.port("TCP")]
        assert request(nsqd.port("HTTP"), "GET", "/ping").body == b"OK"
    finally:
        for daemon in (nsqd, lookupd):
            if daemon is not None:
                daemon.kill()
        silent.close()
