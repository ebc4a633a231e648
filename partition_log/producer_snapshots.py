"""Snapshots of a partition's idempotent producers, as Kafka's producer snapshots.

The sequence each producer reached is kept only in the log: the last record of an idempotent
publish carries its producer and sequence (`records.ProducerMark`). A leader rebuilds its
producers from those marks (`nsqd/idempotence.py`); without snapshots it would read every
record of the last `--producer-id-expiration` to do it. A snapshot,
`<topic>-<p>.producers.<offset>.json`, holds what the marks of every record before `offset`
(a segment's start) say: each producer's last sequence and when it was last seen. Every
replica writes one at its next periodic sync after a segment rolled (and at a clean stop),
from its previous snapshot and the records since, in a worker thread, leaving out the
producers not seen within the expiration. A new leader or a restarted node starts from its
newest snapshot and reads only the records after it: at most about a segment.

A snapshot names the index entry that ends at its offset: one whose tail was cut back (a
follower's unacknowledged records, a recovered tail) no longer matches the log and is
ignored, and removed when the log is cut back before it.
"""

import json
import os
from collections.abc import Iterable
from typing import NamedTuple

from nsqpy.partition_log.files import LogFiles, write_atomically
from nsqpy.partition_log.index import IndexEntry
from nsqpy.partition_log.records import (
    BODY_START,
    PRODUCER_FLAGS,
    SIZED_HEADER,
    Position,
    ProducerMark,
    producer_section,
)

# A producer's last sequence and when its last publish was written (unix nanoseconds).
Producers = dict[bytes, tuple[int, int]]

# The newest snapshots kept: the one a rebuild starts from, and the one before it.
KEPT = 2
# Bytes a snapshot job reads of a segment at a time.
_READ_SIZE = 4 * 1024 * 1024


class ProducerSnapshot(NamedTuple):
    """The producers of the records before `position`; `entry` is the index entry that ends
    there."""

    position: Position
    entry: IndexEntry
    producers: Producers


def read_snapshot(files: LogFiles, offset: int) -> ProducerSnapshot | None:
    """The snapshot at `offset`; None when it is missing or unreadable (it is only a
    shortcut: the log has everything it says)."""
    try:
        with open(files.producer_snapshot(offset), "rb") as file:
            document = json.loads(file.read())
        position = Position(document["offset"], document["count"])
        entry = tuple(int(value) for value in document["entry"])
        producers = {
            bytes.fromhex(key): (int(value[0]), int(value[1]))
            for key, value in document["producers"].items()
        }
    except (OSError, ValueError, KeyError, TypeError, IndexError):
        return None
    if position.offset != offset or len(entry) != 7:
        return None
    return ProducerSnapshot(position, entry, producers)


def write_snapshot(files: LogFiles, snapshot: ProducerSnapshot) -> None:
    """Write `snapshot` and remove all but the newest `KEPT`."""
    document = {
        "offset": snapshot.position.offset,
        "count": snapshot.position.count,
        "entry": list(snapshot.entry),
        "producers": {key.hex(): list(value) for key, value in snapshot.producers.items()},
    }
    write_atomically(
        files.producer_snapshot(snapshot.position.offset), json.dumps(document).encode()
    )
    remove_snapshots(files, files.producer_snapshot_offsets()[:-KEPT])


def remove_snapshots(files: LogFiles, offsets: Iterable[int]) -> None:
    for offset in offsets:
        try:
            os.unlink(files.producer_snapshot(offset))
        except FileNotFoundError:
            pass


def collect_marks(data: bytes | memoryview, found: list[tuple[ProducerMark, int]]) -> int:
    """Add the producer marks of the whole records at the start of `data`, with their
    records' timestamps, to `found`; how many bytes those records take."""
    at, length = 0, len(data)
    while at + BODY_START <= length:
        size, timestamp, attempts, _trace_id = SIZED_HEADER.unpack_from(data, at)
        if at + 4 + size > length:
            break
        if attempts & 0xF000 in PRODUCER_FLAGS:
            found.append((producer_section(data, at + BODY_START)[0], timestamp))
        at += 4 + size
    return at


def fold(producers: Producers, marks: Iterable[tuple[ProducerMark, int]]) -> None:
    """Add `marks` (oldest first) to `producers`."""
    for mark, timestamp_ns in marks:
        found = producers.get(mark.producer_id)
        if found is None:
            producers[mark.producer_id] = (mark.sequence, timestamp_ns)
        else:
            producers[mark.producer_id] = (
                max(found[0], mark.sequence),
                max(found[1], timestamp_ns),
            )


def seen_since(producers: Producers, since_ns: int) -> Producers:
    return {key: value for key, value in producers.items() if value[1] >= since_ns}


def file_marks(path: str, first: int, last: int) -> list[tuple[ProducerMark, int]]:
    """The producer marks of the records from byte `first` to byte `last` of a segment file
    (both record boundaries), read a few MiB at a time; OSError if the file went (retention)
    or ends early."""
    found: list[tuple[ProducerMark, int]] = []
    with open(path, "rb") as file:
        file.seek(first)
        remaining = last - first
        carried = b""
        while remaining > 0:
            chunk = file.read(min(_READ_SIZE, remaining))
            if not chunk:
                raise OSError(f"{path} ends {remaining} bytes early")
            remaining -= len(chunk)
            data = carried + chunk if carried else chunk
            carried = data[collect_marks(data, found) :]
    if carried:
        raise OSError(f"{path} ends inside a record")
    return found
