"""Every V2 command, state rule, limit and error text of Go nsqd v1.3.0 (docs/protocol.md §1, §2).

Each test talks to the in-process nsqd over a real TCP connection and asserts the exact frame
nsqd sends back and what happens to the connection after it: a fatal error closes it, E_FIN_FAILED,
E_REQ_FAILED and E_TOUCH_FAILED leave it open (docs/protocol.md §1.3, §2.11). Go's `%q` quoting of
bad
names, its order of checks and its odd texts (`E_BAD_TOPIC E_BAD_TOPIC MPUB ...`) are asserted
byte for byte.
"""

import json
import struct
import time

import pytest
import trio

from nsqpy.common.command import (
    CLS,
    NOP,
    encode_command,
    encode_dpub,
    encode_fin,
    encode_identify,
    encode_mpub,
    encode_pub,
    encode_rdy,
    encode_req,
    encode_sub,
    encode_touch,
)
from nsqpy.common.frame import FRAME_TYPE_ERROR, FRAME_TYPE_RESPONSE
from nsqpy.common.version import VERSION
from tests.nsqd.wire import (
    READ_TIMEOUT,
    UNKNOWN_ID,
    Wire,
    close_all_wires,
    consumer,
    override_options,
    with_options,
)
from tests.support.polling import wait_until


@pytest.fixture
def nsqd_options(nsqd_options, request):
    return override_options(nsqd_options, request)


@pytest.fixture(autouse=True)
async def close_connections():
    yield
    close_all_wires()


def size(n: int) -> bytes:
    """A 4-byte big-endian signed size prefix, as the wire carries it."""
    return struct.pack(">i", n)


async def connect(nsqd) -> Wire:
    return await Wire.connect(nsqd)


# -- 1.1 connection start -------------------------------------------------------------------


@pytest.mark.parametrize("magic", [b"  V1", b"V2  ", b"GET ", b"\x00\x00\x00\x00"])
async def test_bad_magic_is_refused_and_closed(nsqd, magic):
    wire = await Wire.connect(nsqd, magic=magic)
    # Go writes exactly `E_BAD_PROTOCOL`, not the usual "CODE description".
    await wire.expect_error("E_BAD_PROTOCOL")


async def test_magic_may_arrive_in_pieces(nsqd):
    wire = await Wire.connect(nsqd, magic=b"")
    await wire.send(b" ")
    await wire.send(b" V")
    await wire.send(b"2" + encode_pub("t", b"x"))
    await wire.expect_ok()


# -- 1.6 the message frame ------------------------------------------------------------------


async def test_message_frame_payload(nsqd):
    wire = await consumer(nsqd, "t", "c", rdy=1)
    before = time.time_ns()
    await wire.send(encode_pub("t", b"pay\nload \x00\r\xff"))
    await wire.expect_ok()
    after = time.time_ns()
    message = await wire.read_message()
    assert message.body == b"pay\nload \x00\r\xff"
    assert message.attempts == 1
    assert before <= message.timestamp <= after
    assert len(message.id) == 16
    assert all(c in b"0123456789abcdef" for c in message.id)


# -- 2.1 IDENTIFY ---------------------------------------------------------------------------

GO_DEFAULT_IDENTIFY_REPLY = {
    "max_rdy_count": 2500,
    "version": VERSION,
    "max_msg_timeout": 900000,
    "msg_timeout": 60000,
    "tls_v1": False,
    "deflate": False,
    "deflate_level": 6,
    "max_deflate_level": 6,
    "snappy": False,
    "sample_rate": 0,
    "auth_required": False,
    "output_buffer_size": 16384,
    "output_buffer_timeout": 250,
}


def go_json(value: dict) -> bytes:
    """encoding/json's Marshal: no spaces, keys in the struct's order."""
    return json.dumps(value, separators=(",", ":")).encode()


async def test_identify_reply_has_go_keys_in_go_order(nsqd):
    wire = await connect(nsqd)
    await wire.send(encode_identify({"feature_negotiation": True}))
    frame = await wire.read_response()
    assert frame.frame_type == FRAME_TYPE_RESPONSE
    assert frame.data == go_json(GO_DEFAULT_IDENTIFY_REPLY)
    assert VERSION.startswith("1.3.0")


async def test_identify_reply_reflects_requested_settings(nsqd):
    wire = await connect(nsqd)
    reply = await wire.identify(
        feature_negotiation=True,
        msg_timeout=5000,
        sample_rate=42,
        output_buffer_size=1024,
        output_buffer_timeout=100,
        client_id="me",
        hostname="host",
        user_agent="test/1.0",
        heartbeat_interval=1000,
    )
    assert reply == {
        **GO_DEFAULT_IDENTIFY_REPLY,
        "msg_timeout": 5000,
        "sample_rate": 42,
        "output_buffer_size": 1024,
        "output_buffer_timeout": 100,
    }


@with_options(max_rdy_count=100, max_msg_timeout=120.0, max_deflate_level=3)
async def test_identify_reply_reflects_server_options(nsqd):
    wire = await connect(nsqd)
    reply = await wire.identify(feature_negotiation=True)
    assert reply["max_rdy_count"] == 100
    assert reply["max_msg_timeout"] == 120000
    assert reply["max_deflate_level"] == 3
    # Go computes min(6, max-deflate-level) even when deflate is not negotiated.
    assert reply["deflate_level"] == 3


