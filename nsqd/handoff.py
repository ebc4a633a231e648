"""A client connection handed from one nsqd worker to another (docs/design.md §15).

With `--workers=N` every topic has one owning worker. A connection is accepted by whichever
worker the kernel wakes; when its first topic command names a topic another worker owns, the
connection moves there: its descriptor over the owner's Unix socket (SCM_RIGHTS), with what
the owner replays to stand where the sender stood. The replay is the `preamble` (the magic
and the client's IDENTIFY), run with its replies suppressed since the client has had them,
then `pending`: the topic command and whatever the client sent after it, run as usual. What
AUTH granted comes as it is (the auth server is not asked twice).

A connection that negotiated TLS or compression cannot move (its cipher and compressor state
live in the sender); its sender keeps it and relays the plain bytes over a socket pair whose
other end is handed over the same way (`relayed`). Workers also hand each other socket pairs
for their own links (`internal`: publishes forwarded to a topic's owner). A cluster peer's
replication connection moves the same way once its first request names a partition (`rpc`).

`encode` and `decode` are the message; `send` and `receive` move it with the descriptor.
"""

import array
import json
import socket
import struct
from dataclasses import asdict, dataclass, field

import trio

_LENGTH = struct.Struct(">I")
_RECEIVE_SIZE = 64 * 1024


@dataclass
class Handoff:
    remote_address: str
    # Replayed with its replies suppressed (the client has them).
    preamble: bytes = b""
    pending: bytes = b""
    # What the client negotiated with the sender, shown in /stats as its own (a relay).
    tls: bool = False
    tls_common_name: str = ""
    tls_details: dict = field(default_factory=dict)
    snappy: bool = False
    deflate: bool = False
    deflate_level: int = 0
    internal: bool = False
    # An HTTP connection (`pending`: the requests it sent and was not answered).
    http: bool = False
    # A cluster peer's replication connection (`pending`: its first request, which names a
    # partition the receiver owns).
    rpc: bool = False
    # The client's AUTH: its secret and what the auth server granted (`AuthState` as a
    # dict), carried over rather than asked again.
    auth_secret: str = ""
    auth_state: dict | None = None

    def encode(self) -> bytes:
        header = asdict(self)
        preamble, pending = header.pop("preamble"), header.pop("pending")
        header["preamble_length"] = len(preamble)
        raw = json.dumps(header).encode()
        return _LENGTH.pack(len(raw)) + raw + preamble + pending

    @classmethod
    def decode(cls, data: bytes) -> "Handoff":
        (length,) = _LENGTH.unpack_from(data)
        header = json.loads(data[4 : 4 + length])
        body = data[4 + length :]
        split = header.pop("preamble_length")
        return cls(**header, preamble=body[:split], pending=body[split:])


def worker_socket_address(token: str, index: int) -> bytes:
    """The abstract Unix address a worker takes handed connections on (Linux: no file)."""
    return f"\0nsqpy-{token}-{index}".encode()


async def send(address: bytes, descriptor: int, handoff: Handoff) -> None:
    """Hand `descriptor` and `handoff` to the worker listening at `address`; the sender may
    close its own copy of the descriptor once this returns."""
    data = handoff.encode()
    sock = trio.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    with sock:
        await sock.connect(address)
        fds = array.array("i", [descriptor])
        sent = await sock.sendmsg([data], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, fds)])
        while sent < len(data):
            sent += await sock.send(data[sent:])


async def receive(connection: trio.socket.SocketType) -> tuple[socket.socket, Handoff]:
    """The descriptor (as a socket) and message one `send` sent over `connection`."""
    with connection:
        data, ancillary, _flags, _address = await connection.recvmsg(
            _RECEIVE_SIZE, socket.CMSG_SPACE(array.array("i").itemsize)
        )
        descriptors = array.array("i")
        for level, kind, payload in ancillary:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                descriptors.frombytes(payload[: len(payload) - len(payload) % descriptors.itemsize])
        if len(descriptors) != 1:
            for descriptor in descriptors:
                socket.close(descriptor)
            raise OSError("a handoff came without exactly one descriptor")
        handed = socket.socket(fileno=descriptors[0])
        chunks = [data]
        while True:
            chunk = await connection.recv(_RECEIVE_SIZE)
            if not chunk:
                break
            chunks.append(chunk)
    try:
        return handed, Handoff.decode(b"".join(chunks))
    except (ValueError, KeyError, TypeError, struct.error):
        handed.close()
        raise
