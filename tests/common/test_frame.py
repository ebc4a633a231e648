"""Server→client frames (docs/protocol.md §1.3, §1.6): exact bytes out, whole frames back in."""

import struct
from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nsqpy.common.errors import ProtocolError
from nsqpy.common.frame import (
    CLOSE_WAIT_FRAME,
    FRAME_HEADER_SIZE,
    FRAME_TYPE_ERROR,
    FRAME_TYPE_MESSAGE,
    FRAME_TYPE_RESPONSE,
    HEARTBEAT_FRAME,
    OK_FRAME,
    Frame,
    FrameDecoder,
    encode_error,
    encode_frame,
    encode_message_frame,
    encode_message_frames,
    encode_response,
)
from nsqpy.common.message import DecodedMessage, decode_message, encode_message

MESSAGE_ID = b"0a1b2c3d4e5f6789"


def test_frame_type_numbers() -> None:
    assert (FRAME_TYPE_RESPONSE, FRAME_TYPE_ERROR, FRAME_TYPE_MESSAGE) == (0, 1, 2)
    assert FRAME_HEADER_SIZE == 8


def test_ok_frame_bytes() -> None:
    assert OK_FRAME == bytes.fromhex("00 00 00 06 00 00 00 00 4F 4B")
    assert encode_response(b"OK") == OK_FRAME


def test_heartbeat_and_close_wait_frames() -> None:
    assert HEARTBEAT_FRAME == b"\x00\x00\x00\x0f" + b"\x00\x00\x00\x00" + b"_heartbeat_"
    assert CLOSE_WAIT_FRAME == b"\x00\x00\x00\x0e" + b"\x00\x00\x00\x00" + b"CLOSE_WAIT"


def test_encode_frame_empty_and_typed() -> None:
    assert encode_frame(0, b"") == b"\x00\x00\x00\x04\x00\x00\x00\x00"
    assert encode_frame(7, b"ab") == b"\x00\x00\x00\x06\x00\x00\x00\x07ab"
    assert encode_response(b'{"a":1}') == b"\x00\x00\x00\x0b\x00\x00\x00\x00" + b'{"a":1}'


def test_error_frames() -> None:
    text = "E_INVALID invalid command FOO"
    assert encode_error(text) == struct.pack(">Ii", 4 + len(text), 1) + text.encode()
    assert encode_error(text.encode()) == encode_error(text)
    # The empty description keeps its space (SPEC §1.3).
    assert encode_error(ProtocolError("E_TOPIC_NOT_EXIST", "").text) == (
        b"\x00\x00\x00\x16\x00\x00\x00\x01E_TOPIC_NOT_EXIST "
    )
    assert encode_error(ProtocolError("E_BAD_PROTOCOL", None).text) == (
        b"\x00\x00\x00\x12\x00\x00\x00\x01E_BAD_PROTOCOL"
    )


def test_error_frame_keeps_raw_bytes_of_go_text() -> None:
    # `DPUB could not parse timeout %s` echoes the raw parameter, invalid UTF-8 included.
    text = b"\xff\xfe".decode("utf-8", "surrogateescape")
    assert encode_error(f"E_INVALID DPUB could not parse timeout {text}") == (
        b"\x00\x00\x00\x2d\x00\x00\x00\x01E_INVALID DPUB could not parse timeout \xff\xfe"
    )
    assert encode_error("é") == b"\x00\x00\x00\x06\x00\x00\x00\x01\xc3\xa9"


def test_message_frame_layout() -> None:
    # [size][type 2][8 ts][2 attempts][16 id][body] (SPEC §1.6)
    frame = encode_message_frame(0x0102030405060708, 0x0A0B, MESSAGE_ID, b"body")
    assert frame == (
        bytes.fromhex("00000022")  # size = 4 (type) + 26 (header) + 4 (body) = 34
        + bytes.fromhex("00000002")
        + bytes.fromhex("0102030405060708")
        + bytes.fromhex("0a0b")
        + MESSAGE_ID
        + b"body"
    )
    assert frame == encode_frame(2, encode_message(0x0102030405060708, 0x0A0B, MESSAGE_ID, b"body"))
    assert len(frame) == 4 + 4 + 8 + 2 + 16 + 4


def test_message_frame_with_empty_body_and_extremes() -> None:
    frame = encode_message_frame(-1, 65535, b"\xff" * 16, b"")
    assert frame == b"\x00\x00\x00\x1e\x00\x00\x00\x02" + b"\xff" * 8 + b"\xff\xff" + b"\xff" * 16


def test_message_frame_rejects_out_of_range_fields() -> None:
    with pytest.raises(struct.error):
        encode_message_frame(0, 65536, MESSAGE_ID, b"x")
    with pytest.raises(struct.error):
        encode_message_frame(0, -1, MESSAGE_ID, b"x")


def test_batch_equals_concatenation_of_single_frames() -> None:
    messages = [
        DecodedMessage(1, 1, MESSAGE_ID, b"a"),
        SimpleNamespace(timestamp=2, attempts=3, id=b"f" * 16, body=b""),
        DecodedMessage(1700000000000000000, 65535, b"\x00" * 16, b"x" * 1000),
    ]
    assert encode_message_frames(messages) == b"".join(
        encode_message_frame(m.timestamp, m.attempts, m.id, m.body) for m in messages
    )
    assert encode_message_frames([]) == b""
    assert encode_message_frames(iter(messages)) == encode_message_frames(messages)


