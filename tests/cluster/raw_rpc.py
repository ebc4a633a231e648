"""Speaking to a node's replication port by hand, as a peer the node does not trust might."""

import socket
import ssl

from nsqpy.common.replication import Frame, FrameReader, ReplicationProtocolError


def raw_exchange(port: int, frame: bytes, context: ssl.SSLContext | None = None) -> bytes:
    """Send `frame` to a replication port (over TLS with `context`), and what comes back
    before the peer closes or goes quiet."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=3)
    try:
        if context is not None:
            sock = context.wrap_socket(sock, server_hostname="127.0.0.1")
        sock.sendall(frame)
        received = b""
        while True:
            try:
                data = sock.recv(65536)
            except (TimeoutError, ssl.SSLError, ConnectionResetError):
                break
            if not data:
                break
            received += data
        return received
    finally:
        sock.close()


def frames_of(data: bytes) -> list[Frame]:
    try:
        return FrameReader().receive_data(data)
    except ReplicationProtocolError:
        return []