@pytest.mark.parametrize(
    "settings, expected",
    [
        ({"output_buffer_size": -1}, {"output_buffer_size": 1, "output_buffer_timeout": 0}),
        # -1 buffer size means unbuffered whatever timeout was asked for.
        (
            {"output_buffer_size": -1, "output_buffer_timeout": 100},
            {"output_buffer_size": 1, "output_buffer_timeout": 0},
        ),
        ({"output_buffer_timeout": -1}, {"output_buffer_timeout": 0}),
        (
            {"output_buffer_size": 64, "output_buffer_timeout": 25},
            {"output_buffer_size": 64, "output_buffer_timeout": 25},
        ),
        (
            {"output_buffer_size": 65536, "output_buffer_timeout": 30000},
            {"output_buffer_size": 65536, "output_buffer_timeout": 30000},
        ),
        ({"msg_timeout": 1000, "sample_rate": 99}, {"msg_timeout": 1000, "sample_rate": 99}),
        ({"msg_timeout": 900000}, {"msg_timeout": 900000}),
        ({"heartbeat_interval": 60000}, {}),
        ({"heartbeat_interval": -1}, {}),
        # No TLS configured: tls_v1 is refused by answering false, not by an error.
        ({"tls_v1": True}, {}),
        ({"heartbeat_interval": 0, "msg_timeout": 0, "output_buffer_size": 0}, {}),
    ],
)
async def test_identify_valid_boundaries(nsqd, settings, expected):
    wire = await connect(nsqd)
    reply = await wire.identify(feature_negotiation=True, **settings)
    assert reply == {**GO_DEFAULT_IDENTIFY_REPLY, **expected}


@pytest.mark.parametrize(
    "settings, text",
    [
        ({"heartbeat_interval": 100}, "heartbeat interval (100) is invalid"),
        ({"heartbeat_interval": 999}, "heartbeat interval (999) is invalid"),
        ({"heartbeat_interval": -2}, "heartbeat interval (-2) is invalid"),
        ({"heartbeat_interval": 60001}, "heartbeat interval (60001) is invalid"),
        ({"output_buffer_size": 63}, "output buffer size (63) is invalid"),
        ({"output_buffer_size": -2}, "output buffer size (-2) is invalid"),
        ({"output_buffer_size": 65537}, "output buffer size (65537) is invalid"),
        ({"output_buffer_timeout": 24}, "output buffer timeout (24) is invalid"),
        ({"output_buffer_timeout": -2}, "output buffer timeout (-2) is invalid"),
        ({"output_buffer_timeout": 30001}, "output buffer timeout (30001) is invalid"),
        ({"sample_rate": -1}, "sample rate (-1) is invalid"),
        ({"sample_rate": 100}, "sample rate (100) is invalid"),
        ({"msg_timeout": 999}, "msg timeout (999) is invalid"),
        ({"msg_timeout": -1}, "msg timeout (-1) is invalid"),
        ({"msg_timeout": 900001}, "msg timeout (900001) is invalid"),
        # Go checks heartbeat, then output buffer timeout before size, then sample rate, then
        # msg timeout: the first bad one is reported.
        ({"heartbeat_interval": 1, "output_buffer_size": 1}, "heartbeat interval (1) is invalid"),
        (
            {"output_buffer_size": 1, "output_buffer_timeout": 1},
            "output buffer timeout (1) is invalid",
        ),
        ({"output_buffer_size": 1, "sample_rate": 100}, "output buffer size (1) is invalid"),
        ({"sample_rate": 100, "msg_timeout": 1}, "sample rate (100) is invalid"),
    ],
)
async def test_identify_invalid_settings_are_fatal(nsqd, settings, text):
    wire = await connect(nsqd)
    await wire.send(encode_identify({"feature_negotiation": True, **settings}))
    await wire.expect_error(f"E_BAD_BODY IDENTIFY {text}")


@with_options(max_heartbeat_interval=5.0, max_output_buffer_size=1000, max_msg_timeout=10.0)
@pytest.mark.parametrize(
    "settings, text",
    [
        ({"heartbeat_interval": 5001}, "heartbeat interval (5001) is invalid"),
        ({"output_buffer_size": 1001}, "output buffer size (1001) is invalid"),
        ({"msg_timeout": 10001}, "msg timeout (10001) is invalid"),
    ],
)
async def test_identify_limits_follow_server_options(nsqd, settings, text):
    wire = await connect(nsqd)
    await wire.send(encode_identify(settings))
    await wire.expect_error(f"E_BAD_BODY IDENTIFY {text}")


@pytest.mark.parametrize(
    "body",
    [
        b"{not json",
        b"[]",
        b'"text"',
        b"42",
        b'{"heartbeat_interval": "1000"}',
        b'{"heartbeat_interval": 1000.5}',
        b'{"heartbeat_interval": 1e3}',
        b'{"msg_timeout": true}',
        b'{"feature_negotiation": "true"}',
        b'{"feature_negotiation": 1}',
        b'{"client_id": 5}',
        b'{"hostname": ["h"]}',
        b'{"sample_rate": 2147483648}',
        b'{"tls_v1": {}}',
    ],
)
async def test_identify_undecodable_json_is_fatal(nsqd, body):
    wire = await connect(nsqd)
    await wire.send(encode_command("IDENTIFY", body=body))
    await wire.expect_error("E_BAD_BODY IDENTIFY failed to decode JSON body")


@pytest.mark.parametrize(
    "body",
    [
        b"null",  # Go's Unmarshal of null leaves every field at its zero value
        b'{"unknown_key": [1, 2], "feature_negotiation": false}',
        b'{"FEATURE_NEGOTIATION": false, "Client_ID": "x"}',  # keys match case-insensitively
        b'{"client_id": null, "heartbeat_interval": null}',
    ],
)
async def test_identify_without_feature_negotiation_replies_ok(nsqd, body):
    wire = await connect(nsqd)
    await wire.send(encode_command("IDENTIFY", body=body))
    await wire.expect_ok()
    await wire.send(encode_pub("t", b"x"))
    await wire.expect_ok()


async def test_identify_cannot_enable_both_deflate_and_snappy(nsqd):
    # Go nsqd enables both by default (--deflate, --snappy) and refuses a client asking for both.
    wire = await connect(nsqd)
    await wire.send(encode_identify({"feature_negotiation": True, "deflate": True, "snappy": True}))
    await wire.expect_error("E_IDENTIFY_FAILED cannot enable both deflate and snappy compression")


@with_options(deflate=False, snappy=False)
async def test_identify_compression_disabled_on_the_server_is_not_granted(nsqd):
    wire = await connect(nsqd)
    reply = await wire.identify(feature_negotiation=True, deflate=True, snappy=True)
    assert (reply["deflate"], reply["snappy"]) == (False, False)


async def test_identify_again_before_sub_is_allowed(nsqd):
    """Go's IDENTIFY does not change the connection state: it stays Init until SUB."""
    wire = await connect(nsqd)
    await wire.identify(client_id="first")
    reply = await wire.identify(feature_negotiation=True, msg_timeout=2000)
    assert reply["msg_timeout"] == 2000


