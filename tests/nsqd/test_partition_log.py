"""The partition log on real files: Youzan's layout, IDs and offsets across reopening, segment and
index rolling at their boundaries, torn-tail recovery, and the channel cursor over it."""

import math
import os
import struct

import pytest

from nsqpy.nsqd.cursor_queue import CursorQueue
from nsqpy.nsqd.message import Message
from nsqpy.partition_log import (
    BODY_START,
    ENTRY,
    ID_PARTITION_SHIFT,
    META_MAGIC,
    READ_CHUNK,
    PartitionLog,
    Position,
    ProducerMark,
    record_size,
)
from nsqpy.partition_log.view import LogView, group_fault


def _never_paused() -> bool:
    return False


def open_log(path, **changes) -> PartitionLog:
    settings = {"max_bytes_per_file": 1 << 20, "sync_every": 1, "partition": 2}
    settings.update(changes)
    partition = settings.pop("partition")
    return PartitionLog(str(path), "t", partition, message_type=Message, **settings)


def publish(log: PartitionLog, *bodies: bytes, trace: int = 0) -> list[Message]:
    ids = log.next_ids(len(bodies))
    messages = [
        Message(mid, body, 1_000 + i) for i, (mid, body) in enumerate(zip(ids, bodies, strict=True))
    ]
    for message in messages:
        message.trace_id = trace
    log.append(messages)
    log.commit()
    return messages


def entries(log: PartitionLog) -> list[tuple]:
    with open(log.index_path(), "rb") as file:
        data = file.read()
    return [ENTRY.unpack_from(data, at) for at in range(0, len(data), ENTRY.size)]


def test_files_ids_and_index_entries_are_youzans(tmp_path):
    log = open_log(tmp_path)
    first = publish(log, b"a", b"bb")
    second = publish(log, b"ccc", trace=7)
    base = 2 << ID_PARTITION_SHIFT
    assert [int(m.id, 16) for m in first + second] == [base + 1, base + 2, base + 3]
    # Offsets count size prefixes: 4 + 26-byte header + body.
    assert [m.offset for m in first + second] == [0, 31, 63]
    assert [m.count for m in first + second] == [0, 1, 2]
    assert entries(log) == [
        (base + 1, 0, base + 2, 0, 63, 1, 2),
        (base + 3, 0, base + 3, 63, 33, 3, 1),
    ]
    log.sync()
    names = sorted(os.listdir(tmp_path / "t"))
    assert names == [
        "t-2.diskqueue.000000.dat",
        "t-2.diskqueue.meta.writer.dat",
        "t_2.commit.log",
    ]
    with open(tmp_path / "t" / "t-2.diskqueue.meta.writer.dat", "rb") as file:
        assert file.read() == b"3\n0,96,96\n" + META_MAGIC
    with open(tmp_path / "t" / "t-2.diskqueue.000000.dat", "rb") as file:
        data = file.read()
    # [4 size][8 ts][2 attempts][8 id][8 trace id][body]
    size, ts, attempts, internal_id, trace = struct.unpack_from(">IqHQQ", data, 63)
    assert (size, ts, attempts, internal_id, trace) == (29, 1_000, 0, base + 3, 7)
    assert data[63 + 30 :] == b"ccc"
    log.close()


def test_ids_offsets_and_messages_survive_reopening(tmp_path):
    log = open_log(tmp_path)
    published = publish(log, b"one", b"two")
    log.close()
    again = open_log(tmp_path)
    assert again.end == Position(published[-1].offset + 33, 2)
    (third,) = publish(again, b"three")
    assert int(third.id, 16) == int(published[-1].id, 16) + 1
    read = again.read(Position(0, 0), 10)
    assert [(m.body, m.offset, m.count, m.id) for m in read] == [
        (b"one", 0, 0, published[0].id),
        (b"two", 33, 1, published[1].id),
        (b"three", 66, 2, third.id),
    ]
    again.close()


