"""What nsqd's storage does to the disk that a crash or a full disk can change: the writes of
queue, log and journal data (`write`) and the fsyncs that make them durable (`fsync`).

In production that is the operating system (`SYSTEM`). The cluster simulator gives each node
a disk of its own (`nsqpy/simulated_disk.py`) that knows what each file held at its last
fsync, so that a machine's crash can take back what was written and not synced, and that can
fill. A node asks `current()` for it, as it asks `network.current()` for its network: the
simulator starts each node in a context naming its disk, and every task and worker-thread job
the node starts inherits it.

Reads, opens, renames and truncations stay `os`'s: the simulator keeps a directory entry as
durable the moment it is made.
"""

import contextlib
import contextvars
import os
from collections.abc import Iterator
from typing import Protocol


class Disk(Protocol):
    def write(self, fd: int, data: bytes | memoryview) -> int:
        """`os.write`: how many bytes went to the file; OSError (ENOSPC, EIO) for none."""

    def fsync(self, fd: int) -> None:
        """`os.fsync`: what was written to the file survives a machine's crash."""


class _System:
    """The operating system's disk (`os`'s functions looked up at each call, so that a test
    that fails `os.write` fails it here too)."""

    def write(self, fd: int, data: bytes | memoryview) -> int:
        return os.write(fd, data)

    def fsync(self, fd: int) -> None:
        os.fsync(fd)


SYSTEM: Disk = _System()

_current: contextvars.ContextVar[Disk] = contextvars.ContextVar("nsqpy.disk", default=SYSTEM)


def current() -> Disk:
    """The disk of the daemon this task belongs to."""
    return _current.get()


@contextlib.contextmanager
def using(disk: Disk) -> Iterator[None]:
    """Code run inside (and every task it starts) writes through `disk`."""
    token = _current.set(disk)
    try:
        yield
    finally:
        _current.reset(token)


def write_all(fd: int, data: bytes | memoryview) -> None:
    """Write all of `data` to `fd` through the current disk."""
    disk = current()
    view = memoryview(data)
    while view:
        view = view[disk.write(fd, view) :]


def write_file(path: str, data: bytes, *, sync: bool = True, mode: int = 0o666) -> None:
    """Write `data` to a new file at `path` (or over it), fsynced when `sync`, through the
    current disk."""
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        write_all(descriptor, data)
        if sync:
            current().fsync(descriptor)
    finally:
        os.close(descriptor)
