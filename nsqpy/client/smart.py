"""A smart client for partitioned topics: it finds each partition's leader through every
nsqlookupd and follows it when it moves, as Youzan's smart client does (docs/client.md).

* `LookupdDiscovery` learns every nsqlookupd from `/listlookup` and merges what they all answer
  to `/lookup?topic=T&access=r|w&metainfo=true` into a `TopicLayout` (docs/protocol.md §5.3,
  §5.4).
* `SmartProducer` publishes to a writable partition (`PUB <topic> <partition>`, §3.3):
  round-robin, or by a stable hash of a key (ordered topics); when a leader moves, writes are
  refused or a connection breaks, it drops the connection, looks up again and retries.
* `SmartConsumer` subscribes to every readable partition (`SUB <topic> <channel> <partition>`,
  `SUB_ORDERED` for ordered topics), spreads its RDY over them, and reconnects with backoff
  and a new lookup when a connection closes.

Blocking sockets and threads like `nsqpy.client.blocking`, whose connection it reuses, so the tools,
plain threads and Spark executors can use it.
"""

import json
import logging
import select
import socket
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from functools import partial
from typing import cast

import outcome

from nsqpy.client.blocking import Connection, NSQError, http_request
from nsqpy.client.core import (
    RETRYABLE_ERRORS,
    DeliveredMessage,
    Delivery,
    Key,
    ProducerSequences,
    PublishRouter,
    PublishRun,
    SubscriptionReader,
    Target,
    consumer_identify,
    consumer_plan,
    partition_for_key,
    ready_counts,
    targets_of,
)
from nsqpy.client.discovery import (
    HTTP_HEADERS,
    LookupdDirectory,
    LookupdGet,
    LookupUnavailable,
    Round,
    SmartClientError,
    TopicLayout,
    advance,
    merge_lookups,
    read_lookupd_answer,
)
from nsqpy.client.security import Security
from nsqpy.common.command import (
    encode_command,
    encode_fin,
    encode_rdy,
    encode_req,
    encode_touch,
)
from nsqpy.common.frame import FRAME_TYPE_ERROR, FRAME_TYPE_MESSAGE

__all__ = [
    "ConsumerStats",
    "LookupUnavailable",
    "LookupdDiscovery",
    "ProducerStats",
    "PublishFailed",
    "Published",
    "SmartClientError",
    "SmartConsumer",
    "SmartMessage",
    "SmartProducer",
    "TopicLayout",
    "lookupd_json",
    "merge_lookups",
    "partition_for_key",
]

log = logging.getLogger("nsqpy.smart_client")


class PublishFailed(SmartClientError):
    """A publish kept failing with retryable errors until the producer's deadline."""

    def __init__(
        self, topic: str, last_error: BaseException, attempts: int, elapsed: float
    ) -> None:
        super().__init__(
            f"publishing to topic {topic!r} failed: {attempts} attempt(s) in {elapsed:.2f}s,"
            f" last error: {last_error}"
        )
        self.topic = topic
        self.last_error = last_error
        self.attempts = attempts


# -- discovery --------------------------------------------------------------------------------


class LookupdDiscovery(LookupdDirectory):
    """`LookupdDirectory` (nsqpy/client/discovery.py) asking its questions with urllib:
    blocking and thread-safe."""

    def discover_lookupds(self) -> list[str]:
        """Ask every known lookupd for `/listlookup` and learn the lookupds they list; returns
        every lookupd known. When none answers, the list is kept as it was."""
        return self._run(self.discover_round())

    def lookup(self, topic: str, access: str = "r") -> TopicLayout:
        """`/lookup?topic=&access=&metainfo=true` on every lookupd, merged (`merge_lookups`).
        LookupUnavailable when none answers."""
        return self._run(self.lookup_round(topic, access))

    def lookup_answers(self, topic: str, access: str = "r") -> list[tuple[str, dict | None]]:
        """Every lookupd's `/lookup` answer that could be read, as `(url, document)` pairs.
        LookupUnavailable when none answers."""
        return self._run(self.lookup_answers_round(topic, access))

    def replicas(self, topic: str) -> dict[int, list[str]]:
        """The HTTP addresses of each partition's in-sync replicas, from the first lookupd that
        answers `/cluster/stats` (docs/protocol.md §5.6); empty outside a cluster."""
        return self._run(self.replicas_round(topic))

    def _run(self, round: Round):
        step = advance(round, outcome.Value(None))
        while isinstance(step, LookupdGet):
            step = advance(round, outcome.capture(self._get, step))
        return step.value

    def _get(self, request: LookupdGet) -> dict | None:
        return lookupd_json(request.url, request.path, request.params, self.http_timeout)


