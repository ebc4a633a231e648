"""One task serving every plain keep-alive HTTP connection, a batch of requests per wakeup.

A task per connection costs trio a wakeup, an epoll re-arm and a reschedule for every request,
which is most of what a `POST /pub` costs beyond the publish itself. The poller keeps the
connections' descriptors in an epoll set of its own, level-triggered, and waits on that one
descriptor through trio: each wakeup reads every ready connection, answers every request that
completed, and writes each connection's answers with one write (bench/RESULTS.md, "HTTP
poller").

Routes that may wait (their handlers are coroutine functions: a call out over the network, a
lock) are answered off the poller: the connection leaves the epoll set, a task answers its
requests and writes, and the connection comes back. A client that does not read its answers
is handled the same way (the task waits until it can write).

HTTPS connections are served the same way once their handshake is done (by a task of their
own): the poller reads the socket and has the connection's `TLSStream` decrypt what came and
encrypt the answers, which it writes as it writes a plain connection's (`ConnectionState.tls`).

Within a pass, a publish that overflows to a diskqueue has its write put off (the router's
`write_pass`): each diskqueue gets one write for all of the pass's publishes when the pass
ends, and the answers that wait for it are sent after it (a failed write's as a 500).

Group commit: an inline answer that says a write is durable (`after_commit`, a publish) is
not sent at once. Every such connection of a pass leaves the epoll set, one task runs the
router's commit once for all of them (one fsync per written queue, whatever the number of
requests), then sends their answers and gives them back; an answer whose write the commit
failed to make (its response's `write_group`) becomes a 500. The poller goes on serving the
others meanwhile: a `/ping` never waits for a disk.
"""

import os
import select
import socket

import trio

from nsqpy.daemon.http_server import (
    RECEIVE_SIZE,
    ConnectionState,
    Mover,
    RequestRouter,
    _send_all_fd,
)
from nsqpy.daemon.tls_stream import TLSStream

# How long a connection the server closes may still send (and have it dropped): Go's
# rstAvoidanceDelay.
LINGER_SECONDS = 0.5
# ... and how much of it we read and drop meanwhile, so a client streaming without end is not
# read without end.
LINGER_MAX_BYTES = 256 * 1024
# Level-triggered: a connection with unread bytes is reported again on the next wait.
_READABLE = select.EPOLLIN | select.EPOLLRDHUP
_MAX_EVENTS = 256


def polls_plain_sockets() -> bool:
    """epoll is Linux's; elsewhere every connection keeps a task of its own."""
    return hasattr(select, "epoll")


