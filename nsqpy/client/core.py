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
* `PublishRouter` decides where a producer publishes: the partition of a key
  (`partition_for_key`) or the next one round-robin, avoiding for a while one that refused a
  publish, from lookups kept `lookup_interval` (less while incomplete) that never go back on a
  topic's partition count or ordering.
* `SubscriptionReader` turns a subscribed connection's bytes into events: messages (with the
  ext header and ordered detail split off), heartbeats to answer, errors that end it or not.
"""

import dataclasses
import struct
import threading
import uuid
import zlib
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Protocol

from nsqpy.common.command import (
    encode_mpub,
    encode_mpub_ext,
    encode_mpub_ext_seq,
    encode_mpub_seq,
    encode_pub,
    encode_pub_seq,
)
from nsqpy.common.consume_offset import parse_consume_offset
from nsqpy.common.errors import NON_FATAL_CODES
from nsqpy.common.frame import FRAME_TYPE_ERROR, FRAME_TYPE_MESSAGE, Frame, FrameDecoder
from nsqpy.common.message import decode_message

HEARTBEAT = b"_heartbeat_"
CLOSE_WAIT = b"CLOSE_WAIT"
NOP = b"NOP\n"
# Messages of a SUB_ORDERED subscription start with `[8 queue offset][4 record size]`
# (docs/protocol.md §3.5).
DETAIL = struct.Struct(">QI")

# The word after the code of a refused publish that its leader sent to followers before it
# gave up: it may be stored (docs/protocol.md §3.10).
MAYBE_STORED = "MAYBE_STORED"
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
    # Youzan's consume start (SUB_ADVANCED, docs/protocol.md §3.8): `<type>:<value>` by
    # partition (None: every partition), sent with each partition's first subscription only,
    # so that a reconnect goes on where the channel is.
    start_from: dict[int | None, str] = field(default_factory=dict)
    started: set[int | str] = field(default_factory=set)
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
        self.started.add(target.slot)
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

    def sub_command(self, target: Target, topic: str, channel: str) -> tuple[str, list, bool]:
        """The command name and arguments that subscribe at `target`, and whether its
        messages carry DETAIL (SUB_ORDERED, SUB_ADVANCED). A partition's first subscription
        names its consume start, if any: SUB_ADVANCED (SUB_ORDERED with it, on an ordered
        topic, which nsqpy's nsqd reads and Youzan's ignores)."""
        extra = [] if target.partition is None else [target.partition]
        start = None
        if target.slot not in self.started:
            start = self.start_from.get(target.partition, self.start_from.get(None))
        if start is not None:
            if target.partition is None:
                extra = [-1]
            command = "SUB_ORDERED" if self.sub_ordered else "SUB_ADVANCED"
            return command, [topic, channel, *extra, start], True
        command = "SUB_ORDERED" if self.sub_ordered else "SUB"
        return command, [topic, channel, *extra], self.sub_ordered

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


@dataclass(eq=False)
class DeliveredMessage:
    """A delivered message as a consumer hands it over, the fields every front end's message
    has: `id` is Youzan's 16 bytes `[8 internal id][8 trace id]` (echoed as they are);
    `partition` and `address` where it came from; `offset` and `record_size` the queue
    position a SUB_ORDERED subscription reports; `ext_header` the JSON header of an ext
    topic's message (None without one); `responded` once it was finished, requeued or given
    up on. Each front end adds how it answers."""

    id: bytes
    body: bytes
    attempts: int
    timestamp: int
    partition: int | None
    address: str
    offset: int | None = None
    record_size: int | None = None
    ext_header: bytes | None = None
    responded: bool = False

    @property
    def internal_id(self) -> int:
        return int.from_bytes(self.id[:8], "big")


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
    """A subscribed connection's bytes (or frames, where the adapter's connection cuts them)
    in, events out. SubscriptionError for an error frame that ends the connection.
    `decoder` is the connection's, when it read frames before the subscription (a partial
    frame may wait in it)."""

    def __init__(self, *, detail: bool, extend: bool, decoder: FrameDecoder | None = None):
        self.detail = detail
        self.extend = extend
        self._frames = decoder or FrameDecoder()

    def receive_data(self, data: bytes | bytearray) -> SubscriptionEvents:
        return self.receive_frames(self._frames.receive_data(data))

    def receive_frames(self, frames: Iterable[Frame]) -> SubscriptionEvents:
        events = SubscriptionEvents()
        for frame in frames:
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


Key = str | bytes | int


def partition_for_key(key: Key, partition_num: int) -> int:
    """The partition of a key's messages: CRC-32 of the key (a str's UTF-8 bytes, an int's
    decimal digits) modulo the partition count, the same in every process and run."""
    if partition_num <= 0:
        raise ValueError("the topic has no partitions")
    if isinstance(key, int):
        data = str(key).encode()
    elif isinstance(key, str):
        data = key.encode()
    else:
        data = bytes(key)
    return zlib.crc32(data) % partition_num


class WritableLayout(TopicLayoutLike, Protocol):
    """What the router reads of a lookup of writable partitions (`access=w`)."""

    @property
    def topic(self) -> str: ...

    @property
    def partition_num(self) -> int: ...

    @property
    def complete(self) -> bool: ...


@dataclass
class PublishRouter:
    """Where a producer publishes; see the module docstring. The adapter looks a topic up when
    `cached` says the lookup it has is too old (or after a refusal), gives each answer to
    `looked_up`, asks `choose` for a target, and reports a failed attempt with `refused`."""

    lookup_interval: float = 60.0
    backoff_max: float = 1.0
    partition_cooldown: float = 5.0
    layouts: dict[str, tuple[WritableLayout, float]] = field(default_factory=dict)
    _next: dict[str, int] = field(default_factory=dict)
    _cooling: dict[tuple[str, int | str], float] = field(default_factory=dict)

    def cached(self, topic: str, now: float) -> WritableLayout | None:
        """The topic's last lookup while it is fresh: `lookup_interval`, or `backoff_max`
        while it lacks some of the topic's partitions."""
        cached = self.layouts.get(topic)
        if cached is None:
            return None
        layout, fetched_at = cached
        keep = self.lookup_interval if layout.complete else self.backoff_max
        return layout if now - fetched_at < keep else None

    def last(self, topic: str) -> WritableLayout | None:
        """The topic's last lookup however old (when no lookupd answers)."""
        cached = self.layouts.get(topic)
        return None if cached is None else cached[0]

    def looked_up(self, topic: str, layout: WritableLayout, now: float) -> WritableLayout:
        """A lookup's answer, as the router keeps it: a topic's partitions are never removed,
        and a standalone lookupd that did not create the topic knows neither its partition
        count nor that it is ordered (it counts the partitions registered with it), so neither
        goes back, or a key would map to another partition."""
        known = self.layouts.get(topic)
        if known is not None:
            previous = known[0]
            layout = dataclasses.replace(
                layout,  # type: ignore[type-var]
                partition_num=max(layout.partition_num, previous.partition_num),
                ordered=layout.ordered or previous.ordered,
            )
            # A partition with a new leader, or back after it was gone, is worth trying
            # again at once.
            for partition, address in layout.partitions.items():
                if previous.partitions.get(partition) != address:
                    self._cooling.pop((topic, partition), None)
        self.layouts[topic] = (layout, now)
        return layout

    def choose(
        self,
        layout: WritableLayout,
        key: Key | None,
        partition: int | None,
        tried: set[Target],
        now: float,
    ) -> Target | None:
        """The target to publish to. Keyed: the key's partition, or None while it has no
        writable leader. Otherwise the next one round-robin that was not tried (at that
        leader) in this publish, preferring those not cooling down; a tried one when every
        one was. ValueError for a partition the topic does not have, or an unkeyed publish to
        an ordered topic."""
        if key is not None:
            if not layout.partition_num:
                return None
            partition = partition_for_key(key, layout.partition_num)
        if partition is not None:
            if layout.partition_num and not 0 <= partition < layout.partition_num:
                raise ValueError(
                    f"topic {layout.topic!r} has partitions 0..{layout.partition_num - 1},"
                    f" not {partition}"
                )
            address = layout.partitions.get(partition)
            return None if address is None else Target(address, partition)
        if layout.ordered:
            raise ValueError(
                f"topic {layout.topic!r} is ordered: publish with key= (messages of one key"
                " stay in order on one partition) or partition="
            )
        candidates = targets_of(layout).targets
        if not candidates:
            return None
        topic = layout.topic
        start = self._next.get(topic, 0)
        rotation = [candidates[(start + i) % len(candidates)] for i in range(len(candidates))]
        untried = [target for target in rotation if target not in tried]
        ready = [t for t in untried if self._cooling.get((topic, t.slot), 0.0) <= now]
        chosen = (ready or untried or rotation)[0]
        self._next[topic] = (candidates.index(chosen) + 1) % len(candidates)
        return chosen

    def refused(self, topic: str, target: Target, now: float) -> None:
        """A publish to `target` failed: round-robin avoids it for `partition_cooldown`, or
        until a lookup shows the partition at another leader (nsqlookupd may still list it at
        the same one: nsqd's `/disable/write` is not reported to it)."""
        self._cooling[(topic, target.slot)] = now + self.partition_cooldown