def lookupd_json(url: str, path: str, params: dict[str, str], timeout: float) -> dict | None:
    """An nsqlookupd's v1 JSON answer to a GET; None for a 404 (`TOPIC_NOT_FOUND`, or no
    writable partition yet) and for an empty body (a standalone Youzan lookupd's
    `/listlookup`)."""
    query = urllib.parse.urlencode(params)
    request = urllib.request.Request(
        f"{url}{path}" + (f"?{query}" if query else ""), headers=HTTP_HEADERS
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return read_lookupd_answer(url, response.status, response.read())
    except urllib.error.HTTPError as error:
        if error.code == 404:
            return None
        raise


def _closed_by_peer(connection: Connection) -> bool:
    """Whether nsqd closed this idle connection (a producer's gets nothing unasked)."""
    sock = connection.sock
    readable, _, _ = select.select([sock], [], [], 0)
    if not readable:
        return False
    try:
        # The raw socket's bytes, below TLS (an SSLSocket refuses flags): a peek at whether
        # the TCP connection ended.
        return socket.socket.recv(sock, 1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
    except BlockingIOError:
        return False
    except OSError:
        return True


def _read_reply(connection: Connection, timeout: float) -> bytes:
    """The next response frame's data within `timeout` (heartbeats answered on the way);
    NSQError for an error frame, TimeoutError when nsqd does not answer."""
    deadline = time.monotonic() + timeout
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError(f"nsqd {connection.address} did not answer within {timeout:g}s")
        frame = connection.read_frame(timeout=remaining)
        if frame is None or frame.frame_type == FRAME_TYPE_MESSAGE:
            continue
        if frame.frame_type == FRAME_TYPE_ERROR:
            raise NSQError(frame.data.decode("utf-8", "replace"))
        return frame.data


# -- producer ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Published:
    """Where a publish went: the partition (None on a classic nsqd), the nsqd, and how many
    times the command was sent (more than 1 after retries)."""

    topic: str
    partition: int | None
    address: str
    attempts: int


@dataclass(frozen=True)
class ProducerStats:
    """What a producer did. `retries` counts commands sent again after a retryable failure,
    `lookups` lookup rounds, `connections` TCP connections opened."""

    publishes: int
    messages: int
    retries: int
    lookups: int
    connections: int


class _NodeLink:
    """The producer's one connection to an nsqd; one command and its reply at a time."""

    def __init__(self, address: str) -> None:
        self.address = address
        self.lock = threading.Lock()
        self.connection: Connection | None = None


class SmartProducer:
    """Publishes to partitioned topics found through nsqlookupd, following their leaders.

    Thread-safe: `publish` and `multi_publish` may be called from many threads (each nsqd
    connection carries one command at a time). A publish that fails with
    E_FAILED_ON_NOT_LEADER, E_FAILED_ON_NOT_WRITABLE, E_TOPIC_NOT_EXIST or a broken connection
    drops that connection, looks the topic up again and is retried, first at once on another
    partition, then after a pause that doubles from `backoff_initial` to `backoff_max`, until
    `publish_timeout` seconds have passed (then PublishFailed). A keyed (or explicitly
    partitioned) publish is only ever retried on its own partition, at its new leader. Any
    other refusal is raised at once as NSQError.

    Idempotent (the default, `idempotent=True`): to a log topic's partition on an nsqd that
    serves it, a publish goes as PUB_SEQ/MPUB_SEQ (docs/protocol.md §3.10) with this
    producer's ID and the partition's next sequences, and every retry of it goes to the same
    partition with the same sequences: a retry after an answer lost in a leader failover is
    acknowledged without being stored twice. A publish that fails for good, or a partition
    that no longer knows the producer (E_SEQUENCE_GAP), moves that partition to a new
    producer ID from sequence 0. Elsewhere (classic topics, Youzan's Go nsqd), and with
    `idempotent=False`, a retry after a broken connection may duplicate a message nsqd had
    stored but could not acknowledge.

    Lookups are kept `lookup_interval` seconds, or `backoff_max` while they lack some of the
    topic's partitions. A partition that refused a publish is avoided by round-robin for
    `partition_cooldown` seconds, or until a lookup shows it at another leader (nsqlookupd
    may still list it at the same one: nsqd's `/disable/write` is not reported to it).
    """

    def __init__(
        self,
        lookupd_http_addresses: str | Iterable[str],
        *,
        lookup_interval: float = 60.0,
        publish_timeout: float = 10.0,
        backoff_initial: float = 0.05,
        backoff_max: float = 1.0,
        partition_cooldown: float = 5.0,
        timeout: float = 5.0,
        http_timeout: float = 2.0,
        identify: dict | None = None,
        idempotent: bool = True,
        producer_id: str | None = None,
        security: Security | None = None,
    ) -> None:
        self.security = security
        self.discovery = LookupdDiscovery(
            lookupd_http_addresses, http_timeout=http_timeout, rediscover_interval=lookup_interval
        )
        self.idempotent = idempotent
        # The ID each partition's sequences start under; a partition that must start again
        # gets `<producer_id>-<n>` (`ProducerSequences.restart`).
        self._sequences = ProducerSequences(producer_id, idempotent=idempotent)
        self.producer_id = self._sequences.producer_id
        self.lookup_interval = lookup_interval
        self.publish_timeout = publish_timeout
        self.backoff_initial = backoff_initial
        self.backoff_max = backoff_max
        self.partition_cooldown = partition_cooldown
        self.timeout = timeout
        # No heartbeats: a producer reads only after a command, and nsqd would close a
        # connection left idle for two heartbeat intervals.
        self._identify = self._sequences.identify({"heartbeat_interval": -1, **(identify or {})})
        self._lock = threading.Lock()
        # Where to publish (`nsqpy.client.core`), under `_lock`.
        self._router = PublishRouter(
            lookup_interval=lookup_interval,
            backoff_max=backoff_max,
            partition_cooldown=partition_cooldown,
        )
        self._links: dict[str, _NodeLink] = {}
        self._publishes = self._messages = self._retries = self._connections = 0
        self._closed = False

    def publish(
        self, topic: str, body: bytes, *, key: Key | None = None, partition: int | None = None
    ) -> Published:
        """Publish one message and wait for nsqd's OK. An ordered topic needs `key` (same key,
        same partition, while the partition count stays) or `partition`."""
        return self._publish(topic, [body], key, partition)

    def multi_publish(
        self,
        topic: str,
        bodies: Iterable[bytes],
        *,
        key: Key | None = None,
        partition: int | None = None,
        ext_headers: Iterable[dict | bytes] | None = None,
    ) -> Published:
        """Publish several messages to one partition in one MPUB, atomically. `ext_headers`:
        each message's JSON header, for an ext topic (MPUB_EXT, MPUB_EXT_SEQ when
        idempotent)."""
        bodies = list(bodies)
        if not bodies:
            raise ValueError("multi_publish needs at least one message")
        headers = None
        if ext_headers is not None:
            headers = [
                h if isinstance(h, bytes) else json.dumps(h, separators=(",", ":")).encode()
                for h in ext_headers
            ]
            if len(headers) != len(bodies):
                raise ValueError(f"{len(headers)} ext headers for {len(bodies)} messages")
        return self._publish(topic, bodies, key, partition, headers)

    def refresh(self, topic: str) -> TopicLayout:
        """Look `topic` up now (writable partitions)."""
        return self._layout(topic, refresh=True)

    def stats(self) -> ProducerStats:
        with self._lock:
            return ProducerStats(
                self._publishes,
                self._messages,
                self._retries,
                self.discovery.lookups,
                self._connections,
            )

    def close(self) -> None:
        """Close every connection; idempotent."""
        with self._lock:
            self._closed = True
            links = list(self._links.values())
            self._links.clear()
        for link in links:
            with link.lock:
                if link.connection is not None:
                    link.connection.close()
                    link.connection = None

    def __enter__(self) -> "SmartProducer":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _publish(
        self,
        topic: str,
        bodies: list[bytes],
        key: Key | None,
        partition: int | None,
        ext_headers: list[bytes] | None = None,
    ) -> Published:
        run = PublishRun(
            self._router,
            self._sequences,
            topic,
            bodies,
            key,
            partition,
            time.monotonic(),
            self.publish_timeout,
            (self.backoff_initial, self.backoff_max),
            ext_headers,
        )

        def command(connection: Connection, partition: int | None) -> bytes:
            return run.command(partition, connection.identify_reply)

        def give_up() -> PublishFailed:
            self._count_retries(run.attempts.attempts)
            return PublishFailed(*run.failure(time.monotonic()))

        while True:
            refresh = run.take_refresh()
            try:
                layout: TopicLayout | None = self._layout(topic, refresh)
            except LookupUnavailable as error:
                run.lookup_failed(error)
                layout = None
            with self._lock:
                step = run.next(layout, time.monotonic())
            if step is None:
                raise give_up()
            if not isinstance(step, Target):
                time.sleep(step)
                continue
            target = step
            try:
                self._send(target.address, partial(command, partition=target.partition))
            except NSQError as error:
                with self._lock:
                    decision = run.answered_with_error(error, target, time.monotonic())
                if decision == "resend":
                    continue
                if decision == "raise":
                    self._count_retries(run.attempts.attempts)
                    raise
                failure: BaseException = error
                going_on = decision == "retry"
            except OSError as error:
                failure = error
                with self._lock:
                    going_on = run.answer_lost(error, target, time.monotonic())
            else:
                with self._lock:
                    self._publishes += 1
                    self._messages += len(bodies)
                    self._retries += run.attempts.attempts - 1
                return Published(topic, target.partition, target.address, run.attempts.attempts)
            log.info(
                "publish to %s partition %s at %s failed (%s); looking up again",
                topic,
                target.partition,
                target.address,
                failure,
            )
            if not going_on:
                raise give_up()

    def _count_retries(self, attempts: int) -> None:
        with self._lock:
            self._retries += max(attempts - 1, 0)

    def _layout(self, topic: str, refresh: bool) -> TopicLayout:
        """The topic's writable partitions: the router's while fresh, looked up when asked
        to or when old; the last one when no lookupd answers."""
        with self._lock:
            fresh = None if refresh else self._router.cached(topic, time.monotonic())
            last = self._router.last(topic)
        if fresh is not None:
            return cast(TopicLayout, fresh)
        try:
            layout = self.discovery.lookup(topic, "w")
        except LookupUnavailable:
            if last is None:
                raise
            log.warning("no nsqlookupd answered for %s; using its last lookup", topic)
            return cast(TopicLayout, last)
        with self._lock:
            return cast(TopicLayout, self._router.looked_up(topic, layout, time.monotonic()))

    def _send(self, address: str, command: Callable[[Connection], bytes]) -> None:
        with self._lock:
            if self._closed:
                raise SmartClientError("the producer is closed")
            link = self._links.setdefault(address, _NodeLink(address))
        with link.lock:
            try:
                if link.connection is not None and _closed_by_peer(link.connection):
                    # nsqd went away since the last publish: nothing is sent on the dead
                    # connection (whether it stored that could not be told afterwards).
                    link.connection.close()
                    link.connection = None
                if link.connection is None:
                    link.connection = Connection(
                        address,
                        timeout=self.timeout,
                        identify=self._identify,
                        security=self.security,
                    )
                    with self._lock:
                        self._connections += 1
                # Made here, under the link's lock: sequences go out in the order they
                # were claimed on this connection.
                link.connection.send(command(link.connection))
                _read_reply(link.connection, self.timeout)
            except (OSError, NSQError, ValueError):
                # Whatever the error, the connection's state is unknown (or nsqd closes it):
                # the next publish opens a new one.
                if link.connection is not None:
                    link.connection.close()
                    link.connection = None
                raise


# -- consumer ---------------------------------------------------------------------------------


@dataclass(eq=False)
class SmartMessage(DeliveredMessage):
    """A delivered message (`DeliveredMessage`), answered on the connection it came from."""

    _subscription: "_Subscription | None" = field(default=None, repr=False)
    _consumer: "SmartConsumer | None" = field(default=None, repr=False)

    def finish(self) -> bool:
        """FIN; False when its connection is gone (nsqd then delivers the message again)."""
        return self._answer(encode_fin(self.id), "finished")

    def requeue(self, delay_ms: int = 0) -> bool:
        """REQ with a delay (ignored for SUB_ORDERED unless 0: docs/protocol.md §3.5)."""
        return self._answer(encode_req(self.id, delay_ms), "requeued")

    def touch(self) -> bool:
        """TOUCH: reset its in-flight timeout."""
        if self._subscription is None:
            return False
        return self._subscription.send(encode_touch(self.id))

    def _answer(self, data: bytes, counter: str) -> bool:
        if self.responded or self._subscription is None:
            return False
        self.responded = True
        sent = self._subscription.send(data)
        if sent and self._consumer is not None:
            self._consumer._count(counter)
        return sent


@dataclass(frozen=True)
class ConsumerStats:
    """What a consumer did: messages received, finished and requeued; subscriptions made
    and lost; lookup rounds."""

    messages: int
    finished: int
    requeued: int
    connections: int
    disconnections: int
    lookups: int


class _Subscription:
    """One connection subscribed to one partition, and the thread that reads it."""

    def __init__(
        self, target: Target, connection: Connection, *, detail: bool, extend: bool
    ) -> None:
        self.target = target
        self.partition = target.partition
        self.address = connection.address
        self.connection = connection
        # Its frames to messages (the ordered detail, the ext header split off) and errors.
        self.reader = SubscriptionReader(detail=detail, extend=extend)
        # An RDY above the server's max_rdy_count is a fatal error.
        self.max_rdy = int(connection.identify_reply.get("max_rdy_count", 2500))
        self.rdy = 0
        # Closed on purpose (a moved leader, close()): not a failure to back off from.
        self.retired = False
        self.closed = False
        self.thread: threading.Thread | None = None

    def send(self, data: bytes) -> bool:
        if self.closed:
            return False
        try:
            self.connection.send(data)
        except OSError:
            return False
        return True

    def close(self) -> None:
        self.closed = True
        try:
            # Wakes the reading thread out of recv, which close() alone would not.
            self.connection.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.connection.close()


class SmartConsumer:
    """Consumes `channel` of every partition of `topic`, found through nsqlookupd.

    One connection per partition (`SUB <topic> <channel> <partition>`, or `SUB_ORDERED` when
    `ordered` is true; None follows the topic's meta, and switches to SUB_ORDERED if nsqd
    answers E_SUB_ORDER_IS_MUST). `max_in_flight` is spread as RDY over the connections, at
    least 1 each. A connection that closes or gets an error is reopened after a backoff
    (`backoff_initial` doubling to `backoff_max`) and a new lookup, at the partition's
    current leader; new partitions are picked up by the lookups made every `lookup_interval`
    seconds (or `refresh()`). A subscription refused for a reason a lookup cannot fix
    (E_BAD_TOPIC, E_SUB_ORDER_IS_MUST with `ordered=False`, ...) stops the consumer: its
    `receive` and `wait` raise the NSQError.

    Messages are taken with `receive`, `receive_many` or iteration, or, with `handler`, given
    to it on a thread of the consumer's: a handler that returns FINishes the message (unless
    it answered it), one that raises requeues it after `requeue_delay_ms`. Thread-safe:
    `receive` and the messages' `finish`/`requeue`/`touch` may be called from any thread.
    Messages of a connection that closed are dropped from the queue (nsqd delivers them
    again). `close()` closes every connection; nsqd requeues what was not finished.
    """

    def __init__(
        self,
        lookupd_http_addresses: str | Iterable[str],
        topic: str,
        channel: str,
        handler: Callable[[SmartMessage], None] | None = None,
        *,
        max_in_flight: int = 1,
        ordered: bool | None = None,
        lookup_interval: float = 60.0,
        backoff_initial: float = 0.1,
        backoff_max: float = 5.0,
        requeue_delay_ms: int = 1000,
        timeout: float = 5.0,
        http_timeout: float = 2.0,
        identify: dict | None = None,
        security: Security | None = None,
        desired_tag: str = "",
        start_from: str | dict[int, str] | None = None,
    ) -> None:
        if max_in_flight < 1:
            raise ValueError("max_in_flight must be at least 1")
        self.security = security
        self.topic = topic
        self.channel = channel
        self.max_in_flight = max_in_flight
        self.requeue_delay_ms = requeue_delay_ms
        self.timeout = timeout
        self.discovery = LookupdDiscovery(
            lookupd_http_addresses, http_timeout=http_timeout, rediscover_interval=lookup_interval
        )
        self._handler = handler
        self._lock = threading.Lock()
        self._rdy_lock = threading.Lock()
        # What to be subscribed to and when (`nsqpy.client.core`), under `_lock`.
        self._identify = consumer_identify(identify, desired_tag)
        self._plan = consumer_plan(
            start_from, lookup_interval, backoff_initial, backoff_max, ordered
        )
        self._subscriptions: dict[int | str, _Subscription] = {}
        self._messages: deque[SmartMessage] = deque()
        self._ready = threading.Condition()
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._error: BaseException | None = None
        self._counts = dict.fromkeys(
            ("messages", "finished", "requeued", "connections", "disconnections"), 0
        )
        self._threads: list[threading.Thread] = []
        # The first lookup here: nsqlookupd addresses that all fail are a configuration error
        # to report now; later, the consumer outlives nsqlookupd outages.
        self._apply(self.discovery.lookup(topic, "r"))
        self._start(self._supervise, f"smart-consumer {topic}/{channel}")
        if handler is not None:
            self._start(self._dispatch, f"smart-consumer handler {topic}/{channel}")

    # -- the public side --

    def receive(self, timeout: float | None = None) -> SmartMessage | None:
        """The next message, or None if none came within `timeout` seconds (None: wait) or
        the consumer was closed. Raises the error that stopped the consumer."""
        if self._handler is not None:
            raise RuntimeError("this consumer gives its messages to its handler")
        return self._take(timeout)

    def receive_many(
        self, count: int, timeout: float, *, finish: bool = False
    ) -> list[SmartMessage]:
        """Up to `count` messages, as many as came within `timeout` seconds; FINished on the
        way when `finish` is true."""
        deadline = time.monotonic() + timeout
        messages: list[SmartMessage] = []
        while len(messages) < count:
            message = self.receive(max(0.0, deadline - time.monotonic()))
            if message is None:
                break
            if finish:
                message.finish()
            messages.append(message)
        return messages

    def __iter__(self) -> Iterator[SmartMessage]:
        """Messages until the consumer is closed."""
        while True:
            message = self.receive()
            if message is None:
                return
            yield message

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the consumer stops (closed, or stopped by an error, which is raised);
        False if it still runs after `timeout` seconds."""
        stopped = self._stopping.wait(timeout)
        if self._error is not None:
            raise self._error
        return stopped

    def refresh(self) -> None:
        """Look the topic up again now (in the background), and connect what is new."""
        with self._lock:
            self._plan.request_lookup()
        self._wake.set()

    def empty_delayed(self) -> list[str]:
        """Drop the channel's messages in its log topic's delay queues, on every partition's
        leader (nsqd's `/channel/emptydelayed`); the failures, one line each."""
        return self._channel_action("emptydelayed")

    def requeue_delayed(self) -> list[str]:
        """Deliver the channel's delayed messages now, on every partition's leader (nsqd's
        `/channel/requeuedelayed`); the failures, one line each."""
        return self._channel_action("requeuedelayed")

    def _channel_action(self, action: str) -> list[str]:
        layout = self.discovery.lookup(self.topic, "r")
        targets: list[tuple[str, str | None]] = [
            (address, str(partition)) for partition, address in layout.http_addresses.items()
        ]
        targets += [(address, None) for address in layout.classic_http_nodes]
        if not targets:
            return [f"{self.topic}: no nsqd found for its channel {self.channel}"]
        failures = []
        for address, partition in targets:
            try:
                http_request(
                    address,
                    f"/channel/{action}",
                    method="POST",
                    security=self.security,
                    timeout=self.discovery.http_timeout,
                    topic=self.topic,
                    channel=self.channel,
                    partition=partition,
                )
            except urllib.error.HTTPError as error:
                failures.append(f"{address}: {error.code} {error.read().decode(errors='replace')}")
            except OSError as error:
                failures.append(f"{address}: {error}")
        return failures

    def connected_partitions(self) -> dict[int | str, str]:
        """Partition (or, on a classic nsqd, its address) -> the nsqd subscribed to now."""
        with self._lock:
            return {
                slot: subscription.address for slot, subscription in self._subscriptions.items()
            }

    @property
    def error(self) -> BaseException | None:
        """The error that stopped the consumer, if one did."""
        return self._error

    def stats(self) -> ConsumerStats:
        with self._lock:
            counts = dict(self._counts)
        return ConsumerStats(**counts, lookups=self.discovery.lookups)

    def close(self, timeout: float = 5.0) -> None:
        """Close every connection and stop the consumer's threads; idempotent."""
        self._stop()
        deadline = time.monotonic() + timeout
        with self._lock:
            threads = list(self._threads)
        for thread in threads:
            if thread is not threading.current_thread():
                thread.join(max(0.0, deadline - time.monotonic()))

    def __enter__(self) -> "SmartConsumer":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- threads --

    def _start(self, target: Callable, name: str, *args: object) -> threading.Thread:
        # Daemon threads: a program that forgets close() still exits.
        thread = threading.Thread(target=target, args=args, name=name, daemon=True)
        with self._lock:
            self._threads = [t for t in self._threads if t.is_alive()] + [thread]
        thread.start()
        return thread

    def _stop(self, error: BaseException | None = None) -> None:
        with self._lock:
            if error is not None and self._error is None:
                self._error = error
            subscriptions = list(self._subscriptions.values())
        self._stopping.set()
        self._wake.set()
        for subscription in subscriptions:
            subscription.retired = True
            subscription.close()
        with self._ready:
            self._messages.clear()
            self._ready.notify_all()

    def _supervise(self) -> None:
        try:
            self._supervise_until_stopped()
        except Exception as error:  # a consumer that cannot go on says why, it does not hang
            log.exception("the consumer of %s/%s failed", self.topic, self.channel)
            self._stop(error)

    def _supervise_until_stopped(self) -> None:
        """Look up when the plan says so, subscribe to what is due, sleep until the next
        thing is due (or something woke the supervisor)."""
        while not self._stopping.is_set():
            with self._lock:
                lookup = self._plan.lookup_due(time.monotonic())
            if lookup:
                try:
                    layout = self.discovery.lookup(self.topic, "r")
                except LookupUnavailable as error:
                    log.warning("%s", error)
                    with self._lock:
                        self._plan.lookup_failed(time.monotonic())
                else:
                    self._apply(layout)
            self._connect_due()
            with self._lock:
                wake_at = self._plan.next_wakeup(time.monotonic())
            self._wake.wait(max(0.0, wake_at - time.monotonic()))
            self._wake.clear()

    def _apply(self, layout: TopicLayout) -> None:
        """Follow a new lookup: new partitions, and partitions whose leader moved (their old
        connection is closed; its unfinished messages come again from the new leader)."""
        with self._lock:
            moved = self._plan.looked_up(targets_of(layout), time.monotonic())
            leaving = [self._subscriptions.get(target.slot) for target in moved]
        for subscription in leaving:
            if subscription is None:
                continue
            log.info(
                "%s partition %s moved: leaving %s",
                self.topic,
                subscription.partition,
                subscription.address,
            )
            subscription.retired = True
            subscription.close()

    def _connect_due(self) -> None:
        while not self._stopping.is_set():
            with self._lock:
                due = self._plan.due(time.monotonic())
            if not due:
                return
            for target in due:
                if self._stopping.is_set():
                    return
                self._connect(target)

    def _connect(self, target: Target) -> None:
        try:
            subscription = self._subscribe(target)
        except NSQError as error:
            with self._lock:
                learned = self._plan.refused(error.code)
                if learned:
                    self._plan.not_connected(target)
            if learned:
                return
            if error.code not in RETRYABLE_ERRORS:
                log.error("subscribing to %s/%s failed: %s", self.topic, self.channel, error)
                self._stop(error)
                return
            self._failed(target, error)
            return
        except (OSError, ValueError) as error:
            self._failed(target, error)
            return
        with self._lock:
            wanted = not self._stopping.is_set() and self._plan.subscribed(target)
            if wanted:
                self._subscriptions[target.slot] = subscription
                self._counts["connections"] += 1
        if not wanted:
            subscription.retired = True
            subscription.close()
            return
        log.info(
            "subscribed to %s partition %s at %s", self.topic, target.partition, target.address
        )
        subscription.thread = self._start(
            self._read, f"smart-consumer {self.topic}/{self.channel} {target.address}", subscription
        )
        self._rebalance()

    def _subscribe(self, target: Target) -> _Subscription:
        with self._lock:
            command, args, detail = self._plan.sub_command(target, self.topic, self.channel)
            identify = self._plan.identify(self._identify)
            extend = self._plan.extend
        connection = Connection(
            target.address, timeout=self.timeout, identify=identify, security=self.security
        )
        try:
            connection.send(encode_command(command, *args))
            _read_reply(connection, self.timeout)
        except BaseException:
            connection.close()
            raise
        return _Subscription(target, connection, detail=detail, extend=extend)

    def _failed(self, target: Target, error: BaseException) -> None:
        with self._lock:
            delay = self._plan.subscribe_failed(target, time.monotonic())
        log.warning(
            "subscribing to %s partition %s at %s failed (%s); again in %.2fs",
            self.topic,
            target.partition,
            target.address,
            error,
            delay,
        )

    def _read(self, subscription: _Subscription) -> None:
        error: BaseException | None = None
        try:
            while not subscription.closed:
                frame = subscription.connection.read_frame(timeout=self.timeout)
                if frame is None:
                    continue
                # An error frame that is not fatal (typically a late FIN of a message that had
                # timed out) is left be; a fatal one raises SubscriptionError.
                for delivery in subscription.reader.receive_frames([frame]).deliveries:
                    self._deliver(subscription, delivery)
        except Exception as caught:  # any end of the connection is handled the same way
            error = caught
        finally:
            self._lost(subscription, error)

    def _deliver(self, subscription: _Subscription, delivery: Delivery) -> None:
        message = SmartMessage(
            delivery.id,
            delivery.body,
            delivery.attempts,
            delivery.timestamp,
            subscription.partition,
            subscription.address,
            delivery.offset,
            delivery.record_size,
            delivery.ext_header,
            _subscription=subscription,
            _consumer=self,
        )
        self._count("messages")
        with self._ready:
            self._messages.append(message)
            self._ready.notify()

    def _lost(self, subscription: _Subscription, error: BaseException | None) -> None:
        target = subscription.target
        with self._lock:
            current = self._subscriptions.get(target.slot) is subscription
            if current:
                del self._subscriptions[target.slot]
                self._plan.lost(target, time.monotonic(), retired=subscription.retired)
                if not self._stopping.is_set():
                    self._counts["disconnections"] += 1
        subscription.close()
        with self._ready:
            self._messages = deque(m for m in self._messages if m._subscription is not subscription)
        if self._stopping.is_set() or not current:
            return
        if not subscription.retired:
            log.warning(
                "%s partition %s at %s lost (%s); reconnecting",
                self.topic,
                subscription.partition,
                subscription.address,
                error or "closed",
            )
        self._rebalance()
        self._wake.set()

    def _rebalance(self) -> None:
        """max_in_flight over the subscriptions (`ready_counts`)."""
        with self._rdy_lock:
            with self._lock:
                subscriptions = list(self._subscriptions.values())
            counts = ready_counts(self.max_in_flight, [s.max_rdy for s in subscriptions])
            for subscription, rdy in zip(subscriptions, counts, strict=True):
                if rdy != subscription.rdy and subscription.send(encode_rdy(rdy)):
                    subscription.rdy = rdy

    def _dispatch(self) -> None:
        handler = self._handler
        assert handler is not None  # started only with one
        while True:
            try:
                message = self._take(None)
            except Exception:
                return
            if message is None:
                return
            try:
                handler(message)
            except Exception:
                log.exception("the handler failed on a message of %s; requeueing it", self.topic)
                message.requeue(self.requeue_delay_ms)
            else:
                message.finish()

    def _take(self, timeout: float | None) -> SmartMessage | None:
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._ready:
            while not self._messages:
                if self._error is not None:
                    raise self._error
                if self._stopping.is_set():
                    return None
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return None
                self._ready.wait(remaining)
            return self._messages.popleft()

    def _count(self, name: str) -> None:
        with self._lock:
            self._counts[name] += 1
