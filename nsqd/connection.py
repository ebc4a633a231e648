"""One V2 client connection's I/O: its reads, its sends, its message pump, its timers, and
the effects its commands ask for.

What the client's commands mean is the interpreter's (`nsqd/protocol_v2.py`, which does no
I/O); this file feeds it the bytes read, does what a batch yields (`nsqd/effects.py`) and sends
the replies. The connection owns a cancel scope with two tasks: the read loop (run every
complete command in each receive, answer them with one send) and the message pump (send the
frames the interpreter's `deliveries` gives, one send a piece). Either task ends the
connection by cancelling the scope: a fatal error, EOF, a missed heartbeat or a dead socket.

The I/O the effects need lives here too: TLS and compression upgrades, the auth server, and
under `--workers` moving the connection to another worker, relaying it there, or forwarding a
publish (`nsqd/worker_hops.py`).
"""

import math
import os
import socket
import weakref
from collections.abc import Awaitable, Callable, Iterable
from functools import partial
from typing import TYPE_CHECKING, Any

import trio

from nsqpy.common.command import NOP
from nsqpy.common.errors import ProtocolError
from nsqpy.common.frame import HEARTBEAT_FRAME, OK_FRAME, encode_response
from nsqpy.daemon.auth import AuthError, ip_of, query_any
from nsqpy.daemon.net import peer_common_name
from nsqpy.daemon.tls_stream import TLSStream
from nsqpy.nsqd import effects
from nsqpy.nsqd.compression import CompressedStream, PrefixedStream
from nsqpy.nsqd.connection_poller import ConnectionPoller, PolledWakeup
from nsqpy.nsqd.effects import BatchDone, Commit
from nsqpy.nsqd.handoff import Handoff
from nsqpy.nsqd.idle_reads import RECEIVE_SIZE
from nsqpy.nsqd.protocol_v2 import ProtocolV2, only_nops
from nsqpy.nsqd.tls import connection_details
from nsqpy.nsqd.wakeup import Wakeup
from nsqpy.nsqd.worker_hops import WorkerHops

if TYPE_CHECKING:
    from nsqpy.nsqd.server import NSQD

# Go gives the TLS handshake 5 s.
TLS_HANDSHAKE_TIMEOUT = 5.0
# A TLS close_notify to a peer that stopped reading must not hold the connection's task.
CLOSE_TIMEOUT = 1.0
# After a fatal error nsqd reads and drops what the client still sends for this long before
# it closes: closing a socket with unread bytes resets it, and a reset discards the error
# reply on the client's side (a PUB refused as too big is refused before its body is read).
REFUSED_LINGER = 1.0


# Every connection object alive (`/debug/connections`): one a client holds open, or one that
# ended and something still holds. Reference counting frees a connection the moment it ends
# (nothing of it is a cycle: tests/nsqd/test_connection_lifetime.py), so a count above the open
# connections is a leak to look for.
LIVE_CONNECTIONS: "weakref.WeakSet[V2Connection]" = weakref.WeakSet()


# What a connection's tasks do first when the poller hands it over (`V2Connection.promote`):
# finish what the poller began; False: the connection is to close.
Resume = Callable[[], Awaitable[bool]]


