"""A partition log's records and positions, without I/O.

A record is `[4-byte BE size][8 ts][2 attempts][8 id][8 trace id][body]`; an ext topic's
records add `[1 ext version]` after the trace id, with `[2 length][header]` for version 4, and
mark it in the attempts' high nibble (`0xA`). IDs are `partition << 50 | sequence`.

The last record of an idempotent publish (docs/protocol.md §3.10) carries its producer:
`[1 length][producer id][8 BE sequence of this message]` after the trace id, marked `0xC` in
the attempts' high nibble, or `0xE` when the ext section follows it. The log keeps no other
copy of which producer sequences it holds: a leader rebuilds them from these records.

A delayed record (docs/design.md §13: a DPUB, or a message a channel moved to the end of its
delay) carries `[8 BE due time, unix ms][1 length][channel]` after the trace id, marked `0x8`
in the attempts' high nibble, or `0x9` when the ext section follows it; its channel is empty
for a DPUB (every channel's). Such a record has no producer section.

The log makes the messages it reads with a factory its user gives (nsqd's `Message`), so it
imports nothing of the broker: `LogMessage` is what it reads and writes of one.
"""

import struct
from collections.abc import Callable
from typing import NamedTuple, Protocol, TypeVar

# [8 ts][2 attempts][8 id][8 trace id]
RECORD_HEADER = struct.Struct(">qHQQ")
SIZE = struct.Struct(">I")
# The size prefix and the header but the ID: [4 size][8 ts][2 attempts](8 id)[8 trace id].
SIZED_HEADER = struct.Struct(">IqH8xQ")
# The same with the ID's 8 bytes, to write one.
SIZED_RECORD_HEADER = struct.Struct(">IqH8sQ")
RECORD_HEADER_SIZE = RECORD_HEADER.size  # 26, as a classic record's header
# Where a record's body starts, counted from its size prefix.
BODY_START = 4 + RECORD_HEADER_SIZE
ID_PARTITION_SHIFT = 50
EXT_ATTEMPTS_FLAG = 0xA000
PRODUCER_ATTEMPTS_FLAG = 0xC000
PRODUCER_EXT_ATTEMPTS_FLAG = 0xE000
DELAYED_ATTEMPTS_FLAG = 0x8000
DELAYED_EXT_ATTEMPTS_FLAG = 0x9000
# The attempts' high nibbles of a record with a producer section, and with an ext section.
PRODUCER_FLAGS = (PRODUCER_ATTEMPTS_FLAG, PRODUCER_EXT_ATTEMPTS_FLAG)
EXT_FLAGS = (EXT_ATTEMPTS_FLAG, PRODUCER_EXT_ATTEMPTS_FLAG, DELAYED_EXT_ATTEMPTS_FLAG)
DELAYED_FLAGS = (DELAYED_ATTEMPTS_FLAG, DELAYED_EXT_ATTEMPTS_FLAG)
_SEQUENCE = struct.Struct(">Q")


class LogCorruption(Exception):
    """A record that cannot be what the index says is there."""


class Position(NamedTuple):
    """A place in the log: its virtual offset and how many messages come before it. A tuple:
    one is made per FIN, so it must be cheap."""

    offset: int
    # Shadows tuple.count(), which nothing here calls: Youzan's name for it.
    count: int  # type: ignore[assignment]


class LogMessage(Protocol):
    """What the log reads and writes of a message (nsqd's `Message` has it all)."""

    id: bytes  # 16 hex digits
    body: bytes
    timestamp: int
    attempts: int
    trace_id: int
    ext_header: bytes
    # Set by the log: the record's virtual offset and how many messages come before it.
    offset: int
    count: int
    # A delayed record's channel ("" for a DPUB) and due time in unix ms; None otherwise.
    delay: "tuple[str, int] | None"
    # Bytes of the producer or delay section in its record: set by the log (0 unless it has
    # one).
    mark_size: int


M = TypeVar("M", bound=LogMessage)
# `make(id, body, timestamp, attempts, offset, trace_id, count)`: a message read from the log.
MessageFactory = Callable[[bytes, bytes, int, int, int, int, int], M]


def record_size(message: LogMessage, ext: bool) -> int:
    """Bytes the message's record takes in the log, its size prefix included."""
    size = 4 + RECORD_HEADER_SIZE + len(message.body) + message.mark_size
    if ext:
        size += 1 + (2 + len(message.ext_header) if message.ext_header else 0)
    return size


class ProducerMark(NamedTuple):
    """The producer of an idempotent publish and the sequence of its last message."""

    producer_id: bytes
    sequence: int


