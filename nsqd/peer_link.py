"""A connection to another nsqd's replication port (`common/replication.py`): one request at a
time, its answer read before the next goes out, reconnected on the next request after a
failure. A leader holds one per follower and sends each group to all of them side by side."""

import ssl
from collections.abc import Callable
from typing import TYPE_CHECKING

import trio

from nsqpy import network
from nsqpy.common.replication import (
    ERROR,
    REPLY,
    Frame,
    FrameReader,
    ReplicaRefusal,
    ReplicationProtocolError,
    encode_frame,
)
from nsqpy.nsqd.handoff import Handoff

if TYPE_CHECKING:
    from nsqpy.nsqd.worker import Worker

RECEIVE_SIZE = 256 * 1024


class PeerUnavailable(Exception):
    """The peer could not be reached, or broke off, or did not answer in time. `silent`: the
    request went out and the peer neither answered nor closed the connection in time (frozen,
    or cut off), so it may still act on it; a peer that refused the connection, or closed it
    (it died), will not."""

    def __init__(self, message: str, *, silent: bool = False) -> None:
        super().__init__(message)
        self.silent = silent


class PeerLink:
    def __init__(
        self,
        address: tuple[str, int],
        *,
        timeout: float = 5.0,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        self.address = address
        self.timeout = timeout
        # The cluster's mutual TLS (`nsqd/tls.py`), when configured.
        self.ssl_context = ssl_context
        self._stream: trio.abc.Stream | None = None
        self._reader = FrameReader()
        self._frames: list[Frame] = []
        self._lock = trio.Lock()

    async def request(
        self,
        op: int,
        header: dict | Callable[[], dict],
        payload: bytes = b"",
        timeout: float | None = None,
    ) -> Frame:
        """The peer's `REPLY`; ReplicaRefusal for its `ERROR`, PeerUnavailable when it cannot
        be had within `timeout` (the link's own by default; waiting for the link counts).
        A `header` that is a function is called once the link is this request's: what it
        says is then what the peer's log has of every request before it on the link."""
        limit = self.timeout if timeout is None else min(timeout, self.timeout)
        with trio.move_on_after(limit) as waited:
            await self._lock.acquire()
        if waited.cancelled_caught:
            raise PeerUnavailable(f"{self.address[0]}:{self.address[1]}: busy past {limit:g} s")
        try:
            if callable(header):
                header = header()
            return await self._request(op, header, payload, limit)
        finally:
            self._lock.release()

    async def _request(self, op: int, header: dict, payload: bytes, limit: float) -> Frame:
        sent = False
        try:
            with trio.fail_after(limit):
                stream = self._stream
                if stream is None:
                    stream = self._stream = await self._connect()
                    self._reader = FrameReader()
                    self._frames = []
                sent = True
                await stream.send_all(encode_frame(op, header, payload))
                frame = await self._next_frame(stream)
        except (OSError, trio.BrokenResourceError, trio.TooSlowError) as error:
            # A request cut short leaves its answer (if any comes) unread: a new connection.
            await self._drop()
            host, port = self.address
            # A TLS handshake the peer refused is a BrokenResourceError caused by an SSLError.
            reason = error.__cause__ or error
            silent = sent and isinstance(error, trio.TooSlowError)
            raise PeerUnavailable(
                f"{host}:{port}: {reason or type(error).__name__}", silent=silent
            ) from None
        except ReplicationProtocolError as error:
            await self._drop()
            raise PeerUnavailable(f"{self.address}: {error}") from None
        if frame.op == ERROR:
            raise ReplicaRefusal(frame.header)
        if frame.op != REPLY:
            raise PeerUnavailable(f"{self.address}: answered with op {frame.op}")
        return frame

    async def _connect(self) -> trio.abc.Stream:
        stream = await network.current().connect(*self.address)
        if self.ssl_context is None:
            return stream
        tls = trio.SSLStream(stream, self.ssl_context, server_hostname=self.address[0])
        try:
            await tls.do_handshake()
        except BaseException:
            await trio.aclose_forcefully(stream)
            raise
        return tls

    async def _next_frame(self, stream: trio.abc.Stream) -> Frame:
        while not self._frames:
            data = await stream.receive_some(RECEIVE_SIZE)
            if not data:
                raise trio.BrokenResourceError("the peer closed the connection")
            self._frames.extend(self._reader.receive_data(data))
        return self._frames.pop(0)

    async def _drop(self) -> None:
        stream, self._stream = self._stream, None
        if stream is not None:
            with trio.CancelScope(shield=True):
                await stream.aclose()

    async def aclose(self) -> None:
        async with self._lock:
            await self._drop()


class WorkerPeerLink(PeerLink):
    """A link to another of this node's `--workers`, for a peer's requests about partitions
    that worker owns which reached this one (a TLS link, which cannot move, or a peer whose
    links mix the workers' partitions): a socket pair whose other end is handed to the owner
    as a replication connection (`nsqd/handoff.py`)."""

    def __init__(self, worker: "Worker", owner: int, *, timeout: float) -> None:
        super().__init__(("worker", owner), timeout=timeout)
        self.worker = worker
        self.owner = owner

    async def _connect(self) -> trio.abc.Stream:
        handoff = Handoff(remote_address=f"worker {self.worker.index}", internal=True, rpc=True)
        return await self.worker.hand_off_pair(self.owner, handoff)
