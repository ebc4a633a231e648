"""What consumers of topics and channels can count on, seen from the wire (docs/protocol.md §2, Go's
channel.go and topic.go semantics).

Fan-out to every channel, sharing within a channel, RDY and in-flight limits, requeue and
attempts, in-flight timeouts of a client that went away, pause, #ephemeral lifetimes and the
`--mem-queue-size` bound with its diskqueue overflow. Absence ("nothing more was delivered") is
asserted after `trio.testing.wait_all_tasks_blocked()`: once every task of the in-process nsqd
is blocked, a message it was going to send is already in flight on the server and in our
socket buffer, so checking both is exact, with no sleeping.
"""

import os
import random

import pytest
import trio
import trio.testing

from nsqpy.common.command import (
    encode_dpub,
    encode_fin,
    encode_mpub,
    encode_pub,
    encode_rdy,
    encode_req,
)
from nsqpy.nsqd.topic import FAN_OUT_AFTER_ANSWER_FROM
from tests.nsqd.wire import Wire, close_all_wires, consumer, override_options, with_options
from tests.support.polling import wait_until


@pytest.fixture
def nsqd_options(nsqd_options, request):
    return override_options(nsqd_options, request)


@pytest.fixture(autouse=True)
async def close_connections():
    yield
    close_all_wires()


async def publish(nsqd, topic: str, bodies: list[bytes], batch: int = 200) -> None:
    """MPUB the bodies from a connection of their own, `batch` at a time."""
    wire = await Wire.connect(nsqd)
    for start in range(0, len(bodies), batch):
        await wire.send(encode_mpub(topic, bodies[start : start + batch]))
        await wire.expect_ok()
    await wire.aclose()


def bodies_of(count: int, prefix: bytes = b"m") -> list[bytes]:
    return [prefix + b"%d" % i for i in range(count)]


async def assert_nothing_more(wire: Wire) -> None:
    """No message beyond those already read reaches `wire` (see the module docstring)."""
    await trio.testing.wait_all_tasks_blocked()
    assert wire.pending_messages() == 0
    with trio.move_on_after(0.02):
        message = await wire.read_message()
        raise AssertionError(f"unexpected delivery: {message}")


async def drain(wire: Wire, count: int, timeout: float = 10) -> list:
    """Read and FIN `count` messages."""
    messages = []
    with trio.fail_after(timeout):
        while len(messages) < count:
            message = await wire.read_message()
            messages.append(message)
            await wire.send(encode_fin(message.id))
    return messages


def only_client(nsqd, topic: str, channel: str):
    (client,) = nsqd.topics[topic].channels[channel].clients.values()
    return client


# -- fan-out and sharing --------------------------------------------------------------------


async def test_every_channel_receives_every_message(nsqd):
    first = await consumer(nsqd, "t", "one", rdy=100)
    second = await consumer(nsqd, "t", "two", rdy=100)
    bodies = bodies_of(300)
    await publish(nsqd, "t", bodies)
    for wire in (first, second):
        received = await drain(wire, 300)
        assert sorted(m.body for m in received) == sorted(bodies)
        assert all(m.attempts == 1 for m in received)
    # Each channel has its own copy: same IDs, delivered independently.
    for name in ("one", "two"):
        channel = nsqd.topics["t"].channels[name]
        await wait_until(lambda channel=channel: len(channel.in_flight) == 0)
        assert channel.depth == 0 and channel.message_count == 300


async def test_consumers_of_one_channel_share_its_messages_exactly_once(nsqd):
    count = 600
    wires = [await consumer(nsqd, "t", "c", rdy=10) for _ in range(3)]
    received: list[tuple[int, bytes]] = []

    async def consume(index: int, wire: Wire) -> None:
        while True:
            message = await wire.read_message(timeout=30)
            received.append((index, message.body))
            await wire.send(encode_fin(message.id))

    async with trio.open_nursery() as nursery:
        for index, wire in enumerate(wires):
            nursery.start_soon(consume, index, wire)
        await publish(nsqd, "t", bodies_of(count))
        await wait_until(lambda: len(received) >= count)
        channel = nsqd.topics["t"].channels["c"]
        await wait_until(lambda: len(channel.in_flight) == 0)
        await trio.testing.wait_all_tasks_blocked()
        nursery.cancel_scope.cancel()
    bodies = [body for _, body in received]
    assert len(bodies) == count
    assert sorted(bodies) == sorted(bodies_of(count))
    assert channel.depth == 0
    assert sum(c.message_count for c in channel.clients.values()) == count


