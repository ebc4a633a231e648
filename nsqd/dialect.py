"""The two dialects a V2 connection may speak: Go NSQ's and Youzan's (docs/protocol.md §3, §8).

What differs between them on one connection lives here and nowhere else: how message IDs look
on the wire and map back to the in-flight key (the ID codec), how message frames are encoded,
how a failure text prints an ID, and which failures close the connection. Every connection
starts classic; it switches to Youzan's for good when it shows it is a Youzan client
(docs/protocol.md §8 #1): IDENTIFY with `extend_support`, `desired_tag` or `ext_filter`, or
a Youzan command or command form (a partition, SUB_ORDERED, SUB_ADVANCED, PUB_TRACE, PUB_EXT and
their MPUB forms). Classic connections never see any of Youzan's encodings.
"""

import struct
from typing import TYPE_CHECKING

from nsqpy.common.errors import ProtocolError
from nsqpy.common.frame import FRAME_TYPE_MESSAGE, encode_message_frames
from nsqpy.common.goformat import go_byte_slice, go_text
from nsqpy.common.message import MESSAGE_ID_LENGTH
from nsqpy.partition_log import record_size

if TYPE_CHECKING:
    from nsqpy.nsqd.client import Client
    from nsqpy.nsqd.message import Message
    from nsqpy.nsqd.topic import Topic

# [frame size][frame type][timestamp][attempts][internal id][trace id]
_BINARY_FRAME_HEADER = struct.Struct(">IiqHQQ")
_DETAIL = struct.Struct(">QI")


class ClassicDialect:
    """Go NSQ v1.3.0: IDs are 16 hex digits, a failed publish or a write-disabled topic closes
    the connection."""

    youzan = False
    # Official nsqd closes on a failed publish; Youzan's keeps the connection (§8 #4).
    publish_errors_are_fatal = True

    def message_key(self, args: list[bytes], label: str) -> bytes:
        """The in-flight key a FIN, REQ or TOUCH names."""
        return _wire_id(args, label, "invalid message ID")

    def message_keys(self, wire_ids: list[bytes]) -> list[bytes]:
        """The in-flight keys of a run of FINs' IDs (`CommandParser.take_fin_run`)."""
        return wire_ids

    def printed_id(self, wire_id: bytes) -> str:
        """The ID as failure texts print it: Go's %s of the hex ID."""
        return go_text(wire_id)

    def encode_frames(self, messages: list["Message"], client: "Client", topic: "Topic") -> bytes:
        return encode_message_frames(messages)


class YouzanDialect(ClassicDialect):
    """Youzan's: binary `[8 internal id][8 trace id]` IDs (the internal id is our message id's
    64-bit value, so FIN/REQ/TOUCH map back to it), read at fixed offsets; publish failures
    do not close the connection."""

    youzan = True
    publish_errors_are_fatal = False

    def __init__(self) -> None:
        # Messages carry the DETAIL section `[8 offset][4 size]` (SUB_ORDERED, SUB_ADVANCED).
        self.detail = False

    def message_key(self, args: list[bytes], label: str) -> bytes:
        wire_id = _wire_id(args, label, "Invalid Message ID")
        # Youzan's FIN also refuses an internal id that is not positive (a signed int64).
        if label == "FIN" and int.from_bytes(wire_id[:8], "big", signed=True) <= 0:
            raise ProtocolError("E_INVALID", "Invalid Message ID")
        return message_key(wire_id)

    def message_keys(self, wire_ids: list[bytes]) -> list[bytes]:
        # `message_key` of each: the internal ids' 16 hex digits, all in one conversion.
        digits = b"".join([wire_id[:8] for wire_id in wire_ids]).hex().encode()
        return [digits[start : start + 16] for start in range(0, len(digits), 16)]

    def printed_id(self, wire_id: bytes) -> str:
        """Youzan prints the ID as Go's %s of a byte slice."""
        return go_byte_slice(wire_id)

    def encode_frames(self, messages: list["Message"], client: "Client", topic: "Topic") -> bytes:
        return encode_binary_id_frames(
            messages, self.detail, client.extend_support and topic.ext, stored_ext=topic.ext
        )


CLASSIC = ClassicDialect()


def _wire_id(args: list[bytes], label: str, invalid: str) -> bytes:
    """The ID a FIN, REQ or TOUCH sends, checked as both dialects check it (`invalid`: the
    dialect's wording of a wrong length)."""
    if not args:
        raise ProtocolError("E_INVALID", f"{label} insufficient number of params")
    if len(args[0]) != MESSAGE_ID_LENGTH:
        raise ProtocolError("E_INVALID", invalid)
    return args[0]


def message_key(wire_id: bytes) -> bytes:
    """The in-flight key of a binary ID: its internal id as our 16 hex digits. Youzan reads
    only the first 8 bytes; the trace half is ignored."""
    return b"%016x" % int.from_bytes(wire_id[:8], "big")


def ext_section(message: "Message") -> bytes:
    """`[1 ext_ver]`, plus `[2 length][header]` when the message has a JSON header (ext_ver 4):
    what an ext topic's messages carry for `extend_support` clients (docs/protocol.md §3.5)."""
    header = message.ext_header
    if not header:
        return b"\x00"
    return b"\x04" + len(header).to_bytes(2, "big") + header


def encode_binary_id_frames(
    messages: list["Message"], detail: bool, ext: bool = False, *, stored_ext: bool = False
) -> bytes:
    """Message frames with Youzan's binary IDs, the EXT section (ext topics, `extend_support`
    clients) and the DETAIL section `[8 offset][4 size]` for SUB_ORDERED/SUB_ADVANCED
    connections, in that order (docs/protocol.md §3.5). The size is the record's in the
    partition (`stored_ext`: an ext topic's, whose records hold the ext section)."""
    pack = _BINARY_FRAME_HEADER.pack
    pack_detail = _DETAIL.pack
    overhead = _BINARY_FRAME_HEADER.size - 4 + (_DETAIL.size if detail else 0)
    parts: list[bytes] = []
    append = parts.append
    for message in messages:
        body = message.body
        extension = ext_section(message) if ext else b""
        append(
            pack(
                len(body) + len(extension) + overhead,
                FRAME_TYPE_MESSAGE,
                message.timestamp,
                message.attempts,
                int(message.id, 16),
                message.trace_id,
            )
        )
        if extension:
            append(extension)
        if detail:
            append(pack_detail(message.offset, record_size(message, stored_ext)))
        append(body)
    return b"".join(parts)