class V2Connection:
    # trio's stream on the accepted socket, then what TLS and compression layer on that:
    # made when the connection gets tasks of its own (`run`); a polled one has none.
    stream: trio.abc.HalfCloseableStream

    def __init__(
        self,
        nsqd: "NSQD",
        sock: socket.socket | int,
        remote_address: str,
        handoff: Handoff | None = None,
    ) -> None:
        self.nsqd = nsqd
        # The accepted socket (non-blocking), and trio's on it once the connection has tasks
        # of its own; until then the connection poller serves it (`nsqd/connection_poller.py`)
        # by its descriptor alone (`sock` an int: the socket object is made when it is needed).
        self._socket: socket.socket | None = None if isinstance(sock, int) else sock
        self._raw: trio.socket.SocketType | None = None
        self._poller: ConnectionPoller | None = None
        LIVE_CONNECTIONS.add(self)
        # `--workers` (`nsqd/worker_hops.py`): a connection handed over by another worker, and
        # its moves and forwarded publishes to the others.
        self.handoff = handoff
        self.protocol = ProtocolV2(
            nsqd,
            remote_address,
            trio.current_time,
            internal=handoff is not None and handoff.internal,
        )
        self.client = self.protocol.client
        self._batches = self.protocol.batches()
        self.hops = WorkerHops(self)
        self._muted = False
        self._send_lock = trio.Lock()
        # The descriptor `_send` writes to directly while the connection is a plain socket
        # (-1 once TLS or compression wraps it).
        self._fd = sock if isinstance(sock, int) else sock.fileno()
        # The TLS stream `_send` writes to directly once TLS alone wraps the socket.
        self._tls: TLSStream | None = None
        self._cancel_scope = trio.CancelScope()
        # The connection's timers (`nsqd/heartbeats.py`): when the clock calls it next, when
        # the command being read must have arrived (Go's read deadline: two heartbeat
        # intervals), when the last heartbeat went out, and what of a heartbeat the clock
        # wrote did not fit the socket (sent first by the next `_send`).
        self.timers_at = math.inf
        self._read_deadline = math.inf
        self._last_heartbeat = 0.0
        self._owed = b""
        # A connection on a stream that is not a socket (the cluster simulator's network,
        # `over_stream`): served through that stream alone.
        self._given: trio.abc.HalfCloseableStream | None = None

    @classmethod
    def over_stream(
        cls, nsqd: "NSQD", stream: trio.abc.HalfCloseableStream, remote_address: str
    ) -> "V2Connection":
        """A connection on `stream`, which has no socket under it: its reads, writes and
        heartbeats go through the stream (the connection poller and the direct writes are
        a socket's)."""
        connection = cls(nsqd, -1, remote_address)
        connection._given = stream
        return connection

    def begin(self) -> None:
        """From the protocol magic on: one of nsqd's clients, its timers running."""
        if not self.protocol.internal:
            self.nsqd.add_client(self.client)
        self._last_heartbeat = trio.current_time()
        self._arm_read_deadline()

    # -- connection life ----------------------------------------------------------------------

    async def run(self, resume: Resume | None = None) -> None:
        """Serve the connection with tasks of its own until it ends: from the protocol magic
        on, or (`resume`) from where the poller handed it over."""
        protocol = self.protocol
        if self._given is not None:
            self.stream = self._given
        else:
            if self._socket is None:
                self._socket = socket.socket(fileno=self._fd)
            self._raw = trio.socket.from_stdlib_socket(self._socket)
            self.stream = trio.SocketStream(self._raw)
        if resume is None:
            self.begin()
        relay: trio.SocketStream | None = None
        try:
            with self._cancel_scope:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(self._message_pump)
                    if resume is not None:
                        go_on = await resume()
                    elif self.handoff is not None:
                        go_on = await self._replay(self.handoff)
                    else:
                        go_on = True
                    if go_on:
                        await self._read_loop()
                    nursery.cancel_scope.cancel()
                if protocol.refused:
                    self._leave()
                    with trio.move_on_after(REFUSED_LINGER):
                        await self._discard_input()
                if self.hops.moving is not None:
                    self.nsqd.heartbeats.forget(self)
                    relay = await self.hops.move(self._fd)
                    if relay is not None:
                        await self.hops.relay(self.stream, relay)
        finally:
            if relay is not None:
                relay.socket.close()
            self._leave()
            with trio.CancelScope(shield=True) as closing:
                closing.deadline = trio.current_time() + CLOSE_TIMEOUT
                await self.stream.aclose()

    def _leave(self) -> None:
        """The client is gone from nsqd's view: no heartbeats, out of /stats, what it had in
        flight back to its channel. Safe to repeat."""
        client = self.client
        self.nsqd.heartbeats.forget(self)
        self.nsqd.remove_client(client)
        if client.channel is not None:
            client.channel.remove_client(client)

    async def _discard_input(self) -> None:
        """After a fatal error: tell the client at once that nothing more comes (the error
        frame went out, then the write side ends: TLS's close_notify, then the socket's),
        and read and drop what it still sends until it closes, so its error reply reaches it
        instead of a reset. Youzan's go-nsq checks that such a connection is gone within a
        second, over TLS, snappy and deflate as over plain TCP."""
        try:
            # A socket's, a TLS stream's (close_notify, then its socket's), a compressed
            # stream's (its stream's, under it).
            await self.stream.send_eof()
        except (OSError, trio.BrokenResourceError, trio.ClosedResourceError):
            return
        try:
            if self._raw is None:
                # No socket under the stream: its own bytes.
                while await self.stream.receive_some(RECEIVE_SIZE):
                    pass
                return
            # The socket's bytes, not the stream's: after a close_notify nothing is decrypted.
            while await self._raw.recv(RECEIVE_SIZE):
                pass
        except (OSError, trio.BrokenResourceError, trio.ClosedResourceError):
            pass

    async def _replay(self, handoff: Handoff) -> bool:
        """Stand where the worker that handed the connection over stood: run the preamble
        (its replies were sent already), then what the client sent from its topic command
        on. False: the connection is to close."""
        self.hops.restore(self.client, handoff)
        self.protocol.topic_bound = True
        self._muted = True
        try:
            self.protocol.receive_data(handoff.preamble)
            if not await self._run_commands():
                return False
        finally:
            self._muted = False
        self.protocol.receive_data(handoff.pending)
        return await self._run_commands()

    def close(self) -> None:
        """Server-side close (shutdown, channel deleted)."""
        self._end()

    def _end(self) -> None:
        """End the connection: its tasks' cancel scope, or a polled one here and now."""
        poller = self._poller
        if poller is None:
            self._cancel_scope.cancel()
            return
        self._poller = None
        poller.forget(self._fd)
        self._leave()
        if self._socket is not None:
            self._socket.close()
        else:
            os.close(self._fd)
        self.nsqd.connection_ended(self)

    # -- served by the connection poller ------------------------------------------------------

    def start_polled(self, poller: ConnectionPoller) -> None:
        """Begin, served by `poller` until anything would wait (`promote`)."""
        self._poller = poller
        self.client.wakeup = PolledWakeup(self, poller)
        self.begin()
        poller.watch(self, self._fd)

    def promote(self, resume: Resume) -> None:
        """Leave the poller for tasks of the connection's own, for the rest of its life; they
        run `resume` first."""
        poller = self._poller
        assert poller is not None
        self._poller = None
        poller.forget(self._fd)
        # The pump task looks once, whatever woke the poller's meanwhile.
        self.client.wakeup = Wakeup()
        self.client.wakeup.set()
        self.nsqd.serve_promoted(self, resume)

    def failed(self) -> None:
        """A bug serving a polled connection: it costs that connection alone."""
        self.nsqd.log.exception(
            "PROTOCOL(V2): [%s] internal error, closing the connection",
            self.client.remote_address,
        )
        if self._poller is not None:
            self._end()

    def read_polled(self) -> None:
        """The poller's call, the socket readable: run the complete commands and send their
        replies, as `_read_loop` and `_run_commands` would, or hand the connection over."""
        try:
            data = os.read(self._fd, RECEIVE_SIZE)
        except BlockingIOError:
            return
        except OSError:
            self._end()
            return
        client = self.client
        protocol = self.protocol
        if client.closed_by_server:
            self._end()
            return
        if not data:
            reply = protocol.receive_eof()
            if reply is not None:
                self._write_now(reply)
            self._end()
            return
        if data[:4] == NOP and self.absorb_nops(data):
            return
        protocol.receive_data(data)
        commands_run = protocol.commands_run
        effect = self._batches.send(None)
        if type(effect) is not BatchDone or (effect.commit and self.nsqd.storage.commit_due()):
            # Its commit is the connection's task's: a commit another task begins meanwhile
            # registers the fsyncs it takes, and this one waits for them (`Storage.commit`).
            self.promote(partial(self._run_commands, effect, commands_run))
            return
        keep_open = effect.keep_open and not client.closed_by_server
        replies = protocol.replies()
        unsent = b""
        if replies and not client.closed_by_server:
            written = self._write_now(replies)
            if written is None:
                return
            unsent = written
        if protocol.commands_run != commands_run:
            self._arm_read_deadline()
        if unsent or (not keep_open and protocol.refused):
            # The rest waits for the socket, or the client's input is drained before the
            # close: in the connection's tasks.
            self.promote(partial(self._finish_send, unsent, keep_open))
        elif not keep_open:
            self._end()

    def pump_polled(self) -> None:
        """The poller's pump task's call, the client woken: one round of `_message_pump`."""
        if self._poller is None:
            return
        pieces, held_for = self.protocol.deliveries()
        if pieces is None:
            if self.client.closed_by_server:
                self._end()
            elif held_for or self._owed:
                self.promote(partial(self._finish_send, b"", True))
            return
        frames_left = iter(pieces)
        for frames in frames_left:
            unsent = self._write_now(frames)
            if unsent is None:
                return
            if unsent:
                # The other pieces are encoded as they are sent: one output buffer at a time.
                self.promote(partial(self._finish_send, unsent, True, frames_left))
                return
        # More may be let out: another round after the other woken consumers'.
        self.client.wakeup.set()

    def _write_now(self, data: bytes) -> bytes | None:
        """Write what the plain socket takes now, what is owed first; what it did not take
        (None: the connection ended)."""
        if self._owed:
            data, self._owed = self._owed + data, b""
        try:
            sent = os.write(self._fd, data)
        except BlockingIOError:
            sent = 0
        except OSError:
            self._end()
            return None
        return data[sent:] if sent < len(data) else b""

    async def _finish_send(
        self, unsent: bytes, keep_open: bool, pieces: Iterable[bytes] = ()
    ) -> bool:
        """A promoted connection's first step: send what the socket did not take, and the
        pieces of the delivery it was part of."""
        if unsent or self._owed:
            await self._send(unsent)
        for frames in pieces:
            await self._send(frames)
            del frames
        return keep_open and not self.client.closed_by_server

    # -- timers -------------------------------------------------------------------------------

    def _arm_read_deadline(self) -> None:
        """Go sets a read deadline of twice the heartbeat interval before it reads each
        command, and reads the whole command (line and body) under it: a client dribbling one
        command a byte at a time (slowloris) is cut off, however often a byte arrives. The
        clock enforces it (`timers_due`)."""
        heartbeat = self.client.heartbeat_interval
        if heartbeat > 0:
            now = trio.current_time()
            self._read_deadline = now + heartbeat * 2
            self.nsqd.heartbeats.book(
                self, min(self._read_deadline, self._last_heartbeat + heartbeat)
            )
        else:
            self._read_deadline = math.inf

    def timers_due(self, now: float) -> float:
        """The clock's call (`nsqd/heartbeats.py`): end the connection if its read deadline
        passed; send the heartbeat if it is due, from here when the socket is plain and no
        send is under way, else by waking the pump. Returns when to be called next."""
        if now >= self._read_deadline:
            self.nsqd.log.error("[%s] IOLoop error - read deadline exceeded", self.client)
            self._end()
            return math.inf
        interval = self.client.heartbeat_interval
        if interval <= 0:
            return self._read_deadline
        due = self._last_heartbeat + interval
        if now >= due:
            if self._fd >= 0 and not self._send_lock.locked() and not self._owed:
                self._last_heartbeat = now
                self._write_heartbeat()
            else:
                self.client.wakeup.set()
            due = now + interval
        return min(self._read_deadline, due)

    def _write_heartbeat(self) -> None:
        """Write a heartbeat at once; what the socket does not take is owed to the next send,
        which the pump is woken to make."""
        unsent = self._write_now(HEARTBEAT_FRAME)  # nothing is owed when the clock writes one
        if unsent:
            self._owed = unsent
            self.client.wakeup.set()

    # -- reads and commands -------------------------------------------------------------------

    async def _read_loop(self) -> None:
        idle_reads = self.nsqd.idle_reads
        protocol = self.protocol
        data: bytes | bytearray
        # Whether the client's last bytes were only NOPs: an idle connection, whose next wait
        # goes to the idle reads' poller. A busy one (FINs, publishes) waits in trio, which
        # re-arms a descriptor with one call where the poller takes two.
        idle = False
        while True:
            try:
                if idle and self._fd >= 0 and idle_reads is not None:
                    # Level-triggered: bytes already there are reported at once.
                    data = await idle_reads.receive(self._fd, self)
                else:
                    data = await self.stream.receive_some(RECEIVE_SIZE)
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                return
            if self.client.closed_by_server:
                # Go closes the connection there and then: what the client sent meanwhile
                # (FINs of a deleted channel's messages) meets a closed socket, not refusals.
                return
            idle = data[:4] == NOP and only_nops(data)
            if not data:
                reply = protocol.receive_eof()
                if reply is not None:
                    await self._send(reply)
                return
            protocol.receive_data(data)
            if not await self._run_commands():
                return

    def absorb_nops(self, data: bytes) -> bool:
        """The idle reads' call (`nsqd/idle_reads.py`): whole NOPs are taken there and then,
        and the next command gets a fresh read deadline. False: the read loop runs it."""
        if not self.protocol.absorb_nops(data):
            return False
        self._arm_read_deadline()
        return True

    async def _run_commands(
        self, effect: effects.Effect | None = None, commands_run: int | None = None
    ) -> bool:
        """Run every complete command, doing the effects they ask for, then send all replies
        at once. False: close. `effect`: the batch began (by the poller) and asked for it;
        `commands_run`: the count before it."""
        protocol = self.protocol
        if commands_run is None:
            commands_run = protocol.commands_run
        batches = self._batches
        commit = self.nsqd.storage.commit
        outcome: Any = None
        error: Exception | None = None
        while True:
            if effect is None:
                if error is None:
                    effect = batches.send(outcome)
                else:
                    effect, error = batches.throw(error), None
            if isinstance(effect, BatchDone):
                if effect.commit:
                    await commit()
                break
            if isinstance(effect, Commit):
                # A log publish's batch: its commit is done here, as the commit of the other
                # batches is, rather than through `_perform`.
                await commit(effect.groups)
                outcome = effect = None
                continue
            try:
                outcome = await self._perform(effect)
            except (ProtocolError, AuthError) as raised:
                outcome, error = None, raised
            effect = None
        replies = protocol.replies()
        if replies and not self._muted and not self.client.closed_by_server:
            await self._send(replies)
        if protocol.commands_run != commands_run:
            self._arm_read_deadline()  # a command completed: the next one gets a fresh deadline
        return effect.keep_open and not self.client.closed_by_server

    async def _perform(self, effect: effects.Effect) -> Any:
        """Do what a batch asked for; its outcome goes back to the interpreter."""
        match effect:
            case effects.Forward(owner=owner, command=command, index=index):
                await self.hops.forward(owner, command, index)
            case effects.AnswerForwarded():
                return await self.hops.forwarded_answers()
            case effects.QueryAuth():
                await self._query_auth()
            case effects.Upgrade():
                await self._upgrade(effect)
            case effects.MoveTo(owner=owner, command=command):
                self.hops.move_to(owner, command, self.protocol, self._fd)
            case effects.ReplicateChannels(topics=topics):
                for topic in topics:
                    await topic.replication.channels_changed()
        return None

    async def _query_auth(self) -> None:
        client = self.client
        options = self.nsqd.options
        client.auth_state = await query_any(
            options.auth_http_address,
            ip_of(client.remote_address),
            client.tls,
            client.auth_secret,
            client.tls_common_name,
            options.http_client_connect_timeout + options.http_client_request_timeout,
        )

    async def _upgrade(self, upgrade: effects.Upgrade) -> None:
        """After the IDENTIFY reply: TLS, then compression, each confirmed by an `OK` sent
        through the new layer (docs/protocol.md §2.1)."""
        client = self.client
        negotiated = upgrade.negotiated
        async with self._send_lock:
            self._fd = -1
            await self.stream.send_all(upgrade.before + encode_response(negotiated.reply))
            stream = self.stream
            leftover = self.protocol.parser.take_buffered()
            try:
                if negotiated.tls:
                    # Negotiated only when nsqd has a TLS context (`tls_available`), and first,
                    # on the accepted socket (`leftover`: the client's first TLS bytes).
                    assert self.nsqd.tls_context is not None
                    assert isinstance(stream, trio.SocketStream)
                    tls = TLSStream(stream.socket, self.nsqd.tls_context, leftover)
                    leftover = b""
                    with trio.fail_after(TLS_HANDSHAKE_TIMEOUT):
                        await tls.do_handshake()
                    client.tls = True
                    details = connection_details(tls.ssl_object)
                    client.tls_version = details["tls_version"]
                    client.tls_cipher_suite = details["tls_cipher_suite"]
                    client.tls_negotiated_protocol = details["tls_negotiated_protocol"]
                    client.tls_negotiated_protocol_is_mutual = True
                    client.tls_common_name = peer_common_name(tls.ssl_object)
                    stream = tls
                    await stream.send_all(OK_FRAME)
                elif leftover:
                    stream = PrefixedStream(stream, leftover)
                if negotiated.snappy:
                    stream = CompressedStream.snappy(stream)
                    client.snappy = True
                    await stream.send_all(OK_FRAME)
                if negotiated.deflate_level:
                    stream = CompressedStream.deflate(stream, negotiated.deflate_level)
                    client.deflate = True
                    client.deflate_level = negotiated.deflate_level
                    await stream.send_all(OK_FRAME)
            except (trio.TooSlowError, trio.BrokenResourceError, OSError) as error:
                raise ProtocolError("E_IDENTIFY_FAILED", f"IDENTIFY failed {error}") from None
            finally:
                self.stream = stream
                # The shortcut writes only to a TLS stream nothing is layered on.
                self._tls = stream if type(stream) is TLSStream else None

    # -- sends --------------------------------------------------------------------------------

    async def _send(self, data: bytes) -> None:
        if self._owed:
            data, self._owed = self._owed + data, b""
        fd = self._fd
        if fd >= 0 and not self._send_lock.locked():
            # A plain socket and no send under way: write at once, without trio's socket
            # wrappers and their two scheduler round trips; the socket buffer almost always
            # takes it all. Only what is left waits, under the lock and the write deadline.
            try:
                sent = os.write(fd, data)
            except BlockingIOError:
                sent = 0
            except OSError:
                self._cancel_scope.cancel()
                return
            if sent == len(data):
                return
            data = data[sent:]
        elif self._tls is not None and not self._send_lock.locked():
            # The same over TLS: encrypted and written at once; what the socket does not take
            # waits in the stream, and goes first with the send below.
            try:
                if self._tls.send_now(data):
                    return
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                self._cancel_scope.cancel()
                return
            data = b""
        client = self.client
        try:
            async with self._send_lock:
                # Go sets a write deadline of one heartbeat interval on every write.
                timeout = client.heartbeat_interval if client.heartbeat_interval > 0 else math.inf
                with trio.move_on_after(timeout) as deadline:
                    await self.stream.send_all(data)
                if deadline.cancelled_caught:
                    self.nsqd.log.error("[%s] write deadline exceeded", client)
                    self._cancel_scope.cancel()
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            self._cancel_scope.cancel()

    async def _message_pump(self) -> None:
        client = self.client
        deliveries = self.protocol.deliveries
        # The connection's own from its first task on (`promote` gives it one).
        wakeup = client.wakeup
        assert isinstance(wakeup, Wakeup)
        while True:
            pieces, held_for = deliveries()
            if pieces is not None:
                for frames in pieces:
                    await self._send(frames)
                    del frames
                # A send that fit the socket buffer did not yield: let others run.
                await trio.lowlevel.checkpoint()
                continue
            if client.closed_by_server:
                self._cancel_scope.cancel()
                return
            # The clock (`timers_due`) wakes the pump for a heartbeat it could not write, or
            # could write only part of (`_send` sends the rest first).
            if self._owed:
                await self._send(b"")
                continue
            interval = client.heartbeat_interval
            now = trio.current_time()
            if interval > 0 and now >= self._last_heartbeat + interval:
                self._last_heartbeat = now
                await self._send(HEARTBEAT_FRAME)
                continue
            if held_for:
                with trio.move_on_after(held_for):
                    await wakeup.wait()
                continue
            await wakeup.wait()
