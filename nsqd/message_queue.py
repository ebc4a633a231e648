"""The storage seam: where a topic's backlog and a channel's messages wait to be delivered.

Topics and channels talk to their storage only through the protocols below, so a second
storage engine plugs in without touching the wire protocols, the HTTP API or the stats
(docs/design.md §12); `nsqd/storage.py` chooses the engine. The channel keeps what is in
flight and deferred (`DeadlineQueue`); the queue holds what waits, and is told when a
delivered message is acknowledged or handed back.

`BufferedDiskQueue` is the engine of classic topics: Go's memory channel of `--mem-queue-size`
messages, then go-diskqueue for the overflow (a `DroppingQueue` for #ephemeral names), a
message deleted once it is read. Log topics (docs/design.md §13) keep every message in their
partition's log: the topic appends through `LogTopicQueue`, each channel reads through its
cursor (`nsqd/cursor_queue.py`).
"""

import time
from collections import deque
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Protocol

import trio

from nsqpy import network
from nsqpy.common.guid import GUIDFactory
from nsqpy.nsqd.backend import BackendWriteError, DroppingQueue
from nsqpy.nsqd.cursor_queue import CursorQueue
from nsqpy.nsqd.delay_queue import DelayedRecord, DelayQueue
from nsqpy.nsqd.idempotence import ProducerSequences
from nsqpy.nsqd.log_writer import LogWriter
from nsqpy.nsqd.message import RECORD_OVERHEAD, Message, MessageBatch, records_as_runs
from nsqpy.partition_log import (
    PartitionLog,
    Position,
    ProducerMark,
    delayed_records,
    record_size,
)

if TYPE_CHECKING:
    from nsqpy.diskqueue import DiskQueue
    from nsqpy.nsqd.log_writer import WriteGroup
    from nsqpy.nsqd.storage import Storage


class MessageQueue(Protocol):
    """What a topic or channel may ask of its storage."""

    @property
    def depth(self) -> int:
        """Messages waiting, memory and disk."""

    @property
    def backend_depth(self) -> int:
        """Of `depth`, the messages on disk (the stats' `backend_depth`)."""

    def has_messages(self) -> bool: ...

    def append(
        self, messages: "list[Message] | MessageBatch", *, strict: bool = False
    ) -> BackendWriteError | None:
        """New messages, all or nothing when `strict` (a publish not yet acknowledged: a failed
        write raises and keeps none). Otherwise (messages nsqd already holds) a failed write
        keeps them in memory, so none is lost, and returns the error. A MessageBatch comes
        only to the queues of a topic whose queue `keeps_batches`."""

    def put_back(self, messages: list[Message], *, first: bool = False) -> None:
        """Delivered messages handed back (REQ, a timeout, a deferral that came due): after
        what waits, or before it when `first` (ordered delivery redelivers first)."""

    def take(self, max_count: int) -> list[Message]:
        """Up to `max_count` messages to deliver, oldest first."""

    def acknowledge(self, message: Message) -> None:
        """A delivered message was FINished: it is done for good."""

    def skip_to_end(self) -> None:
        """Drop what waits now (SUB_ADVANCED `special:-1` starts at the end)."""

    def seek(self, kind: str, value: int) -> None:
        """Deliver from a consume offset on (Youzan's `<type>:<value>`, docs/protocol.md
        §3.8); ValueError for one this queue cannot serve."""

    def empty(self) -> None:
        """Drop everything (Go's Empty), files included."""

    def flush(self, unacknowledged: list[Message]) -> int:
        """On a clean stop: keep what waits and `unacknowledged` (in flight and deferred) so a
        restart delivers them again. How many were kept."""

    async def sync_dirty(self) -> None:
        """The periodic sync (`--sync-timeout`): fsync what was written and is not yet."""

    def close(self) -> None: ...

    def delete(self) -> None:
        """The queue and its files go."""

    @property
    def requeue_on_leave(self) -> bool:
        """Whether a leaving consumer's in-flight messages go back at once (Youzan's
        RequeueClientMessages on log topics) rather than when they time out (Go)."""

    def position_stats(self) -> dict[str, int]:
        """Where the queue stands in a retained log, for `/stats` (a cursor's confirmed and
        read positions and lag); empty when it keeps no history."""

    def oldest_unconfirmed_ns(self) -> int:
        """When the oldest message not yet confirmed was published (ns since the epoch; 0
        when none waits, or the queue keeps no history): Youzan's `depth_ts`."""


