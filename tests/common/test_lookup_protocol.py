"""The nsqlookupd V1 codec (docs/protocol.md §4), without a network: every path and every error
text."""

import json
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nsqpy.common.errors import ProtocolError
from nsqpy.common.lookup_protocol import (
    DEFAULT_MAX_IDENTIFY_BODY_SIZE,
    MAGIC_V1,
    OK,
    BadProtocolError,
    LookupClientConnection,
    LookupCommand,
    LookupResponseError,
    LookupServerConnection,
    Registration,
    decode_identify_body,
    encode_error,
    encode_identify,
    encode_magic,
    encode_ping,
    encode_register,
    encode_response,
    encode_unregister,
    go_json,
    identify_reply,
    is_partitioned_peer,
    parse_partition,
    parse_registration,
)

OFFICIAL_IDENTIFY = {
    "version": "1.3.0",
    "tcp_port": 4150,
    "http_port": 4151,
    "hostname": "h",
    "broadcast_address": "h",
}
YOUZAN_IDENTIFY = {
    "version": "0.3.7-HA.1.13.0",
    "tcp_port": 4150,
    "http_port": 4151,
    "hostname": "n1",
    "broadcast_address": "10.0.0.1",
    "distributed_id": "10.0.0.1:4250:4150:1",
}


def identify_frame(body: bytes) -> bytes:
    return b"IDENTIFY\n" + struct.pack(">i", len(body)) + body


def connected(*, identify: dict | None = None, **limits: int) -> LookupServerConnection:
    """A server connection past the magic and, when `identify` is given, past IDENTIFY."""
    conn = LookupServerConnection(**limits)
    assert conn.receive_data(MAGIC_V1) == []
    if identify is not None:
        [command] = conn.receive_data(encode_identify(identify))
        assert command.name == "IDENTIFY"
    return conn


def error_text(conn: LookupServerConnection, data: bytes) -> str:
    with pytest.raises(ProtocolError) as excinfo:
        conn.receive_data(data)
    assert excinfo.value.fatal
    return excinfo.value.text


def body_error(body: bytes) -> str:
    return error_text(connected(), identify_frame(body))


# --- magic -------------------------------------------------------------------------------------


def test_bad_magic_sends_the_bare_code():
    conn = LookupServerConnection()
    with pytest.raises(BadProtocolError) as excinfo:
        conn.receive_data(b"  V2")
    assert excinfo.value.text == "E_BAD_PROTOCOL"
    assert excinfo.value.fatal
    assert encode_error(excinfo.value) == b"\x00\x00\x00\x0eE_BAD_PROTOCOL"


def test_magic_is_judged_only_once_four_bytes_arrived():
    conn = LookupServerConnection()
    assert conn.receive_data(b"PI") == []
    assert conn.pending_bytes == 2
    assert error_text(conn, b"NG\n") == "E_BAD_PROTOCOL"


def test_magic_and_commands_in_one_buffer():
    conn = LookupServerConnection()
    assert conn.receive_data(MAGIC_V1 + b"PING\n") == [LookupCommand("PING")]
    assert encode_magic() == b"  V1"


def test_eof_before_magic_or_inside_a_line_is_quiet():
    conn = LookupServerConnection()
    conn.receive_data(b"  ")
    conn.receive_eof()
    conn = connected()
    conn.receive_data(b"PIN")
    conn.receive_eof()


# --- lines -------------------------------------------------------------------------------------


def test_ping_before_and_after_identify():
    conn = connected()
    assert conn.receive_data(b"PING\n") == [LookupCommand("PING")]
    conn.receive_data(encode_identify(OFFICIAL_IDENTIFY))
    assert conn.receive_data(encode_ping()) == [LookupCommand("PING")]


def test_ping_ignores_its_params():
    assert connected().receive_data(b"PING a b\n") == [LookupCommand("PING", ("a", "b"))]


@pytest.mark.parametrize(
    "line",
    [
        b"PING\r\n",
        b"  PING \t\n",
        b"\xc2\xa0PING\xe3\x80\x80\n",
        b"\x0bPING\x0c\n",
        b"PING\xc2\x85\n",
    ],
)
def test_lines_are_trimmed_like_go_strings_trimspace(line):
    # UTF-8 NBSP, ideographic space and NEL are unicode.IsSpace runes, so Go trims them.
    assert connected().receive_data(line) == [LookupCommand("PING")]


