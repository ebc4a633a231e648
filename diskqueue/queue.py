"""DiskQueue: a FIFO of byte records on disk, byte-compatible with go-diskqueue.

The files are go-diskqueue's (see ``nsqpy.diskqueue.layout`` and ``nsqpy.diskqueue.metadata``)
and the rules for rolling, reading and bad files follow the newest go-diskqueue
(nsqio/go-diskqueue, diskqueue.go): a Go nsqd data directory opens here and ours opens in Go.

What differs is the shape. go-diskqueue is a goroutine behind channels; this is a plain
synchronous object for a single caller (nsqd's trio loop): no threads, no timers, no locks on
the hot path. The caller decides when to sync (``sync_due``, ``dirty``, ``sync_timeout``) and
where the fsync runs (``prepare_sync()`` returns a job for a worker thread; ``sync()`` runs
it inline). See ``nsqpy.diskqueue.syncjob``.

Costs on the hot path:

* ``put`` is one ``os.write`` of header + record, straight to the file like Go's writeOne,
  so a kill -9 loses nothing ``put`` accepted (fsync only matters for a machine crash).
  ``put_many`` frames a batch with one ``b"".join`` and one ``os.write`` per file it touches.
* ``get``/``get_many`` parse records out of a chunk read with one ``os.pread`` (up to
  ``READ_CHUNK_SIZE``), using ``struct.unpack_from``; a record costs one slice.
"""

import itertools
import logging
import os
import re
from collections.abc import Iterable
from types import TracebackType

from nsqpy.diskqueue.errors import MessageSizeError, QueueClosedError
from nsqpy.diskqueue.layout import (
    BAD_FILE_SUFFIX,
    MAX_RECORD_SIZE,
    RECORD_HEADER,
    RECORD_HEADER_SIZE,
    data_file_name,
    metadata_file_name,
)
from nsqpy.diskqueue.metadata import Metadata, read_metadata
from nsqpy.diskqueue.syncjob import SyncJob, SyncState

logger = logging.getLogger("diskqueue")

_pack_header = RECORD_HEADER.pack
_unpack_header = RECORD_HEADER.unpack_from

#: Bytes read from a data file at a time (about 5,000 nsqd messages of 200 bytes).
READ_CHUNK_SIZE = 1 << 20


class _CorruptRecord(Exception):
    """The record at the read position cannot be read; the text is Go's error for it."""