def test_segments_roll_at_max_bytes_and_reads_cross_them(tmp_path):
    log = open_log(tmp_path, max_bytes_per_file=100)
    bodies = [bytes([65 + i]) * 40 for i in range(6)]  # 70-byte records: a roll every 2
    for body in bodies:
        publish(log, body)
    names = sorted(n for n in os.listdir(tmp_path / "t") if n.endswith(".dat"))
    assert "t-2.diskqueue.000000.dat.offsetmeta.dat" in names
    assert "t-2.diskqueue.000002.dat" in names
    with open(tmp_path / "t" / "t-2.diskqueue.000000.dat.offsetmeta.dat", "rb") as file:
        assert file.read() == b"2\n0,140\n"
    log.close()
    reopened = open_log(tmp_path, max_bytes_per_file=100)
    # From disk (a fresh log has no hot tail), across every segment.
    assert [m.body for m in reopened.read(Position(0, 0), 10)] == bodies
    assert [m.body for m in reopened.read(Position(140, 2), 1)] == [bodies[2]]
    reopened.close()


def test_a_record_whose_header_crosses_the_read_chunks_end_is_read_whole(tmp_path):
    log = open_log(tmp_path)
    # The first record ends 10 bytes before READ_CHUNK: the second's 30-byte header crosses it.
    bodies = [b"a" * (READ_CHUNK - 10 - BODY_START), b"second", b"third"]
    publish(log, *bodies)
    log.close()
    reopened = open_log(tmp_path)  # no hot tail: every read comes from the segment
    assert [m.body for m in reopened.read(Position(0, 0), 10)] == bodies
    second = reopened.read(Position(READ_CHUNK - 10, 1), 10)
    assert [m.body for m in second] == bodies[1:]
    reopened.close()


def test_the_magic_code_is_youzans_file_and_goes_with_the_log(tmp_path):
    log = open_log(tmp_path)
    assert log.magic_code == 0
    log.set_magic_code(1_700_000_000_123_456_789)
    assert (tmp_path / "t" / "magic2").read_bytes() == b"1700000000123456789\n"
    log.close()
    reopened = open_log(tmp_path)
    assert reopened.magic_code == 1_700_000_000_123_456_789
    reopened.delete()
    assert not (tmp_path / "t" / "magic2").exists()


def test_the_index_rolls_into_numbered_files_and_reopens(tmp_path):
    log = open_log(tmp_path, index_entries_per_file=3)
    for i in range(7):
        publish(log, b"m%d" % i)
    log.close()
    directory = tmp_path / "t"
    assert sorted(n for n in os.listdir(directory) if "commit.log" in n) == [
        "t_2.commit.log",
        "t_2.commit.log.00000000",
        "t_2.commit.log.00000001",
        "t_2.commit.log.current",
    ]
    assert (directory / "t_2.commit.log.current").read_bytes() == b"2\n"
    reopened = open_log(tmp_path, index_entries_per_file=3)
    assert reopened.end.count == 7
    (after,) = publish(reopened, b"m7")
    assert after.count == 7
    reopened.close()


def test_a_torn_tail_is_cut_back_to_the_last_index_entry(tmp_path, caplog):
    log = open_log(tmp_path)
    publish(log, b"kept")
    log.close()
    segment = tmp_path / "t" / "t-2.diskqueue.000000.dat"
    with open(segment, "ab") as file:
        file.write(b"\x00\x00\x00\x40garbage that no index entry covers")
    with open(tmp_path / "t" / "t_2.commit.log", "ab") as file:
        file.write(b"\x01" * 20)  # a torn index entry too
    reopened = open_log(tmp_path)
    assert "cut the data back to the last complete index entry" in caplog.text
    assert os.path.getsize(segment) == 34
    assert os.path.getsize(tmp_path / "t" / "t_2.commit.log") == ENTRY.size
    (next_message,) = publish(reopened, b"next")
    assert [m.body for m in reopened.read(Position(0, 0), 5)] == [b"kept", b"next"]
    assert next_message.offset == 34
    reopened.close()