class RetainedLog(Protocol):
    """What range readers (`/partition/*`, `/stats`) may ask of a topic's retained log."""

    @property
    def start(self) -> Position: ...

    @property
    def end(self) -> Position: ...

    def position_of_count(self, count: int) -> Position: ...

    def position_at_or_after(self, offset: int) -> Position: ...

    def position_of_id(self, message_id: int) -> Position | None: ...

    def read(self, position: Position, max_count: int, end: int | None = None) -> list: ...

    def search_timestamp(self, timestamp_ns: int) -> Position: ...

    def read_raw(
        self, start: Position, end: int, max_bytes: int, *, starts: list[int] | None = None
    ) -> tuple[bytes, Position]: ...


class TopicQueue(MessageQueue, Protocol):
    """A topic's side of its storage: a MessageQueue, and what a publish and the channels
    need of the engine."""

    @property
    def next_offset(self) -> int:
        """The partition's virtual byte position: where the next record would begin."""

    def continue_offsets(self, offset: int) -> None:
        """Offsets go on from `offset`, where nsqd.dat left them (a log knows its own)."""

    def next_id(self) -> bytes: ...

    def next_ids(self, count: int) -> list[bytes]: ...

    @property
    def keeps_batches(self) -> bool:
        """Whether a plain MPUB may reach this queue and its channels' as one MessageBatch."""

    def accept(self, messages: "list[Message] | MessageBatch", body_bytes: int) -> bool:
        """A publish (IDs set, `defer`, trace and ext header too): True when the queue keeps
        it for the channels itself (a log, read by the channels' cursors once written), False
        when the topic hands it to its channels or `append`s it. Offsets are set either way.
        BackendWriteError when it cannot be kept."""

    @property
    def write_group(self) -> "WriteGroup | None":
        """The open group the last publish went into, which its answer waits for (a log);
        None when a publish is durable once the commit syncs (a diskqueue)."""

    @property
    def waiting_bytes(self) -> int:
        """Body bytes of publishes taken but not yet acknowledged (a log's groups waiting to
        be written, replicated or synced): Youzan's pub waiting bytes. 0 for a diskqueue."""

    @property
    def seekable(self) -> bool:
        """Whether a channel may start anywhere in what is kept (SUB_ADVANCED)."""

    @property
    def retained(self) -> RetainedLog | None:
        """The log of every message kept, for range reads; None for a diskqueue."""

    def open_channel_queue(
        self,
        channel: str,
        *,
        ephemeral: bool,
        deferred: Callable[[], Iterable[Message]],
        defer: Callable[[Message, float], None],
        ordered: Callable[[], bool] = lambda: False,
    ) -> MessageQueue:
        """A new channel's queue: `deferred` lists what waits in its deferred queue now,
        `defer` holds a message read from a log for that many seconds (a DPUB's in an
        `ordered` channel)."""

    async def clean(
        self, *, keep_bytes: float, older_than: float, move_delayed: bool = True
    ) -> int:
        """Retention (docs/design.md §13): remove what every channel has confirmed past that is
        older than `older_than` (unix seconds) or beyond `keep_bytes`; how many segments went.
        `move_delayed`: this node writes the partition, and may write delayed messages whose
        records would go again at the end."""

    @property
    def moves_pending(self) -> bool:
        """Whether channels asked to move messages to the end of their delay (a log's delay
        queue): the topic's pump then calls `write_moves`."""

    async def write_moves(self) -> None: ...

    def take_runs(self, max_count: int) -> "list[list[Message] | MessageBatch]":
        """About `max_count` of the backlog for the topic's pump, in order: an MPUB's
        messages as one MessageBatch (from memory whole, from the diskqueue rebuilt), which
        the channels share; the others as lists of Messages."""

    async def runs_moved(self) -> None:
        """The channels took what `take_runs` gave: once `--sync-every` is reached, their
        diskqueues are synced, then the topic's, whose read position then says so (a crash
        makes the pump move again at most one turn's messages)."""