async def test_identify_after_sub_is_fatal(nsqd):
    wire = await consumer(nsqd, "t", "c")
    await wire.send(encode_identify({"client_id": "late"}))
    await wire.expect_error("E_INVALID cannot IDENTIFY in current state")


async def test_identify_after_sub_is_refused_before_its_body_is_read(nsqd):
    # Go checks the state first; the bad size after it is never read.
    wire = await consumer(nsqd, "t", "c")
    await wire.send(b"IDENTIFY\n" + size(-5))
    await wire.expect_error("E_INVALID cannot IDENTIFY in current state")


@pytest.mark.parametrize(
    "data, text",
    [
        (size(5 * 1024 * 1024 + 1), "IDENTIFY body too big 5242881 > 5242880"),
        (size(0), "IDENTIFY invalid body size 0"),
        (size(-1), "IDENTIFY invalid body size -1"),
    ],
)
async def test_identify_body_size_errors(nsqd, data, text):
    wire = await connect(nsqd)
    await wire.send(b"IDENTIFY\n" + data)
    await wire.expect_error(f"E_BAD_BODY {text}")


@with_options(max_body_size=100)
async def test_identify_body_limit_is_max_body_size(nsqd):
    wire = await connect(nsqd)
    await wire.send(b"IDENTIFY\n" + size(101))
    await wire.expect_error("E_BAD_BODY IDENTIFY body too big 101 > 100")


@pytest.mark.parametrize(
    "data, text",
    [
        (b"\x00\x00", "IDENTIFY failed to read body size"),
        (size(20) + b'{"client', "IDENTIFY failed to read body"),
    ],
)
async def test_identify_cut_short_by_eof(nsqd, data, text):
    wire = await connect(nsqd)
    await wire.send(b"IDENTIFY\n" + data)
    await wire.send_eof()
    await wire.expect_error(f"E_BAD_BODY {text}")


# -- 2.2 AUTH (no --auth-http-address) ------------------------------------------------------


async def test_auth_disabled(nsqd):
    wire = await connect(nsqd)
    await wire.send(encode_command("AUTH", body=b"secret"))
    await wire.expect_error("E_AUTH_DISABLED AUTH disabled")


async def test_auth_with_parameters_is_fatal(nsqd):
    wire = await connect(nsqd)
    await wire.send(b"AUTH secret\n")
    await wire.expect_error("E_INVALID AUTH invalid number of parameters")


async def test_auth_after_sub_is_fatal(nsqd):
    wire = await consumer(nsqd, "t", "c")
    await wire.send(encode_command("AUTH", body=b"secret"))
    await wire.expect_error("E_INVALID cannot AUTH in current state")


@pytest.mark.parametrize(
    "data, text",
    [
        (size(5 * 1024 * 1024 + 1), "AUTH body too big 5242881 > 5242880"),
        (size(0), "AUTH invalid body size 0"),
        (size(-7), "AUTH invalid body size -7"),
    ],
)
async def test_auth_body_size_is_checked_before_auth_is_found_disabled(nsqd, data, text):
    wire = await connect(nsqd)
    await wire.send(b"AUTH\n" + data)
    await wire.expect_error(f"E_BAD_BODY {text}")


@pytest.mark.parametrize(
    "data, text",
    [(b"\x00", "AUTH failed to read body size"), (size(6) + b"sec", "AUTH failed to read body")],
)
async def test_auth_cut_short_by_eof(nsqd, data, text):
    wire = await connect(nsqd)
    await wire.send(b"AUTH\n" + data)
    await wire.send_eof()
    await wire.expect_error(f"E_BAD_BODY {text}")


# -- 2.3 SUB ----------------------------------------------------------------------------------

# Go formats bad names with %q: printable runes as they are, the rest escaped.
BAD_NAMES = [
    (b"a$b", '"a$b"'),
    (b'a"b', '"a\\"b"'),
    (b"a\\b", '"a\\\\b"'),
    (b"x" * 65, '"' + "x" * 65 + '"'),
    (b"", '""'),
    (b"a\tb", '"a\\tb"'),
    (b"t\x01", '"t\\x01"'),
    (b"t\x7f", '"t\\x7f"'),
    (b"\xff", '"\\xff"'),
    (b"caf\xc3\xa9", '"caf\xe9"'),
    (b"#ephemeral", '"#ephemeral"'),
    (b"t#ephemeral#ephemeral", '"t#ephemeral#ephemeral"'),
]


async def test_sub_ok_creates_topic_and_channel(nsqd):
    wire = await connect(nsqd)
    await wire.send(encode_sub("t", "c"))
    await wire.expect_ok()
    assert "c" in nsqd.topics["t"].channels


@pytest.mark.parametrize("topic, channel", [("x" * 64, "y" * 64), ("a.b-c_D9", "e#ephemeral")])
async def test_sub_accepts_valid_names(nsqd, topic, channel):
    wire = await connect(nsqd)
    await wire.send(encode_sub(topic, channel))
    await wire.expect_ok()


async def test_sub_ignores_extra_parameters(nsqd):
    wire = await connect(nsqd)
    await wire.send(b"SUB t c extra more\n")
    await wire.expect_ok()


async def test_sub_twice_is_fatal(nsqd):
    wire = await consumer(nsqd, "t", "c")
    await wire.send(encode_sub("t", "c2"))
    await wire.expect_error("E_INVALID cannot SUB in current state")


async def test_sub_with_heartbeats_disabled_is_fatal(nsqd):
    wire = await connect(nsqd)
    await wire.identify(heartbeat_interval=-1)
    await wire.send(encode_sub("t", "c"))
    await wire.expect_error("E_INVALID cannot SUB with heartbeats disabled")


@pytest.mark.parametrize("line", [b"SUB\n", b"SUB t\n"])
async def test_sub_insufficient_parameters(nsqd, line):
    wire = await connect(nsqd)
    await wire.send(line)
    await wire.expect_error("E_INVALID SUB insufficient number of parameters")


