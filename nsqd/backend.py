"""Where a topic's or channel's overflow goes: a diskqueue, or nowhere for #ephemeral ones."""

from collections.abc import Iterable

from common.message import MESSAGE_HEADER_SIZE
from diskqueue import DiskQueue
from nsqd.options import Options


class DroppingQueue:
    """Go's dummyBackendQueue: an #ephemeral topic or channel drops what memory can't hold."""

    depth = 0
    sync_due = False
    dirty = False

    def put(self, data: bytes) -> None:
        pass

    def put_many(self, records: Iterable[bytes]) -> None:
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
