"""What every NSQ utility shares: Go-style flags, a consumer over several nsqds, progress on a
terminal, and a clean stop on SIGINT/SIGTERM.

The tools are blocking programs over `nsqpy.client.blocking` (plain sockets, no event loop): a
`ConsumerGroup` multiplexes the connections to every nsqd that has the topic with `selectors`,
hands out one message at a time, and on stop sends `CLS` and drains what is still in flight,
as go-nsq's `Consumer.Stop()` does, so no message is left to time out.
"""

import logging
import selectors
import signal
import sys
import time
import urllib.error
from collections.abc import Iterable
from typing import NoReturn, TextIO

from nsqpy.client.blocking import Consumer, Message, NSQError, lookup_nsqds
from nsqpy.client.security import Security
from nsqpy.common.command import encode_command
from nsqpy.common.flags import Flag, FlagSet, Kind
from nsqpy.common.frame import FRAME_TYPE_ERROR, FRAME_TYPE_MESSAGE
from nsqpy.common.message import decode_message
from nsqpy.common.version import version_line
from nsqpy.daemon.log import parse_log_level, setup_logger

__all__ = [
    "ConsumerGroup",
    "Progress",
    "StopFlag",
    "address_flags",
    "fatal",
    "parse_args",
]

NON_FATAL_ERRORS = ("E_FIN_FAILED", "E_REQ_FAILED", "E_TOUCH_FAILED")
# go-nsq's default lookupd_poll_interval.
LOOKUPD_POLL_INTERVAL = 60.0
# How often a lost direct nsqd connection is tried again (go-nsq: 15 s).
RECONNECT_INTERVAL = 15.0
# A receive wakes at least this often, so a stop request is noticed promptly.
WAKE_INTERVAL = 0.25


def parse_args(name: str, flags: list[Flag], argv: list[str] | None) -> dict:
    """Parse Go-style flags (`-flag value`, `--flag=value`); `--version` prints and exits."""
    flag_set = FlagSet(
        name,
        [
            Flag("version", Kind.BOOL, False, "print version string", config_key=None),
            *flags,
        ],
    )
    values, explicit, _args = flag_set.parse_or_exit(sys.argv[1:] if argv is None else argv)
    if values["version"]:
        print(version_line(name))
        sys.exit(0)
    # Which flags were given (Go's FlagSet.Visit): an explicit --max-in-flight beats a
    # max_in_flight passed through --consumer-opt.
    values["_explicit"] = frozenset(explicit)
    return values


def log_flags(name: str) -> list[Flag]:
    return [
        Flag(
            "log-level",
            Kind.VALUE,
            "info",
            "set log verbosity: debug, info, warn, error, or fatal",
            parse=parse_log_level,
            default_text="INFO",
        ),
        Flag("log-prefix", Kind.STRING, f"[{name}] ", "log message prefix"),
    ]


def address_flags() -> list[Flag]:
    """--nsqd-tcp-address and --lookupd-http-address, each repeatable (Go's StringArray)."""
    return [
        Flag(
            "nsqd-tcp-address",
            Kind.STRING_LIST,
            (),
            "nsqd TCP address (may be given multiple times)",
        ),
        Flag(
            "lookupd-http-address",
            Kind.STRING_LIST,
            (),
            "lookupd HTTP address (may be given multiple times)",
        ),
    ]


def consumer_opt_flag() -> Flag:
    return Flag(
        "consumer-opt",
        Kind.STRING_LIST,
        (),
        "option to passthrough to nsq.Consumer (may be given multiple times)",
    )


def make_logger(name: str, values: dict) -> logging.Logger:
    return setup_logger(
        name, values.get("log_prefix", f"[{name}] "), values.get("log_level", "info")
    )


def fatal(log: logging.Logger, message: str, *args) -> NoReturn:
    log.critical(message, *args)
    sys.exit(1)


def check_sources(log: logging.Logger, values: dict) -> None:
    """Go's rule for consumers: nsqd addresses or lookupd addresses, exactly one kind."""
    if not values["nsqd_tcp_address"] and not values["lookupd_http_address"]:
        fatal(log, "--nsqd-tcp-address or --lookupd-http-address required")
    if values["nsqd_tcp_address"] and values["lookupd_http_address"]:
        fatal(log, "use --nsqd-tcp-address or --lookupd-http-address not both")


class StopFlag:
    """Set by SIGINT/SIGTERM (and SIGHUP when asked); the tools poll it between messages."""

    def __init__(self, signals: Iterable[int] = (signal.SIGINT, signal.SIGTERM)) -> None:
        self.requested = False
        for signum in signals:
            signal.signal(signum, self._handle)

    def _handle(self, signum, frame) -> None:
        self.requested = True

    def __bool__(self) -> bool:
        return self.requested


