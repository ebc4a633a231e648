"""Which topics and channels this nsqd has, kept across restarts: `nsqd.dat` (Go's file) and
the journal of changes since it was written (`nsqd/metadata_journal.py`).

A creation, deletion or setting that nsqd.dat holds is journaled before it is answered, so it
survives a kill -9 from that moment; nsqd.dat itself is rewritten whole by one background
task, at once after a quiet spell and then at most a twentieth of the time (its cost grows
with the topics, the journal's does not), and on exit. A power loss can take what the last
nsqd.dat had not written yet, as with Go's nsqd, which writes it after the answer too.
"""

import logging
from typing import TYPE_CHECKING

import trio

from nsqpy import network
from nsqpy.common.version import VERSION
from nsqpy.nsqd.metadata import (
    ChannelMetadata,
    MetadataError,
    TopicMetadata,
    encode_metadata,
    read_metadata,
    recover_metadata,
    write_metadata,
)
from nsqpy.nsqd.metadata_journal import (
    MetadataJournal,
    apply_journals,
    journal_files,
    remove_files,
)
from nsqpy.nsqd.wakeup import Wakeup

if TYPE_CHECKING:
    from nsqpy.nsqd.server import NSQD
    from nsqpy.nsqd.topic import Topic

# Snapshots of nsqd.dat take at most this share of the time: one that took 20 ms waits 400 ms.
SNAPSHOT_SHARE = 0.05


def topic_metadata(topic: "Topic") -> TopicMetadata:
    """What nsqd.dat holds of a topic partition: its settings and its lasting channels."""
    channels = [
        ChannelMetadata(
            c.name,
            c.paused,
            c.max_attempts,
            c.dead_letter_topic,
            c.skipped,
            c.in_order,
            c.rate_limit_kb,
            dict(c.client_limits),
        )
        for c in topic.channels.values()
        if not c.ephemeral
    ]
    entry = TopicMetadata(topic.name, topic.paused, channels)
    if topic.partitioned:
        entry.partition = topic.partition
        entry.ordered = topic.ordered
        entry.sync_every = topic.sync_every
        entry.ext = topic.ext
        entry.next_offset = topic.queue.next_offset
    return entry


def fold_journals(data_path: str, topics: list[TopicMetadata], log: logging.Logger) -> None:
    """Write into nsqd.dat what the journals there add to `topics` (nsqd.dat's), and remove
    them: the supervisor of `--workers` does, before any worker starts (blocking)."""
    found = [path for _g, _w, path in journal_files(data_path)]
    if not found:
        return
    write_metadata(data_path, encode_metadata(apply_journals(topics, data_path, log), VERSION))
    remove_files(found)


class TopologyStore:
    def __init__(self, nsqd: "NSQD") -> None:
        self.nsqd = nsqd
        self.data_path = nsqd.data_path
        self.log = nsqd.log
        # True while `read`'s topics are being made: nothing of them to journal or write.
        self.loading = False
        self.wakeup = Wakeup()
        self._journal: MetadataJournal | None = None
        # One snapshot at a time, each taken inside it, so an older one never lands last (Go
        # holds the nsqd lock around PersistMetadata).
        self._lock = trio.Lock()

    def read(self) -> list[TopicMetadata]:
        """The topics to make on start: nsqd.dat's with the journals applied (this worker's
        own under `--workers`). An unreadable nsqd.dat is set aside and its topics found
        again from their queue files, after one ERROR line."""
        worker = self.nsqd.worker
        try:
            topics = read_metadata(self.data_path)
        except MetadataError as error:
            topics = recover_metadata(self.data_path, error, self.log)
            self.wakeup.set()  # a fresh nsqd.dat in its place as soon as nsqd runs
        owns = None if worker is None else worker.owns
        topics = apply_journals(topics, self.data_path, self.log, owns)
        self._journal = MetadataJournal(
            self.data_path,
            0 if worker is None else worker.index,
            owns_every_file=worker is None,
        )
        if self._journal.rotate():
            self.wakeup.set()  # the journals read go once a snapshot holds them
        return topics

    def changed(self, topic: "Topic") -> None:
        """A topic partition, or one of its lasting channels, came, went or changed a setting
        nsqd.dat holds: journaled now, in nsqd.dat soon."""
        if self.loading:
            return
        journal = self._journal
        if journal is not None:
            try:
                if (
                    topic.deleted
                    or self.nsqd.registry.get(topic.name, topic.partition) is not topic
                ):
                    journal.delete(topic.name, topic.partition if topic.partitioned else None)
                else:
                    journal.put(topic_metadata(topic))
            except OSError as error:
                # A full disk: the change stands, nsqd.dat takes it once the disk has room.
                self.log.error("NSQ: failed to journal metadata - %s", error)
                self.nsqd.storage.health.sync_done(f"failed to persist metadata - {error}")
        self.wakeup.set()

    def snapshot(self) -> list[TopicMetadata]:
        return [topic_metadata(t) for t in self.nsqd.all_partitions() if not t.ephemeral]

    async def persist(self) -> None:
        """Write nsqd.dat now (and on exit; HTTP pause and unpause do, as Go's handlers do),
        then remove the journals it holds."""
        async with self._lock:
            held = self._journal.rotate() if self._journal is not None else []
            own = self.snapshot()
            worker = self.nsqd.worker
            if worker is not None:
                await trio.to_thread.run_sync(worker.write_metadata_share, self.data_path, own)
            else:
                encoded = encode_metadata(own, VERSION)
                await network.current().run_sync(write_metadata, self.data_path, encoded)
            if held and self._journal is not None:
                await network.current().run_sync(remove_files, held)
                self._journal.written(held)

    async def run(self) -> None:
        """The background writer of nsqd.dat."""
        while True:
            await self.wakeup.wait()
            started = trio.current_time()
            try:
                await self.persist()
            except OSError as error:
                # A full disk: keep the old nsqd.dat and the journals, say so, try again.
                self.log.error("NSQ: failed to persist metadata - %s", error)
                self.nsqd.storage.health.sync_done(f"failed to persist metadata - {error}")
                await trio.sleep(self.nsqd.options.sync_timeout)
                self.wakeup.set()
            else:
                self.nsqd.storage.health.sync_done(None)
                await trio.sleep((trio.current_time() - started) / SNAPSHOT_SHARE)

    def close(self) -> None:
        if self._journal is not None:
            self._journal.close()