def test_a_raw_byte_0x85_is_not_trimmed():
    # Alone, 0x85 is invalid UTF-8 (RuneError), not NEL, so Go's TrimSpace stops at it.
    conn = connected()
    with pytest.raises(ProtocolError) as excinfo:
        conn.receive_data(b"PING\x85\n")
    assert encode_error(excinfo.value) == encode_response(b"E_INVALID invalid command PING\x85")


def test_file_separator_is_not_go_whitespace():
    # Python's str.strip() would remove \x1c; Go's TrimSpace keeps it.
    assert error_text(connected(), b"\x1cPING\n") == "E_INVALID invalid command \x1cPING"


def test_empty_line_is_an_invalid_command_with_trailing_space():
    assert error_text(connected(), b"\n") == "E_INVALID invalid command "
    assert error_text(connected(), b" \r\n") == "E_INVALID invalid command "


@pytest.mark.parametrize("line", [b"ping\n", b"FOO bar\n", b"PING\x00\n", b"IDENTIFYX\n"])
def test_unknown_commands(line):
    name = line[:-1].split(b" ")[0].decode()
    assert error_text(connected(), line) == f"E_INVALID invalid command {name}"


def test_error_text_echoes_raw_bytes():
    conn = connected()
    with pytest.raises(ProtocolError) as excinfo:
        conn.receive_data(b"\xff\xfe\xe9t\xc3\xa9\n")
    assert encode_error(excinfo.value) == encode_response(
        b"E_INVALID invalid command \xff\xfe\xe9t\xc3\xa9"
    )


def test_several_commands_in_one_buffer():
    conn = connected()
    data = (
        encode_ping() + encode_identify(OFFICIAL_IDENTIFY) + b"REGISTER t c\nUNREGISTER t\nPING\n"
    )
    commands = conn.receive_data(data)
    assert [c.name for c in commands] == ["PING", "IDENTIFY", "REGISTER", "UNREGISTER", "PING"]
    assert commands[2].registration == Registration("t", None, "c")
    assert commands[3].registration == Registration("t")
    assert conn.pending_bytes == 0


def test_byte_at_a_time():
    data = MAGIC_V1 + encode_identify(YOUZAN_IDENTIFY) + b"REGISTER t 3 c\nPING\n"
    conn = LookupServerConnection()
    commands = []
    for i in range(len(data)):
        commands += conn.receive_data(data[i : i + 1])
    whole = LookupServerConnection().receive_data(data)
    assert commands == whole
    assert [c.name for c in commands] == ["IDENTIFY", "REGISTER", "PING"]


def test_line_length_limit():
    conn = connected(max_line_length=8)
    assert conn.receive_data(b"PING a b") == []  # 8 bytes, still waiting for "\n"
    assert conn.pending_bytes == 8
    assert conn.receive_data(b"\n") == [LookupCommand("PING", ("a", "b"))]
    conn = connected(max_line_length=8)
    assert error_text(conn, b"PING     ") == "E_INVALID command line longer than 8 bytes"
    conn = connected(max_line_length=8)
    assert error_text(conn, b"PING     \n") == "E_INVALID command line longer than 8 bytes"


# --- errors after commands ---------------------------------------------------------------------


def test_error_after_commands_is_raised_by_the_next_call():
    conn = connected()
    assert conn.receive_data(b"PING\nFOO\nPING\n") == [LookupCommand("PING")]
    assert conn.pending_bytes == 0
    assert error_text(conn, b"") == "E_INVALID invalid command FOO"
    # The connection is dead: the same error again, whatever comes next.
    assert error_text(conn, b"PING\n") == "E_INVALID invalid command FOO"
    with pytest.raises(ProtocolError):
        conn.receive_eof()


def test_pending_error_surfaces_at_eof():
    conn = connected()
    conn.receive_data(b"PING\nREGISTER t\n")
    with pytest.raises(ProtocolError, match="client must IDENTIFY"):
        conn.receive_eof()


# --- IDENTIFY ----------------------------------------------------------------------------------


def test_identify_official():
    conn = connected()
    [command] = conn.receive_data(encode_identify(OFFICIAL_IDENTIFY))
    assert command == LookupCommand(
        "IDENTIFY",
        (),
        identify={
            "broadcast_address": "h",
            "hostname": "h",
            "tcp_port": 4150,
            "http_port": 4151,
            "version": "1.3.0",
            "distributed_id": "",
            "topology_zone": "",
            "topology_region": "",
        },
    )
    assert conn.identified and not conn.partitioned


