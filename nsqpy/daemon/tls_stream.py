"""TLS on a socket trio accepted: the stdlib's `ssl.SSLObject` over two memory BIOs, for nsqd's
client connections and the daemons' HTTPS.

`trio.SSLStream` does the same job for any transport, and pays for it on each call: a send
takes its locks, encrypts, then goes through trio's socket wrappers and their scheduler round
trip; a receive decrypts one TLS record. A consumer that finishes each message in its own
write (go-nsq, pynsq, the blocking client) sends a record a message, and nsqd answers each
with a message of its own, so those costs were nsqd's per-message cost over TLS: 24 µs where
a plain connection takes 5.4 (`bench.security_bench --client blocking`).

This stream takes the plain connection's shortcuts. A send encrypts and writes to the socket
at once, and waits only for what the socket buffer does not take. A receive reads what the
socket has and decrypts every whole record in it, so a burst of FINs is one receive. The
handshake, the records and the certificates are OpenSSL's, through the ssl module.
"""

import os
import socket
import ssl

import trio

RECEIVE_SIZE = 256 * 1024


class TLSStream(trio.abc.HalfCloseableStream):
    """The server side of TLS on a connected, non-blocking socket. `prefix` is what was read
    from the socket before the upgrade (the client's first TLS bytes, sent with IDENTIFY).
    One task receives at a time and one sends at a time (the connection's send lock).
    `https_compatible`, as trio.SSLStream's: a connection that ends without close_notify
    ends the stream (b""), as HTTPS clients close, instead of breaking it."""

    def __init__(
        self,
        sock: trio.socket.SocketType,
        context: ssl.SSLContext,
        prefix: bytes = b"",
        *,
        https_compatible: bool = False,
    ) -> None:
        self._https_compatible = https_compatible
        self._socket = sock
        self._fd = sock.fileno()
        self._incoming = ssl.MemoryBIO()
        self._outgoing = ssl.MemoryBIO()
        if prefix:
            self._incoming.write(prefix)
        self.ssl_object = context.wrap_bio(self._incoming, self._outgoing, server_side=True)
        # Encrypted bytes the socket has not taken yet, and whether a task waits to write them.
        self._unsent = b""
        self._draining: trio.Event | None = None
        self._close_notified = False
        self._closed = False

    # -- the handshake ------------------------------------------------------------------------

    async def do_handshake(self) -> None:
        while True:
            try:
                self.ssl_object.do_handshake()
            except ssl.SSLWantReadError:
                await self._flush()
                await self._receive_records()
                continue
            except ssl.SSLError as error:
                # What OpenSSL says of the refusal (an alert) goes to the client first.
                self._flush_quietly()
                raise trio.BrokenResourceError(f"TLS handshake failed: {error}") from error
            await self._flush()
            return

    # -- trio.abc.Stream ----------------------------------------------------------------------

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        self._encrypt(data)
        await self._flush()

    def send_now(self, data: bytes | bytearray | memoryview) -> bool:
        """Encrypt `data` and write what the socket takes, without waiting: True when all of
        it went. What is left goes first with the next `send_all`, which waits for it."""
        self._encrypt(data)
        return self._write_encrypted()

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        """Every whole record's bytes that came; b"" once the client said close_notify.
        A connection that ends without it is broken (trio.BrokenResourceError), as
        trio.SSLStream has it."""
        if self._closed:
            raise trio.ClosedResourceError("the TLS stream is closed")
        parked = False
        while True:
            data = self._decrypted(max_bytes or RECEIVE_SIZE)
            if self._outgoing.pending:
                await self._flush()  # what reading produced (a TLS 1.3 key update's answer)
            if data is not None:
                if not parked:
                    # Bytes that were already there: others run before this task goes on.
                    await trio.lowlevel.checkpoint()
                return data
            if self._incoming.eof:
                return self._ended()
            parked |= await self._receive_records()

    def decrypt_now(self, raw: bytes | None) -> tuple[bytes, bool]:
        """For a caller that reads the socket itself (the HTTP poller): `raw`, what it read
        (b"" at the connection's end, None for nothing new), taken in; every whole record's
        bytes that are there now, and whether the connection ended (close_notify, or its
        end: HTTPS's way). What reading produced for the peer (a TLS 1.3 key update's
        answer) is written as it can."""
        if raw:
            self._incoming.write(raw)
        elif raw is not None:
            self._incoming.write_eof()
        pieces: list[bytes] = []
        ended = False
        while True:
            try:
                data = self._decrypted(RECEIVE_SIZE)
            except trio.BrokenResourceError:
                ended = True
                break
            if data is None:
                break
            if not data:
                ended = True
                break
            pieces.append(data)
        if self._outgoing.pending:
            self.send_now(b"")
        return b"".join(pieces), ended or self._incoming.eof

    async def wait_send_all_might_not_block(self) -> None:
        await trio.lowlevel.wait_writable(self._fd)

    async def send_eof(self) -> None:
        """Nothing more goes to the peer: a close_notify, then the socket's write side ends;
        what the peer still sends can be read (and dropped) from the socket."""
        try:
            self.ssl_object.unwrap()
        except ssl.SSLWantReadError:
            pass  # the close_notify is written: the peer's own may come later, or never
        except (ssl.SSLError, ValueError):
            pass
        await self._flush()
        self._socket.shutdown(socket.SHUT_WR)

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            self.ssl_object.unwrap()
        except (ssl.SSLError, ValueError):
            pass  # a close_notify is a courtesy here: the socket closes either way
        self._flush_quietly()
        self._socket.close()
        await trio.lowlevel.checkpoint()

    # -- bytes in -----------------------------------------------------------------------------

    def _decrypted(self, max_bytes: int) -> bytes | None:
        """What the whole records in the incoming buffer decrypt to, up to `max_bytes` (the
        rest waits inside the TLS layer), b"" after a close_notify, None when no whole record
        is there."""
        pieces: list[bytes] = []
        room = max_bytes
        ssl_object = self.ssl_object
        incoming = self._incoming
        try:
            while room > 0:
                piece = ssl_object.read(room)
                if not piece:
                    if incoming.eof:
                        # OpenSSL reads the end of the bytes as an end without close_notify.
                        return b"".join(pieces) or self._ended()
                    self._close_notified = True  # the client's close_notify
                    break
                pieces.append(piece)
                room -= len(piece)
                if not incoming.pending and not ssl_object.pending() and not incoming.eof:
                    # Every byte taken and nothing decrypted waiting: another read would
                    # only raise SSLWantReadError (a request's worth of time on HTTPS).
                    break
        except ssl.SSLWantReadError:
            pass
        except ssl.SSLEOFError:
            # The connection ended inside a record.
            return b"".join(pieces) or self._ended()
        except ssl.SSLError as error:
            raise trio.BrokenResourceError(f"TLS: {error}") from error
        if pieces:
            return b"".join(pieces)
        return b"" if self._close_notified else None

    def _ended(self) -> bytes:
        """The connection ended without close_notify: the end of an HTTPS stream, else a
        broken one."""
        if self._https_compatible:
            return b""
        raise trio.BrokenResourceError("TLS: the connection ended without close_notify")

    async def _receive_records(self) -> bool:
        """Read what the socket has into the incoming buffer, waiting until it has something
        (True: this task waited); at the connection's end the buffer's end is written."""
        parked = False
        while True:
            try:
                data = os.read(self._fd, RECEIVE_SIZE)
            except BlockingIOError:
                await trio.lowlevel.wait_readable(self._fd)
                parked = True
                continue
            except OSError as error:
                raise trio.BrokenResourceError(f"TLS: {error}") from error
            if data:
                self._incoming.write(data)
            else:
                self._incoming.write_eof()
            return parked

    # -- bytes out ----------------------------------------------------------------------------

    def _encrypt(self, data: bytes | bytearray | memoryview) -> None:
        if self._closed:
            raise trio.ClosedResourceError("the TLS stream is closed")
        if not data:
            return
        try:
            self.ssl_object.write(data)
        except ssl.SSLError as error:
            raise trio.BrokenResourceError(f"TLS: {error}") from error

    def _write_encrypted(self) -> bool:
        """Queue what OpenSSL has encrypted behind the unsent bytes and write what the socket
        takes now, unless a task waits for the socket (it writes these too, in order): True
        when nothing is left."""
        self._unsent += self._outgoing.read()
        return self._draining is None and self._write_now()

    async def _flush(self) -> None:
        """Write what OpenSSL has encrypted; wait only for what the socket does not take."""
        if self._write_encrypted():
            return
        if self._draining is not None:
            await self._draining.wait()
            return
        self._draining = draining = trio.Event()
        try:
            while self._unsent:
                await trio.lowlevel.wait_writable(self._fd)
                self._write_now()
        finally:
            self._draining = None
            draining.set()

    def _write_now(self) -> bool:
        """Write what the socket takes now; True when nothing is left."""
        unsent = self._unsent
        if not unsent:
            return True
        try:
            sent = os.write(self._fd, unsent)
        except BlockingIOError:
            return False
        except OSError as error:
            self._unsent = b""
            raise trio.BrokenResourceError(f"TLS: {error}") from error
        self._unsent = unsent[sent:]
        return not self._unsent

    def _flush_quietly(self) -> None:
        """Write what the socket takes now, at an end where a broken socket is no news."""
        try:
            self._unsent += self._outgoing.read()
            self._write_now()
        except trio.BrokenResourceError:
            pass
