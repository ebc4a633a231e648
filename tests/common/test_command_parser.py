"""The sans-IO V2 command parser (docs/protocol.md §1.2, §2, §3): every command, every error
text."""

import json
import struct

import pytest

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
    encode_identify,
    encode_mpub,
    encode_mpub_body,
    encode_pub,
    encode_rdy,
    encode_req,
    encode_sub,
    encode_touch,
    encode_trace_body,
    split_ext_body,
    split_trace_body,
)
from nsqpy.common.command_parser import (
    BODY_COMMANDS,
    DEFAULT_MAX_LINE_LENGTH,
    CommandParser,
    named_partition,
    parse_mpub_body,
    parse_partition,
)
from nsqpy.common.errors import ProtocolError

# Small limits so that the "too big" texts are short and every boundary is cheap to reach.
MAX_MSG = 100
MAX_BODY = 200
MAX_REQ_MS = 3_600_000
LIMITS = {"max_msg_size": MAX_MSG, "max_body_size": MAX_BODY, "max_req_timeout_ms": MAX_REQ_MS}

HEX_ID = b"0123456789abcdef"
# A Youzan binary ID holding every byte a line-based parser would trip on (docs/protocol.md §1.2).
BINARY_ID = b"\n \r\x00id\n\nA B\r\r\n \xff"


def size(value: int) -> bytes:
    return struct.pack(">i", value)


def make_parser(**options) -> CommandParser:
    settings = {"expect_magic": False, **LIMITS}
    settings.update(options)
    return CommandParser(**settings)


def parse_all(data: bytes, **options) -> list[Command]:
    parser = make_parser(**options)
    parser.receive_data(data)
    return list(parser)


def parse_bytewise(data: bytes, **options) -> list[Command]:
    parser = make_parser(**options)
    commands: list[Command] = []
    for index in range(len(data)):
        parser.receive_data(data[index : index + 1])
        commands.extend(parser)
    return commands


def parse_error(data: bytes, *, eof: bool = False, **options) -> ProtocolError:
    """The error `data` makes the parser raise, while parsing or at the end of the stream."""
    parser = make_parser(**options)
    parser.receive_data(data)
    with pytest.raises(ProtocolError) as caught:
        list(parser)
        if eof:
            parser.receive_eof()
    return caught.value


def test_all_body_commands_are_known() -> None:
    assert set(BODY_COMMANDS) == {
        b"IDENTIFY",
        b"AUTH",
        b"PUB",
        b"DPUB",
        b"MPUB",
        b"PUB_TRACE",
        b"PUB_EXT",
        b"MPUB_TRACE",
        b"MPUB_EXT",
        b"PUB_SEQ",
        b"MPUB_SEQ",
        b"MPUB_EXT_SEQ",
    }


# -- every command of SPEC §2 and §3 ---------------------------------------------------------

IDENTIFY_BODY = json.dumps({"client_id": "c", "feature_negotiation": True}).encode()
MPUB_BODIES = [b"one", b"two\n", b"\x00\x00\x00\x01"]
TRACE_BODY = encode_trace_body(0x1234, b"traced")
EXT_BODY = encode_ext_body({"##trace_id": "7"}, b"data")

COMMANDS = [
    ("IDENTIFY", encode_identify({"client_id": "c", "feature_negotiation": True}),
     Command(b"IDENTIFY", [], IDENTIFY_BODY)),
    ("IDENTIFY extra params ignored", encode_command("IDENTIFY", "x", body=b"{}"),
     Command(b"IDENTIFY", [b"x"], b"{}")),
    ("AUTH", encode_auth("s3cret"), Command(b"AUTH", [], b"s3cret")),
    ("SUB", encode_sub("t", "c"), Command(b"SUB", [b"t", b"c"])),
    ("SUB partition", encode_sub("t", "c", 0), Command(b"SUB", [b"t", b"c", b"0"])),
    ("SUB insufficient is nsqd's job", b"SUB t\n", Command(b"SUB", [b"t"])),
    ("RDY", encode_rdy(2500), Command(b"RDY", [b"2500"])),
    ("FIN", encode_fin(HEX_ID), Command(b"FIN", [HEX_ID])),
    ("REQ", encode_req(HEX_ID, 1000), Command(b"REQ", [HEX_ID, b"1000"])),
    ("TOUCH", encode_touch(HEX_ID), Command(b"TOUCH", [HEX_ID])),
    ("CLS", CLS, Command(b"CLS", [])),
    ("NOP", NOP, Command(b"NOP", [])),
    ("PUB", encode_pub("t", b"hello\nworld"), Command(b"PUB", [b"t"], b"hello\nworld")),
    ("PUB partition", encode_pub("t", b"x", 3), Command(b"PUB", [b"t", b"3"], b"x")),
    ("PUB max size", encode_pub("t", b"m" * MAX_MSG), Command(b"PUB", [b"t"], b"m" * MAX_MSG)),
    ("PUB ephemeral", encode_pub("t#ephemeral", b"x"), Command(b"PUB", [b"t#ephemeral"], b"x")),
    ("MPUB", encode_mpub("t", MPUB_BODIES),
     Command(b"MPUB", [b"t"], encode_mpub_body(MPUB_BODIES), MPUB_BODIES)),
    ("MPUB partition", encode_mpub("t", [b"a"], 1),
     Command(b"MPUB", [b"t", b"1"], encode_mpub_body([b"a"]), [b"a"])),
    ("DPUB", encode_dpub("t", 1500, b"later"), Command(b"DPUB", [b"t", b"1500"], b"later")),
    ("DPUB zero", encode_dpub("t", 0, b"now"), Command(b"DPUB", [b"t", b"0"], b"now")),
    ("DPUB max", encode_dpub("t", MAX_REQ_MS, b"x"),
     Command(b"DPUB", [b"t", b"%d" % MAX_REQ_MS], b"x")),
    # ByteToBase10 of an empty parameter is 0, not an error.
    ("DPUB empty timeout", b"DPUB t \n" + size(1) + b"x", Command(b"DPUB", [b"t", b""], b"x")),
    ("PUB_TRACE", encode_command("PUB_TRACE", "t", body=TRACE_BODY),
     Command(b"PUB_TRACE", [b"t"], TRACE_BODY)),
    ("PUB_TRACE partition", encode_command("PUB_TRACE", "t", -1, body=TRACE_BODY),
     Command(b"PUB_TRACE", [b"t", b"-1"], TRACE_BODY)),
    # Youzan parses the partition only when it is the last of exactly three params (§3.3).
    ("PUB_TRACE 4 params", encode_command("PUB_TRACE", "t", "x", "y", body=TRACE_BODY),
     Command(b"PUB_TRACE", [b"t", b"x", b"y"], TRACE_BODY)),
    # Youzan does not validate PUB-family topic names (§3.3).
    ("PUB_TRACE any topic", encode_command("PUB_TRACE", "b@d", body=TRACE_BODY),
     Command(b"PUB_TRACE", [b"b@d"], TRACE_BODY)),
    ("PUB_EXT", encode_command("PUB_EXT", "t", 0, body=EXT_BODY),
     Command(b"PUB_EXT", [b"t", b"0"], EXT_BODY)),
    ("PUB_EXT empty header", encode_command("PUB_EXT", "t", body=b"\x00\x00x"),
     Command(b"PUB_EXT", [b"t"], b"\x00\x00x")),
    ("MPUB_TRACE", encode_command("MPUB_TRACE", "t", 2, body=encode_mpub_body([TRACE_BODY] * 2)),
     Command(b"MPUB_TRACE", [b"t", b"2"], encode_mpub_body([TRACE_BODY] * 2), [TRACE_BODY] * 2)),
    ("MPUB_EXT", encode_command("MPUB_EXT", "t", body=encode_mpub_body([EXT_BODY])),
     Command(b"MPUB_EXT", [b"t"], encode_mpub_body([EXT_BODY]), [EXT_BODY])),
    ("SUB_ORDERED", encode_command("SUB_ORDERED", "t", "c", 0),
     Command(b"SUB_ORDERED", [b"t", b"c", b"0"])),
    ("SUB_ADVANCED", encode_command("SUB_ADVANCED", "t", "c", 1, "timestamp:1700000000"),
     Command(b"SUB_ADVANCED", [b"t", b"c", b"1", b"timestamp:1700000000"])),
    ("INTERNAL_CREATE_TOPIC", encode_command("INTERNAL_CREATE_TOPIC", "t", 4, "true"),
     Command(b"INTERNAL_CREATE_TOPIC", [b"t", b"4", b"true"])),
    ("unknown name", b"HELLO a b\n", Command(b"HELLO", [b"a", b"b"])),
    ("lowercase is unknown", b"pub t\n", Command(b"pub", [b"t"])),
    ("empty line", b"\n", Command(b"", [])),
    ("double space gives an empty param", b"SUB  t\n", Command(b"SUB", [b"", b"t"])),
    ("trailing space gives an empty param", b"RDY 1 \n", Command(b"RDY", [b"1", b""])),
]  # fmt: skip


