"""nsqd's HTTP API, endpoint by endpoint and error by error, as Go nsqd v1.3.0 answers
(docs/protocol.md §6.1; nsqd/http.go of v1.3.0 for the order in which arguments are checked).

Every request goes over a real socket to the in-process nsqd; what the API did is then checked
from the outside: through `/stats`, by consuming over TCP with our V2 codec, or by reading the
data directory (diskqueue files, `nsqd.dat`). Errors are asserted exactly: status line,
`{"message": ...}` body and headers.
"""

import json
import os
import socket
import struct
import time

import pytest
import trio

from nsqpy.common.command import encode_mpub, encode_mpub_body, encode_pub
from tests.harness import start_nsqd
from tests.nsqd.wire import Wire, consumer, with_options
from tests.support.http import RawConnection, encode_request, raw_request, target
from tests.support.polling import wait_until
from tests.support.stats import raw_stats

JSON_TYPE = "application/json; charset=utf-8"
TEXT_TYPE = "text/plain; charset=utf-8"
NSQ_V1 = "nsq; version=1.0"


async def call(nsqd, method: str, path: str, body=None, **params):
    return await raw_request(nsqd.http_address, method, target(path, **params), body)


def assert_error(response, status: int, message: str) -> None:
    """Go's http_api.RespondV1 error: the status, `{"message":"TEXT"}`, JSON and V1 headers."""
    got = (response.status, response.body)
    assert got == (status, b'{"message":"%s"}' % message.encode()), response
    assert response.header("Content-Type") == JSON_TYPE
    assert response.header("X-Nsq-Content-Type") == NSQ_V1


def assert_empty_ok(response) -> None:
    """Go's RespondV1(200, nil): no body, no Content-Type, the V1 header."""
    assert (response.status_line, response.body) == ("HTTP/1.1 200 OK", b""), response
    assert response.header("Content-Type") is None
    assert response.header("Content-Length") == "0"
    assert response.header("X-Nsq-Content-Type") == NSQ_V1


def assert_ok_text(response, body: bytes = b"OK") -> None:
    assert (response.status, response.body) == (200, body), response
    assert response.header("Content-Type") == TEXT_TYPE
    assert response.header("X-Nsq-Content-Type") == NSQ_V1


async def topic_stats(nsqd, topic: str) -> dict:
    document = await raw_stats(nsqd.http_address, topic=topic)
    assert document["topics"] is not None, f"topic {topic} does not exist"
    (found,) = document["topics"]
    return found


async def channel_stats(nsqd, topic: str, channel: str) -> dict:
    document = await raw_stats(nsqd.http_address, topic=topic, channel=channel)
    (found,) = document["topics"][0]["channels"]
    return found


async def receive_bodies(wire: Wire, count: int) -> list[bytes]:
    messages = await wire.read_messages(count)
    await wire.finish(*messages)
    return [message.body for message in messages]


async def nothing_delivered(wire: Wire, window: float = 0.2) -> bool:
    """No message reaches `wire` within `window`: the one wait for an absence."""
    with trio.move_on_after(window):
        await wire.read_message(timeout=window + 1)
        return False
    return True


# -- /ping and /info ---------------------------------------------------------------------


async def test_ping_answers_plain_ok(nsqd):
    response = await call(nsqd, "GET", "/ping")
    assert (response.status_line, response.body) == ("HTTP/1.1 200 OK", b"OK")
    assert response.header("Content-Type") == TEXT_TYPE
    assert response.header("X-Nsq-Content-Type") is None  # PlainText, not V1


async def test_ping_answers_500_with_the_health_while_unhealthy(nsqd):
    nsqd.storage.health.write_done(OSError("disk full"))
    try:
        response = await call(nsqd, "GET", "/ping")
    finally:
        nsqd.storage.health.write_done(None)
    assert (response.status, response.body) == (500, b"NOK - disk full")
    assert response.header("Content-Type") == TEXT_TYPE
    assert (await call(nsqd, "GET", "/ping")).body == b"OK"


async def test_info_has_go_keys_types_and_values(nsqd):
    response = await call(nsqd, "GET", "/info")
    assert response.status == 200
    assert response.header("Content-Type") == JSON_TYPE
    info = response.json()
    assert list(info) == [
        "version",
        "broadcast_address",
        "hostname",
        "http_port",
        "tcp_port",
        "start_time",
        "max_heartbeat_interval",
        "max_output_buffer_size",
        "max_output_buffer_timeout",
        "max_deflate_level",
    ]
    assert info["version"].startswith("1.3.0")
    assert info["broadcast_address"] == "127.0.0.1"
    assert info["hostname"] == socket.gethostname()
    assert info["http_port"] == int(nsqd.http_address.rsplit(":", 1)[1])
    assert info["tcp_port"] == int(nsqd.tcp_address.rsplit(":", 1)[1])
    assert isinstance(info["start_time"], int) and abs(info["start_time"] - time.time()) < 60
    # Durations are Go time.Duration: integer nanoseconds.
    assert info["max_heartbeat_interval"] == 60_000_000_000
    assert info["max_output_buffer_size"] == 65536
    assert info["max_output_buffer_timeout"] == 30_000_000_000
    assert info["max_deflate_level"] == 6


# -- /pub --------------------------------------------------------------------------------


async def test_pub_publishes_the_body_as_one_message(nsqd):
    wire = await consumer(nsqd, "pub", "ch", rdy=10)
    assert_ok_text(await call(nsqd, "POST", "/pub", b"hello \x00 world\n", topic="pub"))
    assert await receive_bodies(wire, 1) == [b"hello \x00 world\n"]
    topic = await topic_stats(nsqd, "pub")
    assert (topic["message_count"], topic["message_bytes"]) == (1, 14)