@pytest.mark.parametrize("name, quoted", BAD_NAMES)
async def test_sub_bad_topic_name(nsqd, name, quoted):
    wire = await connect(nsqd)
    await wire.send(b"SUB " + name + b" c\n")
    await wire.expect_error(f"E_BAD_TOPIC SUB topic name {quoted} is not valid")


@pytest.mark.parametrize("name, quoted", BAD_NAMES)
async def test_sub_bad_channel_name(nsqd, name, quoted):
    wire = await connect(nsqd)
    await wire.send(b"SUB t " + name + b"\n")
    await wire.expect_error(f"E_BAD_CHANNEL SUB channel name {quoted} is not valid")


async def test_sub_checks_the_topic_before_the_channel(nsqd):
    wire = await connect(nsqd)
    await wire.send(b"SUB t! c!\n")
    await wire.expect_error('E_BAD_TOPIC SUB topic name "t!" is not valid')


@with_options(max_channel_consumers=2)
async def test_sub_beyond_max_channel_consumers(nsqd):
    first = await consumer(nsqd, "t", "c")
    second = await consumer(nsqd, "t", "c")
    # Another channel of the same topic has its own count.
    other = await consumer(nsqd, "t", "other")
    wire = await connect(nsqd)
    await wire.send(encode_sub("t", "c"))
    await wire.expect_error("E_SUB_FAILED SUB failed consumers for t:c exceeds limit of 2")
    # A consumer leaving makes room again.
    await first.aclose()
    await wait_until(lambda: len(nsqd.topics["t"].channels["c"].clients) == 1)
    third = await consumer(nsqd, "t", "c")
    assert len(nsqd.topics["t"].channels["c"].clients) == 2
    for wire in (second, other, third):
        await wire.aclose()


# -- 2.4 RDY ----------------------------------------------------------------------------------


async def test_rdy_before_sub_is_fatal(nsqd):
    wire = await connect(nsqd)
    await wire.send(encode_rdy(1))
    await wire.expect_error("E_INVALID cannot RDY in current state")


@pytest.mark.parametrize("count", [b"abc", b"-1", b"+1", b"1.5", b"0x10", b"\xff"])
async def test_rdy_unparsable_count(nsqd, count):
    wire = await consumer(nsqd, "t", "c")
    await wire.send(b"RDY " + count + b"\n")
    await wire.expect_error(b"E_INVALID RDY could not parse count " + count)


async def test_rdy_above_max_rdy_count(nsqd):
    wire = await consumer(nsqd, "t", "c")
    await wire.send(encode_rdy(2501))
    await wire.expect_error("E_INVALID RDY count 2501 out of range 0-2500")


async def test_rdy_count_that_wraps_negative_in_go(nsqd):
    # Go parses into a uint64 and converts to int64: 2**64-1 is -1 there.
    wire = await consumer(nsqd, "t", "c")
    await wire.send(b"RDY 18446744073709551615\n")
    await wire.expect_error("E_INVALID RDY count -1 out of range 0-2500")


@with_options(max_rdy_count=10)
async def test_rdy_range_follows_max_rdy_count(nsqd):
    wire = await consumer(nsqd, "t", "c")
    await wire.send(encode_rdy(10))
    await wire.expect_open()
    await wire.send(encode_rdy(11))
    await wire.expect_error("E_INVALID RDY count 11 out of range 0-10")


@pytest.mark.parametrize(
    "line, count",
    [
        (b"RDY\n", 1),
        (b"RDY 2500\n", 2500),
        (b"RDY 0\n", 0),
        (b"RDY 007\n", 7),
        # Two spaces make an empty first parameter, which Go parses as 0.
        (b"RDY  5\n", 0),
    ],
)
async def test_rdy_sets_the_count_without_reply(nsqd, line, count):
    wire = await consumer(nsqd, "t", "c")
    await wire.send(line)
    # No reply to RDY: the next frame is the answer to the probe.
    await wire.expect_open()
    client = next(iter(nsqd.topics["t"].channels["c"].clients.values()))
    assert client.ready_count == count


async def test_rdy_without_count_means_one(nsqd):
    wire = await consumer(nsqd, "t", "c")
    await wire.send(b"RDY\n" + encode_mpub("t", [b"1", b"2"]))
    await wire.expect_ok()
    first = await wire.read_message()
    channel = nsqd.topics["t"].channels["c"]
    await trio.testing.wait_all_tasks_blocked()
    assert len(channel.in_flight) == 1 and channel.depth == 1
    await wire.finish(first)
    second = await wire.read_message()
    assert {first.body, second.body} == {b"1", b"2"}


async def test_rdy_after_cls_is_ignored(nsqd):
    wire = await consumer(nsqd, "t", "c", rdy=0)
    await wire.send(CLS)
    await wire.expect_response(b"CLOSE_WAIT")
    await wire.send(encode_rdy(10) + encode_rdy(99999))
    await wire.expect_open()
    await wire.send(encode_pub("t", b"x"))
    await wire.expect_ok()
    await trio.testing.wait_all_tasks_blocked()
    channel = nsqd.topics["t"].channels["c"]
    assert channel.depth == 1 and len(channel.in_flight) == 0
    assert wire.pending_messages() == 0


# -- 2.5 FIN, REQ, TOUCH --------------------------------------------------------------------


@pytest.mark.parametrize(
    "line, label",
    [
        (encode_fin(UNKNOWN_ID), "FIN"),
        (encode_req(UNKNOWN_ID, 0), "REQ"),
        (encode_touch(UNKNOWN_ID), "TOUCH"),
        (b"FIN\n", "FIN"),
    ],
)
async def test_message_commands_before_sub_are_fatal(nsqd, line, label):
    wire = await connect(nsqd)
    await wire.send(line)
    await wire.expect_error(f"E_INVALID cannot {label} in current state")


