"""This nsqd process as one of `--workers=N` (docs/design.md §15).

The supervisor (`nsqd/supervisor.py`) binds the listeners and starts N worker processes; each
is a whole nsqd (`NSQD` with a `Worker`) serving the shared listeners, owning the topics whose
name hashes to it. What a worker does for the others:

- a connection whose first topic command names a topic another worker owns moves there
  (`nsqd/handoff.py`); a later publish to another worker's topic is forwarded over a link to
  its owner and answered with the owner's reply;
- nsqlookupd hears of this worker's topics and channels through the supervisor, which holds
  the one registration of the node (`WorkerLookup`);
- `nsqd.dat` holds every worker's topics: each rewrites its own share under a file lock;
- the HTTP API routes a topic's request to its owner and merges `/stats` and `/metrics`
  (`nsqd/worker_http.py`).
"""

import collections
import ctypes
import fcntl
import hashlib
import json
import math
import os
import signal
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING

import trio

from nsqpy.common.command import MAGIC_V2, encode_identify
from nsqpy.common.frame import FrameDecoder
from nsqpy.common.version import VERSION
from nsqpy.nsqd.handoff import Handoff, receive, send, worker_socket_address
from nsqpy.nsqd.lookup import LookupPeers
from nsqpy.nsqd.metadata import (
    MetadataError,
    TopicMetadata,
    encode_metadata,
    read_metadata,
    write_metadata,
)

if TYPE_CHECKING:
    from nsqpy.daemon.http_poller import HTTPPoller
    from nsqpy.nsqd.server import NSQD

# The environment variable that makes an nsqd process a worker: "index,count,token,control fd,
# tcp fd,http fd,https fd,secret,rpc fds" (-1: none; the rpc fds ";" between them).
WORKER_ENVIRONMENT = "NSQPY_WORKER"
# How many (topic, partition) owners a worker keeps computed (`Worker.owner`).
_OWNERS_KEPT = 100_000
# How often a worker tells its supervisor that its event loop runs.
BEAT_INTERVAL = 0.5
# A forwarded publish gets its owner's answer within this, or fails.
FORWARD_TIMEOUT = 30.0


def owner_of(topic: str, partition: int, count: int) -> int:
    """The worker that owns a topic's partition: the same on every worker and across
    restarts. A topic's partitions go round the workers from the one its name hashes to, so
    partition 0 (a classic topic, the default partition) stays where the name alone put it.
    BLAKE2b rather than CRC-32, whose low bits barely change between `t_0`, `t_1`, ... (all
    four of the benchmark's topics went to one of two workers)."""
    digest = hashlib.blake2b(topic.encode(), digest_size=8).digest()
    return (int.from_bytes(digest, "big") + max(partition, 0)) % count


