"""A partition's data files: each segment and where it starts in the partition."""

import os

from nsqpy.partition_log.files import LogFiles, write_atomically
from nsqpy.partition_log.records import SIZE, Position


class Segment:
    """One data file and where it starts in the partition."""

    __slots__ = ("number", "start", "start_count", "size")

    def __init__(self, number: int, start: int, start_count: int, size: int) -> None:
        self.number = number
        self.start = start
        self.start_count = start_count
        self.size = size


def scan_segments(files: LogFiles, start: Position) -> list[Segment]:
    """The segments on disk, oldest first, placed from the retained log's `start`."""
    numbers = files.segment_numbers()
    segments = []
    offset, count = start
    for number in numbers:
        size = os.path.getsize(files.segment(number))
        segments.append(Segment(number, offset, count, size))
        offset += size
        if number != numbers[-1]:
            count += segment_count(files, number)
    return segments


def segment_count(files: LogFiles, number: int) -> int:
    """How many messages a rolled segment holds: its `.offsetmeta.dat`, else counted."""
    try:
        with open(files.segment_meta(number), "rb") as file:
            lines = file.read().split(b"\n")
        # Whole (two lines and the end), or counted again: a cut-short one says too little.
        if len(lines) >= 3 and b"," in lines[1]:
            return int(lines[0])
    except (FileNotFoundError, ValueError):
        pass
    count = 0
    with open(files.segment(number), "rb") as file:
        data = file.read()
    at = 0
    unpack_size = SIZE.unpack_from  # a local: once per record
    while at + 4 <= len(data):
        at += 4 + unpack_size(data, at)[0]
        count += 1
    return count


def write_segment_meta(files: LogFiles, segment: Segment, end_count: int) -> None:
    """A rolled segment's range (Youzan's `.offsetmeta.dat`)."""
    count = end_count - segment.start_count
    write_atomically(
        files.segment_meta(segment.number),
        b"%d\n%d,%d\n" % (count, segment.start, segment.start + segment.size),
    )


def truncate_segments(files: LogFiles, segments: list[Segment], end: int) -> list[Segment]:
    """Cut the data back to the virtual offset `end`: later segments removed (the first
    always kept), the one holding `end` truncated. The segments kept."""
    kept: list[Segment] = []
    for segment in segments:
        if segment.start >= end and kept:
            os.unlink(files.segment(segment.number))
            continue
        if segment.start + segment.size > end:
            segment.size = max(0, end - segment.start)
            os.truncate(files.segment(segment.number), segment.size)
        kept.append(segment)
    return kept


def read_pieces(pieces: list[tuple[str, int, int]]) -> bytes:
    """The bytes of (file, position, size) pieces, in order (`PartitionLog.group_reads`).
    OSError when a file went (retention) or is shorter than said."""
    parts = []
    for path, position, size in pieces:
        fd = os.open(path, os.O_RDONLY)
        try:
            data = os.pread(fd, size, position)
        finally:
            os.close(fd)
        if len(data) != size:
            raise OSError(f"{path}: {len(data)} bytes at {position}, not {size}")
        parts.append(data)
    return b"".join(parts)
