"""Timeouts on virtual time: trio's MockClock with autojump (pytest-trio's `autojump_clock`).

Asking for `autojump_clock` runs the whole test, the in-process nsqd included, on a clock that
jumps to the next deadline whenever every task is blocked; an hour of nsqd's life takes
milliseconds and every deadline can be asserted to the queue-scan interval. Two kinds of test:

* the channel's in-flight and deferred queues and the queue-scan loop, driven directly on an
  nsqd that is built but never served (no sockets, so time is entirely virtual);
* the same rules seen over the wire from the in-process server. Loopback TCP delivers a write
  to the peer before `send_all` returns, so no virtual time passes between a frame sent and
  the frame read.
"""

import time

import pytest
import trio

from nsqpy.common.command import (
    NOP,
    encode_dpub,
    encode_fin,
    encode_pub,
    encode_rdy,
    encode_req,
    encode_touch,
)
from nsqpy.nsqd.client import Client
from nsqpy.nsqd.message import Message
from nsqpy.nsqd.options import Options
from nsqpy.nsqd.server import NSQD
from tests.nsqd.wire import Wire, close_all_wires, consumer, override_options, with_options
from tests.support.polling import wait_until

SCAN = Options.queue_scan_interval  # how late the queue-scan may notice a deadline


@pytest.fixture
def nsqd_options(nsqd_options, request):
    return override_options(nsqd_options, request)


@pytest.fixture(autouse=True)
async def close_connections():
    yield
    close_all_wires()


def in_flight_message(server: NSQD, timeout: float, *, channels: int = 1):
    """One message in `channels` ephemeral channels, each copy put in flight. (Put in each
    channel here: from FAN_OUT_AFTER_ANSWER_FROM channels a publish reaches them through the
    topic's pump, which this nsqd, never served, does not run.)"""
    topic = server.get_topic("t#ephemeral")
    names = [f"c{i}#ephemeral" for i in range(channels)]
    for name in names:
        topic.get_channel(name)
    published = Message(topic.queue.next_id(), b"x", time.time_ns())
    now = trio.current_time()
    copies = []
    for name in names:
        channel = topic.channels[name]
        channel.put_messages([published.copy()], now)
        (message,) = channel.take(1)
        channel.start_in_flight([message], 1, timeout, now)
        copies.append((channel, message))
    return copies


# -- the channel's queues, driven directly --------------------------------------------------


async def test_in_flight_timeout_requeues_and_counts(standalone, autojump_clock):
    [(channel, message)] = in_flight_message(standalone, 10.0)
    client = Client(standalone.options, "127.0.0.1:1")
    channel.add_client(client)
    message.client_id = client.id
    client.sent_messages(1)
    start = message.deliver_at
    assert message.attempts == 1 and message.deadline == start + 10.0
    assert not channel.process_in_flight(start + 9.999)
    assert channel.timeout_count == 0 and len(channel.in_flight) == 1
    assert channel.process_in_flight(start + 10.0)
    assert channel.timeout_count == 1 and len(channel.in_flight) == 0
    assert client.in_flight_count == 0
    assert channel.depth == 1
    # Attempts count deliveries: the requeued message goes out again as attempt 2.
    (again,) = channel.take(1)
    channel.start_in_flight([again], client.id, 10.0, start + 10.0)
    assert (again.id, again.attempts) == (message.id, 2)


@with_options(max_msg_timeout=15.0)
async def test_touch_is_capped_at_delivery_plus_max_msg_timeout(standalone, autojump_clock):
    [(channel, message)] = in_flight_message(standalone, 10.0)
    start = message.deliver_at
    channel.touch(message.client_id, message.id, 10.0, start + 4)
    assert message.deadline == start + 14
    channel.touch(message.client_id, message.id, 10.0, start + 8)
    assert message.deadline == start + 15
    assert not channel.process_in_flight(start + 14.999)
    assert channel.process_in_flight(start + 15)


async def test_deferred_messages_are_released_when_due(standalone, autojump_clock):
    topic = standalone.get_topic("t#ephemeral")
    channel = topic.get_channel("c#ephemeral")
    start = trio.current_time()
    topic.publish([b"later"], defer=5.0)
    assert channel.depth == 0 and len(channel.deferred) == 1
    assert not channel.process_deferred(start + 4.999)
    assert channel.process_deferred(start + 5.0)
    assert channel.depth == 1 and len(channel.deferred) == 0
    (message,) = channel.take(1)
    assert message.attempts == 0  # a deferred message has not been delivered yet


async def test_requeue_with_delay_is_deferred(standalone, autojump_clock):
    [(channel, message)] = in_flight_message(standalone, 60.0)
    now = trio.current_time()
    channel.requeue(message.client_id, message.id, 7.0, now)
    assert channel.requeue_count == 1 and len(channel.in_flight) == 0
    assert len(channel.deferred) == 1 and channel.depth == 0
    assert not channel.process_deferred(now + 6.999)
    assert channel.process_deferred(now + 7.0)
    assert channel.depth == 1


