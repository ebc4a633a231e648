"""Retention: whole segments every channel has consumed go once they are old enough or
beyond the bytes to keep; the active segment always stays. The log's new start is written
before any file goes, so a crash between leaves files nothing points to, never the reverse."""

import json
import os

from nsqpy.partition_log.files import LogFiles, write_atomically
from nsqpy.partition_log.records import Position
from nsqpy.partition_log.segments import Segment


def removable_segments(
    files: LogFiles,
    segments: list[Segment],
    start: Position,
    end: Position,
    floor: int,
    *,
    keep_bytes: float,
    older_than: float,
) -> int:
    """How many of the oldest segments may go: each ends at or before `floor` (every
    channel's confirmed offset) and is older than `older_than` (a unix time) or beyond
    `keep_bytes` of consumed data."""
    count = 0
    retained_below_floor = min(floor, end.offset) - start.offset
    for segment in segments[:-1]:
        if segment.start + segment.size > floor:
            break
        old = os.path.getmtime(files.segment(segment.number)) < older_than
        over_budget = retained_below_floor > keep_bytes
        if not (old or over_budget):
            break
        count += 1
        retained_below_floor -= segment.size
    return count


def remove_segments(files: LogFiles, removed: list[Segment], following: Segment) -> Position:
    """Start the log at `following` (Youzan's `meta.extra.dat`), then remove `removed`'s
    files. The new start."""
    start = {
        "SegOffset": {"FileNum": following.number, "Pos": 0},
        "VirtualOffset": following.start,
        "TotalMsgCnt": following.start_count,
    }
    write_atomically(files.start_meta, json.dumps(start).encode())
    for segment in removed:
        for name in (files.segment(segment.number), files.segment_meta(segment.number)):
            try:
                os.unlink(name)
            except FileNotFoundError:
                pass
    return Position(following.start, following.start_count)