class HTTPPoller:
    """Serves the connections handed to it by `add` until cancelled, then closes them."""

    def __init__(
        self,
        router: RequestRouter,
        nursery: trio.Nursery,
        max_body_size: int,
        on_error,
        mover: Mover | None = None,
    ) -> None:
        self._router = router
        self._nursery = nursery
        self._max_body_size = max_body_size
        self._on_error = on_error
        self._mover = mover
        self._epoll = select.epoll()
        self._connections: dict[int, tuple[trio.socket.SocketType, ConnectionState]] = {}

    def add(self, stream: trio.SocketStream, remote: str) -> None:
        sock = stream.socket
        state = ConnectionState(self._router, self._max_body_size, remote, self._on_error)
        self._watch(sock, state)

    def add_tls(
        self, stream: trio.SocketStream, tls: TLSStream, remote: str, common_name: str | None
    ) -> None:
        """An HTTPS connection whose handshake is done: served like a plain one, through
        `tls`. What came with the handshake is answered by a task first."""
        state = ConnectionState(self._router, self._max_body_size, remote, self._on_error)
        state.common_name = common_name
        state.tls = tls
        sock = stream.socket
        buffered, ended = tls.decrypt_now(None)
        if ended and not buffered:
            sock.close()
            return
        if buffered:
            final = state.feed(buffered)
            requests = state.take_requests()
            self._nursery.start_soon(
                self._answer_off_poller, sock, state, [], requests, final, ended
            )
            return
        self._watch(sock, state)

    def adopt(self, sock: socket.socket, remote: str, pending: bytes) -> None:
        """A connection another server handed over with what it had received and not
        answered (`pending`): answered by a task, then served as any other."""
        adopted = trio.socket.from_stdlib_socket(sock)
        state = ConnectionState(self._router, self._max_body_size, remote, self._on_error)
        final = state.feed(pending)
        requests = state.take_requests()
        self._nursery.start_soon(
            self._answer_off_poller, adopted, state, [], requests, final, False
        )

    def _watch(self, sock, state: ConnectionState) -> None:
        fd = sock.fileno()
        self._connections[fd] = (sock, state)
        self._epoll.register(fd, _READABLE)

    def _unwatch(self, fd: int):
        self._epoll.unregister(fd)
        return self._connections.pop(fd)

    def _close(self, fd: int) -> None:
        sock, _state = self._unwatch(fd)
        sock.close()

    async def run(self) -> None:
        epoll = self._epoll
        connections = self._connections
        try:
            while True:
                await trio.lowlevel.wait_readable(epoll.fileno())
                committing: list[tuple] = []
                held: list[tuple] = []
                with self._router.write_pass():
                    for fd, _flags in epoll.poll(0, _MAX_EVENTS):
                        entry = connections.get(fd)
                        if entry is None:
                            continue
                        try:
                            self._serve_ready(fd, entry[1], committing, held)
                        except Exception as error:
                            # A bug answering one connection must not end the others'.
                            self._on_error(error)
                            if fd in connections:
                                self._close(fd)
                if held:
                    self._answer_held(held, committing)
                if committing:
                    self._nursery.start_soon(self._commit_then_answer, committing)
        finally:
            for sock, _state in connections.values():
                sock.close()
            connections.clear()
            epoll.close()

    def _serve_ready(
        self, fd: int, state: ConnectionState, committing: list[tuple], held: list[tuple]
    ) -> None:
        """Read what `fd` has, answer the requests it completes, write the answers; or, when
        an answer waits for the commit, move the connection to `committing`, and when it waits
        for writes made at the end of the pass, keep its answers in `held`."""
        try:
            data = os.read(fd, RECEIVE_SIZE)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        tls = state.tls
        if tls is not None:
            # What came decrypted: nothing yet while a record is incomplete. A connection
            # that ended is reported readable again, and closed then, once its last
            # requests are answered.
            try:
                data, ended = tls.decrypt_now(data)
            except trio.BrokenResourceError:
                data, ended = b"", True
            if not data:
                if ended:
                    self._close(fd)
                return
        elif not data:
            self._close(fd)
            return
        final = state.feed(data)
        requests = state.take_requests()
        out: list[bytes] = []
        close = False
        after_commit = False
        after_pass = False
        # Answers that the commit may still refuse: (index in `out`, request, write group).
        groups: list[tuple] = []
        while requests:
            answered = state.answer_inline(requests[0])
            if answered is None:
                break
            request = requests.pop(0)
            answer, close, needs_commit = answered
            if needs_commit is True:
                after_commit = True
            elif needs_commit:
                groups.append((len(out), request, needs_commit))
                if needs_commit.ends_with_pass:
                    after_pass = True
                else:
                    after_commit = True
            out.append(answer)
            if close:
                requests = []
                break
        if after_commit or (after_pass and requests):
            sock, _state = self._unwatch(fd)
            committing.append((sock, state, out, requests, final, close, groups))
            return
        if after_pass:
            held.append((fd, state, out, final, close, groups))
            return
        if requests:
            if self._mover is not None and not out and final is None and tls is None:
                move = self._mover(requests[0])
                if move is not None and not state.events.in_message:
                    sock, _state = self._unwatch(fd)
                    pending = b"".join(request.encode() for request in requests)
                    self._nursery.start_soon(_move, sock, move, pending)
                    return
            # A route that may wait: answered by a task of its own.
            self._hand_over(fd, out, requests, final)
            return
        self._send(fd, out, final, close)

    def _send(self, fd: int, out: list[bytes], final: bytes | None, close: bool) -> None:
        """Write a connection's answers (and its `final` one, after which it closes); what
        the socket does not take at once is written by a task."""
        if final is not None and not close:
            out.append(final)
            close = True
        if out:
            data = out[0] if len(out) == 1 else b"".join(out)
            state = self._connections[fd][1]
            rest = _write_now(fd, state, data)
            if rest is None:
                self._close(fd)
                return
            if rest:
                self._hand_over(fd, rest, [], None, close=close)
                return
        if close:
            sock, state = self._unwatch(fd)
            self._nursery.start_soon(_close_after_answer, sock, state.tls)

    def _answer_held(self, held: list[tuple], committing: list[tuple]) -> None:
        """The answers of a pass that waited for its writes (made as the pass ended): sent,
        a failed write's refused; or, when those writes reached a `--sync-every` count, after
        the commit's fsync like any other."""
        if self._router.commit_due():
            for fd, state, out, final, close, groups in held:
                sock, _state = self._unwatch(fd)
                committing.append((sock, state, out, [], final, close, groups))
            return
        for fd, state, out, final, close, groups in held:
            for index, request, group in groups:
                if group.error is not None:
                    out[index] = state.refused(request, group.error)
            try:
                self._send(fd, out, final, close)
            except Exception as error:
                self._on_error(error)
                if fd in self._connections:
                    self._close(fd)

    async def _commit_then_answer(self, committing: list[tuple]) -> None:
        """One commit for every connection of a pass whose answers wait for it, then each
        connection's answers (and the rest of its requests) by a task of its own."""
        try:
            groups = [group for *_rest, waiting in committing for _i, _r, group in waiting]
            await self._router.commit(groups)
        except Exception as error:
            # Nothing unsynced is acknowledged: the clients see their connections close
            # without an answer and publish again.
            self._on_error(error)
            for sock, *_rest in committing:
                sock.close()
            return
        for sock, state, out, requests, final, close, groups in committing:
            for index, request, group in groups:
                if group.error is not None:
                    out[index] = state.refused(request, group.error)
            if not requests and final is None and not close:
                # The common case, a publish and nothing after it: write the answers now and
                # give the connection back, without a task.
                data = out[0] if len(out) == 1 else b"".join(out)
                rest = _write_now(sock.fileno(), state, data)
                if rest is None:
                    sock.close()
                    continue
                if not rest:
                    self._watch(sock, state)
                    continue
                out = rest
            self._nursery.start_soon(
                self._answer_off_poller, sock, state, out, requests, final, close
            )

    def _hand_over(self, fd: int, out: list[bytes], requests, final, *, close: bool = False):
        sock, state = self._unwatch(fd)
        self._nursery.start_soon(self._answer_off_poller, sock, state, out, requests, final, close)

    async def _answer_off_poller(self, sock, state, out, requests, final, close) -> None:
        """Answer what the poller could not (slow routes, a client not reading), then give the
        connection back to the poller, or close it."""
        fd = sock.fileno()
        try:
            # What was answered already goes out before anything waits (over TLS, what the
            # stream holds encrypted too).
            if (out or state.tls is not None) and not await _send_all(fd, state, b"".join(out)):
                close = True
            for request in requests:
                if close:
                    break
                answer, close = await state.answer(request)
                if not await _send_all(fd, state, answer):
                    close = True
            if final is not None and not close:
                await _send_all(fd, state, final)
                close = True
        except BaseException:
            sock.close()
            raise
        if close:
            await _close_after_answer(sock, state.tls)
        else:
            self._watch(sock, state)


