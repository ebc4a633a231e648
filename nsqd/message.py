"""A message as nsqd holds it: one object per message per channel (docs/protocol.md §1.6).

Go nsqd gives each channel its own copy of a published message because attempts, delivery
time and ownership are per channel; the body bytes are shared, never copied.
"""

import struct

from nsqpy.common.message import MESSAGE_HEADER_SIZE

# A record in a partition's queue: its 4-byte length prefix, the message header, the body.
RECORD_OVERHEAD = 4 + MESSAGE_HEADER_SIZE

_RECORD_HEADER = struct.Struct(">qH16s")
# A diskqueue's framing of a fresh message's record: [4 size][8 ts][2 attempts = 0][16 id].
_FRAMED_HEADER = struct.Struct(">iqH16s")


class Message:
    __slots__ = (
        "id",
        "body",
        "timestamp",
        "attempts",
        "deliver_at",
        "deadline",
        "client_id",
        "defer",
        "offset",
        "trace_id",
        "ext_header",
        "count",
        "mark_size",
        "delay",
    )

    def __init__(
        self,
        message_id: bytes,
        body: bytes,
        timestamp: int,
        attempts: int = 0,
        offset: int = 0,
        trace_id: int = 0,
        count: int = 0,
    ) -> None:
        self.id = message_id
        self.body = body
        self.timestamp = timestamp  # ns since the epoch, set when published
        self.attempts = attempts  # incremented before each delivery: the first has 1
        self.deliver_at = 0.0  # trio clock time of the latest delivery (TOUCH's cap counts from it)
        self.deadline = 0.0  # in-flight timeout or deferred due time, on the trio clock
        self.client_id = 0  # the client it is in flight to
        self.defer = 0.0  # DPUB: seconds to hold the message before the first delivery
        # Youzan: the partition's virtual byte position of the message's record (the DETAIL
        # section and PUB_TRACE's reply), and the publisher's trace id. A log topic's records
        # keep both (partition_log/); Go's diskqueue record has no room for them.
        self.offset = offset
        self.trace_id = trace_id
        self.ext_header = b""  # Youzan ext topics: the PUB_EXT JSON header
        # Log topics: how many messages of the partition come before this one.
        self.count = count
        # Log topics: bytes of the producer mark in the message's stored record (the last of
        # an idempotent publish has one, docs/protocol.md §3.10), so its record size is known.
        self.mark_size = 0
        # Log topics: a delayed record's channel ("" for a DPUB) and due time in unix ms, as
        # the log stores and reads it (`nsqd/delay_queue.py`); None for every other message.
        self.delay: tuple[str, int] | None = None

    def copy(self) -> "Message":
        """A channel's own copy; `defer` travels with it so every channel defers a DPUB."""
        message = Message(self.id, self.body, self.timestamp, self.attempts)
        message.offset, message.trace_id, message.count = self.offset, self.trace_id, self.count
        message.defer = self.defer
        message.ext_header = self.ext_header
        message.mark_size = self.mark_size
        return message

    def to_record(self) -> bytes:
        """The diskqueue record, as Go nsqd writes it: `[8 ts][2 attempts][16 id][body]`."""
        return _RECORD_HEADER.pack(self.timestamp, self.attempts, self.id) + self.body

    @classmethod
    def from_record(cls, record: bytes) -> "Message":
        timestamp, attempts, message_id = _RECORD_HEADER.unpack_from(record)
        return cls(message_id, record[MESSAGE_HEADER_SIZE:], timestamp, attempts)

    def __repr__(self) -> str:
        return f"Message({self.id!r}, attempts={self.attempts}, {len(self.body)} bytes)"


