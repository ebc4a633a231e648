"""The data directory: made ready, or refused, before nsqd accepts a single message.

Go nsqd persists its metadata once at start and exits when it cannot, so a data path it cannot
write never answers a publish it would lose at exit. nsqd checks the same before it listens,
and says in words what is wrong.
"""

import errno
import fcntl
import os


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


def data_incarnation(path: str) -> str:
    """The data directory's identity, made (at random) the first time it is asked for and kept
    in it: a cluster node's incarnation (docs/design.md §14). A directory that lost it (a new
    disk, emptied, or the file unreadable) gets a new one, and with it counts as holding
    none of the partitions' data it held before. OSError when it cannot be written.

    Read and made under a lock on the directory: the `--workers` of one node, starting side
    by side, all find the one identity."""
    directory = os.open(path, os.O_RDONLY)
    try:
        fcntl.flock(directory, fcntl.LOCK_EX)
        return _read_or_make_incarnation(os.path.join(path, INCARNATION_FILE))
    finally:
        os.close(directory)


def _read_or_make_incarnation(file: str) -> str:
    try:
        with open(file, "rb") as handle:
            text = handle.read().decode("ascii").strip()
        if len(text) == 32 and all(char in "0123456789abcdef" for char in text):
            return text
    except (FileNotFoundError, UnicodeDecodeError):
        pass
    incarnation = os.urandom(16).hex()
    temporary = f"{file}.tmp"
    with open(temporary, "wb") as handle:
        handle.write(incarnation.encode() + b"\n")
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(temporary, file)
    return incarnation
