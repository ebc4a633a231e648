"""Server→client frames of the V2 protocol (docs/protocol.md §1.3), encoded and decoded without I/O.

A frame is `[4-byte BE size][4-byte BE frame type][data]` with size = 4 + len(data).
"""

import struct
from dataclasses import dataclass

from nsqpy.common.errors import ProtocolError
from nsqpy.common.message import MESSAGE_HEADER_SIZE

FRAME_TYPE_RESPONSE = 0
FRAME_TYPE_ERROR = 1
FRAME_TYPE_MESSAGE = 2

_FRAME_HEADER = struct.Struct(">Ii")
FRAME_HEADER_SIZE = _FRAME_HEADER.size

# A whole message frame header in one pack: frame size, frame type, timestamp, attempts and
# the 16-byte ID; the body follows as its own piece so it is never copied before the join.
_MESSAGE_FRAME_HEADER = struct.Struct(">IiqH16s")
_MESSAGE_FRAME_OVERHEAD = 4 + MESSAGE_HEADER_SIZE


def encode_frame(frame_type: int, data: bytes) -> bytes:
    return _FRAME_HEADER.pack(len(data) + 4, frame_type) + data


def encode_response(data: bytes) -> bytes:
    return encode_frame(FRAME_TYPE_RESPONSE, data)


def encode_error(text: str | bytes) -> bytes:
    data = text.encode("utf-8", "surrogateescape") if isinstance(text, str) else text
    return encode_frame(FRAME_TYPE_ERROR, data)


OK_FRAME = encode_response(b"OK")
HEARTBEAT_FRAME = encode_response(b"_heartbeat_")
CLOSE_WAIT_FRAME = encode_response(b"CLOSE_WAIT")


def encode_message_frame(timestamp_ns: int, attempts: int, message_id: bytes, body: bytes) -> bytes:
    """One message frame (frame type 2) with the official payload layout (docs/protocol.md §1.6)."""
    return (
        _MESSAGE_FRAME_HEADER.pack(
            len(body) + _MESSAGE_FRAME_OVERHEAD,
            FRAME_TYPE_MESSAGE,
            timestamp_ns,
            attempts,
            message_id,
        )
        + body
    )


def encode_message_frames(messages) -> bytes:
    """Many message frames in one buffer, for one `send_all` per batch (docs/design.md §3.3).

    `messages` yields objects with `timestamp`, `attempts`, `id` and `body` attributes.
    Cost per message: one struct pack and two list appends; one join for the whole batch.
    """
    pack = _MESSAGE_FRAME_HEADER.pack
    overhead = _MESSAGE_FRAME_OVERHEAD
    parts: list[bytes] = []
    append = parts.append
    for message in messages:
        body = message.body
        append(
            pack(
                len(body) + overhead,
                FRAME_TYPE_MESSAGE,
                message.timestamp,
                message.attempts,
                message.id,
            )
        )
        append(body)
    return b"".join(parts)


@dataclass(frozen=True, slots=True)
class Frame:
    frame_type: int
    data: bytes


class FrameDecoder:
    """The client side: feed the bytes a server sent, get whole frames back.

    `max_frame_size` bounds what a hostile or broken server can make us buffer.
    """

    def __init__(self, max_frame_size: int = 64 * 1024 * 1024) -> None:
        self.max_frame_size = max_frame_size
        self._buffer = bytearray()

    def receive_data(self, data: bytes | bytearray) -> list[Frame]:
        buffer = self._buffer
        buffer += data
        frames: list[Frame] = []
        position = 0
        available = len(buffer)
        unpack_from = _FRAME_HEADER.unpack_from
        while available - position >= FRAME_HEADER_SIZE:
            size, frame_type = unpack_from(buffer, position)
            if size < 4 or size > self.max_frame_size:
                raise ProtocolError("E_BAD_FRAME", f"invalid frame size {size}")
            end = position + 4 + size
            if end > available:
                break
            frames.append(Frame(frame_type, bytes(buffer[position + FRAME_HEADER_SIZE : end])))
            position = end
        if position:
            del buffer[:position]
        return frames

    @property
    def buffered(self) -> int:
        return len(self._buffer)
