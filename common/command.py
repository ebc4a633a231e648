"""V2 client→server commands: the parsed form, and the encoders clients use (docs/protocol.md §1.2).

The server side parses bytes into `Command` objects with `nsqpy.common.command_parser`; our own
client, the tools and the tests build the same bytes with the `encode_*` functions here.
"""

import json
import struct
from collections.abc import Iterable
from dataclasses import dataclass

MAGIC_V2 = b"  V2"

_SIZE = struct.Struct(">i")
_TRACE_ID = struct.Struct(">Q")
_JSON_LENGTH = struct.Struct(">H")


@dataclass(slots=True)
class Command:
    """One complete command. `name` and `args` are the raw bytes of the line split on spaces
    (`args` excludes the name); `body` is the body of a body-carrying command; `messages`
    holds the individual bodies of an MPUB-family command."""

    name: bytes
    args: list[bytes]
    body: bytes | None = None
    messages: list[bytes] | None = None


def _line(name: bytes, args: Iterable[bytes | str | int]) -> bytes:
    parts = [name]
    for arg in args:
        if isinstance(arg, int):
            parts.append(b"%d" % arg)
        elif isinstance(arg, str):
            parts.append(arg.encode())
        else:
            parts.append(arg)
    return b" ".join(parts) + b"\n"


def encode_command(name: bytes | str, *args: bytes | str | int, body: bytes | None = None) -> bytes:
    """Any command line, with a size-prefixed body when one is given."""
    line = _line(name.encode() if isinstance(name, str) else name, args)
    if body is None:
        return line
    return line + _SIZE.pack(len(body)) + body


def encode_identify(settings: dict) -> bytes:
    return encode_command(b"IDENTIFY", body=json.dumps(settings).encode())


def encode_auth(secret: bytes | str) -> bytes:
    return encode_command(b"AUTH", body=secret.encode() if isinstance(secret, str) else secret)


def encode_sub(topic: str, channel: str, *extra: bytes | str | int) -> bytes:
    return encode_command(b"SUB", topic, channel, *extra)


def encode_rdy(count: int) -> bytes:
    return b"RDY %d\n" % count


def encode_fin(message_id: bytes) -> bytes:
    return b"FIN " + message_id + b"\n"


def encode_req(message_id: bytes, timeout_ms: int) -> bytes:
    return b"REQ " + message_id + b" %d\n" % timeout_ms


def encode_touch(message_id: bytes) -> bytes:
    return b"TOUCH " + message_id + b"\n"


NOP = b"NOP\n"
CLS = b"CLS\n"


def encode_pub(topic: str, body: bytes, *partition: int) -> bytes:
    return encode_command(b"PUB", topic, *partition, body=body)


def encode_pub_ext(topic: str, header: dict | bytes, body: bytes, *partition: int) -> bytes:
    """Youzan's PUB_EXT: a message with a JSON header, for ext topics (docs/protocol.md §3.6)."""
    return encode_command(b"PUB_EXT", topic, *partition, body=encode_ext_body(header, body))


def encode_dpub(topic: str, defer_ms: int, body: bytes) -> bytes:
    return encode_command(b"DPUB", topic, defer_ms, body=body)


def encode_mpub_body(bodies: Iterable[bytes]) -> bytes:
    """`[4-byte count]([4-byte size][body])*`, the body of MPUB (docs/protocol.md §2.8)."""
    bodies = list(bodies)
    parts = [_SIZE.pack(len(bodies))]
    for body in bodies:
        parts.append(_SIZE.pack(len(body)))
        parts.append(body)
    return b"".join(parts)


def encode_mpub(topic: str, bodies: Iterable[bytes], *partition: int) -> bytes:
    return encode_command(b"MPUB", topic, *partition, body=encode_mpub_body(bodies))


def encode_pub_seq(
    topic: str, partition: int, producer_id: str, sequence: int, body: bytes
) -> bytes:
    """nsqpy's idempotent PUB (docs/protocol.md §3.10)."""
    return encode_command(b"PUB_SEQ", topic, partition, producer_id, sequence, body=body)


def encode_mpub_seq(
    topic: str, partition: int, producer_id: str, first_sequence: int, bodies: Iterable[bytes]
) -> bytes:
    """nsqpy's idempotent MPUB: the messages take `first_sequence` and the ones after it."""
    return encode_command(
        b"MPUB_SEQ", topic, partition, producer_id, first_sequence, body=encode_mpub_body(bodies)
    )


def encode_mpub_ext_seq(
    topic: str,
    partition: int,
    producer_id: str,
    first_sequence: int,
    bodies: Iterable[bytes],
    headers: Iterable[dict | bytes],
) -> bytes:
    """nsqpy's idempotent MPUB_EXT: each message with its JSON header, as MPUB_EXT's."""
    return encode_command(
        b"MPUB_EXT_SEQ",
        topic,
        partition,
        producer_id,
        first_sequence,
        body=_encode_mpub_ext_body(bodies, headers),
    )


def encode_mpub_ext(
    topic: str, bodies: Iterable[bytes], headers: Iterable[dict | bytes], *partition: int
) -> bytes:
    """Youzan's MPUB_EXT: each message with its JSON header."""
    body = _encode_mpub_ext_body(bodies, headers)
    return encode_command(b"MPUB_EXT", topic, *partition, body=body)


def _encode_mpub_ext_body(bodies: Iterable[bytes], headers: Iterable[dict | bytes]) -> bytes:
    messages = (encode_ext_body(header, body) for header, body in zip(headers, bodies, strict=True))
    return encode_mpub_body(messages)


def encode_trace_body(trace_id: int, data: bytes) -> bytes:
    """The body of PUB_TRACE and each message of MPUB_TRACE: `[8 trace id][data]` (§3.6)."""
    return _TRACE_ID.pack(trace_id) + data


def encode_ext_body(header: dict | bytes, data: bytes) -> bytes:
    """The body of PUB_EXT and each message of MPUB_EXT: `[2 json length][json][data]` (§3.6)."""
    raw = header if isinstance(header, bytes) else json.dumps(header).encode()
    return _JSON_LENGTH.pack(len(raw)) + raw + data


def split_trace_body(body: bytes) -> tuple[int, bytes]:
    """(trace id, data) of a PUB_TRACE body; the parser has checked it is longer than 8."""
    return _TRACE_ID.unpack_from(body)[0], body[8:]


def split_ext_body(body: bytes) -> tuple[bytes, bytes]:
    """(json header bytes, data) of a PUB_EXT body; the parser has checked the lengths."""
    (json_length,) = _JSON_LENGTH.unpack_from(body)
    return body[2 : 2 + json_length], body[2 + json_length :]
