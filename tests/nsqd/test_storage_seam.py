"""The seams between nsqd's layers, each tested on its own: the storage interface
(`nsqd/message_queue.py`), a channel's delivery policy (`nsqd/delivery.py`), the connection
dialects (`nsqd/dialect.py`) and IDENTIFY's negotiation into the client (`nsqd/identify.py`).

The wire behaviour behind each is tested over sockets elsewhere (tests/nsqd, tests/youzan);
these pin the contract another engine or dialect has to keep.
"""

import dataclasses
import errno
import json
import os

import pytest
import trio

from nsqpy.common.errors import ProtocolError
from nsqpy.common.frame import encode_message_frames
from nsqpy.common.message import decode_message
from nsqpy.diskqueue import DiskQueue
from nsqpy.nsqd.client import Client
from nsqpy.nsqd.delivery import FIFO, ORDERED
from nsqpy.nsqd.dialect import CLASSIC, YouzanDialect, message_key
from nsqpy.nsqd.identify import decode_identify, negotiate
from nsqpy.nsqd.message import RECORD_OVERHEAD, Message, MessageBatch, records_as_runs
from nsqpy.nsqd.message_queue import BufferedDiskQueue
from nsqpy.nsqd.server import NSQD


@pytest.fixture
def server(nsqd_options):
    """An nsqd that is never served, with room for two messages in memory."""
    server = NSQD(dataclasses.replace(nsqd_options, mem_queue_size=2))
    yield server
    for topic in server.topics.values():
        topic.close()


def messages(server: NSQD, *bodies: bytes) -> list[Message]:
    factory = server.get_topic("ids").queue
    return [Message(factory.next_id(), body, 0) for body in bodies]


def bodies(taken: list[Message]) -> list[bytes]:
    return [message.body for message in taken]


def buffered(server: NSQD, name: str = "q", *, ephemeral: bool = False) -> BufferedDiskQueue:
    return BufferedDiskQueue(
        server.storage,
        name,
        ephemeral=ephemeral,
        failure="QUEUE(%s) write failed",
        failure_args=(name,),
    )


class FullDisk:
    """A diskqueue whose every write fails as on a full disk; reads find nothing."""

    name = "full"
    depth = 0
    sync_due = False

    def put_many(self, records) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    def get_many(self, max_count: int) -> list[bytes]:
        return []