def test_index_entries_past_the_data_are_dropped(tmp_path):
    log = open_log(tmp_path)
    publish(log, b"first")
    publish(log, b"second")
    log.close()
    segment = tmp_path / "t" / "t-2.diskqueue.000000.dat"
    os.truncate(segment, 35 + 10)  # power loss: the second record is short, its entry there
    reopened = open_log(tmp_path)
    assert reopened.end == Position(35, 1)
    assert os.path.getsize(segment) == 35
    assert [m.body for m in reopened.read(Position(0, 0), 5)] == [b"first"]
    reopened.close()


# -- the cursor ------------------------------------------------------------------------------


def cursor(log: PartitionLog, name: str = "c", window: int = 500) -> CursorQueue:
    return CursorQueue(None, log, name, window, paused=_never_paused)


def test_a_new_channel_starts_at_the_end(tmp_path):
    log = open_log(tmp_path)
    publish(log, b"before")
    channel = cursor(log)
    assert channel.take(5) == [] and channel.depth == 0
    publish(log, b"after")
    assert [m.body for m in channel.take(5)] == [b"after"]
    log.close()


def test_out_of_order_fins_move_confirmed_only_when_the_gap_closes(tmp_path):
    log = open_log(tmp_path)
    channel = cursor(log)
    published = publish(log, b"0", b"1", b"2", b"3")
    taken = channel.take(4)
    size = record_size(taken[0], False)
    channel.acknowledge(taken[2])
    channel.acknowledge(taken[1])
    assert channel.confirmed == Position(0, 0)
    channel.acknowledge(taken[0])
    assert channel.confirmed == Position(3 * size, 3)
    channel.acknowledge(taken[3])
    assert channel.confirmed == log.end
    assert channel.lag == 0 and len(published) == 4
    log.close()


def test_delivery_resumes_at_the_persisted_confirmed_position_past_acknowledged_ranges(tmp_path):
    log = open_log(tmp_path)
    channel = cursor(log)
    publish(log, b"0", b"1", b"2")
    taken = channel.take(3)
    channel.acknowledge(taken[0])
    channel.acknowledge(taken[2])  # out of order: kept with the cursor, not delivered again
    channel.flush([])
    log.close()
    reopened = open_log(tmp_path)
    again = cursor(reopened)
    assert [m.body for m in again.take(5)] == [b"1"]
    reopened.close()


def test_the_window_stops_reading_until_the_gaps_close(tmp_path):
    log = open_log(tmp_path)
    channel = cursor(log, window=2)
    publish(log, *[b"%d" % i for i in range(10)])
    taken = channel.take(7)
    for message in taken[1::2]:  # 1, 3, 5: three separate ranges beyond confirmed
        channel.acknowledge(message)
    assert channel.take(3) == []
    channel.acknowledge(taken[0])
    channel.acknowledge(taken[2])  # ranges merge into confirmed: one range left
    assert [m.body for m in channel.take(3)] == [b"7", b"8", b"9"]
    log.close()


def test_requeued_messages_go_out_before_new_reads(tmp_path):
    log = open_log(tmp_path)
    channel = cursor(log)
    publish(log, b"0", b"1", b"2")
    first = channel.take(1)
    channel.put_back(first)
    assert [m.body for m in channel.take(5)] == [b"0", b"1", b"2"]
    log.close()


def test_set_position_replays(tmp_path):
    log = open_log(tmp_path)
    channel = cursor(log)
    publish(log, b"0", b"1", b"2")
    for message in channel.take(3):
        channel.acknowledge(message)
    channel.set_position(log.position_of_count(1))
    assert [m.body for m in channel.take(5)] == [b"1", b"2"]
    channel.set_position(log.search_timestamp(1_002))
    assert [m.body for m in channel.take(5)] == [b"2"]
    channel.set_position(log.position_at_or_after(1))
    assert [m.body for m in channel.take(5)] == [b"1", b"2"]
    log.close()


