"""The nsqlookupd daemon: the registry, the V1 TCP protocol for nsqd peers, the HTTP API.

Go's nsqlookupd.go, tcp.go and lookup_protocol_v1.go on trio. Every peer error is fatal (the
error is sent, then the connection closed), and when a peer's connection ends every
registration it made goes with it.
"""

import logging
import socket
import time
from functools import partial

import trio

from nsqpy import network
from nsqpy.common.errors import ProtocolError
from nsqpy.common.lookup_protocol import (
    OK,
    LookupServerConnection,
    encode_error,
    encode_response,
    identify_reply,
)
from nsqpy.common.names import is_ephemeral
from nsqpy.common.version import VERSION
from nsqpy.daemon.http_server import serve_http
from nsqpy.daemon.log import keep_printable
from nsqpy.daemon.net import accept_forever, peer_address
from nsqpy.nsqlookupd.options import Options
from nsqpy.nsqlookupd.registry import ANY, PeerInfo, RegistrationDB

# Official nsqd pings every 15 s; a peer silent for longer than this is gone (docs/protocol.md §8
# #12: no read deadline shorter than 30 s). Go's nsqlookupd sets none; one keeps dead peers from
# holding registrations forever once their TCP connection is half-open.
PEER_READ_TIMEOUT = 60.0
RECEIVE_SIZE = 64 * 1024
# nsqlookupd's HTTP API takes no bodies worth the name.
HTTP_MAX_BODY = 1024 * 1024