def test_identify_youzan_and_head_fields():
    conn = connected()
    body = dict(YOUZAN_IDENTIFY, topology_zone="z", topology_region="r", id="ignored")
    [command] = conn.receive_data(encode_identify(body))
    assert command.identify["distributed_id"] == "10.0.0.1:4250:4150:1"
    assert command.identify["topology_zone"] == "z"
    assert command.identify["topology_region"] == "r"
    assert "id" not in command.identify
    assert conn.partitioned


def test_identify_params_are_ignored():
    body = json.dumps(OFFICIAL_IDENTIFY).encode()
    [command] = connected().receive_data(b"IDENTIFY x y\n" + struct.pack(">i", len(body)) + body)
    assert command.params == ("x", "y")
    assert command.identify["version"] == "1.3.0"


def test_identify_again_fails_before_reading_a_body():
    conn = connected(identify=OFFICIAL_IDENTIFY)
    assert error_text(conn, b"IDENTIFY\n") == "E_INVALID cannot IDENTIFY again"


def test_identify_body_size_limits():
    conn = connected(max_identify_body_size=10)
    assert conn.receive_data(b"IDENTIFY\n" + struct.pack(">i", 10) + b"{}") == []
    assert conn.pending_bytes == 2
    big = connected(max_identify_body_size=10)
    text = error_text(big, b"IDENTIFY\n" + struct.pack(">i", 11))
    assert text == "E_BAD_BODY IDENTIFY failed to read body size"
    negative = connected()
    text = error_text(negative, b"IDENTIFY\n" + struct.pack(">i", -1))
    assert text == "E_BAD_BODY IDENTIFY failed to read body size"
    assert DEFAULT_MAX_IDENTIFY_BODY_SIZE == 1024 * 1024


@pytest.mark.parametrize(
    ("sent", "text"),
    [
        (b"IDENTIFY\n", "E_BAD_BODY IDENTIFY failed to read body size"),
        (b"IDENTIFY\n\x00\x00", "E_BAD_BODY IDENTIFY failed to read body size"),
        (b"IDENTIFY\n\x00\x00\x00\x05", "E_BAD_BODY IDENTIFY failed to read body"),
        (b"IDENTIFY\n\x00\x00\x00\x05{}", "E_BAD_BODY IDENTIFY failed to read body"),
    ],
)
def test_eof_inside_identify(sent, text):
    conn = connected()
    assert conn.receive_data(sent) == []
    with pytest.raises(ProtocolError) as excinfo:
        conn.receive_eof()
    assert excinfo.value.text == text
    assert conn.pending_bytes == 0


@pytest.mark.parametrize(
    "body",
    [
        b"",
        b"{",
        b"[]",
        b'"x"',
        b"1",
        b"true",
        b'{"version":"1"} x',
        b'{"tcp_port":NaN}',
        b'{"tcp_port":Infinity}',
        b'{"tcp_port":"4150"}',
        b'{"tcp_port":4150.0}',
        b'{"tcp_port":1e3}',
        b'{"tcp_port":true}',
        b'{"tcp_port":9223372036854775808}',
        b'{"http_port":[1]}',
        b'{"version":5}',
        b'{"hostname":{}}',
        b'{"broadcast_address":false}',
        b'{"distributed_id":1}',
        b'{"remote_address":1}',
        b'{"TCP_PORT":"x"}',
        b"\xef\xbb\xbf{}",
        b"{\xff}",
        b"[" * 100_000,
    ],
)
def test_identify_undecodable_body(body):
    assert body_error(body) == "E_BAD_BODY IDENTIFY failed to decode JSON body"


@pytest.mark.parametrize("missing", ["broadcast_address", "tcp_port", "http_port", "version"])
def test_identify_missing_fields(missing):
    absent = {k: v for k, v in OFFICIAL_IDENTIFY.items() if k != missing}
    assert body_error(go_json(absent)) == "E_BAD_BODY IDENTIFY missing fields"
    zero = dict(OFFICIAL_IDENTIFY, **{missing: 0 if "port" in missing else ""})
    assert body_error(go_json(zero)) == "E_BAD_BODY IDENTIFY missing fields"
    null = dict(OFFICIAL_IDENTIFY, **{missing: None})
    assert body_error(go_json(null)) == "E_BAD_BODY IDENTIFY missing fields"


