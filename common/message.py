"""The message payload `[8 ts][2 attempts][16 id][body]` (docs/protocol.md §1.6).

The same bytes are the payload of a message frame and the record nsqd stores in its
diskqueue, so a Go nsqd data directory holds exactly these records.
"""

import struct
from dataclasses import dataclass

from nsqpy.common.errors import ProtocolError

MESSAGE_ID_LENGTH = 16
_MESSAGE_HEADER = struct.Struct(">qH16s")
MESSAGE_HEADER_SIZE = _MESSAGE_HEADER.size  # 26


@dataclass(slots=True)
class DecodedMessage:
    timestamp: int
    attempts: int
    id: bytes
    body: bytes


def encode_message(timestamp_ns: int, attempts: int, message_id: bytes, body: bytes) -> bytes:
    return _MESSAGE_HEADER.pack(timestamp_ns, attempts, message_id) + body


def decode_message(data: bytes) -> DecodedMessage:
    """Parse a message payload; Go nsqd's decodeMessage refuses anything shorter than a header."""
    if len(data) < MESSAGE_HEADER_SIZE:
        raise ProtocolError(
            "E_BAD_MESSAGE",
            f"not enough data to decode valid message ({len(data)} < {MESSAGE_HEADER_SIZE})",
        )
    timestamp, attempts, message_id = _MESSAGE_HEADER.unpack_from(data)
    return DecodedMessage(timestamp, attempts, message_id, bytes(data[MESSAGE_HEADER_SIZE:]))
