"""The client's sans-IO core: what a consumer decides, whoever does its I/O.

Every consumer of `nsqpy.client` (blocking threads, asyncio, trio) is the same state machine
driven by a different adapter, in the style of the project's codecs (`nsqpy.common`): this
module never opens a socket, sleeps or reads a clock; the adapter passes `now` in, performs
what the core asks for and reports back what happened.

* `SubscriptionPlan` follows the lookups (discovery): which targets (an nsqd, or a partition
  and its leader) to be subscribed to, a partition whose leader moved is left for the new one,
  a lost or refused subscription is retried after a backoff, the topic is looked up again
  every `lookup_interval` and before a reconnect, and what a refusal teaches (an ordered or
  ext topic the lookupds did not say) is remembered.
* `ready_counts` spreads `max_in_flight` as RDY over the connections (go-nsq's
  maxInFlight/conns, at least 1 each).
* `SubscriptionReader` turns a subscribed connection's bytes into events: messages (with the
  ext header and ordered detail split off), heartbeats to answer, errors that end it or not.
"""

import struct
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Protocol

from nsqpy.common.errors import NON_FATAL_CODES
from nsqpy.common.frame import FRAME_TYPE_ERROR, FRAME_TYPE_MESSAGE, FrameDecoder
from nsqpy.common.message import decode_message

HEARTBEAT = b"_heartbeat_"
CLOSE_WAIT = b"CLOSE_WAIT"
NOP = b"NOP\n"
# Messages of a SUB_ORDERED subscription start with `[8 queue offset][4 record size]`
# (docs/protocol.md §3.5).
DETAIL = struct.Struct(">QI")

# Refusals a new lookup (a moved leader, a node back) may cure: the request is retried.
RETRYABLE_ERRORS = frozenset(
    {"E_FAILED_ON_NOT_LEADER", "E_FAILED_ON_NOT_WRITABLE", "E_TOPIC_NOT_EXIST"}
)


@dataclass(frozen=True)
class Target:
    """An nsqd a consumer reads from, and the partition there (None: a classic topic)."""

    address: str
    partition: int | None = None

    @property
    def slot(self) -> int | str:
        """What stays the same when the partition's leader moves: the partition, or (classic)
        the nsqd itself."""
        return self.address if self.partition is None else self.partition


@dataclass(frozen=True)
class Targets:
    """Where a topic is read, as a lookup found it: its nsqds or partition leaders, and how
    (SUB_ORDERED for an ordered topic, `extend_support` for an ext topic)."""

    targets: tuple[Target, ...]
    ordered: bool = False
    extend: bool = False


def backoff_delay(failures: int, initial: float, maximum: float) -> float:
    """Seconds before the next attempt after `failures` failures in a row: doubling."""
    return min(initial * 2 ** max(failures - 1, 0), maximum)


def ready_counts(max_in_flight: int, max_rdy: list[int]) -> list[int]:
    """RDY for each of the connections (their servers' `max_rdy_count` given): max_in_flight
    spread over them, the remainder to the first ones, at least 1 each."""
    if not max_rdy:
        return []
    share, extra = divmod(max_in_flight, len(max_rdy))
    return [
        min(max(1, share + (1 if index < extra else 0)), limit)
        for index, limit in enumerate(max_rdy)
    ]


@dataclass
class _Slot:
    """What the plan knows of one partition (or classic nsqd)."""

    target: Target | None  # where the last lookup listed it; None: not listed now
    subscribed: Target | None = None
    connecting: bool = False
    failures: int = 0
    retry_at: float = 0.0


