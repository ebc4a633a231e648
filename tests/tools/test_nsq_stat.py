"""nsq_stat against a real nsqd, directly and through nsqlookupd."""

from nsqpy.client.blocking import Consumer, Producer, http_request
from tests.support.polling import poll
from tests.tools.support import lookupd_has_topic, run_tool

HEADER = (
    "------rate------+----------------depth----------------+--------------metadata---------------\n"
    "ingress  egress |   total     mem    disk inflt   def |     req     t-o         msgs clients\n"
)


def test_nsq_stat_prints_go_table(nsqd, topic):
    tcp = nsqd.addresses["TCP"]
    with Consumer(tcp, topic, "stats", max_in_flight=1) as consumer:
        with Producer(tcp) as producer:
            producer.multi_publish(topic, [b"x"] * 4)
        assert consumer.receive(timeout=5) is not None  # one in flight, three in memory
        result = run_tool(
            "nsq_stat",
            f"--topic={topic}",
            "--channel=stats",
            f"--nsqd-http-address={nsqd.addresses['HTTP']}",
            "--interval=50ms",
            "--count=2",
        )
    assert result.returncode == 0, result.stderr.decode()
    out = result.stdout.decode()
    assert out.startswith(HEADER)
    rows = out[len(HEADER) :].splitlines()
    assert len(rows) == 2
    for row in rows:
        columns = row.replace("|", " ").split()
        # ingress egress | total mem disk inflt def | req t-o msgs clients
        assert columns == ["0", "0", "3", "3", "0", "1", "0", "0", "0", "4", "1"]


def test_nsq_stat_via_lookupd(nsqd, lookupd, topic):
    http_request(nsqd.addresses["HTTP"], "/topic/create", method="POST", topic=topic)
    http_request(nsqd.addresses["HTTP"], "/channel/create", method="POST", topic=topic, channel="c")
    poll(lambda: lookupd_has_topic(lookupd, topic))
    result = run_tool(
        "nsq_stat",
        f"--topic={topic}",
        "--channel=c",
        f"--lookupd-http-address={lookupd.addresses['HTTP']}",
        "--interval=10ms",
        "--count=1",
    )
    assert result.returncode == 0, result.stderr.decode()
    assert len(result.stdout.decode().splitlines()) == 3


def test_nsq_stat_unknown_channel_is_fatal(nsqd, topic):
    http_request(nsqd.addresses["HTTP"], "/topic/create", method="POST", topic=topic)
    result = run_tool(
        "nsq_stat",
        f"--topic={topic}",
        "--channel=nope",
        f"--nsqd-http-address={nsqd.addresses['HTTP']}",
        "--count=1",
    )
    assert result.returncode == 1
    assert b"failed to find channel(nope)" in result.stderr
