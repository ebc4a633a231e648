"""A classic channel's deferred messages (REQ with a delay, DPUB): what they cost is what they
are, not a Message each.

A deferred message waits, often by the hundred thousand, for nothing but its due time; all it
needs then is its ID, body, timestamp, attempts and queue position. Held as one tuple of
those, ordered on the heap by due time, it costs a third of a `Message` and its
`DeadlineQueue` entries (a 100 B message: ~600 B of RSS beyond its body before, Go ~300);
the `Message` is made again when it comes due or is looked at. A message that carries more
(a trace ID, an ext header) waits in a `DeadlineQueue` beside it, as every message of a log
topic's channel does (those use `DeadlineQueue` itself: their deferred messages are moved to
the delay queue by identity).
"""

import heapq
from collections.abc import Iterator

from nsqpy.nsqd.inflight import DeadlineQueue
from nsqpy.nsqd.message import Message

# (due time, ID, body, timestamp, attempts, offset): every field comparable, so entries of
# one due time order by ID without a counter.
Entry = tuple[float, bytes, bytes, int, int, int]

# Below this many heap entries a rebuild is not worth doing.
_MIN_ENTRIES_FOR_REBUILD = 1024


def _message(entry: Entry) -> Message:
    deadline, message_id, body, timestamp, attempts, offset = entry
    message = Message(message_id, body, timestamp, attempts, offset)
    message.deadline = deadline
    return message


def _compact(message: Message) -> bool:
    """Whether the message is all an entry keeps (a classic publish's, REQ'd or DPUB)."""
    return (
        not message.trace_id
        and not message.ext_header
        and not message.count
        and not message.mark_size
        and message.delay is None
    )


class DeferredQueue:
    """`DeadlineQueue`'s interface for deferred messages: the messages it gives back are new
    objects with the same ID, body, timestamp, attempts, position and due time."""

    __slots__ = ("_by_id", "_heap", "_others")

    def __init__(self) -> None:
        self._by_id: dict[bytes, Entry] = {}
        # Entries, each also in `_by_id` while it is live; a popped one goes stale in place.
        self._heap: list[Entry] = []
        self._others = DeadlineQueue()

    def __len__(self) -> int:
        return len(self._by_id) + len(self._others)

    def __contains__(self, message_id: bytes) -> bool:
        return message_id in self._by_id or message_id in self._others

    def __iter__(self) -> Iterator[Message]:
        return iter([*map(_message, self._by_id.values()), *self._others])

    def get(self, message_id: bytes) -> Message | None:
        entry = self._by_id.get(message_id)
        if entry is not None:
            return _message(entry)
        return self._others.get(message_id)

    def push(self, message: Message, deadline: float) -> None:
        message_id = message.id
        if not _compact(message):
            self._by_id.pop(message_id, None)
            self._others.push(message, deadline)
            return
        self._others.pop(message_id)
        entry = (
            deadline,
            message_id,
            message.body,
            message.timestamp,
            message.attempts,
            message.offset,
        )
        self._by_id[message_id] = entry
        heapq.heappush(self._heap, entry)
        self._compact_heap()

    def push_batch(self, messages: tuple[Message, ...] | list[Message], deadline: float) -> None:
        for message in messages:
            self.push(message, deadline)

    def pop(self, message_id: bytes) -> Message | None:
        entry = self._by_id.pop(message_id, None)
        if entry is None:
            return self._others.pop(message_id)
        self._compact_heap()
        return _message(entry)

    def pop_due(self, now: float) -> list[Message]:
        """Every message whose due time is at or before `now`, earliest first."""
        heap = self._heap
        by_id = self._by_id
        due: list[Message] = []
        while heap and heap[0][0] <= now:
            entry = heapq.heappop(heap)
            if by_id.get(entry[1]) is entry:
                del by_id[entry[1]]
                due.append(_message(entry))
        others = self._others.pop_due(now)
        if others:
            due = sorted(due + others, key=lambda message: message.deadline)
        return due

    def clear(self) -> list[Message]:
        messages = list(self)
        self._by_id.clear()
        self._heap.clear()
        self._others.clear()
        return messages

    def _compact_heap(self) -> None:
        """Stale entries (popped before they were due) go once they outnumber the live ones,
        so what the heap holds stays proportional to what is deferred."""
        heap = self._heap
        if len(heap) > _MIN_ENTRIES_FOR_REBUILD and len(heap) > 2 * len(self._by_id):
            self._heap = list(self._by_id.values())
            heapq.heapify(self._heap)