class Progress:
    """Messages and messages/s on one stderr line, redrawn at most once a second, and only
    when stderr is a terminal (a pipe or a log file never sees it)."""

    def __init__(self, label: str = "msgs", stream: TextIO | None = None) -> None:
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = self.stream.isatty()
        self.label = label
        self.count = 0
        self.started = time.monotonic()
        self._last_draw = self.started
        self._last_count = 0

    def add(self, count: int = 1) -> None:
        self.count += count
        if not self.enabled:
            return
        now = time.monotonic()
        if now - self._last_draw >= 1.0:
            rate = (self.count - self._last_count) / (now - self._last_draw)
            self.stream.write(f"\r{self.count} {self.label}, {rate:.0f} {self.label}/s   ")
            self.stream.flush()
            self._last_draw = now
            self._last_count = self.count

    def close(self) -> None:
        if self.enabled:
            elapsed = max(time.monotonic() - self.started, 1e-9)
            self.stream.write(
                f"\r{self.count} {self.label} in {elapsed:.1f}s, "
                f"{self.count / elapsed:.0f} {self.label}/s\n"
            )
            self.stream.flush()


def settle(
    group: "ConsumerGroup",
    message: Message,
    error: str | None,
    *,
    progress: Progress,
    log: logging.Logger,
    status_every: int,
    done: str,
) -> None:
    """After handing `message` on: FIN it and count it (a log line every `status_every`
    messages: `N messages <done>`), or, when handing it on failed (`error`), log why and
    requeue it. go-nsq backs a failed message off by its attempts; a plain delay does here."""
    if error is None:
        group.finish(message)
        progress.add()
        if status_every and progress.count % status_every == 0:
            log.info("%d messages %s", progress.count, done)
    else:
        log.error("%s", error)
        group.requeue(message, delay_ms=min(message.attempts, 60) * 1000)


