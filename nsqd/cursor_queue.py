"""A log topic's channel: a cursor into its partition's log (docs/design.md §13).

The channel's `MessageQueue` for log topics. Nothing is copied per channel: the cursor reads the
partition's log (`partition_log/`) from its read position, and FIN moves its confirmed
position. State, as Youzan keeps it:

* `confirmed`: everything before it is acknowledged; a restart delivers again from here;
* `read`: where the next read starts;
* the ranges acknowledged beyond `confirmed` (FINs out of order), merged as they touch; when
  one starts at `confirmed`, `confirmed` jumps to its end;
* a window: reading stops while more than `--max-confirm-win` ranges wait for the gap before
  them to be acknowledged, and starts again below half of it.

Delayed messages do not hold the cursor back: a DPUB's record, and a message the channel moved
to the end of its delay (`move_to_end`: a copy written to the log with the channel and due time),
are indexed in the partition's delay queue (`nsqd/delay_queue.py`) as they are written; the
cursor reads past such records as if acknowledged, and the delay queue gives each out when it
comes due (`release_due`). An ordered channel holds a DPUB in order instead.

Requeued and timed-out messages wait in memory (`put_back`) and go out before new reads.
`confirmed` (`<topic>-<p>:<channel>.diskqueue.meta.v2.reader.dat`, Youzan's layout) and the
ranges acknowledged beyond it (nsqpy's `<topic>-<p>:<channel>.acked.json`) are persisted every
`--sync-timeout` when they changed and on a clean stop. A restart delivers from `confirmed` on
and skips the acknowledged ranges: after a clean stop nothing finished comes again; after
kill -9, at most what was finished since the last sync. None is ever skipped that was not.
"""

import bisect
import json
import os
import sqlite3
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

import trio

from nsqpy import disk
from nsqpy.nsqd.backend import BackendWriteError
from nsqpy.nsqd.message import Message, MessageBatch
from nsqpy.partition_log import META_MAGIC, LogCorruption, PartitionLog, Position, record_size

if TYPE_CHECKING:
    from nsqpy.diskqueue import DiskQueue
    from nsqpy.nsqd.delay_queue import DelayQueue
    from nsqpy.nsqd.storage import Storage


# Finished delayed messages a leader keeps for its followers at most (the oldest go first: at
# worst a new leader gives one of them out again, at least once).
FINISHED_DELAYED_KEPT = 100_000