class BufferedDiskQueue:
    """Memory while it has room (`--mem-queue-size`), then the diskqueue; Go's channel.put."""

    __slots__ = (
        "storage",
        "memory",
        "memory_count",
        "backend",
        "mem_queue_size",
        "_failure",
        "_failure_args",
    )

    def __init__(
        self,
        storage: "Storage",
        backend_name: str,
        *,
        ephemeral: bool,
        failure: str,
        failure_args: tuple,
    ) -> None:
        self.storage = storage
        # Messages, and MessageBatches of many: `memory_count` counts the messages.
        self.memory: deque[Message | MessageBatch] = deque()
        self.memory_count = 0
        self.backend: DiskQueue | DroppingQueue = storage.open_backend(
            backend_name, ephemeral=ephemeral
        )
        self.mem_queue_size = storage.options.mem_queue_size
        # The error line a failed write logs, with its arguments (Go's texts differ by owner).
        self._failure = failure
        self._failure_args = failure_args

    @property
    def depth(self) -> int:
        return self.memory_count + self.backend.depth

    @property
    def backend_depth(self) -> int:
        return self.backend.depth

    def has_messages(self) -> bool:
        return self.memory_count > 0 or self.backend.depth > 0

    def append(
        self, messages: "list[Message] | MessageBatch", *, strict: bool = False
    ) -> BackendWriteError | None:
        memory = self.memory
        count = len(messages)
        room = self.mem_queue_size - self.memory_count
        if room >= count:
            if isinstance(messages, MessageBatch):
                memory.append(messages)
            else:
                memory.extend(messages)
            self.memory_count += count
            return None
        if isinstance(messages, MessageBatch):
            if not (strict and room <= 0 and self.storage.deferring):
                return self._append_batch(messages, room, strict=strict)
            # As Messages, the batch itself left as it was (the publisher counts it).
            messages = messages.view().take(count)
        # The overflow first, so a failed write leaves nothing half-kept in memory.
        overflow = messages[room:] if room > 0 else messages
        try:
            # A strict publish that memory keeps nothing of may have its write made when the
            # HTTP poller's pass ends (Storage.deferring_writes): a failure then refuses it.
            self._write(overflow, deferrable=strict and room <= 0)
        except BackendWriteError as error:
            if strict:
                raise
            memory.extend(messages)
            self.memory_count += count
            return error
        if room > 0:
            memory.extend(messages[:room])
            self.memory_count += room
        return None

    def _append_batch(
        self, batch: MessageBatch, room: int, *, strict: bool
    ) -> BackendWriteError | None:
        """`append` of a batch memory cannot hold all of: what overflows written as the
        batch's shared records (framed once for all the channels that take it), the rest
        kept in memory as Messages; the batch itself left as it was."""
        kept = max(room, 0)
        try:
            self.storage.write_framed_to_backend(
                self.backend, batch, batch.start + kept, self._failure, self._failure_args
            )
        except BackendWriteError as error:
            if strict:
                raise
            self.memory.append(batch.view())
            self.memory_count += len(batch)
            return error
        if kept:
            self.memory.extend(batch.view().take(kept))
            self.memory_count += kept
        return None

    def put_back(self, messages: list[Message], *, first: bool = False) -> None:
        if first:
            self.memory.extendleft(reversed(messages))
            self.memory_count += len(messages)
        else:
            self.append(messages)

    def take(self, max_count: int) -> list[Message]:
        memory = self.memory
        taken: list[Message] = []
        if self.memory_count:
            append = taken.append
            popleft = memory.popleft
            wanted = max_count
            while wanted and memory:
                item = popleft()
                if not isinstance(item, MessageBatch):
                    append(item)
                    wanted -= 1
                    continue
                part = item.take(wanted)
                taken += part
                wanted -= len(part)
                if len(item):
                    memory.appendleft(item)
            self.memory_count -= len(taken)
        if len(taken) < max_count and self.backend.depth:
            from_record = Message.from_record
            taken.extend(from_record(r) for r in self.backend.get_many(max_count - len(taken)))
        return taken

    def _clear_memory(self) -> None:
        self.memory.clear()
        self.memory_count = 0

    def acknowledge(self, message: Message) -> None:
        """Nothing to do: a diskqueue forgets a message once it is read."""

    def skip_to_end(self) -> None:
        self._clear_memory()
        self.backend.empty()

    def seek(self, kind: str, value: int) -> None:
        """A diskqueue cannot go back: only `special:-1`, the end."""
        if (kind, value) != ("special", -1):
            raise ValueError(f"consume start {kind}:{value} is not supported yet (only special:-1)")
        self.skip_to_end()

    def empty(self) -> None:
        self._clear_memory()
        self.backend.empty()

    def flush(self, unacknowledged: list[Message]) -> int:
        messages = self.take(self.memory_count)  # all of memory: the diskqueue is not read
        messages.extend(unacknowledged)
        if not messages:
            return 0
        try:
            self._write(messages)
        except BackendWriteError:
            return 0  # logged; nowhere else to keep them on the way out
        return len(messages)

    async def sync_dirty(self) -> None:
        backend = self.backend
        if isinstance(backend, DroppingQueue) or not backend.dirty:
            return
        await self.storage.sync_backend(backend)

    def close(self) -> None:
        self.backend.close()

    def delete(self) -> None:
        self._clear_memory()
        # Go's exit(deleted): Empty() removes the files, Delete() closes the queue.
        self.backend.empty()
        self.backend.delete()

    # Go keeps a leaving consumer's messages in flight until they time out.
    requeue_on_leave = False

    def position_stats(self) -> dict[str, int]:
        return {}

    def oldest_unconfirmed_ns(self) -> int:
        return 0

    def _write(self, messages: list[Message], *, deferrable: bool = False) -> None:
        """BackendWriteError (health NOK, logged) if the diskqueue write fails."""
        self.storage.write_to_backend(
            self.backend, messages, self._failure, self._failure_args, deferrable
        )