@pytest.mark.parametrize(
    "line, text",
    [
        (b"FIN\n", "FIN insufficient number of params"),
        (b"REQ\n", "REQ insufficient number of params"),
        (b"REQ " + UNKNOWN_ID + b"\n", "REQ insufficient number of params"),
        (b"REQ abc\n", "REQ insufficient number of params"),
        (b"TOUCH\n", "TOUCH insufficient number of params"),
        (b"FIN abc\n", "invalid message ID"),
        (b"FIN 0123456789abcdef0\n", "invalid message ID"),
        (b"FIN \n", "invalid message ID"),
        (b"REQ abc 0\n", "invalid message ID"),
        (b"TOUCH 0123456789abcde\n", "invalid message ID"),
        # The ID is checked before the timeout.
        (b"REQ abc xyz\n", "invalid message ID"),
        (b"REQ " + UNKNOWN_ID + b" xyz\n", "REQ could not parse timeout xyz"),
        (b"REQ " + UNKNOWN_ID + b" -1\n", "REQ could not parse timeout -1"),
        (b"REQ " + UNKNOWN_ID + b" 1.5\n", "REQ could not parse timeout 1.5"),
    ],
)
async def test_message_command_syntax_errors_are_fatal(nsqd, line, text):
    wire = await consumer(nsqd, "t", "c")
    await wire.send(line)
    await wire.expect_error(f"E_INVALID {text}")


@pytest.mark.parametrize(
    "command, text",
    [
        (encode_fin, "E_FIN_FAILED FIN {} failed ID not in flight"),
        (lambda mid: encode_req(mid, 0), "E_REQ_FAILED REQ {} failed ID not in flight"),
        (encode_touch, "E_TOUCH_FAILED TOUCH {} failed ID not in flight"),
    ],
    ids=["FIN", "REQ", "TOUCH"],
)
async def test_message_commands_on_unknown_id_are_not_fatal(nsqd, command, text):
    wire = await consumer(nsqd, "t", "c")
    message_id = b"0123456789abcdef"
    await wire.send(command(message_id))
    await wire.expect_error(text.format(message_id.decode()), fatal=False)


async def test_message_commands_on_another_clients_message_are_not_fatal(nsqd):
    owner = await consumer(nsqd, "t", "c", rdy=1)
    other = await consumer(nsqd, "t", "c", rdy=0)
    await owner.send(encode_pub("t", b"x"))
    await owner.expect_ok()
    message = await owner.read_message()
    text = message.id.decode()
    await other.send(encode_fin(message.id))
    await other.expect_error(
        f"E_FIN_FAILED FIN {text} failed client does not own message", fatal=False
    )
    await other.send(encode_req(message.id, 0))
    await other.expect_error(
        f"E_REQ_FAILED REQ {text} failed client does not own message", fatal=False
    )
    await other.send(encode_touch(message.id))
    await other.expect_error(
        f"E_TOUCH_FAILED TOUCH {text} failed client does not own message", fatal=False
    )
    # The owner still has it, and can finish it.
    await owner.send(encode_touch(message.id) + encode_fin(message.id))
    channel = nsqd.topics["t"].channels["c"]
    await wait_until(lambda: len(channel.in_flight) == 0)
    await owner.expect_open()


async def test_fin_twice_fails_the_second_time(nsqd):
    wire = await consumer(nsqd, "t", "c", rdy=1)
    await wire.send(encode_pub("t", b"x"))
    await wire.expect_ok()
    message = await wire.read_message()
    await wire.send(encode_fin(message.id) + encode_fin(message.id))
    await wire.expect_error(
        f"E_FIN_FAILED FIN {message.id.decode()} failed ID not in flight", fatal=False
    )


async def test_a_batch_of_fins_is_answered_like_fins_one_by_one(nsqd):
    """A consumer's FINs sent together: each is done, and the ones that fail (unknown, twice,
    malformed) are answered with Go's texts in the order they were sent."""
    wire = await consumer(nsqd, "t", "c", rdy=3)
    await wire.send(encode_mpub("t", [b"a", b"b", b"c"]))
    await wire.expect_ok()
    first, second, third = await wire.read_messages(3)
    channel = nsqd.topics["t"].channels["c"]
    [client] = channel.clients.values()
    await wire.send(
        encode_fin(first.id)
        + encode_fin(UNKNOWN_ID)
        + encode_fin(second.id)
        + encode_fin(second.id)
        + encode_fin(third.id)
    )
    answers = [(await wire.read_response()).data for _ in range(2)]
    assert answers == [
        b"E_FIN_FAILED FIN " + UNKNOWN_ID + b" failed ID not in flight",
        b"E_FIN_FAILED FIN " + second.id + b" failed ID not in flight",
    ]
    await wire.expect_open()
    assert len(channel.in_flight) == 0
    assert (client.finish_count, client.in_flight_count) == (3, 0)
    # A FIN line that is not `FIN <16 bytes>` after a run: still Go's error, fatal.
    await wire.send(encode_fin(UNKNOWN_ID) + b"FIN " + first.id[:15] + b"\r\n")
    answer = await wire.read_response()
    assert answer.data == b"E_FIN_FAILED FIN " + UNKNOWN_ID + b" failed ID not in flight"
    await wire.expect_error("E_INVALID invalid message ID")


async def test_fin_req_touch_reply_nothing(nsqd):
    wire = await consumer(nsqd, "t", "c", rdy=2)
    await wire.send(encode_mpub("t", [b"a", b"b"]))
    await wire.expect_ok()
    first, second = await wire.read_messages(2)
    await wire.send(encode_touch(first.id) + encode_fin(first.id) + encode_req(second.id, 0))
    again = await wire.read_message()
    assert (again.id, again.attempts) == (second.id, 2)
    await wire.send(encode_fin(again.id))
    # The probe's answer is the first frame: nothing was answered before it.
    await wire.expect_open()
    channel = nsqd.topics["t"].channels["c"]
    assert channel.requeue_count == 1 and len(channel.in_flight) == 0


@with_options(max_req_timeout=0.3)
async def test_req_timeout_above_max_is_clamped_not_refused(nsqd):
    wire = await consumer(nsqd, "t", "c", rdy=1)
    await wire.send(encode_pub("t", b"x"))
    await wire.expect_ok()
    message = await wire.read_message()
    sent = trio.current_time()
    await wire.send(encode_req(message.id, 3_600_000))
    again = await wire.read_message(timeout=5)
    # Deferred by --max-req-timeout (0.3 s), not by an hour.
    assert trio.current_time() - sent >= 0.3
    assert (again.id, again.attempts) == (message.id, 2)


