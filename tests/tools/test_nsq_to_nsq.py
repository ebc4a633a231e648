"""nsq_to_nsq copies between two real nsqds; the shared progress line."""

import io

import pytest

from nsqpy.client.blocking import Consumer, Producer
from nsqpy.tools._common import Progress
from tests.harness import start_nsqd
from tests.support.polling import poll
from tests.support.stats import channel_stats
from tests.tools.support import start_tool, stop_tool


@pytest.fixture(scope="module")
def destination(tmp_path_factory):
    daemon = start_nsqd(tmp_path_factory.mktemp("destination"))
    yield daemon
    daemon.stop()


def test_nsq_to_nsq_copies_to_another_nsqd_and_topic(nsqd, destination, topic):
    tcp = nsqd.addresses["TCP"]
    with Producer(tcp) as producer:
        producer.multi_publish(topic, [b"copy %d" % i for i in range(20)])
    tool = start_tool(
        "nsq_to_nsq",
        f"--topic={topic}",
        f"--nsqd-tcp-address={tcp}",
        f"--destination-nsqd-tcp-address={destination.addresses['TCP']}",
        "--destination-topic=copied",
        "--mode=round-robin",
    )

    def copied():
        stats = channel_stats(nsqd, topic, "nsq_to_nsq")
        return (
            stats
            and stats["message_count"] == 20
            and stats["depth"] == 0
            and (stats["in_flight_count"] == 0)
        )

    poll(copied)
    stop_tool(tool)
    with Consumer(destination.addresses["TCP"], "copied", "check") as consumer:
        bodies = [consumer.receive(timeout=5).body for _ in range(20)]
    assert bodies == [b"copy %d" % i for i in range(20)]


class FakeTerminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_only_on_a_terminal():
    pipe = io.StringIO()
    progress = Progress(stream=pipe)
    progress.add(5)
    progress.close()
    assert pipe.getvalue() == ""

    terminal = FakeTerminal()
    progress = Progress(stream=terminal)
    progress._last_draw -= 2  # as if the last redraw was two seconds ago
    progress.add(10)
    progress.close()
    assert terminal.getvalue().startswith("\r10 msgs, ")
    assert "msgs/s" in terminal.getvalue()
    assert terminal.getvalue().endswith("msgs/s\n")
