"""A log topic partition's delay queue (docs/design.md §13, Youzan's delayed queue).

A delayed message is a record in the partition's log: a `DPUB` as it is published, and a REQ
moved to the end (`Channel.requeue`) as a copy of the message written through the partition's
writer, carrying its channel and due time. Both are replicated and durable as every publish
is. A channel's cursor reads past such records (`CursorQueue`); this queue is the index that
finds them again when they come due: per channel, each delayed message's ID, the offset and
count of its record, and its due time, in an sqlite3 file beside the log
(`<topic>-<p>.delayed.sqlite`). Memory stays bounded however many are delayed: the bodies
are in the log, the index on disk.

The index is written as records are (`add`, for the group just written) and committed at
each sync with the log offset it covers (`applied`); after a crash, the records written
after that offset are indexed again from the log as each channel opens
(`LogTopicQueue.open_channel_queue`). A delayed message that goes
out is marked (its due time moved past `OUT`), so that it is not given out twice; a FIN
removes it (`done`); a restart gives out again what was out and not finished.
"""

import sqlite3
import time
from collections.abc import Callable, Iterable, Sequence
from typing import NamedTuple

# Added to a due time while the message is out (in flight, or waiting to be delivered again).
OUT = 1 << 52
# The index is committed at a sync once the log grew this much past it, changed or not, so
# that a recovery reads little of the log again.
RECOVERY_BYTES = 1 << 20

_SCHEMA = """
CREATE TABLE IF NOT EXISTS delayed (
    channel TEXT NOT NULL,
    id INTEGER NOT NULL,
    offset INTEGER NOT NULL,
    count INTEGER NOT NULL,
    due INTEGER NOT NULL,
    PRIMARY KEY (channel, id)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS delayed_due ON delayed (channel, due);
CREATE TABLE IF NOT EXISTS applied (offset INTEGER NOT NULL);
"""


class DelayedRecord(NamedTuple):
    """A delayed record written to the log: its channel ("" for a DPUB, every channel's), the
    message's ID (16 hex digits), the record's offset and count, and its due time in unix
    milliseconds."""

    channel: str
    message_id: bytes
    offset: int
    # Shadows tuple.count(), as `Position.count` does.
    count: int  # type: ignore[assignment]
    due_ms: int


class DueMessage(NamedTuple):
    """A delayed message come due: where its record is."""

    message_id: bytes
    offset: int
    count: int  # type: ignore[assignment]