class BufferedTopicQueue(BufferedDiskQueue):
    """A classic topic's queue: its backlog until it has channels, which get their own
    `BufferedDiskQueue`s; message IDs from nsqd's GUID factory, offsets counted."""

    __slots__ = ("backend_name", "topic_name", "guids", "next_offset")

    def __init__(self, storage: "Storage", topic: str, backend_name: str, *, ephemeral: bool):
        super().__init__(
            storage,
            backend_name,
            ephemeral=ephemeral,
            failure="TOPIC(%s) ERROR: failed to write message to backend",
            failure_args=(topic,),
        )
        self.backend_name = backend_name
        self.topic_name = topic
        self.guids = GUIDFactory(storage.options.node_id)
        self.next_offset = 0

    def continue_offsets(self, offset: int) -> None:
        self.next_offset = offset

    def next_id(self) -> bytes:
        return self.guids.next_id()

    def next_ids(self, count: int) -> list[bytes]:
        return self.guids.next_ids(count)

    def accept(self, messages: "list[Message] | MessageBatch", body_bytes: int) -> bool:
        # Nothing is written here: the topic fans the publish out, or stores it (`append`).
        offset = self.next_offset
        if isinstance(messages, MessageBatch):
            messages.offset = offset
            self.next_offset = offset + RECORD_OVERHEAD * len(messages) + body_bytes
            return False
        for message in messages:
            message.offset = offset
            offset += RECORD_OVERHEAD + len(message.body)
        self.next_offset = offset
        return False

    keeps_batches = True
    write_group = None
    waiting_bytes = 0
    seekable = False
    retained = None

    def open_channel_queue(
        self,
        channel: str,
        *,
        ephemeral: bool,
        deferred: Callable[[], Iterable[Message]],
        defer: Callable[[Message, float], None],
        ordered: Callable[[], bool] = lambda: False,
    ) -> MessageQueue:
        # Go's `<topic>:<channel>`; a partition p > 0 names its channels `<topic>#<p>:<channel>`
        # so two partitions' channels never share files.
        return BufferedDiskQueue(
            self.storage,
            f"{self.backend_name}:{channel}",
            ephemeral=ephemeral,
            failure="CHANNEL(%s:%s) ERROR: failed to write messages to backend",
            failure_args=(self.topic_name, channel),
        )

    async def clean(
        self, *, keep_bytes: float, older_than: float, move_delayed: bool = True
    ) -> int:
        return 0  # a diskqueue keeps nothing that was read

    moves_pending = False

    async def write_moves(self) -> None:
        pass  # a diskqueue topic's channels keep their delays in memory

    def take_runs(self, max_count: int) -> "list[list[Message] | MessageBatch]":
        memory = self.memory
        runs: list[list[Message] | MessageBatch] = []
        singles: list[Message] = []
        wanted = max_count
        while wanted > 0 and memory:
            item = memory.popleft()
            if isinstance(item, MessageBatch):
                if singles:
                    runs.append(singles)
                    singles = []
                runs.append(item)
                count = len(item)
            else:
                singles.append(item)
                count = 1
            self.memory_count -= count
            wanted -= count
        if singles:
            runs.append(singles)
        if wanted > 0 and self.backend.depth:
            runs += records_as_runs(self.backend.get_many(wanted))
        return runs

    async def runs_moved(self) -> None:
        backend = self.backend
        if not isinstance(backend, DroppingQueue) and backend.sync_due:  # an ephemeral one: none
            await self.storage.commit()  # the channels' copies first
            await self.storage.sync_backend(backend)


