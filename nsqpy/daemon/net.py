"""Listening addresses the way Go NSQ reads them: `host:port` (port 0 is ephemeral) or a path."""

import os
import socket
import ssl
from typing import cast

import trio


def split_address(address: str) -> tuple[str, int] | None:
    """`host:port` (IPv6 in brackets) as Go's net.SplitHostPort reads it; None means the
    address is a unix socket path, as Go nsqd decides (util.TypeOfAddr)."""
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit():
        return None
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    elif ":" in host:
        return None
    return host, int(port)


def format_address(sockname) -> str:
    if isinstance(sockname, str):
        return sockname
    host, port = sockname[0], sockname[1]
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def peer_address(stream: trio.abc.Stream, unknown: str = "unknown") -> str:
    """The address a connected stream's peer connects from; `unknown` once it is gone. A
    stream without a socket (the cluster simulator's) says its peer as `remote_address`."""
    sock = getattr(stream, "socket", None)
    if sock is None:
        return getattr(stream, "remote_address", unknown)
    try:
        return format_address(sock.getpeername())
    except OSError:
        return unknown


async def open_listener(address: str) -> trio.SocketListener:
    """A listener on `host:port` (port 0 binds an ephemeral port) or on a unix socket path."""
    try:
        return await _open_listener(address)
    except OSError as error:
        # Go: `listen (0.0.0.0:4150) failed - listen tcp 0.0.0.0:4150: bind: address in use`
        raise OSError(
            error.errno, f"listen ({address}) failed - {error.strerror or error}"
        ) from None


async def _open_listener(address: str) -> trio.SocketListener:
    parts = split_address(address)
    if parts is None:
        sock = trio.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        if os.path.exists(address):
            os.unlink(address)
        await sock.bind(address)
        sock.listen(socket.SOMAXCONN)
        return trio.SocketListener(sock)
    host, port = parts
    # trio sets SO_REUSEADDR, so a harness can restart us on the same port at once.
    listeners = await trio.open_tcp_listeners(port, host=host or "0.0.0.0")
    for extra in listeners[1:]:
        await extra.aclose()
    return listeners[0]


async def accept_forever(listener, handler, nursery, log, kind: str) -> None:
    """Accept connections for ever, each served by `handler(stream)` in `nursery`. An accept
    error (out of file descriptors, say) is logged and retried shortly, as Go's servers do."""
    while True:
        try:
            stream = await listener.accept()
        except OSError as error:
            log.error("%s: accept error - %s", kind, error)
            await trio.sleep(0.05)
            continue
        nursery.start_soon(handler, stream)
        # Not kept while the next accept waits: a closed connection's stream goes with it.
        del stream


def listening_socket(address: str, backlog: int = 1024) -> socket.socket:
    """A blocking listening socket on `host:port` (port 0 picks one), SO_REUSEADDR set so that a
    harness can start a daemon again on the same port at once; errors read as Go's."""
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit():
        raise OSError(f"listen ({address}) failed - address {address}: missing port in address")
    host = host.strip("[]") or "0.0.0.0"
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        return socket.create_server((host, int(port)), family=family, backlog=backlog)
    except OSError as error:
        raise OSError(
            error.errno, f"listen ({address}) failed - {error.strerror or error}"
        ) from None


def peer_common_name(ssl_object: ssl.SSLObject | trio.SSLStream) -> str:
    """The client certificate's subject CN (sent to the auth server as `common_name`)."""
    certificate = ssl_object.getpeercert()
    # The subject is a tuple of relative names, each a tuple of (key, value) pairs.
    subject = cast(tuple[tuple[tuple[str, str], ...], ...], (certificate or {}).get("subject", ()))
    for entry in subject:
        for key, value in entry:
            if key == "commonName":
                return value
    return ""
