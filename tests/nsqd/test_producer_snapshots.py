"""Producer snapshots (nsqpy/partition_log/producer_snapshots.py): each replica writes one as
its segments roll, and a rebuild of the idempotent producers' sequences starts from the newest
that still matches the log, reading only the records after it."""

import dataclasses
import math
import os
import time

import trio
import trio.testing

from nsqpy.common.command import encode_pub
from nsqpy.nsqd.message import Message
from nsqpy.partition_log import PartitionLog, Position, ProducerMark
from nsqpy.partition_log.producer_snapshots import read_snapshot
from tests.nsqd.wire import Wire
from tests.support.nsqd import running_nsqd

# Records of 46 bytes: five publishes fill a segment of 200 bytes, the sixth rolls it (a full
# segment is rolled before the next write).
SEGMENT_BYTES = 200


def open_log(path) -> PartitionLog:
    log = PartitionLog(
        str(path), "t", 0, message_type=Message, max_bytes_per_file=SEGMENT_BYTES, sync_every=1
    )
    log.producer_expiration = lambda: 3600.0
    return log


def publish(log: PartitionLog, producer: bytes, sequence: int, *, at: float | None = None):
    """One message published idempotently by `producer`, written `at` (unix seconds; now)."""
    timestamp = int((time.time() if at is None else at) * 1e9)
    (message_id,) = log.next_ids(1)
    log.append(
        [Message(message_id, b"body %d" % sequence, timestamp)], ProducerMark(producer, sequence)
    )
    log.commit()


def sync(log: PartitionLog) -> None:
    """What nsqd's periodic sync does: the jobs run in a worker thread."""
    assert log.prepare_sync()() is True
    job = log.prepare_producer_snapshot()
    if job is not None:
        job()


def test_a_rolled_segment_leaves_a_snapshot_of_the_producers_before_it(tmp_path):
    log = open_log(tmp_path)
    for sequence in range(3):
        publish(log, b"a", sequence)
    publish(log, b"b", 0)
    publish(log, b"a", 3)
    assert len(log.segments) == 1
    publish(log, b"a", 4)
    assert len(log.segments) == 2
    sync(log)
    (offset,) = log.files.producer_snapshot_offsets()
    active = log.segments[-1]
    assert offset == active.start
    snapshot = read_snapshot(log.files, offset)
    assert snapshot.position == Position(active.start, active.start_count)
    assert {key: value[0] for key, value in snapshot.producers.items()} == {b"a": 3, b"b": 0}
    log.close()


def test_the_state_outlives_the_segments_retention_removed(tmp_path):
    """Producers whose marks were in removed segments are still known, from the snapshot: a
    rebuild from the records alone would have forgotten them."""
    log = open_log(tmp_path)
    publish(log, b"early", 0)
    for sequence in range(6):
        publish(log, b"a", sequence)
    sync(log)
    assert log.clean(log.end.offset, keep_bytes=-1, older_than=math.inf) > 0
    since = int((time.time() - 3600) * 1e9)
    state = log.producer_state(since)
    assert {key: value[0] for key, value in state.items()} == {b"early": 0, b"a": 5}
    log.close()
    reopened = open_log(tmp_path)
    assert reopened.producer_state(since) == state
    reopened.close()


def test_only_the_two_newest_snapshots_are_kept(tmp_path):
    log = open_log(tmp_path)
    written = []
    for sequence in range(20):
        segments = len(log.segments)
        publish(log, b"a", sequence)
        if len(log.segments) > segments:
            sync(log)
            written.append(log.segments[-1].start)
    assert len(written) > 2
    assert log.files.producer_snapshot_offsets() == written[-2:]
    log.close()


def test_a_snapshot_of_a_cut_back_tail_is_removed(tmp_path):
    """A follower cuts back records its new leader does not have: the snapshot taken after
    them goes, and the state is the remaining records'."""
    log = open_log(tmp_path)
    publish(log, b"a", 0)
    kept = log.written
    for sequence in range(1, 6):
        publish(log, b"a", sequence)
    sync(log)
    assert log.files.producer_snapshot_offsets()
    log.truncate_to(kept)
    assert log.files.producer_snapshot_offsets() == []
    assert log.producer_state(0) == {b"a": (0, log.read(Position(0, 0), 1)[0].timestamp)}
    log.close()


def test_a_snapshot_that_does_not_match_the_log_is_ignored(tmp_path):
    """The index entry a snapshot names must end where it says; one that does not (written
    by a job that raced a cut-back, or damaged) is passed over for the records themselves."""
    log = open_log(tmp_path)
    for sequence in range(6):
        publish(log, b"a", sequence)
    sync(log)
    (offset,) = log.files.producer_snapshot_offsets()
    path = os.path.join(log.directory, f"t-0.producers.{offset:020d}.json")
    with open(path) as file:
        document = file.read()
    with open(path, "w") as file:
        file.write(
            document.replace('"producers": {', '"producers": {"7a": [99, 1], ', 1).replace(
                '"entry": [', '"entry": [12345, ', 1
            )
        )
    assert b"z" not in log.producer_state(0)
    with open(path, "w") as file:
        file.write("not json")
    assert log.producer_state(0)[b"a"][0] == 5
    log.close()


