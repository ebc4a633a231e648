"""Messages keyed by ID and ordered by a deadline: the in-flight and the deferred queues.

DESIGN.md, hot path 4: FIN is a dict pop; the queue-scan pops expired entries off a heap.
Removal from the heap is lazy: an entry is live only while the dict still maps its ID to the
same message with the same deadline (TOUCH pushes a new entry and leaves the old one stale).
Stale entries are purged when they outnumber the live ones, so memory stays proportional to
what is really in flight even when consumers FIN long before the timeout.
"""

import heapq
import itertools
from collections.abc import Iterator

from nsqd.message import Message

# Below this many heap entries a rebuild is not worth doing.
_MIN_HEAP_FOR_REBUILD = 1024


class DeadlineQueue:
    __slots__ = ("_by_id", "_heap", "_order")

    def __init__(self) -> None:
        self._by_id: dict[bytes, Message] = {}
        self._heap: list[tuple[float, int, Message]] = []
        self._order = itertools.count()

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
        if len(self._heap) > _MIN_HEAP_FOR_REBUILD and len(self._heap) > 2 * len(self._by_id):
            self._rebuild()

    def reschedule(self, message: Message, deadline: float) -> None:
        """Move a message's deadline (TOUCH); the old heap entry goes stale."""
        self.push(message, deadline)

    def pop(self, message_id: bytes) -> Message | None:
        return self._by_id.pop(message_id, None)

    def pop_due(self, now: float) -> list[Message]:
        """Every message whose deadline is at or before `now`, earliest first."""
        heap = self._heap
        by_id = self._by_id
        due: list[Message] = []
        while heap and heap[0][0] <= now:
            deadline, _order, message = heapq.heappop(heap)
            if by_id.get(message.id) is message and message.deadline == deadline:
                del by_id[message.id]
                due.append(message)
        return due

    def clear(self) -> list[Message]:
        messages = list(self._by_id.values())
        self._by_id.clear()
        self._heap.clear()
        return messages

    def _rebuild(self) -> None:
        self._heap = [(m.deadline, next(self._order), m) for m in self._by_id.values()]
        heapq.heapify(self._heap)
