"""Group commit of log topics (docs/design.md §13, `nsqd/log_writer.py`): publishes that arrive
while a commit of their log waits for the disk are written together by the next one, one write
and one index entry, and each is answered only then. When that write fails, every publish in
the group is refused, over TCP and HTTP, whichever connection's commit wrote it, and nothing of
the group is ever delivered.

The disk is real; what the test controls is at the OS boundary, in this process: an fsync
that blocks until the test lets it go (a slow disk), and `os.write` on regular files failing
with ENOSPC (a full disk), as tests/reliability/test_disk_faults.py injects it.
"""

import dataclasses
import errno
import os
import re
import stat
import threading

import pytest
import trio
import trio.testing

from nsqpy.common.command import encode_pub
from nsqpy.nsqd.log_writer import WriteRefused
from nsqpy.nsqd.publish import publish as nsqd_publish
from nsqpy.partition_log import ENTRY
from tests.nsqd.wire import Wire, consumer
from tests.support.http import raw_request, target
from tests.support.nsqd import running_nsqd
from tests.support.polling import wait_until

ENOSPC_TEXT = os.strerror(errno.ENOSPC).lower()


class SlowDisk:
    """`os.fsync` of a queue's data files (`queue`: "t-0" for a log's partition, "classic:c" for
    a channel's diskqueue) waits, in its worker thread, until `release()`; `entered` once one waits.
    Other fsyncs (nsqd.dat, cursors, index and metadata files) are not slowed: one of them
    setting `entered` would let a test publish before the commit it means to wait behind."""

    def __init__(self, monkeypatch, queue: str) -> None:
        self.entered = threading.Event()
        self._released = threading.Event()
        data_file = re.compile(rf"{re.escape(queue)}\.diskqueue\.\d{{6}}\.dat")
        real_fsync = os.fsync

        def fsync(fd: int) -> None:
            if data_file.fullmatch(os.path.basename(os.readlink(f"/proc/self/fd/{fd}"))):
                self.entered.set()
                self._released.wait(10)
            real_fsync(fd)

        monkeypatch.setattr(os, "fsync", fsync)

    def release(self) -> None:
        self._released.set()


def fill_the_disk(monkeypatch) -> None:
    """From now on, writes to regular files fail with ENOSPC; sockets still work."""
    real_write = os.write

    def write(fd: int, data) -> int:
        if stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_write(fd, data)

    monkeypatch.setattr(os, "write", write)


def index_entries(nsqd, topic: str) -> list[tuple]:
    log = nsqd.get_topic(topic).queue.log
    with open(log.index_path(), "rb") as file:
        data = file.read()
    return [ENTRY.unpack_from(data, at) for at in range(0, len(data), ENTRY.size)]


async def tcp_publish(nsqd, topic: str, body: bytes, replies: dict) -> None:
    wire = await Wire.connect(nsqd)
    await wire.send(encode_pub(topic, body))
    frame = await wire.read_response()
    replies[body] = frame.data
    await wire.aclose()


async def http_publish(nsqd, topic: str, body: bytes, replies: dict) -> None:
    response = await raw_request(nsqd.http_address, "POST", target("/pub", topic=topic), body)
    replies[body] = (response.status, response.body)


PUBLISHERS = {"tcp": tcp_publish, "http": http_publish}


async def publish_behind_a_slow_commit(nsqd, slow_disk, publisher, nursery, replies) -> None:
    """One publish whose commit waits for the slow disk, then two more (`b`, `c`) that wait
    behind it, appended to the log's next group."""
    log = nsqd.get_topic("t").queue.log
    nursery.start_soon(tcp_publish, nsqd, "t", b"a", replies)
    await wait_until(slow_disk.entered.is_set)
    for body in (b"b", b"c"):
        nursery.start_soon(publisher, nsqd, "t", body, replies)
    await wait_until(lambda: log.appended.count - log.end.count == 2)
    assert replies == {}