class LogTopicQueue:
    """A log topic's side of its partition log: a publish is appended and the channels, as
    cursors, read it; nothing waits in the topic itself (docs/design.md §13)."""

    def __init__(
        self,
        storage: "Storage",
        log: PartitionLog[Message],
        *,
        backend_name: str,
        legacy: "DiskQueue | None",
        paused: Callable[[], bool],
        on_written: Callable[[int, int], None],
        wake_pump: Callable[[], None] = lambda: None,
    ) -> None:
        self.storage = storage
        self.log = log
        self.writer = LogWriter(storage, log, self._group_written)
        self.topic = log.topic

        # Idempotent publishes: each producer's sequence (PUB_SEQ, MPUB_SEQ).
        def expiration() -> float:
            return storage.options.producer_id_expiration

        self.producers = ProducerSequences(log, expiration)
        # Every replica writes producer snapshots as its segments roll: a new leader starts
        # from them.
        log.producer_expiration = expiration
        self._snapshot_writing = trio.Lock()
        # Where the partition's diskqueues were (`Topic.backend_name`): an earlier nsqpy's.
        self.backend_name = backend_name
        self._paused = paused
        self._on_written = on_written
        # The channels' cursors, for retention's floor.
        self.cursors: dict[str, CursorQueue] = {}
        # Delayed messages (DPUBs, and messages channels moved to the end of their delay),
        # indexed by channel and due time (`nsqd/delay_queue.py`).
        self.delay_queue = DelayQueue(log.delay_queue_path, storage.log)
        log.on_cut_back = self.delay_queue.cut_back
        self.delay_queue.on_behind = self._index_again
        # Moves asked for and not yet written (`write_moves`, from the topic's pump).
        self._moves: list[tuple[CursorQueue, Message, int]] = []
        # The topic's pump writes them.
        self.wake_pump = wake_pump
        # Whether the log was just made from a diskqueue (see `_migrate`).
        self.migrated = legacy is not None and self._migrate(legacy)

    def _migrate(self, legacy: "DiskQueue") -> bool:
        """Messages kept in this partition's diskqueue (by an earlier nsqpy, or by this topic
        before `--log-topic` named it) go into the log, with new IDs; the diskqueue is then
        removed. Its channels then start at the log's start, not its end."""
        log = self.log
        moved = 0
        while records := legacy.get_many(1024):
            messages = []
            for record in records:
                old = Message.from_record(record)
                messages.append(Message(log.next_id(), old.body, old.timestamp))
            log.append(messages)
            log.commit()
            moved += len(messages)
        log.sync()
        legacy.empty()
        legacy.delete()
        self.storage.log.info(
            "TOPIC(%s) partition %d: moved %d messages from its diskqueue into its log",
            self.topic,
            log.partition,
            moved,
        )
        return True

    depth = 0
    backend_depth = 0
    seekable = True
    requeue_on_leave = True

    @property
    def next_offset(self) -> int:
        return self.log.appended.offset

    def continue_offsets(self, offset: int) -> None:
        pass

    def next_id(self) -> bytes:
        return self.log.next_id()

    def next_ids(self, count: int) -> list[bytes]:
        return self.log.next_ids(count)

    keeps_batches = False

    def accept(self, messages: "list[Message] | MessageBatch", body_bytes: int) -> bool:
        """Into the log's open group, once, written by nsqd's next commit
        (`nsqd/log_writer.py`); the channels read it as cursors once it is written."""
        assert not isinstance(messages, MessageBatch)  # keeps_batches is False
        defer = messages[0].defer
        if defer:
            # A DPUB's record carries its due time: durable and replicated with it.
            due_ms = int((time.time() + defer) * 1000)
            for message in messages:
                message.delay = ("", due_ms)
        group = self._append(messages, body_bytes)
        if defer:
            group.delays.extend(
                DelayedRecord("", message.id, message.offset, message.count, due_ms)
                for message in messages
            )
        return True

    def accept_sequenced(
        self, messages: list[Message], body_bytes: int, producer: ProducerMark, first: int
    ) -> "WriteGroup":
        """An idempotent publish that `producers.check` let through: into the log's open
        group with its producer, which the producer's next check sees as pending."""
        group = self._append(messages, body_bytes, producer)
        self.producers.appended(producer.producer_id, first, producer.sequence, group)
        return group

    def _append(
        self, messages: list[Message], body_bytes: int, producer: ProducerMark | None = None
    ) -> "WriteGroup":
        """Into the log's open group, which counts them once written."""
        group = self.storage.append_to_log(self.writer, messages, self.topic, producer)
        group.count += len(messages)
        group.publishes += 1
        group.body_bytes += body_bytes
        return group

    @property
    def write_group(self) -> "WriteGroup | None":
        return self.writer.group

    @property
    def waiting_bytes(self) -> int:
        return self.writer.waiting_bytes

    @property
    def retained(self) -> RetainedLog:
        return self.log

    def open_channel_queue(
        self,
        channel: str,
        *,
        ephemeral: bool,
        deferred: Callable[[], Iterable[Message]],
        defer: Callable[[Message, float], None],
        ordered: Callable[[], bool] = lambda: False,
    ) -> MessageQueue:
        """A cursor into the log (docs/design.md §13)."""
        delayed_here = not ephemeral
        cursor = CursorQueue(
            self.storage,
            self.log,
            channel,
            self.storage.options.max_confirm_win,
            paused=self._paused,
            start_at_log_start=self.migrated,
            legacy=self.storage.open_legacy_queue(f"{self.backend_name}:{channel}"),
            deferred=deferred,
            defer=defer,
            delay_queue=self.delay_queue if delayed_here else None,
            move=self._ask_move if delayed_here else None,
            ordered=ordered,
        )
        self.cursors[channel] = cursor
        if delayed_here:
            self._recover_delayed(channel)
        return cursor

    # -- the delay queue (`nsqd/delay_queue.py`) -------------------------------------------------

    def _delay_channels(self) -> list[str]:
        """The channels whose delayed messages the delay queue keeps: not an ephemeral or an
        ordered one (those hold a DPUB in memory)."""
        return [
            name
            for name, cursor in self.cursors.items()
            if not cursor.closed and cursor.delay_queue is not None and not cursor.ordered()
        ]

    def index_delayed(self, records: "Sequence[DelayedRecord]") -> None:
        """Delayed records just written (here, or by the leader) go into the delay queue."""
        self.delay_queue.add(records, self._delay_channels)

    def index_raw(self, data: bytes, first: Position) -> None:
        """Groups a catch-up copied as the leader wrote them (`data`, from `first`): their
        delayed records go into the delay queue."""
        found = delayed_records(data, first)
        if found:
            self.index_delayed([DelayedRecord(*record) for record in found])

    def _index_again(self) -> None:
        """A refused write left the index behind the log: index it again from what it last
        committed, as a start does after a crash."""
        for channel in self._delay_channels():
            # Through what the cursors read: records written and not yet synced too.
            self._recover_delayed(channel, self.log.end.offset)

    def _recover_delayed(self, channel: str, through: int | None = None) -> None:
        """Index again what a crash left out: the channel's delayed records written after the
        offset the committed index covers (through the log's synced end, or `through`)."""
        log, delay_queue = self.log, self.delay_queue
        position = log.position_at_or_after(max(delay_queue.applied, log.start.offset))
        end = log.written.offset if through is None else through
        found: list[DelayedRecord] = []
        while position.offset < end:
            messages = log.read(position, 1024, end)
            if not messages:
                break
            for message in messages:
                if message.delay is not None and message.delay[0] in ("", channel):
                    found.append(
                        DelayedRecord(
                            channel, message.id, message.offset, message.count, message.delay[1]
                        )
                    )
            last = messages[-1]
            position = Position(last.offset + record_size(last, log.ext), last.count + 1)
        log.read_delayed = False
        if found:
            delay_queue.add(found, lambda: (channel,), again=True)

    def _ask_move(self, cursor: CursorQueue, message: Message, due_ms: int) -> None:
        self._moves.append((cursor, message, due_ms))
        self.wake_pump()

    @property
    def moves_pending(self) -> bool:
        return bool(self._moves)

    async def write_moves(self) -> None:
        """Write the moves asked for (the topic's pump): each message's copy goes into the log
        with its channel and due time, replicated as any publish; once written, the delay
        queue holds it and the channel lets the original go (`CursorQueue.moved`). A write
        that fails leaves them deferred in memory, as they were."""
        moves, self._moves = self._moves, []
        copies = [
            _delayed_copy(message, cursor.channel, due_ms) for cursor, message, due_ms in moves
        ]
        try:
            group = self.storage.append_to_log(self.writer, copies, self.topic)
        except BackendWriteError as error:
            self._moves_failed(moves, error)
            return
        group.delays.extend(
            DelayedRecord(cursor.channel, copy.id, copy.offset, copy.count, due_ms)
            for (cursor, _message, due_ms), copy in zip(moves, copies, strict=True)
        )
        refused = self.delay_queue.refused_adds
        await self.storage.commit([group])
        if group.error is not None:
            self._moves_failed(moves, group.error)
            return
        if self.delay_queue.refused_adds != refused:
            # Written, and not indexed (a full disk): the message stays in memory to come when
            # due; the copy is indexed once the disk takes writes again, and may come once more.
            self._moves_failed(moves, "the delay queue's index cannot be written")
            return
        for cursor, message, _due_ms in moves:
            if not cursor.closed:
                cursor.moved(message)

    def _moves_failed(self, moves: list[tuple[CursorQueue, Message, int]], error: object) -> None:
        self.storage.log.warning(
            "TOPIC(%s) partition %d: %d delayed messages stay in memory - %s",
            self.topic,
            self.log.partition,
            len(moves),
            error,
        )
        for cursor, message, _due_ms in moves:
            cursor.move_failed(message)

    # -- a cluster partition's writes (docs/design.md §14) --------------------------------------

    def set_write_epoch(self, epoch: int) -> None:
        """The epoch the cluster's metadata gives the partition's writes (fencing)."""
        self.log.write_epoch = epoch

    def replicate_with(
        self, replicate: "Callable[[list, Sequence[DelayedRecord]], Awaitable[None]] | None"
    ) -> None:
        """As the leader: every written group goes to the followers through `replicate`
        before its publishes are answered (None: no followers)."""
        self.writer.replicate = replicate

    def on_disk_state(self, report: "Callable[[OSError | None], None] | None") -> None:
        """`report` hears when the disk starts refusing the log's writes (the error) and when
        it takes one again (None): a cluster leader gives its partition up meanwhile."""
        self.writer.on_disk_state = report

    def stop_writes(self, refusal: Exception) -> None:
        """No longer the leader: what was appended and not written is refused with
        `refusal`, and nothing more is replicated from here."""
        self.writer.abandon(refusal)
        self.writer.replicate = None

    def _group_written(self, group: "WriteGroup") -> None:
        """A group was written (and replicated): its delayed records go into the delay queue
        before any channel can read them; then the topic counts it and its channels read
        it."""
        if group.delays:
            self.index_delayed(group.delays)
        self._on_written(group.count, group.body_bytes)

    def open_cursors(self) -> list[CursorQueue]:
        """The cursors of the channels the topic has now."""
        cursors = self.cursors
        for name in [name for name, cursor in cursors.items() if cursor.closed]:
            del cursors[name]
        return list(cursors.values())

    async def clean(
        self, *, keep_bytes: float, older_than: float, move_delayed: bool = True
    ) -> int:
        """A partition without channels is never cleaned. The producer snapshot a roll made
        due is written first, or the one a periodic sync is writing is waited for: the log
        removes only segments one covers.
        Delayed messages whose records would go are written again at the end first
        (`move_delayed`: where this node writes the partition), so a delay never holds
        retention back; one out for delivery does until it is finished."""
        cursors = self.open_cursors()
        if not cursors:
            return 0
        await self._write_due_snapshot()
        floor = min(cursor.confirmed.offset for cursor in self.open_cursors() or cursors)
        if move_delayed:
            start = self.log.start_after_clean(floor, keep_bytes=keep_bytes, older_than=older_than)
            await self._rewrite_delayed_before(start)
        oldest_delayed = self.delay_queue.oldest_offset()
        if oldest_delayed is not None:
            floor = min(floor, oldest_delayed)
        return self.log.clean(floor, keep_bytes=keep_bytes, older_than=older_than)

    async def _rewrite_delayed_before(self, offset: int) -> None:
        """Write the waiting delayed messages whose records are before `offset` again at the
        log's end, with their channel and due time; the delay queue then points at the new
        records."""
        while waiting := self.delay_queue.waiting_before(offset, 1000):
            copies = []
            for record in waiting:
                position = Position(record.offset, record.count)
                original = self.log.read_message(position, record.message_id)
                if original is None:
                    self.delay_queue.done(record.channel, record.message_id)
                    continue
                copies.append(_delayed_copy(original, record.channel, record.due_ms))
            self.log.read_delayed = False
            if not copies:
                continue
            group = self.storage.append_to_log(self.writer, copies, self.topic)
            group.delays.extend(
                DelayedRecord(copy.delay[0], copy.id, copy.offset, copy.count, copy.delay[1])
                for copy in copies
                if copy.delay is not None
            )
            await self.storage.commit([group])
            if group.error is not None:
                return  # kept where they are: retention waits for them

    def has_messages(self) -> bool:
        return False

    def append(
        self, messages: "list[Message] | MessageBatch", *, strict: bool = False
    ) -> BackendWriteError | None:
        raise AssertionError("a log topic's publishes are accepted, not appended")

    def put_back(self, messages: list[Message], *, first: bool = False) -> None:
        raise AssertionError("a log topic hands nothing out")

    def take(self, max_count: int) -> list[Message]:
        return []

    def take_runs(self, max_count: int) -> "list[list[Message] | MessageBatch]":
        return []

    async def runs_moved(self) -> None:
        pass

    def acknowledge(self, message: Message) -> None:
        pass

    def skip_to_end(self) -> None:
        pass

    def seek(self, kind: str, value: int) -> None:
        pass

    def empty(self) -> None:
        """The log is kept; emptying a channel moves its cursor (CursorQueue.empty)."""

    def flush(self, unacknowledged: list[Message]) -> int:
        self.writer.flush()
        return 0

    async def sync_dirty(self) -> None:
        if self.writer.dirty:
            await self.writer.sync()
        if self.delay_queue.due_to_commit(self.log.end.offset):
            self.delay_queue.commit(self.log.end.offset)
        # Here, not in a sync that publishes wait for: the job reads a whole segment.
        await self._write_due_snapshot()

    async def _write_due_snapshot(self) -> None:
        """The producer snapshot a roll made due, written in a worker thread. One at a time:
        a clean waits for the one a periodic sync is writing, since the log removes only
        segments a snapshot on disk covers."""
        async with self._snapshot_writing:
            snapshot = self.log.prepare_producer_snapshot()
            if snapshot is not None:
                await network.current().run_sync(snapshot)

    def oldest_unconfirmed_ns(self) -> int:
        return 0  # a topic's: its channels' cursors say theirs

    def position_stats(self) -> dict[str, int]:
        log = self.log
        return {
            "log_start_offset": log.start.offset,
            "log_start_count": log.start.count,
            "log_end_offset": log.end.offset,
            "log_end_count": log.end.count,
        }

    def close(self) -> None:
        self.writer.close()
        self.delay_queue.close(self.log.end.offset)

    def delete(self) -> None:
        self.delay_queue.delete()
        self.writer.delete()


def _delayed_copy(message: Message, channel: str, due_ms: int) -> Message:
    """A delayed record of `message` for `channel`, due at `due_ms` (unix ms): its ID,
    attempts, body and ext header, written again at the log's end."""
    copy = Message(message.id, message.body, message.timestamp, message.attempts)
    copy.trace_id = message.trace_id
    copy.ext_header = message.ext_header
    copy.delay = (channel, due_ms)
    return copy
