"""gnsq (gevent) against our nsqd: its Producer publishes, its Consumer consumes.

gnsq monkey-patches the standard library, so it plays each scenario in a subprocess
(`gnsq_client.py`) while the nsqd under test runs in-process on the test's trio loop; the
heartbeat test runs the `nsqd` console script with its default flags. The scenarios are
described in `scenarios.py`.
"""

import pytest

from nsqpy.nsqd.server import NSQD
from tests.harness import start_nsqd
from tests.interop.support import (
    always,
    assert_report,
    channel_state,
    drained,
    expected_channel_state,
    python_module,
    run_client_script,
)
from tests.support.nsqd import tcp_port

TOPIC = "gnsq"
CHANNEL = "interop"


@pytest.fixture
async def nsqd_1s_msg_timeout(nsqd_options, nursery) -> NSQD:
    """gnsq's IDENTIFY sends no msg_timeout, so nsqd's own default is 1 s (-msg-timeout=1s)."""
    server = NSQD(nsqd_options.replace(msg_timeout=1.0))
    await nursery.start(server.serve)
    yield server
    server.shutdown()


async def play(port: int, scenario: str, settled) -> dict:
    argv = python_module(
        "tests.interop.gnsq_client",
        f"--port={port}",
        f"--topic={TOPIC}",
        f"--channel={CHANNEL}",
        f"--scenario={scenario}",
    )
    return await run_client_script(argv, settled=settled)


async def play_in_process(nsqd, scenario: str) -> dict:
    return await play(tcp_port(nsqd), scenario, drained(nsqd, TOPIC, CHANNEL, scenario))


async def test_gnsq_publishes_and_consumes_10000_messages(nsqd):
    report = await play_in_process(nsqd, "pubsub")
    assert_report(report, "pubsub")
    assert channel_state(nsqd, TOPIC, CHANNEL) == expected_channel_state("pubsub")
    identify = report["identify"]
    assert identify["max_rdy_count"] == 2500 and identify["msg_timeout"] == 60000
    assert not identify["tls_v1"] and not identify["snappy"] and not identify["deflate"]


async def test_gnsq_requeued_messages_come_back_with_attempts_2(nsqd):
    report = await play_in_process(nsqd, "requeue")
    assert_report(report, "requeue")
    assert channel_state(nsqd, TOPIC, CHANNEL) == expected_channel_state("requeue")


async def test_gnsq_unanswered_message_is_redelivered_after_msg_timeout(nsqd_1s_msg_timeout):
    nsqd = nsqd_1s_msg_timeout
    report = await play_in_process(nsqd, "timeout")
    assert report["identify"]["msg_timeout"] == 1000
    assert_report(report, "timeout")
    assert channel_state(nsqd, TOPIC, CHANNEL) == expected_channel_state("timeout")


# Also with `--workers=2` (the client's connections moved to the topic's owner).
@pytest.mark.parametrize("workers", ["1", "2"], ids=["one process", "two workers"])
async def test_gnsq_answers_heartbeats_while_idle_then_consumes(tmp_path, workers):
    daemon = start_nsqd(tmp_path, f"-workers={workers}")
    try:
        report = await play(daemon.port(), "heartbeat", always)
    finally:
        assert daemon.stop() == 0, daemon.log
    assert_report(report, "heartbeat")
