"""A partition stored as a replayable log: Youzan's storage model (docs/design.md §13).

Every message of a log topic's partition is appended to segment files and stays there; a
channel is a cursor into the log. The files keep Youzan's layout so a Youzan data directory is
readable (`files.py`). Positions are virtual offsets (bytes since the partition was created,
size prefixes included) and counts (messages since it was created). IDs are
`partition << 50 | sequence` and only increase, across restarts too.

* `records`: the record layout and positions, without I/O;
* `files`: where each file of a partition is;
* `segments`: the data files; `index`: the commit-log index and its searches;
* `recovery`: what opening finds and cuts back; `retention`: which segments may go;
* `producer_snapshots`: the idempotent producers of the records before a segment's start;
* `log`: `PartitionLog`, which appends, commits, reads, searches, syncs and cuts back.

It imports nothing of nsqd: the messages it reads are made by the caller's `message_type`.
"""

from nsqpy import refuse_bare_name
from nsqpy.partition_log.files import META_MAGIC, index_file_name, log_exists
from nsqpy.partition_log.index import ENTRY, IndexEntry
from nsqpy.partition_log.log import HOT_TAIL_BYTES, READ_CHUNK, PartitionLog
from nsqpy.partition_log.records import (
    BODY_START,
    ID_PARTITION_SHIFT,
    RECORD_HEADER_SIZE,
    LogCorruption,
    LogMessage,
    Position,
    ProducerMark,
    Record,
    delayed_records,
    record_size,
)

__all__ = [
    "BODY_START",
    "ENTRY",
    "HOT_TAIL_BYTES",
    "ID_PARTITION_SHIFT",
    "META_MAGIC",
    "READ_CHUNK",
    "RECORD_HEADER_SIZE",
    "IndexEntry",
    "LogCorruption",
    "LogMessage",
    "PartitionLog",
    "Position",
    "ProducerMark",
    "Record",
    "delayed_records",
    "index_file_name",
    "log_exists",
    "record_size",
]

refuse_bare_name(__name__)
