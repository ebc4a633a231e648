"""A small blocking NSQ client over our codec: for the tools, the Spark connector, tests.

Not a full client library (no backoff policy, no lookupd polling loop): a `Producer` that
publishes over TCP and waits for each `OK`, a `Consumer` that subscribes, hands out messages
and sends FIN/REQ/TOUCH, answering heartbeats on the way, and a few HTTP helpers for nsqd's
and nsqlookupd's APIs. Everything is plain sockets, usable from threads or Spark executors.
"""

import contextlib
import http.client
import io
import json
import select
import socket
import ssl
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections import deque
from dataclasses import dataclass

from nsqpy.client.discovery import HTTP_HEADERS, USER_AGENT
from nsqpy.client.security import (
    NO_SECURITY,
    Security,
    SecurityMismatch,
    auth_to_send,
    tls_required_port,
)
from nsqpy.common.command import (
    MAGIC_V2,
    NOP,
    encode_auth,
    encode_command,
    encode_dpub,
    encode_fin,
    encode_identify,
    encode_mpub,
    encode_pub,
    encode_pub_ext,
    encode_rdy,
    encode_req,
    encode_sub,
    encode_touch,
)
from nsqpy.common.frame import FRAME_TYPE_ERROR, FRAME_TYPE_MESSAGE, FrameDecoder
from nsqpy.common.message import decode_message

HEARTBEAT = b"_heartbeat_"
RECEIVE_SIZE = 256 * 1024


class NSQError(Exception):
    """nsqd answered with an error frame; `text` is nsqd's `CODE description`."""

    def __init__(self, text: str) -> None:
        super().__init__(text)
        self.text = text
        self.code = text.split(" ", 1)[0]


@dataclass
class Message:
    """A delivered message; `finish`, `requeue` and `touch` answer for it."""

    id: bytes
    body: bytes
    attempts: int
    timestamp: int
    consumer: "Consumer"

    def finish(self) -> None:
        self.consumer.finish(self.id)

    def requeue(self, delay_ms: int = 0) -> None:
        self.consumer.requeue(self.id, delay_ms)

    def touch(self) -> None:
        self.consumer.touch(self.id)


