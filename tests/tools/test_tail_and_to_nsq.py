"""nsq_tail and to_nsq against a real nsqd and nsqlookupd (subprocesses, ephemeral ports)."""

import re
import subprocess

from nsqpy.client.blocking import Consumer, Producer, http_json, http_request
from tests.support.polling import poll
from tests.support.stats import topic_channels
from tests.tools.support import lookupd_has_topic, run_tool, start_tool, stop_tool


def test_to_nsq_publishes_each_line(nsqd, topic):
    tcp = nsqd.addresses["TCP"]
    result = run_tool(
        "to_nsq", f"--topic={topic}", f"--nsqd-tcp-address={tcp}", stdin=b"one\ntwo\n\nthree"
    )
    assert result.returncode == 0, result.stderr.decode()
    # stderr is a pipe, not a terminal: no progress line.
    assert b"msgs/s" not in result.stderr
    with Consumer(tcp, topic, "check") as consumer:
        bodies = [consumer.receive(timeout=5).body for _ in range(3)]
    assert bodies == [b"one", b"two", b"three"]


def test_to_nsq_delimiter_and_rate(nsqd, topic):
    tcp = nsqd.addresses["TCP"]
    result = run_tool(
        "to_nsq",
        "-topic",
        topic,
        "-nsqd-tcp-address",
        tcp,
        "--delimiter=,",
        "--rate=1000",
        stdin=b"a,b,c",
    )
    assert result.returncode == 0, result.stderr.decode()
    with Consumer(tcp, topic, "check") as consumer:
        assert [consumer.receive(timeout=5).body for _ in range(3)] == [b"a", b"b", b"c"]


def test_to_nsq_requires_topic():
    result = run_tool("to_nsq", "--nsqd-tcp-address=127.0.0.1:1")
    assert result.returncode == 1
    assert b"--topic required" in result.stderr


def test_nsq_tail_prints_n_messages_through_an_ephemeral_channel(nsqd, topic):
    tcp = nsqd.addresses["TCP"]
    with Producer(tcp) as producer:
        producer.multi_publish(topic, [b"m%d" % i for i in range(5)])
    result = run_tool("nsq_tail", f"--topic={topic}", f"--nsqd-tcp-address={tcp}", "-n", "3")
    assert result.returncode == 0, result.stderr.decode()
    assert result.stdout == b"m0\nm1\nm2\n"
    # The ephemeral channel disappears with its last client.
    poll(lambda: not topic_channels(nsqd, topic))


def test_nsq_tail_via_lookupd_with_print_topic_stops_on_sigterm(nsqd, lookupd, topic):
    tcp = nsqd.addresses["TCP"]
    http_request(nsqd.addresses["HTTP"], "/topic/create", method="POST", topic=topic)
    poll(lambda: lookupd_has_topic(lookupd, topic))
    tail = start_tool(
        "nsq_tail",
        f"--topic={topic}",
        f"--lookupd-http-address={lookupd.addresses['HTTP']}",
        "--print-topic",
        "--channel=tailer",
    )
    poll(
        lambda: any(
            c["channel_name"] == "tailer" and c["clients"] for c in topic_channels(nsqd, topic)
        )
    )
    with Producer(tcp) as producer:
        producer.publish(topic, b"hello")
    poll(
        lambda: any(
            c["message_count"] == 1 and c["depth"] == 0 and c["in_flight_count"] == 0
            for c in topic_channels(nsqd, topic)
        )
    )
    out, _err = stop_tool(tail)
    assert out == f"{topic} | hello\n".encode()


def test_nsq_tail_version():
    result = run_tool("nsq_tail", "--version")
    assert result.returncode == 0
    assert re.match(rb"nsq_tail v\d+\.\d+\.\d+", result.stdout)


def test_to_nsq_stops_cleanly_on_sigterm_while_reading(nsqd, topic):
    tcp = nsqd.addresses["TCP"]
    tool = start_tool(
        "to_nsq", f"--topic={topic}", f"--nsqd-tcp-address={tcp}", stdin=subprocess.PIPE
    )
    tool.stdin.write(b"first\n")
    tool.stdin.flush()

    def published():
        stats = http_json(nsqd.addresses["HTTP"], "/stats", format="json", topic=topic)
        return any(t["message_count"] == 1 for t in stats.get("topics") or [])

    poll(published)
    stop_tool(tool)


# -- Youzan ext topics --------------------------------------------------------------------------


def _create_ext_topic(nsqd, topic: str) -> None:
    http_request(
        nsqd.addresses["HTTP"],
        "/topic/create",
        method="POST",
        topic=topic,
        partition_num="1",
        ext="true",
    )
    # The channels exist before publishing: a log topic's new channel starts at its end.
    for channel in ("tags", "blue"):
        http_request(
            nsqd.addresses["HTTP"],
            "/channel/create",
            method="POST",
            topic=topic,
            channel=channel,
            partition="0",
        )


def test_to_nsq_sets_and_nsq_tail_shows_ext_headers_and_tags(nsqd, topic):
    """to_nsq --ext-header publishes with a JSON header (PUB_EXT); nsq_tail --ext prints it,
    and --desired-tag receives only its tag's messages, as a tag-dispatched consumer; an
    untagged one gets every message of a tag no consumer of its channel has."""
    tcp = nsqd.addresses["TCP"]
    _create_ext_topic(nsqd, topic)
    for header, stdin in (
        ('{"##client_dispatch_tag":"blue","k":"v"}', b"b1\nb2\n"),
        ('{"k":"plain"}', b"u1\n"),
    ):
        result = run_tool(
            "to_nsq",
            f"--topic={topic}",
            f"--nsqd-tcp-address={tcp}",
            f"--ext-header={header}",
            stdin=stdin,
        )
        assert result.returncode == 0, result.stderr.decode()
    blue = run_tool(
        "nsq_tail",
        f"--topic={topic}",
        f"--nsqd-tcp-address={tcp}",
        "--channel=blue",
        "--desired-tag=blue",
        "-n",
        "2",
    )
    assert blue.returncode == 0, blue.stderr.decode()
    assert blue.stdout == (
        b'{"##client_dispatch_tag":"blue","k":"v"} | b1\n'
        b'{"##client_dispatch_tag":"blue","k":"v"} | b2\n'
    )
    plain = run_tool(
        "nsq_tail",
        f"--topic={topic}",
        f"--nsqd-tcp-address={tcp}",
        "--channel=tags",
        "--ext",
        "-n",
        "3",
    )
    assert plain.returncode == 0, plain.stderr.decode()
    # No consumer of channel `tags` has the tag blue: its messages fall through to the
    # untagged consumer, in log order, as Youzan's messagePump sends them.
    assert plain.stdout == (
        b'{"##client_dispatch_tag":"blue","k":"v"} | b1\n'
        b'{"##client_dispatch_tag":"blue","k":"v"} | b2\n'
        b'{"k":"plain"} | u1\n'
    )


def test_to_nsq_refuses_an_ext_header_that_is_not_a_json_object():
    for header in ("{nope", "[1]"):
        result = run_tool(
            "to_nsq", "--topic=t", "--nsqd-tcp-address=127.0.0.1:1", f"--ext-header={header}"
        )
        assert result.returncode == 1
        assert b"--ext-header" in result.stderr
