"""What the security tests share: certificates, nsqd daemons, a negotiating client, HTTP.

`NegotiatedConnection` is a blocking V2 client that does IDENTIFY feature negotiation the way
go-nsq does, with nothing of nsqd's own stream code on the client side: our codec for the
commands and frames, the stdlib `ssl` for TLS, python-snappy's `StreamCompressor` /
`StreamDecompressor` for the snappy framing format and `zlib` raw DEFLATE (no header,
sync-flushed on every send) for deflate (docs/protocol.md §2.1, "Upgrade order"). It counts the
bytes
that crossed the socket below the compression layer, so a test can tell that a compressed
connection really compressed.

nsqd runs as the console script (`tests.harness.start_nsqd`, ephemeral ports), the way client
harnesses start it, so the flags themselves (`-tls-required=tcp-https`, `-snappy=false`,
`-tls-client-auth-policy`) go through the real command line.
"""

import contextlib
import json
import socket
import ssl
import struct
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import snappy
import trustme

from nsqpy.common.command import MAGIC_V2, NOP, encode_fin, encode_identify, encode_rdy, encode_sub
from nsqpy.common.frame import FRAME_TYPE_ERROR, FRAME_TYPE_MESSAGE, FRAME_TYPE_RESPONSE, Frame
from nsqpy.common.message import DecodedMessage, decode_message
from tests.harness import DaemonProcess, start_nsqd
from tests.support.http import HTTPReply, fetch

HEARTBEAT = b"_heartbeat_"
READ_TIMEOUT = 10.0
_FRAME_HEADER = struct.Struct(">Ii")
# The name the server certificate is issued for, besides 127.0.0.1.
SERVER_NAME = "localhost"
CLIENT_COMMON_NAME = "consumer.nsqpy.test"


# -- certificates ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Certificates:
    """PEM files made by trustme: one CA, nsqd's certificate (127.0.0.1 and localhost), a
    client certificate the CA signed, and a client certificate from a CA nsqd never heard of."""

    ca: str
    server_cert: str
    server_key: str
    client_cert: str
    client_key: str
    stranger_cert: str
    stranger_key: str

    def client_context(self, *, with_certificate: str = "") -> ssl.SSLContext:
        """A client context that verifies nsqd against the CA; `with_certificate` "ca" or
        "stranger" presents that client certificate."""
        context = ssl.create_default_context(cafile=self.ca)
        if with_certificate == "ca":
            context.load_cert_chain(self.client_cert, self.client_key)
        elif with_certificate == "stranger":
            context.load_cert_chain(self.stranger_cert, self.stranger_key)
        return context

    def tls_flags(self) -> list[str]:
        return [
            f"-tls-cert={self.server_cert}",
            f"-tls-key={self.server_key}",
            "-https-address=127.0.0.1:0",
        ]


def make_certificates(directory: Path) -> Certificates:
    ca = trustme.CA()
    server = ca.issue_cert("127.0.0.1", SERVER_NAME)
    client = ca.issue_cert(CLIENT_COMMON_NAME, common_name=CLIENT_COMMON_NAME)
    stranger = trustme.CA().issue_cert("stranger.nsqpy.test", common_name="stranger.nsqpy.test")
    paths = {}
    for name, blob in [
        ("ca", ca.cert_pem),
        ("server_cert", server.cert_chain_pems[0]),
        ("server_key", server.private_key_pem),
        ("client_cert", client.cert_chain_pems[0]),
        ("client_key", client.private_key_pem),
        ("stranger_cert", stranger.cert_chain_pems[0]),
        ("stranger_key", stranger.private_key_pem),
    ]:
        path = directory / f"{name}.pem"
        blob.write_to_path(str(path))
        paths[name] = str(path)
    return Certificates(**paths)


# -- nsqd -------------------------------------------------------------------------------------


@contextlib.contextmanager
def running_nsqd(data_path: Path, *flags: str) -> Iterator[DaemonProcess]:
    """nsqd with these flags for the duration of the block; it must then exit cleanly."""
    listeners = ("TCP", "HTTP")
    if any(flag.startswith("-https-address") for flag in flags):
        listeners += ("HTTPS",)
    daemon = start_nsqd(data_path, *flags, wait_for=listeners)
    try:
        yield daemon
    finally:
        assert daemon.stop() == 0, daemon.log