def test_identify_null_top_level_is_missing_fields_like_go():
    assert body_error(b"null") == "E_BAD_BODY IDENTIFY missing fields"
    assert body_error(b"{}") == "E_BAD_BODY IDENTIFY missing fields"


def test_identify_decodes_like_go_json():
    body = (
        b' {"TCP_PORT":1,"Http_Port":-2,"\xe2\x84\xaaey":[{"a":1}],"vERSION":"v",'
        b'"broadca\xc5\xbft_addre\xc5\xbfs":"b\xff","hostname":"\\ud800x","tcp_port":null,'
        b'"unknown":{"nested":[1,2.5,"x",null]},"distributed_id":"a","distributed_id":"" } '
    )
    decoded = decode_identify_body(body)
    # Case-insensitive keys (\u017f folds to "s"), null leaves the earlier value, negative ports
    # pass the "missing" check, invalid UTF-8 and lone surrogates become U+FFFD, the last
    # duplicate wins, unknown keys of any type are skipped.
    assert decoded == {
        "broadcast_address": "b\ufffd",
        "hostname": "\ufffdx",
        "tcp_port": 1,
        "http_port": -2,
        "version": "v",
        "distributed_id": "",
        "topology_zone": "",
        "topology_region": "",
    }


def test_identify_duplicates_resolve_in_wire_order_across_case():
    body = (
        b'{"tcp_port":1,"TCP_PORT":2,"tcp_port":3,'
        b'"http_port":1,"version":"v","broadcast_address":"b"}'
    )
    assert decode_identify_body(body)["tcp_port"] == 3


def test_is_partitioned_peer():
    assert not is_partitioned_peer(OFFICIAL_IDENTIFY)
    assert is_partitioned_peer(YOUZAN_IDENTIFY)
    assert is_partitioned_peer({"version": "0.3.7-HA.1.13.0", "distributed_id": ""})
    assert is_partitioned_peer({"version": "1.3.0", "distributed_id": "x"})
    assert not is_partitioned_peer({"version": "1.3.0", "distributed_id": ""})
    assert not is_partitioned_peer({})


# --- REGISTER / UNREGISTER ---------------------------------------------------------------------


@pytest.mark.parametrize("command", ["REGISTER", "UNREGISTER"])
def test_registration_requires_identify(command):
    assert error_text(connected(), f"{command} t c\n".encode()) == "E_INVALID client must IDENTIFY"
    assert error_text(connected(), f"{command}\n".encode()) == "E_INVALID client must IDENTIFY"


CLASSIC_CASES = [
    ("{c}", "E_INVALID {c} insufficient number of params"),
    ("{c} ", "E_INVALID {c} insufficient number of params"),
    ("{c} t", Registration("t")),
    ("{c} t c", Registration("t", None, "c")),
    ("{c} t c extra words", Registration("t", None, "c")),
    ("{c} t 5", Registration("t", None, "5")),
    ("{c} t  c", Registration("t")),
    ("{c} t#ephemeral c#ephemeral", Registration("t#ephemeral", None, "c#ephemeral")),
    ("{c} " + "t" * 64, Registration("t" * 64)),
    ("{c} " + "t" * 65, "E_BAD_TOPIC {c} topic name '" + "t" * 65 + "' is not valid"),
    ("{c}  t", "E_BAD_TOPIC {c} topic name '' is not valid"),
    ("{c} a:b c", "E_BAD_TOPIC {c} topic name 'a:b' is not valid"),
    ("{c} a:b c!", "E_BAD_TOPIC {c} topic name 'a:b' is not valid"),
    ("{c} t c!", "E_BAD_CHANNEL {c} channel name 'c!' is not valid"),
    ("{c} t #ephemeral", "E_BAD_CHANNEL {c} channel name '#ephemeral' is not valid"),
]