class CountingDiskQueue(DiskQueue):
    """A real diskqueue that counts its file writes, and fails them as a full disk does while
    `full` is set."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.writes = 0
        self.full = False

    def _write_bytes(self, buf, count) -> None:
        self.writes += 1
        if self.full:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        super()._write_bytes(buf, count)


def counting(server: NSQD, name: str) -> BufferedDiskQueue:
    """A queue with no room in memory, over a CountingDiskQueue."""
    queue = buffered(server, name)
    queue.mem_queue_size = 0
    options = server.options
    queue.backend = CountingDiskQueue(
        name,
        options.effective_data_path(),
        max_bytes_per_file=options.max_bytes_per_file,
        min_msg_size=26,
        max_msg_size=26 + options.max_msg_size,
        sync_every=options.sync_every,
        sync_timeout=options.sync_timeout,
    )
    return queue


# -- the storage interface: BufferedDiskQueue --------------------------------------------------


def test_messages_past_the_memory_bound_go_to_disk_and_come_back_in_order(server):
    queue = buffered(server)
    assert queue.append(messages(server, b"1", b"2", b"3", b"4", b"5")) is None
    assert (queue.depth, queue.backend_depth) == (5, 3)
    assert queue.has_messages()
    # Memory first (the first two), then the diskqueue.
    assert bodies(queue.take(4)) == [b"1", b"2", b"3", b"4"]
    assert bodies(queue.take(4)) == [b"5"]
    assert not queue.has_messages() and queue.take(1) == []


def test_a_strict_append_that_cannot_be_written_keeps_nothing(server):
    queue = buffered(server)
    queue.backend = FullDisk()
    with pytest.raises(Exception, match="no space left on device"):
        queue.append(messages(server, b"1", b"2", b"3"), strict=True)
    assert queue.depth == 0
    assert server.health != "OK"


def test_an_append_of_held_messages_that_cannot_be_written_keeps_them_in_memory(server):
    queue = buffered(server)
    queue.backend = FullDisk()
    error = queue.append(messages(server, b"1", b"2", b"3"))
    assert "no space left on device" in str(error)
    assert bodies(queue.take(5)) == [b"1", b"2", b"3"]


def test_publishes_of_a_pass_go_to_disk_with_one_write_when_it_ends(server):
    storage = server.storage
    queue = counting(server, "pass")
    with storage.deferring_writes():
        for body in (b"1", b"2", b"3"):
            assert queue.append(messages(server, body), strict=True) is None
            assert storage.take_deferred() is not None
        # Nothing reached the file yet, and nothing is in memory either.
        assert (queue.backend.writes, queue.backend.depth, queue.memory_count) == (0, 0, 0)
    assert (queue.backend.writes, queue.depth) == (1, 3)
    assert bodies(queue.take(5)) == [b"1", b"2", b"3"]


def test_outside_a_pass_and_for_messages_memory_holds_the_write_is_made_at_once(server):
    storage = server.storage
    queue = counting(server, "now")
    queue.append(messages(server, b"1"), strict=True)
    assert (queue.backend.writes, storage.take_deferred()) == (1, None)
    with storage.deferring_writes():
        # Not strict (held messages, a later channel's copy): kept in memory if the write
        # fails, so it is made at once.
        queue.append(messages(server, b"2"))
        assert (queue.backend.writes, storage.take_deferred()) == (2, None)


def test_a_failed_deferred_write_refuses_its_own_publishes_only(server, caplog):
    storage = server.storage
    full, fine = counting(server, "full"), counting(server, "fine")
    full.backend.full = True
    with storage.deferring_writes():
        full.append(messages(server, b"lost"), strict=True)
        refused = storage.take_deferred()
        fine.append(messages(server, b"kept"), strict=True)
        written = storage.take_deferred()
    assert refused is not None and written is not None
    assert refused.done and "no space left on device" in str(refused.error)
    assert written.done and written.error is None
    # Nothing of the refused publish is kept; the other queue's write is.
    assert (full.depth, bodies(fine.take(5))) == (0, [b"kept"])
    assert "QUEUE(full) write failed - write " in caplog.text
    # Health went NOK, and OK again with the next write that succeeded (as after any write).
    assert "health NOK - write " in caplog.text and server.health == "OK"


def test_put_back_goes_behind_what_waits_or_first(server):
    queue = buffered(server)
    one, two, three = messages(server, b"1", b"2", b"3")
    queue.append([one])
    queue.put_back([two])
    queue.put_back([three], first=True)
    assert bodies(queue.take(3)) == [b"3", b"1", b"2"]


def test_flush_keeps_what_waits_and_the_unacknowledged_on_disk(server):
    queue = buffered(server)
    waiting = messages(server, b"waits")
    in_flight = messages(server, b"in flight", b"deferred")
    queue.append(waiting)
    assert queue.flush(in_flight) == 3
    assert (queue.depth, queue.backend_depth) == (3, 3)
    queue.close()
    reopened = buffered(server)
    assert bodies(reopened.take(3)) == [b"waits", b"in flight", b"deferred"]
    reopened.close()


def test_skip_to_end_and_delete_drop_memory_and_disk(server):
    queue = buffered(server)
    queue.append(messages(server, b"1", b"2", b"3"))
    queue.skip_to_end()
    assert queue.depth == 0
    queue.append(messages(server, b"4", b"5", b"6"))
    files = os.listdir(server.options.data_path)
    assert any(name.startswith("q.diskqueue") for name in files)
    queue.delete()
    assert not any(name.startswith("q.diskqueue") for name in os.listdir(server.options.data_path))


async def test_an_ephemeral_queue_drops_past_memory_and_has_nothing_to_sync(server):
    queue = buffered(server, "q#ephemeral", ephemeral=True)
    queue.append(messages(server, b"1", b"2", b"3"))
    assert queue.depth == 2
    await queue.sync_dirty()
    assert not os.listdir(server.options.data_path)
    assert queue.flush([]) == 2  # accepted and dropped: an ephemeral name keeps nothing


async def test_topics_and_channels_hold_their_messages_through_the_interface(server):
    """Stats and the periodic sync see a topic through its queue and its channels' queues."""
    topic = server.get_topic("t")
    topic.publish([b"1", b"2", b"3"])  # no channel yet: the topic keeps them
    assert (topic.depth, topic.backend_depth) == (3, 1)
    channel = topic.get_channel("c")
    assert topic.queue.backend.dirty
    await topic.sync_dirty()
    assert not topic.queue.backend.dirty
    assert channel.depth == 0  # the topic's pump has not run