@pytest.mark.parametrize(
    ("params", "body", "message"),
    [
        ({}, b"x", "MISSING_ARG_TOPIC"),
        ({"topic": "bad!name"}, b"x", "INVALID_TOPIC"),
        ({"topic": ""}, b"x", "INVALID_TOPIC"),
        ({"topic": "a" * 65}, b"x", "INVALID_TOPIC"),
        ({"topic": "t"}, b"", "MSG_EMPTY"),
        ({"topic": "t"}, None, "MSG_EMPTY"),  # no body at all
        ({}, b"", "MSG_EMPTY"),  # the body is checked before the topic
    ],
)
async def test_pub_400_errors(nsqd, params, body, message):
    assert_error(await call(nsqd, "POST", "/pub", body, **params), 400, message)
    assert (await raw_stats(nsqd.http_address))["topics"] == []  # and no topic was created


@with_options(max_msg_size=100)
async def test_pub_msg_too_big_is_413_and_the_limit_itself_is_allowed(nsqd):
    assert_error(await call(nsqd, "POST", "/pub", b"x" * 101, topic="t"), 413, "MSG_TOO_BIG")
    # The size is checked before the topic argument.
    assert_error(await call(nsqd, "POST", "/pub", b"x" * 101), 413, "MSG_TOO_BIG")
    assert (await raw_stats(nsqd.http_address))["topics"] == []
    assert_ok_text(await call(nsqd, "POST", "/pub", b"x" * 100, topic="t"))


async def test_pub_defer_holds_the_message_in_the_channel(nsqd):
    await call(nsqd, "POST", "/topic/create", topic="later")
    await call(nsqd, "POST", "/channel/create", topic="later", channel="ch")
    assert_ok_text(await call(nsqd, "POST", "/pub", b"soon", topic="later", defer="150"))
    channel = await channel_stats(nsqd, "later", "ch")
    assert (channel["deferred_count"], channel["depth"], channel["message_count"]) == (1, 0, 1)
    wire = await consumer(nsqd, "later", "ch", rdy=1)
    assert await receive_bodies(wire, 1) == [b"soon"]


@pytest.mark.parametrize("defer", ["0", "3600000", "+5"])
async def test_pub_defer_accepts_0_to_max_req_timeout(nsqd, defer):
    assert_ok_text(await call(nsqd, "POST", "/pub", b"x", topic="t", defer=defer))


@pytest.mark.parametrize("defer", ["abc", "", "1.5", "-1", "3600001", "99999999999999999999"])
async def test_pub_invalid_defer(nsqd, defer):
    response = await call(nsqd, "POST", "/pub", b"x", topic="t", defer=defer)
    assert_error(response, 400, "INVALID_DEFER")
    assert (await topic_stats(nsqd, "t"))["message_count"] == 0


async def test_put_is_kept_as_an_alias_of_pub(nsqd):
    """Go 1.2.0 dropped /put, but the client-library guide still tells people to publish
    with it, so nsqpy keeps it as /pub under another name (a deliberate difference)."""
    response = await call(nsqd, "POST", "/put", b"x", topic="t")
    assert (response.status, response.body) == (200, b"OK")
    assert (await topic_stats(nsqd, "t"))["message_count"] == 1
    assert_error(await call(nsqd, "POST", "/put", b"", topic="t"), 400, "MSG_EMPTY")


# -- /mpub -------------------------------------------------------------------------------


async def test_mpub_text_mode_publishes_each_line_and_skips_empty_ones(nsqd):
    wire = await consumer(nsqd, "lines", "ch", rdy=10)
    body = b"one\n\ntwo\n\n\nthree\n"
    assert_ok_text(await call(nsqd, "POST", "/mpub", body, topic="lines"))
    assert await receive_bodies(wire, 3) == [b"one", b"two", b"three"]
    # The last line needs no newline; \r is part of a message.
    assert_ok_text(await call(nsqd, "POST", "/mpub", b"four\r\nfive", topic="lines"))
    assert await receive_bodies(wire, 2) == [b"four\r", b"five"]
    assert (await topic_stats(nsqd, "lines"))["message_count"] == 5


async def test_mpub_of_nothing_is_ok_and_publishes_nothing(nsqd):
    assert_ok_text(await call(nsqd, "POST", "/mpub", b"", topic="none"))
    assert_ok_text(await call(nsqd, "POST", "/mpub", b"\n\n", topic="none"))
    assert (await topic_stats(nsqd, "none"))["message_count"] == 0


@with_options(max_msg_size=10)
async def test_mpub_text_line_too_big_is_413_and_publishes_nothing(nsqd):
    body = b"short\n" + b"x" * 11 + b"\nlast"
    assert_error(await call(nsqd, "POST", "/mpub", body, topic="t"), 413, "MSG_TOO_BIG")
    assert (await topic_stats(nsqd, "t"))["message_count"] == 0
    assert_ok_text(await call(nsqd, "POST", "/mpub", b"x" * 10 + b"\nok", topic="t"))


@with_options(max_body_size=100, max_msg_size=50)
async def test_mpub_body_too_big_is_413(nsqd):
    too_big = b"abc\n" * 25 + b"x"
    assert_error(await call(nsqd, "POST", "/mpub", too_big, topic="t"), 413, "BODY_TOO_BIG")
    # Content-Length is checked before the topic argument.
    assert_error(await call(nsqd, "POST", "/mpub", too_big), 413, "BODY_TOO_BIG")
    assert_ok_text(await call(nsqd, "POST", "/mpub", b"abc\n" * 25, topic="t"))
    assert (await topic_stats(nsqd, "t"))["message_count"] == 25


@pytest.mark.parametrize("value", ["true", "1", "yes", "t", "T", "f", "F", "False", "FALSE"])
async def test_mpub_binary_mode_for_true_and_any_unrecognised_value(nsqd, value):
    """Go's boolParams know "true", "1", "false" and "0"; anything else means binary mode."""
    body = encode_mpub_body([b"alpha", b"beta", b"line\nbreak"])
    response = await call(nsqd, "POST", "/mpub", body, topic="bin", binary=value)
    assert_ok_text(response)
    wire = await consumer(nsqd, "bin", "ch", rdy=10)
    assert await receive_bodies(wire, 3) == [b"alpha", b"beta", b"line\nbreak"]


