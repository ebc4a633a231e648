"""A partition's log as its files on disk say, read only: for tools that inspect a data
directory whether nsqd runs or not (`nsq_data_tool`). Nothing is written, cut or recovered:
a torn tail is left as it is, and only what the commit-log index names is read.
"""

import bisect
import json
import os
import sqlite3
from collections.abc import Iterable, Iterator
from typing import BinaryIO, NamedTuple

from nsqpy.partition_log.files import LogFiles
from nsqpy.partition_log.index import (
    ENTRY,
    IndexEntry,
    IndexReader,
    entry_end,
    index_files,
    read_current_number,
)
from nsqpy.partition_log.records import (
    DELAYED_FLAGS,
    EXT_FLAGS,
    PRODUCER_FLAGS,
    RECORD_HEADER,
    RECORD_HEADER_SIZE,
    SIZE,
    Position,
    Record,
    decode_flagged_record,
)
from nsqpy.partition_log.recovery import read_start
from nsqpy.partition_log.segments import Segment, scan_segments

FLAGGED = frozenset((*DELAYED_FLAGS, *EXT_FLAGS, *PRODUCER_FLAGS))


class ChannelPosition:
    """What a channel's files say: its confirmed position, the ranges it acknowledged beyond
    it, and the messages it deferred in memory when it last wrote them (ID to due time)."""

    def __init__(self, name: str, confirmed: Position | None, ranges: list, deferred: dict):
        self.name = name
        self.confirmed = confirmed
        self.ranges = ranges
        self.deferred = deferred


class GroupFault(NamedTuple):
    """An index entry (at `position` in the index) whose stored bytes do not hold its group."""

    position: int
    entry: IndexEntry
    reason: str


def group_fault(entry: IndexEntry, data: bytes) -> str | None:
    """What is wrong with a group's stored bytes against its index entry; None when they hold
    exactly its records: whole, as many as it counts, from its first ID to its last."""
    if len(data) != entry[4]:
        return f"{len(data)} bytes stored of the group's {entry[4]}"
    at = count = 0
    first_id = last_id = -1
    while at < len(data):
        offset = entry[3] + at
        if at + SIZE.size + RECORD_HEADER_SIZE > len(data):
            return f"a torn record at offset {offset}"
        (size,) = SIZE.unpack_from(data, at)
        if size < RECORD_HEADER_SIZE or at + SIZE.size + size > len(data):
            return f"a record of {size} bytes at offset {offset}"
        last_id = RECORD_HEADER.unpack_from(data, at + SIZE.size)[2]
        if count == 0:
            first_id = last_id
        at += SIZE.size + size
        count += 1
    if count != entry[6]:
        return f"{count} records where the index counts {entry[6]}"
    if (first_id, last_id) != (entry[0], entry[2]):
        return f"IDs {first_id} to {last_id} where the index has {entry[0]} to {entry[2]}"
    return None


