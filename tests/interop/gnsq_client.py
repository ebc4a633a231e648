"""gnsq (gevent) playing one scenario of `scenarios.py` against an nsqd; run by test_gnsq.py.

    python -m tests.interop.gnsq_client --port PORT --topic T --channel C --scenario NAME

It runs in its own process because gevent monkey-patches the standard library. It prints
its `Report` as one line of JSON once it has every delivery it expects (or at its deadline),
then keeps its connections open until stdin closes, and closes them.
"""

from gevent import monkey

monkey.patch_all()

import argparse  # noqa: E402
import json  # noqa: E402
import sys  # noqa: E402

import gevent  # noqa: E402
import gevent.event  # noqa: E402
import gnsq  # noqa: E402
import gnsq.protocol  # noqa: E402

from tests.interop.scenarios import (  # noqa: E402
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


def record_identify_replies() -> None:
    """gnsq keeps only max_rdy_count of the IDENTIFY reply: keep it all on the connection."""
    identify = gnsq.NsqdTCPClient.identify

    def identify_and_keep_reply(self):
        self.identify_reply = identify(self)
        return self.identify_reply

    gnsq.NsqdTCPClient.identify = identify_and_keep_reply


def publish_all(producer: gnsq.Producer, topic: str, scenario: str, report: Report) -> None:
    """Pipeline every PUB and MPUB, then collect the answers in order."""
    pending = []
    for command, bodies in publish_plan(message_bodies(COUNTS[scenario])):
        encoded = [body.encode() for body in bodies]
        if command == "pub":
            pending.append(producer.publish(topic, encoded[0], raise_error=False))
        else:
            pending.append(producer.multipublish(topic, encoded, raise_error=False))
    for answer in pending:
        try:
            result = answer.get()
        except gnsq.errors.NSQException as error:
            report.publish_errors.append(repr(error))
            continue
        if result == gnsq.protocol.OK:
            report.published_ok += 1
        else:
            report.publish_errors.append(repr(result))


def play(address: str, topic: str, channel: str, scenario: str, report: Report) -> list:
    """The scenario up to the report; returns what to close afterwards."""
    expected_deliveries = expected_delivery_count(scenario)
    all_delivered = gevent.event.Event()

    producer = gnsq.Producer([address])
    producer.start()
    if scenario != "heartbeat":
        publish_all(producer, topic, scenario, report)

    conn_options = {}
    if scenario == "heartbeat":
        conn_options["heartbeat_interval"] = 1  # seconds: IDENTIFY heartbeat_interval 1000
    # gnsq's IDENTIFY has no msg_timeout: the test starts nsqd with a 1 s one instead.
    consumer = gnsq.Consumer(
        topic,
        channel,
        nsqd_tcp_addresses=[address],
        max_in_flight=MAX_IN_FLIGHT,
        requeue_delay=0,  # REQ <id> 0
        # gnsq backs off after each REQ; its default (up to 128 s) would outlast the test.
        max_backoff_duration=0.1,
        **conn_options,
    )

    @consumer.on_message.connect
    def handle(consumer, message) -> None:
        body = message.body.decode()
        report.deliveries.append((body, message.attempts))
        if len(report.deliveries) >= expected_deliveries:
            all_delivered.set()
        action = handler_action(scenario, body, message.attempts)
        if action == "hold":
            message.enable_async()  # and never answer: nsqd must time it out
        elif action == "requeue":
            raise gnsq.errors.NSQRequeueMessage()
        # "finish": gnsq FINs a message its handler returned from.

    @consumer.on_response.connect
    def on_response(consumer, response) -> None:
        if response == gnsq.protocol.HEARTBEAT:
            report.heartbeats += 1

    @consumer.on_error.connect
    def on_error(consumer, error) -> None:
        report.errors.append(repr(error))

    consumer.start(block=False)
    connections = list(consumer._connections)  # gnsq keeps no other record of them
    if len(connections) != 1:
        report.errors.append(f"consumer has {len(connections)} connections after start")
        return [consumer, producer]
    report.identify = connections[0].identify_reply

    if scenario == "heartbeat":
        while report.heartbeats < HEARTBEATS_BEFORE_PUBLISH:
            gevent.sleep(0.01)
        report.heartbeats_before_publish = report.heartbeats
        publish_all(producer, topic, scenario, report)

    all_delivered.wait()
    # gnsq replaces a lost connection silently; the one we started with must still be it.
    if list(consumer._connections) != connections or not connections[0].is_connected:
        report.disconnects += 1
    return [consumer, producer]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--channel", required=True)
    parser.add_argument("--scenario", choices=COUNTS, required=True)
    args = parser.parse_args()

    record_identify_replies()
    report = Report(client="gnsq")
    to_close = []
    try:
        with gevent.Timeout(CLIENT_DEADLINE):
            to_close = play(
                f"127.0.0.1:{args.port}", args.topic, args.channel, args.scenario, report
            )
    except gevent.Timeout:
        report.errors.append(f"gnsq did not finish in {CLIENT_DEADLINE}s")
    print(json.dumps(report.to_json()), flush=True)

    # Stay connected (and answering heartbeats: read stdin off the gevent hub) until told.
    gevent.get_hub().threadpool.spawn(sys.stdin.buffer.read).get()
    for client in to_close:
        client.close()
    for client in to_close:
        client.join(timeout=5)


if __name__ == "__main__":
    main()
