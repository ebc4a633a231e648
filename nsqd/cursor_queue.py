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

Requeued and timed-out messages wait in memory (`put_back`) and go out before new reads. Only
`confirmed` is persisted (`<topic>-<p>:<channel>.diskqueue.meta.v2.reader.dat`, Youzan's
layout), every `--sync-timeout` when it moved and on a clean stop; after kill -9, delivery
resumes from the last persisted `confirmed`: messages may come again, none is skipped.
"""

import bisect
import json
import os
import time
from collections import deque
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

import trio

from nsqpy.nsqd.backend import BackendWriteError
from nsqpy.nsqd.message import Message, MessageBatch
from nsqpy.partition_log import META_MAGIC, LogCorruption, PartitionLog, Position, record_size

if TYPE_CHECKING:
    from nsqpy.diskqueue import DiskQueue
    from nsqpy.nsqd.storage import Storage


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
        # Deferred messages by offset, with their due time (unix seconds): DPUBs not read yet,
        # and, after a restart, those that waited in the channel's deferred queue.
        self.delays: dict[int, float] = self._load_delays()
        # What waits in the channel's deferred queue now, and how a message read from the log
        # is held there for its delay (the channel's).
        self.deferred_source = deferred
        self._defer = defer
        self.closed = False
        self.redeliver: deque[Message] = deque()
        # Messages an earlier nsqpy kept for this channel in a diskqueue, before partitioned
        # topics were logs: delivered first, written back if still unacknowledged at a stop,
        # and the files removed once none is left.
        self.legacy = legacy
        # Acknowledged ranges beyond `confirmed`: disjoint, sorted by start offset;
        # each [start offset, end offset, start count, end count].
        self._starts: list[int] = []
        self._ranges: list[list[int]] = []
        self._window_full = False
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
        self.read_position = saved
        if saved is log.end:
            self._persist()

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
            _write(self.meta_path, self._meta(), sync=False)
            _write_delays(self.delays_path, self._delays_snapshot(), sync=False)
        except OSError as error:
            self._failed_to_write(error)
            return
        self._persisted = self.confirmed

    def _failed_to_write(self, error: OSError) -> None:
        self._persisted = None
        self.sync_error = str(error)
        self.storage.log.error("CHANNEL(%s): failed to write its cursor - %s", self.name, error)

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
        """The confirmed position moved, or something is deferred (its file is rewritten)."""
        return self._persisted != self.confirmed or bool(self.delays) or self._has_deferred()

    def _has_deferred(self) -> bool:
        if self.deferred_source is None:
            return False
        return any(True for _ in self.deferred_source())

    def prepare_sync(self):
        meta = self._meta()
        delays = self._delays_snapshot()
        path, delays_path = self.meta_path, self.delays_path
        self._persisted = self.confirmed

        def job() -> bool:
            try:
                _write(path, meta, sync=True)
                _write_delays(delays_path, delays, sync=True)
            except OSError as error:
                self._failed_to_write(error)
                return False
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
        ranges = len(self._ranges)
        if self._window_full:
            self._window_full = ranges > self.max_confirm_win // 2
        elif ranges > self.max_confirm_win:
            self._window_full = True
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
        if wanted and not self._reading_paused():
            try:
                messages = self.log.read(self.read_position, wanted)
            except LogCorruption as error:
                self._skip_corruption(error)
                return taken
            if messages:
                last = messages[-1]
                self.read_position = Position(
                    last.offset + record_size(last, self.log.ext), last.count + 1
                )
                taken.extend(messages)
        if taken and self._defer is not None:
            taken = self._hold_deferred(taken, self._defer)
        return taken

    def _hold_deferred(
        self, messages: list[Message], defer: Callable[[Message, float], None]
    ) -> list[Message]:
        """A log topic's DPUB is read like any message; it waits in the channel's deferred
        queue for its first delivery (Go's channel does this as the message is put). The
        delays file keeps the due times that outlived a restart."""
        log = self.log
        if not self.delays and not log.tail_has_deferred:
            return messages
        ready = []
        for message in messages:
            delay = self.take_delay(message)
            if delay is None:
                delay = log.tail_defer(message.offset)
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
        """FIN: merge the message's range; `confirmed` moves when the gap before it closes."""
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

    def set_position(self, position: Position) -> None:
        """Replay or skip: deliver from `position` on; acknowledged ranges are forgotten."""
        self.confirmed = position
        self.read_position = position
        self.redeliver.clear()
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

    def position_stats(self) -> dict[str, int]:
        return {
            "confirmed_offset": self.confirmed.offset,
            "confirmed_count": self.confirmed.count,
            "read_offset": self.read_position.offset,
            "lag": self.lag,
        }

    def close(self) -> None:
        """The confirmed position; the delays were written by `flush` while the channel still
        held its deferred messages."""
        try:
            _write(self.meta_path, self._meta(), sync=False)
            self._persisted = self.confirmed
        except OSError as error:
            self._failed_to_write(error)
        self._close_legacy()
        self.closed = True

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
        self.closed = True
        if self.legacy is not None:
            self.legacy.empty()
        self._close_legacy()
        self.redeliver.clear()
        self.delays.clear()
        for path in (self.meta_path, self.delays_path):
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass


def _write(path: str, data: bytes, *, sync: bool) -> None:
    temporary = path + ".tmp"
    with open(temporary, "wb") as file:
        file.write(data)
        if sync:
            file.flush()
            os.fsync(file.fileno())
    os.replace(temporary, path)


def _write_delays(path: str, data: bytes | None, *, sync: bool) -> None:
    if data is not None:
        _write(path, data, sync=sync)
        return
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