PARTITIONED_CASES = [
    ("{c}", "E_INVALID {c} insufficient number of params"),
    ("{c} t", "E_INVALID {c} insufficient number of params"),
    ("{c} t 0", Registration("t", 0)),
    ("{c} t 254 c", Registration("t", 254, "c")),
    ("{c} t -11", Registration("t", -11)),
    ("{c} t +5 c", Registration("t", 5, "c")),
    ("{c} t 007", Registration("t", 7)),
    ("{c} t -0", Registration("t", 0)),
    ("{c} t 1 c extra", Registration("t", 1, "c")),
    ("{c} t 1  c", Registration("t", 1)),
    ("{c} t 255", "E_BAD_PARTITIONID {c} partition id '255' is not valid"),
    ("{c} t -1", "E_BAD_PARTITIONID {c} partition id '-1' is not valid"),
    ("{c} t x c", "E_BAD_PARTITIONID {c} partition id 'x' is not valid"),
    ("{c} t 1_0", "E_BAD_PARTITIONID {c} partition id '1_0' is not valid"),
    ("{c} t \u0663", "E_BAD_PARTITIONID {c} partition id '\u0663' is not valid"),
    ("{c} t  c", "E_BAD_PARTITIONID {c} partition id '' is not valid"),
    ("{c} t c", "E_BAD_PARTITIONID {c} partition id 'c' is not valid"),
    ("{c} t! x c!", "E_BAD_TOPIC {c} topic name 't!' is not valid"),
    ("{c} t x c!", "E_BAD_CHANNEL {c} channel name 'c!' is not valid"),
]


@pytest.mark.parametrize("command", ["REGISTER", "UNREGISTER"])
@pytest.mark.parametrize(
    ("identify", "line", "expected"),
    [(OFFICIAL_IDENTIFY, *case) for case in CLASSIC_CASES]
    + [(YOUZAN_IDENTIFY, *case) for case in PARTITIONED_CASES],
)
def test_registration_grammar(command, identify, line, expected):
    conn = connected(identify=identify)
    data = line.format(c=command).encode() + b"\n"
    if isinstance(expected, str):
        assert error_text(conn, data) == expected.format(c=command)
    else:
        [parsed] = conn.receive_data(data)
        assert parsed.name == command
        assert parsed.registration == expected


def test_parse_registration_directly():
    assert parse_registration("REGISTER", ["t", "3", "c"], True) == Registration("t", 3, "c")
    assert parse_registration("REGISTER", ["t", "3", "c"], False) == Registration("t", None, "3")
    with pytest.raises(ProtocolError) as excinfo:
        parse_registration("UNREGISTER", [], False)
    assert excinfo.value.text == "E_INVALID UNREGISTER insufficient number of params"
    assert excinfo.value.fatal


def test_parse_partition():
    assert [parse_partition(p) for p in ["0", "254", "-11", "+1", "00"]] == [0, 254, -11, 1, 0]
    for bad in ["", "255", "-1", "-12", " 1", "1 ", "0x1", "1.0", "1_000", "\u0661", "9" * 30]:
        assert parse_partition(bad) is None


# --- replies -----------------------------------------------------------------------------------


def test_encode_response():
    assert encode_response(OK) == b"\x00\x00\x00\x02OK"
    assert encode_response(b"") == b"\x00\x00\x00\x00"


def test_encode_error():
    err = ProtocolError("E_INVALID", "client must IDENTIFY", fatal=True)
    assert encode_error(err) == b"\x00\x00\x00\x1eE_INVALID client must IDENTIFY"


def test_identify_reply_is_go_json():
    reply = identify_reply("lookupd.example", "host-1", 4161, 4160, "1.3.0")
    assert reply == (
        b'{"broadcast_address":"lookupd.example","hostname":"host-1",'
        b'"http_port":4161,"tcp_port":4160,"version":"1.3.0"}'
    )


def test_go_json_escapes_like_go():
    encoded = go_json({"b": "<a&b>\u2028\u2029\n\t\x01\x7f\u00e9\ud800", "a": [1, None, True]})
    assert encoded == (
        b'{"a":[1,null,true],"b":"\\u003ca\\u0026b\\u003e\\u2028\\u2029\\n\\t\\u0001\x7f'
        b'\xc3\xa9\\ufffd"}'
    )


# --- client side -------------------------------------------------------------------------------


def test_encode_identify_sorted_like_go_nsq():
    body = (
        b'{"broadcast_address":"h","hostname":"h",'
        b'"http_port":4151,"tcp_port":4150,"version":"1.3.0"}'
    )
    assert encode_identify(OFFICIAL_IDENTIFY) == b"IDENTIFY\n" + struct.pack(">I", len(body)) + body
    youzan = encode_identify(YOUZAN_IDENTIFY)
    assert youzan.index(b'"broadcast_address"') < youzan.index(b'"distributed_id"')
    assert youzan.index(b'"distributed_id"') < youzan.index(b'"hostname"')