# -- 2.6 CLS, NOP ---------------------------------------------------------------------------


async def test_cls_before_sub_is_fatal(nsqd):
    wire = await connect(nsqd)
    await wire.send(CLS)
    await wire.expect_error("E_INVALID cannot CLS in current state")


async def test_cls_then_fin_still_allowed_and_cls_again_fatal(nsqd):
    wire = await consumer(nsqd, "t", "c", rdy=2)
    await wire.send(encode_mpub("t", [b"a", b"b", b"c"]))
    await wire.expect_ok()
    first, second = await wire.read_messages(2)
    await wire.send(CLS)
    await wire.expect_response(b"CLOSE_WAIT")
    # In-flight messages may still be finished and requeued after CLS ...
    await wire.send(encode_fin(first.id) + encode_req(second.id, 0) + encode_rdy(5))
    channel = nsqd.topics["t"].channels["c"]
    await wait_until(lambda: len(channel.in_flight) == 0)
    # ... but nothing more is delivered: CLS set RDY to 0 and RDY is now ignored.
    await trio.testing.wait_all_tasks_blocked()
    assert channel.depth == 2 and wire.pending_messages() == 0
    await wire.expect_open()
    await wire.send(CLS)
    await wire.expect_error("E_INVALID cannot CLS in current state")


async def test_nop_has_no_reply(nsqd):
    wire = await connect(nsqd)
    await wire.send(NOP + NOP + encode_pub("t", b"x") + NOP)
    await wire.expect_ok()
    await wire.send(encode_pub("t", b"y"))
    await wire.expect_ok()


# -- 2.7 PUB ----------------------------------------------------------------------------------


async def test_pub_creates_the_topic(nsqd):
    wire = await connect(nsqd)
    await wire.send(encode_pub("new", b"x"))
    await wire.expect_ok()
    assert nsqd.topics["new"].depth == 1


async def test_pub_is_allowed_in_every_state(nsqd):
    wire = await connect(nsqd)
    await wire.send(encode_pub("t", b"init"))
    await wire.expect_ok()
    await wire.subscribe("other", "c")
    await wire.send(encode_pub("t", b"subscribed"))
    await wire.expect_ok()
    await wire.send(CLS)
    await wire.expect_response(b"CLOSE_WAIT")
    await wire.send(encode_pub("t", b"closing"))
    await wire.expect_ok()
    assert nsqd.topics["t"].depth == 3


async def test_pub_insufficient_parameters(nsqd):
    wire = await connect(nsqd)
    await wire.send(b"PUB\n" + size(1) + b"x")
    await wire.expect_error("E_INVALID PUB insufficient number of parameters")


@pytest.mark.parametrize("name, quoted", BAD_NAMES)
async def test_pub_bad_topic_name(nsqd, name, quoted):
    wire = await connect(nsqd)
    await wire.send(b"PUB " + name + b"\n")
    await wire.expect_error(f"E_BAD_TOPIC PUB topic name {quoted} is not valid")


@with_options(max_msg_size=100)
@pytest.mark.parametrize(
    "data, text",
    [
        (size(0), "PUB invalid message body size 0"),
        (size(-1), "PUB invalid message body size -1"),
        (size(101), "PUB message too big 101 > 100"),
        (size(2**31 - 1), "PUB message too big 2147483647 > 100"),
    ],
)
async def test_pub_body_size_errors(nsqd, data, text):
    wire = await connect(nsqd)
    await wire.send(b"PUB t\n" + data)
    await wire.expect_error(f"E_BAD_MESSAGE {text}")


@with_options(max_msg_size=100)
async def test_pub_of_exactly_max_msg_size(nsqd):
    wire = await connect(nsqd)
    await wire.send(encode_pub("t", b"m" * 100))
    await wire.expect_ok()


async def test_pub_limit_defaults_to_one_mebibyte(nsqd):
    wire = await connect(nsqd)
    await wire.send(b"PUB t\n" + size(1024 * 1024 + 1))
    await wire.expect_error("E_BAD_MESSAGE PUB message too big 1048577 > 1048576")


async def test_a_refused_body_is_read_and_dropped_so_the_client_gets_the_error_not_a_reset(
    nsqd,
):
    """A client still sending a body nsqd refused (too big) gets the error and then EOF: nsqd
    stops writing, reads what comes and drops it, instead of closing on unread bytes (which
    resets the connection, and a reset loses the error on the client's side)."""
    wire = await connect(nsqd)
    await wire.send(b"PUB t\n" + size(4 * 1024 * 1024))
    frame = await wire.read_response()
    assert frame.data == b"E_BAD_MESSAGE PUB message too big 4194304 > 1048576"
    with trio.fail_after(READ_TIMEOUT):
        assert await wire.stream.receive_some(65536) == b""
        for _ in range(64):
            await wire.stream.send_all(b"x" * 65536)


@pytest.mark.parametrize(
    "data, text",
    [
        (b"", "PUB failed to read message body size"),
        (b"\x00\x00\x00", "PUB failed to read message body size"),
        (size(10) + b"abc", "PUB failed to read message body"),
    ],
)
async def test_pub_cut_short_by_eof(nsqd, data, text):
    wire = await connect(nsqd)
    await wire.send(b"PUB t\n" + data)
    await wire.send_eof()
    await wire.expect_error(f"E_BAD_MESSAGE {text}")
    assert "t" not in nsqd.topics or nsqd.topics["t"].depth == 0


@pytest.mark.parametrize(
    "data, text",
    [
        (encode_pub("t", b"x"), "E_PUB_FAILED PUB failed exiting"),
        (encode_mpub("t", [b"x"]), "E_MPUB_FAILED MPUB failed exiting"),
        (encode_dpub("t", 10, b"x"), "E_DPUB_FAILED DPUB failed exiting"),
    ],
    ids=["PUB", "MPUB", "DPUB"],
)
async def test_publish_while_nsqd_exits(nsqd, data, text):
    wire = await connect(nsqd)
    # What a connection still open during shutdown sees once the topics have started to exit
    # (Go's topic.PutMessage returns "exiting").
    nsqd.exiting = True
    await wire.send(data)
    await wire.expect_error(text)


