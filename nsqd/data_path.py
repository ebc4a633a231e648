"""The data directory: made ready, or refused, before nsqd accepts a single message.

Go nsqd persists its metadata once at start and exits when it cannot, so a data path it cannot
write never answers a publish it would lose at exit. nsqd checks the same before it listens,
and says in words what is wrong.
"""

import errno
import fcntl
import logging
import os
import random

from nsqpy import disk
from nsqpy.common.cluster_meta import same_disk_identity


class DataPathError(Exception):
    """The data path cannot hold nsqd's files; the message names the path and the reason."""


def prepare_data_path(path: str) -> None:
    """Create `path` if it is missing, then prove nsqd can create, write and remove a file in it.

    DataPathError when it is not a directory, cannot be created, or is not writable.
    """
    if os.path.exists(path) and not os.path.isdir(path):
        raise DataPathError(f"--data-path {path} is not a directory")
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as error:
        raise DataPathError(f"--data-path {path} cannot be created: {_reason(error)}") from None
    probe = os.path.join(path, f".nsqd-write-check.{os.getpid()}")
    try:
        descriptor = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.write(descriptor, b"nsqd")
        finally:
            os.close(descriptor)
        os.unlink(probe)
    except OSError as error:
        raise DataPathError(f"--data-path {path} is not writable: {_reason(error)}") from None


def _reason(error: OSError) -> str:
    """`Permission denied`, `Read-only file system`, `Not a directory`: the words, no errno."""
    if error.errno is not None and error.errno in errno.errorcode:
        return os.strerror(error.errno)
    return str(error)


# Where a data directory keeps its identity (nsqpy's; a Go nsqd ignores the file).
INCARNATION_FILE = "nsqd.incarnation"
# Written by a cluster node's clean stop once everything it wrote is fsynced, and removed as
# it starts: a start that does not find it follows a crash, a kill -9 or a power loss.
CLEAN_STOP_FILE = "nsqd.stopped"


def data_incarnation(
    path: str, *, starting: bool = False, log: logging.Logger | None = None
) -> str:
    """The data directory's incarnation (docs/design.md §14, "Incarnations"): its identity,
    made (at random) the first time it is asked for and kept in it, and the run it is in.
    A directory that lost it (a new disk, emptied, or the file unreadable) gets a new
    identity, and with it counts as holding none of the partitions' data it held before.

    `starting` (the node's process that starts, once): a start after a stop that was not
    clean (no `CLEAN_STOP_FILE`) is a new run of the same identity, `<identity>-<run>`.
    Such a stop may have cost the unsynced tail of every log (a power loss): the node holds
    what it held, less perhaps its last writes, and counts as proving nothing until it
    caught up and joined each ISR again; `log` is told when one begins. OSError when the
    file cannot be written.

    Read and made under a lock on the directory: the `--workers` of one node, starting side
    by side, all find the one incarnation their supervisor made."""
    directory = os.open(path, os.O_RDONLY)
    try:
        fcntl.flock(directory, fcntl.LOCK_EX)
        file = os.path.join(path, INCARNATION_FILE)
        incarnation = _read_incarnation(file)
        if incarnation is None:
            return _write_incarnation(file, os.urandom(16).hex())
        if starting:
            stopped = os.path.join(path, CLEAN_STOP_FILE)
            try:
                os.unlink(stopped)
            except FileNotFoundError:
                identity = same_disk_identity(incarnation)
                run = _write_incarnation(file, f"{identity}-{random.getrandbits(32):08x}")
                if log is not None:
                    log.warning(
                        "CLUSTER: the last stop was not clean (%s missing): this node is"
                        " incarnation %s now, and proves nothing it holds until it caught up",
                        CLEAN_STOP_FILE,
                        run,
                    )
                return run
            disk.current().fsync(directory)
        return incarnation
    finally:
        os.close(directory)


def mark_clean_stop(path: str) -> None:
    """Everything this node wrote is durable: its next start is not a new run. OSError when
    the mark cannot be written (the next start then takes the stop for a crash)."""
    disk.write_file(os.path.join(path, CLEAN_STOP_FILE), b"")
    directory = os.open(path, os.O_RDONLY)
    try:
        disk.current().fsync(directory)
    finally:
        os.close(directory)


def _read_incarnation(file: str) -> str | None:
    try:
        with open(file, "rb") as handle:
            text = handle.read().decode("ascii").strip()
    except (FileNotFoundError, UnicodeDecodeError):
        return None
    identity, _, run = text.partition("-")
    if _is_hex(identity, 32) and (not run or _is_hex(run, 8)):
        return text
    return None


def _is_hex(text: str, length: int) -> bool:
    return len(text) == length and all(char in "0123456789abcdef" for char in text)


def _write_incarnation(file: str, incarnation: str) -> str:
    temporary = f"{file}.tmp"
    disk.write_file(temporary, incarnation.encode() + b"\n")
    os.replace(temporary, file)
    return incarnation