@pytest.mark.parametrize(
    ("wire", "expected"), [c[1:] for c in COMMANDS], ids=[c[0] for c in COMMANDS]
)
def test_each_command_parses(wire: bytes, expected: Command) -> None:
    assert parse_all(wire) == [expected]
    assert parse_bytewise(wire) == [expected]


def test_all_commands_in_one_buffer() -> None:
    wire = b"".join(c[1] for c in COMMANDS)
    expected = [c[2] for c in COMMANDS]
    assert parse_all(wire) == expected
    assert parse_bytewise(wire) == expected


def test_all_commands_after_the_magic_split_anywhere() -> None:
    wire = MAGIC_V2 + b"".join(c[1] for c in COMMANDS)
    expected = [c[2] for c in COMMANDS]
    for cut in range(0, len(wire), 7):
        parser = make_parser(expect_magic=True)
        parser.receive_data(wire[:cut])
        commands = list(parser)
        parser.receive_data(wire[cut:])
        commands.extend(parser)
        assert commands == expected


@pytest.mark.parametrize(
    ("wire", "expected"),
    [
        (b"NOP\r\n", Command(b"NOP", [])),
        (b"SUB t c\r\n", Command(b"SUB", [b"t", b"c"])),
        (b"REQ " + HEX_ID + b" 10\r\n", Command(b"REQ", [HEX_ID, b"10"])),
        (b"PUB t\r\n" + size(2) + b"\r\n", Command(b"PUB", [b"t"], b"\r\n")),
        (b"DPUB t 5\r\n" + size(1) + b"x", Command(b"DPUB", [b"t", b"5"], b"x")),
        # Only one '\r' is trimmed, and only right before the '\n'.
        (b"NOP\r\r\n", Command(b"NOP\r", [])),
        (b"SUB t\r c\n", Command(b"SUB", [b"t\r", b"c"])),
        (b"\r\n", Command(b"", [])),
    ],
)
def test_crlf_line_endings(wire: bytes, expected: Command) -> None:
    assert parse_all(wire) == [expected]
    assert parse_bytewise(wire) == [expected]


def test_magic_is_consumed_then_commands_follow() -> None:
    parser = make_parser(expect_magic=True)
    for byte in MAGIC_V2:
        assert not parser.magic_received
        parser.receive_data(bytes([byte]))
        assert parser.next_command() is None
    assert parser.magic_received
    parser.receive_data(NOP)
    assert parser.next_command() == Command(b"NOP", [])


def test_next_command_hands_out_one_command_at_a_time() -> None:
    parser = make_parser()
    parser.receive_data(NOP + CLS + encode_pub("t", b"x"))
    assert parser.next_command() == Command(b"NOP", [])
    assert parser.next_command() == Command(b"CLS", [])
    assert parser.next_command() == Command(b"PUB", [b"t"], b"x")
    assert parser.next_command() is None
    assert parser.buffered == 0


def test_waits_for_a_whole_body_before_returning_it() -> None:
    parser = make_parser()
    parser.receive_data(b"PUB t\n" + size(5) + b"ab")
    assert parser.next_command() is None
    assert parser.buffered == 2 + 4
    parser.receive_data(b"cd")
    assert parser.next_command() is None
    parser.receive_data(b"e" + NOP)
    assert list(parser) == [Command(b"PUB", [b"t"], b"abcde"), Command(b"NOP", [])]


def test_empty_receive_data_is_harmless() -> None:
    parser = make_parser()
    parser.receive_data(b"")
    assert parser.next_command() is None
    parser.receive_data(b"NO")
    parser.receive_data(b"")
    parser.receive_data(b"P\n")
    assert list(parser) == [Command(b"NOP", [])]


def test_buffer_limit_and_buffered() -> None:
    parser = make_parser(max_line_length=40)
    assert parser.buffer_limit == 40 + 1 + 4 + MAX_BODY
    assert CommandParser().buffer_limit == DEFAULT_MAX_LINE_LENGTH + 1 + 4 + 5 * 1024 * 1024
    parser.receive_data(b"SUB t")
    assert parser.buffered == 5
    assert list(parser) == []
    parser.receive_data(b" c\nRDY")
    assert list(parser) == [Command(b"SUB", [b"t", b"c"])]
    assert parser.buffered == 3


