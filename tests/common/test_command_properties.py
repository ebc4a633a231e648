"""Property tests of the V2 command parser: round trips, fuzzing, and a bounded buffer."""

import struct

from hypothesis import given, settings
from hypothesis import strategies as st

from nsqpy.common.command import (
    CLS,
    MAGIC_V2,
    NOP,
    Command,
    encode_auth,
    encode_command,
    encode_dpub,
    encode_ext_body,
    encode_fin,
    encode_mpub,
    encode_mpub_body,
    encode_pub,
    encode_rdy,
    encode_req,
    encode_sub,
    encode_touch,
    encode_trace_body,
)
from nsqpy.common.command_parser import BODY_COMMANDS, CommandParser
from nsqpy.common.errors import ProtocolError

# -- strategies -------------------------------------------------------------------------------

plain_names = st.from_regex(r"[.a-zA-Z0-9_-]{1,64}", fullmatch=True)
ephemeral_names = st.from_regex(r"[.a-zA-Z0-9_-]{1,54}", fullmatch=True).map(
    lambda name: name + "#ephemeral"
)
names = st.one_of(plain_names, ephemeral_names)
# Any parameter bytes a line can carry: no space, no newline, no '\r' (which would be trimmed
# when last).
params = st.binary(max_size=24).map(
    lambda raw: raw.replace(b" ", b"_").replace(b"\n", b"_").replace(b"\r", b"_")
)
bodies = st.binary(min_size=1, max_size=300)
hex_ids = st.binary(min_size=8, max_size=8).map(lambda raw: raw.hex().encode())
binary_ids = st.binary(min_size=16, max_size=16)
partitions = st.integers(-1, 1023)
trace_ids = st.integers(0, 2**64 - 1)
# Names of commands the parser does not know (nsqd answers them with E_INVALID); never one of
# the fixed-offset ID commands, whose framing depends on the connection's mode.
unknown_names = st.from_regex(r"[A-Z_]{1,12}", fullmatch=True).filter(
    lambda name: name.encode() not in BODY_COMMANDS and name not in ("FIN", "REQ", "TOUCH")
)
ext_headers = st.dictionaries(
    st.text(max_size=8), st.one_of(st.text(max_size=8), st.integers()), max_size=3
)


def _case(wire: bytes, name: bytes, args: list, body=None, messages=None):
    return wire, Command(
        name, [a if isinstance(a, bytes) else str(a).encode() for a in args], body, messages
    )


@st.composite
def line_commands(draw, id_strategy):
    """Every command without a body, encoded with the client encoders."""
    kind = draw(
        st.sampled_from(
            ["SUB", "SUB_P", "SUB_ORDERED", "SUB_ADVANCED", "RDY", "FIN", "REQ", "TOUCH", "NOP",
             "CLS", "CREATE", "UNKNOWN"]
        )
    )  # fmt: skip
    topic, channel = draw(names), draw(names)
    if kind == "SUB":
        return _case(encode_sub(topic, channel), b"SUB", [topic, channel])
    if kind == "SUB_P":
        partition = draw(partitions)
        return _case(encode_sub(topic, channel, partition), b"SUB", [topic, channel, partition])
    if kind == "SUB_ORDERED":
        partition = draw(partitions)
        wire = encode_command("SUB_ORDERED", topic, channel, partition)
        return _case(wire, b"SUB_ORDERED", [topic, channel, partition])
    if kind == "SUB_ADVANCED":
        partition = draw(partitions)
        start = draw(st.sampled_from(["timestamp:1700000000", "virtual_queue:0", "special:-1"]))
        wire = encode_command("SUB_ADVANCED", topic, channel, partition, start)
        return _case(wire, b"SUB_ADVANCED", [topic, channel, partition, start])
    if kind == "RDY":
        count = draw(st.integers(0, 10_000))
        return _case(encode_rdy(count), b"RDY", [count])
    if kind == "FIN":
        message_id = draw(id_strategy)
        return _case(encode_fin(message_id), b"FIN", [message_id])
    if kind == "REQ":
        message_id, timeout = draw(id_strategy), draw(st.integers(0, 2**31))
        return _case(encode_req(message_id, timeout), b"REQ", [message_id, timeout])
    if kind == "TOUCH":
        message_id = draw(id_strategy)
        return _case(encode_touch(message_id), b"TOUCH", [message_id])
    if kind == "NOP":
        return _case(NOP, b"NOP", [])
    if kind == "CLS":
        return _case(CLS, b"CLS", [])
    if kind == "CREATE":
        partition, ext = draw(st.integers(0, 254)), draw(st.sampled_from(["true", "false"]))
        wire = encode_command("INTERNAL_CREATE_TOPIC", topic, partition, ext)
        return _case(wire, b"INTERNAL_CREATE_TOPIC", [topic, partition, ext])
    name = draw(unknown_names).encode()
    args = draw(st.lists(params, max_size=4))
    return _case(encode_command(name, *args), name, args)