def test_encode_registrations():
    assert encode_register("t") == b"REGISTER t\n"
    assert encode_register("t", "c") == b"REGISTER t c\n"
    assert encode_register("t", "") == b"REGISTER t\n"
    assert encode_register("t", partition=0) == b"REGISTER t 0\n"
    assert encode_register("t", "c", partition=-11) == b"REGISTER t -11 c\n"
    assert encode_unregister("t") == b"UNREGISTER t\n"
    assert encode_unregister("t", "c", 2) == b"UNREGISTER t 2 c\n"
    assert encode_ping() == b"PING\n"


@pytest.mark.parametrize(("topic", "channel"), [("", None), ("a b", None), ("t", "c\n")])
def test_encode_refuses_params_that_would_desync_the_stream(topic, channel):
    with pytest.raises(ValueError):
        encode_register(topic, channel)


def test_client_splits_replies():
    conn = LookupClientConnection()
    data = encode_response(b"{}") + encode_response(OK) + encode_response(b"")
    assert conn.receive_data(data[:3]) == []
    assert conn.receive_data(data[3:5]) == []
    assert conn.receive_data(data[5:]) == [b"{}", OK, b""]
    assert conn.pending_bytes == 0
    replies = []
    for i in range(len(data)):
        replies += conn.receive_data(data[i : i + 1])
    assert replies == [b"{}", OK, b""]


def test_client_response_limit():
    conn = LookupClientConnection(max_response_size=4)
    assert conn.receive_data(encode_response(b"1234")) == [b"1234"]
    with pytest.raises(LookupResponseError) as excinfo:
        conn.receive_data(b"\x00\x00\x00\x05")
    assert str(excinfo.value) == "response body size (5) is greater than limit (4)"
    with pytest.raises(LookupResponseError, match=r"\(-1\) is negative"):
        LookupClientConnection().receive_data(b"\xff\xff\xff\xff")


# --- properties --------------------------------------------------------------------------------

names = st.builds(
    lambda base, ephemeral: base + "#ephemeral" if ephemeral else base,
    st.from_regex(r"[.a-zA-Z0-9_-]{1,54}", fullmatch=True),
    st.booleans(),
)
ports = st.integers(min_value=-(2**63), max_value=2**63 - 1).filter(bool)
partitions = st.one_of(st.integers(min_value=0, max_value=254), st.just(-11))
identify_bodies = st.fixed_dictionaries(
    {
        "broadcast_address": st.text(min_size=1),
        "tcp_port": ports,
        "http_port": ports,
        "version": st.text(min_size=1),
    },
    optional={
        "hostname": st.text(),
        "distributed_id": st.text(),
        "topology_zone": st.text(),
        "topology_region": st.text(),
        "extra": st.recursive(st.none() | st.integers() | st.text(), st.lists),
    },
)


