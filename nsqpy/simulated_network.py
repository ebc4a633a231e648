"""The cluster simulator's network (`nsqpy/simulation.py`): hosts, their listeners and the
connections between them, in memory, on trio's clock, with the faults a real network has.

Each daemon is given the view of its host (`host(address)`, a `nsqpy.network.Network`):
listening on `<its address>:0` takes the host's next port, connecting reaches a listener of
any host, an HTTP call is one request and its answer over such a connection (the daemons'
own HTTP servers answer it), and work for a worker thread runs inline, so nothing happens
outside the run's order. etcd is the etcd model's network (`nsqpy/etcd_model_network.py`).

A connection is two pipes of chunks. A chunk is delivered `latency` after it was sent and in
order. The faults (each cut and each slow link can overlap others, and is taken back alone):

* `cut(a, b)`: nothing `a` sends reaches `b` (and, unless `one_way`, the reverse) until
  `heal`: what is sent meanwhile waits, as TCP retransmits it, and arrives on healing; a new
  connection between them waits for the cut to heal (a SYN that gets no answer).
* `slow(a, b, seconds)`: chunks between them wait up to `seconds` more, drawn from the seed
  (the order within a connection is kept; connections overtake each other).
* `crash(host)`: the host's listeners go and each of its connections is reset; the far end
  reads a BrokenResourceError once what was already sent to it is read.
"""

import errno
import math
import random
import urllib.parse
import weakref
from collections import Counter, deque
from collections.abc import Callable
from typing import Any, TypeVar

import trio

from nsqpy.common.http_response import ResponseParser
from nsqpy.etcd import EtcdNetwork, _Endpoint, _NotSent
from nsqpy.network import HTTPAnswer

__all__ = ["SimulatedNetwork", "HostNetwork"]

T = TypeVar("T")
_RESET = object()
_EOF = object()
FIRST_PORT = 10_000
# Where the ports a connection comes from are counted (one count for every host).
EPHEMERAL_PORTS = 40_000


class _Pipe:
    """One direction of a connection: chunks from `source` to `target`, each with the time
    it may be read."""

    def __init__(self, network: "SimulatedNetwork", source: str, target: str) -> None:
        self.network = network
        self.source = source
        self.target = target
        self.chunks: deque[tuple[float, Any]] = deque()
        self.waiting = trio.lowlevel.ParkingLot()

    def put(self, item: Any) -> None:
        at = trio.current_time() + self.network.delay(self.source, self.target)
        if self.chunks:
            at = max(at, self.chunks[-1][0])  # a stream keeps its order
        self.chunks.append((at, item))
        self.waiting.unpark_all()

    async def take(self, max_bytes: int) -> bytes:
        """The next bytes that arrived (b"" at the other end's close); BrokenResourceError at
        its reset."""
        while True:
            deadline = math.inf
            if self.chunks and not self.network.is_cut(self.source, self.target):
                at, item = self.chunks[0]
                if at <= trio.current_time():
                    if item is _EOF:
                        return b""
                    if item is _RESET:
                        raise trio.BrokenResourceError("connection reset by peer")
                    if len(item) > max_bytes:
                        self.chunks[0] = (at, item[max_bytes:])
                        return item[:max_bytes]
                    self.chunks.popleft()
                    return item
                deadline = at
            if deadline == math.inf:
                await self.waiting.park()
                continue
            with trio.move_on_at(deadline):
                await self.waiting.park()


class SimulatedStream(trio.abc.HalfCloseableStream):
    """One end of a simulated connection."""

    def __init__(self, incoming: _Pipe, outgoing: _Pipe, remote_address: str) -> None:
        self._incoming = incoming
        self._outgoing = outgoing
        self.remote_address = remote_address
        self._closed = False
        self._eof_sent = False
        # Set when the far end was reset (its host crashed): sending fails, as after an RST.
        self.broken = False
        self.peer: SimulatedStream | None = None

    @property
    def host(self) -> str:
        return self._outgoing.source

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        if self._closed:
            raise trio.ClosedResourceError("the stream is closed")
        if self._eof_sent:
            raise trio.ClosedResourceError("the stream's write side is closed")
        if self.broken:
            raise trio.BrokenResourceError("connection reset by peer")
        if data:
            self._outgoing.put(bytes(data))
        await trio.lowlevel.checkpoint()

    async def wait_send_all_might_not_block(self) -> None:
        await trio.lowlevel.checkpoint()

    async def send_eof(self) -> None:
        if not self._eof_sent and not self._closed:
            self._eof_sent = True
            self._outgoing.put(_EOF)
        await trio.lowlevel.checkpoint()

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        if self._closed:
            raise trio.ClosedResourceError("the stream is closed")
        return await self._incoming.take(max_bytes or 65536)

    def reset(self) -> None:
        """The host went: the far end reads a reset after what it was sent."""
        if not self._closed:
            self._closed = True
            self._outgoing.put(_RESET)
            self._incoming.waiting.unpark_all()
            if self.peer is not None:
                self.peer.broken = True

    async def aclose(self) -> None:
        if not self._closed:
            self._closed = True
            if not self._eof_sent:
                self._outgoing.put(_EOF)
            self._outgoing.network.forget(self)
            self._incoming.waiting.unpark_all()
        await trio.lowlevel.checkpoint()


