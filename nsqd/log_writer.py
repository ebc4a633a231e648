"""Group commit of one partition log (docs/design.md §13).

A publish to a log topic is appended to the log's open `WriteGroup` and answered only once that
group is done: written with one `os.write` and one index entry together with every publish
appended since the previous write, and fsynced when the sync policy (`--sync-every`, a topic's
`syncdisk`) wants it. A write is a syscall on the event loop: the first commit after a batch of
publishes writes the group at once (`write_now`). An fsync runs in a worker thread, as a round:
one round at a time per log, and the publishes that arrive meanwhile wait, are written together
by the next round and fsynced by it, so the slower the disk, the larger the groups. Whoever
waits for an unfinished group when no round is under way runs the next round; the others wait
for it to end. A replication round (the leader sending each group to its followers) belongs in
the same place.

A failed write keeps nothing of its group; the group's `error` refuses every publish in it,
whichever connection's commit wrote it.
"""

from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING

import trio

from nsqpy.nsqd.backend import write_error
from nsqpy.nsqd.delay_queue import DelayedRecord
from nsqpy.nsqd.message import Message
from nsqpy.partition_log import PartitionLog, Position, ProducerMark

if TYPE_CHECKING:
    from nsqpy.nsqd.storage import Storage


class WriteRefused(Exception):
    """Publishes that will not be written (their group was cut back, or this node no longer
    leads the partition): `code` is the error their publishers get."""

    def __init__(self, code: str, reason: str) -> None:
        super().__init__(reason)
        self.code = code
        # The publishes went to followers before the write was given up: one of them may
        # hold them, and lead (their publishers hear `MAYBE_STORED`, docs/protocol.md §3.10).
        self.maybe_stored = False


class WriteGroup:
    """The publishes one write carries. `done` once written (and fsynced when the policy
    wanted it), or failed: then `error` says why, for each of them. The topic counts its
    messages and keeps its DPUBs' due times here until it is written."""

    __slots__ = ("writer", "done", "error", "count", "publishes", "body_bytes", "delays")
    # Written by the awaited commit, not when the HTTP poller's pass ends.
    ends_with_pass = False

    def __init__(self, writer: "LogWriter") -> None:
        self.writer = writer
        self.done = False
        self.error: Exception | None = None
        self.count = 0
        self.publishes = 0
        self.body_bytes = 0
        # Its delayed records (DPUBs, moves to a delay queue), indexed once it is written.
        self.delays: list[DelayedRecord] = []