@dataclass
class SubscriptionPlan:
    """Which targets a consumer is to be subscribed to, and when; see the module docstring.

    The adapter calls `looked_up` with each lookup (and `lookup_failed`), `connecting`,
    `subscribed`, `subscribe_failed` and `lost` as its connections go, and asks `due(now)`
    what to subscribe to, `lookup_due(now)` whether to look up and `next_wakeup(now)` how long
    it may sleep. `ordered` None follows the topic (the lookups, or a refusal)."""

    lookup_interval: float = 60.0
    backoff_initial: float = 0.1
    backoff_max: float = 5.0
    ordered: bool | None = None
    # While nothing is subscribed (a topic no nsqd has yet, every nsqd down), look up this
    # often instead; None: every lookup_interval.
    idle_lookup_interval: float | None = None
    sub_ordered: bool = False
    extend: bool = False
    lookup_requested: bool = False
    next_lookup: float = 0.0
    last_lookup: float = 0.0
    slots: dict[int | str, _Slot] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.sub_ordered = bool(self.ordered)

    # -- discovery --

    def looked_up(self, found: Targets, now: float) -> list[Target]:
        """A lookup's answer. Returns the subscriptions to leave: partitions whose leader
        moved (their unfinished messages come again from the new leader)."""
        self.lookup_requested = False
        self.last_lookup = now
        self.next_lookup = now + self.lookup_interval
        if self.ordered is None and found.ordered:
            self.sub_ordered = True
        # Sticky, like SUB_ORDERED: a lookupd that did not create the topic may not know.
        self.extend = self.extend or found.extend
        listed = {target.slot: target for target in found.targets}
        moved = []
        for slot, target in listed.items():
            state = self.slots.setdefault(slot, _Slot(None))
            if state.target != target:
                state.target = target
                state.failures = 0
                state.retry_at = 0.0
                if state.subscribed is not None and state.subscribed != target:
                    moved.append(state.subscribed)
        for slot, state in self.slots.items():
            if slot not in listed:
                # Gone from the lookup (its nsqd left): not reconnected until it is back. A
                # subscription still open to it is kept while it works.
                state.target = None
        self._postpone_lost(now)
        return moved

    def lookup_failed(self, now: float) -> None:
        """No lookupd answered: keep what is subscribed, try again soon."""
        self.lookup_requested = False
        self.last_lookup = now
        self.next_lookup = now + min(self.lookup_interval, self.backoff_max)
        self._postpone_lost(now)

    def _postpone_lost(self, now: float) -> None:
        """Lost partitions no lookup lists now (a failover under way, their nsqd down): looked
        for again after a backoff."""
        for state in self.slots.values():
            if (
                state.target is None
                and state.subscribed is None
                and state.failures
                and state.retry_at <= now
            ):
                state.failures += 1
                state.retry_at = now + self.backoff(state.failures)

    def request_lookup(self) -> None:
        self.lookup_requested = True

    def _lookup_at(self) -> float:
        if self.idle_lookup_interval is not None and not self.subscriptions():
            return min(self.next_lookup, self.last_lookup + self.idle_lookup_interval)
        return self.next_lookup

    def lookup_due(self, now: float) -> bool:
        """Asked for, the interval is over, or a lost partition's reconnect is due (the
        lookup first: its leader may have moved)."""
        if self.lookup_requested or now >= self._lookup_at():
            return True
        return any(
            state.subscribed is None
            and not state.connecting
            and state.failures
            and state.retry_at <= now
            for state in self.slots.values()
        )

    # -- subscriptions --

    def due(self, now: float) -> list[Target]:
        """The listed targets to subscribe to now (marked connecting)."""
        due = []
        for state in self.slots.values():
            target = state.target
            if (
                target is not None
                and state.subscribed is None
                and not state.connecting
                and state.retry_at <= now
            ):
                state.connecting = True
                due.append(target)
        return due

    def not_connected(self, target: Target) -> None:
        """Subscribing stopped short without a failure (a refusal that taught how): due again
        at once."""
        state = self.slots.get(target.slot)
        if state is not None:
            state.connecting = False

    def connecting(self, target: Target) -> None:
        """The adapter is subscribing to `target` by itself (a first lookup's targets)."""
        self.slots.setdefault(target.slot, _Slot(target)).connecting = True

    def subscribed(self, target: Target) -> bool:
        """A subscription is up. False when the plan no longer wants it (the partition moved
        meanwhile): the adapter closes it."""
        state = self.slots.get(target.slot)
        if state is None:
            return False
        state.connecting = False
        if state.target != target:
            return False
        state.subscribed = target
        state.failures = 0
        return True

    def subscribe_failed(self, target: Target, now: float) -> float:
        """Subscribing failed (a refused SUB, no connection): seconds until it is tried again."""
        state = self.slots.setdefault(target.slot, _Slot(target))
        state.connecting = False
        state.failures += 1
        delay = self.backoff(state.failures)
        state.retry_at = now + delay
        return delay

    def lost(self, target: Target, now: float, *, retired: bool = False) -> bool:
        """A subscription ended; `retired` when the adapter closed it on purpose (a moved
        leader, or closing). True when it was the current one: then, unless retired, it is
        reconnected after a backoff, and a lookup is asked for first."""
        state = self.slots.get(target.slot)
        if state is None or state.subscribed != target:
            return False
        state.subscribed = None
        if not retired:
            state.failures += 1
            state.retry_at = now + self.backoff(state.failures)
        # The leader may have moved: know where before the reconnect is due.
        self.lookup_requested = True
        return True

    def refused(self, code: str) -> bool:
        """An nsqd refused SUB with `code`: true when that teaches how to subscribe (an ordered
        or ext topic the lookups did not say), to subscribe again at once that way."""
        if code == "E_SUB_ORDER_IS_MUST" and self.ordered is None and not self.sub_ordered:
            self.sub_ordered = True
            return True
        if code == "E_SUB_EXTEND_NEED" and not self.extend:
            self.extend = True
            return True
        return False

    def next_wakeup(self, now: float) -> float:
        """When the adapter must ask again at the latest: the next lookup or retry."""
        if self.lookup_requested:
            return now
        waits = [
            state.retry_at
            for state in self.slots.values()
            if state.subscribed is None
            and not state.connecting
            and (state.target is not None or state.failures)
        ]
        return min([self._lookup_at(), *waits])

    def subscriptions(self) -> list[Target]:
        return [state.subscribed for state in self.slots.values() if state.subscribed]

    def backoff(self, failures: int) -> float:
        return backoff_delay(failures, self.backoff_initial, self.backoff_max)

    # -- what a SUB says --

    def sub_command(self, target: Target, topic: str, channel: str) -> tuple[str, list]:
        """The command name and arguments that subscribe at `target`."""
        extra = [] if target.partition is None else [target.partition]
        return ("SUB_ORDERED" if self.sub_ordered else "SUB"), [topic, channel, *extra]

    def identify(self, base: dict) -> dict:
        """The IDENTIFY body: an ext topic needs extend_support, a plain one must not have it
        (docs/protocol.md §3.3)."""
        return {**({"extend_support": True} if self.extend else {}), **base}


