"""One task accepting V2 connections and serving every plain one that needs no waiting: its
reads, its commands, its replies and its messages (docs/design.md §2).

A connection with tasks of its own (a read loop, a message pump, their nursery and cancel
scope, trio's socket wrappers) costs more to start and to end than the few commands of a
client that connects, publishes or subscribes, and closes: that was most of what nsqd did for
such clients, and half of Go's rate (bench/RESULTS.md, "Connections a second"). Instead the
poller keeps the listener and the accepted sockets in an epoll set of its own
(level-triggered, each registered once) and waits on that one descriptor through trio: each
wakeup accepts what is waiting, reads every ready connection and runs its commands there and
then (`V2Connection.read_polled`). A second task sends the messages of the polled consumers
whose channel or RDY woke them (`PolledWakeup`), each with one write.

Whatever would wait goes to the connection's own tasks, for the rest of its life
(`V2Connection.promote`): an effect of the interpreter (a TLS or compression upgrade, AUTH, a
move or a forward under `--workers`, a publish's fsync, a cluster partition's channels), a
write the socket did not take whole, a fatal error's linger, a rate-limited channel's hold.
"""

import os
import select
import socket
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING

import trio

from nsqpy.daemon.log import pass_of
from nsqpy.daemon.net import format_address
from nsqpy.nsqd.wakeup import Wakeup

if TYPE_CHECKING:
    from nsqpy.nsqd.connection import V2Connection
    from nsqpy.nsqd.server import NSQD

_READABLE = select.EPOLLIN | select.EPOLLRDHUP
# Connections read per wakeup (the other tasks run between two), as the idle reads' poller.
_MAX_EVENTS = 32
# Connections accepted per wakeup: a burst of clients does not hold the reads of the others.
_ACCEPTS = 32
# After an accept error (out of descriptors), as Go's servers and `accept_forever` do.
ACCEPT_RETRY_SECONDS = 0.05


def polls_connections() -> bool:
    """epoll is Linux's; elsewhere every connection has tasks of its own."""
    return hasattr(select, "epoll")


def _serve(connection: "V2Connection", step: Callable[[], None]) -> None:
    """One step of a polled connection (its read, its pump's round): a bug there costs that
    connection alone."""
    try:
        step()
    except Exception:
        connection.failed()


class PolledWakeup:
    """A polled consumer's `Client.wakeup`: its channel, a RDY or a FIN may let messages out,
    so the poller's pump task sends them. A weak reference, not the connection: the client
    is the connection's, and a cycle would wait for the collector."""

    __slots__ = ("_is_set", "_connection", "_poller")

    def __init__(self, connection: "V2Connection", poller: "ConnectionPoller") -> None:
        self._is_set = False
        self._connection = weakref.ref(connection)
        self._poller = poller

    def set(self) -> None:
        if self._is_set:
            return
        self._is_set = True
        self._poller.due(self)

    def is_set(self) -> bool:
        return self._is_set

    def take(self) -> "V2Connection | None":
        """The pump task's turn: the connection (gone: None), the flag cleared."""
        self._is_set = False
        return self._connection()


class ConnectionPoller:
    def __init__(
        self, nsqd: "NSQD", listener: trio.socket.SocketType, nursery: trio.Nursery
    ) -> None:
        self._nsqd = nsqd
        self._nursery = nursery
        # A descriptor of the listening socket's own (trio's listener closes its own).
        self._listener = socket.socket(fileno=os.dup(listener.fileno()))
        self._listener.setblocking(False)
        if self._listener.family in (socket.AF_INET, socket.AF_INET6):
            # Accepted sockets inherit it: no setsockopt a connection.
            self._listener.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._epoll = select.epoll()
        self._connections: dict[int, V2Connection] = {}
        self._woken: list[PolledWakeup] = []
        self._pumps_wakeup = Wakeup()
        self._closed = False

    # -- the connections polled ---------------------------------------------------------------

    def watch(self, connection: "V2Connection", fd: int) -> None:
        self._connections[fd] = connection
        self._epoll.register(fd, _READABLE)

    def forget(self, fd: int) -> None:
        """The connection is no longer polled (it ended, or has tasks of its own now)."""
        if self._connections.pop(fd, None) is not None and not self._closed:
            self._epoll.unregister(fd)

    def due(self, wakeup: PolledWakeup) -> None:
        self._woken.append(wakeup)
        self._pumps_wakeup.set()

    def __len__(self) -> int:
        return len(self._connections)

    # -- the tasks ----------------------------------------------------------------------------

    async def run(self) -> None:
        """Accept and read until cancelled (nsqd stops accepting). The connections polled
        then are nsqd's to close (`NSQD._close_connections`)."""
        epoll = self._epoll
        connections = self._connections
        listener_fd = self._listener.fileno()
        epoll.register(listener_fd, select.EPOLLIN)
        log = self._nsqd.log
        events: list[tuple[int, int]] = []
        try:
            while True:
                if not events:
                    await trio.lowlevel.wait_readable(epoll.fileno())
                    events = epoll.poll(0, _MAX_EVENTS)
                with pass_of(log):
                    for fd, _events in events:
                        if fd == listener_fd:
                            self._accept(log)
                            continue
                        connection = connections.get(fd)
                        if connection is not None:
                            _serve(connection, connection.read_polled)
                        # Not kept while the poller waits: an ended connection goes at once.
                        del connection
                # A busy client's next bytes often come while the other tasks run: look
                # again after their turn, before a wait in trio (which re-arms the epoll).
                await trio.lowlevel.checkpoint()
                events = epoll.poll(0, _MAX_EVENTS)
        finally:
            self._closed = True
            epoll.close()
            self._listener.close()

    async def run_pumps(self) -> None:
        """Send the polled consumers' messages as their wakeups come, until cancelled."""
        while True:
            await self._pumps_wakeup.wait()
            woken, self._woken = self._woken, []
            for wakeup in woken:
                connection = wakeup.take()
                if connection is not None:
                    _serve(connection, connection.pump_polled)
                del connection

    def _accept(self, log) -> None:
        accept_connection = self._nsqd.accept_connection
        for _ in range(_ACCEPTS):
            try:
                # The descriptor alone: a socket object each was a tenth of what nsqd did for
                # a client that connects, publishes and closes (the connection makes one if
                # it ever needs it). `_accept` is the C call under `socket.accept`.
                fd, address = self._listener._accept()  # type: ignore[attr-defined]
            except (BlockingIOError, InterruptedError):
                return
            except OSError as error:
                log.error("TCP: accept error - %s", error)
                self._epoll.unregister(self._listener.fileno())
                self._nursery.start_soon(self._accept_again)
                return
            os.set_blocking(fd, False)
            connection = accept_connection(fd, format_address(address))
            if connection is None:
                continue
            # A client sends its first commands as it connects: they are often here already,
            # and read now they cost no wakeup of their own.
            _serve(connection, connection.read_polled)
            del connection

    async def _accept_again(self) -> None:
        await trio.sleep(ACCEPT_RETRY_SECONDS)
        if not self._closed:
            self._epoll.register(self._listener.fileno(), select.EPOLLIN)
