"""ansq (asyncio) against our nsqd: its writer publishes, its reader consumes.

ansq runs in a worker thread on its own asyncio loop while the nsqd under test runs
in-process on the test's trio loop, so the test can read the channel's counters afterwards;
the heartbeat test runs the `nsqd` console script with its default flags. The scenarios are
described in `support.py`.

ansq's reader starts each connection at RDY 1; we raise it to max_in_flight with the
connection's own `rdy()`. Auto-reconnect is off so that a dropped connection shows (as
`on_close` and the end of `messages()`) instead of being quietly replaced.
"""

import asyncio

import ansq
import pytest
from ansq import ConnectionFeatures, ConnectionOptions

from tests.harness import start_nsqd
from tests.interop.scenarios import (
    CLIENT_DEADLINE,
    COUNTS,
    HEARTBEAT_INTERVAL_MS,
    HEARTBEATS_BEFORE_PUBLISH,
    MAX_IN_FLIGHT,
    MSG_TIMEOUT_MS,
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

TOPIC = "ansq"
CHANNEL = "interop"


async def ansq_session(report: Report, port: int, scenario: str, settled) -> None:
    address = f"127.0.0.1:{port}"
    plan = publish_plan(message_bodies(COUNTS[scenario]))
    closing = False

    def on_close(connection) -> None:
        if not closing:
            report.disconnects += 1

    def on_exception(error) -> None:
        report.errors.append(repr(error))

    async def on_heartbeat(connection) -> None:
        report.heartbeats += 1

    features = {}
    if scenario == "timeout":
        features["msg_timeout"] = MSG_TIMEOUT_MS
    if scenario == "heartbeat":
        features["heartbeat_interval"] = HEARTBEAT_INTERVAL_MS
    options = ConnectionOptions(
        auto_reconnect=False,
        on_close=on_close,
        on_exception=on_exception,
        on_heartbeat=on_heartbeat,
        features=ConnectionFeatures(**features),
    )

    async def publish_all() -> None:
        answers = await asyncio.gather(
            *(
                writer.pub(TOPIC, bodies[0].encode())
                if command == "pub"
                else writer.mpub(TOPIC, *(body.encode() for body in bodies))
                for command, bodies in plan
            )
        )
        for answer in answers:
            if answer.is_ok:
                report.published_ok += 1
            else:
                report.publish_errors.append(repr(answer))

    writer = await ansq.create_writer(
        nsqd_tcp_addresses=[address],
        connection_options=ConnectionOptions(auto_reconnect=False, on_close=on_close),
    )
    if scenario != "heartbeat":
        await publish_all()

    reader = await ansq.create_reader(
        topic=TOPIC, channel=CHANNEL, nsqd_tcp_addresses=[address], connection_options=options
    )
    for connection in reader.connections:
        await connection.rdy(MAX_IN_FLIGHT)
    if scenario == "heartbeat":
        await wait_until(
            lambda: report.heartbeats >= HEARTBEATS_BEFORE_PUBLISH,
            "3 heartbeats",
            timeout=CLIENT_DEADLINE,
        )
        report.heartbeats_before_publish = report.heartbeats
        await publish_all()

    expected_deliveries = expected_delivery_count(scenario)
    async for message in reader.messages():
        body = message.body.decode()
        report.deliveries.append((body, message.attempts))
        action = handler_action(scenario, body, message.attempts)
        if action == "finish":
            await message.fin()
        elif action == "requeue":
            await message.req(timeout=0)
        # "hold": never answer; nsqd must time it out.
        if len(report.deliveries) >= expected_deliveries:
            break

    await settle(settled)
    closing = True
    await reader.close()
    await writer.close()


async def play(nsqd, scenario: str) -> dict:
    report = Report(client="ansq")
    settled = from_trio(drained(nsqd, TOPIC, CHANNEL, scenario))
    await run_asyncio_client(ansq_session, report, tcp_port(nsqd), scenario, settled)
    return report.to_json()


async def test_ansq_publishes_and_consumes_10000_messages(nsqd):
    report = await play(nsqd, "pubsub")
    assert_report(report, "pubsub")
    assert channel_state(nsqd, TOPIC, CHANNEL) == expected_channel_state("pubsub")


async def test_ansq_requeued_messages_come_back_with_attempts_2(nsqd):
    report = await play(nsqd, "requeue")
    assert_report(report, "requeue")
    assert channel_state(nsqd, TOPIC, CHANNEL) == expected_channel_state("requeue")


async def test_ansq_unanswered_message_is_redelivered_after_msg_timeout(nsqd):
    report = await play(nsqd, "timeout")
    assert_report(report, "timeout")
    assert channel_state(nsqd, TOPIC, CHANNEL) == expected_channel_state("timeout")


# Also with `--workers=2` (the client's connections moved to the topic's owner).
@pytest.mark.parametrize("workers", ["1", "2"], ids=["one process", "two workers"])
async def test_ansq_answers_heartbeats_while_idle_then_consumes(tmp_path, workers):
    daemon = start_nsqd(tmp_path, f"-workers={workers}")
    try:
        report = Report(client="ansq")
        await run_asyncio_client(ansq_session, report, daemon.port(), "heartbeat", always)
    finally:
        assert daemon.stop() == 0, daemon.log
    assert_report(report.to_json(), "heartbeat")