def test_producers_not_seen_within_the_expiration_are_left_out(tmp_path):
    log = open_log(tmp_path)
    old = time.time() - 7200
    for sequence in range(4):
        publish(log, b"old", sequence, at=old)
    publish(log, b"new", 0)
    for sequence in range(1, 4):
        publish(log, b"new", sequence)
    sync(log)
    offsets = log.files.producer_snapshot_offsets()
    assert offsets
    assert b"old" not in read_snapshot(log.files, offsets[-1]).producers
    assert set(log.producer_state(int((time.time() - 3600) * 1e9))) == {b"new"}
    log.close()


def test_a_follower_writes_the_same_snapshots_as_its_leader(tmp_path):
    """A follower takes the leader's groups as written (`append_raw`) and snapshots them as
    its own segments roll: the one that becomes leader starts from its own."""
    leader, follower = open_log(tmp_path / "leader"), open_log(tmp_path / "follower")
    for sequence in range(12):
        timestamp = int(time.time() * 1e9)
        (message_id,) = leader.next_ids(1)
        leader.append([Message(message_id, b"m", timestamp)], ProducerMark(b"p", sequence))
        follower.append_raw(*leader.commit())
    sync(leader)
    sync(follower)
    offsets = leader.files.producer_snapshot_offsets()
    assert offsets and follower.files.producer_snapshot_offsets() == offsets
    assert read_snapshot(follower.files, offsets[-1]) == read_snapshot(leader.files, offsets[-1])
    assert follower.producer_state(0) == leader.producer_state(0)
    leader.close()
    follower.close()


def test_a_log_started_over_at_another_ones_start_keeps_its_producers(tmp_path):
    """A replica that starts its log over where another's retention left it (the leader's
    `START`: its start, first segment, boundary entry and producer snapshots) knows the
    producers whose records retention removed, once it has copied the rest."""
    leader = open_log(tmp_path / "leader")
    for sequence in range(6):
        publish(leader, b"gone", sequence)
    for sequence in range(12):
        publish(leader, b"later", sequence)
    sync(leader)
    assert leader.clean(leader.segments[-2].start, keep_bytes=-1, older_than=math.inf) > 0
    since = int((time.time() - 3600) * 1e9)
    expected = leader.producer_state(since)
    assert {key: value[0] for key, value in expected.items()} == {b"gone": 5, b"later": 11}
    copy = open_log(tmp_path / "copy")
    copy.reset_to(
        leader.start,
        leader.first_segment_number,
        leader.entry_ending_at(leader.start),
        leader.snapshot_files(),
    )
    for entry in leader.entries_from(leader.start.offset, 100):
        copy.append_raw(entry, leader.read_group_bytes([entry]))
    assert copy.producer_state(since) == expected
    copy.close()
    reopened = open_log(tmp_path / "copy")
    assert reopened.producer_state(since) == expected
    reopened.close()
    leader.close()


async def test_a_greedy_clean_waits_for_the_snapshot_a_periodic_sync_is_writing(nsqd_options):
    """Retention removes only segments a snapshot on disk covers. When the periodic sync has
    taken the due snapshot and is still writing it, a clean (`/topic/greedyclean`) waits for
    it and then removes what it covers, instead of finding none and removing nothing."""
    # The periodic sync is the test's own call (its timer waits an hour).
    options = dataclasses.replace(
        nsqd_options,
        log_topic=["lt"],
        max_bytes_per_file=SEGMENT_BYTES,
        sync_every=1,
        sync_timeout=3600.0,
    )
    async with running_nsqd(options) as nsqd:
        wire = await Wire.connect(nsqd)
        for n in range(12):  # a full segment rolls before the next write
            await wire.send(encode_pub("lt", b"body %d" % n))
            await wire.expect_ok()
        await wire.aclose()
        topic = nsqd.get_topic("lt")
        topic.get_channel("c").seek("special", -1)
        log = topic.queue.log
        assert len(log.segments) > 1 and not log.files.producer_snapshot_offsets()
        removed: list[int] = []

        async def greedy_clean() -> None:
            removed.append(await nsqd.clean_logs([topic], greedy=True))

        # A slow disk: the snapshot's write waits until the test lets it go.
        log._file_jobs.acquire()
        async with trio.open_nursery() as nursery:
            try:
                nursery.start_soon(topic.queue.sync_dirty)
                await trio.testing.wait_all_tasks_blocked()
                nursery.start_soon(greedy_clean)
                await trio.testing.wait_all_tasks_blocked()
                assert removed == []
            finally:
                log._file_jobs.release()
        assert removed[0] > 0 and log.start.offset > 0