def encode_flagged_record(message: LogMessage, ext: bool, producer: ProducerMark | None) -> bytes:
    """An ext topic's record, a publish's last one with its producer, or a delayed one, with
    its size prefix (`PartitionLog.append` writes the others itself, in its loop)."""
    body = message.body
    internal_id = int(message.id, 16)
    sections = b""
    flag = 0
    if message.delay is not None:
        sections = delay_section(*message.delay)
        message.mark_size = len(sections)
        flag = DELAYED_EXT_ATTEMPTS_FLAG if ext else DELAYED_ATTEMPTS_FLAG
    elif producer is not None:
        producer_id = producer.producer_id
        sections = bytes((len(producer_id),)) + producer_id + _SEQUENCE.pack(producer.sequence)
        flag = PRODUCER_EXT_ATTEMPTS_FLAG if ext else PRODUCER_ATTEMPTS_FLAG
    if ext:
        ext_header = message.ext_header
        sections += (
            b"\x04" + len(ext_header).to_bytes(2, "big") + ext_header if ext_header else b"\x00"
        )
        flag = flag or EXT_ATTEMPTS_FLAG
    attempts = (message.attempts & 0x0FFF) | flag
    header = RECORD_HEADER.pack(message.timestamp, attempts, internal_id, message.trace_id)
    record = header + sections + body
    return SIZE.pack(len(record)) + record


def mark_size(producer: ProducerMark) -> int:
    """Bytes the producer section takes in a record."""
    return 1 + len(producer.producer_id) + 8


def delay_section(channel: str, due_ms: int) -> bytes:
    name = channel.encode()
    return _SEQUENCE.pack(due_ms) + bytes((len(name),)) + name


def producer_section(record: bytes | memoryview, at: int) -> tuple[ProducerMark, int]:
    """The producer mark of a record whose section starts at `at` (after the trace id), and
    where what follows it starts."""
    length = record[at]
    producer_id = bytes(record[at + 1 : at + 1 + length])
    (sequence,) = _SEQUENCE.unpack_from(record, at + 1 + length)
    return ProducerMark(producer_id, sequence), at + 1 + length + 8


def decode_flagged_record(
    record: bytes | memoryview, offset: int, count: int, make: MessageFactory[M]
) -> M:
    """A record whose attempts have high bits set: an ext topic's (`0xA`: the ext section
    follows the trace id), a producer's (`0xC`), or both (`0xE`); `PartitionLog` reads the
    others itself, in its loop."""
    timestamp, attempts, internal_id, trace_id = RECORD_HEADER.unpack_from(record)
    rest = RECORD_HEADER_SIZE
    ext_header = b""
    flag = attempts & 0xF000
    attempts &= 0x0FFF
    marked = 0
    delay = None
    if flag in PRODUCER_FLAGS:
        after = producer_section(record, rest)[1]
        marked = after - rest
        rest = after
    elif flag in DELAYED_FLAGS:
        (due_ms,) = _SEQUENCE.unpack_from(record, rest)
        length = record[rest + 8]
        delay = (bytes(record[rest + 9 : rest + 9 + length]).decode(), due_ms)
        marked = 9 + length
        rest += marked
    if flag in EXT_FLAGS:
        version = record[rest]
        rest += 1
        if version == 4:
            length = int.from_bytes(record[rest : rest + 2], "big")
            ext_header = bytes(record[rest + 2 : rest + 2 + length])
            rest += 2 + length
    message = make(
        b"%016x" % internal_id, bytes(record[rest:]), timestamp, attempts, offset, trace_id, count
    )
    message.ext_header = ext_header
    message.mark_size = marked
    if delay is not None:
        message.delay = delay
    return message


def delayed_records(data: bytes, first: Position) -> list[tuple[str, bytes, int, int, int]]:
    """The delayed records among whole records `data` that start at `first`: each one's
    channel, ID (16 hex digits), offset, count and due time (unix ms)."""
    found = []
    at, length = 0, len(data)
    offset, count = first
    unpack = SIZED_RECORD_HEADER.unpack_from
    while at + BODY_START <= length:
        size, _timestamp, attempts, raw_id, _trace_id = unpack(data, at)
        if attempts & 0xF000 in DELAYED_FLAGS:
            rest = at + BODY_START
            (due_ms,) = _SEQUENCE.unpack_from(data, rest)
            name_length = data[rest + 8]
            channel = bytes(data[rest + 9 : rest + 9 + name_length]).decode()
            found.append((channel, raw_id.hex().encode(), offset + at, count, due_ms))
        at += 4 + size
        count += 1
    return found


class Record:
    """A plain `LogMessage`, for reading a log outside nsqd (tools, tests)."""

    __slots__ = (
        "id",
        "body",
        "timestamp",
        "attempts",
        "offset",
        "trace_id",
        "count",
        "ext_header",
        "defer",
        "delay",
        "mark_size",
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
        self.timestamp = timestamp
        self.attempts = attempts
        self.offset = offset
        self.trace_id = trace_id
        self.count = count
        self.ext_header = b""
        self.defer = 0.0
        self.delay: tuple[str, int] | None = None
        self.mark_size = 0