class DelayQueue:
    """The index of one partition's delayed messages, by channel and due time."""

    def __init__(self, path: str) -> None:
        self.path = path
        # Autocommit off by hand: one transaction stays open between commits (`commit`).
        self._db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        self._db.execute("PRAGMA journal_mode=WAL")
        # The log is the truth: after a crash what the index lost is indexed again from it
        # (`LogTopicQueue`).
        self._db.execute("PRAGMA synchronous=OFF")
        self._db.executescript(_SCHEMA)
        if self._db.execute("SELECT count(*) FROM applied").fetchone()[0] == 0:
            self._db.execute("INSERT INTO applied VALUES (0)")
        # Nothing is out after a start: what was out and not finished goes out again.
        self._db.execute("UPDATE delayed SET due = due - ? WHERE due >= ?", (OUT, OUT))
        self._db.execute("BEGIN")
        self._changed = False
        # Per channel, how many are delayed (kept here: `/stats` asks often).
        self._counts: dict[str, int] = {}
        self._recount()
        self.closed = False
        # The log offset the committed index covers.
        self.applied: int = self._db.execute("SELECT offset FROM applied").fetchone()[0]

    def add(self, records: Iterable[DelayedRecord], channels: Callable[[], Sequence[str]]) -> None:
        """Index delayed records just written: a DPUB for each of `channels()` (the channels
        that keep their delays here now), a copy for its own channel. A record of a message
        indexed already replaces its entry (a message delayed again)."""
        by_channel: dict[str, list[tuple]] = {}
        for record in records:
            names = channels() if record.channel == "" else (record.channel,)
            row = (_id(record.message_id), record.offset, record.count, record.due_ms)
            for name in names:
                by_channel.setdefault(name, []).append(row)
        db = self._db
        for name, rows in by_channel.items():
            inserted = db.executemany(
                "INSERT OR IGNORE INTO delayed VALUES (?, ?, ?, ?, ?)",
                [(name, *row) for row in rows],
            ).rowcount
            if inserted < len(rows):
                db.executemany(
                    "UPDATE delayed SET offset = ?, count = ?, due = ?"
                    " WHERE channel = ? AND id = ?",
                    [
                        (offset, count, due, name, message_id)
                        for message_id, offset, count, due in rows
                    ],
                )
            self._counts[name] = self._counts.get(name, 0) + inserted
            self._changed = True

    def _recount(self) -> None:
        self._counts = dict(
            self._db.execute("SELECT channel, count(*) FROM delayed GROUP BY channel").fetchall()
        )

    def count(self, channel: str) -> int:
        return self._counts.get(channel, 0)

    def take_due(self, channel: str, limit: int, now_ms: int | None = None) -> list[DueMessage]:
        """Up to `limit` of the channel's delayed messages due now, earliest first, marked out."""
        if not self._counts.get(channel):
            return []
        if now_ms is None:
            now_ms = int(time.time() * 1000)
        rows = self._db.execute(
            "SELECT id, offset, count FROM delayed WHERE channel = ? AND due <= ?"
            " ORDER BY due LIMIT ?",
            (channel, now_ms, limit),
        ).fetchall()
        if not rows:
            return []
        self._db.executemany(
            "UPDATE delayed SET due = due + ? WHERE channel = ? AND id = ?",
            [(OUT, channel, row[0]) for row in rows],
        )
        self._changed = True
        return [
            DueMessage(b"%016x" % message_id, offset, count) for message_id, offset, count in rows
        ]

    def done(self, channel: str, message_id: bytes) -> bool:
        """A delayed message was finished: it leaves the queue. False if it was not in it."""
        cursor = self._db.execute(
            "DELETE FROM delayed WHERE channel = ? AND id = ?", (channel, _id(message_id))
        )
        if cursor.rowcount:
            self._changed = True
            self._counts[channel] -= 1
            return True
        return False

    def empty(self, channel: str, below: int | None = None) -> int:
        """Drop the channel's delayed messages (`/channel/emptydelayed`): every one, or those
        whose records are before the log offset `below` (a follower doing what its leader
        did, without the messages delayed since); how many."""
        if below is None:
            cursor = self._db.execute("DELETE FROM delayed WHERE channel = ?", (channel,))
            self._counts.pop(channel, None)
        else:
            cursor = self._db.execute(
                "DELETE FROM delayed WHERE channel = ? AND offset < ?", (channel, below)
            )
            self._counts[channel] = self._counts.get(channel, 0) - cursor.rowcount
        self._changed = True
        return cursor.rowcount

    def requeue(self, channel: str, now_ms: int | None = None) -> int:
        """The channel's waiting delayed messages are due now (`/channel/requeuedelayed`);
        how many."""
        if now_ms is None:
            now_ms = int(time.time() * 1000)
        cursor = self._db.execute(
            "UPDATE delayed SET due = ? WHERE channel = ? AND due > ? AND due < ?",
            (now_ms, channel, now_ms, OUT),
        )
        if cursor.rowcount:
            self._changed = True
        return cursor.rowcount

    def oldest_offset(self) -> int | None:
        """The lowest record offset any channel's delayed message is at (retention's floor)."""
        return self._db.execute("SELECT min(offset) FROM delayed").fetchone()[0]

    def waiting_before(self, offset: int, limit: int) -> list[DelayedRecord]:
        """Delayed messages waiting (not out) whose records are before `offset`: those
        retention would remove (`LogTopicQueue.clean` writes them again at the end)."""
        rows = self._db.execute(
            "SELECT channel, id, offset, count, due FROM delayed WHERE offset < ? AND due < ?"
            " ORDER BY offset LIMIT ?",
            (offset, OUT, limit),
        ).fetchall()
        return [
            DelayedRecord(channel, b"%016x" % message_id, at, count, due)
            for channel, message_id, at, count, due in rows
        ]

    def due_to_commit(self, log_end: int) -> bool:
        """Whether the index changed, or the log grew past what a recovery should read again."""
        return self._changed or log_end - self.applied > RECOVERY_BYTES

    def commit(self, log_end: int) -> None:
        """Make the index durable (nsqd's sync), with the log offset it covers (the log's end:
        every record before it was indexed as it was written): what a crash loses after it
        is indexed again from the log (`LogTopicQueue`)."""
        if self.closed:
            return
        self.applied = log_end
        self._db.execute("UPDATE applied SET offset = ?", (self.applied,))
        self._db.execute("COMMIT")
        self._db.execute("BEGIN")
        self._changed = False

    def cut_back(self, offset: int) -> None:
        """The log was cut back to `offset`: entries of records past it go."""
        self._db.execute("DELETE FROM delayed WHERE offset >= ?", (offset,))
        self._recount()
        self.commit(min(self.applied, max(offset, 0)))

    def close(self, log_end: int) -> None:
        if self.closed:
            return
        # What is out now goes out again after the restart.
        self._db.execute("UPDATE delayed SET due = due - ? WHERE due >= ?", (OUT, OUT))
        self.commit(log_end)
        self._db.execute("COMMIT")
        self._db.close()
        self.closed = True

    def delete(self) -> None:
        if not self.closed:
            self._db.execute("ROLLBACK")
            self._db.close()
            self.closed = True


def _id(message_id: bytes) -> int:
    return int(message_id, 16)
