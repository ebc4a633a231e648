"""A classic client and a Youzan client on one nsqd, one topic, at the same time (docs/protocol.md
§8).

pynsq 0.9.1 (a real official-protocol client, on its own asyncio loop in a worker thread)
consumes channel `classic` while a raw-socket Youzan consumer (`SUB t youzan 0`) consumes
channel `youzan` of the same topic, and messages are published both the classic way (PUB,
MPUB) and the Youzan way (PUB_TRACE with partition 0). Each consumer gets every message in its
own ID format: pynsq the 16 hex digits it treats as text, the Youzan consumer the binary
`[8 internal id][8 trace id]` of the same message. pynsq sees nothing unusual: no error, no
disconnect, every message once with attempts 1, and its channel drains.
"""

import asyncio
from dataclasses import dataclass, field

import nsq
import trio

from nsqpy.common.command import encode_mpub, encode_pub
from tests.interop.scenarios import Report
from tests.interop.support import run_asyncio_client, settle
from tests.support.nsqd import tcp_port
from tests.youzan.support import binary_id, connect, http

TOPIC = "mixed"
MESSAGES = 600
HEX_DIGITS = set("0123456789abcdef")
COUNTERS = ("message_count", "depth", "in_flight_count", "requeue_count")


@dataclass
class ClassicReport(Report):
    ids: dict[str, str] = field(default_factory=dict)  # body -> the ID as pynsq gave it


async def pynsq_consumer(report: ClassicReport, port: int, settled) -> None:
    everything = asyncio.Event()

    def handle(message: nsq.Message) -> bool:
        body = message.body.decode()
        report.deliveries.append((body, message.attempts))
        # pynsq hands the ID over as it came; clients of its kind treat it as text.
        report.ids[body] = message.id.decode("ascii")
        if len(report.deliveries) >= MESSAGES:
            everything.set()
        return True

    class Reader(nsq.Reader):
        closing = False

        def _on_connection_error(self, conn, error, **kwargs) -> None:
            if not self.closing:
                report.errors.append(repr(error))
            super()._on_connection_error(conn, error, **kwargs)

        def _on_connection_close(self, conn, **kwargs) -> None:
            if not self.closing:
                report.disconnects += 1
            super()._on_connection_close(conn, **kwargs)

    reader = Reader(
        topic=TOPIC,
        channel="classic",
        message_handler=handle,
        nsqd_tcp_addresses=[f"127.0.0.1:{port}"],
        max_in_flight=50,
    )
    await everything.wait()
    await settle(settled)
    reader.closing = True
    reader.close()


async def test_classic_and_youzan_consumers_on_one_topic(nsqd):
    assert (await http(nsqd, "POST", f"/topic/create?topic={TOPIC}")).status == 200
    for channel in ("classic", "youzan"):
        reply = await http(nsqd, "POST", f"/channel/create?topic={TOPIC}&channel={channel}")
        assert reply.status == 200
    youzan = await connect(nsqd)
    await youzan.subscribe_as("SUB", TOPIC, "youzan", 0, rdy=100)

    def classic_drained() -> bool:
        channel = nsqd.topics[TOPIC].channels["classic"]
        return channel.depth == 0 and not channel.in_flight

    report = ClassicReport(client="pynsq")
    received: dict[bytes, object] = {}
    traces: dict[bytes, int] = {}

    async def run_pynsq() -> None:
        settled = lambda: trio.from_thread.run_sync(classic_drained)  # noqa: E731
        await run_asyncio_client(pynsq_consumer, report, tcp_port(nsqd), settled, deadline=30)

    async def publish() -> None:
        classic, traced = await connect(nsqd), await connect(nsqd)
        for start in range(0, MESSAGES, 6):
            bodies = [b"msg-%d" % n for n in range(start, start + 6)]
            # Two classic PUBs, one classic MPUB of two, two PUB_TRACEs to partition 0.
            await classic.command_ok(encode_pub(TOPIC, bodies[0]) + encode_pub(TOPIC, bodies[1]))
            await classic.expect_ok()
            await classic.command_ok(encode_mpub(TOPIC, bodies[2:4]))
            for n, body in enumerate(bodies[4:], start + 4):
                reply = await traced.publish_traced(TOPIC, 1000 + n, body, 0)
                assert reply.trace_id == 1000 + n
                traces[body] = 1000 + n

    async def consume_youzan() -> None:
        while len(received) < MESSAGES:
            message = await youzan.read_youzan()
            assert message.body not in received, f"{message.body!r} delivered twice"
            received[message.body] = message
            await youzan.finish(message)

    with trio.fail_after(40):
        async with trio.open_nursery() as nursery:
            # Both channels exist already, so nothing published before a SUB is lost.
            nursery.start_soon(run_pynsq)
            nursery.start_soon(consume_youzan)
            await publish()

    # The classic client: unaffected.
    assert report.errors == [] and report.disconnects == 0
    bodies = [f"msg-{n}" for n in range(MESSAGES)]
    assert sorted(report.deliveries) == sorted((body, 1) for body in bodies)
    for message_id in report.ids.values():
        assert len(message_id) == 16 and set(message_id) <= HEX_DIGITS, message_id
    # The Youzan client: the same messages, each with the binary form of the same ID.
    assert sorted(received) == sorted(body.encode() for body in bodies)
    for body in bodies:
        message = received[body.encode()]
        assert message.attempts == 1
        trace = traces.get(body.encode(), 0)
        assert message.id == binary_id(int(report.ids[body], 16), trace), body
    # Both channels drain (the Youzan consumer's last FINs may still be on their way).
    expected = {"message_count": MESSAGES, "depth": 0, "in_flight_count": 0, "requeue_count": 0}
    with trio.fail_after(10):
        while await channel_stats_of(nsqd) != {"classic": expected, "youzan": expected}:
            await trio.sleep(0.01)


async def channel_stats_of(nsqd) -> dict:
    stats = (await http(nsqd, "GET", f"/stats?format=json&topic={TOPIC}")).json()
    return {
        channel["channel_name"]: {key: channel[key] for key in COUNTERS}
        for channel in stats["topics"][0]["channels"]
    }
