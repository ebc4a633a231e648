"""Tag dispatch on an ext topic's channel (Youzan; docs/protocol.md §3.6).

A consumer that IDENTIFYs with `desired_tag` receives only the messages whose
`##client_dispatch_tag` header equals its tag; untagged messages go only to consumers without a
tag. A tagged message whose tag none of the channel's consumers has goes to the consumers
without a tag at once, as Youzan's messagePump lets it fall through to the channel's common
queue: an untagged consumer that reads it takes it. A message read from the channel's queue
by a consumer it is not for waits here until a consumer it is for takes it (held under its
tag; an untagged consumer also takes those of tags no consumer has any more), in the order
the channel read them. What waits here is bounded: past `limit` messages the channel reads
nothing more until consumers take some (the channel stalls as Youzan's does while a tagged
message finds no taker).
"""

from collections import deque
from collections.abc import Callable, Container

from nsqpy.nsqd.ext_header import dispatch_tag
from nsqpy.nsqd.message import Message

HELD_LIMIT = 10_000


class TagDispatch:
    def __init__(self, limit: int = HELD_LIMIT) -> None:
        self.limit = limit
        # Per tag, what waits for its consumers, each with the order the channel read it in.
        self._held: dict[str, deque[tuple[int, Message]]] = {}
        self._read = 0
        self.count = 0

    def take(
        self,
        tag: str,
        count: int,
        read: Callable[[int], list[Message]],
        present: Container[str] = (),
    ) -> tuple[list[Message], set[str]]:
        """Up to `count` messages for a consumer of `tag`: those waiting for it first (in the
        order they were read), then what `read(n)` returns from the queue, keeping the others
        here. `present`: the tags of the channel's consumers now (a message of another tag is
        for the untagged ones). Also the tags whose consumers now have messages waiting (to
        be woken)."""
        if tag:
            sources = [self._held.get(tag)]
        else:
            sources = [
                waiting for held, waiting in self._held.items() if not held or held not in present
            ]
        taken = _oldest_first([waiting for waiting in sources if waiting], count)
        self.count -= len(taken)
        woken: set[str] = set()
        while len(taken) < count and self.count < self.limit:
            read_now = read(count - len(taken))
            if not read_now:
                break
            for message in read_now:
                message_tag = dispatch_tag(message.ext_header)
                if message_tag == tag or (not tag and message_tag not in present):
                    taken.append(message)
                    continue
                self._read += 1
                self._held.setdefault(message_tag, deque()).append((self._read, message))
                self.count += 1
                woken.add(message_tag if message_tag in present else "")
        return taken, woken

    def waiting_tags(self, present: Container[str] = ()) -> set[str]:
        """The consumers' tags that have messages waiting for them ("" for those without a
        tag, which take the messages of tags no consumer in `present` has)."""
        return {
            tag if not tag or tag in present else ""
            for tag, messages in self._held.items()
            if messages
        }

    def full(self) -> bool:
        return self.count >= self.limit

    def drain(self) -> list[Message]:
        """Every waiting message in the order it was read, removed (a shutdown keeps them in
        the channel's queue)."""
        messages = _oldest_first(list(self._held.values()), self.count)
        self.clear()
        return messages

    def clear(self) -> None:
        self._held.clear()
        self.count = 0


def _oldest_first(queues: list[deque[tuple[int, Message]]], count: int) -> list[Message]:
    """Up to `count` messages off the fronts of `queues`, in the order they were read."""
    taken: list[Message] = []
    if len(queues) == 1:
        (queue,) = queues
        while queue and len(taken) < count:
            taken.append(queue.popleft()[1])
        return taken
    while len(taken) < count:
        fronts = [queue for queue in queues if queue]
        if not fronts:
            break
        oldest = min(fronts, key=lambda queue: queue[0][0])
        taken.append(oldest.popleft()[1])
    return taken
