"""A cluster node's replication port (docs/design.md §14): the connection layer of its peers'
requests, which `ClusterNode._answer` answers one frame at a time.

With `--workers` (§15, "In a cluster") every worker accepts on the port its supervisor bound.
A plain connection moves to the worker owning the partition its first request names (its
socket over `nsqd/handoff.py`, the request replayed there): with the same worker count on
every node, a leader's worker links to the same worker of its followers, so the rest of the
connection's requests are about that worker's partitions too. A request that still reaches
another worker's partition (a connection on the cluster's TLS, which cannot move, or a peer
with another worker count) is answered by its owner over a link of this node's own
(`WorkerPeerLink`).
"""

import socket
import ssl
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

import trio

from nsqpy.common.replication import (
    ERROR,
    REPLY,
    Frame,
    FrameReader,
    ReplicaRefusal,
    ReplicationProtocolError,
    encode_frame,
    error_header,
)
from nsqpy.daemon.net import peer_address
from nsqpy.nsqd.handoff import Handoff
from nsqpy.nsqd.peer_link import RECEIVE_SIZE, PeerUnavailable, WorkerPeerLink

if TYPE_CHECKING:
    from nsqpy.nsqd.server import NSQD

# A replication peer has this long to finish the TLS handshake.
PEER_HANDSHAKE_TIMEOUT = 5.0
# A peer's request relayed to the worker owning its partition is answered within this (the
# peer's own link gives up sooner and asks again).
WORKER_LINK_TIMEOUT = 60.0


class PeerServer:
    def __init__(
        self,
        nsqd: "NSQD",
        answer: Callable[[Frame], Awaitable[bytes]],
        server_tls: ssl.SSLContext | None,
    ) -> None:
        self.nsqd = nsqd
        self._answer = answer
        self.server_tls = server_tls
        # Set once the cluster node serves: a connection handed over before waits for it.
        self.ready = trio.Event()
        # With `--workers`: links to the other workers, for peers' requests about their
        # partitions that reached this one (`_answer_elsewhere`).
        self._worker_links: dict[int, WorkerPeerLink] = {}

    async def serve(self, stream: trio.SocketStream) -> None:
        """A connection accepted on the replication port."""
        if self.server_tls is None:
            await self._answer_peer(stream, movable=stream)
            return
        tls = trio.SSLStream(stream, self.server_tls, server_side=True)
        try:
            with trio.fail_after(PEER_HANDSHAKE_TIMEOUT):
                await tls.do_handshake()
        except (trio.BrokenResourceError, trio.TooSlowError, OSError) as error:
            reason = str(error.__cause__ or error) or "no TLS handshake in time"
            self.nsqd.log.warning("RPC: refused a peer (%s) - %s", peer_address(stream), reason)
            await trio.aclose_forcefully(stream)
            return
        await self._answer_peer(tls)

    async def serve_handed(self, sock: socket.socket, handoff: Handoff) -> None:
        """A peer's replication connection another worker handed over (`rpc`), its first
        request in `pending`; or that worker's own link (`WorkerPeerLink`)."""
        stream = trio.SocketStream(trio.socket.from_stdlib_socket(sock))
        await self.ready.wait()
        await self._answer_peer(stream, pending=handoff.pending)

    async def _answer_peer(
        self,
        peer_stream: trio.abc.Stream,
        *,
        pending: bytes = b"",
        movable: trio.SocketStream | None = None,
    ) -> None:
        """Answer the connection's requests in order; `movable`, a plain connection accepted
        here, moves to another worker if its first request is about that worker's
        partition."""
        reader = FrameReader()
        async with peer_stream:
            try:
                data: bytes | bytearray = pending
                while True:
                    if not data:
                        data = await peer_stream.receive_some(RECEIVE_SIZE)
                        if not data:
                            return
                    frames = reader.receive_data(data)
                    data = b""
                    for at, frame in enumerate(frames):
                        owner = self._worker_of(frame)
                        if owner is not None and movable is not None:
                            rest = b"".join(encode_frame(*later) for later in frames[at:])
                            await self._move(movable, owner, rest + reader.unread())
                            return
                        movable = None
                        if owner is None:
                            reply = await self._answer(frame)
                        else:
                            reply = await self._answer_elsewhere(owner, frame)
                        await peer_stream.send_all(reply)
            except ReplicationProtocolError as error:
                self.nsqd.log.error("RPC: bad frame from a peer - %s", error)
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                return

    def _worker_of(self, frame: Frame) -> int | None:
        """The other worker of this node owning the partition a request names; None when
        this process answers it (also a request that names none: `_answer` refuses it)."""
        header = frame.header
        try:
            partition = int(header["partition"])
        except (KeyError, TypeError, ValueError):
            return None
        other = self.nsqd.placement.worker_for(str(header.get("topic")).encode(), partition)
        return None if other is None else other.index

    async def _move(self, stream: trio.SocketStream, owner: int, pending: bytes) -> None:
        worker = self.nsqd.worker
        assert worker is not None
        peer = peer_address(stream)
        handoff = Handoff(remote_address=peer, pending=pending, rpc=True)
        try:
            await worker.hand_off(owner, stream.socket.fileno(), handoff)
        except OSError as error:
            # The owner is starting again (it died): the peer's link connects again.
            self.nsqd.log.error(
                "RPC: worker %d did not take a peer's connection (%s) - %s", owner, peer, error
            )

    async def _answer_elsewhere(self, owner: int, frame: Frame) -> bytes:
        """The answer of the worker owning the partition a request names, asked over a
        link to it."""
        worker = self.nsqd.worker
        assert worker is not None
        link = self._worker_links.get(owner)
        if link is None:
            link = self._worker_links[owner] = WorkerPeerLink(
                worker, owner, timeout=WORKER_LINK_TIMEOUT
            )
        try:
            answer = await link.request(frame.op, frame.header, frame.payload)
        except ReplicaRefusal as refusal:
            return encode_frame(ERROR, refusal.details)
        except PeerUnavailable as error:
            text = f"the partition's worker {owner} did not answer - {error}"
            return encode_frame(ERROR, error_header("E_IO", text))
        return encode_frame(REPLY, answer.header, answer.payload)
