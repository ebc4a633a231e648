"""The log of one partition: append, commit, read by position, search, sync, cut back.

Writes are group-committed: `append` encodes a publish's records into the open group;
`commit()` writes the whole group with one `os.write` and one index entry, and only then do
readers see it (`end`; `appended` is where the next append goes). nsqd commits once per batch
of waiting publishes, before their answers go out. A failed write keeps nothing of its group,
and raises for its publishers to be refused. fsync follows the sync policy like a diskqueue's
(`sync_due`, `dirty`, `prepare_sync`), data first, then the index.
"""

import bisect
import errno
import json
import logging
import os
import threading
import time
from binascii import hexlify, unhexlify
from collections.abc import Callable
from typing import Generic

from nsqpy import disk
from nsqpy.partition_log.files import META_MAGIC, LogFiles, write_atomically
from nsqpy.partition_log.index import (
    DEFAULT_INDEX_ENTRIES_PER_FILE,
    ENTRY,
    IndexEntry,
    IndexReader,
    entry_end,
    index_files,
)
from nsqpy.partition_log.producer_snapshots import (
    Producers,
    ProducerSnapshot,
    collect_marks,
    file_marks,
    fold,
    read_snapshot,
    remove_snapshots,
    seen_since,
    write_snapshot,
)
from nsqpy.partition_log.records import (
    BODY_START,
    ID_PARTITION_SHIFT,
    RECORD_HEADER_SIZE,
    SIZE,
    SIZED_HEADER,
    SIZED_RECORD_HEADER,
    LogCorruption,
    M,
    MessageFactory,
    Position,
    ProducerMark,
    decode_flagged_record,
    encode_flagged_record,
    mark_size,
    record_size,
)
from nsqpy.partition_log.recovery import recover
from nsqpy.partition_log.retention import removable_segments, remove_segments
from nsqpy.partition_log.segments import (
    Segment,
    truncate_segments,
    write_segment_meta,
)

# Bytes of the latest appends kept in memory as written, for cursors at the tail (most
# reads): between this and twice this.
HOT_TAIL_BYTES = 2 * 1024 * 1024
READ_CHUNK = 256 * 1024

logger = logging.getLogger("nsqpy.partition_log")