def test_receive_eof_between_commands_or_mid_line_is_silent() -> None:
    # Go closes the connection without a reply when ReadSlice hits EOF.
    parser = make_parser(expect_magic=True)
    parser.receive_eof()
    parser.receive_data(b"  V")
    assert list(parser) == []
    parser.receive_eof()
    parser.receive_data(b"2NOP\nSUB t")
    assert list(parser) == [Command(b"NOP", [])]
    parser.receive_eof()


def test_body_commands_are_not_split_on_newlines_in_the_body() -> None:
    body = b"NOP\nCLS\n"
    assert parse_all(encode_pub("t", body) + NOP) == [
        Command(b"PUB", [b"t"], body),
        Command(b"NOP", []),
    ]


# -- every error text ------------------------------------------------------------------------

BAD_TOPICS = [
    (b"", '""'),
    (b'a"b', '"a\\"b"'),
    (b"b@d", '"b@d"'),
    (b"\xc3\xa9t\xc3\xa9", '"été"'),
    (b"\xff", '"\\xff"'),
    (b"a\tb", '"a\\tb"'),
    (b"a\x00", '"a\\x00"'),
    (b"a" * 65, '"' + "a" * 65 + '"'),
    (b"#ephemeral", '"#ephemeral"'),
    (b"t#ephemeral#ephemeral", '"t#ephemeral#ephemeral"'),
]


def _bad_topic_cases() -> list:
    cases = []
    for raw, quoted in BAD_TOPICS:
        cases.append(
            (
                f"PUB {quoted}",
                b"PUB " + raw + b"\n",
                f"E_BAD_TOPIC PUB topic name {quoted} is not valid",
            )
        )
        cases.append(
            (
                f"DPUB {quoted}",
                b"DPUB " + raw + b" 10\n",
                f"E_BAD_TOPIC DPUB topic name {quoted} is not valid",
            )
        )
        cases.append(
            (
                f"MPUB {quoted}",
                b"MPUB " + raw + b"\n",
                f"E_BAD_TOPIC E_BAD_TOPIC MPUB topic name {quoted} is not valid",
            )
        )
    return cases


def _mpub(body: bytes, name: bytes = b"MPUB") -> bytes:
    return name + b" t\n" + size(len(body)) + body


def _messages(*parts: bytes | int) -> bytes:
    """An MPUB body from ints (4-byte sizes / counts) and raw bytes."""
    return b"".join(size(part) if isinstance(part, int) else part for part in parts)


WRAPPED_HUGE_TIMEOUT = (10**5000 - 1) % (1 << 64)