async def test_messages_published_before_any_channel_go_to_the_first_channel(nsqd):
    await publish(nsqd, "t", bodies_of(20))
    assert nsqd.topics["t"].depth == 20
    first = await consumer(nsqd, "t", "first", rdy=50)
    received = await drain(first, 20)
    assert sorted(m.body for m in received) == sorted(bodies_of(20))
    assert nsqd.topics["t"].depth == 0
    # A channel created later gets only what is published after it exists.
    later = await consumer(nsqd, "t", "later", rdy=50)
    assert nsqd.topics["t"].channels["later"].depth == 0
    await publish(nsqd, "t", [b"new"])
    assert [m.body for m in await drain(later, 1)] == [b"new"]
    assert [m.body for m in await drain(first, 1)] == [b"new"]
    await assert_nothing_more(later)


# -- RDY and in-flight limits ---------------------------------------------------------------


@pytest.mark.parametrize("rdy", [1, 5])
async def test_a_consumer_never_holds_more_unfinished_messages_than_its_rdy(nsqd, rdy):
    count = 60
    wire = await consumer(nsqd, "t", "c", rdy=rdy)
    await publish(nsqd, "t", bodies_of(count))
    rng = random.Random(rdy)
    outstanding = []
    received = 0
    full_checks = 0
    with trio.fail_after(20):
        while received < count:
            message = await wire.read_message()
            received += 1
            outstanding.append(message)
            # Received minus FINs sent bounds what nsqd holds in flight for us.
            assert len(outstanding) <= rdy
            if len(outstanding) == rdy and full_checks < 3:
                full_checks += 1
                await assert_nothing_more(wire)
                assert only_client(nsqd, "t", "c").in_flight_count == rdy
            if len(outstanding) == rdy or rng.random() < 0.3:
                finishing = rng.sample(outstanding, rng.randint(1, len(outstanding)))
                for message in finishing:
                    outstanding.remove(message)
                await wire.send(b"".join(encode_fin(m.id) for m in finishing))
    assert full_checks == 3


async def test_in_flight_across_connections_is_the_sum_of_their_rdy(nsqd):
    wires = [await consumer(nsqd, "t", "c", rdy=2) for _ in range(3)]
    await publish(nsqd, "t", bodies_of(20))
    channel = nsqd.topics["t"].channels["c"]
    await wait_until(lambda: len(channel.in_flight) == 6)
    held = [await wire.read_messages(2) for wire in wires]
    for wire in wires:
        await assert_nothing_more(wire)
    assert len(channel.in_flight) == 6 and channel.depth == 14
    assert all(c.in_flight_count == 2 for c in channel.clients.values())
    assert len({m.id for messages in held for m in messages}) == 6


async def test_rdy_zero_stops_delivery(nsqd):
    wire = await consumer(nsqd, "t", "c", rdy=3)
    await publish(nsqd, "t", bodies_of(10))
    first = await wire.read_messages(3)
    await wire.send(encode_rdy(0) + b"".join(encode_fin(m.id) for m in first))
    channel = nsqd.topics["t"].channels["c"]
    await wait_until(lambda: len(channel.in_flight) == 0)
    await assert_nothing_more(wire)
    assert channel.depth == 7
    await wire.send(encode_rdy(10))
    rest = await drain(wire, 7)
    assert sorted(m.body for m in first + rest) == sorted(bodies_of(10))


async def test_raising_rdy_delivers_more_at_once(nsqd):
    wire = await consumer(nsqd, "t", "c", rdy=1)
    await publish(nsqd, "t", bodies_of(5))
    await wire.read_message()
    await wire.send(encode_rdy(5))
    await wire.read_messages(4)
    await assert_nothing_more(wire)


# -- deferred, requeued and timed-out messages (real time, short) ---------------------------