@st.composite
def body_commands(draw):
    """Every body-carrying command, official and Youzan."""
    kind = draw(
        st.sampled_from(
            ["IDENTIFY", "AUTH", "PUB", "PUB_P", "DPUB", "MPUB", "PUB_TRACE", "PUB_EXT",
             "MPUB_TRACE", "MPUB_EXT"]
        )
    )  # fmt: skip
    topic = draw(names)
    partition = draw(st.lists(partitions, max_size=1))
    if kind == "IDENTIFY":
        body = draw(bodies)
        return _case(encode_command("IDENTIFY", body=body), b"IDENTIFY", [], body)
    if kind == "AUTH":
        body = draw(bodies)
        return _case(encode_auth(body), b"AUTH", [], body)
    if kind == "PUB":
        body = draw(bodies)
        return _case(encode_pub(topic, body), b"PUB", [topic], body)
    if kind == "PUB_P":
        body = draw(bodies)
        return _case(encode_pub(topic, body, *partition), b"PUB", [topic, *partition], body)
    if kind == "DPUB":
        body, defer_ms = draw(bodies), draw(st.integers(0, 3_600_000))
        return _case(encode_dpub(topic, defer_ms, body), b"DPUB", [topic, defer_ms], body)
    if kind == "MPUB":
        messages = draw(st.lists(bodies, min_size=1, max_size=5))
        wire = encode_mpub(topic, messages, *partition)
        return _case(wire, b"MPUB", [topic, *partition], encode_mpub_body(messages), messages)
    if kind == "PUB_TRACE":
        body = encode_trace_body(draw(trace_ids), draw(bodies))
        wire = encode_command("PUB_TRACE", topic, *partition, body=body)
        return _case(wire, b"PUB_TRACE", [topic, *partition], body)
    if kind == "PUB_EXT":
        body = encode_ext_body(draw(ext_headers), draw(bodies))
        wire = encode_command("PUB_EXT", topic, *partition, body=body)
        return _case(wire, b"PUB_EXT", [topic, *partition], body)
    if kind == "MPUB_TRACE":
        messages = [
            encode_trace_body(trace_id, data)
            for trace_id, data in draw(
                st.lists(st.tuples(trace_ids, bodies), min_size=1, max_size=4)
            )
        ]
        body = encode_mpub_body(messages)
        wire = encode_command("MPUB_TRACE", topic, *partition, body=body)
        return _case(wire, b"MPUB_TRACE", [topic, *partition], body, messages)
    messages = [
        encode_ext_body(header, data)
        for header, data in draw(st.lists(st.tuples(ext_headers, bodies), min_size=1, max_size=4))
    ]
    body = encode_mpub_body(messages)
    wire = encode_command("MPUB_EXT", topic, *partition, body=body)
    return _case(wire, b"MPUB_EXT", [topic, *partition], body, messages)


def chunked(data, wire: bytes) -> list[bytes]:
    """`wire` cut at arbitrary points drawn from `data`."""
    cuts = sorted(data.draw(st.sets(st.integers(0, len(wire)), max_size=30), label="cuts"))
    edges = [0, *cuts, len(wire)]
    return [wire[start:end] for start, end in zip(edges, edges[1:], strict=False)]


def feed(parser: CommandParser, chunks: list[bytes]) -> list[Command]:
    commands: list[Command] = []
    for chunk in chunks:
        parser.receive_data(chunk)
        commands.extend(parser)
    return commands


# -- round trips ------------------------------------------------------------------------------


@settings(max_examples=150, deadline=None)
@given(
    cases=st.lists(st.one_of(line_commands(hex_ids), body_commands()), min_size=1, max_size=12),
    with_magic=st.booleans(),
    data=st.data(),
)
def test_encode_then_parse_round_trips(cases, with_magic, data) -> None:
    wire = (MAGIC_V2 if with_magic else b"") + b"".join(wire for wire, _ in cases)
    parser = CommandParser(expect_magic=with_magic)
    assert feed(parser, chunked(data, wire)) == [command for _, command in cases]
    assert parser.buffered == 0
    parser.receive_eof()


