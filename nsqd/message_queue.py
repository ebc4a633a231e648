"""The storage seam: where a topic's backlog and a channel's messages wait to be delivered.

Topics and channels talk to their queue only through the `MessageQueue` protocol below, so a
second storage engine plugs in without touching the wire protocols, the HTTP API or the stats
(docs/design.md §12). The channel keeps what is in flight and deferred (`DeadlineQueue`); the
queue holds what waits, and is told when a delivered message is acknowledged or handed back.

`BufferedDiskQueue` is the engine of classic topics: Go's memory channel of `--mem-queue-size`
messages, then go-diskqueue for the overflow (a `DroppingQueue` for #ephemeral names), a
message deleted once it is read. Log topics (docs/design.md §13) keep every message in their
partition's log: the topic appends through `LogTopicQueue`, each channel reads through its
cursor (`nsqd/cursor_queue.py`).
"""

from collections import deque
from typing import TYPE_CHECKING, Protocol

from nsqpy.nsqd.backend import BackendWriteError, DroppingQueue
from nsqpy.nsqd.message import Message

if TYPE_CHECKING:
    from nsqpy.diskqueue import DiskQueue
    from nsqpy.nsqd.log_writer import LogWriter
    from nsqpy.nsqd.server import NSQD


class MessageQueue(Protocol):
    """What a topic or channel may ask of its storage."""

    @property
    def depth(self) -> int:
        """Messages waiting, memory and disk."""

    @property
    def backend_depth(self) -> int:
        """Of `depth`, the messages on disk (the stats' `backend_depth`)."""

    def has_messages(self) -> bool: ...

    def append(self, messages: list[Message], *, strict: bool = False) -> BackendWriteError | None:
        """New messages, all or nothing when `strict` (a publish not yet acknowledged: a failed
        write raises and keeps none). Otherwise (messages nsqd already holds) a failed write
        keeps them in memory, so none is lost, and returns the error."""

    def put_back(self, messages: list[Message], *, first: bool = False) -> None:
        """Delivered messages handed back (REQ, a timeout, a deferral that came due): after
        what waits, or before it when `first` (ordered delivery redelivers first)."""

    def take(self, max_count: int) -> list[Message]:
        """Up to `max_count` messages to deliver, oldest first."""

    def acknowledge(self, message: Message) -> None:
        """A delivered message was FINished: it is done for good."""

    def skip_to_end(self) -> None:
        """Drop what waits now (SUB_ADVANCED `special:-1` starts at the end)."""

    def seek(self, kind: str, value: int) -> None:
        """Deliver from a consume offset on (Youzan's `<type>:<value>`, docs/protocol.md
        §3.8); ValueError for one this queue cannot serve."""

    def empty(self) -> None:
        """Drop everything (Go's Empty), files included."""

    def flush(self, unacknowledged: list[Message]) -> int:
        """On a clean stop: keep what waits and `unacknowledged` (in flight and deferred) so a
        restart delivers them again. How many were kept."""

    def sync_targets(self) -> list["DiskQueue"]:
        """The files the periodic sync looks after."""

    def close(self) -> None: ...

    def delete(self) -> None:
        """The queue and its files go."""