@pytest.mark.parametrize("value", ["false", "0"])
async def test_mpub_binary_false_or_0_means_text_mode(nsqd, value):
    response = await call(nsqd, "POST", "/mpub", b"alpha\nbeta", topic="txt", binary=value)
    assert_ok_text(response)
    assert (await topic_stats(nsqd, "txt"))["message_count"] == 2


def _size(n: int) -> bytes:
    return struct.pack(">i", n)


@with_options(max_msg_size=100, max_body_size=1000)
@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"", "BAD_BODY"),
        (b"\x00\x00", "BAD_BODY"),  # no message count
        (_size(0), "BAD_BODY"),
        (_size(-1), "BAD_BODY"),
        (_size(200), "BAD_BODY"),  # more than (max_body_size - 4) / 5 messages
        (_size(1), "BAD_MESSAGE"),  # no size
        (_size(1) + _size(0), "BAD_MESSAGE"),
        (_size(1) + _size(-3), "BAD_MESSAGE"),
        (_size(1) + _size(101) + b"x" * 101, "BAD_MESSAGE"),  # too big: not MSG_TOO_BIG
        (_size(2) + _size(1) + b"x" + _size(5) + b"abc", "BAD_MESSAGE"),  # truncated
    ],
)
async def test_mpub_binary_parse_errors_are_413_with_the_code_minus_e(nsqd, body, message):
    response = await call(nsqd, "POST", "/mpub", body, topic="t", binary="true")
    assert_error(response, 413, message)
    assert (await topic_stats(nsqd, "t"))["message_count"] == 0


async def test_mpub_binary_ignores_bytes_after_the_last_message(nsqd):
    body = encode_mpub_body([b"only"]) + b"trailing junk"
    assert_ok_text(await call(nsqd, "POST", "/mpub", body, topic="t", binary="true"))
    assert (await topic_stats(nsqd, "t"))["message_bytes"] == 4


@pytest.mark.parametrize(
    ("params", "message"),
    [({}, "MISSING_ARG_TOPIC"), ({"topic": "bad name"}, "INVALID_TOPIC")],
)
async def test_mpub_topic_errors(nsqd, params, message):
    assert_error(await call(nsqd, "POST", "/mpub", b"a\nb", **params), 400, message)


# -- /stats ------------------------------------------------------------------------------


async def _two_topics(nsqd) -> None:
    for topic, channel in [("a", "c1"), ("a", "c2"), ("b", "c1")]:
        await call(nsqd, "POST", "/topic/create", topic=topic)
        assert_empty_ok(await call(nsqd, "POST", "/channel/create", topic=topic, channel=channel))


def _names(document) -> dict:
    return {
        topic["topic_name"]: [channel["channel_name"] for channel in topic["channels"]]
        for topic in document["topics"]
    }


async def test_stats_topic_and_channel_filters(nsqd):
    await _two_topics(nsqd)
    address = nsqd.http_address
    assert _names(await raw_stats(address)) == {"a": ["c1", "c2"], "b": ["c1"]}
    assert _names(await raw_stats(address, topic="a")) == {"a": ["c1", "c2"]}
    assert _names(await raw_stats(address, topic="a", channel="c2")) == {"a": ["c2"]}
    assert _names(await raw_stats(address, channel="c1")) == {"a": ["c1"], "b": ["c1"]}
    # A topic without the channel is left out altogether.
    assert _names(await raw_stats(address, channel="c2")) == {"a": ["c2"]}
    assert (await raw_stats(address, topic="missing"))["topics"] is None
    assert (await raw_stats(address, topic="a", channel="missing"))["topics"] == []


async def test_stats_include_clients_false_gives_null_clients_and_producers(nsqd):
    wire = await consumer(nsqd, "t", "ch", rdy=1)
    producer = await Wire.connect(nsqd)
    await producer.send(encode_pub("t", b"x"))
    await producer.expect_ok()
    await receive_bodies(wire, 1)
    with_clients = await raw_stats(nsqd.http_address)
    channel = with_clients["topics"][0]["channels"][0]
    assert len(channel["clients"]) == 1 and len(with_clients["producers"]) == 1
    for value in ("false", "0"):
        document = await raw_stats(nsqd.http_address, include_clients=value)
        channel = document["topics"][0]["channels"][0]
        assert (channel["client_count"], channel["clients"]) == (1, None)
        assert document["producers"] is None
    # An unrecognised value keeps the default, true.
    document = await raw_stats(nsqd.http_address, include_clients="no")
    assert len(document["producers"]) == 1


async def test_stats_include_mem_false_leaves_the_memory_key_out(nsqd):
    keys = ["version", "health", "start_time", "topics", "memory", "producers"]
    assert list(await raw_stats(nsqd.http_address)) == keys
    for value in ("false", "0"):
        document = await raw_stats(nsqd.http_address, include_mem=value)
        assert list(document) == ["version", "health", "start_time", "topics", "producers"]
    assert list(await raw_stats(nsqd.http_address, include_mem="nope")) == keys
    text = (await call(nsqd, "GET", "/stats", include_mem="false")).text
    assert "Memory:" not in text and "\nHealth: OK\n\nTopics: None\n" in text


async def test_stats_text_is_the_default_format(nsqd):
    await _two_topics(nsqd)
    await call(nsqd, "POST", "/topic/pause", topic="b")
    response = await call(nsqd, "GET", "/stats")
    assert response.header("Content-Type") == TEXT_TYPE
    assert response.header("X-Nsq-Content-Type") == NSQ_V1
    lines = response.text.split("\n")
    assert lines[0].startswith("nsqd v1.3.0")
    assert "   [a              ] depth: 0     be-depth: 0     msgs: 0        e2e%: " in lines
    assert "*P [b              ] depth: 0     be-depth: 0     msgs: 0        e2e%: " in lines
    assert lines[-3:] == ["", "Producers: None", ""]