@pytest.mark.parametrize("ext_header", [b"", b'{"k":"v"}'])
def test_ext_records_keep_their_header(tmp_path, ext_header):
    log = open_log(tmp_path, ext=True)
    (mid,) = log.next_ids(1)
    message = Message(mid, b"body", 5)
    message.ext_header = ext_header
    log.append([message])
    log.commit()
    log.close()
    reopened = open_log(tmp_path, ext=True)
    (read,) = reopened.read(Position(0, 0), 1)
    assert (read.body, read.ext_header, read.attempts) == (b"body", ext_header, 0)
    assert reopened.end.offset == record_size(message, True)
    reopened.close()


@pytest.mark.parametrize("ext", [False, True])
def test_a_publish_carries_its_producer_on_its_last_record(tmp_path, ext):
    """Readers see the bodies as stored without the mark (the Spark source's reader:
    tests/spark/test_log_records.py); `producer_state` finds it."""
    log = open_log(tmp_path, ext=ext)
    messages = [
        Message(mid, body, 5_000_000_000)
        for mid, body in zip(log.next_ids(3), (b"a", b"bb", b"ccc"), strict=True)
    ]
    messages[2].ext_header = b'{"k":"v"}'
    log.append(messages[:1])
    log.append(messages[1:], ProducerMark(b"spark-q-b1-p0", 41))
    log.commit()
    read = log.read(Position(0, 0), 5)
    assert [(m.body, m.attempts) for m in read] == [(b"a", 0), (b"bb", 0), (b"ccc", 0)]
    assert read[2].ext_header == (b'{"k":"v"}' if ext else b"")
    assert log.producer_state(0) == {b"spark-q-b1-p0": (41, 5_000_000_000)}
    log.close()


# -- retention -------------------------------------------------------------------------------


def test_retention_removes_only_segments_every_channel_confirmed(tmp_path):
    log = open_log(tmp_path, max_bytes_per_file=100)
    bodies = [bytes([65 + i]) * 40 for i in range(6)]  # 70-byte records: 140-byte segments
    for body in bodies:
        publish(log, body)
    assert log.clean(0, keep_bytes=-1, older_than=math.inf) == 0  # nothing consumed
    assert log.clean(150, keep_bytes=-1, older_than=math.inf) == 1  # segment 0 only
    assert log.start == Position(140, 2)
    assert not (tmp_path / "t" / "t-2.diskqueue.000000.dat").exists()
    # Consumed but young and within the size budget: kept.
    assert log.clean(420, keep_bytes=10_000, older_than=0) == 0
    # Beyond the size budget: the oldest consumed segments go until it fits.
    assert log.clean(420, keep_bytes=150, older_than=0) == 1
    assert log.start == Position(280, 4)
    log.close()
    reopened = open_log(tmp_path, max_bytes_per_file=100)
    assert reopened.start == Position(280, 4)
    assert [m.body for m in reopened.read(reopened.start, 10)] == bodies[4:]
    with pytest.raises(ValueError, match="before the start"):
        reopened.position_for("virtual_queue", 0)
    assert reopened.position_for("msgcount", 5) == Position(350, 5)
    reopened.close()


def test_searches_use_the_index_across_rolled_files(tmp_path):
    log = open_log(tmp_path, index_entries_per_file=4)
    published = []
    for i in range(20):
        message = Message(log.next_ids(1)[0], b"m%02d" % i, 1_000 * i)
        log.append([message])
        log.commit()
        published.append(message)
    for i in (0, 7, 13, 19):
        target = published[i]
        assert log.position_of_count(i) == Position(target.offset, i)
        assert log.position_at_or_after(target.offset - 1) == Position(target.offset, i)
        assert log.search_timestamp(1_000 * i - 1) == Position(target.offset, i)
    assert log.search_timestamp(10**12) == log.end
    data, following = log.read_raw(Position(published[3].offset, 3), log.end.offset, 1)
    assert following == Position(published[4].offset, 4)
    assert data[30:] == b"m03"
    log.close()