@settings(max_examples=150, deadline=None)
@given(
    cases=st.lists(st.one_of(line_commands(binary_ids), body_commands()), min_size=1, max_size=12),
    data=st.data(),
)
def test_encode_then_parse_round_trips_with_binary_ids(cases, data) -> None:
    wire = b"".join(wire for wire, _ in cases)
    parser = CommandParser(expect_magic=False)
    parser.binary_ids = True
    assert feed(parser, chunked(data, wire)) == [command for _, command in cases]
    assert parser.buffered == 0


@settings(max_examples=100, deadline=None)
@given(
    before=st.lists(line_commands(hex_ids), max_size=4),
    after=st.lists(st.one_of(line_commands(binary_ids), body_commands()), max_size=6),
    partition=partitions,
    data=st.data(),
)
def test_binary_ids_switched_on_by_a_sub_mid_buffer(before, after, partition, data) -> None:
    # What nsqd does: a SUB with a partition switches the connection to binary IDs, and every
    # command behind it, even in the same chunk, is framed in the new mode.
    before = [case for case in before if not case[1].name.startswith(b"SUB")]
    sub = encode_sub("t", "c", partition)
    wire = b"".join(w for w, _ in before) + sub + b"".join(w for w, _ in after)
    parser = CommandParser(expect_magic=False)
    commands: list[Command] = []
    for chunk in chunked(data, wire):
        parser.receive_data(chunk)
        while (command := parser.next_command()) is not None:
            commands.append(command)
            if command.name == b"SUB":
                parser.binary_ids = True
    expected = [c for _, c in before] + [Command(b"SUB", [b"t", b"c", b"%d" % partition])]
    assert commands == expected + [c for _, c in after]


# -- fuzzing ----------------------------------------------------------------------------------

SMALL_LIMITS = {"max_msg_size": 32, "max_body_size": 64, "max_line_length": 40}

fragments = st.one_of(
    st.sampled_from(
        [b"PUB ", b"MPUB ", b"DPUB ", b"IDENTIFY", b"AUTH", b"PUB_TRACE ", b"PUB_EXT ",
         b"MPUB_TRACE ", b"MPUB_EXT ", b"FIN ", b"REQ ", b"TOUCH ", b"SUB ", b"NOP", b"t", b" ",
         b"\n", b"\r\n", b"\r", b"0", b"-1", b"x", b"#ephemeral", MAGIC_V2]
    ),
    st.integers(-3, 80).map(lambda n: struct.pack(">i", n)),
    st.binary(max_size=12),
)  # fmt: skip
garbage = st.one_of(st.binary(max_size=400), st.lists(fragments, max_size=60).map(b"".join))


def run(wire_chunks: list[bytes], expect_magic: bool, binary_ids: bool):
    """Feed the chunks as nsqd would; return what came out and the error that ended it."""
    parser = CommandParser(expect_magic=expect_magic, **SMALL_LIMITS)
    parser.binary_ids = binary_ids
    commands: list[Command] = []
    try:
        for chunk in wire_chunks:
            parser.receive_data(chunk)
            while (command := parser.next_command()) is not None:
                assert isinstance(command, Command)
                commands.append(command)
                if command.name == b"SUB":
                    parser.binary_ids = True
            # The whole point of the limits: whatever a peer sends, we hold at most this much.
            assert parser.buffered <= parser.buffer_limit
    except ProtocolError as error:
        return commands, error.text, None
    try:
        parser.receive_eof()
    except ProtocolError as error:
        return commands, None, error.text
    return commands, None, None


@settings(max_examples=1000, deadline=None)
@given(
    wire=garbage,
    magic=st.sampled_from(["none expected", "sent", "missing"]),
    binary_ids=st.booleans(),
    data=st.data(),
)
def test_arbitrary_bytes_give_commands_or_protocol_errors(wire, magic, binary_ids, data) -> None:
    expect_magic = magic != "none expected"
    if magic == "sent":
        wire = MAGIC_V2 + wire
    chunks = chunked(data, wire)
    commands, error, eof_error = run(chunks, expect_magic, binary_ids)
    # Any exception other than ProtocolError has already failed the test inside run().

    # The chunking must not change the outcome.
    whole = run([wire], expect_magic, binary_ids)
    assert (commands, error, eof_error) == whole


@settings(max_examples=300, deadline=None)
@given(wire=garbage, data=st.data())
def test_bytes_after_a_valid_prefix_never_crash(wire, data) -> None:
    prefix = encode_pub("t", b"x") + encode_mpub("t", [b"a"]) + encode_fin(b"0123456789abcdef")
    chunks = chunked(data, MAGIC_V2 + prefix + wire)
    commands, _, _ = run(chunks, expect_magic=True, binary_ids=False)
    assert [command.name for command in commands[:3]] == [b"PUB", b"MPUB", b"FIN"]