def test_decoder_many_frames_in_one_chunk() -> None:
    decoder = FrameDecoder()
    wire = OK_FRAME + HEARTBEAT_FRAME + encode_error("E_INVALID x") + encode_frame(2, b"m" * 26)
    assert decoder.receive_data(wire) == [
        Frame(0, b"OK"),
        Frame(0, b"_heartbeat_"),
        Frame(1, b"E_INVALID x"),
        Frame(2, b"m" * 26),
    ]
    assert decoder.buffered == 0


def test_decoder_partial_frames() -> None:
    decoder = FrameDecoder()
    wire = OK_FRAME + CLOSE_WAIT_FRAME
    assert decoder.receive_data(wire[:3]) == []  # part of the size
    assert decoder.receive_data(wire[3:9]) == []  # header plus one data byte
    assert decoder.buffered == 9
    assert decoder.receive_data(wire[9:12]) == [Frame(0, b"OK")]
    assert decoder.buffered == 2
    assert decoder.receive_data(wire[12:]) == [Frame(0, b"CLOSE_WAIT")]
    assert decoder.buffered == 0
    assert decoder.receive_data(b"") == []


def test_decoder_byte_at_a_time() -> None:
    decoder = FrameDecoder()
    wire = OK_FRAME + encode_message_frame(5, 1, MESSAGE_ID, b"hi") + encode_frame(0, b"")
    frames = []
    for index in range(len(wire)):
        frames += decoder.receive_data(wire[index : index + 1])
    assert frames == [
        Frame(0, b"OK"),
        Frame(2, encode_message(5, 1, MESSAGE_ID, b"hi")),
        Frame(0, b""),
    ]


@pytest.mark.parametrize("size", [0, 1, 3])
def test_decoder_refuses_frame_size_below_four(size: int) -> None:
    decoder = FrameDecoder()
    with pytest.raises(ProtocolError) as caught:
        decoder.receive_data(struct.pack(">Ii", size, 0))
    assert caught.value.text == f"E_BAD_FRAME invalid frame size {size}"
    assert caught.value.fatal


def test_decoder_refuses_frame_size_above_max() -> None:
    decoder = FrameDecoder(max_frame_size=10)
    assert decoder.receive_data(encode_frame(0, b"123456")) == [Frame(0, b"123456")]
    with pytest.raises(ProtocolError, match=r"^E_BAD_FRAME invalid frame size 11$"):
        decoder.receive_data(encode_frame(0, b"1234567"))
    # The size field is unsigned: 0xffffffff is huge, not -1.
    with pytest.raises(ProtocolError, match=r"^E_BAD_FRAME invalid frame size 4294967295$"):
        FrameDecoder().receive_data(b"\xff\xff\xff\xff\x00\x00\x00\x00")


def test_decoder_refuses_a_bad_size_before_its_data_arrives() -> None:
    decoder = FrameDecoder(max_frame_size=100)
    with pytest.raises(ProtocolError):
        decoder.receive_data(struct.pack(">Ii", 101, 0))


def test_decoder_default_max_frame_size() -> None:
    assert FrameDecoder().max_frame_size == 64 * 1024 * 1024


# -- properties -------------------------------------------------------------------------------

frame_types = st.integers(-(2**31), 2**31 - 1)
datas = st.binary(max_size=200)
messages = st.builds(
    DecodedMessage,
    timestamp=st.integers(-(2**63), 2**63 - 1),
    attempts=st.integers(0, 65535),
    id=st.binary(min_size=16, max_size=16),
    body=st.binary(max_size=200),
)


def _chunks(data, wire: bytes) -> list[bytes]:
    cuts = sorted(data.draw(st.sets(st.integers(0, len(wire)), max_size=20)))
    edges = [0, *cuts, len(wire)]
    return [wire[start:end] for start, end in zip(edges, edges[1:], strict=False)]


@settings(max_examples=200, deadline=None)
@given(frames=st.lists(st.tuples(frame_types, datas), max_size=10), data=st.data())
def test_frames_round_trip_in_any_chunking(frames, data) -> None:
    wire = b"".join(encode_frame(frame_type, payload) for frame_type, payload in frames)
    decoder = FrameDecoder()
    decoded: list[Frame] = []
    for chunk in _chunks(data, wire):
        decoded += decoder.receive_data(chunk)
        assert decoder.buffered < FRAME_HEADER_SIZE + 200
    assert decoded == [Frame(frame_type, payload) for frame_type, payload in frames]
    assert decoder.buffered == 0


@settings(max_examples=200, deadline=None)
@given(batch=st.lists(messages, max_size=8), data=st.data())
def test_message_frames_round_trip(batch, data) -> None:
    wire = encode_message_frames(batch)
    decoder = FrameDecoder()
    frames: list[Frame] = []
    for chunk in _chunks(data, wire):
        frames += decoder.receive_data(chunk)
    assert [frame.frame_type for frame in frames] == [FRAME_TYPE_MESSAGE] * len(batch)
    assert [decode_message(frame.data) for frame in frames] == batch


@settings(max_examples=200, deadline=None)
@given(wire=st.binary(max_size=300), data=st.data())
def test_decoder_on_arbitrary_bytes_gives_frames_or_protocol_error(wire, data) -> None:
    decoder = FrameDecoder(max_frame_size=64)
    try:
        for chunk in _chunks(data, wire):
            decoder.receive_data(chunk)
            assert decoder.buffered < 4 + 64
    except ProtocolError as error:
        assert error.code == "E_BAD_FRAME"