def test_a_deleted_log_never_writes_to_its_old_descriptors(tmp_path):
    """Found by the HTTP fuzzer: a topic deleted between a publish and nsqd's commit had its
    index entry written to whatever reused the descriptor's number (an HTTP connection)."""
    log = open_log(tmp_path)
    (message_id,) = log.next_ids(1)
    log.append([Message(message_id, b"x", 0)])
    log.delete()
    read_end, write_end = os.pipe()  # the lowest free numbers: the log's old descriptors
    try:
        log.commit()
        assert log.prepare_sync()() is True
        os.set_blocking(read_end, False)
        with pytest.raises(BlockingIOError):
            os.read(read_end, 100)
        with pytest.raises(OSError, match="closed"):
            log.append([Message(log.next_ids(1)[0], b"y", 0)])
    finally:
        os.close(read_end)
        os.close(write_end)


def test_an_unreadable_record_is_skipped_to_the_next_segment(tmp_path, caplog):
    """A record whose size cannot be right (bit rot, a bad disk) does not stop its channel:
    what came before it is delivered, then one ERROR line, then the next segment. The skipped
    messages count as acknowledged, so the confirmed position passes them."""
    log = open_log(tmp_path, max_bytes_per_file=100)
    bodies = [bytes([65 + i]) * 40 for i in range(6)]  # 70-byte records, 2 per segment
    for body in bodies:
        publish(log, body)
    log.close()
    with open(tmp_path / "t" / "t-2.diskqueue.000001.dat", "r+b") as segment:
        segment.seek(70)  # the fourth record's size prefix
        segment.write(struct.pack(">I", 5))
    reopened = open_log(tmp_path, max_bytes_per_file=100)
    channel = cursor(reopened)
    channel.set_position(reopened.start)
    first = channel.take(10)
    assert [m.body for m in first] == bodies[:3]
    # The take read on into the bad record, and skipped it.
    assert "skipping offsets 210-280 (1 messages)" in caplog.text
    rest = channel.take(10)
    assert [m.body for m in rest] == bodies[4:]
    for message in first + rest:
        channel.acknowledge(message)
    assert channel.confirmed == reopened.end
    reopened.close()


# -- group commit ----------------------------------------------------------------------------


def messages_for(log: PartitionLog, *bodies: bytes) -> list[Message]:
    ids = log.next_ids(len(bodies))
    return [Message(mid, body, 1_000) for mid, body in zip(ids, bodies, strict=True)]


def test_appends_are_written_by_the_commit_as_one_group(tmp_path):
    """Three publishes appended between two commits: nothing on disk and nothing readable
    until the commit, then one write and one index entry for all of them."""
    log = open_log(tmp_path)
    segment = tmp_path / "t" / "t-2.diskqueue.000000.dat"
    for body in (b"a", b"bb", b"ccc"):
        log.append(messages_for(log, body))
    assert log.has_pending and log.end == Position(0, 0)
    assert log.appended == Position(3 * 30 + 6, 3)
    assert segment.stat().st_size == 0 and log.read(Position(0, 0), 10) == []
    log.commit()
    assert not log.has_pending
    assert log.end == log.appended and segment.stat().st_size == 96
    assert [m.body for m in log.read(Position(0, 0), 10)] == [b"a", b"bb", b"ccc"]
    ((first_id, _epoch, last_id, offset, size, first_count, count),) = entries(log)
    assert (offset, size, first_count, count) == (0, 96, 1, 3)
    assert last_id - first_id == 2
    log.close()


