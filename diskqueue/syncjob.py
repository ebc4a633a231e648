"""The slow half of a sync: fsync the data files and persist the metadata, off the event loop.

go-diskqueue's sync() fsyncs the current write file, then persists the metadata, inside its
ioLoop goroutine. nsqd here runs on trio and must not block its loop on fsync, so a sync is
split in two:

* on the loop, ``DiskQueue.prepare_sync()`` does the cheap part: it snapshots the metadata
  and dups the write file's descriptor, and returns a ``SyncJob``;
* the ``SyncJob`` is a plain callable that can run in a worker thread
  (``await trio.to_thread.run_sync(job)``) while the loop keeps calling put/get.

Jobs share a ``SyncState`` with their queue. Its lock serialises jobs, so fsyncs and
metadata writes of one queue never interleave. Files left behind by a roll wait in
``pending_fds`` and are fsynced by whichever job runs next, before it writes metadata that
points past them, which keeps go-diskqueue's order: data durable first, then the metadata
that covers it. Each job carries a sequence number, and a job only writes its snapshot if no
newer one was written, so a job that loses a race to a newer one cannot move the metadata
backwards. ``empty()`` and ``delete()`` raise ``written_seq`` to retire jobs that are still
in flight.

A data file the reader has finished is removed by a job too, once metadata written after the
reader left it is on disk (go-diskqueue removes it at once, before the next sync). A crash in
between then finds the file still there for the stale read position to point into, and the
unlink of a large file happens off the loop.
"""

import collections
import logging
import os
import threading

from nsqpy.diskqueue.metadata import write_metadata

logger = logging.getLogger("diskqueue")


class SyncState:
    """What a queue and its in-flight sync jobs share (one per queue)."""

    __slots__ = ("name", "metadata_path", "lock", "pending_fds", "pending_removals", "written_seq")

    def __init__(self, name: str, metadata_path: str) -> None:
        self.name = name
        self.metadata_path = metadata_path
        # Held by a job for its whole run, and by empty()/delete() to retire jobs.
        self.lock = threading.Lock()
        # Duplicated descriptors of rolled-over data files still to be fsynced. The loop
        # appends without the lock (deque.append is atomic), jobs pop while holding it.
        self.pending_fds: collections.deque[int] = collections.deque()
        # (seq, path) of data files the reader has finished: removable once metadata with a
        # sequence number above seq (a snapshot taken after the reader left) is written.
        self.pending_removals: collections.deque[tuple[int, str]] = collections.deque()
        # Sequence number of the newest metadata snapshot on disk.
        self.written_seq = 0

    def drop_pending(self) -> None:
        """Close pending descriptors without fsyncing them (their files are going away).

        Call with ``lock`` held.
        """
        while self.pending_fds:
            os.close(self.pending_fds.popleft())

    def remove_finished_files(self, up_to_seq: int) -> None:
        """Remove finished data files that metadata ``up_to_seq`` no longer points into.

        Call with ``lock`` held. Errors are logged as go-diskqueue's moveForward logs them.
        """
        removals = self.pending_removals
        while removals and removals[0][0] < up_to_seq:
            path = removals.popleft()[1]
            try:
                os.remove(path)
            except FileNotFoundError:
                pass
            except OSError as e:
                logger.error("DISKQUEUE(%s) failed to Remove(%s) - %s", self.name, path, e)


class SyncJob:
    """fsync the queue's data files, then write its metadata snapshot atomically.

    Call it once, from any thread. It returns True on success; on failure it logs the way
    go-diskqueue does (``DISKQUEUE(name) failed to sync - ...``), leaves the previous
    metadata in place and returns False. It never raises for I/O errors.
    """

    __slots__ = ("_state", "_fd", "_metadata", "_seq")

    def __init__(self, state: SyncState, fd: int | None, metadata: bytes, seq: int) -> None:
        self._state = state
        self._fd = fd
        self._metadata = metadata
        self._seq = seq

    def __call__(self) -> bool:
        state = self._state
        fd, self._fd = self._fd, None
        ok = True
        with state.lock:
            try:
                # Older files first: the metadata below may already point past them.
                while state.pending_fds:
                    ok = _fsync_and_close(state.pending_fds.popleft(), state.name) and ok
                if fd is not None:
                    own_fd, fd = fd, None
                    ok = _fsync_and_close(own_fd, state.name) and ok
                if ok and self._seq > state.written_seq:
                    write_metadata(state.metadata_path, self._metadata)
                    state.written_seq = self._seq
                    state.remove_finished_files(self._seq)
            except OSError as e:
                logger.error("DISKQUEUE(%s) failed to sync - %s", state.name, e)
                ok = False
            finally:
                if fd is not None:  # only if a pending descriptor's close raised
                    os.close(fd)
        return ok


def _fsync_and_close(fd: int, name: str) -> bool:
    """fsync then close ``fd``; False (logged) if the fsync failed. Always closes."""
    try:
        os.fsync(fd)
    except OSError as e:
        logger.error("DISKQUEUE(%s) failed to sync - %s", name, e)
        return False
    finally:
        os.close(fd)
    return True