async def _move(sock, move, pending: bytes) -> None:
    """Hand the connection over (`Mover`); this server's copy of it closes either way."""
    try:
        await move(sock, pending)
    finally:
        sock.close()


def _write_now(fd: int, state: ConnectionState, data: bytes) -> list[bytes] | None:
    """Write what the socket takes of `data` now: None when the connection broke, else what
    a task must still write ([] for nothing; over TLS the rest waits encrypted in the
    stream, and [b""] says a task must flush it)."""
    tls = state.tls
    if tls is not None:
        try:
            return [] if tls.send_now(data) else [b""]
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            return None
    try:
        sent = os.write(fd, data)
    except BlockingIOError:
        sent = 0
    except OSError:
        return None
    return [] if sent == len(data) else [data[sent:]]


async def _send_all(fd: int, state: ConnectionState, data: bytes) -> bool:
    """Write all of `data` (over TLS, encrypted, after what the stream still holds), waiting
    whenever the client is not reading; False when the connection broke."""
    tls = state.tls
    if tls is None:
        return await _send_all_fd(fd, data)
    try:
        await tls.send_all(data)
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        return False
    return True


async def _close_after_answer(sock, tls: TLSStream | None = None) -> None:
    """Go's closeWriteAndWait: closing with unread input makes the kernel send a reset, which
    can destroy the end of our answer before the client has read it (a client that sent more
    after a request we refused, say). Send FIN first (over TLS, a close_notify before it),
    read and drop what comes (up to a limit) for a moment, then close."""
    try:
        if tls is not None:
            await tls.send_eof()
        else:
            sock.shutdown(socket.SHUT_WR)
        with trio.move_on_after(LINGER_SECONDS):
            dropped = 0
            while dropped < LINGER_MAX_BYTES:
                data = await sock.recv(RECEIVE_SIZE)
                if not data:
                    return
                dropped += len(data)
            # A client still streaming: stop reading (as Go does) until the delay is over.
            await trio.sleep_forever()
    except (OSError, trio.BrokenResourceError, trio.ClosedResourceError):
        pass
    finally:
        sock.close()