ERRORS = [
    # magic (SPEC §1.1): the raw code, no trailing space
    ("bad magic", b"  V1", {"expect_magic": True}, "E_BAD_PROTOCOL"),
    ("command instead of magic", b"NOP\n", {"expect_magic": True}, "E_BAD_PROTOCOL"),
    ("V2 without spaces", b"V2  ", {"expect_magic": True}, "E_BAD_PROTOCOL"),
    # IDENTIFY (§2.1)
    ("IDENTIFY too big", b"IDENTIFY\n" + size(MAX_BODY + 1), {},
     "E_BAD_BODY IDENTIFY body too big 201 > 200"),
    ("IDENTIFY size 0", b"IDENTIFY\n" + size(0), {}, "E_BAD_BODY IDENTIFY invalid body size 0"),
    ("IDENTIFY size -1", b"IDENTIFY\n" + b"\xff\xff\xff\xff", {},
     "E_BAD_BODY IDENTIFY invalid body size -1"),
    # AUTH (§2.2)
    ("AUTH with a param", b"AUTH x\n", {}, "E_INVALID AUTH invalid number of parameters"),
    ("AUTH with an empty param", b"AUTH \n", {}, "E_INVALID AUTH invalid number of parameters"),
    ("AUTH too big", b"AUTH\n" + size(MAX_BODY + 1), {}, "E_BAD_BODY AUTH body too big 201 > 200"),
    ("AUTH size 0", b"AUTH\n" + size(0), {}, "E_BAD_BODY AUTH invalid body size 0"),
    ("AUTH size negative", b"AUTH\n" + size(-7), {}, "E_BAD_BODY AUTH invalid body size -7"),
    # PUB (§2.7)
    ("PUB no topic", b"PUB\n", {}, "E_INVALID PUB insufficient number of parameters"),
    ("PUB no topic CRLF", b"PUB\r\n", {}, "E_INVALID PUB insufficient number of parameters"),
    ("PUB size 0", b"PUB t\n" + size(0), {}, "E_BAD_MESSAGE PUB invalid message body size 0"),
    ("PUB size -1", b"PUB t\n" + size(-1), {}, "E_BAD_MESSAGE PUB invalid message body size -1"),
    ("PUB too big", b"PUB t\n" + size(MAX_MSG + 1), {},
     "E_BAD_MESSAGE PUB message too big 101 > 100"),
    ("PUB too big for default limit", b"PUB t\n" + size(1024 * 1024 + 1),
     {"max_msg_size": 1024 * 1024}, "E_BAD_MESSAGE PUB message too big 1048577 > 1048576"),
    # DPUB (§2.9)
    ("DPUB no params", b"DPUB\n", {}, "E_INVALID DPUB insufficient number of parameters"),
    ("DPUB no timeout", b"DPUB t\n", {}, "E_INVALID DPUB insufficient number of parameters"),
    ("DPUB bad topic before bad timeout", b"DPUB b@d x\n", {},
     'E_BAD_TOPIC DPUB topic name "b@d" is not valid'),
    ("DPUB timeout text", b"DPUB t x\n", {}, "E_INVALID DPUB could not parse timeout x"),
    ("DPUB timeout negative", b"DPUB t -1\n", {}, "E_INVALID DPUB could not parse timeout -1"),
    ("DPUB timeout plus", b"DPUB t +1\n", {}, "E_INVALID DPUB could not parse timeout +1"),
    ("DPUB timeout CR inside", b"DPUB t 1\r0\n", {}, "E_INVALID DPUB could not parse timeout 1\r0"),
    ("DPUB timeout raw bytes", b"DPUB t \xff\n", {},
     "E_INVALID DPUB could not parse timeout \udcff"),
    ("DPUB timeout over max", b"DPUB t 3600001\n", {},
     "E_INVALID DPUB timeout 3600001 out of range 0-3600000"),
    ("DPUB timeout other max", b"DPUB t 11\n", {"max_req_timeout_ms": 10},
     "E_INVALID DPUB timeout 11 out of range 0-10"),
    ("DPUB timeout uint64 max", b"DPUB t 18446744073709551615\n", {},
     "E_INVALID DPUB timeout 18446744073709551615 out of range 0-3600000"),
    # Go's ByteToBase10 wraps in a uint64; Python's int() would refuse 5000 digits outright.
    ("DPUB timeout 5000 digits", b"DPUB t " + b"9" * 5000 + b"\n", {},
     f"E_INVALID DPUB timeout {WRAPPED_HUGE_TIMEOUT} out of range 0-3600000"),
    ("DPUB size 0", b"DPUB t 1\n" + size(0), {}, "E_BAD_MESSAGE DPUB invalid message body size 0"),
    ("DPUB too big", b"DPUB t 1\n" + size(MAX_MSG + 1), {},
     "E_BAD_MESSAGE DPUB message too big 101 > 100"),
    # MPUB (§2.8)
    ("MPUB no topic", b"MPUB\n", {}, "E_INVALID MPUB insufficient number of parameters"),
    ("MPUB size 0", b"MPUB t\n" + size(0), {}, "E_BAD_BODY MPUB invalid body size 0"),
    ("MPUB size negative", b"MPUB t\n" + size(-2), {}, "E_BAD_BODY MPUB invalid body size -2"),
    ("MPUB too big", b"MPUB t\n" + size(MAX_BODY + 1), {},
     "E_BAD_BODY MPUB body too big 201 > 200"),
    # MPUB's body is bounded by max-body-size, not max-msg-size
    ("MPUB body short of a count", _mpub(b"\x00\x00\x01"), {},
     "E_BAD_BODY MPUB failed to read message count"),
    ("MPUB count 0", _mpub(_messages(0)), {}, "E_BAD_BODY MPUB invalid message count 0"),
    ("MPUB count -1", _mpub(_messages(-1, 1, b"x")), {},
     "E_BAD_BODY MPUB invalid message count -1"),
    # (200 - 4) // 5 == 39 messages at most
    ("MPUB count over max", _mpub(_messages(40, 1, b"x")), {},
     "E_BAD_BODY MPUB invalid message count 40"),
    ("MPUB count at max", _mpub(_messages(39, 1, b"x")), {},
     "E_BAD_MESSAGE MPUB failed to read message(1) body size"),
    ("MPUB message(0) size 0", _mpub(_messages(1, 0)), {},
     "E_BAD_MESSAGE MPUB invalid message(0) body size 0"),
    ("MPUB message(1) size -1", _mpub(_messages(2, 1, b"x", -1)), {},
     "E_BAD_MESSAGE MPUB invalid message(1) body size -1"),
    ("MPUB message too big", _mpub(_messages(1, MAX_MSG + 1)), {},
     "E_BAD_MESSAGE MPUB message too big 101 > 100"),
    ("MPUB message(1) size cut", _mpub(_messages(2, 1, b"x", b"\x00\x00")), {},
     "E_BAD_MESSAGE MPUB failed to read message(1) body size"),
    ("MPUB message body cut", _mpub(_messages(1, 10, b"12345")), {},
     "E_BAD_MESSAGE MPUB failed to read message body"),
    ("MPUB body longer than messages", _mpub(_messages(1, 1, b"x", b"abc")), {},
     "E_BAD_BODY MPUB body size 12 does not match its 1 messages (9 bytes)"),
    # Youzan PUB_TRACE / PUB_EXT (§3.3, §3.6)
    ("PUB_TRACE no topic", b"PUB_TRACE\n", {}, "E_INVALID insufficient number of parameters"),
    ("PUB_TRACE partition x", b"PUB_TRACE t x\n", {},
     'E_BAD_PARTITION topic partition is not valid: strconv.Atoi: parsing "x": invalid syntax'),
    ("PUB_TRACE partition empty", b"PUB_TRACE t \n", {},
     'E_BAD_PARTITION topic partition is not valid: strconv.Atoi: parsing "": invalid syntax'),
    ("PUB_TRACE partition spaces", b"PUB_TRACE t 1_0\n", {},
     'E_BAD_PARTITION topic partition is not valid: strconv.Atoi: parsing "1_0": invalid syntax'),
    ("PUB_TRACE partition range", b"PUB_TRACE t 9223372036854775808\n", {},
     "E_BAD_PARTITION topic partition is not valid: "
     'strconv.Atoi: parsing "9223372036854775808": value out of range'),
    ("PUB_TRACE size 0", b"PUB_TRACE t\n" + size(0), {}, "E_BAD_BODY invalid body size 0"),
    ("PUB_TRACE size -1", b"PUB_TRACE t\n" + size(-1), {}, "E_BAD_BODY invalid body size -1"),
    ("PUB_TRACE too big", b"PUB_TRACE t\n" + size(MAX_MSG + 1), {},
     "E_BAD_MESSAGE message too big 101 > 100"),
    ("PUB_TRACE size 8", b"PUB_TRACE t\n" + size(8), {},
     "E_BAD_BODY invalid body size 8 with trace id enabled"),
    ("PUB_EXT no topic", b"PUB_EXT\n", {}, "E_INVALID insufficient number of parameters"),
    ("PUB_EXT partition é", "PUB_EXT t é\n".encode(), {},
     'E_BAD_PARTITION topic partition is not valid: strconv.Atoi: parsing "é": invalid syntax'),
    ("PUB_EXT size 0", b"PUB_EXT t\n" + size(0), {}, "E_BAD_BODY invalid body size 0"),
    ("PUB_EXT too big", b"PUB_EXT t\n" + size(MAX_MSG + 1), {},
     "E_BAD_MESSAGE message too big 101 > 100"),
    ("PUB_EXT size 2", b"PUB_EXT t\n" + size(2), {},
     "E_BAD_BODY invalid body size 2 with ext json header enabled"),
    ("PUB_EXT json longer than body", b"PUB_EXT t\n" + size(7) + b"\x00\x05abcde", {},
     "E_BAD_BODY invalid body size 7 in ext json header content length"),
    # Youzan MPUB_TRACE / MPUB_EXT
    ("MPUB_TRACE no topic", b"MPUB_TRACE\n", {}, "E_INVALID insufficient number of parameters"),
    ("MPUB_TRACE partition", b"MPUB_TRACE t 0x1\n", {},
     'E_BAD_PARTITION topic partition is not valid: strconv.Atoi: parsing "0x1": invalid syntax'),
    ("MPUB_TRACE size 0", b"MPUB_TRACE t\n" + size(0), {}, "E_BAD_BODY invalid body size 0"),
    ("MPUB_TRACE too big", b"MPUB_TRACE t\n" + size(MAX_BODY + 1), {},
     "E_BAD_BODY body too big 201 > 200"),
    ("MPUB_TRACE count 0", _mpub(_messages(0), b"MPUB_TRACE"), {},
     "E_BAD_BODY MPUB invalid message count 0"),
    ("MPUB_TRACE message size 8", _mpub(_messages(1, 8, b"12345678"), b"MPUB_TRACE"), {},
     "E_BAD_MESSAGE MPUB invalid message(0) body size 8 for tracing"),
    ("MPUB_TRACE message(1) size 1", _mpub(_messages(2, 9, b"123456789", 1, b"x"), b"MPUB_TRACE"),
     {}, "E_BAD_MESSAGE MPUB invalid message(1) body size 1 for tracing"),
    # Youzan checks `<= 0` first, with the official text and no " for tracing".
    ("MPUB_TRACE message size 0", _mpub(_messages(1, 0), b"MPUB_TRACE"), {},
     "E_BAD_MESSAGE MPUB invalid message(0) body size 0"),
    ("MPUB_TRACE message too big", _mpub(_messages(1, MAX_MSG + 1), b"MPUB_TRACE"), {},
     "E_BAD_MESSAGE MPUB message too big 101 > 100"),
    ("MPUB_EXT no topic", b"MPUB_EXT\n", {}, "E_INVALID insufficient number of parameters"),
    ("MPUB_EXT partition -", b"MPUB_EXT t -\n", {},
     'E_BAD_PARTITION topic partition is not valid: strconv.Atoi: parsing "-": invalid syntax'),
    ("MPUB_EXT size -5", b"MPUB_EXT t\n" + size(-5), {}, "E_BAD_BODY invalid body size -5"),
    ("MPUB_EXT too big", b"MPUB_EXT t\n" + size(MAX_BODY + 1), {},
     "E_BAD_BODY body too big 201 > 200"),
    ("MPUB_EXT message size 0", _mpub(_messages(1, 0), b"MPUB_EXT"), {},
     "E_BAD_MESSAGE MPUB invalid message(0) body size 0"),
    # over-long line
    ("line too long", b"x" * 41, {"max_line_length": 40},
     "E_INVALID command line longer than 40 bytes"),
    ("line too long after commands", NOP + b"SUB " + b"t" * 40, {"max_line_length": 40},
     "E_INVALID command line longer than 40 bytes"),
    ("binary FIN waits for its ID, then too long", b"FIN \n" + b"x" * 40,
     {"max_line_length": 40, "binary_ids": True},
     "E_INVALID command line longer than 40 bytes"),
]  # fmt: skip
ERRORS += [(name, wire, {}, text) for name, wire, text in _bad_topic_cases()]


