"""The commit-log index: one 48-byte big-endian entry per committed group (first ID, epoch,
last ID, virtual offset, group size, 1-based count of the group's first message, message
count), in files rolled after a number of entries, `.current` naming the active one's number.
Searches read entries by position with `pread` (a binary search costs one read a probe)."""

import os
import struct
from collections.abc import Callable

from nsqpy.partition_log.files import LogFiles

ENTRY = struct.Struct(">qqqqiqi")  # LogID, Epoch, LastMsgLogID, MsgOffset, MsgSize, MsgCnt, MsgNum
assert ENTRY.size == 48
# Youzan renames the index file after this many entries.
DEFAULT_INDEX_ENTRIES_PER_FILE = 500_000

# (first id, epoch, last id, virtual offset, size, count of the first message + 1, messages)
IndexEntry = tuple[int, int, int, int, int, int, int]


def entry_end(entry: IndexEntry) -> tuple[int, int]:
    """(virtual offset, count) where the entry's group ends."""
    return entry[3] + entry[4], entry[5] - 1 + entry[6]


def read_current_number(files: LogFiles) -> int:
    try:
        with open(files.index_current, "rb") as file:
            return int(file.read().split()[0])
    except (FileNotFoundError, ValueError, IndexError):
        return 0


def read_index_tail(files: LogFiles, number: int) -> tuple[list[IndexEntry], int]:
    """The entries of the active index file (a torn last entry cut off), and how many it
    holds. When the active file was just rolled and is empty: the previous file's last entry
    (the file holds none)."""
    path = files.index()
    try:
        with open(path, "rb") as file:
            data = file.read()
    except FileNotFoundError:
        data = b""
    whole = len(data) - len(data) % ENTRY.size
    if whole != len(data):
        os.truncate(path, whole)
    entries: list[IndexEntry] = [
        ENTRY.unpack_from(data, position) for position in range(0, whole, ENTRY.size)
    ]
    if not entries and number > 0:
        try:
            with open(files.index(number - 1), "rb") as file:
                file.seek(-ENTRY.size, os.SEEK_END)
                last = file.read(ENTRY.size)
            if len(last) == ENTRY.size:
                return [ENTRY.unpack(last)], 0
        except OSError:
            pass
    return entries, len(entries)


def index_files(files: LogFiles, number: int, active_entries: int) -> list[tuple[str, int]]:
    """Every index file still there, oldest first, with its entry count."""
    found = []
    for rolled in range(number):
        path = files.index(rolled)
        try:
            found.append((path, os.path.getsize(path) // ENTRY.size))
        except FileNotFoundError:
            continue  # removed by retention
    found.append((files.index(), active_entries))
    return found


class IndexReader:
    """The index entries of a log's index files, read by position with `pread`."""

    def __init__(self, files: list[tuple[str, int]]) -> None:
        self._files = files
        self.total = sum(count for _path, count in files)
        self._descriptors: dict[str, int] = {}

    def __enter__(self) -> "IndexReader":
        return self

    def __exit__(self, *exc_info: object) -> None:
        for fd in self._descriptors.values():
            os.close(fd)

    def entry(self, position: int) -> IndexEntry:
        for path, count in self._files:
            if position < count:
                fd = self._descriptors.get(path)
                if fd is None:
                    fd = self._descriptors[path] = os.open(path, os.O_RDONLY)
                return ENTRY.unpack(os.pread(fd, ENTRY.size, position * ENTRY.size))
            position -= count
        raise IndexError(position)

    def entries(self, first: int, count: int) -> list[IndexEntry]:
        return [self.entry(position) for position in range(first, min(first + count, self.total))]

    def count_where(self, holds: Callable[[IndexEntry], bool]) -> int:
        """How many entries `holds` is true for, it being true for a prefix of them."""
        low, high = 0, self.total
        while low < high:
            middle = (low + high) // 2
            if holds(self.entry(middle)):
                low = middle + 1
            else:
                high = middle
        return low