async def test_dpub_arrives_no_earlier_than_its_defer(nsqd):
    wire = await consumer(nsqd, "t", "c", rdy=10)
    sent = trio.current_time()
    await wire.send(encode_dpub("t", 300, b"deferred") + encode_pub("t", b"immediate"))
    await wire.expect_ok()
    await wire.expect_ok()
    first = await wire.read_message()
    assert first.body == b"immediate"
    second = await wire.read_message()
    assert second.body == b"deferred" and second.attempts == 1
    assert trio.current_time() - sent >= 0.3
    channel = nsqd.topics["t"].channels["c"]
    assert len(channel.deferred) == 0


async def test_dpub_is_deferred_in_every_channel(nsqd):
    one = await consumer(nsqd, "t", "one", rdy=1)
    two = await consumer(nsqd, "t", "two", rdy=1)
    sent = trio.current_time()
    await one.send(encode_dpub("t", 200, b"later"))
    await one.expect_ok()
    for wire in (one, two):
        message = await wire.read_message()
        assert message.body == b"later"
        assert trio.current_time() - sent >= 0.2


async def test_req_with_delay_redelivers_after_it_with_attempts_incremented(nsqd):
    wire = await consumer(nsqd, "t", "c", rdy=10)
    await wire.send(encode_pub("t", b"x"))
    await wire.expect_ok()
    message = await wire.read_message()
    assert message.attempts == 1
    sent = trio.current_time()
    await wire.send(encode_req(message.id, 300))
    channel = nsqd.topics["t"].channels["c"]
    await wait_until(lambda: len(channel.deferred) == 1)
    again = await wire.read_message()
    assert trio.current_time() - sent >= 0.3
    assert (again.id, again.body, again.attempts) == (message.id, b"x", 2)
    await wire.send(encode_req(again.id, 0))
    third = await wire.read_message()
    assert third.attempts == 3
    assert channel.requeue_count == 2


async def test_attempts_are_counted_per_channel(nsqd):
    one = await consumer(nsqd, "t", "one", rdy=1)
    two = await consumer(nsqd, "t", "two", rdy=1)
    await one.send(encode_pub("t", b"x"))
    await one.expect_ok()
    first_one, first_two = await one.read_message(), await two.read_message()
    assert first_one.id == first_two.id
    assert (first_one.attempts, first_two.attempts) == (1, 1)
    await one.send(encode_req(first_one.id, 0))
    await two.send(encode_fin(first_two.id))
    again = await one.read_message()
    assert (again.id, again.attempts) == (first_one.id, 2)
    await one.send(encode_fin(again.id))
    await assert_nothing_more(two)
    for name in ("one", "two"):
        channel = nsqd.topics["t"].channels[name]
        await wait_until(lambda channel=channel: len(channel.in_flight) == 0)


async def test_a_disconnected_clients_messages_wait_for_their_msg_timeout(nsqd):
    leaving = await consumer(nsqd, "t", "c", rdy=5, msg_timeout=1000)
    sent = trio.current_time()
    await leaving.send(encode_mpub("t", [b"a", b"b"]))
    await leaving.expect_ok()
    held = await leaving.read_messages(2)
    staying = await consumer(nsqd, "t", "c", rdy=5)
    await leaving.aclose()
    channel = nsqd.topics["t"].channels["c"]
    await wait_until(lambda: len(channel.clients) == 1)
    # Go does not requeue on disconnect: the messages stay in flight until they time out.
    assert len(channel.in_flight) == 2
    redelivered = await staying.read_messages(2, timeout=5)
    assert trio.current_time() - sent >= 1.0
    assert sorted((m.id, m.attempts) for m in redelivered) == sorted((m.id, 2) for m in held)
    assert channel.timeout_count == 2


@with_options(msg_timeout=0.5)
async def test_msg_timeout_option_is_the_default_for_clients(nsqd):
    wire = await consumer(nsqd, "t", "c", rdy=1)
    await wire.send(encode_pub("t", b"x"))
    await wire.expect_ok()
    first = await wire.read_message()
    delivered = trio.current_time()
    again = await wire.read_message(timeout=5)
    assert trio.current_time() - delivered >= 0.45
    assert (again.id, again.attempts) == (first.id, 2)
    # The timed-out delivery can no longer be finished; the new one can.
    await wire.send(encode_fin(again.id))
    channel = nsqd.topics["t"].channels["c"]
    await wait_until(lambda: len(channel.in_flight) == 0)
    assert channel.timeout_count == 1