def split_address(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host.strip("[]") or "127.0.0.1", int(port)


def receive_available(sock: socket.socket, size: int) -> bytes:
    """One recv, and over TLS whatever else is already decrypted: bytes left inside the TLS
    layer would not wake a `select` on the socket."""
    data = sock.recv(size)
    if isinstance(sock, ssl.SSLSocket):
        while data and (pending := sock.pending()):
            data += sock.recv(pending)
    return data


class Connection:
    """One V2 connection: magic, IDENTIFY, the TLS upgrade and AUTH when `security` asks for
    them (nsqpy.client.security), then framed replies with heartbeats answered."""

    def __init__(
        self,
        address: str,
        *,
        timeout: float = 10.0,
        identify: dict | None = None,
        client_id: str | None = None,
        security: Security | None = None,
    ) -> None:
        self.address = address
        self.security = security or NO_SECURITY
        host, port = split_address(address)
        self.sock = socket.create_connection((host, port), timeout=timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        # The reading thread's wait for bytes (the descriptor outlives the TLS wrap); poll,
        # not select, which refuses descriptors above 1023.
        self._readable = select.poll()
        self._readable.register(self.sock, select.POLLIN)
        self.decoder = FrameDecoder()
        self.frames: deque = deque()
        # FIN from one thread and the heartbeat's NOP from the reading one must not interleave.
        self._send_lock = threading.Lock()
        # OpenSSL runs one call at a time on a connection: a read in one thread while another
        # writes races on the connection's state, and the reader can take a write for the
        # peer's close. Over TLS, reads and writes take turns; the reader waits for bytes
        # outside the lock. Plain sockets read and write at once.
        self._tls_lock: threading.Lock | contextlib.nullcontext = contextlib.nullcontext()
        self.auth_reply: dict | None = None
        settings = {
            "client_id": client_id or socket.gethostname().split(".")[0],
            "hostname": socket.gethostname(),
            "user_agent": USER_AGENT,
            "feature_negotiation": True,
        }
        settings.update(identify or {})
        if self.security.tls_v1:
            settings["tls_v1"] = True
        try:
            self.sock.sendall(MAGIC_V2 + encode_identify(settings))
            self.identify_reply = json.loads(self.read_response())
            self._secure(host)
        except BaseException:
            self.close()
            raise

    def _secure(self, host: str) -> None:
        """TLS when asked for (nsqd must grant it: no silent plain text), then AUTH when nsqd
        requires it, as go-nsq does after IDENTIFY."""
        if self.security.tls_v1:
            if not self.identify_reply.get("tls_v1"):
                raise SecurityMismatch(f"nsqd {self.address} did not grant TLS (tls_v1)")
            context = self.security.context()
            assert context is not None  # tls_v1 makes one
            self.sock = context.wrap_socket(self.sock, server_hostname=host)
            self._tls_lock = threading.Lock()
            self.read_response()  # nsqd's OK, the first frame over TLS
        secret = auth_to_send(self.address, self.identify_reply, self.security.auth_secret)
        if secret is not None:
            self.send(encode_auth(secret))
            self.auth_reply = json.loads(self.read_response())

    def send(self, data: bytes) -> None:
        with self._send_lock, self._tls_lock:
            self.sock.sendall(data)

    def read_frame(self, timeout: float | None = None):
        """The next frame (heartbeats are answered and skipped); None on timeout (0 reads
        only what is there). One thread reads; any may send meanwhile. None waits as long as
        the socket's timeout."""
        if timeout is None:
            timeout = self.sock.gettimeout()
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self.frames:
            data = self._receive(deadline)
            if data is None:
                return None
            if not data:
                raise ConnectionError(f"nsqd {self.address} closed the connection")
            for frame in self.decoder.receive_data(data):
                if frame.frame_type == 0 and frame.data == HEARTBEAT:
                    self.send(NOP)
                else:
                    self.frames.append(frame)
        return self.frames.popleft()

    def _receive(self, deadline: float | None) -> bytes | None:
        """The bytes that came, b"" at the connection's end, None at `deadline`. The recv
        runs once the socket is readable, so it leaves the socket's timeout alone (a send from
        another thread goes by it) and holds the TLS turn only briefly."""
        sock = self.sock
        while True:
            if isinstance(sock, ssl.SSLSocket):
                with self._tls_lock:
                    if sock.pending():
                        return receive_available(sock, RECEIVE_SIZE)
            if deadline is None:
                readable = self._readable.poll()
            else:
                readable = self._readable.poll(max(0.0, deadline - time.monotonic()) * 1000)
            if not readable:
                return None
            if not isinstance(sock, ssl.SSLSocket):
                return sock.recv(RECEIVE_SIZE)
            with self._tls_lock:
                data = self._receive_decrypted()
            if data is not None:
                return data
            if deadline is not None and time.monotonic() >= deadline:
                return None

    def _receive_decrypted(self) -> bytes | None:
        """What the TLS records that came decrypt to; None while a record is still partial.
        Called in the TLS turn."""
        blocking = self.sock.gettimeout()
        self.sock.settimeout(0.0)
        try:
            return receive_available(self.sock, RECEIVE_SIZE)
        except (ssl.SSLWantReadError, ssl.SSLWantWriteError):
            return None
        finally:
            self.sock.settimeout(blocking)

    def read_response(self) -> bytes:
        """The next response frame's data; NSQError for an error frame."""
        while True:
            frame = self.read_frame(timeout=None)
            if frame is None:
                continue
            if frame.frame_type == FRAME_TYPE_ERROR:
                raise NSQError(frame.data.decode("utf-8", "replace"))
            if frame.frame_type != FRAME_TYPE_MESSAGE:
                return frame.data

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass

    def __enter__(self):
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()


class Producer(Connection):
    """Publishes over TCP; every call waits for nsqd's `OK` (NSQError otherwise)."""

    def publish(self, topic: str, body: bytes) -> None:
        self.send(encode_pub(topic, body))
        self.read_response()

    def multi_publish(self, topic: str, bodies: list[bytes]) -> None:
        self.send(encode_mpub(topic, bodies))
        self.read_response()

    def deferred_publish(self, topic: str, defer_ms: int, body: bytes) -> None:
        self.send(encode_dpub(topic, defer_ms, body))
        self.read_response()

    def publish_ext(self, topic: str, header: dict | bytes, body: bytes) -> bytes:
        """Youzan's PUB_EXT to an ext topic's default partition; nsqd's reply (`OK`, or the
        traced reply when the header has `##trace_id`)."""
        self.send(encode_pub_ext(topic, header, body))
        return self.read_response()


class Consumer(Connection):
    """Subscribes to `topic`/`channel` with `max_in_flight` messages outstanding."""

    def __init__(
        self,
        address: str,
        topic: str,
        channel: str,
        *,
        max_in_flight: int = 100,
        timeout: float = 10.0,
        identify: dict | None = None,
        security: Security | None = None,
    ) -> None:
        super().__init__(address, timeout=timeout, identify=identify, security=security)
        self.topic = topic
        self.channel = channel
        self.send(encode_sub(topic, channel))
        self.read_response()
        # An RDY above the server's max_rdy_count is a fatal error: stay within it.
        limit = self.identify_reply.get("max_rdy_count", max_in_flight)
        self.max_in_flight = min(max_in_flight, limit)
        self.send(encode_rdy(self.max_in_flight))

    def receive(self, timeout: float | None = None) -> Message | None:
        """The next message, or None if none arrived within `timeout` seconds."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
            frame = self.read_frame(timeout=remaining)
            if frame is None:
                return None
            if frame.frame_type == FRAME_TYPE_MESSAGE:
                decoded = decode_message(frame.data)
                return Message(decoded.id, decoded.body, decoded.attempts, decoded.timestamp, self)
            if frame.frame_type == FRAME_TYPE_ERROR:
                text = frame.data.decode("utf-8", "replace")
                if text.split(" ", 1)[0] not in ("E_FIN_FAILED", "E_REQ_FAILED", "E_TOUCH_FAILED"):
                    raise NSQError(text)

    def finish(self, message_id: bytes) -> None:
        self.send(encode_fin(message_id))

    def requeue(self, message_id: bytes, delay_ms: int = 0) -> None:
        self.send(encode_req(message_id, delay_ms))

    def touch(self, message_id: bytes) -> None:
        self.send(encode_touch(message_id))

    def ready(self, count: int) -> None:
        self.send(encode_rdy(count))

    def close_gracefully(self, timeout: float = 5.0) -> None:
        """CLS, then wait for `CLOSE_WAIT` (messages still in flight may be finished)."""
        self.send(encode_command(b"CLS"))
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            frame = self.read_frame(timeout=max(0.0, deadline - time.monotonic()))
            if frame is None or frame.data == b"CLOSE_WAIT":
                break
        self.close()


# -- HTTP -------------------------------------------------------------------------------------


# The HTTPS address of an nsqd whose plain port answered TLS_REQUIRED, by its plain one.
_https_addresses: dict[str, str] = {}


def nsqd_http_base(address: str, security: Security = NO_SECURITY) -> str:
    """The base URL for `address` (`host:port` or a URL): its HTTPS one once that nsqd said TLS
    is required, when the security settings speak TLS."""
    base = address if address.startswith(("http://", "https://")) else f"http://{address}"
    base = base.rstrip("/")
    if security.tls_v1 and base.startswith("http://"):
        moved = _https_addresses.get(base[len("http://") :])
        if moved is not None:
            return f"https://{moved}"
    return base


def learn_tls_required(address: str, status: int, body: bytes, security: Security) -> bool:
    """Remember the HTTPS port an nsqd's `TLS_REQUIRED` answer gives; True when the request
    should be made again there."""
    port = tls_required_port(status, body)
    if port is None or not security.tls_v1:
        return False
    netloc = urllib.parse.urlsplit(nsqd_http_base(address)).netloc
    host = netloc.rpartition(":")[0] or netloc
    moved = f"{host}:{port}"
    if _https_addresses.get(netloc) == moved:
        return False
    _https_addresses[netloc] = moved
    return True


def http_connection(
    base: str, security: Security = NO_SECURITY, timeout: float = 10.0
) -> http.client.HTTPConnection:
    """A kept-alive connection to the host of `base` (an http:// or https:// URL)."""
    parts = urllib.parse.urlsplit(base)
    host, port = parts.hostname or "127.0.0.1", parts.port
    if parts.scheme == "https":
        return http.client.HTTPSConnection(
            host, port, timeout=timeout, context=security.https_context()
        )
    return http.client.HTTPConnection(host, port, timeout=timeout)


def http_request(
    address: str,
    path: str,
    *,
    method: str = "GET",
    body: bytes | None = None,
    security: Security | None = None,
    timeout: float = 10.0,
    **params,
) -> bytes:
    """One request to an nsqd or nsqlookupd HTTP API (`host:port` or a full URL); the body.
    With `security`, the auth secret goes as `Authorization: Bearer` and an nsqd that
    requires TLS is asked again over HTTPS."""
    security = security or NO_SECURITY
    query = urllib.parse.urlencode({k: v for k, v in params.items() if v is not None})
    data = body if body is not None else (b"" if method == "POST" else None)
    headers = dict(HTTP_HEADERS)
    headers.update(security.http_headers())
    while True:
        base = nsqd_http_base(address, security)
        url = f"{base}{path}" + (f"?{query}" if query else "")
        request = urllib.request.Request(url, data=data, method=method, headers=headers)
        context = security.https_context() if base.startswith("https://") else None
        try:
            with urllib.request.urlopen(request, timeout=timeout, context=context) as response:
                return response.read()
        except urllib.error.HTTPError as error:
            if error.code != 403:
                raise
            text = error.read()
            if not learn_tls_required(address, error.code, text, security):
                # The body was read: hand the caller an error it can read again.
                raise urllib.error.HTTPError(
                    error.url, error.code, error.msg, error.headers, io.BytesIO(text)
                ) from None


def http_json(address: str, path: str, *, security: Security | None = None, **params) -> dict:
    return json.loads(http_request(address, path, security=security, **params) or b"null")


def lookup_nsqds(lookupd_http_address: str, topic: str) -> list[str]:
    """The TCP addresses (`broadcast_address:tcp_port`) of the nsqds that have `topic`."""
    try:
        document = http_json(lookupd_http_address, "/lookup", topic=topic)
    except urllib.error.HTTPError as error:
        if error.code == 404:
            return []
        raise
    return [
        f"{producer['broadcast_address']}:{producer['tcp_port']}"
        for producer in document.get("producers") or []
    ]


def http_publish(
    nsqd_http_address: str, topic: str, bodies: list[bytes], security: Security | None = None
) -> None:
    """Publish with `/pub` (one body) or `/mpub?binary=true` (several)."""
    if len(bodies) == 1:
        http_request(
            nsqd_http_address,
            "/pub",
            method="POST",
            body=bodies[0],
            topic=topic,
            security=security,
        )
        return
    payload = b"".join(len(b).to_bytes(4, "big") + b for b in bodies)
    payload = len(bodies).to_bytes(4, "big") + payload
    http_request(
        nsqd_http_address,
        "/mpub",
        method="POST",
        body=payload,
        topic=topic,
        binary="true",
        security=security,
    )
