"""nsqjs (Node.js) against our nsqd: its Writer publishes, its Reader consumes.

`node/pubsub.js` plays each scenario in a Node process while the nsqd under test runs
in-process on the test's trio loop; the heartbeat test runs the `nsqd` console script with its
default flags. The scenarios are described in `scenarios.py`. nsqjs comes from
`node/package-lock.json`, installed by `make install` (`npm ci --prefix tests/interop/node`).
"""

import shutil

import pytest

from tests.harness import start_nsqd
from tests.interop.support import (
    INTEROP_DIR,
    always,
    assert_report,
    channel_state,
    drained,
    expected_channel_state,
    run_client_script,
)
from tests.support.nsqd import tcp_port

TOPIC = "nsqjs"
CHANNEL = "interop"
NODE_DIR = INTEROP_DIR / "node"


async def play(port: int, scenario: str, settled) -> dict:
    node = shutil.which("node")
    assert node, "Node.js is needed for the nsqjs interop tests: install node and npm"
    assert (NODE_DIR / "node_modules" / "nsqjs").is_dir(), (
        "nsqjs is not installed: run `make install` (npm ci --prefix tests/interop/node)"
    )
    argv = [
        node,
        str(NODE_DIR / "pubsub.js"),
        f"--port={port}",
        f"--topic={TOPIC}",
        f"--channel={CHANNEL}",
        f"--scenario={scenario}",
    ]
    return await run_client_script(argv, settled=settled, cwd=NODE_DIR)


async def play_in_process(nsqd, scenario: str) -> dict:
    return await play(tcp_port(nsqd), scenario, drained(nsqd, TOPIC, CHANNEL, scenario))


async def test_nsqjs_publishes_and_consumes_10000_messages(nsqd):
    report = await play_in_process(nsqd, "pubsub")
    assert_report(report, "pubsub")
    assert channel_state(nsqd, TOPIC, CHANNEL) == expected_channel_state("pubsub")
    identify = report["identify"]
    assert identify["max_rdy_count"] == 2500 and identify["msg_timeout"] == 60000
    assert not identify["tls_v1"] and not identify["snappy"] and not identify["deflate"]


async def test_nsqjs_requeued_messages_come_back_with_attempts_2(nsqd):
    report = await play_in_process(nsqd, "requeue")
    assert_report(report, "requeue")
    assert channel_state(nsqd, TOPIC, CHANNEL) == expected_channel_state("requeue")


async def test_nsqjs_unanswered_message_is_redelivered_after_msg_timeout(nsqd):
    report = await play_in_process(nsqd, "timeout")
    assert report["identify"]["msg_timeout"] == 1000
    assert_report(report, "timeout")
    assert channel_state(nsqd, TOPIC, CHANNEL) == expected_channel_state("timeout")


# Also with `--workers=2` (the client's connections moved to the topic's owner).
@pytest.mark.parametrize("workers", ["1", "2"], ids=["one process", "two workers"])
async def test_nsqjs_answers_heartbeats_while_idle_then_consumes(tmp_path, workers):
    daemon = start_nsqd(tmp_path, f"-workers={workers}")
    try:
        report = await play(daemon.port(), "heartbeat", always)
    finally:
        assert daemon.stop() == 0, daemon.log
    assert_report(report, "heartbeat")
