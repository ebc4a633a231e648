"""A channel's delivery policy: how many messages it may hand out and how redelivery is ordered.

Go NSQ delivers FIFO with as many messages in flight as the consumers' RDY allows; a REQ with a
delay waits in the deferred queue, then queues behind everything else. Youzan's ordered
consumption (SUB_ORDERED, docs/protocol.md §3.5) has one message in flight per channel, sends a
redelivery before everything queued, and keeps a message in flight on `REQ id <ms>` with ms > 0
until its timeout redelivers it. The channel asks its policy at those three points and nowhere
else.
"""

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from nsqpy.nsqd.message import Message
    from nsqpy.nsqd.message_queue import MessageQueue


class FifoDelivery:
    """Go NSQ's delivery."""

    ordered = False
    # Whether a FIN lets the next message go, so a waiting consumer must be woken.
    finish_releases_next = False

    def room(self, in_flight: int, wanted: int) -> int:
        """How many of the `wanted` messages may be handed out with `in_flight` out now."""
        return wanted

    def keeps_in_flight(self, delay: float) -> bool:
        """Whether a REQ with this delay leaves the message in flight (ignored)."""
        return False

    def redeliver(self, queue: "MessageQueue", messages: list["Message"]) -> None:
        """Requeued or timed-out messages go back behind what waits."""
        queue.put_back(messages)


class OrderedDelivery(FifoDelivery):
    """Youzan's SUB_ORDERED: one in flight, redeliveries first."""

    ordered = True
    finish_releases_next = True

    def room(self, in_flight: int, wanted: int) -> int:
        return 0 if in_flight else min(wanted, 1)

    def keeps_in_flight(self, delay: float) -> bool:
        return delay > 0

    def redeliver(self, queue: "MessageQueue", messages: list["Message"]) -> None:
        queue.put_back(messages, first=True)


FIFO = FifoDelivery()
ORDERED = OrderedDelivery()