@dataclass
class Delivery:
    """One message as a subscription delivered it."""

    id: bytes
    body: bytes
    attempts: int
    timestamp: int
    ext_header: bytes | None = None
    offset: int | None = None
    record_size: int | None = None


def split_ext_section(body: bytes) -> tuple[bytes | None, bytes]:
    """A message body from an ext topic, to a consumer that IDENTIFYd `extend_support`:
    (its JSON header, None without one; the data) (docs/protocol.md §3.5)."""
    if not body or body[0] == 0:
        return None, body[1:]
    length = int.from_bytes(body[1:3], "big")
    return body[3 : 3 + length], body[3 + length :]


def decode_delivery(data: bytes, *, detail: bool, extend: bool) -> Delivery:
    """A message frame's data, with the ext section and then the ordered detail split off
    (EXT comes before DETAIL, docs/protocol.md §3.5)."""
    decoded = decode_message(data)
    body = decoded.body
    header = offset = record_size = None
    if extend:
        header, body = split_ext_section(body)
    if detail:
        offset, record_size = DETAIL.unpack_from(body)
        body = body[DETAIL.size :]
    return Delivery(
        decoded.id, body, decoded.attempts, decoded.timestamp, header, offset, record_size
    )


class SubscriptionError(Exception):
    """An error frame that ends a subscription (fatal on nsqd's side too)."""


@dataclass
class SubscriptionEvents:
    """What one read of a subscribed connection brought."""

    deliveries: list[Delivery] = field(default_factory=list)
    # Bytes to send back now (NOP for each heartbeat).
    reply: bytes = b""
    # Error frames that do not end the connection (a late FIN of a timed-out message).
    warnings: list[str] = field(default_factory=list)
    # nsqd answered CLS: nothing more comes.
    closed: bool = False


class SubscriptionReader:
    """A subscribed connection's bytes in, events out. SubscriptionError for an error frame
    that ends the connection."""

    def __init__(self, *, detail: bool, extend: bool, buffered: bytes = b"") -> None:
        self.detail = detail
        self.extend = extend
        self._frames = FrameDecoder()
        self._buffered = buffered

    def receive_data(self, data: bytes | bytearray) -> SubscriptionEvents:
        events = SubscriptionEvents()
        if self._buffered:
            data, self._buffered = self._buffered + data, b""
        for frame in self._frames.receive_data(data):
            if frame.frame_type == FRAME_TYPE_MESSAGE:
                events.deliveries.append(
                    decode_delivery(frame.data, detail=self.detail, extend=self.extend)
                )
            elif frame.frame_type == FRAME_TYPE_ERROR:
                text = frame.data.decode("utf-8", "replace")
                if text.split(" ", 1)[0] not in NON_FATAL_CODES:
                    raise SubscriptionError(text)
                events.warnings.append(text)
            elif frame.data == HEARTBEAT:
                events.reply += NOP
            elif frame.data == CLOSE_WAIT:
                events.closed = True
        return events


class TopicLayoutLike(Protocol):
    """What `targets_of` reads of a lookup's layout (`nsqpy.client.smart.TopicLayout`)."""

    @property
    def partitions(self) -> dict[int, str]: ...

    @property
    def classic_nodes(self) -> Iterable[str]: ...

    @property
    def ordered(self) -> bool: ...

    @property
    def extend_support(self) -> bool: ...


def targets_of(layout: TopicLayoutLike) -> Targets:
    """A smart lookup's layout as targets."""
    if layout.partitions:
        targets = tuple(
            Target(address, partition) for partition, address in layout.partitions.items()
        )
    else:
        targets = tuple(Target(address) for address in layout.classic_nodes)
    return Targets(targets, layout.ordered, layout.extend_support)