class LogWriter:
    """Appends to one partition log and writes them, a group at a time."""

    def __init__(
        self,
        storage: "Storage",
        log: PartitionLog[Message],
        on_written: Callable[[WriteGroup], None],
    ) -> None:
        self.storage = storage
        self.log = log
        # The topic's: a group is written, its channels may read it.
        self._on_written = on_written
        self.name = log.name
        # The group appends go into now; None until the first append after a write.
        self.group: WriteGroup | None = None
        # Written groups waiting for the round's fsync.
        self._unsynced: list[WriteGroup] = []
        # A round (write, replication, fsync) is under way; `_round_over` is set when it ends.
        self._busy = False
        self._round_over = trio.Event()
        # A follower's fsync is under way or about to start (`sync_soon`).
        self._sync_started = False
        # A cluster leader's: sends written groups to the ISR followers (`nsqd/cluster.py`),
        # raising ClusterWriteError when they cannot all have them. Written groups wait for
        # it in `_unreplicated`, unseen by readers.
        self.replicate: Callable[[list, Sequence[DelayedRecord]], Awaitable[None]] | None = None
        self._unreplicated: list[tuple[tuple[tuple, bytes], WriteGroup]] = []
        # Told when the disk starts refusing the log's writes (the error) and when it takes
        # one again (None): a cluster leader hands its partition over meanwhile.
        self.on_disk_state: Callable[[OSError | None], None] | None = None
        self._refusing = False

    def append(self, messages: list, producer: ProducerMark | None = None) -> WriteGroup:
        """Into the open group (`producer`: an idempotent publish's); OSError if the log is
        closed."""
        self.log.append(messages, producer)
        group = self.group
        if group is None:
            group = self.group = WriteGroup(self)
        return group

    @property
    def waiting_bytes(self) -> int:
        """Body bytes of the groups appended and not yet acknowledged: the open one, those
        written and waiting to be replicated or synced."""
        group = self.group
        waiting = group.body_bytes if group is not None else 0
        if self._unreplicated:
            waiting += sum(group.body_bytes for _record, group in self._unreplicated)
        if self._unsynced:
            waiting += sum(group.body_bytes for group in self._unsynced)
        return waiting

    @property
    def dirty(self) -> bool:
        return self.log.dirty

    @property
    def idle(self) -> bool:
        """Nothing appended, written or being replicated: the log's end is what every ISR
        follower must have."""
        return not self._busy and not self._unreplicated and self.group is None

    async def drain(self) -> None:
        """Until every appended group is written and replicated (or refused): a leader that
        hands its partition over takes no new publishes and waits for this, so the follower
        taking over has everything acknowledged."""
        while not self.idle:
            if self._busy:
                await self._round_over.wait()
            else:
                await self._round()

    @asynccontextmanager
    async def exclusive(self) -> AsyncIterator[None]:
        """Inside: every group written so far is replicated (or refused), and no round runs:
        publishes are appended and wait. A cluster leader admits a follower into the ISR
        here, so no group is acknowledged without it once it is in."""
        while self._busy:
            await self._round_over.wait()
        self._busy = True
        try:
            if self._unreplicated:
                await self._replicate()
            yield
        finally:
            self._busy = False
            ended, self._round_over = self._round_over, trio.Event()
            ended.set()

    def abandon(self, error: Exception) -> None:
        """Refuse what was appended and not written yet, and forget it: this node no longer
        leads the partition, so it must acknowledge nothing more (what a round is replicating
        is refused by that round, whose followers refuse it)."""
        self.log.discard_pending()
        self._fail_open(error)

    def _fail_open(self, error: Exception) -> None:
        group = self.group
        if group is not None:
            self.group = None
            group.error = error
            group.done = True

    def write_now(self) -> None:
        """Write the open group, unless a round is under way (it waits for the next)."""
        if not self._busy:
            self._write()

    async def wait(self, group: WriteGroup) -> None:
        """Until `group` is done: running the next round when none is under way, waiting for
        the one that is otherwise."""
        while not group.done:
            if self._busy:
                await self._round_over.wait()
            else:
                await self._round()

    async def sync(self) -> None:
        """The periodic sync (`--sync-timeout`): write and fsync what is not yet, unless a
        round is doing so."""
        if not self._busy:
            await self._round(force_sync=True)

    def sync_soon(self, nursery: trio.Nursery) -> None:
        """A follower's sync policy, after writing what its leader sent: when `--sync-every`
        is due, fsync in `nursery`. Its answer to the leader does not wait for it (replicas
        are the durability, as in Youzan)."""
        if self.log.sync_due and not self._sync_started:
            self._sync_started = True
            nursery.start_soon(self._follower_sync)

    async def _follower_sync(self) -> None:
        """fsync until nothing written is due: groups the leader sent while a sync ran (or
        while the periodic sync's round did) count towards the next one here."""
        try:
            while self.log.sync_due:
                if self._busy:
                    await self._round_over.wait()
                    continue
                written = self.log.written
                await self._round(force_sync=True)
                if self.log.written == written:
                    break  # nothing came meanwhile: still due only when the log is closed
        finally:
            self._sync_started = False

    async def _round(self, *, force_sync: bool = False) -> None:
        self._busy = True
        try:
            self._write()
            if self._unreplicated:
                await self._replicate()
            if self._unsynced or (force_sync and self.log.dirty):
                synced, self._unsynced = self._unsynced, []
                try:
                    await self.storage.sync_backend(self.log)
                finally:
                    for group in synced:
                        group.done = True
        finally:
            self._busy = False
            ended, self._round_over = self._round_over, trio.Event()
            ended.set()

    async def _replicate(self) -> None:
        """The written groups go to the followers; readers and publishers see them once all
        have them. If they cannot, the leader's copy is cut back and they are refused."""
        batch, self._unreplicated = self._unreplicated, []
        log = self.log
        try:
            if self.replicate is None:
                raise WriteRefused("E_FAILED_ON_NOT_LEADER", "no longer the leader")
            delays = [delay for _written, group in batch for delay in group.delays]
            await self.replicate([written for written, _group in batch], delays)
        except Exception as error:
            first = batch[0][0][0]
            issued = log.last_id
            try:
                log.truncate_to(Position(first[3], first[5] - 1))
            except (ValueError, OSError) as cut_error:
                self.storage.log.error("LOG(%s) failed to cut back - %s", log.name, cut_error)
            # The IDs of the groups cut back are not given again: a follower that got one of
            # them tells it from the leader's next group by its IDs (`ClusterNode` MATCH).
            log.last_id = max(log.last_id, issued)
            # What a clean stop wrote meanwhile (no commit writes during a round) was cut back
            # with the batch.
            for _written, group in batch + self._unreplicated:
                group.error = error
                group.done = True
            self._unreplicated = []
            # The cut discarded what was appended meanwhile too: its publishes are refused,
            # never acknowledged as if it had been written.
            self._fail_open(error)
            return
        last = batch[-1][0][0]
        log.make_visible(Position(last[3] + last[4], last[5] - 1 + last[6]))
        sync_due = log.sync_due
        for _written, group in batch:
            self._on_written(group)
            if sync_due:
                self._unsynced.append(group)
            else:
                group.done = True

    def _write(self) -> None:
        group = self.group
        if group is None:
            return
        self.group = None
        log = self.log
        replicating = self.replicate is not None
        try:
            written = log.commit(visible=not replicating)
        except OSError as os_error:
            error = write_error(log, os_error, log.active_segment_path)
            group.error = error
            group.done = True
            self.storage.log.error(
                "TOPIC(%s) ERROR: failed to write message to log - %s", log.topic, error
            )
            self.storage.health.write_done(error)
            self.storage.refused(log.topic, log.partition, group.publishes)
            self._refusing = True
            if self.on_disk_state is not None:
                self.on_disk_state(os_error)
            return
        self.storage.health.write_done(None)
        if self._refusing:
            self._refusing = False
            if self.on_disk_state is not None:
                self.on_disk_state(None)
        if written is None:
            # Nothing of the group is in the log: the log was closed, or cut back under it.
            group.error = WriteRefused("E_FAILED_ON_NOT_WRITABLE", "the group was not written")
            group.done = True
            return
        if replicating:
            self._unreplicated.append((written, group))
            return
        if log.sync_due:
            self._unsynced.append(group)
        else:
            group.done = True
        self._on_written(group)

    def flush(self) -> None:
        """On a clean stop: write and fsync everything, here and now."""
        self._write()
        self.log.sync()
        self._finish_all()

    def close(self) -> None:
        self._write()
        self.log.close()
        self._finish_all()

    def delete(self) -> None:
        """The log goes, with what was appended to it and not written (acknowledged as
        published, like a message in a deleted topic's memory)."""
        self.log.delete()
        if self.group is not None:
            self._unsynced.append(self.group)
            self.group = None
        self._finish_all()

    def _finish_all(self) -> None:
        for group in self._unsynced:
            group.done = True
        self._unsynced = []