@pytest.mark.parametrize("protocol", PUBLISHERS)
async def test_publishes_waiting_behind_a_commit_are_written_as_one_group(
    nsqd_options, monkeypatch, protocol
):
    options = dataclasses.replace(nsqd_options, log_topic=["*"], sync_every=1)
    async with running_nsqd(options) as nsqd:
        reader = await consumer(nsqd, "t", "c", rdy=10)
        slow_disk = SlowDisk(monkeypatch, "t-0")
        replies: dict = {}
        async with trio.open_nursery() as nursery:
            await publish_behind_a_slow_commit(
                nsqd, slow_disk, PUBLISHERS[protocol], nursery, replies
            )
            slow_disk.release()
        ok = b"OK" if protocol == "tcp" else (200, b"OK")
        assert replies == {b"a": b"OK", b"b": ok, b"c": ok}
        counts = [entry[-1] for entry in index_entries(nsqd, "t")]
        assert counts == [1, 2]
        delivered = await reader.read_messages(3)
        assert sorted(message.body for message in delivered) == [b"a", b"b", b"c"]


@pytest.mark.parametrize("protocol", PUBLISHERS)
async def test_a_failed_group_write_refuses_every_publish_in_the_group(
    nsqd_options, monkeypatch, protocol
):
    options = dataclasses.replace(nsqd_options, log_topic=["*"], sync_every=1)
    async with running_nsqd(options) as nsqd:
        reader = await consumer(nsqd, "t", "c", rdy=10)
        slow_disk = SlowDisk(monkeypatch, "t-0")
        replies: dict = {}
        async with trio.open_nursery() as nursery:
            await publish_behind_a_slow_commit(
                nsqd, slow_disk, PUBLISHERS[protocol], nursery, replies
            )
            with monkeypatch.context() as disk:
                fill_the_disk(disk)
                slow_disk.release()
                await wait_until(lambda: len(replies) == 3)
        assert replies[b"a"] == b"OK"
        segment = nsqd.get_topic("t").queue.log.segment_path(0)
        for body in (b"b", b"c"):
            if protocol == "tcp":
                expected = f"E_PUB_FAILED PUB failed write {segment}: {ENOSPC_TEXT}".encode()
            else:
                expected = (500, b'{"message":"INTERNAL_ERROR"}')
            assert replies[body] == expected
        assert nsqd.health == f"NOK - write {segment}: {ENOSPC_TEXT}"
        # The disk has room again: the next publish is written, and only what was
        # acknowledged is ever delivered.
        await tcp_publish(nsqd, "t", b"d", replies)
        assert replies[b"d"] == b"OK" and nsqd.health == "OK"
        assert [entry[-1] for entry in index_entries(nsqd, "t")] == [1, 1]
        delivered = await reader.read_messages(2)
        assert [message.body for message in delivered] == [b"a", b"d"]


async def test_a_commit_waits_for_an_fsync_another_commit_started_for_its_write(
    nsqd_options, monkeypatch
):
    """Classic topics, `--sync-every=1`: a publish written before another task's commit took
    its queue (an HTTP poller pass, then a TCP batch) is answered only once that commit's
    fsync, which covers it, is done, never while it runs."""
    options = dataclasses.replace(nsqd_options, mem_queue_size=0, sync_every=1)
    async with running_nsqd(options) as nsqd:
        topic = nsqd.get_topic("classic")
        topic.get_channel("c")
        slow_disk = SlowDisk(monkeypatch, "classic:c")
        # The first publisher's write, then a second publisher's, both before any commit.
        nsqd_publish(nsqd, topic, [b"first"])
        nsqd_publish(nsqd, topic, [b"second"])
        done = []

        async def commit(name: str) -> None:
            await nsqd.storage.commit()
            done.append(name)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(commit, "first")  # takes the written queue, then waits on fsync
            await wait_until(slow_disk.entered.is_set)
            nursery.start_soon(commit, "second")
            # The second commit has nothing of its own to sync, but its write is in the
            # fsync under way: it may not return before that.
            await trio.testing.wait_all_tasks_blocked()
            assert done == []
            slow_disk.release()
        assert sorted(done) == ["first", "second"]