class NoWritablePartition(LookupError):
    """The lookups list no partition a publish can go to (for its key or partition)."""


@dataclass
class PublishAttempts:
    """One publish's attempts: the adapter asks `next` (with the topic's layout, None when no
    lookupd answered) what to do, sends to the target it gets and reports a retryable
    failure with `failed`. A target tried in this publish is not tried again before a pause
    (`backoff_initial` doubling to `backoff_max`) and a new lookup (`refresh`); when the
    deadline passes, `next` answers None and `last_error` says why."""

    router: PublishRouter
    topic: str
    key: Key | None
    partition: int | None
    deadline: float
    backoff: float
    backoff_max: float
    tried: set[Target] = field(default_factory=set)
    attempts: int = 0
    refresh: bool = False
    last_error: BaseException = field(default_factory=lambda: NoWritablePartition("no attempt"))

    def next(self, layout: WritableLayout | None, now: float) -> Target | float | None:
        """The target to send to now; or seconds to pause, after which the adapter looks the
        topic up again (`refresh`) and asks again; or None: give up (the deadline passed)."""
        target = None
        if layout is not None:
            target = self.router.choose(layout, self.key, self.partition, self.tried, now)
            if target is None:
                keyed = self.partition is not None or self.key is not None
                self.last_error = NoWritablePartition(
                    f"nsqlookupd lists no writable partition of topic {self.topic!r}"
                    + (" for this key/partition" if keyed else "")
                )
        if target is None or target in self.tried:
            remaining = self.deadline - now
            if remaining <= 0:
                return None
            pause = min(self.backoff, remaining)
            self.backoff = min(self.backoff * 2, self.backoff_max)
            self.tried.clear()
            self.refresh = True
            return pause
        self.attempts += 1
        return target

    def lookup_failed(self, error: BaseException) -> None:
        self.last_error = error

    def failed(self, target: Target, error: BaseException, now: float) -> bool:
        """A retryable failure at `target`; False when the deadline passed (give up)."""
        self.last_error = error
        self.tried.add(target)
        self.router.refused(self.topic, target, now)
        self.refresh = True
        return now < self.deadline