def test_a_failed_group_write_keeps_nothing_of_the_group(tmp_path):
    """The write of a group fails (here: its descriptor cannot be written): the file is as
    before, readers and the index never see the group, and the next group takes its offsets."""
    log = open_log(tmp_path)
    publish(log, b"kept")
    before = log.end
    log.append(messages_for(log, b"lost-1", b"lost-2"))
    writable = log._write_fd
    log._write_fd = os.open(log.segment_path(0), os.O_RDONLY)
    try:
        with pytest.raises(OSError):
            log.commit()
    finally:
        os.close(log._write_fd)
        log._write_fd = writable
    assert not log.has_pending and log.end == log.appended == before
    assert len(entries(log)) == 1
    (retried,) = publish(log, b"again")
    assert retried.offset == before.offset
    log.close()
    reopened = open_log(tmp_path)
    assert [m.body for m in reopened.read(Position(0, 0), 10)] == [b"kept", b"again"]
    reopened.close()


# -- replication primitives --------------------------------------------------------------------


def files_of(path) -> dict[str, bytes]:
    return {name: (path / "t" / name).read_bytes() for name in sorted(os.listdir(path / "t"))}


def test_a_follower_writes_its_leaders_groups_byte_for_byte(tmp_path):
    leader = open_log(tmp_path / "leader", max_bytes_per_file=150)
    follower = open_log(tmp_path / "follower", max_bytes_per_file=150)
    leader.write_epoch = 3
    for bodies in ([b"a" * 40, b"b" * 40], [b"c" * 40], [b"d" * 40, b"e" * 40, b"f" * 40]):
        leader.append(messages_for(leader, *bodies))
        entry, data = leader.commit(visible=False)
        # Readers of the leader wait for the followers.
        assert leader.end.offset == entry[3] and leader.written.offset == entry[3] + entry[4]
        follower.append_raw(entry, data)
        leader.make_visible(leader.written)
    assert leader.end == follower.end == follower.written == leader.written
    assert follower.last_id == leader.last_id
    assert entries(follower) == entries(leader) and entries(leader)[0][1] == 3
    leader.close()
    follower.close()
    leader_files = files_of(tmp_path / "leader")
    follower_files = files_of(tmp_path / "follower")
    assert [name for name in leader_files if "offsetmeta" in name]  # a segment rolled
    data_files = [name for name in leader_files if ".dat" in name and "meta" not in name]
    for name in [*data_files, "t_2.commit.log"]:
        assert follower_files[name] == leader_files[name], name


def test_a_follower_refuses_a_group_that_does_not_follow_its_end(tmp_path):
    leader = open_log(tmp_path / "leader")
    follower = open_log(tmp_path / "follower")
    leader.append(messages_for(leader, b"one"))
    leader.commit()
    leader.append(messages_for(leader, b"two"))
    entry, data = leader.commit()
    with pytest.raises(ValueError, match="does not follow"):
        follower.append_raw(entry, data)
    with pytest.raises(ValueError, match="bytes says"):
        follower.append_raw((*entry[:3], 0, len(data) + 1, 1, 1), data)
    assert follower.written == Position(0, 0) and entries(follower) == []
    leader.close()
    follower.close()