async def test_stats_bad_query_is_400_invalid_request(nsqd):
    response = await raw_request(nsqd.http_address, "GET", "/stats?format=json&topic=%zz")
    assert_error(response, 400, "INVALID_REQUEST")


async def test_stats_producers_have_pub_counts_per_topic(nsqd):
    await call(nsqd, "POST", "/topic/create", topic="t3")
    producer = await Wire.connect(nsqd)
    await producer.identify(client_id="prod", hostname="prod.local", user_agent="test/1.0")
    await producer.send(encode_pub("t1", b"a"), encode_pub("t1", b"b"))
    await producer.send(encode_mpub("t2", [b"1", b"2", b"3"]))
    for _ in range(3):
        await producer.expect_ok()
    (stats_of_producer,) = (await raw_stats(nsqd.http_address))["producers"]
    keys = list(stats_of_producer)
    assert keys[keys.index("user_agent") + 1] == "pub_counts"
    assert keys[keys.index("pub_counts") + 1] == "tls"
    assert stats_of_producer["client_id"] == "prod"
    assert stats_of_producer["hostname"] == "prod.local"
    assert stats_of_producer["state"] == 0  # never subscribed
    counts = sorted(stats_of_producer["pub_counts"], key=lambda count: count["topic"])
    assert counts == [{"topic": "t1", "count": 2}, {"topic": "t2", "count": 3}]
    # With a topic filter, only that topic's count; none at all leaves the key out.
    (filtered,) = (await raw_stats(nsqd.http_address, topic="t1"))["producers"]
    assert filtered["pub_counts"] == [{"topic": "t1", "count": 2}]
    (unrelated,) = (await raw_stats(nsqd.http_address, topic="t3"))["producers"]
    assert "pub_counts" not in unrelated


# -- topics and channels: the errors ---------------------------------------------------------


async def test_topic_create(nsqd):
    assert_empty_ok(await call(nsqd, "POST", "/topic/create", topic="made"))
    assert_empty_ok(await call(nsqd, "POST", "/topic/create", topic="made"))  # idempotent
    assert_empty_ok(await call(nsqd, "POST", "/topic/create", topic="made#ephemeral"))
    assert_error(await call(nsqd, "POST", "/topic/create"), 400, "MISSING_ARG_TOPIC")
    assert_error(await call(nsqd, "POST", "/topic/create", topic="b@d"), 400, "INVALID_TOPIC")
    assert _names(await raw_stats(nsqd.http_address)) == {"made": [], "made#ephemeral": []}


@pytest.mark.parametrize("action", ["delete", "pause", "unpause"])
async def test_topic_actions_check_only_that_the_topic_exists(nsqd, action):
    path = f"/topic/{action}"
    assert_error(await call(nsqd, "POST", path), 400, "MISSING_ARG_TOPIC")
    assert_error(await call(nsqd, "POST", path, topic="missing"), 404, "TOPIC_NOT_FOUND")
    # Go does not validate the name here: an invalid one is just not found.
    assert_error(await call(nsqd, "POST", path, topic="b@d"), 404, "TOPIC_NOT_FOUND")
    await call(nsqd, "POST", "/topic/create", topic="here")
    assert_empty_ok(await call(nsqd, "POST", path, topic="here"))


async def test_topic_empty_errors(nsqd):
    assert_error(await call(nsqd, "POST", "/topic/empty"), 400, "MISSING_ARG_TOPIC")
    assert_error(await call(nsqd, "POST", "/topic/empty", topic="b@d"), 400, "INVALID_TOPIC")
    assert_error(await call(nsqd, "POST", "/topic/empty", topic="missing"), 404, "TOPIC_NOT_FOUND")


CHANNEL_ACTIONS = ["create", "delete", "empty", "pause", "unpause"]


@pytest.mark.parametrize("action", CHANNEL_ACTIONS)
async def test_channel_action_errors(nsqd, action):
    path = f"/channel/{action}"
    await call(nsqd, "POST", "/topic/create", topic="t")
    cases = [
        ({}, 400, "MISSING_ARG_TOPIC"),
        ({"channel": "c"}, 400, "MISSING_ARG_TOPIC"),
        ({"topic": "b@d", "channel": "c"}, 400, "INVALID_ARG_TOPIC"),
        ({"topic": "", "channel": "c"}, 400, "INVALID_ARG_TOPIC"),
        ({"topic": "t"}, 400, "MISSING_ARG_CHANNEL"),
        ({"topic": "t", "channel": "b@d"}, 400, "INVALID_ARG_CHANNEL"),
        ({"topic": "missing", "channel": "c"}, 404, "TOPIC_NOT_FOUND"),
        # the channel name is checked before the topic's existence
        ({"topic": "missing", "channel": "b@d"}, 400, "INVALID_ARG_CHANNEL"),
    ]
    if action != "create":
        cases.append(({"topic": "t", "channel": "nope"}, 404, "CHANNEL_NOT_FOUND"))
    for params, status, message in cases:
        assert_error(await call(nsqd, "POST", path, **params), status, message)
    await call(nsqd, "POST", "/channel/create", topic="t", channel="c")
    assert_empty_ok(await call(nsqd, "POST", path, topic="t", channel="c"))


async def test_channel_create_needs_an_existing_topic_and_is_idempotent(nsqd):
    await call(nsqd, "POST", "/topic/create", topic="t")
    for _ in range(2):
        assert_empty_ok(await call(nsqd, "POST", "/channel/create", topic="t", channel="c"))
    await call(nsqd, "POST", "/channel/create", topic="t", channel="c#ephemeral")
    assert _names(await raw_stats(nsqd.http_address)) == {"t": ["c", "c#ephemeral"]}


