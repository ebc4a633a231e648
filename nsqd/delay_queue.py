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

A disk that refuses the index's writes (full) stops no one: what it would not store (or what
SQLite rolled back) is kept in memory and still comes when due, `applied` stays where it was,
and once the disk takes writes again the log is indexed again from there (`on_behind`).
"""

import logging
import sqlite3
import time
from collections.abc import Callable, Iterable, Sequence
from typing import NamedTuple

# A follower remembers at most this many finished delayed messages it has not indexed yet.
FINISHED_UNSEEN_KEPT = 100_000
# Added to a due time while the message is out (in flight, or waiting to be delivered again).
OUT = 1 << 52
# The index is committed at a sync once the log grew this much past it, changed or not, so
# that a recovery reads little of the log again.
RECOVERY_BYTES = 1 << 20
REFUSAL_LOG_INTERVAL = 60.0

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

    def __init__(
        self, path: str, log: "logging.Logger | logging.LoggerAdapter | None" = None
    ) -> None:
        self.path = path
        self.log = log or logging.getLogger("nsqd")
        # A write the disk refused (full): the index missed delayed records (an `add`, or the
        # uncommitted work SQLite rolled back), so `commit` keeps `applied` where it is until
        # the owner indexes the log again from there (`LogTopicQueue.sync_dirty`); and the
        # finishes still to remove. The log is the truth: nothing delayed is lost.
        self.behind = False
        # Called (with `behind` cleared) before a commit once the index is behind: the owner
        # indexes the log again from `applied` (`LogTopicQueue`).
        self.on_behind: Callable[[], None] | None = None
        # The messages out now, by channel and ID, as the OUT marks say: a rolled-back mark is
        # not given out twice.
        self._out: set[tuple[str, int]] = set()
        # Entries the disk would not take (channel, ID -> offset, count, due), kept here
        # until a commit stores them, so that they still come when due.
        self._unstored: dict[tuple[str, int], tuple[int, int, int]] = {}
        # Entries added since the last commit: kept here if SQLite rolls them back.
        self._uncommitted: dict[tuple[str, int], tuple[int, int, int]] = {}
        # How many `add`s the disk refused (a move whose copy was not indexed stays in memory).
        self.refused_adds = 0
        # Entries to remove at the next commit: the disk refused their DELETE, or SQLite
        # rolled it back with the transaction. Never given out meanwhile.
        self._done_pending: set[tuple[str, int]] = set()
        # Channel -> below (None: all) for `/channel/emptydelayed`s SQLite rolled back.
        self._empties_pending: dict[str, int | None] = {}
        # What was removed since the last commit, to remove again should SQLite roll it back.
        self._removed: set[tuple[str, int]] = set()
        self._emptied: dict[str, int | None] = {}
        # A follower's: delayed messages its leader finished before their records were indexed
        # here (a catch-up copies them later), never to be indexed (`forget`). Bounded.
        self._finished_unseen: dict[tuple[str, int], None] = {}
        # When a refusal was last logged (one line a minute while the disk stays full).
        self._refusal_logged = -REFUSAL_LOG_INTERVAL
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

    def add(
        self,
        records: Iterable[DelayedRecord],
        channels: Callable[[], Sequence[str]],
        *,
        again: bool = False,
    ) -> None:
        """Index delayed records just written: a DPUB for each of `channels()` (the channels
        that keep their delays here now), a copy for its own channel. A record of a message
        indexed already replaces its entry (a message delayed again, no longer out), unless
        the log's records are indexed `again` (what is out stays out)."""
        by_channel: dict[str, list[tuple]] = {}
        unseen = self._finished_unseen
        for record in records:
            names = channels() if record.channel == "" else (record.channel,)
            row = (_id(record.message_id), record.offset, record.count, record.due_ms)
            for name in names:
                if unseen and unseen.pop((name, row[0]), 0) is None:
                    continue  # finished by the leader already
                by_channel.setdefault(name, []).append(row)
        db = self._db
        try:
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
                uncommitted = self._uncommitted
                for message_id, offset, count, due in rows:
                    uncommitted[(name, message_id)] = (offset, count, due)
                if self._out and not again:
                    self._out.difference_update((name, row[0]) for row in rows)
                if self._unstored:
                    for row in rows:
                        self._unstored.pop((name, row[0]), None)
        except sqlite3.Error as error:
            self.behind = True
            self.refused_adds += 1
            for name, rows in by_channel.items():
                for message_id, offset, count, due in rows:
                    self._unstored[(name, message_id)] = (offset, count, due)
            self._refused("index delayed messages", error)

    def _recount(self) -> None:
        db = self._db
        counts = dict(db.execute("SELECT channel, count(*) FROM delayed GROUP BY channel"))
        for channel, below in self._empties_pending.items():
            if below is None:
                counts.pop(channel, None)
            elif channel in counts:
                counts[channel] = db.execute(
                    "SELECT count(*) FROM delayed WHERE channel = ? AND offset >= ?",
                    (channel, below),
                ).fetchone()[0]
        for key in self._done_pending:
            row = db.execute(
                "SELECT offset FROM delayed WHERE channel = ? AND id = ?", key
            ).fetchone()
            if row is not None and not self._emptied_pending(key[0], row[0]):
                counts[key[0]] -= 1
        self._counts = counts

    def _emptied_pending(self, channel: str, offset: int) -> bool:
        """Whether an emptying SQLite rolled back covers the channel's entry at `offset`."""
        if channel not in self._empties_pending:
            return False
        below = self._empties_pending[channel]
        return below is None or offset < below

    def count(self, channel: str) -> int:
        unstored = (
            sum(1 for name, _id in self._unstored if name == channel) if self._unstored else 0
        )
        return self._counts.get(channel, 0) + unstored

    def take_due(self, channel: str, limit: int, now_ms: int | None = None) -> list[DueMessage]:
        """Up to `limit` of the channel's delayed messages due now, earliest first, marked out."""
        if now_ms is None:
            now_ms = int(time.time() * 1000)
        if self._unstored:
            due = self._take_unstored(channel, limit, now_ms)
            if due:
                return due
        if not self._counts.get(channel):
            return []
        out = self._out
        skipped = out | self._done_pending if self._done_pending else out
        try:
            rows = self._db.execute(
                "SELECT id, offset, count FROM delayed WHERE channel = ? AND due <= ?"
                " ORDER BY due LIMIT ?",
                (channel, now_ms, limit + len(skipped)),
            ).fetchall()
            if skipped:
                rows = [row for row in rows if (channel, row[0]) not in skipped]
            if channel in self._empties_pending:
                rows = [row for row in rows if not self._emptied_pending(channel, row[1])]
            rows = rows[:limit]
            if not rows:
                return []
            self._db.executemany(
                "UPDATE delayed SET due = due + ? WHERE channel = ? AND id = ?",
                [(OUT, channel, row[0]) for row in rows],
            )
        except sqlite3.Error as error:
            self._refused("mark due delayed messages", error)
            return []  # released at a later scan
        out.update((channel, row[0]) for row in rows)
        self._changed = True
        return [
            DueMessage(b"%016x" % message_id, offset, count) for message_id, offset, count in rows
        ]

    def _take_unstored(self, channel: str, limit: int, now_ms: int) -> list[DueMessage]:
        out = self._out
        pending = self._done_pending
        due = sorted(
            (entry[2], key[1], entry[0], entry[1])
            for key, entry in self._unstored.items()
            if key[0] == channel and entry[2] <= now_ms and key not in out and key not in pending
        )[:limit]
        out.update((channel, message_id) for _due, message_id, _offset, _count in due)
        return [
            DueMessage(b"%016x" % message_id, offset, count)
            for _due, message_id, offset, count in due
        ]

    def find(self, channel: str, message_id: int) -> tuple[int, int, int] | None:
        """Where a channel's delayed message's record is and when it is due (unix ms):
        `(offset, count, due)`, or None when the channel has no such delayed message."""
        key = (channel, message_id)
        if key in self._done_pending:
            return None
        entry = self._unstored.get(key)
        if entry is not None:
            return entry
        row = self._db.execute(
            "SELECT offset, count, due FROM delayed WHERE channel = ? AND id = ?", key
        ).fetchone()
        if row is None:
            return None
        offset, count, due = row
        return offset, count, due - OUT if due >= OUT else due

    def done(self, channel: str, message_id: bytes) -> bool:
        """A delayed message was finished: it leaves the queue. False if it was not in it."""
        key = (channel, _id(message_id))
        self._out.discard(key)
        self._uncommitted.pop(key, None)
        if self._unstored.pop(key, None) is not None:
            self._done_pending.add(key)
            return True
        try:
            cursor = self._db.execute("DELETE FROM delayed WHERE channel = ? AND id = ?", key)
        except sqlite3.Error as error:
            self._refused("remove a finished delayed message", error)
            if key in self._done_pending:
                return False
            self._done_pending.add(key)  # removed at the next commit
            self._counts[channel] = self._counts.get(channel, 0) - 1
            return True
        if cursor.rowcount:
            self._changed = True
            self._removed.add(key)
            self._counts[channel] -= 1
            return True
        return False

    def forget(self, channel: str, message_id: bytes) -> None:
        """A follower hears its leader finished a delayed message: it leaves the queue, or,
        when its record is not indexed here yet (a catch-up copies it later), it never
        enters."""
        if self.done(channel, message_id):
            return
        unseen = self._finished_unseen
        unseen[(channel, _id(message_id))] = None
        if len(unseen) > FINISHED_UNSEEN_KEPT:
            del unseen[next(iter(unseen))]

    def empty(self, channel: str, below: int | None = None) -> int:
        """Drop the channel's delayed messages (`/channel/emptydelayed`): every one, or those
        whose records are before the log offset `below` (a follower doing what its leader
        did, without the messages delayed since); how many."""
        try:
            cursor = self._delete_channel(channel, below)
        except sqlite3.Error as error:
            self._refused("empty a channel's delayed messages", error)
            return 0
        _merge_emptying(self._emptied, channel, below)
        if below is None:
            self._counts.pop(channel, None)
        else:
            self._counts[channel] = self._counts.get(channel, 0) - cursor.rowcount
        self._changed = True
        return cursor.rowcount

    def _delete_channel(self, channel: str, below: int | None) -> sqlite3.Cursor:
        if below is None:
            return self._db.execute("DELETE FROM delayed WHERE channel = ?", (channel,))
        return self._db.execute(
            "DELETE FROM delayed WHERE channel = ? AND offset < ?", (channel, below)
        )

    def requeue(self, channel: str, now_ms: int | None = None) -> int:
        """The channel's waiting delayed messages are due now (`/channel/requeuedelayed`);
        how many."""
        if now_ms is None:
            now_ms = int(time.time() * 1000)
        try:
            cursor = self._db.execute(
                "UPDATE delayed SET due = ? WHERE channel = ? AND due > ? AND due < ?",
                (now_ms, channel, now_ms, OUT),
            )
        except sqlite3.Error as error:
            self._refused("requeue a channel's delayed messages", error)
            return 0
        if cursor.rowcount:
            self._changed = True
        return cursor.rowcount

    def entries_before(self, offset: int) -> dict[str, list[int]]:
        """Per channel, the IDs of the delayed messages whose records are before `offset`:
        what a leader admitting a follower holds, so that the follower drops what was
        finished or emptied here while it was not in the ISR (`keep_only`)."""
        held: dict[str, list[int]] = {}
        for channel, message_id in self._db.execute(
            "SELECT channel, id FROM delayed WHERE offset < ?", (offset,)
        ):
            if (channel, message_id) not in self._done_pending:
                held.setdefault(channel, []).append(message_id)
        for (channel, message_id), entry in self._unstored.items():
            if entry[0] < offset and (channel, message_id) not in self._done_pending:
                held.setdefault(channel, []).append(message_id)
        return held

    def keep_only(self, held: dict[str, set[int]], before: int) -> int:
        """Of the entries whose records are before `before`, drop those `held` lacks (its
        leader's, `entries_before`): a follower's catch-up indexes every delayed record it
        copies, finished or not. How many were dropped."""
        if self.closed:
            return 0
        rows = self._db.execute(
            "SELECT channel, id FROM delayed WHERE offset < ?", (before,)
        ).fetchall()
        gone = [(channel, message_id) for channel, message_id in rows
                if message_id not in held.get(channel, ())]  # fmt: skip
        gone.extend(
            key
            for key, entry in self._unstored.items()
            if entry[0] < before and key[1] not in held.get(key[0], ())
        )
        for key in gone:
            self._out.discard(key)
            self._unstored.pop(key, None)
            self._uncommitted.pop(key, None)
        try:
            self._db.executemany("DELETE FROM delayed WHERE channel = ? AND id = ?", gone)
        except sqlite3.Error as error:
            self._refused("drop delayed messages its leader finished", error)
            self._done_pending.update(gone)  # removed at the next commit
        else:
            self._removed.update(gone)
        self._recount()
        self._changed = True
        return len(gone)

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
        return (
            self._changed
            or bool(self._done_pending)
            or bool(self._empties_pending)
            or self.behind
            or log_end - self.applied > RECOVERY_BYTES
        )

    def commit(self, log_end: int) -> None:
        """Make the index durable (nsqd's sync), with the log offset it covers (the log's end:
        every record before it was indexed as it was written): what a crash loses after it
        is indexed again from the log (`LogTopicQueue`)."""
        if self.closed:
            return
        if self.behind and self.on_behind is not None:
            self.behind = False
            self.on_behind()
        try:
            if self._done_pending:
                self._db.executemany(
                    "DELETE FROM delayed WHERE channel = ? AND id = ?", sorted(self._done_pending)
                )
            for channel, below in self._empties_pending.items():
                self._delete_channel(channel, below)
            applied = self.applied if self.behind else log_end
            self._db.execute("UPDATE applied SET offset = ?", (applied,))
            self._db.execute("COMMIT")
        except sqlite3.Error as error:
            self._refused("commit the delay queue's index", error)
            return
        self._db.execute("BEGIN")
        self.applied = applied
        self._removed.clear()
        self._emptied.clear()
        if self._done_pending or self._empties_pending:
            self._done_pending.clear()
            self._empties_pending.clear()
            self._recount()
        self._uncommitted.clear()
        self._changed = False
        if not self.behind:
            # Stored now: indexed again from the log before this commit.
            self._unstored.clear()

    def _refused(self, what: str, error: sqlite3.Error) -> None:
        """The disk refused a write (full): an ERROR line, one a minute at most. If SQLite
        rolled back the open transaction, what it held since the last commit is gone: the
        index is behind the log, and a new transaction starts."""
        now = time.monotonic()
        if now - self._refusal_logged >= REFUSAL_LOG_INTERVAL:
            self._refusal_logged = now
            self.log.error("delay queue %s: failed to %s - %s", self.path, what, error)
        if not self._db.in_transaction:
            self.behind = True
            self._unstored.update(self._uncommitted)
            self._uncommitted.clear()
            # What was removed since the last commit is back: removed again at the next one.
            self._done_pending.update(self._removed)
            self._removed.clear()
            for channel, below in self._emptied.items():
                _merge_emptying(self._empties_pending, channel, below)
            self._emptied.clear()
            self._db.execute("BEGIN")
            self._recount()

    def cut_back(self, offset: int) -> None:
        """The log was cut back to `offset`: entries of records past it go."""
        try:
            self._db.execute("DELETE FROM delayed WHERE offset >= ?", (offset,))
        except sqlite3.Error as error:
            self._refused("drop entries past a cut", error)
            self.behind = True
        self._recount()
        self.applied = min(self.applied, max(offset, 0))
        self.commit(self.applied)

    def close(self, log_end: int) -> None:
        if self.closed:
            return
        # What is out now goes out again after the restart (a start does the same, should
        # this write be refused).
        try:
            self._db.execute("UPDATE delayed SET due = due - ? WHERE due >= ?", (OUT, OUT))
        except sqlite3.Error as error:
            self._refused("close", error)
        self.commit(log_end)
        try:
            self._db.execute("COMMIT")
        except sqlite3.Error as error:
            self._refused("close", error)
        self._db.close()
        self.closed = True

    def delete(self) -> None:
        if not self.closed:
            self._db.execute("ROLLBACK")
            self._db.close()
            self.closed = True


def _id(message_id: bytes) -> int:
    return int(message_id, 16)


def _merge_emptying(emptyings: dict[str, int | None], channel: str, below: int | None) -> None:
    """Add an emptying of the channel (below an offset, or all of it: None) to `emptyings`."""
    current = emptyings.get(channel, below)
    emptyings[channel] = None if below is None or current is None else max(below, current)