class StalledReplication:
    """A leader's replication (`LogWriter.replicate`) that waits until `fail()`, then
    fails as a round whose followers did not answer: what a cut-off leader's round does."""

    def __init__(self, *, reached_followers: bool = False) -> None:
        self.entered = trio.Event()
        self._failed = trio.Event()
        self.reached_followers = reached_followers

    async def __call__(self, writes, delays=()) -> None:
        self.entered.set()
        await self._failed.wait()
        error = WriteRefused("E_FAILED_ON_NOT_WRITABLE", "replication failed")
        error.maybe_stored = self.reached_followers
        raise error

    def fail(self) -> None:
        self._failed.set()


async def test_publishes_appended_during_a_failed_replication_round_are_refused(nsqd_options):
    """A publish that arrives while a round is replicating waits in the next group; the
    round fails and its log is cut back, which drops that group's appends too: its publisher
    is refused, never told OK for a message that was not written."""
    options = dataclasses.replace(nsqd_options, log_topic=["*"], sync_every=1)
    async with running_nsqd(options) as nsqd:
        await tcp_publish(nsqd, "t", b"before", {})
        topic = nsqd.get_topic("t")
        replication = StalledReplication()
        topic.queue.writer.replicate = replication
        replies: dict = {}
        async with trio.open_nursery() as nursery:
            nursery.start_soon(tcp_publish, nsqd, "t", b"in the round", replies)
            await replication.entered.wait()
            nursery.start_soon(tcp_publish, nsqd, "t", b"behind the round", replies)
            await wait_until(lambda: topic.queue.writer.group is not None)
            replication.fail()
        assert replies == {
            b"in the round": b"E_FAILED_ON_NOT_WRITABLE ",
            b"behind the round": b"E_FAILED_ON_NOT_WRITABLE ",
        }
        assert [entry[-1] for entry in index_entries(nsqd, "t")] == [1]


async def test_a_round_that_reached_followers_is_refused_as_maybe_stored(nsqd_options):
    """Refused after its group went to followers (one of which may lead next), a publish is
    told it may be stored (docs/protocol.md §3.10): an idempotent producer keeps its
    sequences for the retry instead of sending it again as a new publish."""
    options = dataclasses.replace(nsqd_options, log_topic=["*"], sync_every=1)
    async with running_nsqd(options) as nsqd:
        await tcp_publish(nsqd, "t", b"before", {})
        replication = StalledReplication(reached_followers=True)
        nsqd.get_topic("t").queue.writer.replicate = replication
        replies: dict = {}
        async with trio.open_nursery() as nursery:
            nursery.start_soon(tcp_publish, nsqd, "t", b"sent", replies)
            await replication.entered.wait()
            replication.fail()
        assert replies[b"sent"].startswith(b"E_FAILED_ON_NOT_WRITABLE MAYBE_STORED ")


async def test_a_writer_that_stops_leading_refuses_what_it_did_not_write(nsqd_options):
    options = dataclasses.replace(nsqd_options, log_topic=["*"], sync_every=1)
    async with running_nsqd(options) as nsqd:
        topic = nsqd.get_topic("t")
        nsqd_publish(nsqd, topic, [b"appended"])
        group = topic.queue.writer.group
        topic.queue.writer.abandon(WriteRefused("E_FAILED_ON_NOT_LEADER", "no longer the leader"))
        await nsqd.storage.commit([group])
        assert group.done and group.error.code == "E_FAILED_ON_NOT_LEADER"
        assert topic.queue.log.written.count == topic.queue.log.appended.count == 0
        assert not os.path.exists(topic.queue.log.index_path()) or index_entries(nsqd, "t") == []