def die_with_parent() -> None:
    """A worker is part of one nsqd: when its supervisor is killed (`kill -9`), the kernel
    kills the worker too, as it would have killed one process (Linux's PR_SET_PDEATHSIG).
    A supervisor that exits otherwise is noticed on the control socket (`_read_control`)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):
        return
    if os.getppid() == 1:  # the supervisor died before the request took effect
        os._exit(1)


_PR_SET_PDEATHSIG = 1


def encode_control(message: dict) -> bytes:
    """One message on a control socket between the supervisor and a worker: a JSON line."""
    return json.dumps(message).encode() + b"\n"


async def control_messages(control: trio.SocketStream) -> AsyncIterator[dict]:
    """The messages `encode_control` wrote on the other end, until that end is gone."""
    buffered = b""
    while True:
        try:
            data = await control.receive_some(64 * 1024)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            return
        if not data:
            return
        buffered += data
        *lines, buffered = buffered.split(b"\n")
        for line in lines:
            yield json.loads(line)


class WorkerSetup:
    """What the supervisor passes a worker in `WORKER_ENVIRONMENT`."""

    def __init__(self, text: str) -> None:
        fields = text.split(",")
        self.index, self.count = int(fields[0]), int(fields[1])
        self.token = fields[2]
        self.control_fd, self.tcp_fd, self.http_fd, self.https_fd = map(int, fields[3:7])
        # What a worker's HTTP request to another carries once it checked the client's
        # credential itself (`Authorization: Bearer`): the client's address is its own.
        self.secret = fields[7]
        # A cluster node's replication listeners (`--rpc-port`), ";" between them.
        self.rpc_fds = [int(fd) for fd in fields[8].split(";") if fd]

    @staticmethod
    def encode(
        index: int,
        count: int,
        token: str,
        fds: tuple[int, int, int, int],
        secret: str,
        rpc_fds: list[int],
    ) -> str:
        rpc = ";".join(map(str, rpc_fds))
        return ",".join(map(str, (index, count, token, *fds, secret, rpc)))


class Worker:
    def __init__(self, setup: WorkerSetup) -> None:
        self.index = setup.index
        self.count = setup.count
        self.token = setup.token
        self.secret = setup.secret
        self.setup = setup
        # Each worker's private HTTP address, for requests routed to a topic's owner.
        self.peers_http: dict[int, str] = {}
        self.lookupd_http: list[str] = []
        # The workers' health as each last told the supervisor (`NSQD.health`).
        self.health: dict[int, str] = {}
        self._peers_known = trio.Event()
        self._links: dict[int, ForwardLink] = {}
        self._nursery: trio.Nursery | None = None
        self.http_poller: HTTPPoller | None = None
        self._http_poller_ready = trio.Event()
        self._outbox_send, self._outbox = trio.open_memory_channel[dict](math.inf)
        self._owners: dict[tuple[str, int], int] = {}

    # -- topics --------------------------------------------------------------------------------

    def owns(self, topic: str, partition: int) -> bool:
        return self._owner_of(topic, partition) == self.index

    def owner(self, topic: str, partition: int) -> int:
        """The worker owning the topic's partition (-1: the default one, where partition 0
        is); `nsqd/placement.py` asks, for every command and request naming a topic, so the
        hash is kept."""
        return self._owner_of(topic, partition)

    def _owner_of(self, topic: str, partition: int) -> int:
        key = (topic, partition)
        owner = self._owners.get(key)
        if owner is None:
            if len(self._owners) >= _OWNERS_KEPT:
                self._owners.clear()
            owner = self._owners[key] = owner_of(topic, partition, self.count)
        return owner

    def listener_socket(self, kind: str) -> socket.socket | None:
        """The supervisor's listener of `kind` ("TCP", "HTTP", "HTTPS"), None without one."""
        setup = self.setup
        fds = {"TCP": setup.tcp_fd, "HTTP": setup.http_fd, "HTTPS": setup.https_fd}
        return None if fds[kind] < 0 else socket.socket(fileno=fds[kind])

    def rpc_listeners(self) -> list[trio.SocketListener]:
        """The supervisor's replication listeners (a cluster node's `--rpc-port`)."""
        return [
            trio.SocketListener(trio.socket.from_stdlib_socket(socket.socket(fileno=fd)))
            for fd in self.setup.rpc_fds
        ]

    # -- the supervisor ------------------------------------------------------------------------

    def tell(self, message: dict) -> None:
        self._outbox_send.send_nowait(message)

    async def run(
        self,
        nsqd: "NSQD",
        handle_handed: Callable[[socket.socket, Handoff], Awaitable[None]],
        private_http: str,
        *,
        task_status=trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Talk to the supervisor and take handed connections until cancelled; started once
        the peers' addresses are known."""
        control = trio.SocketStream(
            trio.socket.from_stdlib_socket(socket.socket(fileno=self.setup.control_fd))
        )
        listener = trio.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        await listener.bind(worker_socket_address(self.token, self.index))
        listener.listen(socket.SOMAXCONN)
        self.tell({"http": private_http, "registrations": nsqd.registrations()})
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            nursery.start_soon(self._write_control, control)
            nursery.start_soon(self._read_control, nsqd, control)
            nursery.start_soon(self._beat)
            nursery.start_soon(self._accept_handoffs, listener, handle_handed, nursery)
            await self._peers_known.wait()
            task_status.started()

    async def _beat(self) -> None:
        """Tell the supervisor this worker's event loop runs (`Supervisor._watch_workers`)."""
        while True:
            self.tell({"beat": True})
            await trio.sleep(BEAT_INTERVAL)

    async def _write_control(self, control: trio.SocketStream) -> None:
        async for message in self._outbox:
            await control.send_all(encode_control(message))

    async def _read_control(self, nsqd: "NSQD", control: trio.SocketStream) -> None:
        async for message in control_messages(control):
            self._apply(nsqd, message)
        # The supervisor is gone: a worker never outlives it.
        nsqd.log.error("WORKER(%d): the supervisor is gone; exiting", self.index)
        nsqd.shutdown()

    def _apply(self, nsqd: "NSQD", message: dict) -> None:
        if "peers" in message:
            self.peers_http = {int(index): address for index, address in message["peers"].items()}
            if len(self.peers_http) == self.count:
                self._peers_known.set()
        if "lookupd_http" in message:
            self.lookupd_http = list(message["lookupd_http"])
        if "health" in message:
            self.health = {int(index): text for index, text in message["health"].items()}

    def peers_health(self) -> str:
        """The first worker's health that is not OK, as the supervisor last told, else OK."""
        return next((text for _, text in sorted(self.health.items()) if text != "OK"), "OK")

    async def _accept_handoffs(self, listener, handle_handed, nursery: trio.Nursery) -> None:
        with listener:
            while True:
                connection, _ = await listener.accept()
                nursery.start_soon(self._take_handoff, connection, handle_handed)

    async def _take_handoff(self, connection, handle_handed) -> None:
        try:
            handed, handoff = await receive(connection)
        except OSError:
            return
        if not handoff.http:
            await handle_handed(handed, handoff)
            return
        # A worker still starting serves HTTP only once it knows its peers, while the others
        # may already hand it connections.
        await self._http_poller_ready.wait()
        assert self.http_poller is not None
        self.http_poller.adopt(handed, handoff.remote_address, handoff.pending)

    def take_http_poller(self, poller: "HTTPPoller") -> None:
        """The poller of the shared HTTP listener, which takes the HTTP connections other
        workers hand over."""
        self.http_poller = poller
        self._http_poller_ready.set()

    # -- moving and forwarding -------------------------------------------------------------------

    async def hand_off(self, owner: int, descriptor: int, handoff: Handoff) -> None:
        await send(worker_socket_address(self.token, owner), descriptor, handoff)

    async def hand_off_pair(self, owner: int, handoff: Handoff) -> trio.SocketStream:
        """This end of a socket pair whose other end worker `owner` took as `handoff` says
        (a relayed client, or a link of the workers' own)."""
        ours, theirs = socket.socketpair()
        try:
            with theirs:
                await self.hand_off(owner, theirs.fileno(), handoff)
        except BaseException:
            ours.close()
            raise
        return trio.SocketStream(trio.socket.from_stdlib_socket(ours))

    async def forward(self, owner: int, command: bytes) -> "Forwarded":
        """Send a publish to the worker owning its topic; its answer comes later."""
        link = self._links.get(owner)
        if link is None or link.broken:
            assert self._nursery is not None
            link = self._links[owner] = ForwardLink(self, owner, self._nursery)
        return await link.send(command)

    # -- nsqd.dat ------------------------------------------------------------------------------

    def write_metadata_share(self, data_path: str, own: list[TopicMetadata]) -> None:
        """Rewrite nsqd.dat with this worker's topics in place of what it held of them, the
        other workers' entries as they are (blocking: run it in a thread)."""
        # The lock is on the data directory itself: no file beside Go's.
        directory = os.open(data_path, os.O_RDONLY)
        try:
            fcntl.flock(directory, fcntl.LOCK_EX)
            try:
                existing = read_metadata(data_path)
            except MetadataError:
                existing = []
            others = [
                topic for topic in existing if not self.owns(topic.name, topic.partition or 0)
            ]
            write_metadata(data_path, encode_metadata([*others, *own], VERSION))
        finally:
            os.close(directory)


class Forwarded:
    """A publish sent to its topic's owner: the owner's answer, once it came."""

    __slots__ = ("_done", "_frame", "_error")

    def __init__(self) -> None:
        self._done = trio.Event()
        self._frame: tuple[int, bytes] | None = None
        self._error: BaseException | None = None

    def resolve(self, frame_type: int, data: bytes) -> None:
        self._frame = (frame_type, data)
        self._done.set()

    def fail(self, error: BaseException) -> None:
        self._error = error
        self._done.set()

    async def answer(self) -> tuple[int, bytes]:
        """(frame type, data) of the owner's answer; OSError-like errors when the link broke
        or the owner did not answer within FORWARD_TIMEOUT."""
        with trio.fail_after(FORWARD_TIMEOUT):
            await self._done.wait()
        if self._error is not None:
            raise self._error
        assert self._frame is not None
        return self._frame


class ForwardLink:
    """One worker's connection to another for the publishes it forwards: a V2 client over a
    socket pair whose other end was handed to the owner as an internal connection. Publishes
    are pipelined: each is sent at once, and a reader task gives the answers, which come in
    order, to their publishes."""

    def __init__(self, worker: Worker, owner: int, nursery: trio.Nursery) -> None:
        self.worker = worker
        self.owner = owner
        self.broken = False
        self._nursery = nursery
        self._stream: trio.SocketStream | None = None
        self._send_lock = trio.Lock()
        self._waiting: collections.deque[Forwarded] = collections.deque()

    async def _connect(self) -> trio.SocketStream:
        identify = encode_identify(
            {"client_id": f"nsqd-worker-{self.worker.index}", "heartbeat_interval": -1}
        )
        handoff = Handoff(
            remote_address=f"worker {self.worker.index}",
            preamble=MAGIC_V2 + identify,
            internal=True,
        )
        stream = await self.worker.hand_off_pair(self.owner, handoff)
        self._nursery.start_soon(self._read_answers, stream)
        return stream

    async def send(self, command: bytes) -> Forwarded:
        forwarded = Forwarded()
        async with self._send_lock:
            try:
                with trio.fail_after(FORWARD_TIMEOUT):
                    if self._stream is None:
                        self._stream = await self._connect()
                    # Queued before it is sent, so the answers meet their publishes in order.
                    self._waiting.append(forwarded)
                    await self._stream.send_all(command)
            except (OSError, trio.BrokenResourceError, trio.ClosedResourceError, trio.TooSlowError):
                self._break(trio.BrokenResourceError("the link to the owning worker broke"))
                raise
        return forwarded

    async def _read_answers(self, stream: trio.SocketStream) -> None:
        decoder = FrameDecoder()
        try:
            while data := await stream.receive_some(64 * 1024):
                for frame in decoder.receive_data(data):
                    # The owner keeps the link open after a refused publish.
                    self._waiting.popleft().resolve(frame.frame_type, frame.data)
        except (OSError, trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        self._break(trio.BrokenResourceError("the owning worker closed the link"))

    def _break(self, error: BaseException) -> None:
        self.broken = True
        while self._waiting:
            self._waiting.popleft().fail(error)


class WorkerLookup(LookupPeers):
    """nsqlookupd as a worker reaches it: through the supervisor, which keeps the one
    connection to each nsqlookupd and registers the union of its workers' topics."""

    def __init__(self, nsqd: "NSQD", worker: Worker) -> None:
        super().__init__(nsqd)
        self.worker = worker

    async def run(self, addresses: list[str]) -> None:
        await trio.sleep_forever()

    def set_addresses(self, addresses: list[str]) -> None:
        self.worker.tell({"lookupd": list(addresses)})

    def notify(
        self, action: str, topic: str, channel: str | None = None, partition: int = 0
    ) -> None:
        self.worker.tell({"notify": [action, topic, channel, partition]})

    def http_addresses(self) -> list[str]:
        return list(self.worker.lookupd_http)
