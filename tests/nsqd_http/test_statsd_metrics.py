"""nsqd's metrics: statsd lines pushed over UDP (Go nsqd's statsd.go) and `GET /metrics`.

statsd: the test binds a UDP socket and starts nsqd with `statsd_address` pointing at it and a
0.2 s `statsd_interval`; it reads the pushes (each ends with `mem.gc_runs`, the last metric Go
sends) and checks Go's metric names, their order, the values, the `nsq.<host key>.` prefix,
the packet size limit and `statsd_exclude_ephemeral`.

/metrics: the Prometheus text exposition is parsed by the real parser of `prometheus_client`,
and the topic and channel families must carry what `/stats` says.
"""

import socket

import pytest
import trio
from prometheus_client.parser import text_string_to_metric_families

from nsqpy.nsqd.server import NSQD
from tests.nsqd.wire import consumer, with_options
from tests.support.http import raw_request, target
from tests.support.stats import raw_stats

PUSH_TIMEOUT = 10.0
INTERVAL = 0.2


async def call(nsqd, method: str, path: str, body=None, **params):
    response = await raw_request(nsqd.http_address, method, target(path, **params), body)
    assert response.status == 200, response
    return response


# -- statsd ------------------------------------------------------------------------------------


@pytest.fixture
async def statsd_socket():
    sock = trio.socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    await sock.bind(("127.0.0.1", 0))
    yield sock
    sock.close()


@pytest.fixture
async def statsd_nsqd(nsqd_options, statsd_socket, nursery) -> NSQD:
    host, port = statsd_socket.getsockname()
    options = nsqd_options.replace(statsd_address=f"{host}:{port}", statsd_interval=INTERVAL)
    server = NSQD(options)
    await nursery.start(server.serve)
    yield server
    server.shutdown()


class Push:
    """One statsd push: its packets, and its lines as (name, value, type) in order."""

    def __init__(self) -> None:
        self.packets: list[bytes] = []
        self.lines: list[str] = []

    def metrics(self, prefix: str) -> list[tuple[str, int, str]]:
        found = []
        for line in self.lines:
            assert line.startswith(prefix), f"{line!r} lacks the prefix {prefix!r}"
            name, _, rest = line[len(prefix) :].rpartition(":")
            value, _, kind = rest.partition("|")
            found.append((name, int(value), kind))
        return found


async def next_push(sock) -> Push:
    """The packets up to the end of the next push (the line of `mem.gc_runs`)."""
    push = Push()
    with trio.fail_after(PUSH_TIMEOUT):
        while True:
            packet = await sock.recv(65536)
            push.packets.append(packet)
            assert packet.endswith(b"\n"), f"a packet ends inside a line: {packet!r}"
            push.lines.extend(packet.decode().splitlines())
            if ".mem.gc_runs:" in push.lines[-1]:
                return push


def prefix_of(nsqd) -> str:
    """Go's default prefix `nsq.%s`: the host key is `<broadcast address>:<http port>` with
    dots and colons turned into underscores, and a dot is appended."""
    port = nsqd.http_address.rsplit(":", 1)[1]
    return f"nsq.127_0_0_1_{port}."


TOPIC_METRICS = [
    ("message_count", "c"),
    ("message_bytes", "c"),
    ("depth", "g"),
    ("backend_depth", "g"),
]
CHANNEL_METRICS = [
    ("message_count", "c"),
    ("depth", "g"),
    ("backend_depth", "g"),
    ("in_flight_count", "g"),
    ("deferred_count", "g"),
    ("requeue_count", "c"),
    ("timeout_count", "c"),
    ("clients", "g"),
]
MEM_METRICS = [
    ("mem.heap_objects", "g"),
    ("mem.heap_idle_bytes", "g"),
    ("mem.heap_in_use_bytes", "g"),
    ("mem.heap_released_bytes", "g"),
    ("mem.gc_pause_usec_100", "g"),
    ("mem.gc_pause_usec_99", "g"),
    ("mem.gc_pause_usec_95", "g"),
    ("mem.next_gc_bytes", "g"),
    ("mem.gc_runs", "c"),
]