# -- empty, delete, pause: what they do ------------------------------------------------------


@with_options(mem_queue_size=5)
async def test_channel_empty_drops_memory_disk_and_in_flight_messages(nsqd):
    await call(nsqd, "POST", "/topic/create", topic="full")
    await call(nsqd, "POST", "/channel/create", topic="full", channel="ch")
    bodies = b"\n".join(b"old-%d" % i for i in range(20))
    assert_ok_text(await call(nsqd, "POST", "/mpub", bodies, topic="full"))
    wire = await consumer(nsqd, "full", "ch", rdy=3)
    in_flight = await wire.read_messages(3)
    channel = await channel_stats(nsqd, "full", "ch")
    got = (channel["depth"], channel["backend_depth"], channel["in_flight_count"])
    assert got == (17, 15, 3)
    assert channel["clients"][0]["in_flight_count"] == 3

    assert_empty_ok(await call(nsqd, "POST", "/channel/empty", topic="full", channel="ch"))
    channel = await channel_stats(nsqd, "full", "ch")
    got = (channel["depth"], channel["backend_depth"], channel["in_flight_count"])
    assert got == (0, 0, 0)
    assert channel["clients"][0]["in_flight_count"] == 0
    # The emptied in-flight messages are gone: FIN fails, not fatally.
    await wire.finish(in_flight[0])
    expected = b"E_FIN_FAILED FIN " + in_flight[0].id + b" failed ID not in flight"
    await wire.expect_error(expected, fatal=False)
    # Only what is published afterwards is delivered; nothing of the backlog comes back.
    assert_ok_text(await call(nsqd, "POST", "/pub", b"new", topic="full"))
    assert await receive_bodies(wire, 1) == [b"new"]
    assert await nothing_delivered(wire)


@with_options(mem_queue_size=5)
async def test_topic_empty_drops_its_memory_and_disk_backlog(nsqd):
    bodies = b"\n".join(b"m%d" % i for i in range(20))
    assert_ok_text(await call(nsqd, "POST", "/mpub", bodies, topic="held"))
    topic = await topic_stats(nsqd, "held")
    assert (topic["depth"], topic["backend_depth"]) == (20, 15)
    assert_empty_ok(await call(nsqd, "POST", "/topic/empty", topic="held"))
    topic = await topic_stats(nsqd, "held")
    assert (topic["depth"], topic["backend_depth"], topic["message_count"]) == (0, 0, 20)
    wire = await consumer(nsqd, "held", "ch", rdy=5)
    assert_ok_text(await call(nsqd, "POST", "/pub", b"after", topic="held"))
    assert await receive_bodies(wire, 1) == [b"after"]


def _queue_files(data_path, prefix: str) -> list[str]:
    return sorted(
        name
        for name in os.listdir(data_path)
        if name.startswith((f"{prefix}.diskqueue", f"{prefix}:"))
    )


def _metadata(data_path) -> dict:
    with open(os.path.join(data_path, "nsqd.dat")) as file:
        return json.load(file)


def _metadata_topics(data_path) -> dict:
    try:
        document = _metadata(data_path)
    except FileNotFoundError:
        return {}
    return {
        topic["name"]: {
            "paused": topic["paused"],
            "channels": {c["name"]: c["paused"] for c in topic["channels"]},
        }
        for topic in document["topics"]
    }


@with_options(mem_queue_size=2)
async def test_topic_delete_removes_channels_diskqueue_files_and_metadata(nsqd, tmp_path):
    data_path = nsqd.options.data_path
    await call(nsqd, "POST", "/topic/create", topic="kept")
    await call(nsqd, "POST", "/topic/create", topic="doomed")
    for channel in ("c1", "c2"):
        await call(nsqd, "POST", "/channel/create", topic="doomed", channel=channel)
    wire = await consumer(nsqd, "doomed", "c1")
    bodies = b"\n".join(b"m%d" % i for i in range(10))
    await call(nsqd, "POST", "/mpub", bodies, topic="doomed")  # channels: 2 in memory, 8 on disk
    await call(nsqd, "POST", "/topic/pause", topic="doomed")
    await call(nsqd, "POST", "/mpub", bodies, topic="doomed")  # the topic: 2 + 8
    assert (await topic_stats(nsqd, "doomed"))["backend_depth"] == 8
    assert (await channel_stats(nsqd, "doomed", "c2"))["backend_depth"] == 8
    files = _queue_files(data_path, "doomed")
    assert any(name.startswith("doomed.diskqueue") for name in files), files
    assert any(name.startswith("doomed:c1.diskqueue") for name in files), files
    assert any(name.startswith("doomed:c2.diskqueue") for name in files), files
    await wait_until(lambda: set(_metadata_topics(data_path)) == {"kept", "doomed"})

    assert_empty_ok(await call(nsqd, "POST", "/topic/delete", topic="doomed"))
    assert _names(await raw_stats(nsqd.http_address)) == {"kept": []}
    assert (await raw_stats(nsqd.http_address, topic="doomed"))["topics"] is None
    assert _queue_files(data_path, "doomed") == []
    await wait_until(lambda: set(_metadata_topics(data_path)) == {"kept"})
    # Go closes the connections of the deleted channels' consumers.
    await wire.expect_closed()
    assert_error(await call(nsqd, "POST", "/topic/delete", topic="doomed"), 404, "TOPIC_NOT_FOUND")


@with_options(mem_queue_size=2)
async def test_channel_delete_removes_its_diskqueue_files(nsqd):
    data_path = nsqd.options.data_path
    await call(nsqd, "POST", "/topic/create", topic="t")
    for channel in ("gone", "stays"):
        await call(nsqd, "POST", "/channel/create", topic="t", channel=channel)
    await call(nsqd, "POST", "/mpub", b"1\n2\n3\n4\n5", topic="t")
    assert _queue_files(data_path, "t:gone")
    assert_empty_ok(await call(nsqd, "POST", "/channel/delete", topic="t", channel="gone"))
    assert _queue_files(data_path, "t:gone") == []
    assert _queue_files(data_path, "t:stays")
    assert _names(await raw_stats(nsqd.http_address)) == {"t": ["stays"]}
    await wait_until(
        lambda: _metadata_topics(data_path).get("t", {}).get("channels") == {"stays": False}
    )


