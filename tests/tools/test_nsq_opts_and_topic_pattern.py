"""--consumer-opt/--producer-opt (go-nsq Config passthrough) and nsq_to_file's topic discovery
(--topic-pattern, --topic-refresh), against a real nsqd and nsqlookupd on ephemeral ports."""

import pytest

from nsqpy.client.blocking import Producer, http_json
from nsqpy.tools._options import NsqOptions, OptionError
from tests.support.polling import poll
from tests.support.stats import channel_stats, topic_channels
from tests.tools.support import lookupd_has_topic, run_tool, start_tool, stop_tool


def test_nsq_to_file_archives_the_topics_matching_the_pattern(nsqd, lookupd, topic, tmp_path):
    tcp = nsqd.addresses["TCP"]
    skipped, kept = f"{topic}_skip", [f"{topic}_keep_a", f"{topic}_keep_b"]
    tool = start_tool(
        "nsq_to_file",
        f"--topic-pattern=^{topic}_keep_",
        "--topic-refresh=100ms",
        f"--lookupd-http-address={lookupd.addresses['HTTP']}",
        f"--output-dir={tmp_path}",
        "--sync-interval=100ms",
    )
    with Producer(tcp) as producer:
        # The topic that does not match exists before the ones that do: every refresh that
        # finds those has seen (and skipped) it.
        producer.publish(skipped, b"not archived")
        poll(lambda: lookupd_has_topic(lookupd, skipped))
        for name in kept:
            producer.multi_publish(name, [b"%s %d" % (name.encode(), i) for i in range(3)])

    def archived(name: str) -> bool:
        stats = channel_stats(nsqd, name, "nsq_to_file")
        return (
            stats is not None
            and stats["message_count"] == 3
            and stats["depth"] == 0
            and (stats["in_flight_count"] == 0)
        )

    poll(lambda: all(archived(name) for name in kept))
    stop_tool(tool)
    for name in kept:
        paths = sorted(tmp_path.glob(f"{name}.*.log"))
        assert paths, name
        content = b"".join(path.read_bytes() for path in paths)
        assert content == b"".join(b"%s %d\n" % (name.encode(), i) for i in range(3))
    assert not list(tmp_path.glob(f"{skipped}.*"))
    assert "nsq_to_file" not in [c["channel_name"] for c in topic_channels(nsqd, skipped)]


@pytest.mark.parametrize(
    ("args", "error"),
    [
        (["--lookupd-http-address=127.0.0.1:1"], b"--topic or --topic-pattern required"),
        (
            ["--nsqd-tcp-address=127.0.0.1:1", "--topic-pattern=x"],
            b"--lookupd-http-address must be specified when no --topic specified",
        ),
        (["--topic-pattern=x"], b"--nsqd-tcp-address or --lookupd-http-address required"),
    ],
)
def test_nsq_to_file_topic_rules_are_gos(args, error, tmp_path):
    result = run_tool("nsq_to_file", *args, f"--output-dir={tmp_path}")
    assert result.returncode == 1
    assert error in result.stderr, result.stderr


def test_consumer_opt_sets_identify_fields_and_rdy(nsqd, topic):
    tcp = nsqd.addresses["TCP"]
    with Producer(tcp) as producer:
        producer.publish(topic, b"x")
    tool = start_tool(
        "nsq_tail",
        f"--topic={topic}",
        f"--nsqd-tcp-address={tcp}",
        "--channel=opts",
        "--consumer-opt=user_agent,custom-agent/1.0",
        "--consumer-opt=sample_rate=42",
        "--consumer-opt=heartbeat_interval,5s",
        "--consumer-opt=max_in_flight,7",
        "--consumer-opt=backoff_strategy,full_jitter",  # go-nsq's: accepted, no effect here
        "--consumer-opt=max_attempts,3",
    )

    def client():
        stats = channel_stats(nsqd, topic, "opts")
        clients = (stats or {}).get("clients") or []
        return clients[0] if clients and clients[0]["ready_count"] == 7 else None

    found = poll(client)
    stop_tool(tool)
    assert found["user_agent"] == "custom-agent/1.0"
    assert found["sample_rate"] == 42
    assert found["ready_count"] == 7


def test_producer_opt_sets_identify_fields(nsqd, topic):
    tcp = nsqd.addresses["TCP"]
    with Producer(tcp) as producer:
        producer.publish(topic, b"copy me")
    tool = start_tool(
        "nsq_to_nsq",
        f"--topic={topic}",
        f"--nsqd-tcp-address={tcp}",
        f"--destination-nsqd-tcp-address={tcp}",
        f"--destination-topic={topic}_copy",
        "--producer-opt=user_agent,producer-agent/2.0",
        "--producer-opt=output_buffer_timeout,100ms",
    )

    def producer_agents():
        stats = http_json(nsqd.addresses["HTTP"], "/stats", format="json")
        return [p["user_agent"] for p in stats.get("producers") or []]

    poll(lambda: "producer-agent/2.0" in producer_agents())
    stop_tool(tool)


@pytest.mark.parametrize(
    ("tool", "args", "error"),
    [
        (
            "nsq_tail",
            ["--topic=t", "--nsqd-tcp-address=127.0.0.1:1", "--consumer-opt=bogus,1"],
            b'invalid value "bogus,1" for flag -consumer-opt: invalid option bogus',
        ),
        (
            "nsq_to_file",
            ["--topic=t", "--nsqd-tcp-address=127.0.0.1:1", "--consumer-opt=sample_rate,100"],
            b"invalid sample_rate ! 100 > 99",
        ),
        (
            "to_nsq",
            ["--topic=t", "--nsqd-tcp-address=127.0.0.1:1", "--producer-opt=nope"],
            b"invalid option nope",
        ),
        (
            "nsq_to_nsq",
            [
                "--topic=t",
                "--nsqd-tcp-address=127.0.0.1:1",
                "--destination-nsqd-tcp-address=127.0.0.1:1",
                "--producer-opt=msg_timeout,soon",
            ],
            b"failed to coerce option msg_timeout (soon) - time: invalid duration",
        ),
    ],
)
def test_bad_options_exit_1_with_go_nsq_errors(tool, args, error, tmp_path):
    extra = [f"--output-dir={tmp_path}"] if tool == "nsq_to_file" else []
    result = run_tool(tool, *args, *extra)
    assert result.returncode == 1, result.stderr
    assert error in result.stderr, result.stderr


def test_option_parsing_follows_go_nsq():
    options = NsqOptions(
        ["read-timeout,2m", "heartbeat_interval,90s", "output_buffer_size=0", "snappy,false"]
    )
    assert options.identify("tool/1") == {
        "user_agent": "tool/1",
        "heartbeat_interval": 90000,
        "output_buffer_size": 0,
    }
    with pytest.raises(OptionError, match="invalid read_timeout ! 10ms < 100ms"):
        NsqOptions(["read_timeout,10ms"])
    with pytest.raises(OptionError, match="HeartbeatInterval 2m0s must be less than ReadTimeout"):
        NsqOptions(["heartbeat_interval,2m"])
    with pytest.raises(OptionError, match="snappy is not supported"):
        NsqOptions(["snappy"])