@pytest.mark.parametrize(
    ("wire", "options", "text"), [e[1:] for e in ERRORS], ids=[e[0] for e in ERRORS]
)
def test_error_text(wire: bytes, options: dict, text: str) -> None:
    options = dict(options)
    binary_ids = options.pop("binary_ids", False)
    for feed in ("whole", "bytewise"):
        parser = make_parser(**options)
        parser.binary_ids = binary_ids
        with pytest.raises(ProtocolError) as caught:
            if feed == "whole":
                parser.receive_data(wire)
                list(parser)
            else:
                for index in range(len(wire)):
                    parser.receive_data(wire[index : index + 1])
                    list(parser)
        error = caught.value
        assert error.text == text, feed
        assert str(error) == text
        assert error.fatal
        assert error.code == text.split(" ", 1)[0]


def test_bad_magic_has_no_description() -> None:
    error = parse_error(b"  V3", expect_magic=True)
    assert error.code == "E_BAD_PROTOCOL"
    assert error.description is None
    assert error.text == "E_BAD_PROTOCOL"


# Errors Go sends when the stream ends inside a command: io.ReadFull fails on the size or body.
EOF_ERRORS = [
    ("IDENTIFY no size", b"IDENTIFY\n", "E_BAD_BODY IDENTIFY failed to read body size"),
    ("IDENTIFY half size", b"IDENTIFY\n\x00\x00", "E_BAD_BODY IDENTIFY failed to read body size"),
    ("IDENTIFY no body", b"IDENTIFY\n" + size(2), "E_BAD_BODY IDENTIFY failed to read body"),
    ("IDENTIFY half body", b"IDENTIFY\n" + size(2) + b"{",
     "E_BAD_BODY IDENTIFY failed to read body"),
    ("AUTH no size", b"AUTH\n\x00", "E_BAD_BODY AUTH failed to read body size"),
    ("AUTH half body", b"AUTH\n" + size(3) + b"ab", "E_BAD_BODY AUTH failed to read body"),
    ("PUB no size", b"PUB t\n", "E_BAD_MESSAGE PUB failed to read message body size"),
    ("PUB half size", b"PUB t\n\x00\x00\x00", "E_BAD_MESSAGE PUB failed to read message body size"),
    ("PUB half body", b"PUB t\n" + size(3) + b"ab",
     "E_BAD_MESSAGE PUB failed to read message body"),
    ("DPUB no size", b"DPUB t 0\n", "E_BAD_MESSAGE DPUB failed to read message body size"),
    ("DPUB no body", b"DPUB t 0\n" + size(1), "E_BAD_MESSAGE DPUB failed to read message body"),
    ("MPUB no size", b"MPUB t\n", "E_BAD_BODY MPUB failed to read body size"),
    ("MPUB no count", b"MPUB t\n" + size(9), "E_BAD_BODY MPUB failed to read message count"),
    ("MPUB half count", b"MPUB t\n" + size(9) + b"\x00\x00",
     "E_BAD_BODY MPUB failed to read message count"),
    ("MPUB bad count", b"MPUB t\n" + size(9) + _messages(0),
     "E_BAD_BODY MPUB invalid message count 0"),
    ("MPUB no message size", b"MPUB t\n" + size(9) + _messages(1),
     "E_BAD_MESSAGE MPUB failed to read message(0) body size"),
    ("MPUB bad message size", b"MPUB t\n" + size(9) + _messages(1, 0),
     "E_BAD_MESSAGE MPUB invalid message(0) body size 0"),
    ("MPUB message too big", b"MPUB t\n" + size(20) + _messages(1, MAX_MSG + 1),
     "E_BAD_MESSAGE MPUB message too big 101 > 100"),
    ("MPUB mid message", b"MPUB t\n" + size(11) + _messages(1, 3, b"ab"),
     "E_BAD_MESSAGE MPUB failed to read message body"),
    ("MPUB second message size", b"MPUB t\n" + size(30) + _messages(2, 1, b"x", b"\x00"),
     "E_BAD_MESSAGE MPUB failed to read message(1) body size"),
    ("MPUB mid second message", b"MPUB t\n" + size(30) + _messages(2, 1, b"x", 5, b"abc"),
     "E_BAD_MESSAGE MPUB failed to read message body"),
    ("PUB_TRACE no size", b"PUB_TRACE t\n", "E_BAD_BODY failed to read body size"),
    ("PUB_TRACE half body", b"PUB_TRACE t\n" + size(10) + b"12345",
     "E_BAD_MESSAGE failed to read message body"),
    ("PUB_EXT no size", b"PUB_EXT t 1\n\x00", "E_BAD_BODY failed to read body size"),
    ("PUB_EXT no body", b"PUB_EXT t 1\n" + size(10), "E_BAD_MESSAGE failed to read message body"),
    ("MPUB_TRACE no size", b"MPUB_TRACE t\n", "E_BAD_BODY failed to read body size"),
    ("MPUB_TRACE no count", b"MPUB_TRACE t\n" + size(30),
     "E_BAD_BODY MPUB failed to read message count"),
    ("MPUB_TRACE short message", b"MPUB_TRACE t\n" + size(30) + _messages(1, 4),
     "E_BAD_MESSAGE MPUB invalid message(0) body size 4 for tracing"),
    ("MPUB_TRACE mid message", b"MPUB_TRACE t\n" + size(30) + _messages(1, 9, b"1234"),
     "E_BAD_MESSAGE MPUB failed to read message body"),
    ("MPUB_EXT no size", b"MPUB_EXT t\n\x00\x00\x00", "E_BAD_BODY failed to read body size"),
    ("MPUB_EXT mid message", b"MPUB_EXT t\n" + size(30) + _messages(2, 3, b"\x00\x00x", 3),
     "E_BAD_MESSAGE MPUB failed to read message body"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("wire", "text"), [e[1:] for e in EOF_ERRORS], ids=[e[0] for e in EOF_ERRORS]
)
def test_error_text_at_end_of_stream(wire: bytes, text: str) -> None:
    parser = make_parser()
    parser.receive_data(wire)
    assert list(parser) == []  # nothing is wrong yet: more bytes could still come
    with pytest.raises(ProtocolError) as caught:
        parser.receive_eof()
    assert caught.value.text == text
    assert caught.value.fatal


def test_end_of_stream_after_complete_commands_is_silent() -> None:
    parser = make_parser()
    parser.receive_data(encode_pub("t", b"x") + encode_mpub("t", [b"a", b"b"]))
    assert len(list(parser)) == 2
    parser.receive_eof()


def test_end_of_stream_counts_bytes_not_yet_joined() -> None:
    parser = make_parser()
    parser.receive_data(b"PUB t\n" + size(3))
    assert list(parser) == []
    parser.receive_data(b"a")  # fewer bytes than wanted: not parsed yet
    parser.receive_data(b"b")
    with pytest.raises(ProtocolError, match="PUB failed to read message body$"):
        parser.receive_eof()


# -- limits are enforced before the body arrives ----------------------------------------------

EARLY_LIMITS = [
    (b"IDENTIFY\n", MAX_BODY, "E_BAD_BODY IDENTIFY body too big 201 > 200"),
    (b"AUTH\n", MAX_BODY, "E_BAD_BODY AUTH body too big 201 > 200"),
    (b"PUB t\n", MAX_MSG, "E_BAD_MESSAGE PUB message too big 101 > 100"),
    (b"DPUB t 1\n", MAX_MSG, "E_BAD_MESSAGE DPUB message too big 101 > 100"),
    (b"MPUB t\n", MAX_BODY, "E_BAD_BODY MPUB body too big 201 > 200"),
    (b"PUB_TRACE t\n", MAX_MSG, "E_BAD_MESSAGE message too big 101 > 100"),
    (b"PUB_EXT t\n", MAX_MSG, "E_BAD_MESSAGE message too big 101 > 100"),
    (b"MPUB_TRACE t\n", MAX_BODY, "E_BAD_BODY body too big 201 > 200"),
    (b"MPUB_EXT t\n", MAX_BODY, "E_BAD_BODY body too big 201 > 200"),
]


@pytest.mark.parametrize(("line", "limit", "text"), EARLY_LIMITS)
def test_size_limit_is_enforced_before_the_body_arrives(line: bytes, limit: int, text: str) -> None:
    # Exactly at the limit: the parser waits for the body.
    parser = make_parser()
    parser.receive_data(line + size(limit))
    assert parser.next_command() is None
    # One over: refused as soon as the 4 size bytes are in, with no body sent at all.
    parser = make_parser()
    parser.receive_data(line + size(limit + 1))
    with pytest.raises(ProtocolError) as caught:
        parser.next_command()
    assert caught.value.text == text
    # A huge size is refused just the same, without waiting for (or buffering) its body.
    parser = make_parser()
    parser.receive_data(line + size(2**31 - 1))
    with pytest.raises(ProtocolError):
        parser.next_command()


def test_size_prefix_split_across_chunks_is_checked_when_complete() -> None:
    parser = make_parser()
    parser.receive_data(b"PUB t\n\x00\x00")
    assert parser.next_command() is None
    parser.receive_data(b"\x00")
    assert parser.next_command() is None
    parser.receive_data(b"\x65")  # 101
    with pytest.raises(ProtocolError, match="PUB message too big 101 > 100"):
        parser.next_command()


# -- before_body runs first -------------------------------------------------------------------


class StateError(Exception):
    pass


@pytest.mark.parametrize(
    "wire",
    [
        b"IDENTIFY\n" + size(MAX_BODY + 1),
        b"AUTH x\n" + size(0),
        b"PUB\n",
        b"PUB b@d\n",
        b"DPUB t x\n",
        b"MPUB\n",
        b"PUB_TRACE t x\n",
        b"MPUB_EXT\n",
        b"PUB t\n" + size(-1),
    ],
)
def test_before_body_runs_before_argument_and_size_checks(wire: bytes) -> None:
    seen: list[bytes] = []

    def before_body(name: bytes) -> None:
        seen.append(name)
        raise ProtocolError("E_INVALID", f"cannot {name.decode()} in current state")

    parser = make_parser(before_body=before_body)
    parser.receive_data(wire)
    with pytest.raises(ProtocolError) as caught:
        parser.next_command()
    name = wire.split(b"\n")[0].split(b" ")[0]
    assert seen == [name]
    assert caught.value.text == f"E_INVALID cannot {name.decode()} in current state"


def test_before_body_may_raise_anything_and_is_only_for_body_commands() -> None:
    seen: list[bytes] = []

    def before_body(name: bytes) -> None:
        seen.append(name)
        if name == b"AUTH":
            raise StateError(name)

    parser = make_parser(before_body=before_body)
    parser.receive_data(NOP + encode_sub("t", "c") + encode_fin(HEX_ID) + encode_pub("t", b"x"))
    assert [command.name for command in parser] == [b"NOP", b"SUB", b"FIN", b"PUB"]
    assert seen == [b"PUB"]
    parser.receive_data(encode_auth("s"))
    with pytest.raises(StateError):
        parser.next_command()


def test_before_body_is_called_once_per_command_even_when_the_body_trickles_in() -> None:
    seen: list[bytes] = []
    wire = encode_identify({"a": 1}) + encode_mpub("t", [b"a", b"bc"])
    parser = make_parser(before_body=seen.append)
    commands = []
    for index in range(len(wire)):
        parser.receive_data(wire[index : index + 1])
        commands.extend(parser)
    assert [command.name for command in commands] == [b"IDENTIFY", b"MPUB"]
    assert seen == [b"IDENTIFY", b"MPUB"]


# -- Youzan binary IDs ------------------------------------------------------------------------


def test_binary_id_is_16_odd_bytes() -> None:
    assert len(BINARY_ID) == 16
    assert b"\n" in BINARY_ID and b" " in BINARY_ID and b"\r" in BINARY_ID


BINARY_COMMANDS = [
    (encode_fin(BINARY_ID), Command(b"FIN", [BINARY_ID])),
    (encode_req(BINARY_ID, 0), Command(b"REQ", [BINARY_ID, b"0"])),
    (encode_req(BINARY_ID, 60000), Command(b"REQ", [BINARY_ID, b"60000"])),
    (b"REQ " + BINARY_ID + b" 5\r\n", Command(b"REQ", [BINARY_ID, b"5"])),
    (encode_touch(BINARY_ID), Command(b"TOUCH", [BINARY_ID])),
    # An ID whose last byte is '\r' or '\n' keeps it: the ID is taken by offset.
    (b"FIN " + b"x" * 15 + b"\r\n", Command(b"FIN", [b"x" * 15 + b"\r"])),
    (b"FIN " + b"x" * 15 + b"\n\n", Command(b"FIN", [b"x" * 15 + b"\n"])),
    (b"TOUCH " + b"\n" * 16 + b"\n", Command(b"TOUCH", [b"\n" * 16])),
    (b"FIN " + b" " * 16 + b"\r\n", Command(b"FIN", [b" " * 16])),
    # Hex IDs fit the same layout (SPEC §1.2).
    (encode_fin(HEX_ID), Command(b"FIN", [HEX_ID])),
    (encode_req(HEX_ID, 7), Command(b"REQ", [HEX_ID, b"7"])),
    (encode_touch(HEX_ID), Command(b"TOUCH", [HEX_ID])),
    # Too short for an ID: nsqd reports the missing params / bad ID from these.
    (b"REQ " + HEX_ID + b"\n", Command(b"REQ", [HEX_ID])),
    (b"FIN\n", Command(b"FIN", [])),
    # Other commands are untouched by the mode.
    (encode_sub("t", "c", 0), Command(b"SUB", [b"t", b"c", b"0"])),
    (encode_rdy(1), Command(b"RDY", [b"1"])),
    (encode_pub("t", b"FIN \n"), Command(b"PUB", [b"t"], b"FIN \n")),
]


@pytest.mark.parametrize(("wire", "expected"), BINARY_COMMANDS)
def test_binary_ids_parse_by_fixed_offsets(wire: bytes, expected: Command) -> None:
    for parse in (parse_all, parse_bytewise):
        parser_commands = _parse_binary(wire, parse is parse_bytewise)
        assert parser_commands == [expected]


def _parse_binary(wire: bytes, bytewise: bool) -> list[Command]:
    parser = make_parser()
    parser.binary_ids = True
    if not bytewise:
        parser.receive_data(wire)
        return list(parser)
    commands: list[Command] = []
    for index in range(len(wire)):
        parser.receive_data(wire[index : index + 1])
        commands.extend(parser)
    return commands


def test_all_binary_commands_in_one_buffer() -> None:
    wire = b"".join(wire for wire, _ in BINARY_COMMANDS)
    expected = [command for _, command in BINARY_COMMANDS]
    assert _parse_binary(wire, bytewise=False) == expected
    assert _parse_binary(wire, bytewise=True) == expected


def test_without_binary_ids_the_same_bytes_split_on_newlines_and_spaces() -> None:
    commands = parse_all(encode_fin(BINARY_ID))
    assert commands[0] == Command(b"FIN", [b""])
    assert len(commands) > 1


def test_binary_ids_switched_between_commands_of_one_buffer() -> None:
    # nsqd switches the mode after a SUB with a partition; the FIN right behind it in the
    # same buffer must already be read by offsets.
    wire = encode_sub("t", "c", 0) + encode_fin(BINARY_ID) + encode_touch(BINARY_ID) + NOP
    parser = make_parser()
    parser.receive_data(wire)
    assert parser.next_command() == Command(b"SUB", [b"t", b"c", b"0"])
    parser.binary_ids = True
    assert parser.next_command() == Command(b"FIN", [BINARY_ID])
    assert parser.next_command() == Command(b"TOUCH", [BINARY_ID])
    assert parser.next_command() == Command(b"NOP", [])
    assert parser.next_command() is None


def test_binary_ids_switched_off_again() -> None:
    wire = encode_fin(BINARY_ID) + b"FIN a b\n"
    parser = make_parser()
    parser.binary_ids = True
    parser.receive_data(wire)
    assert parser.next_command() == Command(b"FIN", [BINARY_ID])
    parser.binary_ids = False
    assert parser.next_command() == Command(b"FIN", [b"a", b"b"])


def test_binary_fin_waits_past_early_newlines() -> None:
    parser = make_parser()
    parser.binary_ids = True
    parser.receive_data(b"FIN \n\n\n")
    assert parser.next_command() is None
    parser.receive_data(b"x" * 13)
    assert parser.next_command() is None
    parser.receive_data(b"\n")
    assert parser.next_command() == Command(b"FIN", [b"\n\n\n" + b"x" * 13])


def test_a_run_of_fins_is_taken_as_their_ids() -> None:
    ids = [b"%016x" % n for n in range(3)]
    parser = make_parser()
    parser.receive_data(b"".join(encode_fin(i) for i in ids) + NOP)
    assert parser.take_fin_run() == ids
    assert parser.take_fin_run() == []
    assert parser.next_command() == Command(b"NOP", [])
    assert parser.next_command() is None


def test_a_fin_run_stops_where_a_line_is_not_a_plain_fin() -> None:
    good = b"0123456789abcdef"
    parser = make_parser()
    for tail in (b"FIN 0123456789abcde\r\n", b"FIN 0123456789 abcde\n", b"RDY 1\n"):
        parser.receive_data(encode_fin(good) + tail)
        assert parser.take_fin_run() == [good]
        assert parser.take_fin_run() == []
        assert parser.next_command() is not None


def test_a_fin_split_across_receives_waits_for_the_rest() -> None:
    parser = make_parser()
    parser.receive_data(b"FIN 0123456789")
    assert parser.take_fin_run() == []
    assert parser.next_command() is None
    parser.receive_data(b"abcdef\n")
    assert parser.take_fin_run() == [b"0123456789abcdef"]


def test_a_run_of_youzan_fins_is_taken_as_their_binary_ids() -> None:
    # Any bytes, a newline and a space among them; the internal id (the first 8) positive.
    ids = [(n + 1).to_bytes(8, "big") + b"\n \x00trac\r" for n in range(3)]
    parser = make_parser()
    parser.binary_ids = True
    parser.receive_data(b"".join(encode_fin(i) for i in ids) + NOP)
    assert parser.take_fin_run() == ids
    assert parser.take_fin_run() == []
    assert parser.next_command() == Command(b"NOP", [])


def test_a_youzan_fin_run_leaves_an_id_that_is_not_positive_to_its_error() -> None:
    good = (5).to_bytes(8, "big") + b"t" * 8
    for bad in (bytes(8) + b"t" * 8, (-3).to_bytes(8, "big", signed=True) + b"t" * 8):
        parser = make_parser()
        parser.binary_ids = True
        parser.receive_data(encode_fin(good) + encode_fin(bad))
        assert parser.take_fin_run() == [good]
        assert parser.take_fin_run() == []
        assert parser.next_command() == Command(b"FIN", [bad])


# -- helpers exported for nsqd ----------------------------------------------------------------


def test_parse_partition() -> None:
    assert parse_partition(b"0") == 0
    assert parse_partition(b"-1") == -1
    assert parse_partition(b"+7") == 7
    with pytest.raises(ProtocolError) as caught:
        parse_partition(b"1.5")
    assert caught.value.text == (
        'E_BAD_PARTITION topic partition is not valid: strconv.Atoi: parsing "1.5": invalid syntax'
    )
    assert caught.value.fatal


def test_parse_mpub_body_directly() -> None:
    body = encode_mpub_body([b"a", b"bb", b"ccc"])
    assert parse_mpub_body(body, 3, 100) == [b"a", b"bb", b"ccc"]
    with pytest.raises(ProtocolError, match=r"^E_BAD_MESSAGE MPUB message too big 3 > 2$"):
        parse_mpub_body(body, 2, 100)
    with pytest.raises(ProtocolError, match=r"^E_BAD_BODY MPUB invalid message count 3$"):
        parse_mpub_body(body, 3, 18)  # (18 - 4) // 5 == 2
    trace = encode_mpub_body([b"12345678x"])
    assert parse_mpub_body(trace, 100, 100, min_message_size=9) == [b"12345678x"]


def test_trace_and_ext_bodies_split_back() -> None:
    assert split_trace_body(encode_trace_body(2**64 - 1, b"data")) == (2**64 - 1, b"data")
    header, data = split_ext_body(encode_ext_body({"##trace_id": "1"}, b"rest"))
    assert json.loads(header) == {"##trace_id": "1"}
    assert data == b"rest"
    assert split_ext_body(encode_ext_body(b"", b"x")) == (b"", b"x")


def test_encoders_exact_bytes() -> None:
    assert MAGIC_V2 == b"\x20\x20\x56\x32"
    assert NOP == b"NOP\n"
    assert CLS == b"CLS\n"
    assert encode_sub("t", "c") == b"SUB t c\n"
    assert encode_rdy(0) == b"RDY 0\n"
    assert encode_fin(HEX_ID) == b"FIN " + HEX_ID + b"\n"
    assert encode_req(HEX_ID, 0) == b"REQ " + HEX_ID + b" 0\n"
    assert encode_touch(HEX_ID) == b"TOUCH " + HEX_ID + b"\n"
    assert encode_pub("t", b"ab") == b"PUB t\n\x00\x00\x00\x02ab"
    assert encode_dpub("t", 5, b"a") == b"DPUB t 5\n\x00\x00\x00\x01a"
    assert encode_auth(b"s") == b"AUTH\n\x00\x00\x00\x01s"
    assert encode_mpub("t", [b"a", b"bc"]) == (
        b"MPUB t\n" + size(15) + size(2) + size(1) + b"a" + size(2) + b"bc"
    )
    assert encode_trace_body(1, b"x") == b"\x00" * 7 + b"\x01x"
    assert encode_ext_body(b"{}", b"x") == b"\x00\x02{}x"
    assert encode_command(b"X") == b"X\n"
    assert encode_command("X", b"a", "b", 3, body=b"") == b"X a b 3\n\x00\x00\x00\x00"


def test_over_long_line_is_refused_when_it_arrives_byte_by_byte() -> None:
    wire = b"SUB " + b"t" * 60 + b" c\n"
    with pytest.raises(ProtocolError, match="longer than 40 bytes"):
        parse_bytewise(wire, max_line_length=40)


def test_over_long_line_is_refused_when_it_arrives_whole() -> None:
    wire = b"SUB " + b"t" * 60 + b" c\n"
    with pytest.raises(ProtocolError, match="longer than 40 bytes"):
        parse_all(wire, max_line_length=40)


@pytest.mark.parametrize(
    ("line", "partition"),
    [
        (b"SUB t c", -1),
        (b"SUB t c 3", 3),
        (b"SUB t c x", -1),
        (b"SUB_ORDERED t c 2", 2),
        (b"SUB_ADVANCED t c 1 timestamp:5", 1),
        (b"PUB t", -1),
        (b"PUB t 2", 2),
        (b"PUB t extra words", -1),
        (b"DPUB t 100", -1),
        (b"MPUB_EXT t 7", 7),
        (b"PUB_SEQ t 4 producer 9", 4),
        (b"INTERNAL_CREATE_TOPIC t 6 true", 6),
        (b"PUB t -1", -1),
        (b"PUB t +5", 5),
        (b"PUB t 1x", -1),
        (b"NOP", -1),
    ],
)
def test_the_partition_a_topic_command_names(line: bytes, partition: int):
    name, *args = line.split(b" ")
    assert named_partition(name, args) == partition
