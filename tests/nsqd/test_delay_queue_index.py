"""The delay queue's index (nsqd/delay_queue.py) on its own: entries by channel and due time,
given out once, finished, emptied, cut back with the log, and what a restart keeps."""

import subprocess
import sys

from nsqpy.nsqd.delay_queue import DelayedRecord, DelayQueue
from tests.support.tmpfs import Tmpfs

ID = b"%016x"


def record(channel: str, number: int, due_ms: int) -> DelayedRecord:
    return DelayedRecord(channel, ID % number, number * 100, number, due_ms)


def test_a_dpub_is_indexed_for_every_channel_and_a_copy_for_its_own(tmp_path):
    queue = DelayQueue(str(tmp_path / "d.sqlite"))
    queue.add([record("", 1, 1000), record("a", 2, 500)], lambda: ["a", "b"])
    assert (queue.count("a"), queue.count("b")) == (2, 1)
    assert [m.message_id for m in queue.take_due("a", 10, now_ms=2000)] == [ID % 2, ID % 1]
    assert queue.take_due("b", 10, now_ms=999) == []
    assert [m.offset for m in queue.take_due("b", 10, now_ms=1000)] == [100]


def test_what_is_out_is_not_given_again_until_a_restart(tmp_path):
    path = str(tmp_path / "d.sqlite")
    queue = DelayQueue(path)
    queue.add([record("a", 1, 10), record("a", 2, 20)], lambda: [])
    assert len(queue.take_due("a", 10, now_ms=100)) == 2
    assert queue.take_due("a", 10, now_ms=100) == []
    assert queue.done("a", ID % 1) and not queue.done("a", ID % 1)
    assert queue.count("a") == 1
    queue.close(log_end=300)
    again = DelayQueue(path)
    assert [m.message_id for m in again.take_due("a", 10, now_ms=100)] == [ID % 2]
    assert again.applied == 300


def test_a_message_delayed_again_replaces_its_entry(tmp_path):
    queue = DelayQueue(str(tmp_path / "d.sqlite"))
    queue.add([record("a", 1, 10)], lambda: [])
    assert len(queue.take_due("a", 10, now_ms=100)) == 1
    queue.add([DelayedRecord("a", ID % 1, 900, 9, 5000)], lambda: [])
    assert queue.count("a") == 1
    assert queue.take_due("a", 10, now_ms=4999) == []
    assert [(m.offset, m.count) for m in queue.take_due("a", 10, now_ms=5000)] == [(900, 9)]


def test_uncommitted_entries_are_gone_after_a_crash_and_applied_says_from_where(tmp_path):
    path = str(tmp_path / "d.sqlite")
    # A process that commits one entry, adds another and dies as kill -9 would (no close).
    script = f"""
import os
from nsqpy.nsqd.delay_queue import DelayedRecord, DelayQueue
from tests.support.tmpfs import Tmpfs
queue = DelayQueue({path!r})
queue.add([DelayedRecord("a", b"%016x" % 1, 100, 1, 10)], lambda: [])
queue.commit(log_end=150)
queue.add([DelayedRecord("a", b"%016x" % 2, 200, 2, 10)], lambda: [])
os._exit(0)
"""
    subprocess.run([sys.executable, "-c", script], check=True)
    crashed = DelayQueue(path)
    assert crashed.count("a") == 1 and crashed.applied == 150


def test_emptying_a_channel_and_cutting_the_log_back(tmp_path):
    queue = DelayQueue(str(tmp_path / "d.sqlite"))
    queue.add([record("", 1, 10), record("", 2, 10), record("", 3, 10)], lambda: ["a", "b"])
    assert queue.empty("a") == 3 and queue.count("a") == 0
    assert queue.oldest_offset() == 100
    queue.cut_back(200)
    assert queue.count("b") == 1 and queue.applied == 0
    assert [r.message_id for r in queue.waiting_before(150, 10)] == [ID % 1]


def test_a_follower_keeps_only_what_its_leader_holds_before_the_admission(tmp_path):
    """A catch-up indexes every delayed record it copies; at its admission the follower drops
    the entries before the leader's end that the leader no longer holds, and keeps the ones
    past it (written after the admission)."""
    leader = DelayQueue(str(tmp_path / "leader.sqlite"))
    follower = DelayQueue(str(tmp_path / "follower.sqlite"))
    records = [record("a", number, 10) for number in range(1, 5)]
    records.append(DelayedRecord("b", ID % 5, 250, 1, 10))
    for queue in (leader, follower):
        queue.add(records, lambda: [])
    assert leader.done("a", ID % 1) and leader.done("b", ID % 5)
    held = leader.entries_before(400)
    assert {channel: sorted(ids) for channel, ids in held.items()} == {"a": [2, 3]}
    dropped = follower.keep_only({name: set(ids) for name, ids in held.items()}, before=400)
    assert dropped == 2
    assert (follower.count("a"), follower.count("b")) == (3, 0)
    assert sorted(m.message_id for m in follower.take_due("a", 10, now_ms=100)) == [
        ID % 2,
        ID % 3,
        ID % 4,
    ]


def test_what_a_full_disk_rolled_back_stays_removed(tmp_path):
    """On a full disk (a real 2 MiB tmpfs) SQLite rolls the commit back, and with it what was
    removed since the last one: the entries a follower dropped as its leader's finished ones,
    a FIN, an emptied channel. None of them is counted or given out meanwhile, and the first
    commit with space back removes them for good."""
    disk = Tmpfs(tmp_path / "disk", "2m")
    try:
        path = str(disk.mount_point / "d.sqlite")
        queue = DelayQueue(path)
        queue.add([record("a", number, 10) for number in range(1, 2001)], lambda: [])
        queue.add([record("b", number, 10) for number in range(2001, 2011)], lambda: [])
        queue.commit(log_end=10**6)
        disk.fill()
        held = {"a": set(range(1001, 2001)), "b": set(range(2001, 2011))}
        assert queue.keep_only(held, before=10**9) == 1000
        assert queue.done("a", ID % 1500)
        assert queue.empty("b") == 10
        queue.commit(log_end=10**6 + 1)
        assert queue.behind, "the commit was not refused: the disk is not full"
        assert (queue.count("a"), queue.count("b")) == (999, 0)
        given = {int(m.message_id, 16) for m in queue.take_due("a", 5000, now_ms=100)}
        assert given == set(range(1001, 2001)) - {1500}
        assert queue.take_due("b", 10, now_ms=100) == []
        disk.free()
        queue.commit(log_end=10**6 + 2)
        queue.close(log_end=10**6 + 2)
        reopened = DelayQueue(path)
        assert (reopened.count("a"), reopened.count("b")) == (999, 0)
        reopened.close(log_end=10**6 + 2)
    finally:
        disk.close()


def test_what_the_leader_finished_before_its_record_came_is_never_indexed(tmp_path):
    """A follower hears of a finished delayed message before it indexed the message's record
    (a catch-up copies the record later): that record never enters its queue; one already
    indexed leaves it."""
    queue = DelayQueue(str(tmp_path / "d.sqlite"))
    queue.add([record("a", 1, 10)], lambda: [])
    queue.forget("a", ID % 1)
    queue.forget("a", ID % 2)
    queue.add([record("a", 2, 10), record("a", 3, 10), record("b", 2, 10)], lambda: [])
    assert (queue.count("a"), queue.count("b")) == (1, 1)
    assert [m.message_id for m in queue.take_due("a", 10, now_ms=100)] == [ID % 3]
