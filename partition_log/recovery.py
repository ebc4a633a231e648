"""Opening a partition's log: the index is the truth. Data past its last entry (a torn tail
after kill -9) is cut off, and an index entry past the data (the index got ahead of the data
at a power loss) is dropped, each with one log line."""

import json
import logging
import os
from typing import NamedTuple

from nsqpy.partition_log.files import LogFiles
from nsqpy.partition_log.index import ENTRY, entry_end, read_current_number, read_index_tail
from nsqpy.partition_log.records import ID_PARTITION_SHIFT, Position
from nsqpy.partition_log.segments import Segment, scan_segments, truncate_segments


class Recovered(NamedTuple):
    segments: list[Segment]
    start: Position  # where the retained log begins
    committed: Position  # where its last complete index entry ends
    last_id: int
    index_number: int  # the active index file's number
    index_entries: int  # and how many entries it holds


def read_start(files: LogFiles) -> Position:
    """Where the retained log begins (Youzan's `meta.extra.dat`: `VirtualOffset`,
    `TotalMsgCnt`), else the beginning."""
    try:
        with open(files.start_meta, "rb") as file:
            start = json.loads(file.read())
        return Position(int(start["VirtualOffset"]), int(start["TotalMsgCnt"]))
    except (FileNotFoundError, ValueError, KeyError, TypeError):
        return Position(0, 0)


def recover(files: LogFiles, log: logging.Logger | logging.LoggerAdapter) -> Recovered:
    index_number = read_current_number(files)
    entries, index_entries = read_index_tail(files, index_number)
    start = read_start(files)
    segments = scan_segments(files, start)
    data_end = segments[-1].start + segments[-1].size if segments else start.offset
    committed = start
    last_id = files.partition << ID_PARTITION_SHIFT
    while entries:
        entry = entries[-1]
        if entry[3] + entry[4] <= data_end:
            committed = Position(*entry_end(entry))
            last_id = entry[2]
            break
        entries.pop()
        if index_entries > 0:
            index_entries -= 1
            os.truncate(files.index(), index_entries * ENTRY.size)
        else:  # the active file was just rolled: the entry is the previous file's last
            previous = files.index(index_number - 1)
            os.truncate(previous, max(0, os.path.getsize(previous) - ENTRY.size))
    if data_end != committed.offset:
        log.warning(
            "TOPIC(%s) partition %d: log data ends at %d, its index at %d: cut the data back"
            " to the last complete index entry",
            files.topic,
            files.partition,
            data_end,
            committed.offset,
        )
        segments = truncate_segments(files, segments, committed.offset)
    if not segments:
        segments = [Segment(0, start.offset, start.count, 0)]
    return Recovered(segments, start, committed, last_id, index_number, index_entries)