# -- pause ----------------------------------------------------------------------------------


async def test_paused_topic_holds_messages_until_unpaused(nsqd):
    wire = await consumer(nsqd, "t", "c", rdy=10)
    topic = nsqd.topics["t"]
    topic.pause()
    await publish(nsqd, "t", bodies_of(5))
    await assert_nothing_more(wire)
    assert topic.depth == 5 and topic.channels["c"].depth == 0
    topic.unpause()
    received = await drain(wire, 5)
    assert sorted(m.body for m in received) == sorted(bodies_of(5))
    assert topic.depth == 0


async def test_paused_channel_holds_messages_until_unpaused(nsqd):
    wire = await consumer(nsqd, "t", "c", rdy=10)
    other = await consumer(nsqd, "t", "other", rdy=10)
    channel = nsqd.topics["t"].channels["c"]
    channel.pause()
    await publish(nsqd, "t", bodies_of(5))
    # Only the paused channel holds back; the topic still fans out.
    await drain(other, 5)
    await assert_nothing_more(wire)
    assert channel.depth == 5 and len(channel.in_flight) == 0
    channel.unpause()
    received = await drain(wire, 5)
    assert sorted(m.body for m in received) == sorted(bodies_of(5))


async def test_pausing_a_channel_still_lets_in_flight_messages_finish(nsqd):
    wire = await consumer(nsqd, "t", "c", rdy=2)
    await publish(nsqd, "t", bodies_of(4))
    held = await wire.read_messages(2)
    channel = nsqd.topics["t"].channels["c"]
    channel.pause()
    await wire.send(b"".join(encode_fin(m.id) for m in held))
    await wait_until(lambda: len(channel.in_flight) == 0)
    await assert_nothing_more(wire)
    channel.unpause()
    await drain(wire, 2)


# -- #ephemeral -----------------------------------------------------------------------------


async def test_ephemeral_channel_goes_with_its_last_client(nsqd):
    first = await consumer(nsqd, "t", "c#ephemeral")
    second = await consumer(nsqd, "t", "c#ephemeral")
    topic = nsqd.topics["t"]
    await first.aclose()
    await wait_until(lambda: len(topic.channels["c#ephemeral"].clients) == 1)
    assert "c#ephemeral" in topic.channels
    await second.aclose()
    await wait_until(lambda: "c#ephemeral" not in topic.channels)
    # A normal topic stays when its ephemeral channel goes.
    assert nsqd.topics.get("t") is topic


async def test_ephemeral_topic_goes_with_its_last_channel(nsqd):
    one = await consumer(nsqd, "t#ephemeral", "one#ephemeral")
    two = await consumer(nsqd, "t#ephemeral", "two#ephemeral")
    topic = nsqd.topics["t#ephemeral"]
    await one.aclose()
    await wait_until(lambda: "one#ephemeral" not in topic.channels)
    assert nsqd.topics.get("t#ephemeral") is topic
    await two.aclose()
    await wait_until(lambda: "t#ephemeral" not in nsqd.topics)


async def test_ephemeral_topic_with_a_durable_channel_stays(nsqd):
    wire = await consumer(nsqd, "t#ephemeral", "durable")
    await wire.aclose()
    await wait_until(lambda: not nsqd.topics["t#ephemeral"].channels["durable"].clients)
    assert "t#ephemeral" in nsqd.topics


async def test_durable_channel_keeps_its_messages_without_clients(nsqd):
    wire = await consumer(nsqd, "t", "c", rdy=0)
    await wire.aclose()
    channel = nsqd.topics["t"].channels["c"]
    await wait_until(lambda: not channel.clients)
    await publish(nsqd, "t", bodies_of(3))
    assert channel.depth == 3
    back = await consumer(nsqd, "t", "c", rdy=3)
    assert sorted(m.body for m in await drain(back, 3)) == sorted(bodies_of(3))


@with_options(mem_queue_size=10)
async def test_ephemeral_channel_drops_what_memory_cannot_hold(nsqd):
    wire = await consumer(nsqd, "t", "c#ephemeral", rdy=0)
    await publish(nsqd, "t", bodies_of(50))
    channel = nsqd.topics["t"].channels["c#ephemeral"]
    assert channel.depth == 10 and channel.backend_depth == 0
    await wire.send(encode_rdy(50))
    await drain(wire, 10)
    await assert_nothing_more(wire)