@with_options(statsd_udp_packet_size=200)
async def test_statsd_pushes_go_metric_lines(statsd_nsqd, statsd_socket):
    nsqd = statsd_nsqd
    prefix = prefix_of(nsqd)
    await call(nsqd, "POST", "/topic/create", topic="t")
    await call(nsqd, "POST", "/channel/create", topic="t", channel="ch")
    await call(nsqd, "POST", "/mpub", b"one\ntwo\nthree\nfour\nfive", topic="t")
    deferred = await call(nsqd, "POST", "/pub", b"later", topic="t", defer="60000")
    assert deferred.body == b"OK"

    counted: dict[str, int] = {}
    while True:
        push = await next_push(statsd_socket)
        metrics = push.metrics(prefix)
        for name, value, kind in metrics:
            if kind == "c":
                counted[name] = counted.get(name, 0) + value
        gauges = {name: value for name, value, kind in metrics if kind == "g"}
        if gauges.get("topic.t.channel.ch.deferred_count") == 1:
            break

    # Go's names, types and order: the topic, each channel, then the memory figures.
    expected_order = [(f"topic.t.{name}", kind) for name, kind in TOPIC_METRICS]
    expected_order += [(f"topic.t.channel.ch.{name}", kind) for name, kind in CHANNEL_METRICS]
    expected_order += MEM_METRICS
    assert [(name, kind) for name, _value, kind in metrics] == expected_order
    # Counters are differences between pushes: summed, they are the totals.
    assert counted["topic.t.message_count"] == 6
    assert counted["topic.t.message_bytes"] == len("onetwothreefourfivelater")
    assert counted["topic.t.channel.ch.message_count"] == 6
    assert counted["topic.t.channel.ch.requeue_count"] == 0
    assert counted["topic.t.channel.ch.timeout_count"] == 0
    assert gauges["topic.t.depth"] == 0
    assert gauges["topic.t.backend_depth"] == 0
    assert gauges["topic.t.channel.ch.depth"] == 5
    assert gauges["topic.t.channel.ch.in_flight_count"] == 0
    assert gauges["topic.t.channel.ch.clients"] == 0
    assert gauges["mem.heap_objects"] > 0
    # Whole lines, in packets no larger than statsd_udp_packet_size.
    assert len(push.packets) > 1
    assert max(len(packet) for packet in push.packets) <= 200

    # The next push counts only what happened since: nothing.
    later = {name: value for name, value, kind in (await next_push(statsd_socket)).metrics(prefix)}
    assert later["topic.t.message_count"] == 0
    assert later["topic.t.channel.ch.depth"] == 5


@pytest.mark.parametrize(
    "nsqd_options",
    [{"statsd_exclude_ephemeral": True}, {"statsd_exclude_ephemeral": False}],
    indirect=True,
    ids=["exclude", "include"],
)
async def test_statsd_exclude_ephemeral(statsd_nsqd, statsd_socket):
    nsqd = statsd_nsqd
    exclude = nsqd.options.statsd_exclude_ephemeral
    await call(nsqd, "POST", "/topic/create", topic="eph#ephemeral")
    await call(nsqd, "POST", "/topic/create", topic="t")
    for channel in ("ch", "ch#ephemeral"):
        await call(nsqd, "POST", "/channel/create", topic="t", channel=channel)
    while True:
        names = [name for name, _, _ in (await next_push(statsd_socket)).metrics(prefix_of(nsqd))]
        if "topic.t.channel.ch.depth" in names:
            break
    ephemeral = sorted({name.rsplit(".", 1)[0] for name in names if "#ephemeral" in name})
    if exclude:
        assert ephemeral == []
    else:
        assert ephemeral == ["topic.eph#ephemeral", "topic.t.channel.ch#ephemeral"]


@with_options(statsd_prefix="svc.%s.nsqd")
async def test_statsd_custom_prefix_gets_the_host_key_and_a_dot(statsd_nsqd, statsd_socket):
    port = statsd_nsqd.http_address.rsplit(":", 1)[1]
    push = await next_push(statsd_socket)
    assert push.lines[-1].startswith(f"svc.127_0_0_1_{port}.nsqd.mem.gc_runs:")