def http_url(daemon: DaemonProcess, path: str) -> str:
    return f"http://{daemon.addresses['HTTP']}{path}"


def https_url(daemon: DaemonProcess, path: str) -> str:
    return f"https://{daemon.addresses['HTTPS']}{path}"


def http_get(url: str, context: ssl.SSLContext | None = None) -> HTTPReply:
    return fetch(url, context=context, timeout=READ_TIMEOUT)


def find_client_stats(stats: dict, client_id: str) -> dict | None:
    """The CLIENT object of /stats with this client_id, as consumer or producer."""
    for topic in stats.get("topics") or []:
        for channel in topic.get("channels") or []:
            for client in channel.get("clients") or []:
                if client["client_id"] == client_id:
                    return client
    for client in stats.get("producers") or []:
        if client["client_id"] == client_id:
            return client
    return None


def client_stats(url: str, client_id: str, context: ssl.SSLContext | None = None) -> dict:
    """This client's entry of `/stats?format=json` (url up to the host and port)."""
    reply = http_get(f"{url}/stats?format=json", context)
    assert reply.status == 200, reply
    found = find_client_stats(json.loads(reply.body), client_id)
    assert found is not None, f"client {client_id!r} not in /stats: {reply.body[:2000]!r}"
    return found


# -- the negotiating client -------------------------------------------------------------------


class ConnectionClosed(Exception):
    """nsqd closed the connection while a frame was expected."""


def snappy_codec() -> tuple[Callable[[bytes], bytes], Callable[[bytes], bytes]]:
    compressor = snappy.StreamCompressor()
    decompressor = snappy.StreamDecompressor()
    return compressor.add_chunk, decompressor.decompress


def deflate_codec(level: int) -> tuple[Callable[[bytes], bytes], Callable[[bytes], bytes]]:
    compressor = zlib.compressobj(level, zlib.DEFLATED, -zlib.MAX_WBITS)
    decompressor = zlib.decompressobj(-zlib.MAX_WBITS)

    def compress(data: bytes) -> bytes:
        return compressor.compress(data) + compressor.flush(zlib.Z_SYNC_FLUSH)

    return compress, decompressor.decompress