class ConsumerGroup:
    """One subscription (`topic`/`channel`) on every nsqd that has the topic.

    nsqds come from `nsqd_tcp_addresses` directly or from each lookupd's `/lookup`, polled
    again every `lookupd_poll_interval`. `max_in_flight` is shared out between the
    connections as go-nsq does (at least 1 each).
    """

    def __init__(
        self,
        topics: list[str],
        channel: str,
        *,
        nsqd_tcp_addresses: Iterable[str] = (),
        lookupd_http_addresses: Iterable[str] = (),
        max_in_flight: int = 200,
        user_agent: str = "",
        identify: dict | None = None,
        log: logging.Logger | None = None,
        lookupd_poll_interval: float = LOOKUPD_POLL_INTERVAL,
        security: Security | None = None,
    ) -> None:
        self.topics = list(topics)
        self.security = security
        self.channel = channel
        self.nsqd_tcp_addresses = list(nsqd_tcp_addresses)
        self.lookupd_http_addresses = list(lookupd_http_addresses)
        self.max_in_flight = max_in_flight
        self.identify = {"user_agent": user_agent} if user_agent else {}
        self.identify.update(identify or {})
        self.log = log or logging.getLogger("tools")
        self.lookupd_poll_interval = lookupd_poll_interval
        self.selector = selectors.DefaultSelector()
        # (topic, address) -> Consumer
        self.consumers: dict[tuple[str, str], Consumer] = {}
        self._next_discovery = 0.0
        self._closing = False

    def add_topic(self, topic: str) -> None:
        """Subscribe to one more topic (nsq_to_file's topic discovery); connects at once."""
        if topic not in self.topics:
            self.topics.append(topic)
            self._next_discovery = 0.0

    # -- connections --------------------------------------------------------------------------

    def discover(self) -> None:
        """Connect to every nsqd that has each topic and that we are not connected to yet."""
        self._next_discovery = time.monotonic() + (
            self.lookupd_poll_interval if self.lookupd_http_addresses else RECONNECT_INTERVAL
        )
        for topic in self.topics:
            for address in self._addresses_for(topic):
                if (topic, address) not in self.consumers:
                    self._connect(topic, address)
        self._share_max_in_flight()

    def _addresses_for(self, topic: str) -> list[str]:
        if not self.lookupd_http_addresses:
            return self.nsqd_tcp_addresses
        addresses: list[str] = []
        for lookupd in self.lookupd_http_addresses:
            try:
                found = lookup_nsqds(lookupd, topic)
            except (OSError, ValueError, urllib.error.URLError) as error:
                self.log.error("error querying nsqlookupd (%s) - %s", lookupd, error)
                continue
            addresses.extend(a for a in found if a not in addresses)
        return addresses

    def _connect(self, topic: str, address: str) -> None:
        self.log.info("(%s) connecting to nsqd", address)
        try:
            consumer = Consumer(
                address,
                topic,
                self.channel,
                max_in_flight=1,
                identify=self.identify,
                security=self.security,
            )
        except (OSError, NSQError) as error:
            self.log.error("(%s) error connecting to nsqd - %s", address, error)
            return
        self.consumers[(topic, address)] = consumer
        self.selector.register(consumer.sock, selectors.EVENT_READ, (topic, address))

    def _share_max_in_flight(self) -> None:
        if not self.consumers or self._closing:
            return
        each = max(1, self.max_in_flight // len(self.consumers))
        for consumer in list(self.consumers.values()):
            if consumer.max_in_flight != each:
                consumer.max_in_flight = each
                self._send(consumer, lambda c, n=each: c.ready(n))

    def _drop(self, key: tuple[str, str], reason: object) -> None:
        consumer = self.consumers.pop(key, None)
        if consumer is None:
            return
        if not self._closing:
            self.log.warning("(%s) connection lost - %s", key[1], reason)
        self.selector.unregister(consumer.sock)
        consumer.close()
        self._share_max_in_flight()

    def _send(self, consumer: Consumer, action) -> None:
        try:
            action(consumer)
        except OSError as error:
            self._drop((consumer.topic, consumer.address), error)

    # -- messages -----------------------------------------------------------------------------

    def receive(self, timeout: float | None = WAKE_INTERVAL) -> Message | None:
        """The next message from any connection, or None after `timeout` seconds."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            if not self._closing and time.monotonic() >= self._next_discovery:
                self.discover()
            for key, consumer in list(self.consumers.items()):
                if consumer.frames:
                    message = self._receive_from(key, consumer)
                    if message is not None:
                        return message
            remaining = WAKE_INTERVAL if deadline is None else deadline - time.monotonic()
            if remaining <= 0:
                return None
            wait = min(remaining, max(0.0, self._next_discovery - time.monotonic()))
            if not self.consumers:
                time.sleep(min(wait, WAKE_INTERVAL))
                if deadline is None:
                    continue
                return None
            for selector_key, _events in self.selector.select(wait):
                key = selector_key.data
                readable = self.consumers.get(key)
                if readable is not None:
                    message = self._receive_from(key, readable)
                    if message is not None:
                        return message
            if deadline is not None and time.monotonic() >= deadline:
                return None

    def _receive_from(self, key, consumer: Consumer) -> Message | None:
        """A message already on this connection, if any; answers CLOSE_WAIT and errors."""
        try:
            while True:
                frame = consumer.read_frame(timeout=0.001)
                if frame is None:
                    return None
                if frame.frame_type == FRAME_TYPE_MESSAGE:
                    decoded = decode_message(frame.data)
                    return Message(
                        decoded.id, decoded.body, decoded.attempts, decoded.timestamp, consumer
                    )
                if frame.frame_type == FRAME_TYPE_ERROR:
                    text = frame.data.decode("utf-8", "replace")
                    if text.split(" ", 1)[0] in NON_FATAL_ERRORS:
                        self.log.warning("(%s) %s", key[1], text)
                        continue
                    raise NSQError(text)
                if frame.data == b"CLOSE_WAIT":
                    self._drop(key, "closed")
                    return None
        except (OSError, NSQError) as error:
            self._drop(key, error)
            return None

    def finish(self, message: Message) -> None:
        self._send(message.consumer, lambda c: c.finish(message.id))

    def requeue(self, message: Message, delay_ms: int = 0) -> None:
        self._send(message.consumer, lambda c: c.requeue(message.id, delay_ms))

    def touch(self, message: Message) -> None:
        self._send(message.consumer, lambda c: c.touch(message.id))

    def start_close(self) -> None:
        """Send CLS everywhere: nsqd stops sending; what is in flight can still be answered."""
        self._closing = True
        for consumer in list(self.consumers.values()):
            self._send(consumer, lambda c: c.send(encode_command(b"CLS")))

    def drain(self, timeout: float = 5.0):
        """After start_close(): yield the messages that were already on their way, until
        every connection answered CLOSE_WAIT (or `timeout`)."""
        deadline = time.monotonic() + timeout
        while self.consumers and time.monotonic() < deadline:
            message = self.receive(timeout=min(WAKE_INTERVAL, deadline - time.monotonic()))
            if message is not None:
                yield message

    def close(self) -> None:
        self._closing = True
        for key in list(self.consumers):
            self._drop(key, "closed")
        self.selector.close()