# -- 2.8 MPUB ---------------------------------------------------------------------------------


async def test_mpub_delivers_every_message_in_order(nsqd):
    wire = await consumer(nsqd, "t", "c", rdy=100)
    bodies = [b"m%d" % i for i in range(50)]
    await wire.send(encode_mpub("t", bodies))
    await wire.expect_ok()
    messages = await wire.read_messages(50)
    assert [m.body for m in messages] == bodies
    assert len({m.id for m in messages}) == 50


async def test_mpub_insufficient_parameters(nsqd):
    wire = await connect(nsqd)
    await wire.send(b"MPUB\n")
    await wire.expect_error("E_INVALID MPUB insufficient number of parameters")


@pytest.mark.parametrize("name, quoted", BAD_NAMES)
async def test_mpub_bad_topic_name_repeats_the_code(nsqd, name, quoted):
    wire = await connect(nsqd)
    await wire.send(b"MPUB " + name + b"\n")
    await wire.expect_error(f"E_BAD_TOPIC E_BAD_TOPIC MPUB topic name {quoted} is not valid")


def mpub_raw(body: bytes) -> bytes:
    return b"MPUB t\n" + size(len(body)) + body


@with_options(max_body_size=200, max_msg_size=100)
@pytest.mark.parametrize(
    "data, text",
    [
        (b"MPUB t\n" + size(0), "E_BAD_BODY MPUB invalid body size 0"),
        (b"MPUB t\n" + size(-3), "E_BAD_BODY MPUB invalid body size -3"),
        (b"MPUB t\n" + size(201), "E_BAD_BODY MPUB body too big 201 > 200"),
        (mpub_raw(size(0)), "E_BAD_BODY MPUB invalid message count 0"),
        (mpub_raw(size(-1)), "E_BAD_BODY MPUB invalid message count -1"),
        # At most (max_body_size - 4) / 5 messages fit: 39 here.
        (mpub_raw(size(40)), "E_BAD_BODY MPUB invalid message count 40"),
        (
            mpub_raw(size(2) + size(1) + b"a" + size(0)),
            "E_BAD_MESSAGE MPUB invalid message(1) body size 0",
        ),
        (mpub_raw(size(1) + size(-2)), "E_BAD_MESSAGE MPUB invalid message(0) body size -2"),
        (
            mpub_raw(size(1) + size(101) + b"m" * 101),
            "E_BAD_MESSAGE MPUB message too big 101 > 100",
        ),
    ],
)
async def test_mpub_body_errors(nsqd, data, text):
    wire = await connect(nsqd)
    await wire.send(data)
    await wire.expect_error(text)
    assert "t" not in nsqd.topics or nsqd.topics["t"].depth == 0


@with_options(max_body_size=200, max_msg_size=100)
async def test_mpub_of_exactly_the_limits(nsqd):
    wire = await connect(nsqd)
    # 4 + 39 * 5 = 199 bytes: the most messages that fit.
    await wire.send(encode_mpub("t", [b"x"] * 39))
    await wire.expect_ok()
    await wire.send(encode_mpub("t", [b"m" * 100]))
    await wire.expect_ok()
    assert nsqd.topics["t"].depth == 40


@pytest.mark.parametrize(
    "data, text",
    [
        (b"\x00\x00", "E_BAD_BODY MPUB failed to read body size"),
        (size(10) + b"\x00\x00", "E_BAD_BODY MPUB failed to read message count"),
        (
            size(16) + size(3) + size(1) + b"a" + size(1) + b"b",
            "E_BAD_MESSAGE MPUB failed to read message(2) body size",
        ),
        (size(11) + size(1) + size(10) + b"abc", "E_BAD_MESSAGE MPUB failed to read message body"),
    ],
)
async def test_mpub_cut_short_by_eof(nsqd, data, text):
    wire = await connect(nsqd)
    await wire.send(b"MPUB t\n" + data)
    await wire.send_eof()
    await wire.expect_error(text)
    # All or nothing: not even the complete messages before the cut are stored.
    assert "t" not in nsqd.topics or nsqd.topics["t"].depth == 0


# -- 2.9 DPUB ---------------------------------------------------------------------------------


@pytest.mark.parametrize("line", [b"DPUB\n", b"DPUB t\n"])
async def test_dpub_insufficient_parameters(nsqd, line):
    wire = await connect(nsqd)
    await wire.send(line)
    await wire.expect_error("E_INVALID DPUB insufficient number of parameters")


@pytest.mark.parametrize("name, quoted", BAD_NAMES)
async def test_dpub_bad_topic_name(nsqd, name, quoted):
    wire = await connect(nsqd)
    # The topic is checked before the timeout, even an unparsable one.
    await wire.send(b"DPUB " + name + b" xyz\n")
    await wire.expect_error(f"E_BAD_TOPIC DPUB topic name {quoted} is not valid")


@pytest.mark.parametrize(
    "timeout, text",
    [
        (b"xyz", "DPUB could not parse timeout xyz"),
        (b"-1", "DPUB could not parse timeout -1"),
        (b"3600001", "DPUB timeout 3600001 out of range 0-3600000"),
        (b"18446744073709551615", "DPUB timeout 18446744073709551615 out of range 0-3600000"),
    ],
)
async def test_dpub_bad_timeout(nsqd, timeout, text):
    wire = await connect(nsqd)
    await wire.send(b"DPUB t " + timeout + b"\n" + size(1) + b"x")
    await wire.expect_error(f"E_INVALID {text}")


@with_options(max_req_timeout=10.0)
async def test_dpub_range_follows_max_req_timeout(nsqd):
    wire = await connect(nsqd)
    await wire.send(encode_dpub("t", 10000, b"x"))
    await wire.expect_ok()
    await wire.send(encode_dpub("t", 10001, b"x"))
    await wire.expect_error("E_INVALID DPUB timeout 10001 out of range 0-10000")


async def test_dpub_range_ends_are_accepted(nsqd):
    wire = await connect(nsqd)
    # An empty timeout parses as 0 in Go (ByteToBase10 of no digits).
    await wire.send(
        encode_dpub("t", 0, b"now")
        + encode_dpub("t", 3_600_000, b"later")
        + b"DPUB t \n"
        + size(5)
        + b"empty"
    )
    for _ in range(3):
        await wire.expect_ok()


