"""nsqd's storage: which engine keeps a topic, and the writes a publish waits for.

`open_topic_queue` is the one place an engine is chosen (docs/design.md §12): go-diskqueue
behind a memory buffer for classic topics (`BufferedTopicQueue`), a partition log for
partitioned topics and those `--log-topic` names (`LogTopicQueue`). Topics and channels then
see only their `MessageQueue`; the engines see only this object, never the daemon.

The rest is group commit (docs/design.md §3.4): writes made for publishes are remembered here
until the publishing connection's next commit, which writes every partition log's open group
and fsyncs every diskqueue whose `--sync-every` count is reached, before the publishes are
acknowledged. A failed write or sync turns `health` NOK.

Within one pass of the HTTP poller (`deferring_writes`), a publish that overflows to a
diskqueue does not write at once: the pass's records for each diskqueue are written with one
`os.write` when it ends, before any of its answers goes out (`DeferredWrite`).
"""

import fnmatch
import logging
import os
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Iterator
from contextlib import contextmanager
from functools import partial
from typing import TYPE_CHECKING

import trio

from nsqpy import network
from nsqpy.diskqueue import DiskQueue
from nsqpy.nsqd.backend import BackendWriteError, DroppingQueue, open_backend, write_error
from nsqpy.nsqd.health import Health
from nsqpy.nsqd.log_writer import LogWriter, WriteGroup
from nsqpy.nsqd.message import Message, MessageBatch
from nsqpy.nsqd.message_queue import BufferedTopicQueue, LogTopicQueue, TopicQueue
from nsqpy.nsqd.options import Options
from nsqpy.partition_log import PartitionLog, ProducerMark, log_exists

if TYPE_CHECKING:
    from nsqpy.nsqd.cursor_queue import CursorQueue


class DeferredWrite:
    """The messages that publishes of one HTTP poller pass appended to one diskqueue, written
    together (as records made in one go) when the pass ends; `done` then, and `error` says
    whether the write failed (its publishes are refused: nothing of them was kept in memory
    either)."""

    __slots__ = ("backend", "messages", "publishes", "failure", "args", "done", "error")
    # Written when the poller's pass ends, not by an (awaited) commit.
    ends_with_pass = True

    def __init__(self, backend: DiskQueue, failure: str, args: tuple) -> None:
        self.backend = backend
        self.messages: list[Message] = []
        self.publishes = 0
        # The line a failed write logs, as the immediate write would have.
        self.failure = failure
        self.args = args
        self.done = False
        self.error: Exception | None = None


# What a commit waits for: a group's write, a diskqueue's fsync, another commit's fsync.
Wait = Callable[[], Awaitable[object]]


async def wait_for_all(waits: list[Wait]) -> None:
    """Wait for each of `waits`, side by side: one slow disk flush does not queue the rest."""
    if len(waits) == 1:
        await waits[0]()
    elif waits:
        async with trio.open_nursery() as syncs:
            for wait in waits:
                syncs.start_soon(wait)