# -- --mem-queue-size -----------------------------------------------------------------------


@with_options(mem_queue_size=10)
async def test_topic_without_channels_overflows_to_its_diskqueue(nsqd):
    bodies = bodies_of(1000)
    await publish(nsqd, "t", bodies)
    topic = nsqd.topics["t"]
    assert topic.depth == 1000
    assert topic.backend_depth == 990
    wire = await consumer(nsqd, "t", "c", rdy=100)
    received = await drain(wire, 1000, timeout=30)
    assert sorted(m.body for m in received) == sorted(bodies)
    assert topic.depth == 0
    channel = topic.channels["c"]
    await wait_until(lambda: len(channel.in_flight) == 0)
    assert channel.depth == 0 and channel.backend_depth == 0


@with_options(mem_queue_size=10)
async def test_channel_overflows_to_its_diskqueue(nsqd):
    wire = await consumer(nsqd, "t", "c", rdy=0)
    bodies = bodies_of(1000)
    await publish(nsqd, "t", bodies)
    channel = nsqd.topics["t"].channels["c"]
    assert channel.depth == 1000
    assert channel.backend_depth == 990
    assert nsqd.topics["t"].depth == 0
    await wire.send(encode_rdy(100))
    received = await drain(wire, 1000, timeout=30)
    assert sorted(m.body for m in received) == sorted(bodies)
    await wait_until(lambda: len(channel.in_flight) == 0)
    assert channel.depth == 0 and channel.backend_depth == 0


@with_options(mem_queue_size=10)
async def test_every_channel_of_an_mpub_that_overflows_delivers_the_same_messages(nsqd):
    """An MPUB's records are framed once for every channel that writes them: each channel,
    whatever memory it had left, delivers every message, with the same ID, timestamp and
    body, in the order published."""
    wires = [await consumer(nsqd, "t", f"c{n}", rdy=0) for n in range(3)]
    topic = nsqd.topics["t"]
    await publish(nsqd, "t", bodies_of(5), batch=5)  # c0..c2 keep these in memory
    await wires[1].send(encode_rdy(5))
    await drain(wires[1], 5)  # c1 has room again
    await wires[1].send(encode_rdy(0))
    (client,) = topic.channels["c1"].clients.values()
    await wait_until(lambda: client.ready_count == 0, "c1 takes no more")
    bodies = bodies_of(400)
    await publish(nsqd, "t", bodies, batch=100)
    assert [topic.channels[f"c{n}"].depth for n in range(3)] == [405, 400, 405]
    seen = []
    for wire in wires:
        await wire.send(encode_rdy(500))
        received = await drain(wire, 405 if wire is not wires[1] else 400, timeout=30)
        seen.append([(m.id, m.timestamp, m.body) for m in received][-400:])
    assert [body for _id, _ts, body in seen[0]] == bodies
    assert seen[0] == seen[1] == seen[2]


@with_options(mem_queue_size=0)
async def test_mem_queue_size_zero_sends_everything_through_disk(nsqd):
    wire = await consumer(nsqd, "t", "c", rdy=0)
    bodies = bodies_of(200)
    await publish(nsqd, "t", bodies[:100])
    channel = nsqd.topics["t"].channels["c"]
    assert channel.depth == 100 and channel.backend_depth == 100
    await wire.send(encode_rdy(30))
    await publish(nsqd, "t", bodies[100:])
    received = await drain(wire, 200, timeout=30)
    assert sorted(m.body for m in received) == sorted(bodies)
    await wait_until(lambda: len(channel.in_flight) == 0)
    assert channel.depth == 0


@with_options(mem_queue_size=0)
async def test_requeued_messages_go_through_disk_too(nsqd):
    wire = await consumer(nsqd, "t", "c", rdy=1)
    await publish(nsqd, "t", [b"x"])
    message = await wire.read_message()
    await wire.send(encode_rdy(0) + encode_req(message.id, 0))
    channel = nsqd.topics["t"].channels["c"]
    await wait_until(lambda: channel.backend_depth == 1)
    await wire.send(encode_rdy(1))
    again = await wire.read_message()
    assert (again.id, again.body, again.attempts) == (message.id, b"x", 2)


