"""How a cluster daemon reaches the other parts of its deployment: the listeners it serves,
the connections it opens (replication peers, nsqlookupd), the HTTP calls it makes of the
others (the master's `/cluster/*`, a node's API), etcd, and the blocking work it gives a
worker thread.

In production that is sockets and trio's threads (`SOCKETS`). The cluster simulator
(`nsqpy/simulation.py`) gives the same daemons a network of its own, in memory, on trio's
virtual clock, where it can cut, pause and delay any link between two hosts
(`nsqpy/simulated_network.py`). A daemon asks `current()` for it: the simulator starts each
daemon in a context that names that daemon's view, and every task the daemon starts
inherits it, as trio's tasks inherit their context. Nothing outside the cluster's paths goes
through it: client connections, the connection poller and the HTTP poller stay on sockets.
"""

import contextlib
import contextvars
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple, Protocol, TypeVar

import trio

from nsqpy.daemon.net import format_address, open_listener
from nsqpy.etcd import SOCKETS as ETCD_SOCKETS
from nsqpy.etcd import EtcdNetwork

T = TypeVar("T")


class HTTPAnswer(NamedTuple):
    """An HTTP call's status and body (an error status included: only no answer at all is
    an OSError)."""

    status: int
    body: bytes

    def ok_body(self) -> bytes:
        """The body of an answer that is not an error; OSError (as urllib's HTTPError was)
        naming the status and the start of the body otherwise."""
        if self.status >= 400:
            text = self.body[:200].decode(errors="replace")
            raise OSError(f"HTTP Error {self.status}: {text}")
        return self.body


class Network(Protocol):
    etcd: EtcdNetwork

    async def listen(self, address: str) -> trio.abc.Listener[trio.abc.Stream]:
        """A listener on `host:port` (port 0: one is chosen; `bound_address` says which)."""

    async def connect(self, host: str, port: int) -> trio.abc.Stream:
        """A connection to `host:port`; OSError when none can be made."""

    async def request(
        self,
        method: str,
        url: str,
        *,
        timeout: float,
        headers: dict[str, str] | None = None,
        abandon_on_cancel: bool = True,
    ) -> HTTPAnswer:
        """One HTTP request (a POST with an empty body); OSError when no answer came within
        `timeout`."""

    async def run_sync(
        self, function: Callable[..., T], *args: Any, abandon_on_cancel: bool = False
    ) -> T:
        """`function(*args)`, blocking work (a file's write, a disk's read), off the loop."""


def listening_on(listener: trio.abc.Listener) -> str:
    """What `listener` took, as the daemons log it: `host:port`, or a unix socket's path."""
    sock = getattr(listener, "socket", None)
    if sock is not None:
        return format_address(sock.getsockname())
    host, port = listener.address  # type: ignore[attr-defined]
    return format_address((host, port))


def bound_address(listener: trio.abc.Listener) -> tuple[str, int]:
    """The host and port `listener` took."""
    sock = getattr(listener, "socket", None)
    if sock is not None:
        host, port = sock.getsockname()[:2]
        return host, port
    return listener.address  # type: ignore[attr-defined]


class SocketNetwork:
    """TCP, urllib in a worker thread for the HTTP calls (imported on the first: with
    `http.client` and `email` it is 2 MiB resident), trio's worker threads."""

    etcd: EtcdNetwork = ETCD_SOCKETS

    async def listen(self, address: str) -> trio.abc.Listener[trio.abc.Stream]:
        return await open_listener(address)

    async def connect(self, host: str, port: int) -> trio.abc.Stream:
        return await trio.open_tcp_stream(host, port)

    async def request(
        self,
        method: str,
        url: str,
        *,
        timeout: float,
        headers: dict[str, str] | None = None,
        abandon_on_cancel: bool = True,
    ) -> HTTPAnswer:
        return await trio.to_thread.run_sync(
            _urllib_request, method, url, timeout, headers, abandon_on_cancel=abandon_on_cancel
        )

    async def run_sync(
        self, function: Callable[..., T], *args: Any, abandon_on_cancel: bool = False
    ) -> T:
        return await trio.to_thread.run_sync(function, *args, abandon_on_cancel=abandon_on_cancel)


def bearer(secret: str) -> dict[str, str]:
    """The headers of a call as the cluster's own caller (`--cluster-secret`, if any)."""
    return {"Authorization": f"Bearer {secret}"} if secret else {}


def _urllib_request(
    method: str, url: str, timeout: float, headers: dict[str, str] | None
) -> HTTPAnswer:
    import urllib.error
    import urllib.request

    data = b"" if method == "POST" else None
    request = urllib.request.Request(url, data=data, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return HTTPAnswer(response.status, response.read())
    except urllib.error.HTTPError as error:
        return HTTPAnswer(error.code, error.read())


SOCKETS: Network = SocketNetwork()

_CURRENT: contextvars.ContextVar[Network] = contextvars.ContextVar("nsqpy_network", default=SOCKETS)


def current() -> Network:
    """The network of the daemon whose task asks."""
    return _CURRENT.get()


@contextlib.contextmanager
def using(network: Network) -> Iterator[None]:
    """Tasks started from here on (and their children) reach the others through `network`."""
    token = _CURRENT.set(network)
    try:
        yield
    finally:
        _CURRENT.reset(token)
