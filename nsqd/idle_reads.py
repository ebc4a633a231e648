"""Every idle plain V2 connection's reads, polled together (docs/design.md §2).

A connection's read loop waiting in trio's `receive_some` costs, for each thing the client
sends, an `epoll_ctl` to re-arm and a task switch to wake it. An idle consumer sends one
thing a second: the NOP answering its heartbeat, which changes nothing but the connection's
read deadline. With thousands of consumers that was most of what nsqd did (bench/RESULTS.md,
"Many connections").

Instead a waiting read loop hands its descriptor to this poller, which keeps every such
descriptor in an epoll set of its own (level-triggered, registered once per wait) and waits
on that one descriptor through trio. Each wakeup reads every ready connection; bytes that are
only NOPs are taken there and then (`absorb_nops`: the read deadline moves on, nothing else
happens), and the read loop is woken only with anything else: a command, the end of the
stream, an error. The HTTP poller (`nsqpy/daemon/http_poller.py`) does the same for HTTP.
"""

import errno
import os
import select
from typing import Protocol

import outcome
import trio

# The most a V2 connection's read takes at once (the read loop's, the poller's, a relay's).
RECEIVE_SIZE = 64 * 1024
_READABLE = select.EPOLLIN | select.EPOLLRDHUP
# Connections read per wakeup: the other tasks run between two, so a request waits for at most
# this many reads (128 took up to 14 ms of wall time on a busy machine, bench/RESULTS.md).
_MAX_EVENTS = 32


class IdleReader(Protocol):
    def absorb_nops(self, data: bytes) -> bool:
        """Take `data` if it is nothing but whole NOPs; False: the read loop must see it."""
        ...


def polls_idle_reads() -> bool:
    """epoll is Linux's; elsewhere every read loop waits in trio."""
    return hasattr(select, "epoll")


class IdleReads:
    def __init__(self) -> None:
        self._epoll = select.epoll()
        # fd -> (the connection, its waiting read loop's task)
        self._waiting: dict[int, tuple[IdleReader, trio.lowlevel.Task]] = {}

    async def receive(self, fd: int, reader: IdleReader) -> bytes:
        """What the client sent on `fd` next that is not only NOPs (b"" at its end). OSError
        as a read on the socket raises it."""
        task = trio.lowlevel.current_task()
        try:
            self._epoll.register(fd, _READABLE)
        except ValueError:
            # The poller ended (nsqd is stopping): the connection ends as on a failed read.
            raise OSError(errno.EBADF, "nsqd's idle reads have ended") from None
        self._waiting[fd] = (reader, task)

        def abort(_raise_cancel) -> trio.lowlevel.Abort:
            self._forget(fd)
            return trio.lowlevel.Abort.SUCCEEDED

        return await trio.lowlevel.wait_task_rescheduled(abort)

    def _forget(self, fd: int) -> None:
        if self._waiting.pop(fd, None) is not None:
            try:
                self._epoll.unregister(fd)
            except (OSError, ValueError):
                pass  # the descriptor closed already, or the poller ended (a shutdown)

    async def run(self) -> None:
        epoll = self._epoll
        waiting = self._waiting
        reschedule = trio.lowlevel.reschedule
        try:
            while True:
                # An epoll set with nothing in it is never readable: no wake-up while no
                # connection waits.
                await trio.lowlevel.wait_readable(epoll.fileno())
                for fd, _events in epoll.poll(0, _MAX_EVENTS):
                    entry = waiting.get(fd)
                    if entry is None:
                        continue
                    reader, task = entry
                    try:
                        data = os.read(fd, RECEIVE_SIZE)
                    except BlockingIOError:
                        continue
                    except OSError as error:
                        self._forget(fd)
                        reschedule(task, outcome.Error(error))
                        continue
                    if data and reader.absorb_nops(data):
                        continue
                    self._forget(fd)
                    reschedule(task, outcome.Value(data))
        finally:
            epoll.close()