def split_into(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({cut % (len(data) + 1) for cut in cuts})
    return [data[a:b] for a, b in zip([0, *points], [*points, len(data)], strict=True)]


@given(identify_bodies, st.lists(st.integers(min_value=0), max_size=8))
def test_identify_round_trip(body, cuts):
    data = MAGIC_V1 + encode_identify(body) + encode_ping()
    conn = LookupServerConnection()
    commands = [c for chunk in split_into(data, cuts) for c in conn.receive_data(chunk)]
    assert [c.name for c in commands] == ["IDENTIFY", "PING"]
    identify = commands[0].identify
    for key in ("broadcast_address", "tcp_port", "http_port", "version"):
        assert identify[key] == body[key]
    for key in ("hostname", "distributed_id", "topology_zone", "topology_region"):
        assert identify[key] == body.get(key, "")
    assert conn.partitioned == is_partitioned_peer(body)


@given(
    st.booleans(),
    st.lists(
        st.tuples(
            st.sampled_from(["REGISTER", "UNREGISTER"]), names, st.none() | names, partitions
        ),
        max_size=10,
    ),
)
def test_registration_round_trip(partitioned, registrations):
    identify = YOUZAN_IDENTIFY if partitioned else OFFICIAL_IDENTIFY
    conn = connected(identify=identify)
    encoders = {"REGISTER": encode_register, "UNREGISTER": encode_unregister}
    data = b""
    expected = []
    for command, topic, channel, partition in registrations:
        partition = partition if partitioned else None
        data += encoders[command](topic, channel, partition)
        expected.append((command, Registration(topic, partition, channel)))
    commands = conn.receive_data(data)
    assert [(c.name, c.registration) for c in commands] == expected


def feed(conn: LookupServerConnection, chunks: list[bytes], bound: int):
    """Feed chunks; return (commands, error text or None), checking the buffering bound."""
    commands: list[LookupCommand] = []
    try:
        for chunk in [*chunks, b""]:
            result = conn.receive_data(chunk)
            assert isinstance(result, list)
            assert all(isinstance(c, LookupCommand) for c in result)
            commands += result
            assert conn.pending_bytes <= bound
    except ProtocolError as err:
        assert err.fatal
        encode_error(err)  # always encodable, whatever bytes it echoes
        return commands, err.text
    return commands, None


words = st.sampled_from(
    [b"PING", b"IDENTIFY", b"REGISTER", b"UNREGISTER", b"t", b"c", b"0", b"-11", b"255", b"t!",
     b"c!", b"", b"\xc2\xa0", b"\xff", b"t" * 40]
)  # fmt: skip
lines = st.builds(
    lambda words, end: b" ".join(words) + end,
    st.lists(words, max_size=4),
    st.sampled_from([b"\n", b"\r\n", b" \n", b""]),
)
identify_frames = st.one_of(
    st.sampled_from([OFFICIAL_IDENTIFY, YOUZAN_IDENTIFY]).map(encode_identify),
    st.builds(lambda body: identify_frame(json.dumps(body).encode()), identify_bodies),
    st.builds(lambda size, body: b"IDENTIFY\n" + struct.pack(">i", size) + body,
              st.sampled_from([-1, 0, 2, 16, 300, 2**31 - 1]), st.binary(max_size=20)),
)  # fmt: skip
fuzz_input = st.lists(
    st.one_of(lines, lines, lines, identify_frames, st.binary(max_size=40)), max_size=20
).map(b"".join)


@settings(max_examples=300)
@given(
    st.sampled_from([None, OFFICIAL_IDENTIFY, YOUZAN_IDENTIFY]),
    fuzz_input,
    st.lists(st.integers(min_value=0), max_size=10),
)
def test_arbitrary_bytes_yield_commands_or_protocol_errors(identify, data, cuts):
    # A real IDENTIFY body (~150 bytes) fits; the fuzzer's 40-byte words overflow a line.
    limits = {"max_line_length": 64, "max_identify_body_size": 256}
    bound = max(limits.values())
    prefix = MAGIC_V1 + (encode_identify(identify) if identify else b"")
    whole = feed(LookupServerConnection(**limits), [prefix + data], bound)
    chunked = feed(LookupServerConnection(**limits), split_into(prefix + data, cuts), bound)
    assert chunked == whole
    bytewise = [bytes([b]) for b in prefix + data]
    assert feed(LookupServerConnection(**limits), bytewise, bound) == whole
    # Check EOF handling never raises anything but a ProtocolError either.
    conn = LookupServerConnection(**limits)
    feed(conn, [prefix + data], bound)
    try:
        conn.receive_eof()
    except ProtocolError:
        pass


@given(st.binary(max_size=200), st.lists(st.integers(min_value=0), max_size=6))
def test_arbitrary_bytes_at_the_magic(data, cuts):
    commands, text = feed(
        LookupServerConnection(), split_into(data, cuts), DEFAULT_MAX_IDENTIFY_BODY_SIZE
    )
    if not data.startswith(MAGIC_V1) and len(data) >= 4:
        assert (commands, text) == ([], "E_BAD_PROTOCOL")


@given(st.binary(max_size=200), st.lists(st.integers(min_value=0), max_size=6))
def test_client_arbitrary_bytes(data, cuts):
    conn = LookupClientConnection(max_response_size=16)
    try:
        for chunk in split_into(data, cuts):
            replies = conn.receive_data(chunk)
            assert all(isinstance(r, bytes) and len(r) <= 16 for r in replies)
            assert conn.pending_bytes <= 4 + 16
    except LookupResponseError:
        pass