# -- /metrics ----------------------------------------------------------------------------------


def samples_of(text: str) -> dict:
    """{(sample name, ((label, value), ...)): value} from the real Prometheus parser."""
    found = {}
    for family in text_string_to_metric_families(text):
        assert family.documentation, f"{family.name} has no HELP"
        assert family.type in ("gauge", "counter"), family
        for sample in family.samples:
            found[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return found


async def test_metrics_parse_and_carry_the_stats(nsqd):
    wire = await consumer(nsqd, "t", "ch", rdy=1)
    await call(nsqd, "POST", "/mpub", b"a\nbb\nccc", topic="t")
    (message,) = await wire.read_messages(1)
    await call(nsqd, "POST", "/topic/create", topic="p")
    await call(nsqd, "POST", "/topic/pause", topic="p")
    topic = (await raw_stats(nsqd.http_address, topic="t"))["topics"][0]
    channel = topic["channels"][0]
    assert (channel["depth"], channel["in_flight_count"]) == (2, 1)

    response = await call(nsqd, "GET", "/metrics")
    assert response.header("Content-Type") == "text/plain; version=0.0.4; charset=utf-8"
    samples = samples_of(response.text)
    t = (("topic", "t"),)
    t_ch = (("channel", "ch"), ("topic", "t"))
    expected = {
        ("nsq_up", ()): 1,
        ("nsq_topic_depth", t): topic["depth"],
        ("nsq_topic_backend_depth", t): 0,
        ("nsq_topic_messages_total", t): 3,
        ("nsq_topic_message_bytes_total", t): 6,
        ("nsq_topic_paused", t): 0,
        ("nsq_topic_paused", (("topic", "p"),)): 1,
        ("nsq_channel_depth", t_ch): 2,
        ("nsq_channel_backend_depth", t_ch): 0,
        ("nsq_channel_in_flight", t_ch): 1,
        ("nsq_channel_deferred", t_ch): 0,
        ("nsq_channel_messages_total", t_ch): 3,
        ("nsq_channel_requeues_total", t_ch): 0,
        ("nsq_channel_timeouts_total", t_ch): 0,
        ("nsq_channel_clients", t_ch): 1,
        ("nsq_channel_paused", t_ch): 0,
    }
    assert {key: samples.get(key) for key in expected} == expected
    client_samples = {
        key: value for key, value in samples.items() if key[0] == "nsq_client_in_flight"
    }
    assert list(client_samples.values()) == [1]

    await wire.finish(message)
    await wire.read_messages(1)
    samples = samples_of((await call(nsqd, "GET", "/metrics")).text)
    assert samples[("nsq_channel_depth", t_ch)] == 1
    assert samples[("nsq_topic_messages_total", t)] == 3


async def test_metrics_give_each_partition_of_a_log_topic_its_own_series(nsqd):
    """Two partitions of one topic on one nsqd are two series (a `partition` label), never the
    same labels twice, which Prometheus would refuse; a log topic adds its log's positions and
    each channel's confirmed offset and lag."""
    await call(nsqd, "POST", "/topic/create", topic="lt", partition_num="2")
    await call(nsqd, "POST", "/channel/create", topic="lt", channel="ch")
    await call(nsqd, "POST", "/pubtrace", b"one", topic="lt", partition="1", trace_id="1")
    text = (await call(nsqd, "GET", "/metrics")).text
    series = [line for line in text.splitlines() if line and not line.startswith("#")]
    assert len(series) == len({line.rsplit(" ", 1)[0] for line in series})
    samples = samples_of(text)
    for partition, published in (("0", 0), ("1", 1)):
        where = (("partition", partition), ("topic", "lt"))
        channel = (("channel", "ch"), *where)
        assert samples[("nsq_topic_messages_total", where)] == published
        assert samples[("nsq_log_messages", where)] == published
        assert samples[("nsq_channel_lag", channel)] == published
        assert samples[("nsq_channel_confirmed_offset", channel)] == 0
        assert samples[("nsq_channel_delayed_queue", channel)] == 0