def batch(server: NSQD, *bodies: bytes, offset: int = 0) -> MessageBatch:
    factory = server.get_topic("ids").queue
    return MessageBatch(factory.next_ids(len(bodies)), list(bodies), 7, offset)


def test_a_batch_is_made_into_messages_as_it_is_taken(server):
    one_batch = batch(server, b"a", b"bb", b"ccc", offset=100)
    ids = list(one_batch.ids)
    first = one_batch.take(2)
    assert [(m.id, m.body, m.timestamp, m.attempts) for m in first] == [
        (ids[0], b"a", 7, 0),
        (ids[1], b"bb", 7, 0),
    ]
    assert [m.offset for m in first] == [100, 100 + RECORD_OVERHEAD + 1]
    assert len(one_batch) == 1
    [last] = one_batch.take(5)
    assert (last.body, last.offset) == (b"ccc", 100 + 2 * RECORD_OVERHEAD + 3)
    assert len(one_batch) == 0 and one_batch.take(1) == []


def test_each_view_of_a_batch_is_taken_on_its_own(server):
    one_batch = batch(server, b"1", b"2", b"3")
    one_batch.take(1)
    other = one_batch.view()
    assert bodies(other.take(5)) == [b"2", b"3"]
    assert bodies(one_batch.take(5)) == [b"2", b"3"]


def test_a_queue_counts_the_messages_of_its_batches_and_takes_across_them(server):
    queue = buffered(server)
    queue.mem_queue_size = 10
    queue.append(batch(server, b"1", b"2", b"3"))
    queue.append(messages(server, b"4"))
    queue.append(batch(server, b"5", b"6"))
    assert (queue.depth, queue.backend_depth) == (6, 0)
    assert bodies(queue.take(2)) == [b"1", b"2"]
    assert queue.depth == 4
    # The rest of the first batch, the lone message, part of the second.
    assert bodies(queue.take(3)) == [b"3", b"4", b"5"]
    queue.put_back(messages(server, b"again"), first=True)
    assert bodies(queue.take(10)) == [b"again", b"6"]
    assert queue.depth == 0 and not queue.has_messages()


def test_a_batch_past_the_memory_bound_goes_to_disk_in_order(server):
    queue = buffered(server)  # room for two
    one_batch = batch(server, b"1", b"2", b"3", b"4", b"5")
    assert queue.append(one_batch) is None
    assert (queue.depth, queue.backend_depth) == (5, 3)
    assert len(one_batch) == 5  # the publisher's batch is left as it was
    assert bodies(queue.take(5)) == [b"1", b"2", b"3", b"4", b"5"]


def test_flush_writes_the_batches_in_memory_to_disk(server):
    queue = buffered(server)
    queue.mem_queue_size = 10
    queue.append(batch(server, b"1", b"2"))
    queue.take(1)
    queue.append(messages(server, b"3"))
    assert queue.flush(messages(server, b"in flight")) == 3
    queue.close()
    reopened = buffered(server)
    assert bodies(reopened.take(5)) == [b"2", b"3", b"in flight"]
    reopened.close()


async def test_an_mpub_stays_one_batch_per_channel_until_delivered(server):
    topic = server.get_topic("b")
    first, second = topic.get_channel("one"), topic.get_channel("two")
    published = topic.publish([b"x", b"y"])
    assert isinstance(published, MessageBatch)
    for channel in (first, second):
        [queued] = channel.queue.memory
        assert isinstance(queued, MessageBatch) and channel.depth == 2
    # Each channel's messages are its own (attempts and in-flight state are per channel).
    taken_one, taken_two = first.take(2), second.take(2)
    assert bodies(taken_one) == bodies(taken_two) == [b"x", b"y"]
    assert all(a is not b for a, b in zip(taken_one, taken_two, strict=True))
    assert [m.id for m in taken_one] == [m.id for m in taken_two]
    assert topic.message_count == 2


