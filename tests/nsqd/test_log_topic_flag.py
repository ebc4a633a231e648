"""`--log-topic`: an unpartitioned topic stored as a log (docs/design.md §13). Classic clients
see a classic topic; its messages live in `<data>/<topic>/` as a partition-0 log, channels are
cursors (a restart redelivers what was not acknowledged, replay works), a diskqueue the topic
had before the flag named it moves into the log, and a log on disk stays a log when the flag
is dropped."""

import dataclasses
import os

from nsqpy.common.command import encode_mpub, encode_pub
from nsqpy.diskqueue import DiskQueue
from nsqpy.nsqd.message import Message
from nsqpy.nsqd.options import build_flags, options_from_values
from nsqpy.nsqd.server import NSQD
from tests.nsqd.wire import Wire, consumer
from tests.support.nsqd import running_nsqd
from tests.support.polling import wait_until


async def publish(nsqd: NSQD, topic: str, *bodies: bytes) -> None:
    wire = await Wire.connect(nsqd)
    if len(bodies) > 1:
        await wire.send(encode_mpub(topic, list(bodies)))
    else:
        await wire.send(encode_pub(topic, bodies[0]))
    await wire.expect_ok()
    await wire.aclose()


def test_the_flag_is_repeatable():
    values = build_flags().parse(["-log-topic=orders.*", "--log-topic", "audit"]).values
    assert options_from_values(values).log_topic == ["orders.*", "audit"]


async def test_a_matching_topic_is_a_log_and_others_stay_classic(nsqd_options):
    options = dataclasses.replace(nsqd_options, log_topic=["orders.*"])
    async with running_nsqd(options) as nsqd:
        await publish(nsqd, "orders.eu", b"one", b"two")
        await publish(nsqd, "plain", b"x")
        assert nsqd.get_topic("orders.eu").queue.retained is not None
        assert nsqd.get_topic("plain").queue.retained is None
        files = os.listdir(os.path.join(options.data_path, "orders.eu"))
        assert "orders.eu_0.commit.log" in files
        assert "orders.eu-0.diskqueue.000000.dat" in files
        assert not os.path.exists(os.path.join(options.data_path, "orders.eu.diskqueue.meta.dat"))
        # Classic consumers: a new channel starts at the end, as on every log topic.
        reader = await consumer(nsqd, "orders.eu", "c", rdy=10)
        await publish(nsqd, "orders.eu", b"three")
        (message,) = await reader.read_messages(1)
        assert message.body == b"three"
        assert len(message.id) == 16 and int(message.id, 16) > 0


async def test_unacknowledged_messages_come_again_after_a_restart(nsqd_options):
    options = dataclasses.replace(nsqd_options, log_topic=["*"])
    async with running_nsqd(options) as nsqd:
        reader = await consumer(nsqd, "t", "c", rdy=10)
        await publish(nsqd, "t", b"a", b"b", b"c")
        first, second, _third = await reader.read_messages(3)
        await reader.finish(first)
        await reader.finish(second)
        await reader.send(b"NOP\n")  # FINs are processed in order before the connection ends
        await reader.aclose()
        await wait_until(lambda: nsqd.get_topic("t").channels["c"].queue.confirmed.count == 2)
    async with running_nsqd(options) as nsqd:
        reader = await consumer(nsqd, "t", "c", rdy=10)
        (again,) = await reader.read_messages(1)
        assert again.body == b"c"
        assert again.attempts == 1


async def test_a_diskqueue_from_before_the_flag_moves_into_the_log(nsqd_options):
    async with running_nsqd(nsqd_options) as nsqd:
        await publish(nsqd, "t", b"kept-1", b"kept-2")  # no channel: in the topic's diskqueue
    assert os.path.exists(os.path.join(nsqd_options.data_path, "t.diskqueue.meta.dat"))
    options = dataclasses.replace(nsqd_options, log_topic=["t"])
    async with running_nsqd(options) as nsqd:
        assert nsqd.get_topic("t").queue.retained is not None
        assert not os.path.exists(os.path.join(options.data_path, "t.diskqueue.meta.dat"))
        reader = await consumer(nsqd, "t", "c", rdy=10)
        messages = await reader.read_messages(2)
        assert [m.body for m in messages] == [b"kept-1", b"kept-2"]


async def test_a_channel_diskqueue_from_before_the_flag_is_delivered_first(nsqd_options):
    queue = DiskQueue("t:c", nsqd_options.data_path, 1 << 20, 0, 1 << 20, 1)
    queue.put_many([Message(b"%016x" % 7, b"from-the-channel", 1).to_record()])
    queue.close()
    options = dataclasses.replace(nsqd_options, log_topic=["t"])
    async with running_nsqd(options) as nsqd:
        await publish(nsqd, "t", b"bootstrap")
        reader = await consumer(nsqd, "t", "c", rdy=10)
        (message,) = await reader.read_messages(1)
        assert message.body == b"from-the-channel"


async def test_a_log_on_disk_stays_a_log_without_the_flag(nsqd_options):
    options = dataclasses.replace(nsqd_options, log_topic=["t"])
    async with running_nsqd(options) as nsqd:
        await consumer(nsqd, "t", "c")
        await publish(nsqd, "t", b"in-the-log")
    async with running_nsqd(nsqd_options) as nsqd:
        topic = nsqd.get_topic("t")
        assert topic.queue.retained is not None
        reader = await consumer(nsqd, "t", "c", rdy=10)
        (message,) = await reader.read_messages(1)
        assert message.body == b"in-the-log"


async def test_ephemeral_topics_are_never_logs(nsqd_options):
    options = dataclasses.replace(nsqd_options, log_topic=["*"])
    async with running_nsqd(options) as nsqd:
        await publish(nsqd, "t#ephemeral", b"x")
        assert nsqd.get_topic("t#ephemeral").queue.retained is None