async def test_paused_channel_delivers_nothing_until_unpaused(nsqd):
    await call(nsqd, "POST", "/topic/create", topic="t")
    await call(nsqd, "POST", "/channel/create", topic="t", channel="paused")
    assert_empty_ok(await call(nsqd, "POST", "/channel/pause", topic="t", channel="paused"))
    paused = await consumer(nsqd, "t", "paused", rdy=10)
    control = await consumer(nsqd, "t", "control", rdy=10)
    await call(nsqd, "POST", "/mpub", b"1\n2", topic="t")
    # The unpaused channel got both: the fan-out happened; the paused one holds them.
    assert await receive_bodies(control, 2) == [b"1", b"2"]
    assert await nothing_delivered(paused)
    channel = await channel_stats(nsqd, "t", "paused")
    assert (channel["paused"], channel["depth"], channel["in_flight_count"]) == (True, 2, 0)

    assert_empty_ok(await call(nsqd, "POST", "/channel/unpause", topic="t", channel="paused"))
    assert await receive_bodies(paused, 2) == [b"1", b"2"]
    assert (await channel_stats(nsqd, "t", "paused"))["paused"] is False


async def test_paused_topic_fans_out_nothing_until_unpaused(nsqd):
    wire = await consumer(nsqd, "t", "ch", rdy=10)
    assert_empty_ok(await call(nsqd, "POST", "/topic/pause", topic="t"))
    await call(nsqd, "POST", "/mpub", b"1\n2\n3", topic="t")
    topic = await topic_stats(nsqd, "t")
    assert (topic["paused"], topic["depth"], topic["message_count"]) == (True, 3, 3)
    assert await nothing_delivered(wire)
    channel = topic["channels"][0]
    assert (channel["depth"], channel["message_count"]) == (0, 0)

    assert_empty_ok(await call(nsqd, "POST", "/topic/unpause", topic="t"))
    assert await receive_bodies(wire, 3) == [b"1", b"2", b"3"]
    topic = await topic_stats(nsqd, "t")
    assert (topic["paused"], topic["depth"], topic["channels"][0]["message_count"]) == (False, 0, 3)


async def test_pause_flags_are_in_nsqd_dat_when_the_reply_comes(nsqd):
    """Go's pause handlers persist the metadata under the nsqd lock before replying, and every
    other persist encodes the state of its own moment: the file never goes back in time."""
    data_path = nsqd.options.data_path
    await call(nsqd, "POST", "/topic/create", topic="t")
    await call(nsqd, "POST", "/channel/create", topic="t", channel="c")
    for _ in range(5):
        await call(nsqd, "POST", "/topic/pause", topic="t")
        assert _metadata_topics(data_path)["t"] == {"paused": True, "channels": {"c": False}}
        await call(nsqd, "POST", "/channel/pause", topic="t", channel="c")
        assert _metadata_topics(data_path)["t"] == {"paused": True, "channels": {"c": True}}
        await call(nsqd, "POST", "/topic/unpause", topic="t")
        assert _metadata_topics(data_path)["t"] == {"paused": False, "channels": {"c": True}}
        await call(nsqd, "POST", "/channel/unpause", topic="t", channel="c")
        assert _metadata_topics(data_path)["t"] == {"paused": False, "channels": {"c": False}}
    assert list(_metadata(data_path)) == ["topics", "version"]


# -- e2e processing latency ------------------------------------------------------------------


@with_options(e2e_processing_latency_percentile=[0.99, 0.5])
async def test_e2e_latency_percentiles_after_fin(nsqd):
    wire = await consumer(nsqd, "lat", "ch", rdy=50)
    await call(nsqd, "POST", "/topic/create", topic="lat")
    topic = await topic_stats(nsqd, "lat")
    empty = {
        "count": 0,
        "percentiles": [{"quantile": 0.99, "value": 0}, {"quantile": 0.5, "value": 0}],
    }
    assert topic["e2e_processing_latency"] == empty
    await call(nsqd, "POST", "/mpub", b"\n".join(b"m%d" % i for i in range(20)), topic="lat")
    await receive_bodies(wire, 20)
    channel_state = nsqd.topics["lat"].channels["ch"]
    await wait_until(lambda: len(channel_state.in_flight) == 0)
    topic = await topic_stats(nsqd, "lat")
    for latency in (
        topic["e2e_processing_latency"],
        topic["channels"][0]["e2e_processing_latency"],
    ):
        assert list(latency) == ["count", "percentiles"]
        assert latency["count"] == 20
        assert [list(p) for p in latency["percentiles"]] == [["quantile", "value"]] * 2
        assert [p["quantile"] for p in latency["percentiles"]] == [0.99, 0.5]
        p99, p50 = (p["value"] for p in latency["percentiles"])
        assert isinstance(p99, int | float) and 0 < p50 <= p99 < 10_000_000_000  # ns
    text = (await call(nsqd, "GET", "/stats", topic="lat")).text
    assert "e2e%: " in text and text.count("e2e%: \n") == 0


@with_options(e2e_processing_latency_percentile=[0.99, 0.5])
async def test_e2e_latency_of_a_topic_without_channels_is_count_0_and_null(nsqd):
    """Go merges the channels' streams; with no channel there is no stream: Result{}."""
    await call(nsqd, "POST", "/topic/create", topic="alone")
    topic = await topic_stats(nsqd, "alone")
    assert topic["e2e_processing_latency"] == {"count": 0, "percentiles": None}