class NegotiatedConnection:
    """One V2 connection; `negotiate()` applies whatever the IDENTIFY reply granted."""

    def __init__(self, port: int, *, timeout: float = READ_TIMEOUT) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        self.transport: socket.socket = self.sock  # becomes the SSLSocket after TLS
        self._compress: Callable[[bytes], bytes] | None = None
        self._decompress: Callable[[bytes], bytes] | None = None
        self._plain = bytearray()  # received bytes after every layer, not yet framed
        self.messages: list[DecodedMessage] = []
        self.upgrade_oks: list[str] = []  # the layers each confirmed by an OK through it
        self.wire_bytes_received = 0  # below compression (above TLS)
        self.plain_bytes_received = 0
        self.transport.sendall(MAGIC_V2)

    # -- sending and reading ---------------------------------------------------------------

    def send(self, data: bytes) -> None:
        if self._compress is not None:
            data = self._compress(data)
        self.transport.sendall(data)

    def _fill(self) -> None:
        try:
            data = self.transport.recv(256 * 1024)
        except ConnectionResetError:
            data = b""
        if not data:
            raise ConnectionClosed("nsqd closed the connection")
        self.wire_bytes_received += len(data)
        if self._decompress is not None:
            data = self._decompress(data)
        self.plain_bytes_received += len(data)
        self._plain += data

    def read_frame(self) -> Frame:
        plain = self._plain
        while True:
            if len(plain) >= _FRAME_HEADER.size:
                size, frame_type = _FRAME_HEADER.unpack_from(plain)
                end = 4 + size
                if len(plain) >= end:
                    frame = Frame(frame_type, bytes(plain[_FRAME_HEADER.size : end]))
                    del plain[:end]
                    return frame
            self._fill()

    def read_response(self) -> Frame:
        """The next response or error frame: heartbeats are answered, messages kept."""
        while True:
            frame = self.read_frame()
            if frame.frame_type == FRAME_TYPE_MESSAGE:
                self.messages.append(decode_message(frame.data))
            elif frame.frame_type == FRAME_TYPE_RESPONSE and frame.data == HEARTBEAT:
                self.send(NOP)
            else:
                return frame

    def read_messages(self, count: int) -> list[DecodedMessage]:
        while len(self.messages) < count:
            frame = self.read_frame()
            if frame.frame_type == FRAME_TYPE_MESSAGE:
                self.messages.append(decode_message(frame.data))
            elif frame.data == HEARTBEAT:
                self.send(NOP)
            else:
                raise AssertionError(f"frame while waiting for messages: {frame}")
        taken, self.messages = self.messages[:count], self.messages[count:]
        return taken

    def expect_ok(self) -> None:
        frame = self.read_response()
        assert (frame.frame_type, frame.data) == (FRAME_TYPE_RESPONSE, b"OK"), frame

    def expect_error(self, text: str) -> None:
        """The next response is exactly this error frame, then nsqd closes (all fatal)."""
        frame = self.read_response()
        assert (frame.frame_type, frame.data) == (FRAME_TYPE_ERROR, text.encode()), frame
        self.expect_closed()

    def expect_closed(self) -> None:
        """nsqd closes the connection, sending nothing but heartbeats first."""
        while True:
            try:
                frame = self.read_frame()
            except (ConnectionClosed, ssl.SSLError, ConnectionResetError):
                return
            assert frame.data == HEARTBEAT, f"frame before the close: {frame}"

    def close(self) -> None:
        self.transport.close()

    # -- negotiation -----------------------------------------------------------------------

    def identify(self, **settings) -> Frame:
        """Send IDENTIFY with feature negotiation; the raw reply frame, nothing upgraded."""
        settings.setdefault("feature_negotiation", True)
        self.send(encode_identify(settings))
        return self.read_response()

    def negotiate(self, tls_context: ssl.SSLContext | None = None, **settings) -> dict:
        """IDENTIFY, then every upgrade the reply grants, each confirmed by `OK` through the
        new layer: TLS first, then snappy or deflate (docs/protocol.md §2.1)."""
        frame = self.identify(**settings)
        assert frame.frame_type == FRAME_TYPE_RESPONSE, f"IDENTIFY refused: {frame}"
        reply = json.loads(frame.data)
        if reply["tls_v1"]:
            self.start_tls(tls_context)
        if reply["snappy"]:
            self._start_compression("snappy", *snappy_codec())
        if reply["deflate"]:
            self._start_compression("deflate", *deflate_codec(reply["deflate_level"]))
        return reply

    def start_tls(self, context: ssl.SSLContext | None) -> None:
        assert context is not None, "nsqd granted TLS to a client that has no TLS context"
        # nsqd waits for the ClientHello: nothing may follow the IDENTIFY reply in clear.
        assert not self._plain, f"bytes after the IDENTIFY reply before TLS: {self._plain!r}"
        self.transport = context.wrap_socket(self.sock, server_hostname=SERVER_NAME)
        self.expect_ok()
        self.upgrade_oks.append("tls")

    def _start_compression(self, name: str, compress, decompress) -> None:
        # What arrived after the last plain frame is already compressed.
        leftover = bytes(self._plain)
        self._plain.clear()
        self._compress, self._decompress = compress, decompress
        if leftover:
            self._plain += decompress(leftover)
        self.expect_ok()
        self.upgrade_oks.append(name)

    # -- conversations ---------------------------------------------------------------------

    def subscribe(self, topic: str, channel: str, rdy: int) -> None:
        self.send(encode_sub(topic, channel))
        self.expect_ok()
        self.send(encode_rdy(rdy))

    def finish(self, messages: list[DecodedMessage]) -> None:
        self.send(b"".join(encode_fin(message.id) for message in messages))


@contextlib.contextmanager
def connection(port: int) -> Iterator[NegotiatedConnection]:
    conn = NegotiatedConnection(port)
    try:
        yield conn
    finally:
        conn.close()
