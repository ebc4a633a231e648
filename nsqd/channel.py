"""A channel: its own copy of every message of its topic, shared out among its clients.

Messages wait in the channel's queue (`nsqd/message_queue.py`: memory up to
`--mem-queue-size`, then the diskqueue `<topic>:<channel>`, as Go names it). A delivered message
is in flight until FIN, REQ or its timeout; REQ with a delay and DPUB hold it in the deferred
queue. How many may be out at once and where a redelivery goes is the channel's delivery policy
(`nsqd/delivery.py`). Clients' message pumps take batches with `take()`; a pump with room and
nothing to take waits in `_waiting` and is woken when messages arrive (docs/design.md §3.3).
"""

import math
import time
from collections import Counter
from collections.abc import Sequence
from typing import TYPE_CHECKING

import trio

from nsqpy.common.names import is_ephemeral
from nsqpy.nsqd import dead_letters
from nsqpy.nsqd.backend import BackendWriteError
from nsqpy.nsqd.cursor_queue import CursorQueue
from nsqpy.nsqd.deferred_queue import DeferredQueue
from nsqpy.nsqd.delivery import FIFO, ORDERED
from nsqpy.nsqd.e2e import LatencyStream, merged_result
from nsqpy.nsqd.inflight import DeadlineQueue
from nsqpy.nsqd.message import Message, MessageBatch
from nsqpy.nsqd.message_queue import MessageQueue
from nsqpy.nsqd.rate_limit import RateLimit
from nsqpy.nsqd.replication import SINGLE_NODE
from nsqpy.nsqd.tag_dispatch import TagDispatch

if TYPE_CHECKING:
    from nsqpy.nsqd.client import Client
    from nsqpy.nsqd.topic import Topic

# A channel's flags (the first of `Channel.controls`): Youzan's skip, and delivery in order
# on a topic that is not ordered (`/channel/setorder`, SUB_ORDERED).
SKIPPED = 1
IN_ORDER = 2


# Delayed messages a queue scan releases from the delay queue per channel at most.
_RELEASE_BATCH = 1000


# Youzan's MAX_MEM_REQ_TIMES: a message requeued with a delay after more attempts than this
# waits in the delay queue (one that keeps coming back would hold the cursor each time).
MAX_MEMORY_REQUEUES = 10


class ChannelError(Exception):
    """Why FIN, REQ or TOUCH could not act on a message; the text is Go's."""