async def test_e2e_latency_without_percentiles_is_count_0_and_null(nsqd):
    wire = await consumer(nsqd, "lat", "ch", rdy=5)
    await call(nsqd, "POST", "/pub", b"x", topic="lat")
    await receive_bodies(wire, 1)
    topic = await topic_stats(nsqd, "lat")
    none = {"count": 0, "percentiles": None}
    assert topic["e2e_processing_latency"] == none
    assert topic["channels"][0]["e2e_processing_latency"] == none


# -- /config ---------------------------------------------------------------------------------


async def test_config_get(nsqd):
    for name, value in [
        ("nsqlookupd_tcp_addresses", []),
        ("log_level", 2),  # lg.LogLevel marshals as its number: INFO
        ("mem_queue_size", 10000),
        ("msg_timeout", 60_000_000_000),
    ]:
        response = await call(nsqd, "GET", f"/config/{name}")
        assert (response.status, response.json()) == (200, value), name
        assert response.header("Content-Type") == JSON_TYPE
    # RespondV1 writes a string value as it is, as text: not JSON.
    assert_ok_text(await call(nsqd, "GET", "/config/broadcast_address"), b"127.0.0.1")
    assert_error(await call(nsqd, "GET", "/config/no_such_option"), 400, "INVALID_OPTION")


async def test_config_put_nsqlookupd_tcp_addresses(nsqd):
    closed_port = "127.0.0.1:9"  # discard: nothing listens there
    response = await call(
        nsqd, "PUT", "/config/nsqlookupd_tcp_addresses", json.dumps([closed_port])
    )
    assert (response.status, response.json()) == (200, [closed_port])
    assert (await call(nsqd, "GET", "/config/nsqlookupd_tcp_addresses")).json() == [closed_port]
    for bad in (b"not json", b'"a string"', b"[1, 2]", b"{}"):
        response = await call(nsqd, "PUT", "/config/nsqlookupd_tcp_addresses", bad)
        assert_error(response, 400, "INVALID_VALUE")
    response = await call(nsqd, "PUT", "/config/nsqlookupd_tcp_addresses", b"[]")
    assert (response.status, response.json()) == (200, [])


async def test_config_put_null_lookupd_addresses_is_go_nil(nsqd):
    """json.Unmarshal of `null` into a []string leaves nil, which marshals back as null."""
    response = await call(nsqd, "PUT", "/config/nsqlookupd_tcp_addresses", b"null")
    assert (response.status, response.body) == (200, b"null")


async def test_config_put_log_level(nsqd):
    for text, number in [("debug", 1), ("WARN", 3), ("Error", 4), ("info", 2)]:
        response = await call(nsqd, "PUT", "/config/log_level", text)
        assert (response.status, response.json()) == (200, number), text
    assert (await call(nsqd, "GET", "/config/log_level")).json() == 2
    # lg.ParseLogLevel knows debug, info, warn, error and fatal, any case; not "warning".
    for bad in ("verbose", "warning", "2"):
        assert_error(await call(nsqd, "PUT", "/config/log_level", bad), 400, "INVALID_VALUE")


@with_options(max_msg_size=64)
async def test_config_put_errors(nsqd):
    assert_error(await call(nsqd, "PUT", "/config/log_level", b""), 413, "INVALID_VALUE")
    assert_error(await call(nsqd, "PUT", "/config/log_level", b"d" * 65), 413, "INVALID_VALUE")
    # The body is checked before the option name.
    assert_error(await call(nsqd, "PUT", "/config/no_such_option", b""), 413, "INVALID_VALUE")
    response = await call(nsqd, "PUT", "/config/mem_queue_size", b"5")
    assert_error(response, 400, "INVALID_OPTION")
    assert (await call(nsqd, "GET", "/config/mem_queue_size")).json() == 10000


# -- routing: 404, 405, OPTIONS --------------------------------------------------------------


async def test_unknown_path_is_404_not_found(nsqd):
    for method, path in [("GET", "/nope"), ("POST", "/nope"), ("GET", "/topic"), ("GET", "/")]:
        assert_error(await call(nsqd, method, path), 404, "NOT_FOUND")


@pytest.mark.parametrize(
    ("method", "path", "allow"),
    [
        ("GET", "/pub", "OPTIONS, POST"),
        ("PUT", "/mpub", "OPTIONS, POST"),
        ("POST", "/ping", "GET, OPTIONS"),
        ("POST", "/stats", "GET, OPTIONS"),
        ("GET", "/topic/create", "OPTIONS, POST"),
        ("DELETE", "/channel/delete", "OPTIONS, POST"),
        ("POST", "/config/log_level", "GET, OPTIONS, PUT"),
    ],
)
async def test_wrong_method_is_405_with_allow(nsqd, method, path, allow):
    response = await call(nsqd, method, path)
    assert_error(response, 405, "METHOD_NOT_ALLOWED")
    assert response.status_line == "HTTP/1.1 405 Method Not Allowed"
    assert response.header("Allow") == allow


async def test_options_lists_the_allowed_methods(nsqd):
    response = await call(nsqd, "OPTIONS", "/pub")
    assert (response.status, response.body, response.header("Allow")) == (200, b"", "OPTIONS, POST")


# -- connections -----------------------------------------------------------------------------


async def test_keep_alive_serves_several_requests_on_one_connection(nsqd):
    connection = await RawConnection.open(nsqd.http_address)
    try:
        assert (await connection.request("GET", "/ping")).body == b"OK"
        assert (await connection.request("GET", "/info")).status == 200
        for i in range(3):
            assert_ok_text(await connection.request("POST", "/pub?topic=ka", b"m%d" % i))
        assert_error(await connection.request("GET", "/nope"), 404, "NOT_FOUND")
        assert_error(await connection.request("GET", "/pub"), 405, "METHOD_NOT_ALLOWED")
        response = await connection.request("GET", "/stats?format=json&topic=ka")
        assert response.json()["topics"][0]["message_count"] == 3
        assert response.header("Connection") is None
    finally:
        await connection.aclose()