class MessageBatch:
    """An MPUB's messages while they wait in memory: their IDs and bodies in two lists and
    one timestamp, instead of an object per message.

    A million queued `Message`s are a million objects the cyclic GC rescans (bytes are not
    tracked, so a batch is three tracked objects for any count) and 128 bytes each of memory.
    A channel makes the `Message`s when it takes them out to deliver (`take`); the ones that
    overflow to the diskqueue are made on the way to it. Each channel queues a batch of its
    own over the same lists (`view`): taking from one leaves the others where they are."""

    __slots__ = ("ids", "bodies", "timestamp", "start", "offset", "_framed")

    def __init__(
        self, ids: list[bytes], bodies: list[bytes], timestamp: int, offset: int = 0
    ) -> None:
        self.ids = ids
        self.bodies = bodies
        self.timestamp = timestamp
        self.start = 0  # the first message not taken yet
        self.offset = offset  # its record's position (Message.offset)
        # The batch's diskqueue records, made once for every channel's view (`framed`).
        self._framed: list[FramedRecords | None] = [None]

    def __len__(self) -> int:
        return len(self.bodies) - self.start

    def view(self) -> "MessageBatch":
        """The messages not taken yet, as another channel's batch."""
        other = MessageBatch(self.ids, self.bodies, self.timestamp, self.offset)
        other.start = self.start
        other._framed = self._framed
        return other

    def framed(self) -> "FramedRecords":
        """Every message of the batch as a diskqueue writes it, framed: made by the first
        channel whose copy overflows to its diskqueue, shared by the rest (with a hundred
        channels, one encoding of the batch instead of a hundred)."""
        framed = self._framed[0]
        if framed is None:
            framed = self._framed[0] = FramedRecords(self.ids, self.bodies, self.timestamp)
        return framed

    def take(self, count: int) -> list[Message]:
        """The next `count` (or all that are left) as Messages."""
        start = self.start
        end = min(start + count, len(self.bodies))
        timestamp = self.timestamp
        offset = self.offset
        taken: list[Message] = []
        append = taken.append
        ids, bodies = self.ids, self.bodies
        for index in range(start, end):
            body = bodies[index]
            append(Message(ids[index], body, timestamp, 0, offset))
            offset += RECORD_OVERHEAD + len(body)
        self.start = end
        self.offset = offset
        return taken

    def __repr__(self) -> str:
        return f"MessageBatch({len(self)} of {len(self.bodies)} left)"


def records_as_runs(records: list[bytes]) -> "list[list[Message] | MessageBatch]":
    """A topic diskqueue's records as the topic's pump hands them to the channels: each run
    of fresh ones with one timestamp (an MPUB's) as a MessageBatch, which every channel shares
    and which is framed once for all their diskqueues; the others as Messages."""
    runs: list[list[Message] | MessageBatch] = []
    unpack = _RECORD_HEADER.unpack_from
    ids: list[bytes] = []
    bodies: list[bytes] = []
    run_timestamp = None
    for record in records:
        timestamp, attempts, message_id = unpack(record)
        if attempts == 0 and timestamp == run_timestamp:
            ids.append(message_id)
            bodies.append(record[MESSAGE_HEADER_SIZE:])
            continue
        _end_run(runs, ids, bodies, run_timestamp)
        if attempts:
            runs.append([Message(message_id, record[MESSAGE_HEADER_SIZE:], timestamp, attempts)])
            ids, bodies, run_timestamp = [], [], None
        else:
            ids, bodies, run_timestamp = [message_id], [record[MESSAGE_HEADER_SIZE:]], timestamp
    _end_run(runs, ids, bodies, run_timestamp)
    return runs


def _end_run(runs: list, ids: list[bytes], bodies: list[bytes], timestamp: int | None) -> None:
    if timestamp is None:
        return
    if len(bodies) == 1:
        runs.append([Message(ids[0], bodies[0], timestamp)])
    else:
        runs.append(MessageBatch(ids, bodies, timestamp))


class FramedRecords:
    """A batch of fresh messages as a diskqueue's records, framed (`[4 size][record]` each,
    attempts 0), in one bytes object with where each record ends; any run of them is a slice
    a diskqueue writes as it is (`DiskQueue.put_framed`)."""

    __slots__ = ("data", "ends", "largest")

    def __init__(self, ids: list[bytes], bodies: list[bytes], timestamp: int) -> None:
        pack = _FRAMED_HEADER.pack
        header_size = MESSAGE_HEADER_SIZE
        parts: list[bytes] = [b""] * (2 * len(bodies))
        parts[0::2] = [
            pack(header_size + len(body), timestamp, 0, message_id)
            for message_id, body in zip(ids, bodies, strict=True)
        ]
        parts[1::2] = bodies
        self.data = b"".join(parts)
        ends = []
        position = 0
        for body in bodies:
            position += RECORD_OVERHEAD + len(body)
            ends.append(position)
        self.ends = ends
        self.largest = header_size + max(map(len, bodies), default=0)
