"""The message payload `[8 ts][2 attempts][16 id][body]` (docs/protocol.md §1.6)."""

import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nsqpy.common.errors import ProtocolError
from nsqpy.common.message import (
    MESSAGE_HEADER_SIZE,
    MESSAGE_ID_LENGTH,
    DecodedMessage,
    decode_message,
    encode_message,
)

MESSAGE_ID = b"0123456789abcdef"


def test_header_size() -> None:
    assert MESSAGE_HEADER_SIZE == 8 + 2 + 16 == 26
    assert MESSAGE_ID_LENGTH == 16


def test_encode_exact_bytes() -> None:
    encoded = encode_message(0x0102030405060708, 0x0A0B, MESSAGE_ID, b"hello")
    assert encoded == bytes.fromhex("0102030405060708 0a0b") + MESSAGE_ID + b"hello"
    # Big-endian int64: a negative timestamp is two's complement.
    assert encode_message(-2, 1, MESSAGE_ID, b"")[:10] == b"\xff" * 7 + b"\xfe\x00\x01"


def test_decode_exact_bytes() -> None:
    raw = bytes.fromhex("0000000000000005 0003") + MESSAGE_ID + b"body\n"
    assert decode_message(raw) == DecodedMessage(5, 3, MESSAGE_ID, b"body\n")


def test_header_only_is_an_empty_body() -> None:
    assert decode_message(encode_message(0, 0, MESSAGE_ID, b"")) == DecodedMessage(
        0, 0, MESSAGE_ID, b""
    )


def test_binary_youzan_id_survives() -> None:
    youzan_id = struct.pack(">QQ", 42, 0x1234)
    message = decode_message(encode_message(1, 1, youzan_id, b"x"))
    assert message.id == youzan_id


@pytest.mark.parametrize("length", [0, 1, 25])
def test_decode_refuses_short_data(length: int) -> None:
    with pytest.raises(ProtocolError) as caught:
        decode_message(b"\x00" * length)
    assert caught.value.text == (
        f"E_BAD_MESSAGE not enough data to decode valid message ({length} < 26)"
    )


def test_decode_accepts_bytearray_and_memoryview_and_returns_bytes() -> None:
    raw = encode_message(9, 2, MESSAGE_ID, b"payload")
    for view in (bytearray(raw), memoryview(raw)):
        message = decode_message(view)
        assert message == DecodedMessage(9, 2, MESSAGE_ID, b"payload")
        assert type(message.body) is bytes


def test_encode_refuses_out_of_range_fields() -> None:
    with pytest.raises(struct.error):
        encode_message(2**63, 0, MESSAGE_ID, b"")
    with pytest.raises(struct.error):
        encode_message(0, 2**16, MESSAGE_ID, b"")


@given(
    timestamp=st.integers(-(2**63), 2**63 - 1),
    attempts=st.integers(0, 2**16 - 1),
    message_id=st.binary(min_size=16, max_size=16),
    body=st.binary(max_size=500),
)
def test_round_trip(timestamp: int, attempts: int, message_id: bytes, body: bytes) -> None:
    encoded = encode_message(timestamp, attempts, message_id, body)
    assert len(encoded) == MESSAGE_HEADER_SIZE + len(body)
    assert decode_message(encoded) == DecodedMessage(timestamp, attempts, message_id, body)