async def test_pipelined_requests_are_answered_in_order(nsqd):
    connection = await RawConnection.open(nsqd.http_address)
    try:
        requests = [
            encode_request("POST", "/pub?topic=pipe", b"first"),
            encode_request("POST", "/pub?topic=bad!", b"x"),
            encode_request("POST", "/mpub?topic=pipe", b"second\nthird"),
            encode_request("GET", "/stats?format=json&topic=pipe&include_mem=false"),
            encode_request("GET", "/ping"),
        ]
        await connection.send(b"".join(requests))
        assert_ok_text(await connection.read_response())
        assert_error(await connection.read_response(), 400, "INVALID_TOPIC")
        assert_ok_text(await connection.read_response())
        assert (await connection.read_response()).json()["topics"][0]["message_count"] == 3
        assert (await connection.read_response()).body == b"OK"
        # A request that arrives a few bytes at a time is answered once it is complete.
        for byte in encode_request("POST", "/pub?topic=pipe", b"slow"):
            await connection.send(bytes([byte]))
        assert_ok_text(await connection.read_response())
    finally:
        await connection.aclose()
    wire = await consumer(nsqd, "pipe", "ch", rdy=10)
    assert await receive_bodies(wire, 4) == [b"first", b"second", b"third", b"slow"]


@with_options(mem_queue_size=0)
async def test_a_request_after_pipelined_publishes_sees_them_on_disk(nsqd):
    """Publishes that overflow to disk are written when the poller's pass ends; a request
    that reads or changes the queue in the same pass has them written first."""
    connection = await RawConnection.open(nsqd.http_address)
    stats = "/stats?format=json&topic=disk&include_mem=false"
    try:
        requests = [
            *(encode_request("POST", "/pub?topic=disk", b"m%d" % i) for i in range(3)),
            encode_request("GET", stats),
            encode_request("POST", "/topic/empty?topic=disk"),
            encode_request("POST", "/pub?topic=disk", b"last"),
            encode_request("GET", stats),
        ]
        await connection.send(b"".join(requests))
        for _ in range(3):
            assert_ok_text(await connection.read_response())
        (topic,) = (await connection.read_response()).json()["topics"]
        assert (topic["depth"], topic["backend_depth"]) == (3, 3)
        assert (await connection.read_response()).status == 200
        assert_ok_text(await connection.read_response())
        (topic,) = (await connection.read_response()).json()["topics"]
        assert (topic["depth"], topic["backend_depth"]) == (1, 1)
    finally:
        await connection.aclose()
    wire = await consumer(nsqd, "disk", "ch", rdy=10)
    assert await receive_bodies(wire, 1) == [b"last"]


@pytest.mark.parametrize(
    "garbage",
    [
        b"THIS IS NOT HTTP\r\n\r\n",
        b"GET /ping HTTP/1.1\r\nHost: x\r\nno colon here\r\n\r\n",
        b"POST /pub?topic=t HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n",
        b"GET /ping HTTP/9.9\r\n\r\n",
    ],
)
async def test_malformed_request_is_400_and_the_server_serves_others(nsqd, garbage):
    bystander = await RawConnection.open(nsqd.http_address)
    assert (await bystander.request("GET", "/ping")).body == b"OK"
    connection = await RawConnection.open(nsqd.http_address)
    try:
        await connection.send(garbage)
        response = await connection.read_response()
        assert response.status_line == "HTTP/1.1 400 Bad Request"
        assert await connection.closed_by_peer()
    finally:
        await connection.aclose()
    # The open keep-alive connection and new ones are served as before.
    assert (await bystander.request("GET", "/ping")).body == b"OK"
    await bystander.aclose()
    assert_ok_text(await call(nsqd, "POST", "/pub", b"still here", topic="t"))


async def test_oversized_content_length_is_refused_before_the_body_arrives(nsqd):
    """Go's doPUB answers 413 from the Content-Length header, without reading the body."""
    connection = await RawConnection.open(nsqd.http_address)
    try:
        head = encode_request("POST", "/pub?topic=t", b"")
        head = head.replace(b"Content-Length: 0", b"Content-Length: 10000000000")
        await connection.send(head + b"x" * 1024)
        response = await connection.read_response(timeout=2)
        assert_error(response, 413, "MSG_TOO_BIG")
    finally:
        await connection.aclose()


def _resident_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise AssertionError("no VmRSS")


def test_oversized_content_length_does_not_make_nsqd_buffer_the_body(tmp_path):
    """A client that declares 1 GB and streams 96 MB: nsqd's memory stays flat, and it keeps
    serving other connections meanwhile (a separate process, so its memory can be measured)."""
    daemon = start_nsqd(tmp_path, "-max-msg-size=1024")
    try:
        port = daemon.port("HTTP")
        before = _resident_kib(daemon.process.pid)
        sender = socket.create_connection(("127.0.0.1", port), timeout=10)
        head = encode_request("POST", "/pub?topic=big", b"")
        sender.sendall(head.replace(b"Content-Length: 0", b"Content-Length: 1000000000"))
        chunk = b"x" * (1024 * 1024)
        try:
            for _ in range(96):
                sender.sendall(chunk)
        except (BrokenPipeError, ConnectionResetError):
            pass  # Go answers 413 at once and closes: nothing more is read either way
        growth_mib = (_resident_kib(daemon.process.pid) - before) / 1024
        assert growth_mib < 32, f"nsqd grew by {growth_mib:.0f} MiB"
        with socket.create_connection(("127.0.0.1", port), timeout=10) as other:
            other.sendall(encode_request("GET", "/ping"))
            assert other.recv(4096).startswith(b"HTTP/1.1 200 OK")
        sender.close()
    finally:
        assert daemon.stop() == 0, daemon.log
