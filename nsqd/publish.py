"""The one path every publish takes, whatever protocol carried it (TCP PUB, MPUB, DPUB and
Youzan's traced and ext forms, HTTP /pub, /mpub, /pubtrace): refuse while nsqd is exiting, hand
the messages to the topic, and turn a failed diskqueue write into one error type. Each protocol
only maps `PublishError` to its wire form; the publish is acknowledged once nsqd's
`Storage.commit()` has synced what it wrote."""

from typing import TYPE_CHECKING, Protocol

from nsqpy.nsqd.backend import BackendWriteError
from nsqpy.nsqd.message import Message, MessageBatch

if TYPE_CHECKING:
    from nsqpy.nsqd.topic import Topic


class Publishing(Protocol):
    """What a publish asks of nsqd (`NSQD`): whether it is on its way out."""

    @property
    def exiting(self) -> bool: ...


class PublishError(Exception):
    """A publish nsqd read but refused. `str()` is Go's reason, `exiting` or a write error such
    as `write <file>: no space left on device`; `exiting` tells the two apart (HTTP answers 503
    to one and 500 to the other)."""

    def __init__(self, reason: str, *, exiting: bool) -> None:
        super().__init__(reason)
        self.exiting = exiting


class TooMuchWaiting(PublishError):
    """Youzan's E_PUB_TOO_MUCH_WAITING: the publish would leave more body bytes waiting to be
    acknowledged in its topic than `--max-pub-waiting-size`. `waiting` is that total."""

    def __init__(self, waiting: int) -> None:
        super().__init__(f"pub too much waiting in the queue: {waiting}", exiting=False)
        self.waiting = waiting


def publish(
    nsqd: Publishing,
    topic: "Topic",
    bodies: list[bytes],
    *,
    defer: float = 0.0,
    trace_ids: list[int] | None = None,
    ext_headers: list[bytes] | None = None,
    producer: tuple[bytes, int] | None = None,
) -> "list[Message] | MessageBatch":
    """New messages in `topic`, all or nothing (Topic.publish); PublishError if refused.
    `producer`: an idempotent publish's producer and first sequence, checked already."""
    if nsqd.exiting:
        raise PublishError("exiting", exiting=True)
    body_bytes = len(bodies[0]) if len(bodies) == 1 else sum(map(len, bodies))
    waiting = topic.queue.waiting_bytes + body_bytes
    if waiting > topic.nsqd.options.max_pub_waiting_size:
        raise TooMuchWaiting(waiting)
    try:
        return topic.publish(bodies, defer, trace_ids, ext_headers, producer, body_bytes)
    except BackendWriteError as error:
        topic.nsqd.storage.refused(topic.name, topic.partition)
        raise PublishError(str(error), exiting=False) from None


def publish_traced(
    nsqd: Publishing,
    topic: "Topic",
    bodies: list[bytes],
    *,
    trace_ids: list[int],
    ext_headers: list[bytes] | None = None,
) -> list[Message]:
    """A publish with trace ids (and ext headers): its Messages, for the traced reply. Such a
    publish is never kept as a MessageBatch."""
    messages = publish(nsqd, topic, bodies, trace_ids=trace_ids, ext_headers=ext_headers)
    assert not isinstance(messages, MessageBatch)
    return messages