def test_traced_and_deferred_publishes_are_messages(server):
    topic = server.get_topic("t")
    assert isinstance(topic.publish([b"1", b"2"], trace_ids=[1, 2]), list)
    assert isinstance(topic.publish([b"1", b"2"], defer=1.0), list)


# -- delivery policies ------------------------------------------------------------------------


def test_fifo_lets_out_what_rdy_allows_and_requeues_behind(server):
    queue = buffered(server)
    assert FIFO.room(in_flight=5, wanted=3) == 3
    assert not FIFO.keeps_in_flight(1.0)
    one, two = messages(server, b"1", b"2")
    queue.append([one])
    FIFO.redeliver(queue, [two])
    assert bodies(queue.take(2)) == [b"1", b"2"]


def test_ordered_lets_out_one_at_a_time_and_redelivers_first(server):
    queue = buffered(server)
    assert ORDERED.room(in_flight=0, wanted=3) == 1
    assert ORDERED.room(in_flight=1, wanted=3) == 0
    assert ORDERED.keeps_in_flight(1.0) and not ORDERED.keeps_in_flight(0)
    assert ORDERED.finish_releases_next
    one, two = messages(server, b"1", b"2")
    queue.append([one])
    ORDERED.redeliver(queue, [two])
    assert bodies(queue.take(2)) == [b"2", b"1"]


async def test_a_channel_switched_to_ordered_delivery_hands_out_one_in_flight(server):
    topic = server.get_topic("t")
    channel = topic.get_channel("c")
    topic.publish([b"1", b"2", b"3"])
    assert not channel.ordered
    channel.deliver_in_order()
    assert channel.ordered
    taken = channel.take(10)
    assert bodies(taken) == [b"1"]
    channel.start_in_flight(taken, client_id=7, timeout=60, now=0)
    assert channel.take(10) == []
    channel.finish(7, taken[0].id)
    assert bodies(channel.take(10)) == [b"2"]


# -- dialects ---------------------------------------------------------------------------------


def test_the_classic_dialect_takes_hex_ids_and_encodes_go_frames(server):
    (message,) = messages(server, b"body")
    assert CLASSIC.message_key([message.id], "FIN") == message.id
    with pytest.raises(ProtocolError, match="invalid message ID"):
        CLASSIC.message_key([b"short"], "FIN")
    assert CLASSIC.printed_id(message.id) == message.id.decode()
    assert CLASSIC.publish_errors_are_fatal
    client = Client(server.options, "127.0.0.1:1")
    frames = CLASSIC.encode_frames([message], client, server.get_topic("t"))
    assert frames == encode_message_frames([message])
    assert decode_message(frames[8:]).id == message.id


def test_the_youzan_dialect_maps_binary_ids_back_to_the_in_flight_key(server):
    (message,) = messages(server, b"body")
    message.trace_id = 99
    dialect = YouzanDialect()
    wire_id = int(message.id, 16).to_bytes(8, "big") + (99).to_bytes(8, "big")
    assert message_key(wire_id) == message.id
    assert dialect.message_key([wire_id], "REQ") == message.id
    with pytest.raises(ProtocolError, match="Invalid Message ID"):
        dialect.message_key([bytes(16)], "FIN")  # Youzan's FIN wants a positive internal id
    assert dialect.printed_id(wire_id) == "[" + " ".join(str(b) for b in wire_id) + "]"
    assert not dialect.publish_errors_are_fatal
    client = Client(server.options, "127.0.0.1:1")
    frame = dialect.encode_frames([message], client, server.get_topic("t"))
    # [size][type][timestamp][attempts][internal id][trace id][body]
    assert frame[16:18] == b"\x00\x00" and frame[18:34] == wire_id and frame[34:] == b"body"
    dialect.detail = True
    with_detail = dialect.encode_frames([message], client, server.get_topic("t"))
    assert len(with_detail) == len(frame) + 12