def _remove(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


class PartitionLog(Generic[M]):
    """The log of one partition. `message_type` makes the messages it reads (nsqd's
    `Message`; `records.Record` elsewhere)."""

    def __init__(
        self,
        data_path: str,
        topic: str,
        partition: int,
        *,
        message_type: MessageFactory[M],
        max_bytes_per_file: int,
        sync_every: int,
        ext: bool = False,
        index_entries_per_file: int = DEFAULT_INDEX_ENTRIES_PER_FILE,
        log: logging.Logger | logging.LoggerAdapter = logger,
    ) -> None:
        self.files = LogFiles(data_path, topic, partition)
        self.topic = topic
        self.partition = partition
        self.name = self.files.name
        self.directory = self.files.directory
        self.message_type = message_type
        self.max_bytes_per_file = max_bytes_per_file
        self.sync_every = max(1, sync_every)
        self.ext = ext
        self.index_entries_per_file = index_entries_per_file
        self.log = log
        os.makedirs(self.directory, exist_ok=True)
        self.segments: list[Segment] = []
        self._segment_starts: list[int] = []
        self.start = Position(0, 0)
        self.end = Position(0, 0)
        self.last_id = partition << ID_PARTITION_SHIFT
        self._write_fd = -1
        self._index_fd = -1
        self._index_number = 0
        self._index_entries = 0
        # The group appended since the last commit: its bytes (header and body pieces), and
        # what its index entry says. One write and one entry cover it.
        self._pending: list[bytes] = []
        self._pending_first: tuple[int, int, int] | None = None  # first id, offset, count
        self._pending_last_id = 0
        self._pending_size = 0
        self._pending_count = 0
        # Where the written data ends (`end` is where readers stop: the same, but on a leader
        # whose followers have not all acknowledged the last groups yet), and where the next
        # append goes: that plus the group not yet written.
        self.written = self.end
        self.appended = self.end
        # Stamped into each index entry: the partition's write epoch in a cluster (0 alone).
        self.write_epoch = 0
        # Grows whenever the log changes other than by its own appends: groups written as
        # another node wrote them (`append_raw`), cut back, started over. What was derived
        # from the log (an idempotent producer's sequence) is derived again after it.
        self.rewrites = 0
        self._ops_since_sync = 0
        self._closed = False
        # Deleted (`delete`): nothing writes its files again. A sync or snapshot job in a
        # worker thread writes its files under this lock, and only while the log is not
        # deleted, so that a deletion meeting a job never leaves a file behind.
        self._deleted = False
        self._file_jobs = threading.Lock()
        # The hot tail: the bytes of the latest appends, as written (whole records), with the
        # offset each starts at; read like a chunk of a segment.
        self._tail: list[bytes] = []
        self._tail_starts: list[int] = []
        self._tail_bytes = 0
        # Whether a read since this was last cleared met a delayed record (a cursor skips
        # them: the delay queue delivers them, `nsqd/delay_queue.py`).
        self.read_delayed = False
        # Told the offset the log was cut back to (-1: started over, nothing kept), so that
        # what was derived from the records cut goes too (the delay queue's entries).
        self.on_cut_back: Callable[[int], None] | None = None
        # The last chunk read from a segment: (segment number, position, bytes).
        self._read_cache: tuple[int, int, bytes] | None = None
        # Groups found corrupt with no other copy (`/topic/fixdata`): (offset, end), sorted;
        # a reader that meets one goes on right after it.
        self._corrupt_groups: list[tuple[int, Position]] = []
        # Seconds an idempotent producer is remembered (nsqd's `--producer-id-expiration`,
        # read at each use); None: no producer snapshots are written (producer_snapshots.py).
        self.producer_expiration: Callable[[], float] | None = None
        # A segment was rolled since the last producer snapshot was prepared.
        self._snapshot_due = False
        # Why the last sync that failed did (for health).
        self.sync_error = ""
        # Where its writes and fsyncs go: the node's disk (`nsqpy/disk.py`).
        self._disk = disk.current()
        self._open()

    # -- file names ----------------------------------------------------------------------------

    def segment_path(self, number: int) -> str:
        return self.files.segment(number)

    @property
    def magic_code_path(self) -> str:
        """Youzan's `magic<partition>`: the MagicCode of the topic this log was written for."""
        return self.files.magic_code

    @property
    def magic_code(self) -> int:
        """The MagicCode recorded with this log, 0 for none (or an unreadable file: the
        cluster's code is then taken as this log's)."""
        try:
            with open(self.magic_code_path, "rb") as file:
                return int(file.read().strip() or b"0")
        except (FileNotFoundError, ValueError):
            return 0

    def set_magic_code(self, code: int) -> None:
        write_atomically(self.magic_code_path, b"%d\n" % code)

    @property
    def active_segment_path(self) -> str:
        """The segment writes go to (what a failed write's error names)."""
        return self.segment_path(self.segments[-1].number)

    @property
    def writer_meta_path(self) -> str:
        return self.files.writer_meta

    @property
    def start_meta_path(self) -> str:
        return self.files.start_meta

    def index_path(self, number: int | None = None) -> str:
        """The active index file, or a rolled one by number."""
        return self.files.index(number)

    def delays_path(self, channel: str) -> str:
        """A channel's deferred messages (nsqpy's own file: Youzan has no DPUB)."""
        return self.files.delays(channel)

    def reader_meta_path(self, channel: str) -> str:
        return self.files.reader_meta(channel)

    @property
    def delay_queue_path(self) -> str:
        """The partition's delay queue (nsqpy's own file, `nsqd/delay_queue.py`)."""
        return self.files.delay_queue

    def acked_path(self, channel: str) -> str:
        """A channel's ranges acknowledged beyond its confirmed position (nsqpy's own file)."""
        return self.files.acked(channel)

    # -- opening ---------------------------------------------------------------------------------

    def _open(self) -> None:
        recovered = recover(self.files, self.log)
        self.segments = recovered.segments
        self._index_number = recovered.index_number
        self._index_entries = recovered.index_entries
        self.start = recovered.start
        self.end = self.written = self.appended = recovered.committed
        self.last_id = recovered.last_id
        self._segment_starts = [segment.start for segment in self.segments]
        self._write_fd = os.open(
            self.segment_path(self.segments[-1].number),
            os.O_WRONLY | os.O_CREAT | os.O_APPEND,
            0o600,
        )
        self._index_fd = os.open(self.index_path(), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        self._forget_snapshots_after(self.written.offset)

    # -- appending -----------------------------------------------------------------------------

    def next_ids(self, count: int) -> list[bytes]:
        """The next `count` message IDs of the partition, as 16 hex digits."""
        first = self.last_id + 1
        self.last_id += count
        return [b"%016x" % value for value in range(first, first + count)]

    def next_id(self) -> bytes:
        self.last_id += 1
        return b"%016x" % self.last_id

    def append(self, messages: list[M], producer: ProducerMark | None = None) -> None:
        """Add the messages to the group the next commit writes; their `offset` and `count`
        are set now. Readers see them only once they are written (`end`). `producer`: an
        idempotent publish's, stored with its last message."""
        if self._closed:
            raise OSError(errno.EBADF, f"the log of {self.name} is closed")
        offset, count = self.appended
        if self._pending_first is None:
            self._pending_first = (int(messages[0].id, 16), offset, count + 1)
        first_offset = offset
        parts = self._pending
        append = parts.append
        # An ext topic's records, delayed ones, and an idempotent publish's last one, take a
        # call each; the others are the fast loop's.
        if self.ext or messages[0].delay is not None:
            flagged = messages
        else:
            flagged = messages[-1:] if producer is not None else []
        plain = messages[: len(messages) - len(flagged)] if flagged else messages
        # The hot loop of every publish: a header and the body per message, no call.
        pack = SIZED_RECORD_HEADER.pack
        for message in plain:
            body = message.body
            append(
                pack(
                    RECORD_HEADER_SIZE + len(body),
                    message.timestamp,
                    message.attempts,
                    unhexlify(message.id),
                    message.trace_id,
                )
            )
            append(body)
            message.offset = offset
            message.count = count
            offset += BODY_START + len(body)
            count += 1
        last = messages[-1]
        for message in flagged:
            marked = producer if message is last else None
            record = encode_flagged_record(message, self.ext, marked)
            if marked is not None:
                message.mark_size = mark_size(marked)
            message.offset = offset
            message.count = count
            offset += len(record)
            count += 1
            append(record)
        self._pending_size += offset - first_offset
        self._pending_count += len(messages)
        self._pending_last_id = int(messages[-1].id, 16)
        self.appended = Position(offset, count)
        self._ops_since_sync += len(messages)

    @property
    def has_pending(self) -> bool:
        """Whether appends wait for the next commit to be written."""
        return self._pending_first is not None

    def commit(self, *, visible: bool = True) -> tuple[IndexEntry, bytes] | None:
        """Write the group appended since the last commit, at once (one write), and its one
        index entry; then readers see it, or, with `visible=False` (a leader whose followers
        must have it first), once `make_visible` says so. The group's index entry and bytes,
        as a follower writes them (`append_raw`); None when nothing was appended. OSError if
        the write failed: nothing of the group is kept (the file is cut back, the group's
        offsets are given to the next appends), and the caller refuses its publishes
        (`nsqd/log_writer.py`). Nothing once the log is closed or deleted (its descriptors'
        numbers may belong to sockets by then)."""
        if self._pending_first is None or self._closed:
            return None
        first_id, offset, first_count = self._pending_first
        data = b"".join(self._pending)
        entry = (
            first_id,
            self.write_epoch,
            self._pending_last_id,
            offset,
            self._pending_size,
            first_count,
            self._pending_count,
        )
        try:
            self._write_group(entry, data, self.appended)
        except OSError:
            self.discard_pending()
            raise
        if visible:
            self.end = self.written
        self._pending = []
        self._pending_first = None
        self._pending_size = 0
        self._pending_count = 0
        return entry, data

    def append_raw(self, entry: IndexEntry, data: bytes) -> None:
        """A follower writes a group exactly as its leader did: the records' bytes and the
        index entry. ValueError when it does not start at this log's end (the follower must
        catch up first) or its size is not the entry's; OSError if the write failed (then
        nothing of it is kept)."""
        if self._closed:
            raise OSError(errno.EBADF, f"the log of {self.name} is closed")
        offset, size, first_count, count = entry[3], entry[4], entry[5], entry[6]
        if (offset, first_count - 1) != tuple(self.written):
            raise ValueError(
                f"a group at offset {offset} (count {first_count - 1}) does not follow the log's"
                f" end at {self.written.offset} (count {self.written.count})"
            )
        if size != len(data):
            raise ValueError(f"a group of {len(data)} bytes says it has {size}")
        self._write_group(entry, data, Position(offset + size, first_count - 1 + count))
        self.rewrites += 1
        self.end = self.appended = self.written
        self.last_id = max(self.last_id, entry[2])
        self._ops_since_sync += count

    def make_visible(self, position: Position) -> None:
        """Readers see the log up to `position` (at most what is written)."""
        if position.offset > self.end.offset:
            self.end = min(position, self.written)

    def _write_group(self, entry: IndexEntry, data: bytes, following: Position) -> None:
        # Full files are rolled before the next write, not after the one that filled them:
        # where a segment (or index file) ends then depends only on the groups written, so
        # replicas cut their logs into the same files even if one was killed between a write
        # and its roll. A roll that fails (a full disk) fails the write, nothing written.
        if self.segments[-1].size >= self.max_bytes_per_file:
            self._roll()
        if self._index_entries >= self.index_entries_per_file:
            self._roll_index()
        segment = self.segments[-1]
        try:
            written = 0
            view = memoryview(data)
            while written < len(data):
                written += self._disk.write(self._write_fd, view[written:])
            if self._disk.write(self._index_fd, ENTRY.pack(*entry)) != ENTRY.size:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        except OSError:
            # Nothing of the group stays: neither its bytes nor a piece of its entry, or the
            # next group would be written after them and its entry name the wrong place.
            try:
                os.ftruncate(self._write_fd, segment.size)
                os.ftruncate(self._index_fd, self._index_entries * ENTRY.size)
            except OSError as error:
                self.log.error("LOG(%s) failed to cut back a failed write - %s", self.name, error)
            raise
        segment.size += len(data)
        self._index_entries += 1
        self.written = following
        self._remember(data, entry[3])

    def discard_pending(self) -> None:
        """Forget what was appended since the last commit (it will not be written)."""
        self._ops_since_sync = max(0, self._ops_since_sync - self._pending_count)
        self._pending = []
        self._pending_first = None
        self._pending_size = 0
        self._pending_count = 0
        self.appended = self.written

    def _remember(self, data: bytes, offset: int) -> None:
        """The bytes just written, for readers at the tail: one reference per group."""
        self._tail.append(data)
        self._tail_starts.append(offset)
        self._tail_bytes += len(data)
        if self._tail_bytes > 2 * HOT_TAIL_BYTES:
            tail = self._tail
            dropped = 0
            index = 0
            while dropped < HOT_TAIL_BYTES and index < len(tail) - 1:
                dropped += len(tail[index])
                index += 1
            self._forget_tail_before(self._tail_starts[index])

    def _roll(self) -> None:
        """The segment is full: record its range, start the next. OSError when the disk
        refuses the next file (full, failing): the segment stays the active one, and the
        next write tries again."""
        segment = self.segments[-1]
        following = Segment(segment.number + 1, self.written.offset, self.written.count, 0)
        try:
            descriptor = os.open(
                self.segment_path(following.number), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600
            )
        except OSError as error:
            self.log.error(
                "LOG(%s) cannot start segment %d - %s", self.name, following.number, error
            )
            raise
        try:
            write_segment_meta(self.files, segment, self.written.count)
            self._disk.fsync(self._write_fd)
        except OSError as error:
            # Only a shortcut (opening counts the records without it) and an early fsync
            # (the next sync covers the segment again through its index and the writer
            # metadata): the roll goes on.
            self.log.error(
                "LOG(%s) rolled segment %d unsynced - %s", self.name, segment.number, error
            )
        os.close(self._write_fd)
        self._write_fd = descriptor
        self.segments.append(following)
        self._segment_starts.append(following.start)
        self._snapshot_due = True

    def _roll_index(self) -> None:
        """The active index file is full: it gets its number, and a new one is the active
        one. OSError when the disk refuses the new file: the write waits for it."""
        try:
            self._disk.fsync(self._index_fd)
        except OSError as error:
            self.log.error("LOG(%s) index rolled unsynced - %s", self.name, error)
        following = self.index_path() + ".next"
        try:
            descriptor = os.open(
                following, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o600
            )
        except OSError as error:
            self.log.error("LOG(%s) cannot start a new index file - %s", self.name, error)
            raise
        try:
            write_atomically(self.files.index_current, b"%d\n" % (self._index_number + 1))
        except OSError as error:
            os.close(descriptor)
            _remove(following)
            self.log.error("LOG(%s) cannot start a new index file - %s", self.name, error)
            raise
        os.rename(self.index_path(), self.index_path(self._index_number))
        os.rename(following, self.index_path())
        os.close(self._index_fd)
        self._index_fd = descriptor
        self._index_number += 1
        self._index_entries = 0

    # -- durability: the diskqueue's sync contract -----------------------------------------------

    @property
    def sync_due(self) -> bool:
        return self._ops_since_sync >= self.sync_every

    @property
    def dirty(self) -> bool:
        return self._ops_since_sync > 0 or self._pending_first is not None

    def prepare_sync(self) -> Callable[[], bool]:
        """The returned job fsyncs what was written (data, then index), then writes the writer
        metadata, and may run in a worker thread; commit first, for what is appended. A closed
        log has nothing left to sync."""
        if self._closed:
            return lambda: True
        self._ops_since_sync = self._pending_count
        data_fd = os.dup(self._write_fd)
        index_fd = os.dup(self._index_fd)
        segment = self.segments[-1]
        written = self.written
        meta = b"%d\n%d,%d,%d\n" % (written.count, segment.number, segment.size, written.offset)
        meta_path = self.writer_meta_path

        def job() -> bool:
            try:
                self._disk.fsync(data_fd)
                self._disk.fsync(index_fd)
                with self._file_jobs:
                    if not self._deleted:
                        write_atomically(meta_path, meta + META_MAGIC)
                return True
            except OSError as error:
                logger.error("LOG(%s) failed to sync - %s", self.name, error)
                self.sync_error = str(error)
                return False
            finally:
                os.close(data_fd)
                os.close(index_fd)

        return job

    def prepare_producer_snapshot(self) -> Callable[[], None] | None:
        """After a roll, a job (for a worker thread, apart from the syncs publishes wait for)
        that writes the producer snapshot at the active segment's start: the newest snapshot
        before it and the marks of the records between, from the rolled segments' files
        (which no longer change). None when no segment rolled since the last one."""
        if not self._snapshot_due or self.producer_expiration is None:
            return None
        self._snapshot_due = False
        active = self.segments[-1]
        boundary = Position(active.start, active.start_count)
        entry = self.entry_ending_at(boundary)
        if entry is None:
            return None
        since_ns = int((time.time() - self.producer_expiration()) * 1e9)
        producers, first = self._producers_before(boundary.offset, since_ns)
        pieces = [
            (self.segment_path(segment.number), segment.start, segment.start + segment.size)
            for segment in self.segments[:-1]
            if segment.start + segment.size > first.offset
        ]
        files = self.files
        name = self.name

        def job() -> None:
            try:
                for path, start, end in pieces:
                    fold(producers, file_marks(path, max(first.offset, start) - start, end - start))
                snapshot = ProducerSnapshot(boundary, entry, seen_since(producers, since_ns))
                with self._file_jobs:
                    if not self._deleted:
                        write_snapshot(files, snapshot)
            except OSError as error:
                logger.warning("LOG(%s) wrote no producer snapshot - %s", name, error)

        return job

    def sync(self) -> bool:
        """Commit and fsync, here and now (tests, migration, a clean stop)."""
        self.commit()
        return self.prepare_sync()()

    # -- reading -------------------------------------------------------------------------------

    def read(self, position: Position, max_count: int, end: int | None = None) -> list[M]:
        """Up to `max_count` messages from `position` (a record boundary) up to the end: from
        the hot tail where it holds them, from the segments otherwise."""
        end = self.end.offset if end is None else min(end, self.end.offset)
        if position.offset >= end or max_count <= 0:
            return []
        return self._read_records(position, max_count, end)

    def read_message(self, position: Position, message_id: bytes) -> M | None:
        """The message whose record is at `position`, if the log still holds it there with
        that ID (retention, or a log cut back and written again, may have taken it)."""
        try:
            read = self.read(position, 1)
        except LogCorruption:
            return None
        return read[0] if read and read[0].id == message_id else None

    def _read_records(self, position: Position, max_count: int, end: int) -> list[M]:
        if position.offset < self.start.offset:
            raise LogCorruption(f"offset {position.offset} is before the log's start")
        index = bisect.bisect_right(self._segment_starts, position.offset) - 1
        messages: list[M] = []
        offset, count = position.offset, position.count
        while len(messages) < max_count and offset < end and index < len(self.segments):
            segment = self.segments[index]
            pos = offset - segment.start
            if pos >= segment.size:
                index += 1
                continue
            chunk, at = self._chunk_at(segment, pos, end - offset)
            first = at
            # Records past `end` may be in the chunk: they are not read.
            length = min(len(chunk), at + (end - offset))
            # The hot loop of every read from disk: no call but make() per record, the hex
            # ID straight from the record's 8 bytes, every name local.
            unpack_header = SIZED_HEADER.unpack_from
            append = messages.append
            make, hex_id = self.message_type, hexlify
            header_size, body_start = RECORD_HEADER_SIZE, BODY_START
            for _ in range(max_count - len(messages)):
                if at + body_start > length:
                    break  # the chunk ends inside this record's header
                size, timestamp, attempts, trace_id = unpack_header(chunk, at)
                end_at = at + 4 + size
                if end_at > length or size < header_size:
                    if size < header_size and not messages:
                        raise LogCorruption(f"a record of {size} bytes at offset {offset}")
                    break
                if attempts < 0x1000:
                    append(
                        make(
                            hex_id(chunk[at + 14 : at + 22]),
                            chunk[at + body_start : end_at],
                            timestamp,
                            attempts,
                            offset,
                            trace_id,
                            count,
                        )
                    )
                else:
                    message = decode_flagged_record(chunk[at + 4 : end_at], offset, count, make)
                    if message.delay is not None:
                        self.read_delayed = True
                    append(message)
                offset += end_at - at
                at = end_at
                count += 1
            if at == first:
                if messages:
                    break  # what was read is good; the next read meets the bad record
                raise LogCorruption(f"no whole record at offset {offset}")
        return messages

    def file_position(self, offset: int) -> tuple[int, int]:
        """(segment number, position in it) of a virtual offset."""
        segment = self.segments[max(0, bisect.bisect_right(self._segment_starts, offset) - 1)]
        return segment.number, offset - segment.start

    def position_after_corruption(self, position: Position) -> Position:
        """Where reading goes on past an unreadable record at `position`: the start of the
        next segment, or the log's end in the last one."""
        corrupt = self._corrupt_groups
        at = bisect.bisect_right([group[0] for group in corrupt], position.offset) - 1
        if at >= 0 and corrupt[at][0] <= position.offset < corrupt[at][1].offset:
            return corrupt[at][1]
        index = bisect.bisect_right(self._segment_starts, position.offset)
        if index < len(self.segments):
            following = self.segments[index]
            return Position(following.start, following.start_count)
        return self.end

    def repair_group(self, entry: IndexEntry, data: bytes) -> None:
        """Write a committed group's bytes again where they are stored, from another
        replica's copy (byte-identical: followers write their leader's groups as they are),
        and sync them (`/topic/fixdata`)."""
        offset, size = entry[3], entry[4]
        inside = self.start.offset <= offset <= offset + size <= self.written.offset
        if len(data) != size or not inside:
            raise ValueError(f"the group at offset {offset} is not in the log")
        number, pos = self.file_position(offset)
        fd = os.open(self.segment_path(number), os.O_WRONLY)
        try:
            os.pwrite(fd, data, pos)
            self._disk.fsync(fd)
        finally:
            os.close(fd)
        self._read_cache = None
        self._corrupt_groups = [group for group in self._corrupt_groups if group[0] != offset]

    def skip_corrupt_group(self, entry: IndexEntry) -> None:
        """A group no copy repairs: a reader that meets it goes on right after it (instead of
        at the next segment)."""
        group = (entry[3], Position(*entry_end(entry)))
        if group not in self._corrupt_groups:
            bisect.insort(self._corrupt_groups, group)

    def _chunk_at(self, segment: Segment, pos: int, wanted: int) -> tuple[bytes, int]:
        """Bytes of `segment` holding at least the whole record at `pos`, and where it starts in
        them. The last chunk read is kept: a consumer reads a few hundred records at a time
        (what RDY lets out), and a chunk holds about a thousand. Written bytes never change,
        so a kept chunk stays true."""
        offset = segment.start + pos
        starts = self._tail_starts
        if starts and offset >= starts[0]:
            index = bisect.bisect_right(starts, offset) - 1
            data = self._tail[index]
            at = offset - starts[index]
            if at < len(data):
                return data, at
        cached = self._read_cache
        if cached is not None and cached[0] == segment.number:
            start, data = cached[1], cached[2]
            at = pos - start
            if 0 <= at and at + 4 <= len(data):
                (size,) = SIZE.unpack_from(data, at)
                if at + 4 + size <= len(data):
                    return data, at
        available = min(segment.size - pos, wanted)
        fd = os.open(self.segment_path(segment.number), os.O_RDONLY)
        try:
            chunk = os.pread(fd, min(segment.size - pos, READ_CHUNK), pos)
            if len(chunk) >= 4:
                (first_size,) = SIZE.unpack_from(chunk)
                if 4 + first_size > len(chunk) and 4 + first_size <= available:
                    chunk = os.pread(fd, 4 + first_size, pos)  # one record past a chunk
        finally:
            os.close(fd)
        self._read_cache = (segment.number, pos, chunk)
        return chunk, 0

    def read_raw(
        self,
        position: Position,
        end: int,
        max_bytes: int,
        *,
        bound: Position | None = None,
        starts: list[int] | None = None,
    ) -> tuple[bytes, Position]:
        """The stored bytes of whole records from `position` (a record boundary) up to `end`
        (at most the log's end, or `bound`), at most `max_bytes` of them but at least one
        record: the records exactly as written, `[4 size][record]...`, and the position after
        them. With `starts`, where each record starts in those bytes is appended to it (the
        walk that finds the last whole record passes every start)."""
        end = min(end, (bound or self.end).offset)
        if position.offset >= end:
            return b"", position
        parts: list[bytes] = []
        offset, count = position.offset, position.count
        budget = max_bytes
        # A local: a method of an imported name is looked up as an attribute at every call
        # (CPython 3.11 does not use its method-call fast path for those), once per record.
        unpack_size = SIZE.unpack_from
        index = bisect.bisect_right(self._segment_starts, offset) - 1
        while offset < end and index < len(self.segments):
            segment = self.segments[index]
            pos = offset - segment.start
            if pos >= segment.size:
                index += 1
                continue
            fd = os.open(self.segment_path(segment.number), os.O_RDONLY)
            # Where each whole record of the chunk starts: counts them, and is `starts`'s
            # share (an append a record costs about what counting them one by one did).
            found: list[int] = []
            note = found.append
            try:
                want = min(segment.size - pos, end - offset, max(budget, 0))
                chunk = os.pread(fd, want, pos) if want > 0 else b""
                at = 0
                while True:
                    if at + 4 > len(chunk):
                        if at == 0 and not parts and pos + 4 <= segment.size:
                            # Not even one record in the budget: take the first whole.
                            (size,) = SIZE.unpack(os.pread(fd, 4, pos))
                            chunk = os.pread(fd, 4 + size, pos)
                            continue
                        break
                    (size,) = unpack_size(chunk, at)
                    if at + 4 + size > len(chunk):
                        if at == 0 and not parts:
                            chunk = os.pread(fd, 4 + size, pos)
                            continue
                        break
                    note(at)
                    at += 4 + size
            finally:
                os.close(fd)
            if at == 0:
                break
            count += len(found)
            if starts is not None:
                taken = offset - position.offset
                starts.extend([taken + start for start in found] if taken else found)
            parts.append(chunk[:at])
            offset += at
            budget -= at
            if budget <= 0:
                break
        return b"".join(parts), Position(offset, count)

    # -- searching: the commit-log index, then the batch ------------------------------------------

    def _index_files(self) -> list[tuple[str, int]]:
        return index_files(self.files, self._index_number, self._index_entries)

    def _last_entry_where(self, holds: Callable[[IndexEntry], bool]) -> IndexEntry | None:
        """The last index entry for which `holds` is true, `holds` being true for a prefix of
        the entries (a binary search with one `pread` per probe)."""
        with IndexReader(self._index_files()) as index:
            found = index.count_where(holds)
            return index.entry(found - 1) if found > 0 else None

    def entries_from(self, offset: int, max_entries: int) -> list[IndexEntry]:
        """Up to `max_entries` index entries, from the one that starts at `offset` on (what
        a follower catching up pulls); [] at the written end. ValueError when no entry starts
        at `offset`."""
        if offset == self.written.offset:
            return []
        with IndexReader(self._index_files()) as index:
            first = index.count_where(lambda e: e[3] < offset)
            entries = index.entries(first, max_entries)
        if not entries or entries[0][3] != offset:
            raise ValueError(f"no index entry starts at offset {offset}")
        return entries

    def entry_ending_at(self, position: Position) -> IndexEntry | None:
        """The index entry that ends exactly at `position`, if there is one."""
        with IndexReader(self._index_files()) as index:
            found = index.count_where(lambda e: e[3] < position.offset)
            entry = index.entry(found - 1) if found > 0 else None
        if entry is not None and entry_end(entry) == position:
            return entry
        return None

    def group_reads(self, entries: list[IndexEntry]) -> list[tuple[str, int, int]]:
        """Where the stored bytes of consecutive index entries' groups are: (segment file,
        position, size) pieces, to read with `read_pieces` away from the caller's thread (a
        group never spans two segments; a roll comes after one). ValueError for a group
        outside the segments this log holds."""
        if not entries:
            return []
        start = entries[0][3]
        end = entries[-1][3] + entries[-1][4]
        if start < self.start.offset or end > self.written.offset:
            raise ValueError(f"[{start}, {end}) is not in the log")
        pieces = []
        index = bisect.bisect_right(self._segment_starts, start) - 1
        offset = start
        while offset < end:
            segment = self.segments[index]
            size = min(end, segment.start + segment.size) - offset
            if size <= 0:
                raise ValueError(f"offset {offset} is past segment {segment.number}")
            pieces.append((self.segment_path(segment.number), offset - segment.start, size))
            offset += size
            index += 1
        return pieces

    def read_group_bytes(self, entries: list[IndexEntry]) -> bytes:
        """The stored bytes of consecutive index entries' groups, as written."""
        if not entries:
            return b""
        start = Position(entries[0][3], entries[0][5] - 1)
        end = entries[-1][3] + entries[-1][4]
        data, _following = self.read_raw(start, end, end - start.offset, bound=self.written)
        return data

    def truncate_to(self, position: Position) -> None:
        """Cut the log back to `position`, where one of its index entries ends (a leader's
        group that its followers did not all take; a follower's tail that its new leader does
        not have). ValueError when `position` is not such a place in the active index file."""
        self.discard_pending()
        if position == self.written:
            return
        self.rewrites += 1
        if not self.start.offset <= position.offset < self.written.offset:
            raise ValueError(f"offset {position.offset} is not in the log")
        with open(self.index_path(), "rb") as file:
            data = file.read()
        whole = len(data) - len(data) % ENTRY.size
        entries = [ENTRY.unpack_from(data, at) for at in range(0, whole, ENTRY.size)]
        keep = bisect.bisect_left([entry[3] for entry in entries], position.offset)
        if keep:
            last = entries[keep - 1]
            if entry_end(last) != position:
                raise ValueError(f"no index entry ends at offset {position.offset}")
            last_id = last[2]
        elif entries and entries[0][3] == position.offset:
            last_id = entries[0][0] - 1
        else:
            raise ValueError(f"offset {position.offset} is before the active index file")
        os.truncate(self.index_path(), keep * ENTRY.size)
        self._index_entries = keep
        active = self.segments[-1].number
        self.segments = truncate_segments(self.files, self.segments, position.offset)
        self._segment_starts = [segment.start for segment in self.segments]
        last_segment = self.segments[-1]
        if last_segment.number != active:
            os.close(self._write_fd)
            self._write_fd = os.open(
                self.segment_path(last_segment.number), os.O_WRONLY | os.O_APPEND, 0o600
            )
            try:
                os.unlink(self.segment_path(last_segment.number) + ".offsetmeta.dat")
            except FileNotFoundError:
                pass
        self.written = self.appended = position
        self.end = min(self.end, position)
        self.last_id = last_id
        self._forget_snapshots_after(position.offset)
        index = bisect.bisect_left(self._tail_starts, position.offset)
        for data in self._tail[index:]:
            self._tail_bytes -= len(data)
        del self._tail[index:]
        del self._tail_starts[index:]
        self._read_cache = None
        if self.on_cut_back is not None:
            self.on_cut_back(position.offset)
        self.log.warning(
            "TOPIC(%s) partition %d: log cut back to offset %d (count %d)",
            self.topic,
            self.partition,
            position.offset,
            position.count,
        )

    # -- starting over where another replica starts -------------------------------------------

    @property
    def first_segment_number(self) -> int:
        return self.segments[0].number

    def snapshot_files(self) -> dict[int, bytes]:
        """The producer snapshots at or after the log's start, by offset, as stored: what a
        replica that starts over at this log's start copies (`reset_to`)."""
        found = {}
        for offset in self.files.producer_snapshot_offsets():
            if offset < self.start.offset:
                continue
            try:
                with open(self.files.producer_snapshot(offset), "rb") as file:
                    found[offset] = file.read()
            except FileNotFoundError:
                continue  # replaced by a newer one meanwhile
        return found

    def reset_to(
        self,
        start: Position,
        segment_number: int,
        boundary: IndexEntry | None,
        snapshots: dict[int, bytes],
    ) -> None:
        """Drop every record and start the log over, empty, at `start`, in segment file
        `segment_number`: a replica whose leader's retention removed what it lacks (or whose
        history went another way below the leader's start) copies the leader's log from the
        leader's start, and its files then carry the leader's names and bytes. `boundary` (the
        leader's index entry that ends at `start`) becomes the first index entry, as retention
        leaves removed groups' entries in the index; `snapshots` (the leader's producer
        snapshots at or after `start`, as stored) are written as they are and count once the
        records they follow are copied. OSError if the files cannot be written: the log is
        then an empty one at some start (a crash meanwhile leaves the same), which the next
        attempt starts over again."""
        if self._deleted:
            # A catch-up answered after its partition left this node: no files again.
            raise OSError(errno.EBADF, f"the log of {self.name} was deleted")
        if start.offset < 0 or start.count < 0 or segment_number < 0:
            raise ValueError(f"cannot start a log at {start} in segment {segment_number}")
        if boundary is not None and entry_end(boundary) != tuple(start):
            raise ValueError(f"the index entry {boundary} does not end at {start}")
        self.discard_pending()
        self.rewrites += 1
        if not self._closed:
            os.close(self._write_fd)
            os.close(self._index_fd)
        self._closed = True
        files = self.files
        # The index first: a crash from here on leaves fewer entries than data, which
        # opening cuts back to an empty log.
        for number in range(self._index_number, -1, -1):
            _remove(files.index(number) if number != self._index_number else files.index())
        for path in (files.index_current, files.writer_meta):
            _remove(path)
        for number in files.segment_numbers():
            _remove(files.segment(number))
            _remove(files.segment_meta(number))
        remove_snapshots(files, files.producer_snapshot_offsets())
        open(files.segment(segment_number), "wb").close()
        write_atomically(
            files.start_meta,
            json.dumps(
                {
                    "SegOffset": {"FileNum": segment_number, "Pos": 0},
                    "VirtualOffset": start.offset,
                    "TotalMsgCnt": start.count,
                }
            ).encode(),
        )
        disk.write_file(files.index(), b"" if boundary is None else ENTRY.pack(*boundary))
        for offset, document in snapshots.items():
            if offset >= start.offset:
                write_atomically(files.producer_snapshot(offset), document)
        self.segments = [Segment(segment_number, start.offset, start.count, 0)]
        self._segment_starts = [start.offset]
        self.start = self.end = self.written = self.appended = start
        if boundary is not None:
            self.last_id = max(self.last_id, boundary[2])
        self._index_number = 0
        self._index_entries = 1 if boundary is not None else 0
        self._tail, self._tail_starts, self._tail_bytes = [], [], 0
        self._read_cache = None
        self._snapshot_due = False
        self._ops_since_sync = 0
        self._write_fd = os.open(files.segment(segment_number), os.O_WRONLY | os.O_APPEND, 0o600)
        self._index_fd = os.open(files.index(), os.O_WRONLY | os.O_APPEND, 0o600)
        self._closed = False
        if self.on_cut_back is not None:
            self.on_cut_back(-1)
        self.log.warning(
            "TOPIC(%s) partition %d: log started over at offset %d (count %d), segment %d",
            self.topic,
            self.partition,
            start.offset,
            start.count,
            segment_number,
        )

    def _scan_from(self, entry: IndexEntry | None, stop: Callable[[M], bool]) -> Position:
        """From the start of `entry`'s batch (the log's start when None), the position of the
        first message for which `stop` is true; the end when none is."""
        position = self.start
        if entry is not None and entry[3] >= self.start.offset:
            position = Position(entry[3], entry[5] - 1)
        while position.offset < self.end.offset:
            batch = self.read(position, 1024)
            if not batch:
                break
            for message in batch:
                if stop(message):
                    return Position(message.offset, message.count)
            last = batch[-1]
            position = Position(last.offset + record_size(last, self.ext), last.count + 1)
        return self.end

    def _first_timestamp(self, entry: IndexEntry) -> int:
        first = self.read(Position(entry[3], entry[5] - 1), 1)
        return first[0].timestamp if first else 0

    def producer_state(self, since_ns: int) -> Producers:
        """Each producer whose idempotent publishes were written at or after `since_ns`: its
        last sequence and when it was last seen. From the newest producer snapshot and the
        records after it, or from every record since `since_ns` when there is none
        (`nsqd/idempotence.py` rebuilds its producers from this)."""
        producers, first = self._producers_before(self.written.offset, since_ns)
        fold(producers, self._marks_from(first))
        return seen_since(producers, since_ns)

    def _producers_before(self, at_most: int, since_ns: int) -> tuple[Producers, Position]:
        """Where a rebuild of the producers up to offset `at_most` starts: the producers of
        the newest snapshot at or before it (none without one), and the first record whose
        marks are still to be read (the snapshot's end, or the first written at or after
        `since_ns` when that comes later)."""
        first = self.search_timestamp(since_ns)
        base = self._newest_snapshot(at_most)
        if base is None:
            return {}, first
        # What it says of records before `first` is older than `since_ns`, and left out by
        # the caller; but it also remembers records retention may have removed.
        return dict(base.producers), max(first, base.position)

    def _marks_from(self, position: Position) -> list[tuple[ProducerMark, int]]:
        """The producer marks of the written records from `position` on, oldest first."""
        found: list[tuple[ProducerMark, int]] = []
        end = self.written.offset
        while position.offset < end:
            data, position = self.read_raw(position, end, READ_CHUNK)
            if not data:
                break
            collect_marks(data, found)
        return found

    def _newest_snapshot(self, at_most: int) -> ProducerSnapshot | None:
        """The newest producer snapshot at or before offset `at_most` that matches this log
        (the index entry it names ends where it says)."""
        for offset in reversed(self.files.producer_snapshot_offsets()):
            if offset > at_most:
                continue
            snapshot = read_snapshot(self.files, offset)
            if snapshot is None:
                continue
            # Index files outlive retention: a snapshot of removed records is checked too.
            if self.entry_ending_at(snapshot.position) == snapshot.entry:
                return snapshot
        return None

    def _forget_snapshots_after(self, offset: int) -> None:
        """Remove the producer snapshots of records past `offset` (cut back)."""
        remove_snapshots(
            self.files, [at for at in self.files.producer_snapshot_offsets() if at > offset]
        )

    def search_timestamp(self, timestamp_ns: int) -> Position:
        """The first message published at or after `timestamp_ns`, or the end."""
        entry = self._last_entry_where(
            lambda e: e[3] < self.start.offset or self._first_timestamp(e) < timestamp_ns
        )
        return self._scan_from(entry, lambda message: message.timestamp >= timestamp_ns)

    def position_of_count(self, count: int) -> Position:
        """The position of the message with `count` messages before it (clamped to start and
        end)."""
        if count <= self.start.count:
            return self.start
        if count >= self.end.count:
            return self.end
        entry = self._last_entry_where(lambda e: e[5] - 1 <= count)
        return self._scan_from(entry, lambda message: message.count >= count)

    def position_of_id(self, message_id: int) -> Position | None:
        """Where the message with this ID is (a partition's IDs grow with its log), or None
        when the log does not hold it: removed by retention, or never written here."""
        entry = self._last_entry_where(lambda e: e[3] < self.start.offset or e[0] <= message_id)
        if entry is None or entry[3] < self.start.offset or entry[2] < message_id:
            return None
        position = self._scan_from(entry, lambda message: int(message.id, 16) >= message_id)
        found = self.read(position, 1)
        return position if found and int(found[0].id, 16) == message_id else None

    def position_at_or_after(self, offset: int) -> Position:
        """The first record boundary at or after a virtual offset."""
        if offset <= self.start.offset:
            return self.start
        if offset >= self.end.offset:
            return self.end
        entry = self._last_entry_where(lambda e: e[3] <= offset)
        return self._scan_from(entry, lambda message: message.offset >= offset)

    def position_for(self, kind: str, value: int) -> Position:
        """Where a consume offset (Youzan's `<type>:<value>`, docs/protocol.md §3.8) points:
        `timestamp` (unix seconds: the first message at or after it), `virtual_queue` (the
        first record at or after that virtual offset), `msgcount` (the message with that many
        before it), `special:-1` (the end). ValueError for what cannot be served, such as an
        offset already removed by retention."""
        if kind == "special":
            if value != -1:
                raise ValueError(f"not supported special consume offset: {value}")
            return self.end
        if kind == "timestamp":
            return self.search_timestamp(value * 1_000_000_000)
        if kind == "virtual_queue":
            if value < self.start.offset:
                raise ValueError(
                    f"offset {value} is before the start {self.start.offset} of the queue"
                )
            return self.position_at_or_after(value)
        if kind == "msgcount":
            if value < self.start.count:
                raise ValueError(
                    f"count {value} is before the start {self.start.count} of the queue"
                )
            return self.position_of_count(value)
        raise ValueError(f"invalid consume offset:{kind}:{value}")

    # -- retention -----------------------------------------------------------------------------

    def start_after_clean(self, floor: int, *, keep_bytes: float, older_than: float) -> int:
        """The offset the log would start at after `clean` with these arguments (what it
        would remove, without removing it)."""
        count = self._removable(floor, keep_bytes, older_than)
        return self.segments[count].start if count else self.start.offset

    def _removable(self, floor: int, keep_bytes: float, older_than: float) -> int:
        return removable_segments(
            self.files,
            self.segments,
            self.start,
            self.end,
            floor,
            keep_bytes=keep_bytes,
            older_than=older_than,
        )

    def clean(self, floor: int, *, keep_bytes: float, older_than: float) -> int:
        """Remove whole segments that end at or before `floor` (every channel's confirmed
        offset) and are either older than `older_than` (a unix time) or beyond `keep_bytes`
        of consumed data (`retention.py`). How many segments were removed.

        Idempotent producers are known from the records' marks: a segment goes only once a
        producer snapshot covers it (the periodic sync after a roll writes one), or a
        rebuild, and a replica that starts over here, would forget the producers whose
        records it held."""
        if self.producer_expiration is not None:
            covered = self._newest_snapshot(self.written.offset)
            floor = min(floor, covered.position.offset if covered else self.start.offset)
        count = self._removable(floor, keep_bytes, older_than)
        if not count:
            return 0
        self.start = remove_segments(self.files, self.segments[:count], self.segments[count])
        del self.segments[:count]
        self._segment_starts = [segment.start for segment in self.segments]
        self._forget_tail_before(self.start.offset)
        self.log.info(
            "TOPIC(%s) partition %d: retention removed %d segment(s); the log starts at %d",
            self.topic,
            self.partition,
            count,
            self.start.offset,
        )
        return count

    def _forget_tail_before(self, offset: int) -> None:
        """Drop the hot tail's appends that start before `offset`."""
        index = bisect.bisect_left(self._tail_starts, offset)
        for data in self._tail[:index]:
            self._tail_bytes -= len(data)
        del self._tail[:index]
        del self._tail_starts[:index]

    # -- closing -------------------------------------------------------------------------------

    def close(self) -> None:
        if self._closed:
            return
        try:
            self.sync()
        except OSError as error:
            self.log.error("LOG(%s) failed to write at close - %s", self.name, error)
        snapshot = self.prepare_producer_snapshot()
        if snapshot is not None:
            snapshot()
        os.close(self._write_fd)
        os.close(self._index_fd)
        self._closed = True

    def delete(self) -> None:
        """The partition's files go, and what was appended but not written with them."""
        self.discard_pending()
        with self._file_jobs:
            self._deleted = True
        if not self._closed:
            os.close(self._write_fd)
            os.close(self._index_fd)
            self._closed = True
        self.files.remove_all()
