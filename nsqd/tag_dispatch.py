"""Tag dispatch on an ext topic's channel (Youzan; docs/protocol.md §3.6).

A consumer that IDENTIFYs with `desired_tag` receives only the messages whose
`##client_dispatch_tag` header equals its tag; untagged messages go only to consumers without a
tag. A tagged message whose tag none of the channel's consumers has goes to the consumers
without a tag, as Youzan's messagePump lets it fall through to the channel's common queue. A
message read from the channel's queue by a consumer it is not for waits here until a consumer
it is for takes it (held under its tag; an untagged consumer also takes those of tags no
consumer has any more). What waits here is bounded: past `limit` messages the channel reads
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
        self._held: dict[str, deque[Message]] = {}
        self.count = 0

    def take(
        self,
        tag: str,
        count: int,
        read: Callable[[int], list[Message]],
        present: Container[str] = (),
    ) -> tuple[list[Message], set[str]]:
        """Up to `count` messages for a consumer of `tag`: those waiting for it first, then
        what `read(n)` returns from the queue, keeping the others here. `present`: the tags
        of the channel's consumers now (a message of another tag is for the untagged ones).
        Also the tags whose consumers now have messages waiting (to be woken)."""
        taken: list[Message] = []
        if tag:
            sources = [tag]
        else:
            sources = ["", *(held for held in self._held if held and held not in present)]
        for source in sources:
            waiting = self._held.get(source)
            while waiting and len(taken) < count:
                taken.append(waiting.popleft())
        self.count -= len(taken)
        woken: set[str] = set()
        while len(taken) < count and self.count < self.limit:
            read_now = read(count - len(taken))
            if not read_now:
                break
            for message in read_now:
                message_tag = dispatch_tag(message.ext_header)
                if message_tag == tag:
                    taken.append(message)
                    continue
                self._held.setdefault(message_tag, deque()).append(message)
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
        """Every waiting message, removed (a shutdown keeps them in the channel's queue)."""
        messages = [message for held in self._held.values() for message in held]
        self.clear()
        return messages

    def clear(self) -> None:
        self._held.clear()
        self.count = 0
