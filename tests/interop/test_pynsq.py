"""pynsq 0.9.1 (tornado) against our nsqd: its Writer publishes, its Reader consumes.

pynsq runs in a worker thread on its own asyncio loop (tornado's IOLoop wraps it) while the
nsqd under test runs in-process on the test's trio loop, so the test can read the channel's
counters afterwards; the heartbeat test runs the `nsqd` console script with its default flags.
The scenarios are described in `support.py`.
"""

import asyncio

import nsq
import pytest

from tests.harness import start_nsqd
from tests.interop.scenarios import (
    CLIENT_DEADLINE,
    COUNTS,
    HEARTBEATS_BEFORE_PUBLISH,
    MAX_IN_FLIGHT,
    Report,
    expected_delivery_count,
    handler_action,
    message_bodies,
    publish_plan,
)
from tests.interop.support import (
    always,
    assert_report,
    channel_state,
    drained,
    expected_channel_state,
    from_trio,
    run_asyncio_client,
    settle,
)
from tests.support.nsqd import tcp_port
from tests.support.polling import wait_until

TOPIC = "pynsq"
CHANNEL = "interop"


class RecordingReader(nsq.Reader):
    """pynsq's Reader, also recording what it reports through its hooks."""

    def __init__(self, report: Report, **kwargs) -> None:
        self.report = report
        self.closing = False
        super().__init__(**kwargs)

    def heartbeat(self, conn) -> None:
        self.report.heartbeats += 1

    def _on_connection_identify_response(self, conn, data, **kwargs) -> None:
        self.report.identify = data
        super()._on_connection_identify_response(conn, data, **kwargs)

    def _on_connection_error(self, conn, error, **kwargs) -> None:
        if not self.closing:  # pynsq reports its own close as a failed read
            self.report.errors.append(repr(error))
        super()._on_connection_error(conn, error, **kwargs)

    def _on_connection_close(self, conn, **kwargs) -> None:
        if not self.closing:
            self.report.disconnects += 1
        super()._on_connection_close(conn, **kwargs)


async def pynsq_session(report: Report, port: int, scenario: str, settled) -> None:
    address = f"127.0.0.1:{port}"
    plan = publish_plan(message_bodies(COUNTS[scenario]))
    expected_deliveries = expected_delivery_count(scenario)
    all_delivered = asyncio.Event()

    def on_published(conn, data) -> None:
        if data == b"OK":
            report.published_ok += 1
        else:
            report.publish_errors.append(repr(data))

    def publish_all() -> None:
        for command, bodies in plan:
            encoded = [body.encode() for body in bodies]
            if command == "pub":
                writer.pub(TOPIC, encoded[0], callback=on_published)
            else:
                writer.mpub(TOPIC, encoded, callback=on_published)

    def published() -> bool:
        return report.published_ok + len(report.publish_errors) == len(plan)

    def handle(message: nsq.Message):
        body = message.body.decode()
        report.deliveries.append((body, message.attempts))
        if len(report.deliveries) >= expected_deliveries:
            all_delivered.set()
        action = handler_action(scenario, body, message.attempts)
        if action == "hold":
            message.enable_async()  # and never answer: nsqd must time it out
            return None
        return action == "finish"  # False: pynsq sends REQ (with backoff)

    writer = nsq.Writer([address])
    await wait_until(
        lambda: any(c.connected() for c in writer.conns.values()),
        "the Writer",
        timeout=CLIENT_DEADLINE,
    )
    if scenario != "heartbeat":
        publish_all()
        await wait_until(published, "answers to every PUB and MPUB", timeout=CLIENT_DEADLINE)

    conn_options = {"requeue_delay": 0}  # REQ <id> 0, not pynsq's default 90 s * attempts
    if scenario == "timeout":
        conn_options["msg_timeout"] = 1  # seconds: IDENTIFY msg_timeout 1000
    if scenario == "heartbeat":
        conn_options["heartbeat_interval"] = 1  # seconds: IDENTIFY heartbeat_interval 1000
    reader = RecordingReader(
        report,
        topic=TOPIC,
        channel=CHANNEL,
        message_handler=handle,
        nsqd_tcp_addresses=[address],
        max_in_flight=MAX_IN_FLIGHT,
        # pynsq backs off after each REQ; its default (up to 128 s) would outlast the test.
        max_backoff_duration=1,
        **conn_options,
    )
    if scenario == "heartbeat":
        await wait_until(
            lambda: report.heartbeats >= HEARTBEATS_BEFORE_PUBLISH,
            "3 heartbeats",
            timeout=CLIENT_DEADLINE,
        )
        report.heartbeats_before_publish = report.heartbeats
        publish_all()
        await wait_until(published, "the answer to the PUB", timeout=CLIENT_DEADLINE)

    await all_delivered.wait()
    await settle(settled)
    reader.closing = True
    reader.close()
    for conn in list(writer.conns.values()):
        conn.close()


async def play(nsqd, scenario: str) -> dict:
    report = Report(client="pynsq")
    settled = from_trio(drained(nsqd, TOPIC, CHANNEL, scenario))
    await run_asyncio_client(pynsq_session, report, tcp_port(nsqd), scenario, settled)
    return report.to_json()


async def test_pynsq_publishes_and_consumes_10000_messages(nsqd):
    report = await play(nsqd, "pubsub")
    assert_report(report, "pubsub")
    assert channel_state(nsqd, TOPIC, CHANNEL) == expected_channel_state("pubsub")
    # The IDENTIFY reply pynsq negotiated: no TLS, snappy or deflate granted yet.
    identify = report["identify"]
    assert identify["max_rdy_count"] == 2500 and identify["msg_timeout"] == 60000
    assert not identify["tls_v1"] and not identify["snappy"] and not identify["deflate"]


async def test_pynsq_requeued_messages_come_back_with_attempts_2(nsqd):
    report = await play(nsqd, "requeue")
    assert_report(report, "requeue")
    assert channel_state(nsqd, TOPIC, CHANNEL) == expected_channel_state("requeue")


async def test_pynsq_unanswered_message_is_redelivered_after_msg_timeout(nsqd):
    report = await play(nsqd, "timeout")
    assert report["identify"]["msg_timeout"] == 1000
    assert_report(report, "timeout")
    assert channel_state(nsqd, TOPIC, CHANNEL) == expected_channel_state("timeout")


# Also with `--workers=2` (the client's connections moved to the topic's owner).
@pytest.mark.parametrize("workers", ["1", "2"], ids=["one process", "two workers"])
async def test_pynsq_answers_heartbeats_while_idle_then_consumes(tmp_path, workers):
    daemon = start_nsqd(tmp_path, f"-workers={workers}")
    try:
        report = Report(client="pynsq")
        await run_asyncio_client(pynsq_session, report, daemon.port(), "heartbeat", always)
    finally:
        assert daemon.stop() == 0, daemon.log
    assert_report(report.to_json(), "heartbeat")
