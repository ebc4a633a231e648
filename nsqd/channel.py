"""A channel: its own copy of every message of its topic, shared out among its clients.

Messages wait in a bounded in-memory deque (`--mem-queue-size`) and, past it, in the
channel's diskqueue (`<topic>:<channel>`, as Go names it). A delivered message is in flight
until FIN, REQ or its timeout; REQ with a delay and DPUB hold it in the deferred queue.
Clients' message pumps take batches with `take()`; a pump with room and nothing to take
waits in `_waiting` and is woken when messages arrive (docs/design.md §3.3).
"""

import time
from collections import deque
from collections.abc import Iterable
from typing import TYPE_CHECKING

import trio

from common.names import is_ephemeral
from nsqd.backend import BackendWriteError
from nsqd.e2e import LatencyStream, merged_result
from nsqd.inflight import DeadlineQueue
from nsqd.message import Message

if TYPE_CHECKING:
    from nsqd.client import Client
    from nsqd.topic import Topic


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
        self.mem_queue_size = nsqd.options.mem_queue_size
        self.memory: deque[Message] = deque()
        # Go's `<topic>:<channel>`; a partition p > 0 names its channels `<topic>#<p>:<channel>`
        # so two partitions' channels never share files.
        self.backend = nsqd.open_backend(f"{topic.backend_name}:{name}", ephemeral=self.ephemeral)
        self.in_flight = DeadlineQueue()
        self.deferred = DeadlineQueue()
        self.clients: dict[int, Client] = {}
        self.paused = False
        self.deleted = False
        # Youzan ordered consumption: one message in flight, redeliveries first (§3.5).
        self.ordered = topic.ordered
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
        self, messages: list[Message], now: float, *, strict: bool = False
    ) -> BackendWriteError | None:
        """Messages fanned out from the topic; DPUB ones go to the deferred queue. See
        `_put` for what a failed diskqueue write does."""
        self.message_count += len(messages)
        if messages[0].defer or messages[-1].defer:
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

    def _put(self, messages: list[Message], *, strict: bool = False) -> BackendWriteError | None:
        """Go's channel.put: memory while it has room, then the diskqueue.

        If the diskqueue write fails (a full disk), health turns NOK and: with `strict`
        (a publish that is not acknowledged yet) the error is raised and none of the
        messages is kept; otherwise (messages nsqd already holds: from the topic's backlog,
        a requeue, a timeout) they stay in memory past `--mem-queue-size`, so none is lost,
        and the error is returned.
        """
        memory = self.memory
        room = self.mem_queue_size - len(memory)
        if room >= len(messages):
            memory.extend(messages)
        else:
            # The overflow first, so a failed write leaves nothing half-kept in memory.
            overflow = messages[room:] if room > 0 else messages
            try:
                self._write_to_backend(overflow)
            except BackendWriteError as error:
                if strict:
                    raise
                memory.extend(messages)
                self.notify()
                return error
            if room > 0:
                memory.extend(messages[:room])
        self.notify()
        return None

    def _write_to_backend(self, messages: Iterable[Message]) -> None:
        """BackendWriteError (health NOK) if the diskqueue write fails."""
        self.nsqd.write_to_backend(
            self.backend,
            messages,
            "CHANNEL(%s:%s) ERROR: failed to write messages to backend",
            self.topic_name,
            self.name,
        )

    @property
    def depth(self) -> int:
        return len(self.memory) + self.backend.depth

    @property
    def backend_depth(self) -> int:
        return self.backend.depth

    def has_messages(self) -> bool:
        return bool(self.memory) or self.backend.depth > 0

    # -- taking messages out --------------------------------------------------------------

    def take(self, max_count: int) -> list[Message]:
        """Up to `max_count` messages to deliver, memory first, then the diskqueue."""
        memory = self.memory
        if len(memory) >= max_count:
            popleft = memory.popleft
            return [popleft() for _ in range(max_count)]
        taken = list(memory)
        memory.clear()
        if len(taken) < max_count and self.backend.depth:
            from_record = Message.from_record
            taken.extend(from_record(r) for r in self.backend.get_many(max_count - len(taken)))
        return taken

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
        waiting = self._waiting
        if waiting and not self.paused and self.has_messages():
            index = self.nsqd.random.randrange(len(waiting))
            waiting[index], waiting[-1] = waiting[-1], waiting[index]
            client = waiting.pop()
            self._waiting_ids.discard(client.id)
            client.wake()

    def notify_all(self) -> None:
        waiting, self._waiting = self._waiting, []
        self._waiting_ids.clear()
        for client in waiting:
            client.wake()

    # -- FIN, REQ, TOUCH ----------------------------------------------------------------

    def _owned_in_flight(self, client_id: int, message_id: bytes) -> Message:
        """The in-flight message, if this client owns it; Go's error texts otherwise."""
        message = self.in_flight.get(message_id)
        if message is None:
            raise ChannelError("ID not in flight")
        if message.client_id != client_id:
            raise ChannelError("client does not own message")
        return message

    def _pop_in_flight(self, client_id: int, message_id: bytes) -> Message:
        message = self._owned_in_flight(client_id, message_id)
        self.in_flight.pop(message_id)
        return message

    def finish(self, client_id: int, message_id: bytes) -> Message:
        message = self._pop_in_flight(client_id, message_id)
        if self.ordered:
            self.notify()  # the next message may go now, to whichever client is waiting
        if self.e2e is not None:
            self.e2e.insert(time.time_ns() - message.timestamp, trio.current_time())
        return message

    def e2e_result(self, now: float) -> dict:
        percentiles = self.nsqd.options.e2e_processing_latency_percentile
        return merged_result(percentiles, [self.e2e] if self.e2e else [], now)

    def requeue(self, client_id: int, message_id: bytes, delay: float, now: float) -> bool:
        """False when the REQ was ignored: Youzan keeps a message of an ordered channel in
        flight on `REQ id <ms>` with ms > 0, until its timeout redelivers it."""
        if self.ordered and delay > 0:
            if self.in_flight.get(message_id) is None:
                raise ChannelError("ID not in flight")
            return False
        message = self._pop_in_flight(client_id, message_id)
        self.requeue_count += 1
        if self.ordered:
            self._redeliver_first([message])
        elif delay <= 0:
            self._put([message])
        else:
            self.deferred.push(message, now + delay)
        return True

    def _redeliver_first(self, messages: list[Message]) -> None:
        """An ordered channel's redelivery goes before everything queued."""
        self.memory.extendleft(reversed(messages))
        self.notify()

    def skip_queued(self) -> None:
        """SUB_ADVANCED special:-1: start at the end, skipping what is queued now."""
        self.memory.clear()
        self.backend.empty()

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
        if self.ordered:
            self._redeliver_first(expired)
        else:
            self._put(expired)
        return True

    def process_deferred(self, now: float) -> bool:
        due = self.deferred.pop_due(now)
        if not due:
            return False
        self._put(due)
        return True

    # -- clients --------------------------------------------------------------------------

    def add_client(self, client: "Client") -> None:
        limit = self.nsqd.options.max_channel_consumers
        if limit and client.id not in self.clients and len(self.clients) >= limit:
            raise ChannelError(
                f"consumers for {self.topic_name}:{self.name} exceeds limit of {limit}"
            )
        self.clients[client.id] = client

    def remove_client(self, client: "Client") -> None:
        self.stop_waiting(client)
        if self.clients.pop(client.id, None) is None:
            return
        # Go deletes an ephemeral channel when its last client leaves.
        if self.ephemeral and not self.clients and not self.deleted:
            self.topic.delete_channel(self.name)

    # -- pause, empty, shutdown -------------------------------------------------------------

    def pause(self) -> None:
        self.paused = True

    def unpause(self) -> None:
        self.paused = False
        # Paused pumps were not waiting on the channel, so wake every client's pump.
        self.notify_all()
        for client in self.clients.values():
            client.wake()

    def empty(self) -> None:
        """Go's channel.Empty: drop queued and in-flight messages (clients' counts reset)."""
        self.memory.clear()
        self.in_flight.clear()
        self.deferred.clear()
        for client in self.clients.values():
            client.empty_in_flight()
        self.backend.empty()

    def flush(self) -> int:
        """On shutdown: memory, in-flight and deferred messages into the diskqueue (Go's flush).

        In-flight and deferred messages are delivered again after the restart, so a message
        is never lost to a restart, only possibly repeated (at-least-once).
        """
        messages = list(self.memory)
        messages.extend(self.in_flight.clear())
        messages.extend(self.deferred.clear())
        self.memory.clear()
        if messages and not self.ephemeral:
            try:
                self._write_to_backend(messages)
            except BackendWriteError:
                return 0  # logged; nowhere else to keep them on the way out
        return len(messages)

    def close(self) -> None:
        self.deleted = True
        self.notify_all()
        self.backend.close()

    def delete(self) -> None:
        """Go's channel.Delete: the messages and the diskqueue files go."""
        self.deleted = True
        self.memory.clear()
        self.in_flight.clear()
        self.deferred.clear()
        for client in list(self.clients.values()):
            client.channel_deleted()
        self.notify_all()
        # Go's channel.exit(deleted): Empty() removes the files, Delete() closes the queue.
        self.backend.empty()
        self.backend.delete()

    def __repr__(self) -> str:
        return f"Channel({self.topic_name}:{self.name})"