class PublishRun:
    """One smart publish from its first attempt to its answer, the same for every front end
    (the blocking and the trio producers drive it): it says where to send (`next`), what to
    send there (`command`), and what an error reply or a lost answer means for the publish
    (`answered_with_error`, `answer_lost`); the front end does the I/O and the waiting."""

    def __init__(
        self,
        router: PublishRouter,
        sequences: "ProducerSequences",
        topic: str,
        bodies: list[bytes],
        key: Key | None,
        partition: int | None,
        now: float,
        timeout: float,
        backoff: tuple[float, float],
        ext_headers: list[bytes] | None = None,
    ) -> None:
        if key is not None and partition is not None:
            raise ValueError("give key or partition, not both")
        self.topic = topic
        self.started = now
        self.attempts = PublishAttempts(
            router, topic, key, partition, now + timeout, backoff[0], backoff[1]
        )
        self.sequenced = SequencedPublish(
            sequences,
            topic,
            bodies,
            self.attempts,
            key is not None or partition is not None,
            ext_headers=ext_headers,
        )

    def take_refresh(self) -> bool:
        """Whether the next layout must be looked up afresh (asked once per round)."""
        refresh, self.attempts.refresh = self.attempts.refresh, False
        return refresh

    def lookup_failed(self, error: BaseException) -> None:
        self.attempts.lookup_failed(error)

    def next(self, layout: WritableLayout | None, now: float) -> Target | float | None:
        """`PublishAttempts.next`: a target, seconds to wait, or None: give up."""
        return self.attempts.next(layout, now)

    def command(self, partition: int | None, identify_reply: dict) -> bytes:
        return self.sequenced.command(partition, identify_reply)

    def answered_with_error(self, error: Exception, target: Target, now: float) -> str:
        """An error reply from `target` (`error.code`, `error.text`: nsqd's): `resend` (the
        sequences moved: send again now), `retry` (a refusal a new lookup may fix, recorded),
        `give up` (so, and the deadline passed) or `raise` (no retry fixes it)."""
        code, text = getattr(error, "code", ""), getattr(error, "text", str(error))
        if self.sequenced.refused(code, text):
            return "resend"
        if code not in RETRYABLE_ERRORS:
            return "raise"
        return "retry" if self.attempts.failed(target, error, now) else "give up"

    def answer_lost(self, error: BaseException, target: Target, now: float) -> bool:
        """The attempt got no answer (a broken or silent connection): whether to go on."""
        self.sequenced.answer_lost()
        return self.attempts.failed(target, error, now)

    def failure(self, now: float) -> tuple[str, BaseException, int, float]:
        """The publish gives up: (topic, last error, attempts, seconds spent), for the front
        end's `PublishFailed`."""
        self.sequenced.gave_up()
        attempts = self.attempts
        return self.topic, attempts.last_error, attempts.attempts, now - self.started