class BufferedDiskQueue:
    """Memory while it has room (`--mem-queue-size`), then the diskqueue; Go's channel.put."""

    __slots__ = ("nsqd", "memory", "backend", "mem_queue_size", "_failure", "_failure_args")

    def __init__(
        self,
        nsqd: "NSQD",
        backend_name: str,
        *,
        ephemeral: bool,
        failure: str,
        failure_args: tuple,
    ) -> None:
        self.nsqd = nsqd
        self.memory: deque[Message] = deque()
        self.backend: DiskQueue | DroppingQueue = nsqd.open_backend(
            backend_name, ephemeral=ephemeral
        )
        self.mem_queue_size = nsqd.options.mem_queue_size
        # The error line a failed write logs, with its arguments (Go's texts differ by owner).
        self._failure = failure
        self._failure_args = failure_args

    @property
    def depth(self) -> int:
        return len(self.memory) + self.backend.depth

    @property
    def backend_depth(self) -> int:
        return self.backend.depth

    def has_messages(self) -> bool:
        return bool(self.memory) or self.backend.depth > 0

    def append(self, messages: list[Message], *, strict: bool = False) -> BackendWriteError | None:
        memory = self.memory
        room = self.mem_queue_size - len(memory)
        if room >= len(messages):
            memory.extend(messages)
            return None
        # The overflow first, so a failed write leaves nothing half-kept in memory.
        overflow = messages[room:] if room > 0 else messages
        try:
            self._write(overflow)
        except BackendWriteError as error:
            if strict:
                raise
            memory.extend(messages)
            return error
        if room > 0:
            memory.extend(messages[:room])
        return None

    def put_back(self, messages: list[Message], *, first: bool = False) -> None:
        if first:
            self.memory.extendleft(reversed(messages))
        else:
            self.append(messages)

    def take(self, max_count: int) -> list[Message]:
        memory = self.memory
        if len(memory) >= max_count:
            popleft = memory.popleft
            return [popleft() for _ in range(max_count)]
        taken = list(memory)
        memory.clear()
        if len(taken) < max_count and self.backend.depth:
            from_record = Message.from_record
            taken.extend(from_record(r) for r in self.backend.get_many(max_count - len(taken)))
        return taken

    def acknowledge(self, message: Message) -> None:
        """Nothing to do: a diskqueue forgets a message once it is read."""

    def skip_to_end(self) -> None:
        self.memory.clear()
        self.backend.empty()

    def seek(self, kind: str, value: int) -> None:
        """A diskqueue cannot go back: only `special:-1`, the end."""
        if (kind, value) != ("special", -1):
            raise ValueError(f"consume start {kind}:{value} is not supported yet (only special:-1)")
        self.skip_to_end()

    def empty(self) -> None:
        self.memory.clear()
        self.backend.empty()

    def flush(self, unacknowledged: list[Message]) -> int:
        messages = list(self.memory)
        messages.extend(unacknowledged)
        self.memory.clear()
        if not messages:
            return 0
        try:
            self._write(messages)
        except BackendWriteError:
            return 0  # logged; nowhere else to keep them on the way out
        return len(messages)

    def sync_targets(self) -> list["DiskQueue"]:
        return [] if isinstance(self.backend, DroppingQueue) else [self.backend]

    def close(self) -> None:
        self.backend.close()

    def delete(self) -> None:
        self.memory.clear()
        # Go's exit(deleted): Empty() removes the files, Delete() closes the queue.
        self.backend.empty()
        self.backend.delete()

    def _write(self, messages: list[Message]) -> None:
        """BackendWriteError (health NOK, logged) if the diskqueue write fails."""
        self.nsqd.write_to_backend(self.backend, messages, self._failure, *self._failure_args)


class LogTopicQueue:
    """A log topic's side of its partition log: a publish is appended and the channels, as
    cursors, read it; nothing waits in the topic itself (docs/design.md §13)."""

    def __init__(self, nsqd: "NSQD", writer: "LogWriter", topic: str) -> None:
        self.nsqd = nsqd
        self.writer = writer
        self.log = writer.log
        self.topic = topic

    depth = 0
    backend_depth = 0

    def has_messages(self) -> bool:
        return False

    def append(self, messages: list[Message], *, strict: bool = False) -> BackendWriteError | None:
        """Into the log's open group, written by nsqd's next commit (`nsqd/log_writer.py`)."""
        self.nsqd.append_to_log(self.writer, messages, self.topic)
        return None

    def put_back(self, messages: list[Message], *, first: bool = False) -> None:
        raise AssertionError("a log topic hands nothing out")

    def take(self, max_count: int) -> list[Message]:
        return []

    def acknowledge(self, message: Message) -> None:
        pass

    def skip_to_end(self) -> None:
        pass

    def seek(self, kind: str, value: int) -> None:
        pass

    def empty(self) -> None:
        """The log is kept; emptying a channel moves its cursor (CursorQueue.empty)."""

    def flush(self, unacknowledged: list[Message]) -> int:
        self.writer.flush()
        return 0

    def sync_targets(self) -> list:
        return [self.writer]

    def close(self) -> None:
        self.writer.close()

    def delete(self) -> None:
        self.writer.delete()