class Channel:
    def __init__(self, topic: "Topic", name: str) -> None:
        nsqd = topic.nsqd
        self.topic = topic
        self.topic_name = topic.name
        self.name = name
        self.nsqd = nsqd
        self.ephemeral = is_ephemeral(name)
        self.in_flight = DeadlineQueue()
        # Deferred messages as compact entries (`nsqd/deferred_queue.py`), unless a delay
        # queue takes them (below: it moves them by identity).
        self.deferred: DeadlineQueue | DeferredQueue = DeferredQueue()
        # What waits to be delivered (`nsqd/message_queue.py`), from the topic's engine: Go's
        # memory and diskqueue, or a cursor into the partition's log.
        self.queue: MessageQueue = topic.queue.open_channel_queue(
            name,
            ephemeral=self.ephemeral,
            deferred=lambda: iter(self.deferred),
            defer=self._defer_read,
            ordered=lambda: self.delivery.ordered,
        )
        # A log topic's channel whose delayed messages the partition's delay queue keeps
        # (`nsqd/delay_queue.py`), as a cursor into the log; None otherwise.
        self.cursor: CursorQueue | None = None
        if isinstance(self.queue, CursorQueue) and self.queue.delay_queue is not None:
            self.cursor = self.queue
            self.deferred = DeadlineQueue()
            self.queue.on_window_full = self._move_deferred_to_end
            self.queue.on_moved = self._moved
            self.queue.on_move_failed = self._move_failed
            if topic.replication is not SINGLE_NODE:
                # A cluster's partition: from its first delayed message finished or emptied,
                # whatever the followers have not heard of yet is kept for them (a finish
                # before the leader's first push with followers in its ISR is not lost).
                self.queue.finished_delayed = []
        # IDs of deferred messages whose move to the delay queue is being written.
        self._moving: set[bytes] = set()
        # Poison messages (`nsqd/dead_letters.py`): the channel's own attempt limit (None: the
        # flag's), its dead-letter topic once chosen, how many went there since the start,
        # and the replayed messages being written for it, by ID, with where they came from.
        self.max_attempts: int | None = None
        self.dead_letter_topic = ""
        self.dead_letter_count = 0
        self.replaying: dict[bytes, tuple[Channel, Message]] = {}
        self.clients: dict[int, Client] = {}
        self.paused = False
        # Youzan's skip (`/channel/skip`): what is published meanwhile is dropped, not held.
        self.skipped = False
        # Youzan's `/channel/ratelimit`: the channel's own limit in KiB/s (None: the
        # daemon's `--channel-ratelimit-kb`), and the bucket that enforces whichever applies.
        self.rate_limit_kb: int | None = None
        self.rate_limit: RateLimit | None = None
        self._apply_rate_limit()
        # Youzan's `/channel/setclientlimit`: a RDY cap for the consumers whose address starts
        # with each prefix, in the order they were set (a later one wins).
        self.client_limits: dict[str, int] = {}
        self.deleted = False
        # Youzan ordered topics deliver in order to every channel; SUB_ORDERED switches one.
        self.delivery = ORDERED if topic.ordered else FIFO
        # Youzan ext topics deliver by `##client_dispatch_tag` (nsqd/tag_dispatch.py).
        self.tags = TagDispatch() if topic.ext else None
        # The `desired_tag`s of the channel's consumers, with how many have each.
        self._client_tags: Counter[str] = Counter()
        self.message_count = 0
        self.requeue_count = 0
        self.timeout_count = 0
        # Pumps with room waiting for messages: a list to pick one at random in O(1), and
        # their IDs to know who is in it. Both the channel's own: a consumer is only told
        # `wake()`.
        self._waiting: list[Client] = []
        self._waiting_ids: set[int] = set()
        percentiles = nsqd.options.e2e_processing_latency_percentile
        self.e2e = (
            LatencyStream(percentiles, nsqd.options.e2e_processing_latency_window_time, nsqd.random)
            if percentiles
            else None
        )

    # -- putting messages in ------------------------------------------------------------

    def put_messages(
        self, messages: "list[Message] | MessageBatch", now: float, *, strict: bool = False
    ) -> BackendWriteError | None:
        """Messages fanned out from the topic; DPUB ones go to the deferred queue (a
        MessageBatch never has one). See `_put` for what a failed diskqueue write does."""
        self.message_count += len(messages)
        if type(messages) is list and (messages[0].defer or messages[-1].defer):
            ready = []
            for message in messages:
                if message.defer:
                    self.deferred.push(message, now + message.defer)
                else:
                    ready.append(message)
            if not ready:
                return None
            messages = ready
        return self._put(messages, strict=strict)

    def _put(
        self, messages: "list[Message] | MessageBatch", *, strict: bool = False
    ) -> BackendWriteError | None:
        """Into the queue, and a waiting pump woken (MessageQueue.append says what a failed
        write does with and without `strict`)."""
        error = self.queue.append(messages, strict=strict)
        self.notify()
        return error

    @property
    def depth(self) -> int:
        if self.tags is not None:
            return self.queue.depth + self.tags.count
        return self.queue.depth

    @property
    def backend_depth(self) -> int:
        return self.queue.backend_depth

    @property
    def ordered(self) -> bool:
        return self.delivery.ordered

    def deliver_in_order(self) -> None:
        """SUB_ORDERED: from now on the channel delivers in order (docs/protocol.md §3.5)."""
        self.delivery = ORDERED

    @property
    def in_order(self) -> bool:
        """Whether the channel delivers in order on a topic that does not (`/channel/setorder`,
        SUB_ORDERED): its own choice, kept and replicated."""
        return self.delivery.ordered and not self.topic.ordered

    @property
    def controls(self) -> list:
        """The channel's own controls as a cluster leader sends them after its position:
        none when it has none, else the flags (`SKIPPED`, `IN_ORDER`), then when set its
        rate limit (-1: the daemon's) and its consumers' limits as `[prefix, ready]`."""
        flags = (SKIPPED if self.skipped else 0) | (IN_ORDER if self.in_order else 0)
        if self.rate_limit_kb is None and not self.client_limits:
            return [flags] if flags else []
        rate = -1 if self.rate_limit_kb is None else self.rate_limit_kb
        return [flags, rate, [[prefix, ready] for prefix, ready in self.client_limits.items()]]

    def take_controls(self, flags: int = 0, rate: int = -1, client_limits: Sequence = ()) -> None:
        """A follower takes its leader's controls (as `controls` gives them)."""
        self.skipped = bool(flags & SKIPPED)
        self.delivery = ORDERED if flags & IN_ORDER or self.topic.ordered else FIFO
        rate_limit_kb = None if rate < 0 else rate
        if rate_limit_kb != self.rate_limit_kb:
            self.set_rate_limit(rate_limit_kb)
        self.client_limits = {}
        for prefix, ready in client_limits:
            self.limit_clients(str(prefix), int(ready))

    def set_rate_limit(self, kilobytes: int | None) -> None:
        """The channel's own delivery limit in KiB/s, or the daemon's again (None)."""
        self.rate_limit_kb = kilobytes
        self._apply_rate_limit()

    def _apply_rate_limit(self) -> None:
        kilobytes = self.rate_limit_kb
        if kilobytes is None:
            kilobytes = self.nsqd.options.channel_ratelimit_kb
        if kilobytes <= 0:
            self.rate_limit = None
        elif self.rate_limit is None:
            self.rate_limit = RateLimit(kilobytes, trio.current_time())
        else:
            self.rate_limit.change(kilobytes, trio.current_time())
        for client in self.clients.values():
            client.wakeup.set()

    def fix_confirmed(self) -> None:
        """Youzan's `/channel/fixconfirmed`: a log topic's channel reads again, from its
        confirmed position, what it neither holds nor has acknowledged (nothing, unless it
        lost track of a message); as Youzan's, not while paused, skipped or in order."""
        queue = self.queue
        if self.paused or self.skipped or self.ordered or not isinstance(queue, CursorQueue):
            return
        held = {message.id for message in self.in_flight}
        held.update(message.id for message in self.deferred)
        held.update(self._moving)
        queue.reread(held)
        self.notify()

    def limit_clients(self, prefix: str, ready: int) -> None:
        """Youzan's `/channel/setclientlimit`: the consumers whose address starts with
        `prefix` have at most `ready` messages in flight, whatever their RDY; kept for those
        that subscribe later too."""
        self.client_limits.pop(prefix, None)
        self.client_limits[prefix] = ready
        for client in self.clients.values():
            if client.remote_address.startswith(prefix):
                client.set_limited_ready(ready)

    def set_order(self, ordered: bool) -> None:
        """Youzan's `/channel/setorder`: in order from the next message on; back to FIFO, its
        consumers are disconnected (they subscribe again as the consumers they are)."""
        if ordered:
            self.delivery = ORDERED
            return
        if not self.delivery.ordered:
            return
        self.delivery = FIFO
        for client in list(self.clients.values()):
            client.close_by_server()

    def has_messages(self) -> bool:
        if self.tags is not None and self.tags.count:
            return True
        return self.queue.has_messages()

    # -- taking messages out --------------------------------------------------------------

    def take(self, max_count: int, tag: str = "") -> list[Message]:
        """Up to `max_count` messages to deliver, as many as the delivery policy lets out; on
        an ext topic, only those for a consumer whose `desired_tag` is `tag`. Messages past
        the channel's attempt limit go to its dead-letter topic instead."""
        while True:
            taken = self._take(max_count, tag)
            if not taken or not (self.max_attempts or self.nsqd.options.max_attempts):
                return taken
            limit = dead_letters.attempt_limit(self)
            if not limit or all(message.attempts < limit for message in taken):
                return taken
            poison = [message for message in taken if message.attempts >= limit]
            if not dead_letters.send(self, poison, limit):
                return taken
            if self.delivery.finish_releases_next:
                self.notify()
            deliver = [message for message in taken if message.attempts < limit]
            if deliver:
                return deliver
            # None is left: what followed them goes now.

    def _take(self, max_count: int, tag: str) -> list[Message]:
        if self.skipped:
            self._skip_ahead()
            return []
        count = self.delivery.room(len(self.in_flight), max_count)
        if not count:
            return []
        if self.tags is not None:
            taken, woken = self.tags.take(tag, count, self._take_from_queue, self._client_tags)
            for other in woken:
                self._notify_tag(other)
            return taken
        return self._take_from_queue(count)

    def _take_from_queue(self, count: int) -> list[Message]:
        return self.queue.take(count)

    def _defer_read(self, message: Message, delay: float) -> None:
        """A DPUB read from a log: held in the deferred queue for its first delivery."""
        self.deferred.push(message, trio.current_time() + delay)

    def start_in_flight(
        self, messages: list[Message], client_id: int, timeout: float, now: float
    ) -> None:
        for message in messages:
            message.attempts += 1
            message.deliver_at = now
            message.client_id = client_id
        self.in_flight.push_batch(messages, now + timeout)

    def wait_for_messages(self, client: "Client") -> None:
        """Register a pump that has room; `notify` wakes one when messages arrive."""
        if client.id not in self._waiting_ids:
            self._waiting_ids.add(client.id)
            self._waiting.append(client)

    def stop_waiting(self, client: "Client") -> None:
        if client.id in self._waiting_ids:
            self._waiting_ids.discard(client.id)
            self._waiting.remove(client)

    def notify(self) -> None:
        """Wake one waiting pump, chosen at random as Go's select among clients is random.

        The woken pump takes what it can and, if messages remain, notifies again; so a burst
        spreads over as many clients as it needs and a lone message wakes only one.
        """
        if self.skipped:
            self._skip_ahead()
            return
        waiting = self._waiting
        if not waiting or self.paused:
            return
        if self.tags is not None:
            # The consumers of the tags with messages waiting for them, then one at random
            # to read on (unless what waits has filled the dispatch).
            for tag in self.tags.waiting_tags(self._client_tags):
                self._notify_tag(tag)
            if not self._waiting or self.tags.full() or not self.queue.has_messages():
                return
            waiting = self._waiting
        if self.has_messages():
            index = self.nsqd.random.randrange(len(waiting))
            waiting[index], waiting[-1] = waiting[-1], waiting[index]
            client = waiting.pop()
            self._waiting_ids.discard(client.id)
            client.wake()

    def _notify_tag(self, tag: str) -> None:
        """Wake one waiting pump whose consumer's `desired_tag` is `tag`, if one waits."""
        for index, client in enumerate(self._waiting):
            if client.desired_tag == tag:
                del self._waiting[index]
                self._waiting_ids.discard(client.id)
                client.wake()
                return

    def notify_all(self) -> None:
        waiting, self._waiting = self._waiting, []
        self._waiting_ids.clear()
        for client in waiting:
            client.wake()

    # -- FIN, REQ, TOUCH ----------------------------------------------------------------

    def _owned_in_flight(self, client_id: int, message_id: bytes) -> Message:
        """The in-flight message, if this client owns it; Go's error texts otherwise."""
        message = self.in_flight.get(message_id)
        if message is None or message.client_id != client_id:
            raise _not_owned(message)
        return message

    def _pop_in_flight(self, client_id: int, message_id: bytes) -> Message:
        message = self._owned_in_flight(client_id, message_id)
        self.in_flight.pop(message_id)
        return message

    def finish(self, client_id: int, message_id: bytes) -> None:
        """FIN; ChannelError with Go's reason when it cannot be."""
        failures = self.finish_many(client_id, [message_id])
        if failures:
            raise failures[0][1]

    def finish_many(
        self, client_id: int, message_ids: list[bytes]
    ) -> list[tuple[bytes, ChannelError]]:
        """FIN of each of `message_ids` in turn (a consumer's batched FINs); returns those that
        failed, in order, with Go's reason."""
        in_flight = self.in_flight
        by_id = in_flight.get
        acknowledge = self.queue.acknowledge
        e2e = self.e2e
        failures: list[tuple[bytes, ChannelError]] = []
        for message_id in message_ids:
            message = by_id(message_id)
            if message is None or message.client_id != client_id:
                failures.append((message_id, _not_owned(message)))
                continue
            in_flight.pop(message_id)
            acknowledge(message)
            if e2e is not None:
                e2e.insert(time.time_ns() - message.timestamp, trio.current_time())
        if len(failures) < len(message_ids):
            if self.delivery.finish_releases_next:
                self.notify()  # the next message may go now, to whichever client is waiting
            self.topic.replication.cursor_moved()
        return failures

    def e2e_result(self, now: float) -> dict:
        percentiles = self.nsqd.options.e2e_processing_latency_percentile
        return merged_result(percentiles, [self.e2e] if self.e2e else [], now)

    def requeue(self, client_id: int, message_id: bytes, delay: float, now: float) -> bool:
        """False when the REQ was ignored: the delivery policy kept the message in flight
        (Youzan's ordered channels on `REQ id <ms>` with ms > 0, until the timeout)."""
        if self.delivery.keeps_in_flight(delay):
            if self.in_flight.get(message_id) is None:
                raise ChannelError("ID not in flight")
            return False
        message = self._pop_in_flight(client_id, message_id)
        self.requeue_count += 1
        if delay > 0:
            self.deferred.push(message, now + delay)
            cursor = self.cursor
            long_delay = delay >= self.nsqd.options.req_to_end_threshold
            if (
                cursor is not None
                and not self.delivery.ordered
                and (
                    (long_delay and self._delay_queue_takes(cursor, limit_reached=False))
                    or (
                        (
                            cursor.window_full
                            or (message.attempts > MAX_MEMORY_REQUEUES and delay >= 1.0)
                        )
                        and self._delay_queue_takes(cursor, limit_reached=True)
                    )
                )
            ):
                # Youzan's requeue to the end: the message waits in the delay queue, and the
                # cursor goes on.
                self._move_to_end(message, delay)
            # The delay reaches a cluster's followers at once (coalesced), so that a new
            # leader holds the message until it is due, as a DPUB's.
            self.topic.replication.cursor_moved()
        else:
            self._redeliver([message])
        return True

    def _delay_queue_takes(self, cursor: CursorQueue, *, limit_reached: bool) -> bool:
        """Youzan's `--max-channel-delayed-qnum`: a long REQ goes to the delay queue while the
        channel has fewer delayed messages than it; a move that keeps the cursor going (a
        full window, a message requeued again and again) while it has at most ten times as
        many; past that, deferrals stay in memory."""
        limit = self.nsqd.options.max_channel_delayed_qnum
        if not limit:
            return True
        count = cursor.delayed_count
        return count <= 10 * limit if limit_reached else count < limit

    def _move_to_end(self, message: Message, delay: float) -> None:
        assert self.cursor is not None
        if message.id not in self._moving and self.cursor.move_to_end(message, delay):
            self._moving.add(message.id)

    def _move_deferred_to_end(self) -> None:
        """The window filled: what waits in memory holds the cursor back, so it moves to the
        delay queue (an ordered channel keeps its order instead)."""
        cursor = self.cursor
        assert cursor is not None  # the cursor calls it
        if self.delivery.ordered or not self._delay_queue_takes(cursor, limit_reached=True):
            return
        now = trio.current_time()
        for message in list(self.deferred):
            self._move_to_end(message, max(0.0, message.deadline - now))

    def _moved(self, message: Message) -> bool:
        """A move was written: the message now waits in the delay queue, not in memory. False
        when the channel no longer held it deferred (it came due and went out meanwhile)."""
        if message.id in self.replaying:
            dead_letters.replayed(self, message, written=True)
            return True
        self._moving.discard(message.id)
        if self.deferred.get(message.id) is message:
            self.deferred.pop(message.id)
            if self.cursor is not None and self.cursor.window_full:
                # Acknowledged once this returns, the original may open the window: the
                # pumps look again (no FIN or REQ may come to wake them).
                self.notify()
            return True
        # Its copy leaves the delay queue (`CursorQueue`): the followers must hear of it.
        self.topic.replication.cursor_moved()
        return False

    def _move_failed(self, message: Message) -> None:
        if message.id in self.replaying:
            dead_letters.replayed(self, message, written=False)
        self._moving.discard(message.id)

    def put_replayed(self, messages: list[Message]) -> None:
        """Dead-letter messages put back (`dead_letters.replay`), on a classic topic."""
        self._put(messages)

    def _redeliver(self, messages: list[Message]) -> None:
        self.delivery.redeliver(self.queue, messages)
        self.notify()

    def skip_queued(self) -> None:
        """Start at the end, skipping what is queued now."""
        self._drop_held()
        self.queue.skip_to_end()

    def _drop_held(self) -> None:
        if self.tags is not None:
            self.tags.clear()

    def seek(self, kind: str, value: int) -> None:
        """SUB_ADVANCED's start and `/channel/setoffset`: deliver from a consume offset on
        (docs/protocol.md §3.8); consumers are woken. ValueError if the queue cannot."""
        self.queue.seek(kind, value)
        self._drop_held()
        self.notify_all()
        for client in self.clients.values():
            client.wake()

    def touch(self, client_id: int, message_id: bytes, msg_timeout: float, now: float) -> None:
        message = self._owned_in_flight(client_id, message_id)
        deadline = now + msg_timeout
        # Go caps the extension at delivery time + --max-msg-timeout.
        cap = message.deliver_at + self.nsqd.options.max_msg_timeout
        self.in_flight.reschedule(message, min(deadline, cap))

    # -- the queue-scan's work ------------------------------------------------------------

    def process_in_flight(self, now: float) -> bool:
        """Requeue timed-out messages; True when there was work (Go's "dirty")."""
        expired = self.in_flight.pop_due(now)
        if not expired:
            return False
        self.timeout_count += len(expired)
        for message in expired:
            client = self.clients.get(message.client_id)
            if client is not None:
                client.timed_out_message()
        self._redeliver(expired)
        return True

    def process_deferred(self, now: float) -> bool:
        released = False
        cursor = self.cursor
        if cursor is not None and not self.topic.is_cluster_follower:
            # Released ones wait in memory to go out: no more than a batch at a time.
            room = _RELEASE_BATCH - len(cursor.redeliver)
            if room > 0 and cursor.release_due(room):
                self.notify()
                released = True
        due = self.deferred.pop_due(now)
        if not due:
            return released
        self._put(due)
        return True

    @property
    def delayed_count(self) -> int:
        """Messages in the partition's delay queue for this channel (Youzan's
        `delayed_queue_count`)."""
        return self.cursor.delayed_count if self.cursor is not None else 0

    def empty_delayed(self) -> int:
        """`/channel/emptydelayed`: the channel's delayed messages go; how many."""
        return self.cursor.empty_delayed() if self.cursor is not None else 0

    def requeue_delayed(self) -> int:
        """`/channel/requeuedelayed`: every message the channel holds for a delay, in memory
        or in the delay queue, is due now; how many."""
        waiting = self.deferred.pop_due(math.inf)
        if waiting:
            self._redeliver(waiting)
        return len(waiting) + (self.cursor.requeue_delayed() if self.cursor is not None else 0)

    # -- finishing by ID (Youzan's /message/finish) ---------------------------------------

    def finish_force(self, message_id: bytes) -> bool:
        """Finish a message whoever holds it: in flight, deferred in memory or waiting in the
        delay queue. False if the channel holds no such message."""
        message = self.in_flight.get(message_id)
        if message is not None:
            self.in_flight.pop(message_id)
            client = self.clients.get(message.client_id)
            if client is not None:
                client.finished_message()
        else:
            message = self.deferred.get(message_id)
            if message is not None:
                self.deferred.pop(message_id)
        if message is not None:
            self.queue.acknowledge(message)
            if self.delivery.finish_releases_next:
                self.notify()
        elif self.cursor is None or not self.cursor.finish_delayed(message_id):
            return False
        self.topic.replication.cursor_moved()
        return True

    def finish_unsent(self, messages: list[Message]) -> None:
        """Messages taken for a consumer whose `ext_filter` leaves them out: finished for the
        channel without going in flight (Youzan's ConfirmMsgWithoutGoInflight)."""
        for message in messages:
            self.queue.acknowledge(message)
        self.topic.replication.cursor_moved()

    def finish_memory_delayed(self) -> list[bytes]:
        """Youzan's `/channel/finishmemdelayed`: the messages deferred in memory are
        finished; their IDs."""
        finished = [message.id for message in list(self.deferred)]
        for message_id in finished:
            self.finish_force(message_id)
        return finished

    # -- clients --------------------------------------------------------------------------

    def add_client(self, client: "Client") -> None:
        limit = self.nsqd.options.max_channel_consumers
        if limit and client.id not in self.clients and len(self.clients) >= limit:
            raise ChannelError(
                f"consumers for {self.topic_name}:{self.name} exceeds limit of {limit}"
            )
        self.clients[client.id] = client
        if self.tags is not None and client.desired_tag:
            self._client_tags[client.desired_tag] += 1
        for prefix, ready in self.client_limits.items():
            if client.remote_address.startswith(prefix):
                client.set_limited_ready(ready)

    def remove_client(self, client: "Client") -> None:
        self.stop_waiting(client)
        if self.clients.pop(client.id, None) is None:
            return
        if self.tags is not None and client.desired_tag:
            tags = self._client_tags
            tags[client.desired_tag] -= 1
            if tags[client.desired_tag] <= 0:
                del tags[client.desired_tag]
                # What waits for the tag is now for the consumers without one.
                self.notify()
        if (self.queue.requeue_on_leave or self.ordered) and not self.deleted:
            # Youzan nsqd requeues a leaving consumer's in-flight messages at once
            # (RequeueClientMessages); Go's wait out --msg-timeout. An ordered channel hands
            # out nothing while a message is in flight, so waiting would stall it that long.
            leaving = [message for message in self.in_flight if message.client_id == client.id]
            for message in leaving:
                self.in_flight.pop(message.id)
            if leaving:
                self.requeue_count += len(leaving)
                self._redeliver(leaving)
        # Go deletes an ephemeral channel when its last client leaves.
        if self.ephemeral and not self.clients and not self.deleted:
            self.topic.delete_channel(self.name)

    # -- pause, empty, shutdown -------------------------------------------------------------

    def pause(self) -> None:
        self.paused = True

    def skip(self, skipped: bool = True) -> None:
        """Youzan's `/channel/skip` and `/channel/unskip`: either way the channel starts again
        at the end, its delayed messages dropped; while skipped it drops what arrives (and
        what comes back: requeues, deferrals that come due), so it delivers nothing."""
        self.skipped = skipped
        self.queue.skip_to_end()
        self._drop_held()
        self.empty_delayed()
        self.topic.replication.cursor_moved()
        if not skipped:
            self.notify_all()
            for client in self.clients.values():
                client.wake()

    def _skip_ahead(self) -> None:
        # A cluster follower's cursor goes where its leader's does.
        if self.queue.has_messages() and not self.topic.replication.is_follower:
            self.queue.skip_to_end()
            self.topic.replication.cursor_moved()

    def unpause(self) -> None:
        self.paused = False
        # Paused pumps were not waiting on the channel, so wake every client's pump.
        self.notify_all()
        for client in self.clients.values():
            client.wake()

    def empty(self) -> None:
        """Go's channel.Empty: drop queued and in-flight messages (clients' counts reset)."""
        self.in_flight.clear()
        self.deferred.clear()
        for client in self.clients.values():
            client.empty_in_flight()
        self._drop_held()
        self.queue.empty()

    def flush(self) -> int:
        """On shutdown: what waits, in flight and deferred is kept (Go's flush).

        In-flight and deferred messages are delivered again after the restart, so a message
        is never lost to a restart, only possibly repeated (at-least-once).
        """
        # The queue flushes first: a log topic's cursor reads the deferred queue to keep
        # each deferred message's due time.
        held = self.tags.drain() if self.tags is not None else []
        kept = self.queue.flush([*self.in_flight, *self.deferred, *held])
        self.in_flight.clear()
        self.deferred.clear()
        return kept

    def close(self) -> None:
        self.deleted = True
        self.notify_all()
        self.queue.close()

    def delete(self) -> None:
        """Go's channel.Delete: the messages and the diskqueue files go."""
        self.deleted = True
        self.in_flight.clear()
        self.deferred.clear()
        for client in list(self.clients.values()):
            client.channel_deleted()
        self._drop_held()
        self.notify_all()
        self.queue.delete()

    def __repr__(self) -> str:
        return f"Channel({self.topic_name}:{self.name})"


def _not_owned(message: Message | None) -> ChannelError:
    """Go's reason a FIN, REQ or TOUCH of a message that is not the client's fails."""
    if message is None:
        return ChannelError("ID not in flight")
    return ChannelError("client does not own message")