@pytest.mark.parametrize("deleted", ["topic", "channel"])
async def test_fins_a_consumer_sent_as_its_channel_went_meet_a_closed_connection(nsqd, deleted):
    """Go closes a deleted channel's consumers there and then: the FINs they had sent are never
    answered `E_FIN_FAILED ... not in flight`, the connection just ends (a topic made, used and
    deleted while its consumer finished messages made the churn soak's refused FINs)."""
    wire = await consumer(nsqd, "t", "c", rdy=10)
    nsqd.get_topic("t").publish([b"m%d" % number for number in range(10)])
    await nsqd.storage.commit()
    messages = await wire.read_messages(10)
    # The FINs are in nsqd's socket, unread, when the channel goes: written without yielding.
    fins = b"".join(encode_fin(message.id) for message in messages)
    assert os.write(wire.stream.socket.fileno(), fins) == len(fins)
    if deleted == "topic":
        nsqd.delete_topic("t")
    else:
        nsqd.get_topic("t").delete_channel("c")
    await wire.expect_closed()


@with_options(mem_queue_size=3)
async def test_a_topic_with_many_channels_answers_first_and_every_channel_gets_all_in_order(
    nsqd,
):
    """From FAN_OUT_AFTER_ANSWER_FROM channels a publish is answered once the topic holds it
    (its memory, past `--mem-queue-size` its diskqueue) and the topic's pump copies it to the
    channels after, as Go's does: every channel delivers every message once, in the order
    published, PUBs and MPUBs mixed, through the topic's diskqueue and their own."""
    topic = nsqd.get_topic("t")
    names = [f"c{number}" for number in range(FAN_OUT_AFTER_ANSWER_FROM)]
    for name in names:
        topic.get_channel(name)
    producer = await Wire.connect(nsqd)
    bodies = [b"m%d" % number for number in range(40)]
    commands = [
        encode_pub("t", bodies[0]),
        encode_mpub("t", bodies[1:11]),
        encode_pub("t", bodies[11]),
        encode_mpub("t", bodies[12:40]),
    ]
    await producer.send(*commands)
    for _ in commands:
        await producer.expect_ok()
    for name in (names[0], names[-1]):
        wire = await consumer(nsqd, "t", name, rdy=100)
        messages = await wire.read_messages(40)
        assert [message.body for message in messages] == bodies
        assert {message.attempts for message in messages} == {1}
        assert len({message.id for message in messages}) == 40
    await trio.testing.wait_all_tasks_blocked()
    assert topic.depth == 0
    assert all(topic.channels[name].message_count == 40 for name in names)


async def test_a_failing_pump_turn_is_logged_and_the_topic_goes_on(nsqd, caplog, autojump_clock):
    """A bug in a turn of the topic's pump (here one channel's copy raising once) is logged
    with its traceback, costs that turn's copy in that channel only, and the pump goes on a
    second later: the daemon, the topic and its other channels keep working."""
    topic = nsqd.get_topic("t")
    names = [f"c{number}" for number in range(FAN_OUT_AFTER_ANSWER_FROM)]
    for name in names:
        topic.get_channel(name)
    broken = topic.channels[names[-1]]
    failures = []

    def fail_once(messages, now, *, strict=False):
        if not failures:
            failures.append(messages)
            raise RuntimeError("a bug in a channel's copy")
        return type(broken).put_messages(broken, messages, now, strict=strict)

    broken.put_messages = fail_once
    producer = await Wire.connect(nsqd)
    await producer.send(encode_pub("t", b"first"))
    await producer.expect_ok()
    await wait_until(lambda: failures, timeout=10)
    assert "TOPIC(t): internal error in its pump" in caplog.text
    assert "a bug in a channel's copy" in caplog.text
    await producer.send(encode_pub("t", b"second"))
    await producer.expect_ok()
    first_channel = await consumer(nsqd, "t", names[0], rdy=10)
    assert [m.body for m in await first_channel.read_messages(2)] == [b"first", b"second"]
    last_channel = await consumer(nsqd, "t", names[-1], rdy=10)
    assert [m.body for m in await last_channel.read_messages(1, timeout=30)] == [b"second"]