# -- the queue-scan loop --------------------------------------------------------------------


async def test_queue_scan_releases_at_the_right_virtual_time(standalone, autojump_clock):
    [(channel, message)] = in_flight_message(standalone, 10.0)
    topic = standalone.topics["t#ephemeral"]
    start = trio.current_time()
    topic.publish([b"later"], defer=3.0)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(standalone.queue_scanner.run)
        await wait_until(lambda: channel.depth == 1, timeout=60)
        assert start + 3.0 <= trio.current_time() < start + 3.0 + 2 * SCAN
        await wait_until(lambda: channel.timeout_count == 1, timeout=60)
        assert start + 10.0 <= trio.current_time() < start + 10.0 + 2 * SCAN
        assert channel.depth == 2
        nursery.cancel_scope.cancel()


async def test_queue_scan_dirty_loop_processes_many_expired_channels(standalone, autojump_clock):
    # 100 channels each with an expired message; the scan samples 20 at a time and goes round
    # again at once while more than 25% of a sample had work (Go's queueScanLoop).
    count = 100
    selection = standalone.options.queue_scan_selection_count
    copies = in_flight_message(standalone, 1.0, channels=count)
    channels = [channel for channel, _ in copies]
    start = trio.current_time()

    def processed() -> int:
        return sum(channel.timeout_count for channel in channels)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(standalone.queue_scanner.run)
        await wait_until(lambda: processed() > 0, timeout=60)
        first_scan = trio.current_time()
        assert start + 1.0 <= first_scan < start + 1.0 + 2 * SCAN
        # The first scan with work did not stop after one sample.
        assert processed() > selection
        await wait_until(lambda: processed() == count, timeout=120)
        assert all(channel.timeout_count == 1 for channel in channels)
        assert all(channel.depth == 1 for channel in channels)
        nursery.cancel_scope.cancel()


# -- the same, over the wire ----------------------------------------------------------------


@with_options(msg_timeout=10.0)
async def test_wire_in_flight_timeout_redelivers_with_attempts_incremented(nsqd, autojump_clock):
    wire = await consumer(nsqd, "t", "c", rdy=1)
    await wire.send(encode_pub("t", b"x"))
    await wire.expect_ok()
    first = await wire.read_message()
    delivered = trio.current_time()
    again = await wire.read_message(timeout=60)
    assert delivered + 10.0 <= trio.current_time() < delivered + 10.0 + 2 * SCAN
    assert (again.id, again.body, again.attempts) == (first.id, b"x", 2)
    channel = nsqd.topics["t"].channels["c"]
    assert channel.timeout_count == 1
    third = await wire.read_message(timeout=60)
    assert third.attempts == 3 and channel.timeout_count == 2
    await wire.send(encode_fin(third.id))
    await wait_until(lambda: len(channel.in_flight) == 0)


async def test_wire_identify_msg_timeout_sets_the_in_flight_timeout(nsqd, autojump_clock):
    wire = await consumer(nsqd, "t", "c", rdy=1, msg_timeout=2000)
    await wire.send(encode_pub("t", b"x"))
    await wire.expect_ok()
    await wire.read_message()
    delivered = trio.current_time()
    again = await wire.read_message(timeout=60)
    assert delivered + 2.0 <= trio.current_time() < delivered + 2.0 + 2 * SCAN
    assert again.attempts == 2


async def test_wire_dpub_is_released_at_its_time(nsqd, autojump_clock):
    wire = await consumer(nsqd, "t", "c", rdy=1)
    sent = trio.current_time()
    await wire.send(encode_dpub("t", 5000, b"later"))
    await wire.expect_ok()
    message = await wire.read_message(timeout=60)
    assert sent + 5.0 <= trio.current_time() < sent + 5.0 + 2 * SCAN
    assert message.attempts == 1


@with_options(max_req_timeout=20.0)
async def test_wire_req_delay_and_clamp(nsqd, autojump_clock):
    wire = await consumer(nsqd, "t", "c", rdy=1)
    await wire.send(encode_pub("t", b"x"))
    await wire.expect_ok()
    message = await wire.read_message()
    sent = trio.current_time()
    await wire.send(encode_req(message.id, 7000))
    again = await wire.read_message(timeout=60)
    assert sent + 7.0 <= trio.current_time() < sent + 7.0 + 2 * SCAN
    assert again.attempts == 2
    # Beyond --max-req-timeout the delay is clamped to it, not refused.
    sent = trio.current_time()
    await wire.send(encode_req(again.id, 3_600_000))
    third = await wire.read_message(timeout=120)
    assert sent + 20.0 <= trio.current_time() < sent + 20.0 + 2 * SCAN
    assert third.attempts == 3