class CursorQueue:
    """A channel's cursor into a partition log; the MessageQueue protocol."""

    def __init__(
        self,
        storage: "Storage",
        log: PartitionLog[Message],
        channel: str,
        max_confirm_win: int,
        *,
        paused: Callable[[], bool],
        start_at_log_start: bool = False,
        legacy: "DiskQueue | None" = None,
        deferred: Callable[[], Iterable[Message]] | None = None,
        defer: Callable[[Message, float], None] | None = None,
        delay_queue: "DelayQueue | None" = None,
        move: "Callable[[CursorQueue, Message, int], None] | None" = None,
        ordered: Callable[[], bool] = lambda: False,
    ):
        self.storage = storage
        self.log = log
        self.channel = channel
        self.name = f"{log.name}:{channel}"
        self.max_confirm_win = max_confirm_win
        # Whether the topic holds its messages back (paused): nothing is read then.
        self._topic_paused = paused
        self.meta_path = log.reader_meta_path(channel)
        self.delays_path = log.delays_path(channel)
        self.acked_path = log.acked_path(channel)
        # Messages the channel deferred in memory when it stopped, by offset, with their due
        # time (unix seconds): held again when read after the restart.
        self.delays: dict[int, float] = self._load_delays()
        # What waits in the channel's deferred queue now, and how a message read from the log
        # is held there for its delay (the channel's).
        self.deferred_source = deferred
        self._defer = defer
        # The partition's delay queue, and how a message is moved to the end of its delay
        # (`LogTopicQueue.move_to_end`); None for a channel that keeps its delays in memory
        # (an ephemeral one).
        self.delay_queue = delay_queue
        self._move = move
        self.ordered = ordered
        # The channel's: called when the window fills (it moves what it defers in memory to
        # the delay queue, which lets the cursor go on), and when a move is written.
        self.on_window_full: Callable[[], None] | None = None
        self.on_moved: Callable[[Message], bool] | None = None
        self.on_move_failed: Callable[[Message], None] | None = None
        # IDs of delayed messages finished here that a cluster's followers have not heard of
        # yet (the leader's cursor push carries them, `nsqd/cluster.py`); None where no one
        # asked (an nsqd alone).
        self.finished_delayed: list[bytes] | None = None
        # The log offset below which the channel's delayed messages were emptied here
        # (`/channel/emptydelayed`), for the followers too; None when they heard of it.
        self.emptied_delayed_below: int | None = None
        self.closed = False
        # A sync job in a worker thread writes the cursor's files under this lock, and only
        # while the cursor is open: one finishing after `close` or `delete` would write an
        # older position over the last one, or files of a deleted channel.
        self._file_jobs = threading.Lock()
        # The cursor's files are written from snapshots, each numbered when taken; a sync job
        # that runs after a newer snapshot was written (jobs run in worker threads, `_persist`
        # in trio's) leaves the files alone, so they never go back to an older position.
        self._snapshots_taken = 0
        self._snapshot_written = 0
        self.redeliver: deque[Message] = deque()
        # `/channel/fixconfirmed`: reading again from `confirmed` up to this offset, passing
        # the messages the channel holds (in flight, deferred, to be delivered again).
        self._rereading: tuple[int, set[bytes]] | None = None
        # Messages an earlier nsqpy kept for this channel in a diskqueue, before partitioned
        # topics were logs: delivered first, written back if still unacknowledged at a stop,
        # and the files removed once none is left.
        self.legacy = legacy
        # Acknowledged ranges beyond `confirmed`: disjoint, sorted by start offset;
        # each [start offset, end offset, start count, end count].
        self._starts: list[int] = []
        self._ranges: list[list[int]] = []
        self._window_full = False
        # The ranges changed since they were last written.
        self._ranges_changed = False
        self._persisted: Position | None = None
        # Why the last write of the cursor's files that failed did (for health).
        self.sync_error = ""
        saved = self._load()
        if saved is None:
            # A new channel starts at the end, as in Youzan; but where the log was just made
            # from an earlier nsqpy's diskqueue, at its start, so the channel gets those too.
            saved = log.start if start_at_log_start else log.end
        # `confirmed` (its setter): the count, and the offset or the message it ends with.
        self._confirmed_offset = 0
        self._confirmed_count = 0
        self._confirmed_through: Message | None = None
        self.confirmed = saved
        if saved is log.end:
            self._persist()
        else:
            self._load_ranges()
        self.read_position = self.confirmed

    # -- persistence --------------------------------------------------------------------------

    def _load(self) -> Position | None:
        """The persisted confirmed position, clamped to what the log holds."""
        try:
            with open(self.meta_path, "rb") as file:
                lines = file.read().split(b"\n")
            count = int(lines[0])
            offset = int(lines[2].split(b",")[2])
        except (FileNotFoundError, ValueError, IndexError):
            return None
        log = self.log
        if offset > log.end.offset:
            return log.end
        if offset < log.start.offset:
            return log.start
        return Position(offset, count)

    def _load_ranges(self) -> None:
        """The acknowledged ranges persisted with `confirmed`: those the log still holds."""
        try:
            with open(self.acked_path, "rb") as file:
                saved = json.loads(file.read())
            ranges = [(int(s), int(e), int(sc), int(ec)) for s, e, sc, ec in saved]
        except (FileNotFoundError, ValueError, TypeError):
            return
        start, end = self.log.start.offset, self.log.end.offset
        for range_start, range_end, start_count, end_count in sorted(ranges):
            if start <= range_start < range_end <= end and end_count > start_count:
                self._acknowledge_range(range_start, range_end, start_count, end_count)
        self._ranges_changed = False

    def acknowledged_ranges(self) -> list[list[int]]:
        """The ranges acknowledged beyond `confirmed`: [start, end, start count, end count]."""
        return [list(acked) for acked in self._ranges]

    def take_acknowledged_ranges(self, ranges: Iterable[list[int]]) -> None:
        """A follower takes its leader's acknowledged ranges (after its confirmed position)."""
        end = self.log.written.offset
        taken = sorted(
            [int(value) for value in acked]
            for acked in ranges
            if int(acked[0]) < int(acked[1]) <= end
        )
        if taken == self._ranges:
            return
        self._ranges.clear()
        self._starts.clear()
        self._ranges_changed = True
        for range_start, range_end, start_count, end_count in taken:
            self._acknowledge_range(range_start, range_end, start_count, end_count)

    def _ranges_snapshot(self) -> bytes | None:
        """The acknowledged ranges file's content; None when there are none."""
        return json.dumps(self._ranges).encode() if self._ranges else None

    def _load_delays(self) -> dict[int, float]:
        try:
            with open(self.delays_path, "rb") as file:
                return {int(offset): float(due) for offset, due in json.loads(file.read()).items()}
        except (FileNotFoundError, ValueError, AttributeError, TypeError):
            return {}

    def _delays_snapshot(self) -> bytes | None:
        """The delays file's content; None when nothing is deferred."""
        delays = self.deferred_dues()
        if not delays:
            return None
        return json.dumps({str(offset): due for offset, due in sorted(delays.items())}).encode()

    def deferred_dues(self) -> dict[int, float]:
        """Every deferred message's offset and due time (unix seconds): DPUBs not read yet and
        messages deferred in memory (REQ with a delay)."""
        delays = dict(self.delays)
        if self.deferred_source is not None:
            deferred = list(self.deferred_source())
            if deferred:
                try:
                    now = trio.current_time()
                except RuntimeError:  # not on trio's loop: a direct call, as in unit tests
                    now = 0.0
                wall = time.time()
                for message in deferred:
                    if message.delay is None:  # one from the delay queue stays there
                        delays[message.offset] = wall + max(0.0, message.deadline - now)
        return delays

    def take_delay(self, message: Message) -> float | None:
        """Seconds a message read from the log must still wait, if it was deferred."""
        due = self.delays.pop(message.offset, None)
        return None if due is None else max(0.0, due - time.time())

    def _meta(self) -> bytes:
        log = self.log
        confirmed, end = self.confirmed, log.end
        confirmed_file = log.file_position(confirmed.offset)
        end_file = log.file_position(end.offset)
        return (
            b"%d\n%d\n%d,%d,%d\n%d,%d,%d\n"
            % (
                confirmed.count,
                end.count,
                *confirmed_file,
                confirmed.offset,
                *end_file,
                end.offset,
            )
            + META_MAGIC
        )

    def _persist(self) -> None:
        """Write the cursor's files now. A disk that refuses them leaves the cursor dirty,
        and the next sync tries again: a full disk never ends nsqd."""
        try:
            with self._file_jobs:
                self._commit_delay_queue()
                _write_or_remove(self.acked_path, self._ranges_snapshot(), sync=False)
                _write(self.meta_path, self._meta(), sync=False)
                _write_or_remove(self.delays_path, self._delays_snapshot(), sync=False)
                self._snapshots_taken += 1
                self._snapshot_written = self._snapshots_taken
        except (OSError, sqlite3.Error) as error:
            self._failed_to_write(error)
            return
        self._persisted = self.confirmed
        self._ranges_changed = False
        self.sync_error = ""

    def _commit_delay_queue(self) -> None:
        """Before the cursor's files: the cursor passed delayed records the index holds."""
        delay_queue = self.delay_queue
        if delay_queue is not None and delay_queue.due_to_commit(self.log.end.offset):
            delay_queue.commit(self.log.end.offset)

    def _failed_to_write(self, error: Exception) -> None:
        self._persisted = None
        if self.sync_error != str(error):
            # One line when the writes start failing, not one per sync while the disk is full.
            self.storage.log.error("CHANNEL(%s): failed to write its cursor - %s", self.name, error)
        self.sync_error = str(error)

    @property
    def confirmed(self) -> Position:
        through = self._confirmed_through
        if through is not None:
            self._confirmed_offset = through.offset + record_size(through, self.log.ext)
            self._confirmed_through = None
        return Position(self._confirmed_offset, self._confirmed_count)

    @confirmed.setter
    def confirmed(self, position: Position) -> None:
        # Kept as the count and the offset, or the count and the last message confirmed in
        # order (`_confirmed_through`), whose end is the offset: FIN in order sets only that,
        # touching no more of the message than its count.
        self._confirmed_offset, self._confirmed_count = position
        self._confirmed_through = None

    # The sync contract nsqd's periodic sync drives (like a diskqueue's).
    sync_due = False

    @property
    def dirty(self) -> bool:
        """The confirmed position or the acknowledged ranges changed, or something is deferred
        (its file is rewritten)."""
        return (
            self._persisted != self.confirmed
            or self._ranges_changed
            or bool(self.delays)
            or self._has_deferred()
            or (
                self.delay_queue is not None and self.delay_queue.due_to_commit(self.log.end.offset)
            )
        )

    def _has_deferred(self) -> bool:
        if self.deferred_source is None:
            return False
        return any(True for _ in self.deferred_source())

    def prepare_sync(self):
        try:
            self._commit_delay_queue()
        except sqlite3.Error as error:
            self._failed_to_write(error)
            return lambda: False
        meta = self._meta()
        delays = self._delays_snapshot()
        ranges = self._ranges_snapshot()
        path, delays_path, acked_path = self.meta_path, self.delays_path, self.acked_path
        self._persisted = self.confirmed
        self._ranges_changed = False
        self._snapshots_taken += 1
        snapshot = self._snapshots_taken

        def job() -> bool:
            try:
                # The ranges before `confirmed`: a crash between the two leaves the older
                # `confirmed` with ranges no older than it, so a message may come again but
                # none is skipped (a replay's empty ranges are written before its position).
                with self._file_jobs:
                    if self.closed or snapshot < self._snapshot_written:
                        return True
                    _write_or_remove(acked_path, ranges, sync=True)
                    _write(path, meta, sync=True)
                    _write_or_remove(delays_path, delays, sync=True)
                    self._snapshot_written = snapshot
            except OSError as error:
                self._failed_to_write(error)
                return False
            self.sync_error = ""
            return True

        return job

    # -- MessageQueue ---------------------------------------------------------------------------

    @property
    def depth(self) -> int:
        legacy = self.legacy.depth if self.legacy is not None else 0
        return self.log.end.count - self.read_position.count + len(self.redeliver) + legacy

    @property
    def backend_depth(self) -> int:
        return self.depth

    @property
    def lag(self) -> int:
        """Messages not yet acknowledged: the log's end minus `confirmed`."""
        return self.log.end.count - self.confirmed.count

    def has_messages(self) -> bool:
        if self.redeliver or (self.legacy is not None and self.legacy.depth):
            return True
        return self.read_position.offset < self.log.end.offset and not self._reading_paused()

    def _reading_paused(self) -> bool:
        if self._topic_paused():
            return True
        if self._ranges and self.read_position.offset < self._ranges[-1][1]:
            return False  # after a restart: what is not acknowledged among the ranges
        ranges = len(self._ranges)
        if self._window_full:
            self._window_full = ranges > self.max_confirm_win // 2
        elif ranges > self.max_confirm_win:
            self._window_full = True
            if self.on_window_full is not None:
                self.on_window_full()
        return self._window_full

    @property
    def window_full(self) -> bool:
        return self._window_full

    def append(
        self, messages: "list[Message] | MessageBatch", *, strict: bool = False
    ) -> BackendWriteError | None:
        """Messages the channel holds again (a deferral that came due): they are in the log
        already, so they only wait to go out again."""
        assert not isinstance(messages, MessageBatch)  # a log topic keeps no batches
        self.redeliver.extend(messages)
        return None

    def put_back(self, messages: list[Message], *, first: bool = False) -> None:
        if first:
            self.redeliver.extendleft(reversed(messages))
        else:
            self.redeliver.extend(messages)

    def take(self, max_count: int) -> list[Message]:
        redeliver = self.redeliver
        taken: list[Message] = []
        while redeliver and len(taken) < max_count:
            taken.append(redeliver.popleft())
        legacy = self.legacy
        if legacy is not None and legacy.depth and len(taken) < max_count:
            for record in legacy.get_many(max_count - len(taken)):
                message = Message.from_record(record)
                # Not in the log: a FIN moves nothing.
                message.offset = message.count = -1
                taken.append(message)
        wanted = max_count - len(taken)
        # Records the channel does not deliver now (delayed records, deferrals kept through a
        # restart) are passed: read on, so that what follows them goes out now.
        while wanted and not self._reading_paused():
            try:
                messages = self._read(wanted)
            except LogCorruption as error:
                self._skip_corruption(error)
                return taken
            if not messages:
                break
            last = messages[-1]
            self.read_position = Position(
                last.offset + record_size(last, self.log.ext), last.count + 1
            )
            if self._rereading is not None:
                messages = self._not_held(messages)
            if self.log.read_delayed:
                self.log.read_delayed = False
                messages = self._pass_delayed(messages)
            if messages and self._defer is not None:
                messages = self._hold_deferred(messages, self._defer)
            taken.extend(messages)
            wanted = max_count - len(taken)
        return taken

    def _pass_delayed(self, messages: list[Message]) -> list[Message]:
        """Delayed records among messages read: the delay queue holds them, so the cursor
        passes them as acknowledged; an ordered channel (or one without the delay queue)
        holds a DPUB in order, in memory, until it is due."""
        kept = []
        ext = self.log.ext
        for message in messages:
            delay = message.delay
            if delay is None:
                kept.append(message)
                continue
            channel, due_ms = delay
            if channel == "" and (self.delay_queue is None or self.ordered()):
                wait = due_ms / 1000 - time.time()
                if wait > 0 and self._defer is not None:
                    self._defer(message, wait)
                else:
                    kept.append(message)
                continue
            end = message.offset + record_size(message, ext)
            self._acknowledge_range(message.offset, end, message.count, message.count + 1)
        return kept

    # -- the delay queue ------------------------------------------------------------------------

    @property
    def delayed_count(self) -> int:
        """How many of the channel's messages wait in the delay queue (or are out from it)."""
        return self.delay_queue.count(self.channel) if self.delay_queue is not None else 0

    def move_to_end(self, message: Message, delay: float) -> bool:
        """Move a deferred message to the end of its delay: a copy goes into the log with the
        channel and its due time, and once written, the original counts as acknowledged
        (`moved`). False when the channel keeps its delays in memory."""
        if self._move is None:
            return False
        self._move(self, message, int((time.time() + delay) * 1000))
        return True

    def moved(self, message: Message) -> None:
        """A move was written: the copy is in the delay queue. The original, read from the log,
        no longer holds the cursor back; if the channel no longer held it (delivered again
        meanwhile), the copy goes instead."""
        still_deferred = self.on_moved is None or self.on_moved(message)
        if not still_deferred:
            # Finished or delivered again meanwhile: the copy goes, here and, with the next
            # cursor push, on the followers (which took it with the write).
            self.finish_delayed(message.id)
            return
        if message.delay is None and message.offset >= 0:
            end = message.offset + record_size(message, self.log.ext)
            self._acknowledge_range(message.offset, end, message.count, message.count + 1)

    def take_finished_delayed(self, message_ids: list[bytes]) -> None:
        """A follower hears which delayed messages its leader's channel finished."""
        if self.delay_queue is not None:
            for message_id in message_ids:
                self.delay_queue.forget(self.channel, message_id)

    def finish_delayed(self, message_id: bytes) -> bool:
        """A delayed message finished: it leaves the delay queue (and, released already, the
        messages waiting to go out), and the followers hear of it. False if it was not there."""
        if self.delay_queue is None or not self.delay_queue.done(self.channel, message_id):
            return False
        finished = self.finished_delayed
        if finished is not None:
            finished.append(message_id)
            if len(finished) > FINISHED_DELAYED_KEPT:
                del finished[: len(finished) - FINISHED_DELAYED_KEPT]
        if any(message.id == message_id for message in self.redeliver):
            self.redeliver = deque(m for m in self.redeliver if m.id != message_id)
        return True

    def empty_delayed(self) -> int:
        """`/channel/emptydelayed`: the channel's delayed messages go, here and, with the next
        cursor push, on the followers (up to the log's end now: not those delayed since)."""
        if self.delay_queue is None:
            return 0
        if self.finished_delayed is not None:
            self.emptied_delayed_below = self.log.written.offset
        return self.delay_queue.empty(self.channel)

    def take_emptied_delayed(self, below: int) -> None:
        """A follower hears that its leader's channel emptied its delayed messages."""
        if self.delay_queue is not None:
            self.delay_queue.empty(self.channel, below)

    def requeue_delayed(self) -> int:
        """`/channel/requeuedelayed`: the channel's delayed messages are due now; how many."""
        return self.delay_queue.requeue(self.channel) if self.delay_queue is not None else 0

    def move_failed(self, message: Message) -> None:
        """A move could not be written: the message stays deferred in memory."""
        if self.on_move_failed is not None:
            self.on_move_failed(message)

    def release_due(self, limit: int) -> int:
        """The channel's delayed messages that came due go out, before new reads; how many."""
        delay_queue = self.delay_queue
        if delay_queue is None or self.closed:
            return 0
        due = delay_queue.take_due(self.channel, limit)
        for entry in due:
            message = self.log.read_message(Position(entry.offset, entry.count), entry.message_id)
            if message is None:
                self.storage.log.error(
                    "CHANNEL(%s): delayed message %s is not at offset %d any more; dropped",
                    self.name,
                    entry.message_id.decode(),
                    entry.offset,
                )
                delay_queue.done(self.channel, entry.message_id)
                continue
            self.redeliver.append(message)
        return len(due)

    def _read(self, wanted: int) -> list[Message]:
        """Up to `wanted` messages from the read position on. Behind acknowledged ranges (a
        restart reads from `confirmed` again) a read stops at the next range and skips it."""
        confirmed = self.confirmed
        if self.read_position.offset < confirmed.offset:
            # The gap the read stood in closed, and `confirmed` took the ranges after it.
            self.read_position = confirmed
        ranges = self._ranges
        if not ranges or self.read_position.offset >= ranges[-1][1]:
            return self.log.read(self.read_position, wanted)
        index = bisect.bisect_right(self._starts, self.read_position.offset) - 1
        if index >= 0 and ranges[index][1] > self.read_position.offset:
            self.read_position = Position(ranges[index][1], ranges[index][3])
        index += 1
        stop = ranges[index][0] if index < len(ranges) else None
        return self.log.read(self.read_position, wanted, stop)

    def _hold_deferred(
        self, messages: list[Message], defer: Callable[[Message, float], None]
    ) -> list[Message]:
        """A message the channel deferred in memory before a restart (the delays file kept
        its due time) waits in the channel's deferred queue again when read."""
        if not self.delays:
            return messages
        ready = []
        for message in messages:
            delay = self.take_delay(message)
            if delay:
                defer(message, delay)
            else:
                ready.append(message)
        return ready

    def _skip_corruption(self, error: LogCorruption) -> None:
        """Records that cannot be read: the channel goes on at the next segment (the log's
        end when it is the last), with one ERROR line saying what was skipped, as
        go-diskqueue sets a bad file aside and reads on. The skipped range counts as
        acknowledged, so `confirmed` passes it once what came before is."""
        start = self.read_position
        resume = self.log.position_after_corruption(start)
        log = self.log
        log.log.error(
            "TOPIC(%s) partition %d channel %s: %s; skipping offsets %d-%d (%d messages)",
            log.topic,
            log.partition,
            self.channel,
            error,
            start.offset,
            resume.offset,
            resume.count - start.count,
        )
        self._acknowledge_range(start.offset, resume.offset, start.count, resume.count)
        self.read_position = resume

    def acknowledge(self, message: Message) -> None:
        """FIN: merge the message's range; `confirmed` moves when the gap before it closes. A
        message from the delay queue leaves it."""
        if message.delay is not None and self.finish_delayed(message.id):
            return
        count = message.count
        if count == self._confirmed_count and not self._ranges:
            # In order, nothing acknowledged ahead: the common case, kept short.
            self._confirmed_count = count + 1
            self._confirmed_through = message
            return
        start = message.offset
        if start < 0:
            return  # from the legacy diskqueue
        end = start + record_size(message, self.log.ext)
        self._acknowledge_range(start, end, message.count, message.count + 1)

    def _acknowledge_range(self, start: int, end: int, start_count: int, end_count: int) -> None:
        confirmed = self.confirmed
        if end <= confirmed.offset:
            return
        if start <= confirmed.offset:
            self.confirmed = Position(end, end_count)
            self._absorb_ranges()
            return
        self._ranges_changed = True
        starts, ranges = self._starts, self._ranges
        index = bisect.bisect_left(starts, start)
        new = [start, end, start_count, end_count]
        # Merge with the range before (ends where this starts) and after (starts where it ends).
        if index > 0 and ranges[index - 1][1] == start:
            index -= 1
            ranges[index][1] = end
            ranges[index][3] = new[3]
            new = ranges[index]
        else:
            ranges.insert(index, new)
            starts.insert(index, start)
        if index + 1 < len(ranges) and ranges[index + 1][0] == new[1]:
            following = ranges.pop(index + 1)
            starts.pop(index + 1)
            new[1], new[3] = following[1], following[3]

    def _absorb_ranges(self) -> None:
        ranges, starts = self._ranges, self._starts
        while ranges and ranges[0][0] <= self.confirmed.offset:
            first = ranges.pop(0)
            starts.pop(0)
            if first[1] > self.confirmed.offset:
                self.confirmed = Position(first[1], first[3])

    def skip_to_end(self) -> None:
        if self.legacy is not None:
            self.legacy.empty()
        self.set_position(self.log.end)

    def seek(self, kind: str, value: int) -> None:
        self.set_position(self.log.position_for(kind, value))

    def reread(self, held: set[bytes]) -> None:
        """Youzan's fix of a channel's confirmed position: read again from it what is neither
        acknowledged nor `held` (the IDs of what the channel holds in flight or deferred), so
        nothing the channel lost track of stays undelivered and nothing it holds comes
        twice."""
        held.update(message.id for message in self.redeliver)
        self._rereading = (self.read_position.offset, held)
        self.read_position = self.confirmed

    def _not_held(self, messages: list[Message]) -> list[Message]:
        assert self._rereading is not None
        until, held = self._rereading
        if self.read_position.offset >= until:
            self._rereading = None
        return [message for message in messages if message.id not in held]

    def set_position(self, position: Position) -> None:
        """Replay or skip: deliver from `position` on; acknowledged ranges are forgotten."""
        self.confirmed = position
        self.read_position = position
        self._rereading = None
        self.redeliver.clear()
        self._ranges_changed = self._ranges_changed or bool(self._ranges)
        self._ranges.clear()
        self._starts.clear()
        self._window_full = False

    def empty(self) -> None:
        self.skip_to_end()

    def flush(self, unacknowledged: list[Message]) -> int:
        """Persist `confirmed`: what waits and `unacknowledged` are still in the log behind it
        (messages of the legacy diskqueue go back to it)."""
        self._persist()
        legacy = self.legacy
        if legacy is not None:
            held = [m for m in [*self.redeliver, *unacknowledged] if m.offset < 0]
            if held:
                legacy.put_many([message.to_record() for message in held])
        return self.depth + len(unacknowledged)

    async def sync_dirty(self) -> None:
        if self.dirty:
            await self.storage.sync_backend(self)

    # Youzan requeues a leaving consumer's in-flight messages at once.
    requeue_on_leave = True

    def oldest_unconfirmed_ns(self) -> int:
        if self.confirmed.offset >= self.log.end.offset:
            return 0
        try:
            oldest = self.log.read(self.confirmed, 1)
        except (LogCorruption, OSError):
            return 0  # retention took it meanwhile, or the disk failed the read
        return oldest[0].timestamp if oldest else 0

    def position_stats(self) -> dict[str, int]:
        return {
            "confirmed_offset": self.confirmed.offset,
            "confirmed_count": self.confirmed.count,
            "read_offset": self.read_position.offset,
            "lag": self.lag,
            "delayed_queue_count": self.delayed_count,
        }

    def close(self) -> None:
        """The confirmed position; the delays were written by `flush` while the channel still
        held its deferred messages."""
        with self._file_jobs:
            try:
                self._commit_delay_queue()
                _write_or_remove(self.acked_path, self._ranges_snapshot(), sync=False)
                _write(self.meta_path, self._meta(), sync=False)
                self._persisted = self.confirmed
                self._ranges_changed = False
            except (OSError, sqlite3.Error) as error:
                self._failed_to_write(error)
            self.closed = True
        self._close_legacy()

    def _close_legacy(self) -> None:
        legacy, self.legacy = self.legacy, None
        if legacy is None:
            return
        if legacy.depth:
            legacy.close()
        else:
            legacy.empty()
            legacy.delete()

    def delete(self) -> None:
        with self._file_jobs:
            self.closed = True
        if self.legacy is not None:
            self.legacy.empty()
        self._close_legacy()
        self.redeliver.clear()
        self.delays.clear()
        if self.delay_queue is not None and not self.delay_queue.closed:
            self.delay_queue.empty(self.channel)
        for path in (self.meta_path, self.delays_path, self.acked_path):
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass


def _write(path: str, data: bytes, *, sync: bool) -> None:
    temporary = path + ".tmp"
    disk.write_file(temporary, data, sync=sync)
    os.replace(temporary, path)


def _write_or_remove(path: str, data: bytes | None, *, sync: bool) -> None:
    if data is not None:
        _write(path, data, sync=sync)
        return
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