# -- IDENTIFY negotiated into the client ------------------------------------------------------


def test_identify_settings_land_in_the_client(server):
    client = Client(server.options, "127.0.0.1:1")
    data = decode_identify(
        json.dumps(
            {"client_id": "a", "heartbeat_interval": 5000, "msg_timeout": 2000, "desired_tag": "x"}
        ).encode()
    )
    assert negotiate(client, data, server.options, tls_available=False, auth_required=False) is None
    assert (client.client_id, client.heartbeat_interval, client.msg_timeout) == ("a", 5.0, 2.0)
    assert client.asked_for_youzan and client.desired_tag == "x" and not client.extend_support


def test_identify_negotiation_replies_with_what_was_agreed(server):
    client = Client(server.options, "127.0.0.1:1")
    data = decode_identify(b'{"feature_negotiation":true,"snappy":true,"tls_v1":true}')
    negotiated = negotiate(client, data, server.options, tls_available=False, auth_required=True)
    reply = json.loads(negotiated.reply)
    assert (reply["snappy"], reply["tls_v1"], reply["auth_required"]) == (True, False, True)
    assert negotiated.upgrades and negotiated.snappy and not negotiated.tls


def test_an_out_of_range_identify_setting_is_refused_with_go_text(server):
    client = Client(server.options, "127.0.0.1:1")
    data = decode_identify(b'{"sample_rate":100}')
    with pytest.raises(ProtocolError, match=r"IDENTIFY sample rate \(100\) is invalid"):
        negotiate(client, data, server.options, tls_available=False, auth_required=False)


def test_a_topics_diskqueue_records_come_back_as_the_publishes_they_were():
    """The topic's pump reads its diskqueue as runs: an MPUB's fresh records (one timestamp)
    as one MessageBatch the channels share, anything else (a lone one, a requeued one with
    attempts) as Messages, in the order written."""
    records = [
        Message(b"%016d" % number, b"body%d" % number, timestamp, attempts).to_record()
        for number, timestamp, attempts in [
            (0, 5, 0),
            (1, 5, 0),
            (2, 5, 0),
            (3, 6, 0),
            (4, 6, 2),
            (5, 7, 0),
            (6, 7, 0),
        ]
    ]
    runs = records_as_runs(records)
    kinds = [type(run).__name__ for run in runs]
    assert kinds == ["MessageBatch", "list", "list", "MessageBatch"]
    taken = [run.take(len(run)) if isinstance(run, MessageBatch) else run for run in runs]
    assert [[(m.id, m.body, m.timestamp, m.attempts) for m in run] for run in taken] == [
        [(b"%016d" % n, b"body%d" % n, 5, 0) for n in (0, 1, 2)],
        [(b"%016d" % 3, b"body3", 6, 0)],
        [(b"%016d" % 4, b"body4", 6, 2)],
        [(b"%016d" % n, b"body%d" % n, 7, 0) for n in (5, 6)],
    ]
    assert records_as_runs([]) == []


async def test_a_commit_that_finds_the_queues_taken_waits_for_their_fsyncs(nsqd_options):
    """A commit takes the queues written since the last one and fsyncs them side by side; a
    second commit that begins meanwhile finds nothing left to take and still returns only once
    those fsyncs are done (and their metadata written): what it answers may be in them. Each
    fsync is registered as the first commit begins, not when its own task first runs (trio
    runs the two commits in either order; thirty tries see both)."""
    server = NSQD(dataclasses.replace(nsqd_options, mem_queue_size=0, sync_every=1))
    storage = server.storage
    data_path = server.options.effective_data_path()
    for attempt in range(30):
        names = (f"first{attempt}", f"second{attempt}")
        for name in names:
            assert buffered(server, name).append(messages(server, name.encode())) is None
        async with trio.open_nursery() as nursery:
            nursery.start_soon(storage.commit)
            await trio.lowlevel.checkpoint()
            await storage.commit()
            for name in names:
                path = os.path.join(data_path, f"{name}.diskqueue.meta.dat")
                assert os.path.exists(path), f"try {attempt}: {name} answered before its fsync"