@with_options(msg_timeout=10.0)
async def test_wire_touch_extends_the_timeout(nsqd, autojump_clock):
    holder = await consumer(nsqd, "t", "c", rdy=1)
    await holder.send(encode_pub("t", b"x"))
    await holder.expect_ok()
    message = await holder.read_message()
    delivered = trio.current_time()
    # RDY 0 keeps the holder from being sent the message again when it times out.
    await holder.send(encode_rdy(0))
    waiting = await consumer(nsqd, "t", "c", rdy=1)
    await trio.sleep_until(delivered + 8.0)
    await holder.send(encode_touch(message.id))
    again = await waiting.read_message(timeout=60)
    assert delivered + 18.0 <= trio.current_time() < delivered + 18.0 + 2 * SCAN
    assert (again.id, again.attempts) == (message.id, 2)
    # The message now belongs to the other connection.
    await holder.send(encode_fin(message.id))
    await holder.expect_error(
        f"E_FIN_FAILED FIN {message.id.decode()} failed client does not own message", fatal=False
    )


@with_options(msg_timeout=10.0, max_msg_timeout=15.0)
async def test_wire_touch_is_capped_at_max_msg_timeout(nsqd, autojump_clock):
    holder = await consumer(nsqd, "t", "c", rdy=1)
    await holder.send(encode_pub("t", b"x"))
    await holder.expect_ok()
    message = await holder.read_message()
    delivered = trio.current_time()
    # RDY 0 keeps the holder from being sent the message again when it times out.
    await holder.send(encode_rdy(0))
    waiting = await consumer(nsqd, "t", "c", rdy=1)
    await trio.sleep_until(delivered + 8.0)
    await holder.send(encode_touch(message.id))
    await trio.sleep_until(delivered + 14.0)
    await holder.send(encode_touch(message.id))
    again = await waiting.read_message(timeout=60)
    # Not delivered + 24: a TOUCH never takes a message past delivery + --max-msg-timeout.
    assert delivered + 15.0 <= trio.current_time() < delivered + 15.0 + 2 * SCAN
    assert again.attempts == 2
    await holder.send(encode_touch(message.id))
    await holder.expect_error(
        f"E_TOUCH_FAILED TOUCH {message.id.decode()} failed client does not own message",
        fatal=False,
    )


async def test_wire_fin_after_timeout_fails_not_fatally(nsqd, autojump_clock):
    wire = await consumer(nsqd, "t", "c", rdy=1, msg_timeout=1000)
    await wire.send(encode_pub("t", b"x"))
    await wire.expect_ok()
    message = await wire.read_message()
    channel = nsqd.topics["t"].channels["c"]
    await wire.send(encode_rdy(0))
    await wait_until(lambda: channel.timeout_count == 1, timeout=60)
    await wire.send(encode_fin(message.id))
    await wire.expect_error(
        f"E_FIN_FAILED FIN {message.id.decode()} failed ID not in flight", fatal=False
    )


async def test_wire_silent_client_closed_at_twice_the_heartbeat(nsqd, autojump_clock):
    wire = await Wire.connect(nsqd, answer_heartbeats=False)
    await wire.identify(heartbeat_interval=1000)
    start = trio.current_time()
    await wire.expect_closed(timeout=60)
    assert start + 2.0 <= trio.current_time() < start + 2.0 + SCAN


async def test_wire_default_heartbeat_is_half_the_client_timeout(nsqd, autojump_clock):
    wire = await Wire.connect(nsqd, answer_heartbeats=False)
    start = trio.current_time()
    frame = await wire.read_frame(timeout=120)
    assert frame.data == b"_heartbeat_"
    assert trio.current_time() == pytest.approx(start + 30.0, abs=SCAN)
    await wire.expect_closed(timeout=120)
    assert trio.current_time() == pytest.approx(start + 60.0, abs=SCAN)


async def test_wire_client_answering_heartbeats_stays(nsqd, autojump_clock):
    wire = await Wire.connect(nsqd)
    await wire.identify(heartbeat_interval=1000)
    start = trio.current_time()
    with trio.move_on_after(60):
        await wire.read_message(timeout=120)
    assert trio.current_time() >= start + 60
    assert wire.heartbeats >= 59
    await wire.send(NOP + encode_pub("t", b"x"))
    await wire.expect_ok()


async def test_wire_nops_however_they_arrive_keep_the_connection_and_its_commands(nsqd):
    """An idle connection's NOPs are taken without waking its read loop (nsqd/idle_reads.py);
    NOPs cut across reads, and NOPs sent with a command, go the read loop's way: every one
    still counts, and nothing after them is lost."""
    wire = await Wire.connect(nsqd)
    await wire.identify(heartbeat_interval=1000)
    await wire.send(NOP * 3)
    await wire.send(b"NO")
    await wire.send(b"P\n" + NOP)
    await wire.send(NOP + encode_pub("t", b"with a nop before it"))
    await wire.expect_ok()
    await wire.send(encode_pub("t", b"x")[:5])
    await wire.send(encode_pub("t", b"x")[5:] + NOP + NOP)
    await wire.expect_ok()
    await wire.send(NOP)
    await wire.send(encode_pub("t", b"after the last nop"))
    await wire.expect_ok()
