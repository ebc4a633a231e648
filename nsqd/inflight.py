"""Messages keyed by ID and ordered by a deadline: the in-flight and the deferred queues.

docs/design.md §3.4: FIN is a dict pop; the queue-scan pops expired entries off a heap.
A pump batch shares one deadline, so it is one heap entry, not one per message. Removal from
the heap is lazy: a message in an entry is live only while the dict still maps its ID to that
message with that deadline (TOUCH pushes a new entry and leaves the old one stale). Stale
references are purged when they outnumber the live messages, so memory stays proportional to
what is really in flight even when consumers FIN long before the timeout.
"""

import heapq
import itertools
from collections.abc import Iterator

from nsqpy.nsqd.message import Message

# Below this many referenced messages a rebuild is not worth doing.
_MIN_REFERENCES_FOR_REBUILD = 1024


class DeadlineQueue:
    __slots__ = ("_by_id", "_heap", "_order", "_references")

    def __init__(self) -> None:
        self._by_id: dict[bytes, Message] = {}
        # (deadline, order, a pump batch's messages as a tuple, or one message alone: a REQ's,
        # a TOUCH's, without a tuple of its own)
        self._heap: list[tuple[float, int, tuple[Message, ...] | Message]] = []
        self._order = itertools.count()
        self._references = 0  # messages referenced from the heap, live or stale

    def __len__(self) -> int:
        return len(self._by_id)

    def __contains__(self, message_id: bytes) -> bool:
        return message_id in self._by_id

    def __iter__(self) -> Iterator[Message]:
        return iter(list(self._by_id.values()))

    def get(self, message_id: bytes) -> Message | None:
        return self._by_id.get(message_id)

    def push(self, message: Message, deadline: float) -> None:
        message.deadline = deadline
        self._by_id[message.id] = message
        heapq.heappush(self._heap, (deadline, next(self._order), message))
        self._references += 1
        self._rebuild_if_stale()

    def push_batch(self, messages: tuple[Message, ...] | list[Message], deadline: float) -> None:
        """Many messages with one deadline: one heap entry (a pump batch, docs/design.md §3.4)."""
        by_id = self._by_id
        for message in messages:
            message.deadline = deadline
            by_id[message.id] = message
        heapq.heappush(self._heap, (deadline, next(self._order), tuple(messages)))
        self._references += len(messages)
        self._rebuild_if_stale()

    def _rebuild_if_stale(self) -> None:
        references = self._references
        if references > _MIN_REFERENCES_FOR_REBUILD and references > 2 * len(self._by_id):
            self._rebuild()

    def reschedule(self, message: Message, deadline: float) -> None:
        """Move a message's deadline (TOUCH); the old heap reference goes stale."""
        self.push(message, deadline)

    def pop(self, message_id: bytes) -> Message | None:
        return self._by_id.pop(message_id, None)

    def pop_due(self, now: float) -> list[Message]:
        """Every message whose deadline is at or before `now`, earliest first."""
        heap = self._heap
        by_id = self._by_id
        due: list[Message] = []
        while heap and heap[0][0] <= now:
            deadline, _order, held = heapq.heappop(heap)
            messages = (held,) if isinstance(held, Message) else held
            self._references -= len(messages)
            for message in messages:
                if message.deadline == deadline and by_id.get(message.id) is message:
                    del by_id[message.id]
                    due.append(message)
        return due

    def clear(self) -> list[Message]:
        messages = list(self._by_id.values())
        self._by_id.clear()
        self._heap.clear()
        self._references = 0
        return messages

    def _rebuild(self) -> None:
        groups: dict[float, list[Message]] = {}
        for message in self._by_id.values():
            groups.setdefault(message.deadline, []).append(message)
        self._heap = [(d, next(self._order), tuple(ms)) for d, ms in groups.items()]
        heapq.heapify(self._heap)
        self._references = len(self._by_id)