@with_options(max_msg_size=100)
@pytest.mark.parametrize(
    "data, text",
    [
        (size(0), "DPUB invalid message body size 0"),
        (size(-1), "DPUB invalid message body size -1"),
        (size(101), "DPUB message too big 101 > 100"),
    ],
)
async def test_dpub_body_size_errors(nsqd, data, text):
    wire = await connect(nsqd)
    await wire.send(b"DPUB t 10\n" + data)
    await wire.expect_error(f"E_BAD_MESSAGE {text}")


@pytest.mark.parametrize(
    "data, text",
    [
        (b"\x00", "DPUB failed to read message body size"),
        (size(3) + b"a", "DPUB failed to read message body"),
    ],
)
async def test_dpub_cut_short_by_eof(nsqd, data, text):
    wire = await connect(nsqd)
    await wire.send(b"DPUB t 10\n" + data)
    await wire.send_eof()
    await wire.expect_error(f"E_BAD_MESSAGE {text}")


# -- 2.10 unknown commands ------------------------------------------------------------------


@pytest.mark.parametrize(
    "line, name",
    [
        (b"FOO\n", b"FOO"),
        (b"pub t\n", b"pub"),
        (b"SUBX t c\n", b"SUBX"),
        (b"\n", b""),
        (b"\r\n", b""),
        (b" PUB t\n", b""),
        (b"NOP!\n", b"NOP!"),
    ],
)
async def test_unknown_command_is_fatal(nsqd, line, name):
    wire = await connect(nsqd)
    await wire.send(line)
    await wire.expect_error(b"E_INVALID invalid command " + name)


# -- 1.2 framing: pipelining and line endings -----------------------------------------------


async def test_pipelined_commands_are_answered_in_order(nsqd):
    wire = await connect(nsqd)
    await wire.send(
        encode_identify({"feature_negotiation": True, "msg_timeout": 3000})
        + encode_pub("t", b"1")
        + NOP
        + encode_mpub("t", [b"2", b"3"])
        + encode_dpub("t", 0, b"4")
        + encode_sub("t", "c")
        + encode_rdy(10)
        + encode_pub("t", b"5")
    )
    reply = await wire.read_response()
    assert json.loads(reply.data)["msg_timeout"] == 3000
    for _ in range(5):  # PUB, MPUB, DPUB, SUB, PUB
        await wire.expect_ok()
    messages = await wire.read_messages(5)
    assert sorted(m.body for m in messages) == [b"1", b"2", b"3", b"4", b"5"]


async def test_pipelined_commands_after_a_fatal_error_are_not_run(nsqd):
    wire = await connect(nsqd)
    await wire.send(encode_pub("t", b"1") + b"BAD\n" + encode_pub("t", b"2"))
    await wire.expect_ok()
    frame = await wire.read_response()
    assert (frame.frame_type, frame.data) == (FRAME_TYPE_ERROR, b"E_INVALID invalid command BAD")
    await wire.expect_closed()
    assert nsqd.topics["t"].depth == 1


async def test_pipelined_non_fatal_errors_keep_going(nsqd):
    wire = await consumer(nsqd, "t", "c")
    other = b"fedcba9876543210"
    await wire.send(encode_fin(UNKNOWN_ID) + encode_touch(other) + encode_pub("t", b"x"))
    first = await wire.read_response()
    second = await wire.read_response()
    assert first.data == b"E_FIN_FAILED FIN " + UNKNOWN_ID + b" failed ID not in flight"
    assert second.data == b"E_TOUCH_FAILED TOUCH " + other + b" failed ID not in flight"
    await wire.expect_ok()


async def test_commands_split_across_writes(nsqd):
    wire = await connect(nsqd)
    data = encode_pub("t", b"hello") + encode_mpub("t", [b"a", b"b"])
    for index in range(len(data)):
        await wire.send(data[index : index + 1])
    await wire.expect_ok()
    await wire.expect_ok()
    assert nsqd.topics["t"].depth == 3


async def test_crlf_terminated_commands(nsqd):
    wire = await connect(nsqd)
    await wire.send(b"IDENTIFY\r\n" + encode_identify({"client_id": "crlf"})[len(b"IDENTIFY\n") :])
    await wire.expect_ok()
    await wire.send(b"SUB t c\r\nRDY 2\r\nPUB t\r\n" + size(1) + b"a" + b"NOP\r\n")
    await wire.expect_ok()
    await wire.expect_ok()
    message = await wire.read_message()
    await wire.send(b"REQ " + message.id + b" 0\r\n")
    again = await wire.read_message()
    assert again.attempts == 2
    await wire.send(b"TOUCH " + again.id + b"\r\nFIN " + again.id + b"\r\n")
    channel = nsqd.topics["t"].channels["c"]
    await wait_until(lambda: len(channel.in_flight) == 0)
    await wire.send(b"CLS\r\n")
    await wire.expect_response(b"CLOSE_WAIT")


# -- 1.4 heartbeats (real time) -------------------------------------------------------------


async def test_heartbeats_arrive_and_a_client_answering_nop_stays(nsqd):
    wire = await Wire.connect(nsqd, answer_heartbeats=False)
    await wire.identify(heartbeat_interval=1000)
    start = trio.current_time()
    with trio.fail_after(6):
        # Answer each heartbeat until well past 2 x interval.
        while trio.current_time() - start < 2.5:
            frame = await wire.read_frame()
            assert (frame.frame_type, frame.data) == (FRAME_TYPE_RESPONSE, b"_heartbeat_")
            await wire.send(NOP)
    await wire.send(encode_pub("t", b"still here"))
    await wire.expect_ok()


async def test_silent_client_is_closed_after_two_heartbeat_intervals(nsqd):
    wire = await Wire.connect(nsqd, answer_heartbeats=False)
    await wire.identify(heartbeat_interval=1000)
    start = trio.current_time()
    with trio.fail_after(5):
        await wire.expect_closed()
    elapsed = trio.current_time() - start
    assert 1.8 <= elapsed < 3.5
    await wait_until(lambda: not nsqd.clients)