def targets_of(layout: TopicLayoutLike) -> Targets:
    """A smart lookup's layout as targets."""
    if layout.partitions:
        targets = tuple(
            Target(address, partition) for partition, address in layout.partitions.items()
        )
    else:
        targets = tuple(Target(address) for address in layout.classic_nodes)
    return Targets(targets, layout.ordered, layout.extend_support)


# -- idempotent publishing ---------------------------------------------------------------------


class ProducerSequences:
    """A producer's sequences on each partition it publishes to idempotently (PUB_SEQ and
    MPUB_SEQ, docs/protocol.md §3.10), shared by its threads or tasks: the ID each partition's
    sequences run under and the next one, and the topics that take plain publishes.
    `producer_id`: the ID the sequences start under (default: a new `smart-<32 hex>`);
    `idempotent=False`: every publish goes plain."""

    def __init__(self, producer_id: str | None = None, *, idempotent: bool = True) -> None:
        self.producer_id = producer_id or f"smart-{uuid.uuid4().hex}"
        self.idempotent = idempotent
        self._next: dict[tuple[str, int], tuple[str, int]] = {}
        self._restarts = 0
        self._plain_topics: set[str] = set()
        self._lock = threading.Lock()

    def claim(self, topic: str, partition: int, count: int) -> tuple[str, int]:
        """The producer ID and first sequence of the partition's next `count` messages."""
        with self._lock:
            producer_id, first = self._next.get((topic, partition), (self.producer_id, 0))
            self._next[(topic, partition)] = (producer_id, first + count)
            return producer_id, first

    def restart(self, topic: str, partition: int, producer_id: str) -> None:
        """The partition's next publishes go under a new producer ID from 0 (unless another
        publish moved it on already): what was claimed under `producer_id` may never arrive."""
        with self._lock:
            current = self._next.get((topic, partition), (self.producer_id, 0))[0]
            if current == producer_id:
                self._restarts += 1
                self._next[(topic, partition)] = (f"{self.producer_id}-{self._restarts}", 0)

    def identify(self, settings: dict) -> dict:
        """A connection's IDENTIFY `settings`, asking nsqd for sequenced publishes when
        idempotent."""
        return {**settings, "idempotent_publish": True} if self.idempotent else settings

    def takes_plain(self, topic: str) -> bool:
        return topic in self._plain_topics

    def plain(self, topic: str) -> None:
        """An nsqd refused a sequenced publish to `topic` (a classic topic)."""
        with self._lock:
            self._plain_topics.add(topic)