def test_catch_up_pulls_entries_and_their_bytes_and_cuts_a_divergent_tail(tmp_path):
    """A follower that took a group its old leader never got acknowledged: it finds where its
    log and the new leader's part, cuts its own back there and pulls the rest."""
    leader = open_log(tmp_path / "leader")
    follower = open_log(tmp_path / "follower")
    for body in (b"shared-1", b"shared-2"):
        leader.append(messages_for(leader, body))
        follower.append_raw(*leader.commit())
    shared = leader.written
    follower.append(messages_for(follower, b"divergent"))  # the old leader's unacknowledged group
    follower.commit()
    for body in (b"new-1", b"new-2", b"new-3"):
        leader.append(messages_for(leader, body))
        leader.commit()
    assert leader.entry_ending_at(follower.written) is None
    assert leader.entry_ending_at(shared) is not None
    follower.truncate_to(shared)
    assert follower.written == follower.end == shared
    assert [m.body for m in follower.read(Position(0, 0), 10)] == [b"shared-1", b"shared-2"]
    pulled = leader.entries_from(shared.offset, 2)
    assert len(pulled) == 2
    data = leader.read_group_bytes(pulled)
    at = 0
    for entry in pulled:
        follower.append_raw(entry, data[at : at + entry[4]])
        at += entry[4]
    rest = leader.entries_from(follower.written.offset, 10)
    follower.append_raw(rest[0], leader.read_group_bytes(rest))
    assert leader.entries_from(follower.written.offset, 10) == []
    assert entries(follower) == entries(leader)
    assert [m.body for m in follower.read(Position(0, 0), 10)][2:] == [b"new-1", b"new-2", b"new-3"]
    with pytest.raises(ValueError, match="no index entry starts"):
        leader.entries_from(1, 10)
    leader.close()
    follower.close()
    reopened = open_log(tmp_path / "follower")
    assert reopened.written == leader.written and reopened.last_id == leader.last_id
    reopened.close()


def test_truncating_across_a_segment_roll_writes_on_in_the_earlier_segment(tmp_path):
    log = open_log(tmp_path, max_bytes_per_file=100)
    log.append(messages_for(log, b"a" * 40))
    log.commit()
    kept = log.written
    log.append(messages_for(log, b"b" * 40))
    log.commit()  # the segment is past 100 bytes: the next is begun
    log.append(messages_for(log, b"c" * 40))
    log.commit()
    assert len(log.segments) == 2
    log.truncate_to(kept)
    assert len(log.segments) == 1 and log.written == kept
    assert not (tmp_path / "t" / "t-2.diskqueue.000000.dat.offsetmeta.dat").exists()
    log.append(messages_for(log, b"d" * 40))
    log.commit()
    assert [m.body[:1] for m in log.read(Position(0, 0), 10)] == [b"a", b"d"]
    with pytest.raises(ValueError, match="no index entry ends"):
        log.truncate_to(Position(kept.offset + 1, 1))
    log.close()
    reopened = open_log(tmp_path, max_bytes_per_file=100)
    assert [m.body[:1] for m in reopened.read(Position(0, 0), 10)] == [b"a", b"d"]
    reopened.close()


def test_a_deleted_log_is_never_started_over(tmp_path):
    """A catch-up answered after its partition left the node (a removal, a move) must not
    write the partition's files again: the removed node would keep a copy for good."""
    log = open_log(tmp_path)
    publish(log, b"0", b"1")
    log.delete()
    with pytest.raises(OSError):
        log.reset_to(Position(0, 0), 0, None, {})
    assert log.files.all_files() == []


def test_a_sync_job_that_finishes_after_the_deletion_leaves_no_file(tmp_path):
    """A sync runs in a worker thread: a partition deleted meanwhile (moved off the node)
    must not get its writer metadata back, or the node keeps a piece of it for good."""
    log = open_log(tmp_path, sync_every=1000)
    channel = cursor(log)
    publish(log, b"0", b"1")
    channel.take(1)
    log.commit()
    log_job = log.prepare_sync()
    channel_job = channel.prepare_sync()
    channel.delete()
    log.delete()
    assert log_job() is True and channel_job() is True
    assert log.files.all_files() == []
    assert os.listdir(tmp_path / "t") == []


def test_a_cursor_sync_job_never_writes_an_older_position_over_its_close(tmp_path):
    log = open_log(tmp_path)
    channel = cursor(log)
    publish(log, b"0", b"1")
    taken = channel.take(2)
    stale_job = channel.prepare_sync()  # written before anything was acknowledged
    for message in taken:
        channel.acknowledge(message)
    end = log.end
    channel.close()
    assert stale_job() is True
    log.close()
    reopened = open_log(tmp_path)
    again = cursor(reopened)
    assert again.confirmed == end and again.take(5) == []
    reopened.close()