class DiskQueue:
    """A FIFO of byte records in ``data_path``, stored exactly as go-diskqueue stores them.

    ``name`` is the file name prefix (nsqd: the topic name, or ``"<topic>:<channel>"``).
    Records must be ``min_msg_size..max_msg_size`` bytes long; a data file is rolled before
    a record that would take it past ``max_bytes_per_file``. A sync is due after
    ``sync_every`` puts and gets, and on every roll, new read file or bad file; the caller
    should also sync when its ``sync_timeout`` timer fires and the queue is ``dirty``.
    With ``auto_sync=True`` the queue syncs inline (blocking) whenever one is due, which is
    go-diskqueue's behaviour minus the timer, for callers without an event loop.

    Not thread-safe: one caller at a time. Only a ``SyncJob`` may run elsewhere.
    """

    __slots__ = (
        "name",
        "data_path",
        "max_bytes_per_file",
        "min_msg_size",
        "max_msg_size",
        "sync_every",
        "sync_timeout",
        "auto_sync",
        "_depth",
        "_read_file_num",
        "_read_pos",
        "_write_file_num",
        "_write_pos",
        "_write_fd",
        "_read_fd",
        "_read_file_size",
        "_rbuf",
        "_rbuf_off",
        "_ops_left",
        "_seq",
        "_closed",
        "_metadata_path",
        "_sync_state",
    )

    def __init__(
        self,
        name: str,
        data_path: str | os.PathLike[str],
        max_bytes_per_file: int,
        min_msg_size: int,
        max_msg_size: int,
        sync_every: int,
        sync_timeout: float = 2.0,
        *,
        auto_sync: bool = False,
    ) -> None:
        if max_bytes_per_file <= 0:
            raise ValueError(f"max_bytes_per_file must be positive, not {max_bytes_per_file}")
        if not 0 <= min_msg_size <= max_msg_size <= MAX_RECORD_SIZE:
            raise ValueError(
                f"need 0 <= min_msg_size ({min_msg_size}) <= max_msg_size ({max_msg_size})"
                f" <= {MAX_RECORD_SIZE}"
            )
        self.name = name
        self.data_path = os.fspath(data_path)
        self.max_bytes_per_file = max_bytes_per_file
        self.min_msg_size = min_msg_size
        self.max_msg_size = max_msg_size
        # go-diskqueue syncs when its op counter reaches syncEvery; below 1 that is always.
        self.sync_every = max(1, sync_every)
        self.sync_timeout = sync_timeout
        self.auto_sync = auto_sync

        # The persisted state, go-diskqueue's five metadata fields. _read_pos is the
        # position of the next record not yet returned by get().
        self._depth = 0
        self._read_file_num = 0
        self._read_pos = 0
        self._write_file_num = 0
        self._write_pos = 0

        self._write_fd: int | None = None
        self._read_fd: int | None = None
        # Final size of the read file once it is complete (no longer the write file);
        # None while the reader is on the file being written.
        self._read_file_size: int | None = None
        # Bytes of the read file starting at _read_pos - _rbuf_off.
        self._rbuf = b""
        self._rbuf_off = 0
        # Puts and gets left until a sync is due; 0 or less means due. Events that make
        # go-diskqueue set needSync (roll, new read file, bad file) set it to 0.
        self._ops_left = self.sync_every
        self._seq = 0
        self._closed = False
        self._metadata_path = metadata_file_name(self.data_path, name)
        self._sync_state = SyncState(name, self._metadata_path)
        self._retrieve_metadata()

    # -- public API ---------------------------------------------------------------------

    @property
    def depth(self) -> int:
        """Records queued. Like go-diskqueue, it can over-count after a bad file was set
        aside (its unread records are unknown) until the reader reaches the tail, where it
        is reset to 0."""
        return self._depth

    @property
    def sync_due(self) -> bool:
        """True when go-diskqueue's ioLoop would sync now: ``sync_every`` puts and gets
        since the last sync, or a roll, a new read file or a bad file since then."""
        return self._ops_left <= 0

    @property
    def dirty(self) -> bool:
        """True when anything happened since the last sync. Go's ``sync_timeout`` ticker
        syncs only then: when the caller's timer fires, sync if ``dirty``."""
        return self._ops_left < self.sync_every

    def put(self, data: bytes) -> None:
        """Append one record. Raises MessageSizeError if its size is out of bounds, OSError
        if the write fails (nothing is then recorded), QueueClosedError after close."""
        size = len(data)
        if size < self.min_msg_size or size > self.max_msg_size:
            raise MessageSizeError(size, self.min_msg_size, self.max_msg_size)
        if self._closed:
            raise QueueClosedError(self.name)
        total = size + RECORD_HEADER_SIZE
        # go-diskqueue writeOne: roll *before* a write that would take a non-empty file past
        # max_bytes_per_file, so a record larger than that still gets a file of its own.
        if self._write_pos > 0 and self._write_pos + total > self.max_bytes_per_file:
            self._roll()
        fd = self._write_fd
        if fd is None:
            fd = self._open_write_file()
        buf = _pack_header(size) + data
        try:
            written = os.write(fd, buf)
            while written < total:
                written += os.write(fd, buf[written:])
        except OSError:
            self._abort_write()
            raise
        self._write_pos += total
        self._depth += 1
        self._ops_left -= 1
        if self._ops_left <= 0 and self.auto_sync:
            self.sync()

    def put_many(self, records: Iterable[bytes]) -> None:
        """Append a batch (nsqd's MPUB path). Every size is checked before anything is
        written, so a MessageSizeError leaves the queue untouched. The batch is framed with
        one join and written with one ``os.write`` per data file it lands in. If a write
        fails (OSError), the records of the files already written stay queued."""
        if not isinstance(records, list | tuple):
            records = list(records)
        lengths = list(map(len, records))
        if not lengths:
            return
        min_size, max_size = self.min_msg_size, self.max_msg_size
        if min(lengths) < min_size or max(lengths) > max_size:
            bad = next(n for n in lengths if n < min_size or n > max_size)
            raise MessageSizeError(bad, min_size, max_size)
        if self._closed:
            raise QueueClosedError(self.name)
        count = len(lengths)
        parts: list[bytes] = [b""] * (2 * count)
        parts[0::2] = map(_pack_header, lengths)
        parts[1::2] = records
        data = b"".join(parts)
        if self._write_pos + len(data) <= self.max_bytes_per_file:
            # The whole batch fits in the current file: no record can trigger a roll.
            self._write_bytes(data, count)
            if self._ops_left <= 0 and self.auto_sync:
                self.sync()
            return
        ends = list(itertools.accumulate(length + RECORD_HEADER_SIZE for length in lengths))
        self.put_framed(data, ends, 0, count, max(lengths))

    def get(self) -> bytes | None:
        """Remove and return the oldest record, or None when the queue is empty.

        Unreadable data never raises: a bad record or file is set aside as ``.bad`` and
        reading continues with the next file, as go-diskqueue's handleReadError does.
        """
        buf = self._rbuf
        off = self._rbuf_off
        start = off + RECORD_HEADER_SIZE
        if start <= len(buf):
            size = _unpack_header(buf, off)[0]
            end = start + size
            if end <= len(buf) and self.min_msg_size <= size <= self.max_msg_size:
                self._rbuf_off = end
                self._read_pos += end - off
                self._depth -= 1
                self._ops_left -= 1
                if end == len(buf):
                    self._chunk_consumed()
                if self._ops_left <= 0 and self.auto_sync:
                    self.sync()
                return buf[start:end]
        if self._closed:
            raise QueueClosedError(self.name)
        if not self._fill():
            return None
        # _fill left a complete, valid record at the front of the buffer.
        return self.get()

    def get_many(self, max_count: int) -> list[bytes]:
        """Remove and return up to ``max_count`` of the oldest records (fewer when the queue
        runs out; an empty list when it is empty). Bad data is handled as in ``get``."""
        if self._closed:
            raise QueueClosedError(self.name)
        records: list[bytes] = []
        append = records.append
        min_size, max_size = self.min_msg_size, self.max_msg_size
        remaining = max_count
        while remaining > 0:
            buf = self._rbuf
            first = off = self._rbuf_off
            buflen = len(buf)
            before = len(records)
            for _ in itertools.repeat(None, remaining):
                start = off + RECORD_HEADER_SIZE
                if start > buflen:
                    break
                size = _unpack_header(buf, off)[0]
                end = start + size
                if end > buflen or size < min_size or size > max_size:
                    break
                append(buf[start:end])
                off = end
            taken = len(records) - before
            if taken:
                self._rbuf_off = off
                self._read_pos += off - first
                self._depth -= taken
                self._ops_left -= taken
                remaining -= taken
                if off == buflen:
                    self._chunk_consumed()
                if not remaining:
                    break
            if not self._fill():
                break
        if self._ops_left <= 0 and self.auto_sync:
            self.sync()
        return records

    def prepare_sync(self) -> SyncJob:
        """The loop-side half of a sync: snapshot the metadata, dup the write file's
        descriptor, reset the sync counter, and return the job that fsyncs and writes the
        metadata. The job may run in a worker thread while this queue keeps being used::

            if dq.sync_due:
                await trio.to_thread.run_sync(dq.prepare_sync())

        Every put already reached the OS (``os.write``), so there is no buffer to flush.
        """
        if self._closed:
            raise QueueClosedError(self.name)
        fd = os.dup(self._write_fd) if self._write_fd is not None else None
        self._seq += 1
        self._ops_left = self.sync_every
        return SyncJob(self._sync_state, fd, self._metadata().encode(), self._seq)

    def sync(self) -> bool:
        """fsync and persist the metadata now, blocking. Returns False if that failed (the
        error is logged, as go-diskqueue logs it)."""
        return self.prepare_sync()()

    def empty(self) -> None:
        """Drop every queued record: go-diskqueue's Empty. The data files are deleted, the
        reader and writer move on to a fresh file number, depth becomes 0, and the metadata
        file is removed (the next sync writes it again). Waits for a sync job in progress,
        so it cannot write stale metadata afterwards. Raises OSError (after resetting) if a
        file could not be removed."""
        if self._closed:
            raise QueueClosedError(self.name)
        logger.info("DISKQUEUE(%s): emptying", self.name)
        self._retire_sync_jobs()
        error = self._skip_to_next_rw_file()
        try:
            os.remove(self._metadata_path)
        except FileNotFoundError:
            pass
        except OSError as e:
            logger.error("DISKQUEUE(%s) failed to remove metadata file - %s", self.name, e)
            error = error or e
        self._ops_left = self.sync_every
        if error is not None:
            raise error

    def delete(self) -> None:
        """Close without persisting anything: go-diskqueue's Delete. Unread data files and
        the metadata stay on disk (files already read are removed, as Go would have removed
        them); nsqd deletes a topic or channel with ``empty()`` then ``delete()``, as Go's
        does."""
        if self._closed:
            return
        logger.info("DISKQUEUE(%s): deleting", self.name)
        self._retire_sync_jobs()
        self._shut()

    def close(self) -> None:
        """Sync (fsync data and write metadata) and close: go-diskqueue's Close, which
        only persists the metadata; we fsync the data too. Blocking; a second call is a
        no-op."""
        if self._closed:
            return
        logger.info("DISKQUEUE(%s): closing", self.name)
        try:
            self.sync()
        finally:
            with self._sync_state.lock:
                self._sync_state.drop_pending()
            self._shut()

    def __enter__(self) -> "DiskQueue":
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # -- writing --------------------------------------------------------------------------

    def put_framed(self, data: bytes, ends: list[int], start: int, stop: int, largest: int) -> None:
        """Append records `start` to `stop` of `data`, records already framed (`[4 size]
        [record]` each, record i ending at `ends[i]`, none larger than `largest`): the
        records of a batch many queues take, framed once for all of them. Written as
        `put_many` writes them (it frames its records and comes here when they roll), one
        ``os.write`` per data file they land in."""
        if stop <= start:
            return
        if largest > self.max_msg_size:
            raise MessageSizeError(largest, self.min_msg_size, self.max_msg_size)
        if self._closed:
            raise QueueClosedError(self.name)
        begin = ends[start - 1] if start else 0
        view = memoryview(data)
        pos = self._write_pos
        max_bytes = self.max_bytes_per_file
        if pos + ends[stop - 1] - begin <= max_bytes:
            self._write_bytes(view[begin : ends[stop - 1]], stop - start)
        else:
            # writeOne's roll rule record by record (`put_many` comes here too).
            first = start
            for index in range(start, stop):
                previous = ends[index - 1] if index else 0
                total = ends[index] - previous
                if pos > 0 and pos + total > max_bytes:
                    if index > first:
                        self._write_bytes(view[begin:previous], index - first)
                    self._roll()
                    pos = 0
                    first, begin = index, previous
                pos += total
            self._write_bytes(view[begin : ends[stop - 1]], stop - first)
        if self._ops_left <= 0 and self.auto_sync:
            self.sync()

    def _write_bytes(self, buf: bytes | memoryview, count: int) -> None:
        """`count` framed records, all bound for the current write file, in one write."""
        nbytes = len(buf)
        fd = self._write_fd
        if fd is None:
            fd = self._open_write_file()
        try:
            written = os.write(fd, buf)
            while written < nbytes:
                written += os.write(fd, buf[written:])
        except OSError:
            self._abort_write()
            raise
        self._write_pos += nbytes
        self._depth += count
        self._ops_left -= count

    def _open_write_file(self) -> int:
        # go-diskqueue writeOne: O_RDWR|O_CREATE, 0600, then seek to writePos.
        path = self._data_file_name(self._write_file_num)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        if self._write_pos > 0:
            try:
                os.lseek(fd, self._write_pos, os.SEEK_SET)
            except OSError:
                os.close(fd)
                raise
        logger.info("DISKQUEUE(%s): writeOne() opened %s", self.name, path)
        self._write_fd = fd
        return fd

    def _abort_write(self) -> None:
        """After a failed write, cut off any partial record and close the file; the next
        write reopens it at _write_pos (go-diskqueue closes and reopens the same way)."""
        fd, self._write_fd = self._write_fd, None
        if fd is None:
            return
        try:
            os.ftruncate(fd, self._write_pos)
        except OSError:
            pass
        os.close(fd)

    def _roll(self) -> None:
        """Start the next data file (go-diskqueue writeOne's roll).

        The finished file's descriptor waits in the sync state for the next SyncJob to
        fsync it (Go syncs on every roll; here the roll makes a sync due).
        """
        finished_size = self._write_pos
        if self._write_fd is not None:
            self._sync_state.pending_fds.append(self._write_fd)
            self._write_fd = None
        reader_on_it = self._read_file_num == self._write_file_num
        if reader_on_it:
            # Go sets maxBytesPerFileRead = writePos here: the file's size is now final.
            self._read_file_size = finished_size
        self._write_file_num += 1
        self._write_pos = 0
        self._ops_left = 0
        if reader_on_it and self._read_pos >= finished_size:
            # The reader already has everything from the finished file. go-diskqueue would
            # try one more read from it, hit EOF and rename it .bad (go-diskqueue issue
            # #42). We move the reader on now, as moveForward would, so the metadata this
            # roll's sync writes has it on the new file and a Go nsqd reopening the
            # directory does not hit #42 either.
            self._advance_read_file()

    # -- reading --------------------------------------------------------------------------

    def _fill(self) -> bool:
        """Load the read buffer so that it starts with one complete, valid record at the
        read position. Returns False when there is nothing left to read. Bad files are set
        aside on the way (go-diskqueue's readOne + handleReadError)."""
        while True:
            if self._read_file_num == self._write_file_num and self._read_pos >= self._write_pos:
                self._check_tail_corruption()
                return False
            fd = self._read_fd
            if fd is None:
                fd = self._open_read_file()
                if fd is None:
                    continue
            pos = self._read_pos
            if self._read_file_size is not None:
                available = self._read_file_size - pos
            else:
                available = self._write_pos - pos
            if available <= 0:
                # A complete file read to its end (e.g. metadata written by a Go nsqd in the
                # go-diskqueue #42 state): move on as moveForward would.
                self._advance_read_file()
                continue
            try:
                chunk = self._read_chunk(fd, pos, available)
            except (OSError, _CorruptRecord) as e:
                self._handle_read_error(str(e))
                continue
            self._rbuf = chunk
            self._rbuf_off = 0
            return True

    def _read_chunk(self, fd: int, pos: int, available: int) -> bytes:
        """Up to READ_CHUNK_SIZE bytes at ``pos``, starting with a whole valid record.

        The checks are go-diskqueue readOne's: a length outside min..max means the file is
        corrupt ("we have no reasonable guarantee on where a new message should begin"),
        and a length prefix or record cut short by the end of the file is an EOF error.
        """
        chunk = os.pread(fd, min(available, READ_CHUNK_SIZE), pos)
        if len(chunk) < RECORD_HEADER_SIZE:
            raise _CorruptRecord("unexpected EOF" if chunk else "EOF")
        size = _unpack_header(chunk, 0)[0]
        if size < self.min_msg_size or size > self.max_msg_size:
            raise _CorruptRecord(f"invalid message read size ({size})")
        need = RECORD_HEADER_SIZE + size
        if need > len(chunk):
            if need > available:
                raise _CorruptRecord("unexpected EOF")
            chunk = os.pread(fd, need, pos)
            if len(chunk) < need:
                raise _CorruptRecord("unexpected EOF")
        return chunk

    def _open_read_file(self) -> int | None:
        path = self._data_file_name(self._read_file_num)
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError as e:
            self._handle_read_error(str(e))
            return None
        logger.info("DISKQUEUE(%s): readOne() opened %s", self.name, path)
        if self._read_file_num < self._write_file_num:
            # go-diskqueue: a "complete" file ends at its size, since the size it was
            # rolled at is not recorded anywhere (maxBytesPerFileRead).
            try:
                self._read_file_size = os.fstat(fd).st_size
            except OSError:
                self._read_file_size = self.max_bytes_per_file
        self._read_fd = fd
        return fd

    def _chunk_consumed(self) -> None:
        """The read buffer is used up: free it, and do go-diskqueue moveForward's checks
        (finished a complete file? reached the tail?)."""
        self._rbuf = b""
        self._rbuf_off = 0
        if self._read_file_num != self._write_file_num:
            if self._read_file_size is not None and self._read_pos >= self._read_file_size:
                self._advance_read_file()
        elif self._read_pos >= self._write_pos:
            self._check_tail_corruption()

    def _close_read_file(self) -> None:
        fd, self._read_fd = self._read_fd, None
        if fd is not None:
            os.close(fd)
        self._rbuf = b""
        self._rbuf_off = 0
        self._read_file_size = None

    def _advance_read_file(self) -> None:
        """go-diskqueue moveForward onto a new file: sync soon, and remove the finished file
        once that sync has written metadata that no longer points into it (SyncJob)."""
        finished = self._read_file_num
        self._close_read_file()
        self._read_file_num = finished + 1
        self._read_pos = 0
        # "sync every time we start reading from a new file"
        self._ops_left = 0
        self._sync_state.pending_removals.append((self._seq, self._data_file_name(finished)))
        self._check_tail_corruption()

    def _handle_read_error(self, reason: str) -> None:
        """go-diskqueue handleReadError: rename the unreadable file to ``.bad`` and jump to
        the next one. Its unread records are lost and depth stays too high until the reader
        reaches the tail (checkTailCorruption resets it there)."""
        bad_path = self._data_file_name(self._read_file_num)
        logger.error(
            "DISKQUEUE(%s) reading at %d of %s - %s", self.name, self._read_pos, bad_path, reason
        )
        self._close_read_file()
        if self._read_file_num == self._write_file_num:
            # "if you can't properly read from the current write file it's safe to assume
            # that something is fucked and we should skip the current file too"
            self._close_write_file()
            self._write_file_num += 1
            self._write_pos = 0
        renamed = bad_path + BAD_FILE_SUFFIX
        logger.warning(
            "DISKQUEUE(%s) jump to next file and saving bad file as %s", self.name, renamed
        )
        try:
            os.rename(bad_path, renamed)
        except OSError:
            logger.error(
                "DISKQUEUE(%s) failed to rename bad diskqueue file %s to %s",
                self.name,
                bad_path,
                renamed,
            )
        self._read_file_num += 1
        self._read_pos = 0
        # "significant state change, schedule a sync on the next iteration"
        self._ops_left = 0
        self._check_tail_corruption()

    def _check_tail_corruption(self) -> None:
        """go-diskqueue checkTailCorruption: once the reader reaches the writer, depth must
        be 0 and the positions equal; if not, log it and reset.

        Unlike Go's check (``readFileNum < writeFileNum || readPos < writePos``), a reader
        on a *later* file than the writer counts as past the tail whatever the positions,
        so corrupt metadata cannot send the reader chasing files that will never exist.
        """
        if self._read_file_num < self._write_file_num or (
            self._read_file_num == self._write_file_num and self._read_pos < self._write_pos
        ):
            return
        if self._depth != 0:
            if self._depth < 0:
                logger.error(
                    "DISKQUEUE(%s) negative depth at tail (%d), metadata corruption, "
                    "resetting 0...",
                    self.name,
                    self._depth,
                )
            else:
                logger.error(
                    "DISKQUEUE(%s) positive depth at tail (%d), data loss, resetting 0...",
                    self.name,
                    self._depth,
                )
            self._depth = 0
            self._ops_left = 0
        if self._read_file_num != self._write_file_num or self._read_pos != self._write_pos:
            if self._read_file_num > self._write_file_num:
                logger.error(
                    "DISKQUEUE(%s) readFileNum > writeFileNum (%d > %d), corruption, "
                    "skipping to next writeFileNum and resetting 0...",
                    self.name,
                    self._read_file_num,
                    self._write_file_num,
                )
            if self._read_pos > self._write_pos:
                logger.error(
                    "DISKQUEUE(%s) readPos > writePos (%d > %d), corruption, "
                    "skipping to next writeFileNum and resetting 0...",
                    self.name,
                    self._read_pos,
                    self._write_pos,
                )
            self._skip_to_next_rw_file()
            self._ops_left = 0

    # -- state, files, metadata -------------------------------------------------------------

    def _skip_to_next_rw_file(self) -> OSError | None:
        """go-diskqueue skipToNextRWFile: delete every data file from the read file to the
        write file and start both at the next file number, empty. Returns the last removal
        error, if any (logged already)."""
        self._close_read_file()
        self._close_write_file()
        error = None
        for file_num in range(self._read_file_num, self._write_file_num + 1):
            try:
                os.remove(self._data_file_name(file_num))
            except FileNotFoundError:
                pass
            except OSError as e:
                logger.error("DISKQUEUE(%s) failed to remove data file - %s", self.name, e)
                error = e
        self._write_file_num += 1
        self._write_pos = 0
        self._read_file_num = self._write_file_num
        self._read_pos = 0
        self._depth = 0
        return error

    def _close_write_file(self) -> None:
        fd, self._write_fd = self._write_fd, None
        if fd is not None:
            os.close(fd)

    def _retire_sync_jobs(self) -> None:
        """Make sure no sync job still in flight writes metadata after this point. Takes
        the jobs' lock, so it waits for one that is running."""
        state = self._sync_state
        with state.lock:
            state.written_seq = max(state.written_seq, self._seq)
            state.drop_pending()
            state.remove_finished_files(state.written_seq + 1)

    def _shut(self) -> None:
        self._closed = True
        self._close_read_file()
        self._close_write_file()

    def _metadata(self) -> Metadata:
        return Metadata(
            self._depth,
            self._read_file_num,
            self._read_pos,
            self._write_file_num,
            self._write_pos,
        )

    def _data_file_name(self, file_num: int) -> str:
        return data_file_name(self.data_path, self.name, file_num)

    def _retrieve_metadata(self) -> None:
        """go-diskqueue retrieveMetaData, plus the checks that make a crash recoverable."""
        try:
            metadata = read_metadata(self._metadata_path)
        except (OSError, ValueError) as e:
            logger.error("DISKQUEUE(%s) failed to retrieveMetaData - %s", self.name, e)
            metadata = None
        if metadata is not None:
            self._depth = metadata.depth
            self._read_file_num = metadata.read_file_num
            self._read_pos = metadata.read_pos
            self._write_file_num = metadata.write_file_num
            self._write_pos = metadata.write_pos
        else:
            self._adopt_unlisted_files()
        self._check_write_file()
        self._check_tail_corruption()

    def _adopt_unlisted_files(self) -> None:
        """Without metadata, start from the data files that are there.

        go-diskqueue starts at file 0, position 0, and would write over whatever file 0
        holds. But a queue killed before its first sync, or after ``empty()`` (which removes
        the metadata and moves to a new file number) and before the next one, has records
        on disk and no metadata; every put reached the file, so read them all instead.
        """
        pattern = re.compile(re.escape(self.name) + r"\.diskqueue\.(\d+)\.dat")
        try:
            names = os.listdir(self.data_path)
        except OSError:
            return
        file_nums = sorted(int(m.group(1)) for m in map(pattern.fullmatch, names) if m)
        if not file_nums:
            return
        logger.warning(
            "DISKQUEUE(%s) no metadata, reading data files %06d to %06d from the start",
            self.name,
            file_nums[0],
            file_nums[-1],
        )
        self._read_file_num = file_nums[0]
        self._write_file_num = file_nums[-1]
        # The last file's records are counted by _check_write_file as it skips past it.
        self._depth = sum(self._count_records(self._data_file_name(n), 0) for n in file_nums[:-1])

    def _check_write_file(self) -> None:
        """Never append where the metadata and the data files disagree.

        go-diskqueue: "if the metadata was not sync'd at the last shutdown of nsqd then the
        actual file size might actually be larger than the writePos, in which case the
        safest thing to do is skip to the next file for writes, and let the reader salvage
        what it can". Here a roll does not sync at once (the caller runs the sync job), so
        a crash can also leave whole files past writeFileNum: we skip past those too. The
        records to salvage are counted into depth (Go leaves them out, so its depth goes
        negative at the tail). A file shorter than writePos, or missing, is skipped as well,
        where Go would seek past its end and leave a hole.
        """
        while True:
            path = self._data_file_name(self._write_file_num)
            try:
                size: int | None = os.stat(path).st_size
            except OSError:
                size = None
            if size is not None and self._write_pos < size:
                logger.warning(
                    "DISKQUEUE(%s) %s metadata writePos %d < file size of %d, skipping to new file",
                    self.name,
                    path,
                    self._write_pos,
                    size,
                )
                self._depth += self._count_records(path, self._write_pos)
            elif self._write_pos > 0 and (size is None or size < self._write_pos):
                logger.warning(
                    "DISKQUEUE(%s) %s metadata writePos %d > file size of %s, skipping to new file",
                    self.name,
                    path,
                    self._write_pos,
                    "(missing)" if size is None else size,
                )
            elif os.path.exists(self._data_file_name(self._write_file_num + 1)):
                logger.warning(
                    "DISKQUEUE(%s) data file after %s found, skipping to new file",
                    self.name,
                    path,
                )
            else:
                return
            self._write_file_num += 1
            self._write_pos = 0

    def _count_records(self, path: str, start: int) -> int:
        """Whole, valid records from ``start`` to the end of ``path``, stopping at the first
        bad one (the reader will set the file aside there)."""
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError:
            return 0
        count = 0
        pos = start
        try:
            while True:
                chunk = os.pread(fd, READ_CHUNK_SIZE, pos)
                off = 0
                size = 0
                while off + RECORD_HEADER_SIZE <= len(chunk):
                    size = _unpack_header(chunk, off)[0]
                    if size < self.min_msg_size or size > self.max_msg_size:
                        return count
                    end = off + RECORD_HEADER_SIZE + size
                    if end > len(chunk):
                        break
                    count += 1
                    off = end
                if len(chunk) < READ_CHUNK_SIZE:
                    return count
                if off == 0:
                    # One record larger than a chunk: just check that all of it is there.
                    need = RECORD_HEADER_SIZE + size
                    if len(os.pread(fd, need, pos)) < need:
                        return count
                    count += 1
                    off = need
                pos += off
        except OSError:
            return count
        finally:
            os.close(fd)