@dataclass
class SequencedPublish:
    """One publish's sequences (`ProducerSequences`), through its attempts: claimed when it
    is first sent sequenced to a partition, and sent the same on every retry to that
    partition, which the publish then keeps to (elsewhere the sequences mean nothing), unless
    a refusal says it was not stored."""

    sequences: ProducerSequences
    topic: str
    bodies: list[bytes]
    attempts: PublishAttempts
    # The caller chose the partition (a key, or `partition=`): it never moves.
    pinned: bool
    # (partition, producer ID, first sequence) once claimed.
    claim: tuple[int, str, int] | None = None
    # An attempt went unanswered (a broken or silent connection), or was refused by a leader
    # that had sent it to followers before it gave up (`MAYBE_STORED`): the publish may be
    # stored, so it keeps its claim whatever later attempts are told, or a retry under a new
    # claim would store it twice.
    unanswered: bool = False
    # An ext topic's messages: each one's JSON header (MPUB_EXT_SEQ, or MPUB_EXT).
    ext_headers: list[bytes] | None = None

    def command(self, partition: int | None, identify_reply: dict) -> bytes:
        """The publish to send to `partition` (None: a classic topic's nsqd) on a connection
        whose IDENTIFY answer is `identify_reply`: PUB_SEQ, MPUB_SEQ or MPUB_EXT_SEQ when the
        producer is idempotent and the nsqd serves them, else PUB, MPUB or MPUB_EXT."""
        topic, bodies = self.topic, self.bodies
        sequences = self.sequences
        served = sequences.idempotent and bool(identify_reply.get("idempotent_publish"))
        if partition is None or not served or sequences.takes_plain(topic):
            extra = () if partition is None else (partition,)
            if self.ext_headers is not None:
                return encode_mpub_ext(topic, bodies, self.ext_headers, *extra)
            if len(bodies) == 1:
                return encode_pub(topic, bodies[0], *extra)
            return encode_mpub(topic, bodies, *extra)
        if self.claim is None or self.claim[0] != partition:
            self.claim = (partition, *self.sequences.claim(topic, partition, len(bodies)))
            self.attempts.partition = partition
        _partition, producer_id, first = self.claim
        if self.ext_headers is not None:
            return encode_mpub_ext_seq(
                topic, partition, producer_id, first, bodies, self.ext_headers
            )
        if len(bodies) == 1:
            return encode_pub_seq(topic, partition, producer_id, first, bodies[0])
        return encode_mpub_seq(topic, partition, producer_id, first, bodies)

    def refused(self, code: str, text: str = "") -> bool:
        """After nsqd refused it with `code` (its whole answer `text`): True when it is to be
        sent again at once (E_NOT_LOG_TOPIC: plainly; E_SEQUENCE_GAP: the partition forgot the
        producer, so under a new one). A retryable refusal of a publish the leader did not
        write stored nothing: an unpinned publish may go to another partition, whose next
        publishes start afresh. One that says `MAYBE_STORED` (docs/protocol.md §3.10: the
        leader sent it to followers, one of which may lead now), or any after an attempt that
        went unanswered (`answer_lost`), leaves it with its claim, as Kafka's idempotent
        producer keeps a batch's sequence: the partition's next leader stores it or says it
        holds it."""
        if MAYBE_STORED in text.split(" ", 2)[1:2]:
            self.answer_lost()
        if code == "E_NOT_LOG_TOPIC":
            self.sequences.plain(self.topic)
            self.claim = None
            return True
        if code == "E_SEQUENCE_GAP" and self.claim is not None:
            self._restart()
            return True
        if code in RETRYABLE_ERRORS and self.claim is not None and not self.pinned:
            if self.unanswered:
                return False  # its partition's next leader tells whether it holds it
            self._restart()
            self.attempts.partition = None
        return False

    def answer_lost(self) -> None:
        """An attempt was sent, or may have been, and no answer came (or one that says it
        may be stored): it may be stored."""
        if self.claim is not None:
            self.unanswered = True

    def gave_up(self) -> None:
        """The publish failed for good: stored or not, nobody knows, so its partition's next
        publish starts afresh."""
        if self.claim is not None:
            self._restart()

    def _restart(self) -> None:
        assert self.claim is not None
        self.sequences.restart(self.topic, self.claim[0], self.claim[1])
        self.claim = None


def consume_starts(start_from: "str | dict[int, str] | None") -> dict[int | None, str]:
    """A consumer's `start_from`: one consume start for every partition, or one per
    partition, each `<type>:<value>` (`timestamp` unix seconds, `virtual_queue` a byte offset,
    `msgcount` a message count, `special:-1` the end); ValueError for anything else."""
    if start_from is None:
        return {}
    if isinstance(start_from, str):
        starts: dict[int | None, str] = {None: start_from}
    else:
        starts = {int(partition): start for partition, start in start_from.items()}
    for start in starts.values():
        try:
            parse_consume_offset(start)  # as nsqd reads SUB_ADVANCED's
        except ValueError:
            raise ValueError(f"a consume start is <type>:<integer>, not {start!r}") from None
    return starts


def consumer_identify(identify: dict | None, desired_tag: str) -> dict:
    """A consumer's IDENTIFY settings: its own, with Youzan's `desired_tag` when it filters
    by tag."""
    return {**(identify or {}), **({"desired_tag": desired_tag} if desired_tag else {})}


def consumer_plan(
    start_from: "str | dict[int, str] | None",
    lookup_interval: float,
    backoff_initial: float,
    backoff_max: float,
    ordered: bool | None = None,
    idle_lookup_interval: float | None = None,
) -> SubscriptionPlan:
    """A consumer front end's `SubscriptionPlan`, `start_from` read by `consume_starts`
    (ValueError for a bad start)."""
    return SubscriptionPlan(
        lookup_interval=lookup_interval,
        backoff_initial=backoff_initial,
        backoff_max=backoff_max,
        ordered=ordered,
        idle_lookup_interval=idle_lookup_interval,
        start_from=consume_starts(start_from),
    )