class Storage:
    """The storage engines of one nsqd, and the writes not yet made durable."""

    def __init__(self, options: Options, log: logging.Logger | logging.LoggerAdapter) -> None:
        # Swapped by PUT /config with the daemon's (queues opened later see the new values).
        self.options = options
        self.log = log
        self.health = Health(log)
        self.data_path = options.effective_data_path()
        # Publishes refused for a write the disk refused, by topic and partition (Youzan's
        # pub_failed_cnt; their sum is /serverstats' server_pub_failed).
        self.refused_publishes: Counter[tuple[str, int]] = Counter()
        # Diskqueues written since the last commit (dicts, not sets, here: their order is the
        # order of the writes, not of the objects' addresses, so one run is like the next).
        self._written_backends: dict[DiskQueue, None] = {}
        # Diskqueue fsyncs under way: a commit that finds its queues taken by another task's
        # commit waits for them (its writes may be in them).
        self._queue_syncs: dict[trio.Event, None] = {}
        # Partition logs appended to since the last commit: each writes its group then.
        self._written_logs: dict[LogWriter, None] = {}
        # Inside an HTTP poller pass: diskqueue overflow is written when it ends.
        self._deferring = False
        self._deferred: dict[DiskQueue, DeferredWrite] = {}
        # The deferred write of the latest publish of the pass, until its route takes it.
        self._last_deferred: DeferredWrite | None = None

    # -- choosing the engine --------------------------------------------------------------------

    def open_topic_queue(
        self,
        name: str,
        partition: int,
        *,
        backend_name: str,
        partitioned: bool,
        ephemeral: bool,
        ext: bool,
        sync_every: int,
        paused: Callable[[], bool],
        on_written: Callable[[int, int], None],
        wake_pump: Callable[[], None] = lambda: None,
    ) -> TopicQueue:
        """The queue of a new topic partition, on the engine that keeps it. `paused` says
        whether the topic holds its messages back; `on_written` is told how many messages (and
        body bytes) of a log topic were written (its channels read them then); `wake_pump` wakes
        the topic's pump (a log topic's moves to its delay queue)."""
        if not ephemeral and (partitioned or self.stores_as_log(name, partition)):
            options = self.options
            log = PartitionLog(
                self.data_path,
                name,
                partition,
                message_type=Message,
                max_bytes_per_file=options.max_bytes_per_file,
                sync_every=sync_every or options.sync_every,
                ext=ext,
                log=self.log,
            )
            return LogTopicQueue(
                self,
                log,
                backend_name=backend_name,
                legacy=self.open_legacy_queue(backend_name),
                paused=paused,
                on_written=on_written,
                wake_pump=wake_pump,
            )
        return BufferedTopicQueue(self, name, backend_name, ephemeral=ephemeral)

    def stores_as_log(self, name: str, partition: int) -> bool:
        """Whether an unpartitioned topic is a log topic: `--log-topic` matches its name, or
        its log is on disk already (a log is never hidden by a changed flag)."""
        if any(fnmatch.fnmatchcase(name, pattern) for pattern in self.options.log_topic):
            return True
        return log_exists(self.data_path, name, partition)

    def open_backend(self, name: str, *, ephemeral: bool) -> DiskQueue | DroppingQueue:
        return open_backend(name, self.options, ephemeral=ephemeral)

    def open_legacy_queue(self, name: str) -> DiskQueue | None:
        """The diskqueue an earlier nsqpy kept a partitioned topic's or channel's messages in,
        before partitioned topics were logs; None when there is none."""
        if not os.path.exists(os.path.join(self.data_path, f"{name}.diskqueue.meta.dat")):
            return None
        backend = open_backend(name, self.options, ephemeral=False)
        assert isinstance(backend, DiskQueue)
        return backend

    # -- writes a publish waits for -------------------------------------------------------------

    def write_to_backend(
        self,
        backend: DiskQueue | DroppingQueue,
        messages: list[Message],
        failure: str,
        args: tuple,
        deferrable: bool = False,
    ) -> None:
        """Append `messages` to a diskqueue, to be synced by the next commit (before the
        publish is acknowledged); health is OK again after it. A failed write (a full disk) is
        logged as `failure % args` and ` - <error>`, turns health NOK and raises
        BackendWriteError. `deferrable` (the publish keeps nothing of the messages elsewhere):
        inside `deferring_writes`, the write is made when the pass ends."""
        if deferrable and self._deferring and isinstance(backend, DiskQueue):
            deferred = self._deferred.get(backend)
            if deferred is None:
                deferred = self._deferred[backend] = DeferredWrite(backend, failure, args)
            deferred.messages += messages
            deferred.publishes += 1
            self._last_deferred = deferred
            return
        self._put(backend, failure, args, backend.put_many, list(map(Message.to_record, messages)))

    def write_framed_to_backend(
        self,
        backend: DiskQueue | DroppingQueue,
        batch: MessageBatch,
        start: int,
        failure: str,
        args: tuple,
    ) -> None:
        """`write_to_backend` for a batch's messages from `start` on: its records framed
        once for every queue that writes them (`MessageBatch.framed`)."""
        framed = batch.framed()
        self._put(
            backend,
            failure,
            args,
            backend.put_framed,
            framed.data,
            framed.ends,
            start,
            len(framed.ends),
            framed.largest,
        )

    def _put(
        self, backend: DiskQueue | DroppingQueue, failure: str, args: tuple, put, *what
    ) -> None:
        """`put(*what)` on `backend`, then health OK and the queue in the next commit's; a
        failed write logged as `failure % args`, health NOK, BackendWriteError raised."""
        try:
            put(*what)
        except OSError as os_error:
            self._write_failed(write_error(backend, os_error), failure, *args)
        self.health.write_done(None)
        if isinstance(backend, DiskQueue):
            self._written_backends[backend] = None

    @property
    def deferring(self) -> bool:
        """Inside `deferring_writes`: a deferrable write waits for the pass to end."""
        return self._deferring

    @contextmanager
    def deferring_writes(self) -> Iterator[None]:
        """One pass of the HTTP poller: diskqueue writes of publishes (`deferrable`) are
        collected and made when it ends, one `os.write` per diskqueue. Nothing awaits inside,
        so no other task sees a queue with records not yet written."""
        self._deferring = True
        try:
            yield
        finally:
            self._deferring = False
            self._last_deferred = None
            if self._deferred:
                self.write_deferred()

    def write_deferred(self) -> None:
        """Make the writes deferred so far (before a request that is not a publish reads or
        changes a queue, and when the pass ends)."""
        deferred, self._deferred = self._deferred, {}
        for backend, write in deferred.items():
            try:
                backend.put_many(list(map(Message.to_record, write.messages)))
            except Exception as error:  # every failure (a closed queue too) refuses the publishes
                failed = (
                    write_error(backend, error)
                    if isinstance(error, OSError)
                    else BackendWriteError(str(error))
                )
                self.log.error(write.failure + " - %s", *write.args, failed)
                self.health.write_done(failed)
                self.refused(backend.name, 0, write.publishes)
                write.error = failed
            else:
                self.health.write_done(None)
                self._written_backends[backend] = None
            write.done = True

    def take_deferred(self) -> DeferredWrite | None:
        """The deferred write that the publish just answered made, if it made one."""
        write, self._last_deferred = self._last_deferred, None
        return write

    def append_to_log(
        self,
        writer: LogWriter,
        messages: list[Message],
        topic: str,
        producer: ProducerMark | None = None,
    ) -> WriteGroup:
        """Append a publish to a partition log's open group, to be written by the next commit
        (before the publish is acknowledged; `WriteGroup.error` then says whether it was).
        `producer`: an idempotent publish's. BackendWriteError if the log is closed."""
        try:
            group = writer.append(messages, producer)
        except OSError as os_error:
            self._write_failed(
                write_error(writer.log, os_error, writer.log.active_segment_path),
                "TOPIC(%s) ERROR: failed to write message to log",
                topic,
            )
        self._written_logs[writer] = None
        return group

    def refused(self, topic: str, partition: int, publishes: int = 1) -> None:
        """`publishes` to a topic's partition refused because the disk refused their write."""
        self.refused_publishes[topic, partition] += publishes

    def _write_failed(self, error: BackendWriteError, failure: str, *args) -> None:
        """A failed write: logged as `failure % args - <error>`, health NOK, raised."""
        self.log.error(failure + " - %s", *args, error)
        self.health.write_done(error)
        raise error from None

    def commit_due(self) -> bool:
        """Whether a publish has anything to wait for: a partition log's group to write, or a
        diskqueue written since the last commit that reached its `--sync-every` count."""
        return bool(self._written_logs) or any(
            backend.sync_due for backend in self._written_backends
        )

    async def commit(self, groups: Iterable[WriteGroup] = ()) -> None:
        """Before publishes are acknowledged: write every partition log's open group, wait
        until `groups` (the log publishes being answered) are done (`nsqd/log_writer.py`),
        and fsync every diskqueue whose `--sync-every` count is reached. fsyncs run in worker
        threads so the event loop never waits on the disk."""
        await wait_for_all(self.begin_commit(groups))

    def begin_commit(self, groups: Iterable[WriteGroup] = ()) -> list[Wait]:
        """What `commit` does at once, before any other task runs: the open groups written,
        and each diskqueue sync due begun and registered, its metadata taken now, so that a
        commit of another task that finds nothing left to take still waits for it; what is
        left to wait for. Every sync begun must be waited for (`wait_for_all`)."""
        if self._written_logs:
            writers, self._written_logs = self._written_logs, {}
            for writer in writers:
                writer.write_now()
        waits: list[Wait] = [
            partial(group.writer.wait, group)
            for group in dict.fromkeys(g for g in groups if not g.done)
        ]
        if self._queue_syncs:
            # Another task's commit took the written queues and is syncing them: what this
            # task wrote may be among them, and is answered only once they are synced.
            waits.extend(event.wait for event in self._queue_syncs)
        if self._written_backends:
            backends, self._written_backends = self._written_backends, {}
            for backend in backends:
                if backend.sync_due:
                    waits.append(self._begin_sync(backend))
        return waits

    def _begin_sync(self, backend: DiskQueue) -> Wait:
        """A diskqueue fsync publishes wait for, its metadata taken now: the commits of other
        tasks wait for it too."""
        done = trio.Event()
        self._queue_syncs[done] = None
        try:
            job: Callable[[], bool] | Exception = backend.prepare_sync()
        except Exception as error:  # a queue closed meanwhile: the waiter raises it
            job = error

        async def finish() -> None:
            try:
                if isinstance(job, Exception):
                    raise job
                await self._run_sync_job(backend, job)
            finally:
                self._queue_syncs.pop(done, None)
                done.set()

        return finish

    async def sync_backend(self, backend: "DiskQueue | PartitionLog | CursorQueue") -> None:
        """Run one sync job off the loop; a failure (the job logs it) makes health NOK."""
        await self._run_sync_job(backend, backend.prepare_sync())

    async def _run_sync_job(
        self, backend: "DiskQueue | PartitionLog | CursorQueue", job: Callable[[], bool]
    ) -> None:
        ok = await network.current().run_sync(job)
        if ok:
            self.health.sync_done(None)
            return
        reason = getattr(backend, "sync_error", "")
        self.health.sync_done(
            f"DISKQUEUE({backend.name}) failed to sync" + (f" - {reason}" if reason else "")
        )