def reopened_confirmed(path) -> Position:
    """The position a channel `c` of the log at `path` starts from when opened again."""
    log = open_log(path)
    try:
        return cursor(log).confirmed
    finally:
        log.close()


def test_cursor_sync_jobs_run_out_of_order_never_write_an_older_position(tmp_path):
    """Sync jobs run in worker threads, a later one maybe first: the files keep the newest
    position (the channel is never closed here, which would write it once more)."""
    log = open_log(tmp_path)
    channel = cursor(log)
    publish(log, b"0", b"1", b"2")
    first, second, _third = channel.take(3)
    channel.acknowledge(first)
    older = channel.prepare_sync()
    channel.acknowledge(second)
    acknowledged = channel.confirmed
    newer = channel.prepare_sync()
    assert newer() is True
    assert older() is True  # too late: leaves the newer position
    log.close()
    assert reopened_confirmed(tmp_path) == acknowledged


def test_a_cursor_sync_job_never_writes_an_older_position_over_a_flush(tmp_path):
    log = open_log(tmp_path)
    channel = cursor(log)
    publish(log, b"0", b"1")
    taken = channel.take(2)
    stale = channel.prepare_sync()  # before anything was acknowledged
    for message in taken:
        channel.acknowledge(message)
    channel.flush([])
    assert stale() is True
    log.close()
    assert reopened_confirmed(tmp_path) == channel.confirmed


def zero_group(log_path, entry: tuple, segment: int = 0) -> None:
    """What a crash or a bad disk leaves: the group's bytes as zeros, its index entry intact."""
    with open(log_path / "t" / f"t-2.diskqueue.{segment:06d}.dat", "r+b") as data:
        data.seek(entry[3])
        data.write(bytes(entry[4]))


def test_the_view_finds_each_group_whose_bytes_do_not_hold_its_index_entry(tmp_path):
    log = open_log(tmp_path)
    for n in range(5):
        publish(log, b"a%d" % n, b"b%d" % n)  # a group of two each
    groups = entries(log)
    log.close()
    zero_group(tmp_path, groups[1])
    with open(tmp_path / "t" / "t-2.diskqueue.000000.dat", "r+b") as data:
        data.seek(groups[3][3] + 4 + 10)  # the first record's attempts, then its ID
        data.write(b"\xff" * 10)
    view = LogView(str(tmp_path), "t", 2)
    faults = list(view.faults())
    view.close()
    assert [(fault.position, fault.entry) for fault in faults] == [(1, groups[1]), (3, groups[3])]
    assert faults[0].reason == f"a record of 0 bytes at offset {groups[1][3]}"
    assert faults[1].reason.startswith("IDs ")
    assert group_fault(groups[0], b"") == f"0 bytes stored of the group's {groups[0][4]}"


def test_a_corrupt_group_with_no_copy_is_skipped_exactly_and_a_copy_repairs_it(tmp_path):
    log = open_log(tmp_path)
    bodies = [b"m%d" % n for n in range(8)]
    for start in range(0, 8, 2):
        publish(log, *bodies[start : start + 2])
    groups = entries(log)
    original = log.read_group_bytes([groups[1]])
    log.close()
    zero_group(tmp_path, groups[1])
    reopened = open_log(tmp_path)
    reopened.skip_corrupt_group(groups[1])
    channel = cursor(reopened)
    channel.set_position(reopened.start)
    taken = channel.take(10) + channel.take(10)
    # The group after the corrupt one is read, though it is in the same segment.
    assert [m.body for m in taken] == bodies[:2] + bodies[4:]
    reopened.repair_group(groups[1], original)
    channel.set_position(reopened.start)
    assert [m.body for m in channel.take(10)] == bodies
    with pytest.raises(ValueError, match="not in the log"):
        reopened.repair_group(groups[1], original[:-1])
    reopened.close()