class SimulatedListener(trio.abc.Listener[trio.abc.Stream]):
    def __init__(self, network: "SimulatedNetwork", address: tuple[str, int]) -> None:
        self.network = network
        self.address = address
        self.pending: deque[SimulatedStream] = deque()
        self.waiting = trio.lowlevel.ParkingLot()
        self.closed = False

    async def accept(self) -> trio.abc.Stream:
        while not self.pending:
            if self.closed:
                raise trio.ClosedResourceError("the listener is closed")
            await self.waiting.park()
        stream = self.pending.popleft()
        await trio.lowlevel.checkpoint()
        return stream

    async def aclose(self) -> None:
        self.close()
        await trio.lowlevel.checkpoint()

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.network.listeners.pop(self.address, None)
            self.waiting.unpark_all()


class SimulatedNetwork:
    """Every host's connections and listeners; `etcd`, how the hosts reach the etcd model."""

    def __init__(self, etcd: EtcdNetwork, rng: random.Random, *, latency: float = 0.0) -> None:
        self.etcd = etcd
        self.rng = rng
        self.latency = latency
        # Links made slow (`slow`): the most a chunk on them waits beyond `latency`.
        self._jitter: dict[tuple[str, str], float] = {}
        self.listeners: dict[tuple[str, int], SimulatedListener] = {}
        self._next_port: dict[str, int] = {}
        self._ephemeral = EPHEMERAL_PORTS
        # Each cut of a direction counts: faults that overlap heal one at a time.
        self._cuts: Counter[tuple[str, str]] = Counter()
        self._healed = trio.lowlevel.ParkingLot()
        # Each host's streams, in the order they were made (a set would order a crash's resets,
        # and the random delays they draw, by the objects' addresses).
        self._streams: dict[str, dict[SimulatedStream, None]] = {}
        self._pipes: weakref.WeakSet[_Pipe] = weakref.WeakSet()
        # Hosts that crashed and have not started again: whatever of them still runs (its
        # shutdown code) reaches nobody.
        self.crashed: set[str] = set()
        # Each host's connections to etcd (`HostEtcd`).
        self._etcd_streams: dict[str, dict[trio.abc.Stream, None]] = {}

    def host(self, address: str) -> "HostNetwork":
        return HostNetwork(self, address)

    # -- faults --------------------------------------------------------------------------

    def cut(self, a: str, b: str, *, one_way: bool = False) -> None:
        self._cuts[(a, b)] += 1
        if not one_way:
            self._cuts[(b, a)] += 1

    def uncut(self, a: str, b: str, *, one_way: bool = False) -> None:
        """Take back one `cut` of the same hosts."""
        self._cuts[(a, b)] -= 1
        if not one_way:
            self._cuts[(b, a)] -= 1
        self._cuts = +self._cuts
        self._wake_all()

    def heal(self) -> None:
        """Every cut and slow link ends."""
        self._cuts.clear()
        self._jitter.clear()
        self._wake_all()

    def slow(self, a: str, b: str, seconds: float) -> None:
        """Chunks between `a` and `b` wait up to `seconds` more, at random (in order)."""
        self._jitter[(a, b)] = self._jitter[(b, a)] = seconds

    def unslow(self, a: str, b: str) -> None:
        self._jitter.pop((a, b), None)
        self._jitter.pop((b, a), None)

    def delay(self, source: str, target: str) -> float:
        jitter = self._jitter.get((source, target))
        return self.latency + (self.rng.uniform(0, jitter) if jitter else 0.0)

    def _wake_all(self) -> None:
        self._healed.unpark_all()
        for pipe in self._pipes:
            pipe.waiting.unpark_all()

    def is_cut(self, source: str, target: str) -> bool:
        return self._cuts.get((source, target), 0) > 0

    def crash(self, host: str) -> None:
        self.crashed.add(host)
        for address, listener in list(self.listeners.items()):
            if address[0] == host:
                listener.close()
        for stream in self._streams.pop(host, {}):
            stream.reset()
        for etcd_stream in self._etcd_streams.pop(host, {}):
            # Its kernel closes the dead process's connections: etcd sees them end, and no
            # request its shutdown code makes (a lease's revocation) gets there.
            assert isinstance(etcd_stream, trio.StapledStream)
            etcd_stream.send_stream.close()

    def revive(self, host: str) -> None:
        """The host starts again: listening as it did takes the ports it had (a restarted
        daemon binds its configured ports again)."""
        self.crashed.discard(host)
        self._next_port.pop(host, None)

    def forget(self, stream: SimulatedStream) -> None:
        self._streams.get(stream.host, {}).pop(stream, None)

    # -- connections ---------------------------------------------------------------------

    def listen(self, host: str, port: int) -> SimulatedListener:
        if port == 0:
            port = self._next_port.get(host, FIRST_PORT)
            self._next_port[host] = port + 1
        address = (host, port)
        if address in self.listeners:
            raise OSError(errno.EADDRINUSE, f"listen ({host}:{port}) failed - address in use")
        listener = self.listeners[address] = SimulatedListener(self, address)
        return listener

    async def connect(self, source: str, host: str, port: int) -> SimulatedStream:
        if source in self.crashed:
            raise OSError(errno.ENETDOWN, f"{source} is down")
        while self.is_cut(source, host) or self.is_cut(host, source):
            await self._healed.park()
        await trio.sleep(self.delay(source, host))
        listener = self.listeners.get((host, port))
        if listener is None:
            raise ConnectionRefusedError(errno.ECONNREFUSED, f"connect {host}:{port}: refused")
        there = _Pipe(self, source, host)
        back = _Pipe(self, host, source)
        self._pipes.add(there)
        self._pipes.add(back)
        self._ephemeral += 1
        client = SimulatedStream(back, there, f"{host}:{port}")
        server = SimulatedStream(there, back, f"{source}:{self._ephemeral}")
        client.peer, server.peer = server, client
        self._streams.setdefault(source, {})[client] = None
        self._streams.setdefault(host, {})[server] = None
        listener.pending.append(server)
        listener.waiting.unpark_all()
        return client