class NSQLookupd:
    def __init__(self, options: Options, log: logging.Logger | None = None) -> None:
        self.options = options
        self.log = keep_printable(log or logging.getLogger("nsqlookupd"))
        self.db = RegistrationDB()
        self.hostname = socket.gethostname()
        self.tcp_address: str | None = None
        self.http_address: str | None = None
        # Youzan topic attributes set by POST /topic/create (partition_num, ordered, ...).
        self.topic_meta: dict[str, dict] = {}
        # Youzan's POST /disable/write: None, "all" or "ordered".
        self.write_disabled: str | None = None
        self._shutdown = trio.Event()
        # Cluster mode (docs/design.md §14): the cluster's metadata, and the master's work.
        self.coordinator = None
        self.operations = None
        if options.cluster_leadership_addresses:
            from nsqpy.nsqlookupd.coordinator import Coordinator
            from nsqpy.nsqlookupd.operations import ClusterOperations

            self.coordinator = Coordinator(self)
            self.operations = ClusterOperations(self.coordinator)

    @property
    def tcp_port(self) -> int:
        return int(self.tcp_address.rsplit(":", 1)[1]) if self.tcp_address else 0

    @property
    def http_port(self) -> int:
        return int(self.http_address.rsplit(":", 1)[1]) if self.http_address else 0

    def shutdown(self) -> None:
        self._shutdown.set()

    async def serve(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        from nsqpy.nsqlookupd.http_api import HTTPAPI

        # On the daemon's network (`nsqpy/network.py`): sockets, or a simulator's.
        through = network.current()
        tcp_listener = await through.listen(self.options.tcp_address)
        self.tcp_address = network.listening_on(tcp_listener)
        self.log.info("TCP: listening on %s", self.tcp_address)
        http_listener = await through.listen(self.options.http_address)
        self.http_address = network.listening_on(http_listener)
        self.log.info("HTTP: listening on %s", self.http_address)
        http_api = HTTPAPI(self)
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(
                    accept_forever, tcp_listener, self._serve_peer, nursery, self.log, "TCP"
                )
                nursery.start_soon(
                    partial(
                        serve_http,
                        http_listener,
                        http_api.router,
                        nursery,
                        self.log,
                        max_body_size=HTTP_MAX_BODY,
                    )
                )
                if self.coordinator is not None:
                    await nursery.start(self.coordinator.run)
                task_status.started(self)
                await self._shutdown.wait()
                nursery.cancel_scope.cancel()
        finally:
            with trio.CancelScope(shield=True):
                await tcp_listener.aclose()
                await http_listener.aclose()

    # -- TCP: nsqd peers -----------------------------------------------------------------

    async def _serve_peer(self, stream: trio.SocketStream) -> None:
        remote = peer_address(stream)
        self.log.info("TCP: new client(%s)", remote)
        connection = LookupServerConnection()
        peer: PeerInfo | None = None
        try:
            while True:
                with trio.move_on_after(PEER_READ_TIMEOUT) as deadline:
                    data = await stream.receive_some(RECEIVE_SIZE)
                if deadline.cancelled_caught:
                    self.log.error("CLIENT(%s): read timeout", remote)
                    return
                try:
                    if not data:
                        connection.receive_eof()
                        return
                    replies = []
                    commands = connection.receive_data(data)
                    while commands:
                        for command in commands:
                            reply, peer = self._execute(command, peer, remote)
                            replies.append(encode_response(reply))
                        commands = connection.receive_data(b"")
                except ProtocolError as error:
                    self.log.error("CLIENT(%s): %s", remote, error.text)
                    replies.append(encode_error(error))
                    await stream.send_all(b"".join(replies))
                    return
                if replies:
                    await stream.send_all(b"".join(replies))
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        except Exception:
            self.log.exception("CLIENT(%s): internal error, closing the connection", remote)
        finally:
            if peer is not None:
                self._forget_peer(peer, remote)
            with trio.CancelScope(shield=True):
                await stream.aclose()
            self.log.info("CLIENT(%s): closing", remote)

    def _execute(self, command, peer: PeerInfo | None, remote: str):
        name = command.name
        if name == "PING":
            if peer is not None:
                peer.last_update = time.time_ns()
            return OK, peer
        if name == "IDENTIFY":
            info = command.identify
            peer = PeerInfo(
                id=remote,
                remote_address=remote,
                hostname=info["hostname"],
                broadcast_address=info["broadcast_address"],
                tcp_port=info["tcp_port"],
                http_port=info["http_port"],
                version=info["version"],
                distributed_id=info.get("distributed_id", ""),
                partitioned=bool(info.get("distributed_id")) or "HA" in info["version"],
            )
            if self.db.add_producer(("client", "", "", None), peer):
                self.log.info("DB: client(%s) REGISTER category:client key: subkey:", remote)
            reply = identify_reply(
                self.options.broadcast_address,
                self.hostname,
                self.http_port,
                self.tcp_port,
                VERSION,
            )
            return reply, peer
        if peer is None:
            # The command parser refuses REGISTER and UNREGISTER before IDENTIFY.
            raise AssertionError(f"{name} before IDENTIFY")
        registration = command.registration
        topic, channel, partition = registration.topic, registration.channel, registration.partition
        if name == "REGISTER":
            if peer.partitioned:
                # Youzan: REGISTER and UNREGISTER also count as a sign of life.
                peer.last_update = time.time_ns()
            if channel:
                if self.db.add_producer(("channel", topic, channel, partition), peer):
                    self.log.info(
                        "DB: client(%s) REGISTER category:channel key:%s subkey:%s",
                        remote,
                        topic,
                        channel,
                    )
            if self.db.add_producer(("topic", topic, "", partition), peer):
                self.log.info(
                    "DB: client(%s) REGISTER category:topic key:%s subkey:", remote, topic
                )
            return OK, peer
        # UNREGISTER
        if peer.partitioned:
            peer.last_update = time.time_ns()
        if channel:
            key = ("channel", topic, channel, partition)
            removed, left = self.db.remove_producer(key, peer.id)
            if removed:
                self.log.info(
                    "DB: client(%s) UNREGISTER category:channel key:%s subkey:%s",
                    remote,
                    topic,
                    channel,
                )
            if left == 0 and is_ephemeral(channel):
                self.db.remove_registration(key)
        else:
            # A topic unregistration also drops this peer's channels of the topic.
            for key in self.db.find_registrations("channel", topic, ANY, partition):
                removed, _left = self.db.remove_producer(key, peer.id)
                if removed:
                    self.log.warning(
                        "client(%s) unexpected UNREGISTER category:channel key:%s subkey:%s",
                        remote,
                        topic,
                        key[2],
                    )
            key = ("topic", topic, "", partition)
            removed, left = self.db.remove_producer(key, peer.id)
            if removed:
                self.log.info(
                    "DB: client(%s) UNREGISTER category:topic key:%s subkey:", remote, topic
                )
            if left == 0 and is_ephemeral(topic):
                self.db.remove_registration(key)
        return OK, peer

    def _forget_peer(self, peer: PeerInfo, remote: str) -> None:
        for registration in self.db.registrations_of_peer(peer.id):
            removed, _left = self.db.remove_producer(registration, peer.id)
            if removed:
                self.log.info(
                    "DB: client(%s) UNREGISTER category:%s key:%s subkey:%s",
                    remote,
                    registration[0],
                    registration[1],
                    registration[2],
                )
