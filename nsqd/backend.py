"""Where a topic's or channel's overflow goes: a diskqueue, or nowhere for #ephemeral ones."""

import os
from collections.abc import Iterable

from nsqpy.common.message import MESSAGE_HEADER_SIZE
from nsqpy.diskqueue import DiskQueue
from nsqpy.diskqueue.layout import data_file_name
from nsqpy.nsqd.options import Options


class BackendWriteError(Exception):
    """A diskqueue write failed (a full disk, an I/O error). `str()` is Go's error text, as
    `writeOne` returns it: `write <file>: no space left on device`."""


def write_error(backend, error: OSError, path: str | None = None) -> BackendWriteError:
    """The OSError of a failed write, worded as Go's *os.PathError; `path` is the file being
    written when the backend is not a diskqueue (a partition log's segment)."""
    reason = error.strerror or str(error)
    reason = reason[:1].lower() + reason[1:]
    if error.filename is not None:
        return BackendWriteError(f"open {os.fsdecode(error.filename)}: {reason}")
    if path is not None:
        return BackendWriteError(f"write {path}: {reason}")
    file_num = getattr(backend, "_write_file_num", None)
    data_path = getattr(backend, "data_path", None)
    if file_num is None or data_path is None:
        return BackendWriteError(f"write {backend.name}: {reason}")
    return BackendWriteError(f"write {data_file_name(data_path, backend.name, file_num)}: {reason}")


class DroppingQueue:
    """Go's dummyBackendQueue: an #ephemeral topic or channel drops what memory can't hold."""

    depth = 0
    sync_due = False
    dirty = False

    def put(self, data: bytes) -> None:
        pass

    def put_many(self, records: Iterable[bytes]) -> None:
        pass

    def put_framed(self, data: bytes, ends: list[int], start: int, stop: int, largest: int) -> None:
        pass

    def get_many(self, max_count: int) -> list[bytes]:
        return []

    def empty(self) -> None:
        pass

    def close(self) -> None:
        pass

    def delete(self) -> None:
        pass


def open_backend(name: str, options: Options, *, ephemeral: bool) -> DiskQueue | DroppingQueue:
    """Go nsqd's diskqueue settings: records hold at least a message header and at most
    `--max-msg-size` of body after it."""
    if ephemeral:
        return DroppingQueue()
    return DiskQueue(
        name,
        options.effective_data_path(),
        max_bytes_per_file=options.max_bytes_per_file,
        min_msg_size=MESSAGE_HEADER_SIZE,
        max_msg_size=options.max_msg_size + MESSAGE_HEADER_SIZE,
        sync_every=options.sync_every,
        sync_timeout=options.sync_timeout,
    )