class HostEtcd:
    """etcd as a host reaches it (`nsqpy.etcd.EtcdNetwork`): the etcd model's network, while
    the host runs."""

    def __init__(self, network: SimulatedNetwork, address: str) -> None:
        self.network = network
        self.address = address

    async def connect(self, endpoint: _Endpoint, ssl_context: Any) -> trio.abc.Stream:
        if self.address in self.network.crashed:
            await trio.lowlevel.checkpoint()
            raise _NotSent(f"connect failed: {self.address} is down")
        stream = await self.network.etcd.connect(endpoint, ssl_context)
        self.network._etcd_streams.setdefault(self.address, {})[stream] = None
        return stream

    def dropped(self, stream: trio.abc.Stream) -> bool:
        return self.network.etcd.dropped(stream)

    def close(self, stream: trio.abc.Stream) -> None:
        self.network._etcd_streams.get(self.address, {}).pop(stream, None)
        self.network.etcd.close(stream)


class HostNetwork:
    """The network as a daemon on `address` has it (`nsqpy.network.Network`)."""

    def __init__(self, network: SimulatedNetwork, address: str) -> None:
        self.network = network
        self.address = address
        self.etcd: EtcdNetwork = HostEtcd(network, address)

    async def listen(self, address: str) -> trio.abc.Listener[trio.abc.Stream]:
        _host, _, port = address.rpartition(":")
        await trio.lowlevel.checkpoint()
        if self.address in self.network.crashed:
            raise OSError(errno.ENETDOWN, f"{self.address} is down")
        return self.network.listen(self.address, int(port))

    async def connect(self, host: str, port: int) -> trio.abc.Stream:
        return await self.network.connect(self.address, host, port)

    async def request(
        self,
        method: str,
        url: str,
        *,
        timeout: float,
        headers: dict[str, str] | None = None,
        abandon_on_cancel: bool = True,
    ) -> HTTPAnswer:
        parts = urllib.parse.urlsplit(url)
        target = parts.path + (f"?{parts.query}" if parts.query else "")
        return await self.exchange(
            parts.hostname or "", parts.port or 80, method, target, b"", timeout, headers
        )

    async def exchange(
        self,
        host: str,
        port: int,
        method: str,
        target: str,
        body: bytes,
        timeout: float,
        headers: dict[str, str] | None = None,
    ) -> HTTPAnswer:
        """One HTTP/1.1 request with `body` and its answer, on a connection of its own."""
        lines = [f"{method} {target} HTTP/1.1", f"Host: {host}:{port}", "Connection: close"]
        if method != "GET" or body:
            lines.append(f"Content-Length: {len(body)}")
        lines += [f"{name}: {value}" for name, value in (headers or {}).items()]
        request = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body
        with trio.move_on_after(timeout) as waited:
            stream = await self.connect(host, port)
            try:
                await stream.send_all(request)
                parser = ResponseParser(OSError)
                answer = bytearray()
                while not parser.complete:
                    data = await stream.receive_some()
                    if not data:
                        raise ConnectionResetError(errno.ECONNRESET, "the answer ended early")
                    parser.feed(data)
                    answer += parser.take_body()
                return HTTPAnswer(parser.status, bytes(answer))
            except trio.BrokenResourceError as error:
                raise ConnectionResetError(errno.ECONNRESET, str(error)) from None
            finally:
                with trio.CancelScope(shield=True):
                    await stream.aclose()
        assert waited.cancelled_caught
        raise TimeoutError(errno.ETIMEDOUT, "timed out")

    async def run_sync(
        self, function: Callable[..., T], *args: Any, abandon_on_cancel: bool = False
    ) -> T:
        await trio.lowlevel.checkpoint()
        return function(*args)