class LogView:
    """One partition's files: its retained start, its commit-log index, its segments."""

    def __init__(self, data_path: str, topic: str, partition: int) -> None:
        self.files = files = LogFiles(data_path, topic, partition)
        if not os.path.exists(files.index()):
            raise FileNotFoundError(
                f"no commit log for {topic} partition {partition}: {files.index()}"
            )
        self.start = read_start(files)
        self.index_number = read_current_number(files)
        active = os.path.getsize(files.index()) // ENTRY.size
        self.active_entries = active
        self.index = IndexReader(index_files(files, self.index_number, active))
        self.segments: list[Segment] = scan_segments(files, self.start)
        self._segment_starts = [segment.start for segment in self.segments]
        # The segment file the last group was read from: (number, open file).
        self._segment_file: tuple[int, BinaryIO] | None = None

    def close(self) -> None:
        self.index.__exit__(None, None, None)
        if self._segment_file is not None:
            self._segment_file[1].close()
            self._segment_file = None

    @property
    def first_retained(self) -> int:
        """The index position of the first group at or after the retained start (rolled
        index files may still hold groups retention removed)."""
        start = self.start.offset
        return self.index.count_where(lambda entry: entry[3] < start)

    @property
    def last_entry(self) -> IndexEntry | None:
        total = self.index.total
        return self.index.entry(total - 1) if total else None

    @property
    def end(self) -> Position:
        last = self.last_entry
        return Position(*entry_end(last)) if last is not None else self.start

    # -- the index ---------------------------------------------------------------------------

    def entry_at(self, mode: str, value: int) -> int:
        """The position in the index of the group holding the message that `mode` (`count`,
        `id`, `virtual_offset`, `timestamp`: unix nanoseconds) names; ValueError when the
        index holds none."""
        index = self.index
        if mode == "count":
            position = index.count_where(lambda entry: entry[5] - 1 <= value) - 1
        elif mode == "id":
            position = index.count_where(lambda entry: entry[0] <= value) - 1
        elif mode == "virtual_offset":
            position = index.count_where(lambda entry: entry[3] <= value) - 1
        elif mode == "timestamp":
            position = index.count_where(lambda entry: self._first_timestamp(entry) < value)
            position = max(position - 1, 0) if position == index.total else position
        else:
            raise ValueError(f"not supported search mode: {mode}")
        if not 0 <= position < index.total:
            raise ValueError(f"no message at {mode} {value} in the commit log")
        return position

    def _first_timestamp(self, entry: IndexEntry) -> int:
        for message in self.records(Position(entry[3], entry[5] - 1), 1):
            return message.timestamp
        return 0

    # -- checking the data against the index -------------------------------------------------

    def group_bytes(self, entry: IndexEntry) -> bytes:
        """The stored bytes of an entry's group (short when its file is); OSError when its
        segment is gone or cannot be read. Groups read in order share one open file."""
        offset, size = entry[3], entry[4]
        index = bisect.bisect_right(self._segment_starts, offset) - 1
        if index < 0:
            raise FileNotFoundError(f"no segment holds offset {offset}")
        segment = self.segments[index]
        if self._segment_file is None or self._segment_file[0] != segment.number:
            if self._segment_file is not None:
                self._segment_file[1].close()
                self._segment_file = None
            self._segment_file = (segment.number, open(self.files.segment(segment.number), "rb"))
        data = self._segment_file[1]
        data.seek(offset - segment.start)
        return data.read(size)

    def faults(self, positions: Iterable[int] | None = None) -> Iterator[GroupFault]:
        """The groups (by position in the index; every one from the retained start when not
        given) whose stored bytes do not hold what their index entries say."""
        if positions is None:
            positions = range(self.first_retained, self.index.total)
        start = self.start.offset
        for position in positions:
            entry = self.index.entry(position)
            if entry[3] < start:
                continue  # before the retained start: retention removes it
            try:
                reason = group_fault(entry, self.group_bytes(entry))
            except OSError as error:
                reason = str(error)
            if reason is not None:
                yield GroupFault(position, entry, reason)

    # -- records -------------------------------------------------------------------------------

    def records(self, position: Position, limit: int) -> Iterator[Record]:
        """Up to `limit` messages from `position` (a record's start) on, up to the index's
        end; OSError when a file is shorter than the index says."""
        offset, count = position
        end = self.end.offset
        for segment in self.segments:
            if limit <= 0 or offset >= end:
                return
            if not segment.start <= offset < segment.start + segment.size:
                continue
            path = self.files.segment(segment.number)
            with open(path, "rb") as file:
                while limit > 0 and offset < min(end, segment.start + segment.size):
                    file.seek(offset - segment.start)
                    header = file.read(SIZE.size)
                    if len(header) < SIZE.size:
                        raise OSError(f"{path}: torn record at {offset}")
                    (size,) = SIZE.unpack(header)
                    record = file.read(size)
                    if len(record) < size:
                        raise OSError(f"{path}: torn record at {offset}")
                    yield decode_record(record, offset, count)
                    offset += SIZE.size + size
                    count += 1
                    limit -= 1

    # -- channels and the delay queue ----------------------------------------------------------

    def channels(self) -> list[ChannelPosition]:
        """Every channel whose position file is beside the log."""
        prefix, suffix = f"{self.files.name}:", ".diskqueue.meta.v2.reader.dat"
        names = sorted(
            name[len(prefix) : -len(suffix)]
            for name in os.listdir(self.files.directory)
            if name.startswith(prefix) and name.endswith(suffix)
        )
        return [self.channel(name) for name in names]

    def channel(self, name: str) -> ChannelPosition:
        confirmed = None
        try:
            with open(self.files.reader_meta(name), "rb") as file:
                lines = file.read().split(b"\n")
            confirmed = Position(int(lines[2].split(b",")[2]), int(lines[0]))
        except (OSError, ValueError, IndexError):
            pass
        return ChannelPosition(
            name,
            confirmed,
            _json_file(self.files.acked(name), []),
            _json_file(self.files.delays(name), {}),
        )

    def delayed(self, channel: str, limit: int) -> tuple[dict[str, int], list[tuple]]:
        """The delay queue's count per channel, and `channel`'s (every channel's when empty)
        first `limit` entries by due time: (channel, ID, offset, count, due unix ms)."""
        path = self.files.delay_queue
        if not os.path.exists(path):
            return {}, []
        try:
            db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
            counts = dict(db.execute("SELECT channel, count(*) FROM delayed GROUP BY channel"))
        except sqlite3.Error:
            # No WAL index to share (nsqd stopped): read the file as it is.
            db = sqlite3.connect(f"file:{path}?immutable=1", uri=True)
            counts = dict(db.execute("SELECT channel, count(*) FROM delayed GROUP BY channel"))
        try:
            where, arguments = ("WHERE channel = ?", (channel,)) if channel else ("", ())
            rows = db.execute(
                f"SELECT channel, id, offset, count, due FROM delayed {where}"
                " ORDER BY due, id LIMIT ?",
                (*arguments, limit),
            ).fetchall()
        finally:
            db.close()
        return counts, rows


def decode_record(record: bytes, offset: int, count: int) -> Record:
    """One record's message, whatever its kind (plain, ext, producer-marked, delayed)."""
    timestamp, attempts, internal_id, trace_id = RECORD_HEADER.unpack_from(record)
    if attempts & 0xF000 in FLAGGED:
        return decode_flagged_record(record, offset, count, Record)
    return Record(
        b"%016x" % internal_id,
        bytes(record[RECORD_HEADER_SIZE:]),
        timestamp,
        attempts,
        offset,
        trace_id,
        count,
    )


def _json_file(path: str, empty):
    try:
        with open(path, "rb") as file:
            return json.loads(file.read())
    except (OSError, ValueError):
        return empty
