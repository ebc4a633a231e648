"""A small etcd v3 client for trio, over etcd's gRPC-JSON gateway (HTTP/1.1 and JSON).

The cluster keeps its membership, elections and replica sets in etcd (docs/design.md §14).
etcd's native API is gRPC; every etcd v3 server also serves the same RPCs as
`POST /v3/<service>/<method>` with a JSON body, which trio can speak with a plain TCP stream,
httptools and the stdlib (bench/etcd_client.py measures it against etcd3gw in a thread).

What the gateway looks like (etcd 3.4, checked against the real server):

* paths: `/v3/` (3.4 also serves `/v3beta/` for 3.3 clients; 3.2 had only `/v3alpha/`);
* keys and values are base64; int64 fields (revisions, lease ids, TTLs) come as JSON strings
  (the proto3 JSON mapping) and we send them the same way; fields at their zero value are
  left out of answers (a PUT event has no `type`, a gone lease no `TTL`);
* an error is a non-200 answer `{"error", "message", "code"}` with the gRPC status code;
* the streaming RPCs (Watch, LeaseKeepAlive) answer chunked, one JSON object a line, each
  `{"result": {...}}` or `{"error": {...}}`; LeaseKeepAlive ends its stream after answering
  the one request a body carries, so it is one request and one answer, like the rest.

The codec (request bodies, HTTP framing, decoding answers into `KeyValue` and `WatchEvent`)
is plain functions and `ResponseParser`, with no I/O, so it is tested without a server;
`EtcdClient` does the I/O.

Failover: a call tries the endpoints in turn, starting with the one that last answered, each
attempt bounded by `attempt_timeout` (a member that answers nothing in that time, paused,
partitioned or stuck, is left for the next) and all of them by the call's `timeout`; round
after round until then, and `EtcdUnavailable` naming every endpoint and what failed when none
answered. A request that may have reached etcd is sent again only when doing it twice is
harmless (a read, a put or delete of the same thing, a lease refresh, or a transaction whose
caller reads its own outcome back: `txn(resend=True)`, `campaign`); `create`, `replace` and
`delete_if` are sent again only when they surely were not sent (the connection could not be
made), since etcd may have applied them and a second try would then report a lost compare.

`EtcdClient.health` says whether etcd answers, since when, and each endpoint's last failure,
for the daemons' stats and their one log line per change (an outage begins, an outage ends).
"""

import base64
import collections
import json
import os
import select
import ssl
import time
import urllib.parse
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Literal, Protocol

import trio

from nsqpy.common.http_response import ResponseParser

__all__ = [
    "Compare",
    "EtcdClient",
    "EtcdHealth",
    "EtcdCompacted",
    "EtcdAuthError",
    "EtcdError",
    "EtcdUnavailable",
    "KeyValue",
    "LeaseLost",
    "Watch",
    "WatchEvent",
    "keep_lease_alive",
]

API_PREFIX = "/v3"
DEFAULT_PORT = 2379
RECEIVE_SIZE = 64 * 1024
# Idle keep-alive connections kept per endpoint; more concurrent calls open more, and the
# extra ones are closed when they finish.
MAX_IDLE_CONNECTIONS = 8
# A watch whose connection dropped re-opens after this delay, doubling up to the maximum.
WATCH_RETRY_DELAY = 0.05
WATCH_RETRY_MAX_DELAY = 1.0
# keep_lease_alive retries a refresh that found no endpoint this often, until the TTL is over.
LEASE_RETRY_DELAY = 0.2
# How long one attempt on one endpoint may take before the next endpoint is tried. A healthy
# member answers in milliseconds (a write waits for its fsync and a majority's); one that
# answers nothing for a second is paused, cut off or without a leader, and the call moves on.
ATTEMPT_TIMEOUT = 1.0
# A watch whose stream was silent this long asks its member whether it still answers (a
# linearizable read: a member paused, or cut off from the majority, cannot serve one), and
# moves to another member when it does not: a quiet prefix and a dead member look the same
# on the stream alone.
WATCH_PROBE_INTERVAL = 1.0
# etcd's default --max-txn-ops: the most compares, and the most operations, of one transaction.
MAX_TXN_OPS = 128

# gRPC status codes that matter here (google.golang.org/grpc/codes).
GRPC_INVALID_ARGUMENT = 3
GRPC_NOT_FOUND = 5
GRPC_UNAVAILABLE = 14
GRPC_UNAUTHENTICATED = 16
# What etcd answers a request without a valid token while auth is on (3.4: "user name is
# empty" for none, code 16 "invalid auth token" for an expired one).
_TOKEN_REFUSALS = ("invalid auth token", "user name is empty")


class EtcdError(Exception):
    """etcd refused a request (`code` is its gRPC status code), or answered what we cannot
    read."""

    def __init__(self, message: str, code: int | None = None) -> None:
        super().__init__(message)
        self.code = code


class EtcdUnavailable(EtcdError):
    """No endpoint answered within the timeout: refused or dropped connections, no answer
    in time, or etcd itself answering UNAVAILABLE (no leader, request timed out)."""


class EtcdCompacted(EtcdError):
    """A watch's start revision is older than etcd's last compaction, so events in between
    are lost: read the keys again and watch from a newer revision."""

    def __init__(self, message: str, compact_revision: int) -> None:
        super().__init__(message)
        self.compact_revision = compact_revision


class LeaseLost(EtcdError):
    """A lease expired or was revoked, or could not be refreshed before its TTL ran out."""


class EtcdAuthError(Exception):
    """etcd refused the client's user and password: a configuration error no retry mends
    (not an EtcdError, so that the loops that wait for etcd to come back do not wait for it)."""


@dataclass(frozen=True, slots=True)
class KeyValue:
    """One key as etcd stores it. `lease` is 0 when the key has none; a deleted key (in a
    DELETE event) has only `key` and `mod_revision`, the revision of its deletion."""

    key: str
    value: bytes
    create_revision: int
    mod_revision: int
    version: int
    lease: int


@dataclass(frozen=True, slots=True)
class WatchEvent:
    kind: Literal["PUT", "DELETE"]
    kv: KeyValue

    @property
    def value(self) -> bytes | None:
        """The key's value after the event; None when it was deleted."""
        return self.kv.value if self.kind == "PUT" else None


@dataclass(frozen=True, slots=True)
class WatchMessage:
    """One message of a watch stream, decoded."""

    revision: int  # header.revision
    events: list[WatchEvent]
    created: bool = False
    canceled: bool = False
    compact_revision: int = 0
    cancel_reason: str = ""


# --- codec: request bodies ------------------------------------------------------------------


def encode_key(key: str) -> bytes:
    # surrogateescape: a key that is not UTF-8 (written by another tool) decodes to a str
    # that encodes back to the same bytes.
    return key.encode("utf-8", "surrogateescape")


def decode_key(raw: bytes) -> str:
    return raw.decode("utf-8", "surrogateescape")


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def prefix_range_end(prefix: bytes) -> bytes:
    """The `range_end` that selects every key starting with `prefix` (clientv3's
    GetPrefixRangeEnd): the prefix up to its last byte below 0xff, that byte incremented;
    b"\\0", meaning every key, for an empty or all-0xff prefix."""
    for index in range(len(prefix) - 1, -1, -1):
        if prefix[index] < 0xFF:
            return prefix[:index] + bytes([prefix[index] + 1])
    return b"\0"


def key_range(key: str, *, prefix: bool = False) -> dict[str, str]:
    """The `key` (and `range_end` for a prefix) fields of a range, delete or watch request."""
    raw = encode_key(key)
    if prefix:
        return {"key": b64(raw), "range_end": b64(prefix_range_end(raw))}
    return {"key": b64(raw)}


def put_request(key: str, value: bytes | str, *, lease: int = 0) -> dict[str, str]:
    body = {"key": b64(encode_key(key)), "value": b64(_value_bytes(value))}
    if lease:
        body["lease"] = str(lease)
    return body


def txn_request(
    key: str, target: Literal["CREATE", "MOD"], revision: int, then: dict[str, Any]
) -> dict[str, Any]:
    """A transaction: if the key's create or mod revision equals `revision`, do `then` (a
    RequestOp such as {"request_put": put_request(...)})."""
    field = "create_revision" if target == "CREATE" else "mod_revision"
    compare = {
        "key": b64(encode_key(key)),
        "target": target,
        "result": "EQUAL",
        field: str(revision),
    }
    return {"compare": [compare], "success": [then]}


@dataclass(frozen=True, slots=True)
class Compare:
    """One compare of a transaction: the key's `target` ("CREATE", "MOD", "VERSION" or
    "LEASE") revision, version or lease EQUAL to `value` (0 for CREATE: the key is absent)."""

    key: str
    target: Literal["CREATE", "MOD", "VERSION", "LEASE"]
    value: int

    def to_json(self) -> dict[str, str]:
        field = {
            "CREATE": "create_revision",
            "MOD": "mod_revision",
            "VERSION": "version",
            "LEASE": "lease",
        }[self.target]
        return {
            "key": b64(encode_key(self.key)),
            "target": self.target,
            "result": "EQUAL",
            field: str(self.value),
        }


def put_op(key: str, value: bytes | str, *, lease: int = 0) -> dict[str, Any]:
    return {"request_put": put_request(key, value, lease=lease)}


def range_op(key: str) -> dict[str, Any]:
    return {"request_range": key_range(key)}


def delete_op(key: str) -> dict[str, Any]:
    return {"request_delete_range": key_range(key)}


@dataclass(frozen=True, slots=True)
class TxnResult:
    """A transaction's outcome: whether every compare held, the store revision after it (a
    key it wrote has it as its mod revision), and what each operation of the branch that ran
    answered (for a range, its keys: `ranges`)."""

    succeeded: bool
    revision: int
    responses: list[dict[str, Any]]

    def ranges(self) -> list[list[KeyValue]]:
        """The keys each range operation of the branch that ran read, in order."""
        found = []
        for response in self.responses:
            if "response_range" in response:
                found.append([decode_kv(kv) for kv in response["response_range"].get("kvs", ())])
        return found


def watch_request(prefix: str, start_revision: int) -> dict[str, Any]:
    create: dict[str, Any] = key_range(prefix, prefix=True)
    if start_revision > 0:
        create["start_revision"] = str(start_revision)
    return {"create_request": create}


def encode_request(host: str, path: str, body: dict[str, Any], token: str = "") -> bytes:
    """An HTTP/1.1 keep-alive POST of `body` as JSON, with etcd's auth `token` if any."""
    payload = json.dumps(body, separators=(",", ":")).encode()
    auth = f"Authorization: {token}\r\n" if token else ""
    head = (
        f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
        f"{auth}Content-Length: {len(payload)}\r\n\r\n"
    )
    return head.encode("latin-1") + payload


def _value_bytes(value: bytes | str) -> bytes:
    return value.encode() if isinstance(value, str) else bytes(value)


# --- codec: answers -------------------------------------------------------------------------


def decode_kv(data: dict[str, Any]) -> KeyValue:
    """A mvccpb.KeyValue in the gateway's JSON: base64 key and value, int64 as strings,
    zero fields left out."""
    return KeyValue(
        key=decode_key(base64.b64decode(data.get("key", ""))),
        value=base64.b64decode(data.get("value", "")),
        create_revision=int(data.get("create_revision", 0)),
        mod_revision=int(data.get("mod_revision", 0)),
        version=int(data.get("version", 0)),
        lease=int(data.get("lease", 0)),
    )


def header_revision(answer: dict[str, Any]) -> int:
    return int(answer.get("header", {}).get("revision", 0))


def decode_range(answer: dict[str, Any]) -> tuple[list[KeyValue], int]:
    """A RangeResponse: its keys (in key order) and the store revision it was read at."""
    return [decode_kv(kv) for kv in answer.get("kvs", ())], header_revision(answer)


def decode_txn(answer: dict[str, Any]) -> tuple[bool, int]:
    """A TxnResponse: whether the compare held, and the store revision after it (the mod
    revision of a key the transaction wrote)."""
    return bool(answer.get("succeeded", False)), header_revision(answer)


def decode_txn_result(answer: dict[str, Any]) -> TxnResult:
    succeeded, revision = decode_txn(answer)
    return TxnResult(succeeded, revision, list(answer.get("responses", ())))


def decode_watch(result: dict[str, Any]) -> WatchMessage:
    """A WatchResponse (the `result` of one line of the stream)."""
    events = []
    for event in result.get("events", ()):
        kind = event.get("type", "PUT")
        if kind not in ("PUT", "DELETE"):
            raise EtcdError(f"etcd watch: unknown event type {kind!r}")
        events.append(WatchEvent(kind, decode_kv(event.get("kv", {}))))
    return WatchMessage(
        revision=header_revision(result),
        events=events,
        created=bool(result.get("created", False)),
        canceled=bool(result.get("canceled", False)),
        compact_revision=int(result.get("compact_revision", 0)),
        cancel_reason=result.get("cancel_reason", ""),
    )


def decode_stream_line(line: bytes) -> dict[str, Any]:
    """One line of a streaming answer: its `result`; EtcdError for an `{"error": ...}`."""
    try:
        message = json.loads(line)
    except ValueError:
        raise EtcdError(f"etcd stream: not JSON: {line[:200]!r}") from None
    if "error" in message:
        error = message["error"]
        if isinstance(error, dict):
            text = error.get("message", str(error))
            code = error.get("grpc_code", error.get("code"))
        else:
            text, code = str(error), message.get("code")
        raise _grpc_error(text, code)
    return message.get("result", {})


def decode_answer(status: int, body: bytes) -> dict[str, Any]:
    """The JSON of a 200 answer; EtcdError (EtcdUnavailable for UNAVAILABLE and the HTTP
    statuses a proxy answers when etcd is down) for any other."""
    try:
        answer = json.loads(body) if body else {}
    except ValueError:
        answer = None
    if status == 200 and isinstance(answer, dict):
        return answer
    if isinstance(answer, dict) and ("message" in answer or "error" in answer):
        raise _grpc_error(str(answer.get("message") or answer.get("error")), answer.get("code"))
    if status in (502, 503, 504):
        raise EtcdUnavailable(f"HTTP {status}: {body[:200]!r}")
    raise EtcdError(f"HTTP {status}: {body[:200]!r}")


def _grpc_error(text: str, code: Any) -> EtcdError:
    code = int(code) if isinstance(code, int | str) and str(code).isdigit() else None
    kind = EtcdUnavailable if code == GRPC_UNAVAILABLE else EtcdError
    return kind(f"{text} (gRPC code {code})", code)


class LineSplitter:
    """Bytes of a streaming answer in, complete lines (one JSON message each) out."""

    __slots__ = ("_buffer",)

    def __init__(self) -> None:
        self._buffer = bytearray()

    def feed(self, data: bytes | bytearray) -> list[bytes]:
        self._buffer += data
        *lines, rest = self._buffer.split(b"\n")
        self._buffer = rest
        return [bytes(line) for line in lines if line.strip()]


# --- I/O ------------------------------------------------------------------------------------


class _NotSent(Exception):
    """The request did not leave: the connection could not be made."""


class _NoAnswer(Exception):
    """The request was sent (or may have been) but no complete answer came back."""


# What a call or a watch survives by trying another endpoint (or the same one again).
_CONNECTION_ERRORS = (_NotSent, _NoAnswer, EtcdUnavailable, OSError, trio.BrokenResourceError)


@dataclass
class _Endpoint:
    url: str
    host: str
    port: int
    idle: list[trio.abc.Stream]
    tls: bool = False

    @property
    def authority(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"


def _parse_endpoint(url: str) -> _Endpoint:
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(
            f"etcd endpoint {url!r} is not valid: expected http://HOST:PORT or https://HOST:PORT"
        )
    return _Endpoint(
        url.rstrip("/"), parts.hostname, parts.port or DEFAULT_PORT, [], parts.scheme == "https"
    )


class EtcdNetwork(Protocol):
    """How the client reaches etcd's members: TCP (and TLS) in production (`SOCKETS`); the
    etcd model's in-memory streams under a simulation (`nsqpy/etcd_model.py`)."""

    async def connect(
        self, endpoint: "_Endpoint", ssl_context: ssl.SSLContext | None
    ) -> trio.abc.Stream:
        """A new connection to `endpoint`; `_NotSent` when none can be made."""

    def dropped(self, stream: trio.abc.Stream) -> bool:
        """Whether an idle pooled connection was closed by the other side."""

    def close(self, stream: trio.abc.Stream) -> None:
        """Close at once, without a checkpoint (inside a cancelled scope too)."""


class SocketNetwork:
    """etcd over TCP, and TLS for https:// endpoints."""

    async def connect(
        self, endpoint: "_Endpoint", ssl_context: ssl.SSLContext | None
    ) -> trio.abc.Stream:
        return await _open_connection(endpoint, ssl_context)

    def dropped(self, stream: trio.abc.Stream) -> bool:
        return _dropped(stream)

    def close(self, stream: trio.abc.Stream) -> None:
        _close(stream)


def _socket_of(stream: trio.abc.Stream) -> trio.socket.SocketType:
    if isinstance(stream, trio.SSLStream):
        stream = stream.transport_stream
    assert isinstance(stream, trio.SocketStream), stream
    return stream.socket


def _dropped(stream: trio.abc.Stream) -> bool:
    # An idle keep-alive connection has nothing to read; if it is readable, the server has
    # closed it (etcd restarted) and a request sent on it would be lost. This is how urllib3
    # checks its pooled connections; one poll(2) costs about a microsecond. (Over TLS a late
    # session ticket reads the same: that connection is merely replaced.)
    poller = select.poll()
    poller.register(_socket_of(stream).fileno(), select.POLLIN)
    return bool(poller.poll(0))


def _close(stream: trio.abc.Stream) -> None:
    # SocketStream.aclose is this plus a checkpoint; closing synchronously also works inside
    # a cancelled scope.
    _socket_of(stream).close()


async def _open_connection(
    endpoint: _Endpoint, ssl_context: ssl.SSLContext | None = None
) -> trio.abc.Stream:
    try:
        stream = await trio.open_tcp_stream(endpoint.host, endpoint.port)
    except OSError as error:
        # trio's own message ("all attempts to connect to ... failed") hides why; the
        # attempts' errors are its cause.
        causes = getattr(error.__cause__, "exceptions", ())
        reasons = sorted(
            {os.strerror(cause.errno) for cause in causes if getattr(cause, "errno", None)}
        )
        raise _NotSent(f"connect failed: {', '.join(reasons) or error}") from None
    if not endpoint.tls:
        return stream
    tls = trio.SSLStream(
        stream, ssl_context or ssl.create_default_context(), server_hostname=endpoint.host
    )
    try:
        await tls.do_handshake()
    except (trio.BrokenResourceError, OSError) as error:
        stream.socket.close()
        cause = error.__cause__ or error
        raise _NotSent(f"TLS handshake failed: {cause}") from None
    return tls


async def _read_answer(stream: trio.abc.Stream, parser: ResponseParser) -> None:
    """Feed `parser` until its response is complete."""
    while not parser.complete:
        data = await stream.receive_some(RECEIVE_SIZE)
        if not data:
            raise _NoAnswer("connection closed before the answer")
        parser.feed(data)


SOCKETS = SocketNetwork()


class EtcdHealth:
    """Whether etcd answers this client: since when (wall-clock seconds, for the stats an
    operator reads; `trio.current_time()` for the daemon's own rules), the error that began
    an outage, and each endpoint's last failure (a member of three gone while the others
    answer). `on_change(health)` is called once each time an outage begins or ends, where a
    daemon logs one line."""

    def __init__(self, endpoints: list[str]) -> None:
        self.reachable = True
        # When it last changed: trio's clock, and the wall clock.
        self.changed_at = 0.0
        self.changed_wall = time.time()
        self.error = ""
        self.answered_once = False
        # Endpoint URL -> (wall time of its first failure in a row, the last error), for the
        # endpoints that failed their last attempt.
        self.failing: dict[str, tuple[float, str]] = {}
        self.endpoints = endpoints
        # The endpoint of the member the others follow, as the last `check_members` found.
        self.leader_endpoint = ""
        self.on_change: Callable[[EtcdHealth], None] | None = None

    def answered(self, endpoint: str) -> None:
        self.failing.pop(endpoint, None)
        self.answered_once = True
        if not self.reachable:
            self._change(True, "")

    def endpoint_failed(self, endpoint: str, error: str) -> None:
        since = self.failing.get(endpoint, (time.time(), ""))[0]
        self.failing[endpoint] = (since, error)

    def failed(self, error: str) -> None:
        """No endpoint answered a call."""
        if self.reachable:
            self._change(False, error)

    def answering_for(self) -> float:
        """Seconds etcd has answered since its last outage (trio's clock); 0 while it does
        not."""
        return trio.current_time() - self.changed_at if self.reachable else 0.0

    def _change(self, reachable: bool, error: str) -> None:
        self.reachable = reachable
        self.error = error
        try:
            self.changed_at = trio.current_time()
        except RuntimeError:  # outside a trio run (a test of the record alone)
            self.changed_at = 0.0
        self.changed_wall = time.time()
        if self.on_change is not None:
            self.on_change(self)

    def to_json(self) -> dict[str, Any]:
        """For `/stats` and `/cluster/stats`."""
        return {
            "reachable": self.reachable,
            "endpoints": self.endpoints,
            "error": self.error,
            "unreachable_since": None if self.reachable else iso_time(self.changed_wall),
            "leader_endpoint": self.leader_endpoint,
            "failing_endpoints": [
                {"endpoint": url, "since": iso_time(since), "error": error}
                for url, (since, error) in sorted(self.failing.items())
            ],
        }


def iso_time(wall: float) -> str:
    """A wall-clock time as RFC 3339 in UTC, to the second."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(wall))


class EtcdClient:
    """An etcd v3 client over the JSON gateway of one or more endpoints of one cluster.

    Calls are linearizable (etcd's default), each bounded by `timeout` seconds over all the
    endpoints it tries (see the module docstring for failover). Keep-alive connections are
    pooled per endpoint. Use it from one trio run; close it with `aclose` or `async with`.
    """

    def __init__(
        self,
        endpoints: list[str],
        *,
        timeout: float = 5.0,
        attempt_timeout: float = ATTEMPT_TIMEOUT,
        ssl_context: ssl.SSLContext | None = None,
        username: str = "",
        password: str = "",
        network: EtcdNetwork = SOCKETS,
    ) -> None:
        """`endpoints`: URLs like "http://127.0.0.1:2379" of members of one cluster;
        https:// ones are reached over TLS with `ssl_context` (the CA to trust, a client
        certificate for etcd's `--client-cert-auth`). With `username`, every call carries a
        token etcd gave for it and `password` (etcd's auth), renewed when etcd refuses it;
        EtcdAuthError when etcd refuses the password. `network`: how members are reached
        (TCP; the etcd model's streams in a simulation)."""
        if not endpoints:
            raise ValueError("etcd client needs at least one endpoint")
        self._endpoints = [_parse_endpoint(url) for url in endpoints]
        self.timeout = timeout
        self.attempt_timeout = attempt_timeout
        self.health = EtcdHealth(self.endpoints)
        self._ssl_context = ssl_context
        self.network = network
        self._username = username
        self._password = password
        self._token = ""
        self._preferred = 0  # the endpoint that answered last
        self._closed = False

    async def __aenter__(self) -> "EtcdClient":
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    @property
    def endpoints(self) -> list[str]:
        return [endpoint.url for endpoint in self._endpoints]

    # --- keys

    async def get(self, key: str) -> KeyValue | None:
        """The key, or None when it does not exist."""
        kvs, _ = decode_range(await self._call("/kv/range", key_range(key)))
        return kvs[0] if kvs else None

    async def get_prefix(self, prefix: str) -> tuple[list[KeyValue], int]:
        """Every key starting with `prefix`, in key order, and the store revision they were
        read at: watch from that revision + 1 to miss nothing."""
        return decode_range(await self._call("/kv/range", key_range(prefix, prefix=True)))

    async def put(self, key: str, value: bytes | str, *, lease: int = 0) -> int:
        """Set the key (attached to `lease` when not 0); returns the revision of the write."""
        return header_revision(await self._call("/kv/put", put_request(key, value, lease=lease)))

    async def delete(self, key: str) -> int:
        """Delete the key; returns how many keys were deleted (0 or 1)."""
        answer = await self._call("/kv/deleterange", key_range(key))
        return int(answer.get("deleted", 0))

    async def delete_prefix(self, prefix: str) -> int:
        """Delete every key starting with `prefix`; returns how many were deleted."""
        answer = await self._call("/kv/deleterange", key_range(prefix, prefix=True))
        return int(answer.get("deleted", 0))

    async def create(self, key: str, value: bytes | str, *, lease: int = 0) -> int:
        """Put the key only if it does not exist (a transaction on create_revision == 0).
        Returns the revision of the write (the new key's mod_revision, for a later
        `replace`), or 0 when the key exists; so the result also reads as a bool."""
        then = {"request_put": put_request(key, value, lease=lease)}
        return await self._txn(txn_request(key, "CREATE", 0, then))

    async def replace(
        self, key: str, value: bytes | str, mod_revision: int, *, lease: int = 0
    ) -> int:
        """Compare-and-swap: put the key only if its mod_revision is still `mod_revision`.
        Returns the revision of the write, or 0 when the key changed or is gone."""
        then = {"request_put": put_request(key, value, lease=lease)}
        return await self._txn(txn_request(key, "MOD", mod_revision, then))

    async def delete_if(self, key: str, mod_revision: int) -> bool:
        """Compare-and-delete: delete the key only if its mod_revision is still
        `mod_revision`; False when it changed or is gone."""
        then = {"request_delete_range": key_range(key)}
        return bool(await self._txn(txn_request(key, "MOD", mod_revision, then)))

    async def _txn(self, body: dict[str, Any]) -> int:
        succeeded, revision = decode_txn(await self._call("/kv/txn", body, resend=False))
        return revision if succeeded else 0

    async def txn(
        self,
        compares: list[Compare],
        success: list[dict[str, Any]],
        failure: list[dict[str, Any]] = (),  # type: ignore[assignment]
        *,
        resend: bool = False,
    ) -> TxnResult:
        """A transaction: if every compare holds, the `success` operations (`put_op`,
        `range_op`, `delete_op`), else the `failure` ones; at most MAX_TXN_OPS compares and
        as many operations a branch (etcd's limit). With `resend`, one sent to a member
        that did not answer is sent to the next: only for a caller that tells from the
        answer whether an earlier try was applied (its compares fail then; a range in
        `failure` shows what the keys hold)."""
        body: dict[str, Any] = {"compare": [compare.to_json() for compare in compares]}
        if success:
            body["success"] = list(success)
        if failure:
            body["failure"] = list(failure)
        return decode_txn_result(await self._call("/kv/txn", body, resend=resend))

    async def campaign(self, key: str, value: bytes | str, lease: int) -> int:
        """Create `key` on `lease` unless it exists (an election): the key's create revision
        when this lease holds it (created now, or by an earlier try whose answer was lost),
        0 when another lease does."""
        result = await self.txn(
            [Compare(key, "CREATE", 0)],
            [put_op(key, value, lease=lease)],
            [range_op(key)],
            resend=True,
        )
        if result.succeeded:
            return result.revision
        held = result.ranges()[0] if result.ranges() else []
        if held and held[0].lease == lease:
            return held[0].create_revision
        return 0

    # --- leases

    async def grant_lease(self, ttl: int) -> int:
        """A new lease of `ttl` seconds; returns its id."""
        answer = await self._call("/lease/grant", {"TTL": str(ttl)})
        if answer.get("error"):
            raise EtcdError(f"etcd lease grant refused: {answer['error']}")
        return int(answer["ID"])

    async def keep_alive_once(self, lease: int) -> int:
        """Refresh the lease; returns its TTL from now in seconds, 0 when it is gone
        (expired or revoked)."""
        answer = await self._call("/lease/keepalive", {"ID": str(lease)}, stream=True)
        return int(answer.get("TTL", 0))

    async def revoke(self, lease: int) -> None:
        """Revoke the lease, deleting its keys at once; a lease already gone is no error."""
        try:
            await self._call("/lease/revoke", {"ID": str(lease)})
        except EtcdError as error:
            if error.code != GRPC_NOT_FOUND:
                raise

    # --- watch

    async def read_prefix(
        self, prefix: str, failed: Callable[["EtcdError"], None], retry: float = 0.5
    ) -> tuple[list[KeyValue], int]:
        """`get_prefix` until etcd answers, `failed` told of each error: the first read of
        what a daemon then follows with `watch_prefix` from the revision + 1."""
        while True:
            try:
                return await self.get_prefix(prefix)
            except EtcdError as error:
                failed(error)
                await trio.sleep(retry)

    async def follow_prefix(
        self,
        prefix: str,
        start_revision: int,
        take: Callable[["WatchEvent"], None],
        reload: Callable[[], Awaitable[int]],
        failed: Callable[["EtcdError"], None],
    ) -> None:
        """Every event on keys starting with `prefix` from `start_revision` on, to `take`, for
        as long as the caller runs (what a daemon does after `read_prefix`). A watch that
        cannot be opened (etcd away past the client's timeout) is opened again, after telling
        `failed`, from the revision it had reached; one etcd can no longer serve from there
        (compacted, canceled) starts again from what `reload()` read (the revision it returns).
        Neither ends the daemon."""
        revision = start_revision
        while True:
            watch = self.watch_prefix(prefix, revision)
            try:
                async with watch:
                    async for event in watch:
                        take(event)
            except EtcdUnavailable as error:
                failed(error)
                revision = watch.revision
            except EtcdError as error:
                failed(error)
                revision = await reload() + 1
            await trio.sleep(WATCH_RETRY_DELAY)

    def watch_prefix(self, prefix: str, start_revision: int) -> "Watch":
        """Events on keys starting with `prefix` from `start_revision` on (0: from now), in
        revision order: `async with client.watch_prefix(p, rev) as watch: async for event
        in watch: ...`. See `Watch`."""
        return Watch(self, prefix, start_revision)

    async def check_members(self) -> None:
        """Ask every endpoint for its member's status, side by side, each within
        `attempt_timeout`: `health` then says which members do not answer (calls go to the
        one that answered last, so a member gone would otherwise stay unnoticed) and which
        leads."""
        leaders: dict[str, int] = {}
        members: dict[int, str] = {}

        async def ask(endpoint: _Endpoint) -> None:
            token = await self.token() if self._username else ""
            request = encode_request(
                endpoint.authority, API_PREFIX + "/maintenance/status", {}, token
            )
            with trio.move_on_after(self.attempt_timeout):
                try:
                    connection = await self._connect(endpoint)
                    answer = await self._exchange(endpoint, connection, request, False)
                except (EtcdError, *_CONNECTION_ERRORS) as error:
                    self.health.endpoint_failed(endpoint.url, str(error) or type(error).__name__)
                    return
                self.health.failing.pop(endpoint.url, None)
                leaders[endpoint.url] = int(answer.get("leader", 0))
                members[int(answer.get("header", {}).get("member_id", 0))] = endpoint.url
                return
            self.health.endpoint_failed(endpoint.url, "stopped answering")

        try:
            async with trio.open_nursery() as nursery:
                for endpoint in self._endpoints:
                    nursery.start_soon(ask, endpoint)
        except* EtcdAuthError:
            pass  # said by the calls that need a token
        agreed = set(leaders.values())
        self.health.leader_endpoint = members.get(agreed.pop(), "") if len(agreed) == 1 else ""

    async def aclose(self) -> None:
        """Close the pooled connections; the client cannot be used afterwards."""
        self._closed = True
        for endpoint in self._endpoints:
            while endpoint.idle:
                self.network.close(endpoint.idle.pop())
        await trio.lowlevel.checkpoint()

    # --- transport

    def _order(self) -> list[int]:
        """Endpoint indexes to try, the one that answered last first."""
        count = len(self._endpoints)
        return [(self._preferred + step) % count for step in range(count)]

    async def _connect(self, endpoint: _Endpoint) -> trio.abc.Stream:
        while endpoint.idle:
            stream = endpoint.idle.pop()
            if not self.network.dropped(stream):
                return stream
            self.network.close(stream)
        return await self.network.connect(endpoint, self._ssl_context)

    async def token(self, *, renew: bool = False) -> str:
        """The auth token calls carry ("" without a user): asked for once, and again with
        `renew` (etcd refused the last one: it expired, or etcd restarted)."""
        if not self._username:
            return ""
        if self._token and not renew:
            return self._token
        try:
            answer = await self._call(
                "/auth/authenticate",
                {"name": self._username, "password": self._password},
                authenticate=False,
            )
        except EtcdError as error:
            if "authentication failed" in str(error) or error.code == GRPC_INVALID_ARGUMENT:
                raise EtcdAuthError(f"etcd refused user {self._username!r}: {error}") from None
            raise
        self._token = str(answer.get("token", ""))
        return self._token

    async def _call(
        self,
        method: str,
        body: dict[str, Any],
        *,
        resend: bool = True,
        stream: bool = False,
        authenticate: bool = True,
    ) -> dict[str, Any]:
        """`_call_once`, with the auth token when there is a user: asked for the first time,
        and once more when etcd refuses it."""
        if not authenticate or not self._username:
            return await self._call_once(method, body, resend=resend, stream=stream, token="")
        token = await self.token()
        try:
            return await self._call_once(method, body, resend=resend, stream=stream, token=token)
        except EtcdError as error:
            if not _token_refused(error):
                raise
        token = await self.token(renew=True)
        return await self._call_once(method, body, resend=resend, stream=stream, token=token)

    async def _call_once(
        self, method: str, body: dict[str, Any], *, resend: bool, stream: bool, token: str
    ) -> dict[str, Any]:
        """POST `body` to /v3`method` with failover; the answer's JSON (for a streaming RPC,
        its one `result`)."""
        if self._closed:
            raise trio.ClosedResourceError("etcd client is closed")
        path = API_PREFIX + method
        failures: list[str] = []
        deadline = trio.current_time() + self.timeout
        count = len(self._endpoints)
        attempt = 0
        # Endpoints that refused the connection in the round under way: a round of refusals
        # only (nothing listens anywhere) ends the call at once, as no answer can come.
        refused = 0
        while True:
            index = (self._preferred + attempt) % count
            if attempt and attempt % count == 0:
                if refused == count:
                    break
                refused = 0
            attempt += 1
            left = deadline - trio.current_time()
            if left <= 0:
                break
            endpoint = self._endpoints[index]
            # One endpoint and a request that may not be sent twice: nothing to move on to,
            # so the attempt may take the whole call's time.
            budget = min(left, self.attempt_timeout) if count > 1 or resend else left
            request = encode_request(endpoint.authority, path, body, token)
            sent = False
            with trio.move_on_after(budget):
                try:
                    connection = await self._connect(endpoint)
                    sent = True
                    answer = await self._exchange(endpoint, connection, request, stream)
                except _NotSent as error:
                    self._endpoint_failed(endpoint, str(error), failures)
                    refused += 1
                    continue
                except _CONNECTION_ERRORS as error:  # EtcdUnavailable among them
                    reason = str(error) or type(error).__name__
                    self._endpoint_failed(endpoint, reason, failures)
                    if not resend:
                        raise self._unavailable(
                            f"etcd {endpoint.url} {path}: {reason}; etcd may have applied it"
                        ) from None
                    await self._pause_between_rounds(attempt, count, deadline)
                    continue
                except EtcdError:
                    # A refusal is an answer: etcd is there.
                    self._preferred = index
                    self.health.answered(endpoint.url)
                    raise
                self._preferred = index
                self.health.answered(endpoint.url)
                return answer
            reason = f"no answer within {budget:.3g} s"
            self._endpoint_failed(endpoint, reason, failures)
            if sent and not resend:
                raise self._unavailable(
                    f"etcd {endpoint.url} {path}: {reason}; etcd may have applied it"
                )
        raise self._unavailable(
            f"no etcd endpoint answered {path} (timeout {self.timeout:g} s): "
            + _each_endpoint(failures)
        )

    def _endpoint_failed(self, endpoint: _Endpoint, reason: str, failures: list[str]) -> None:
        failures.append(f"{endpoint.url} {reason}")
        self.health.endpoint_failed(endpoint.url, reason)

    def _unavailable(self, text: str) -> "EtcdUnavailable":
        self.health.failed(text)
        return EtcdUnavailable(text)

    async def _pause_between_rounds(self, attempt: int, count: int, deadline: float) -> None:
        """After a round of endpoints that all refused at once (etcd restarting), a breath
        before the next, rather than a busy loop until the deadline."""
        if attempt % count == 0:
            await trio.sleep(min(LEASE_RETRY_DELAY, max(deadline - trio.current_time(), 0)))

    async def _exchange(
        self, endpoint: _Endpoint, connection: trio.abc.Stream, request: bytes, stream: bool
    ) -> dict[str, Any]:
        """One request and its answer on `connection`, which goes back to the pool after a
        clean keep-alive answer and is closed otherwise."""
        parser = ResponseParser(EtcdError)
        try:
            await connection.send_all(request)
            await _read_answer(connection, parser)
        except BaseException:
            self.network.close(connection)
            raise
        if parser.keep_alive and len(endpoint.idle) < MAX_IDLE_CONNECTIONS and not self._closed:
            endpoint.idle.append(connection)
        else:
            self.network.close(connection)
        body = parser.take_body()
        if stream and parser.status == 200:
            lines = LineSplitter().feed(body + b"\n")
            if not lines:
                raise _NoAnswer("empty stream")
            return decode_stream_line(lines[0])
        return decode_answer(parser.status, body)


class Watch:
    """A watch on a key prefix: an async iterator of `WatchEvent`s in revision order, and an
    async context manager that closes its connection.

    It opens on the first iteration (or `open`), with the client's failover and timeout:
    EtcdUnavailable when no endpoint answers. Once open, it survives a dropped connection
    (etcd restarted, killed, a member gone) and a member that stops answering (paused, stuck,
    cut off from the majority: after `WATCH_PROBE_INTERVAL` of silence it asks the member for
    a read, and leaves it when none comes): it re-opens from the revision after the last
    event it received, on the next endpoint that answers, retrying every 50 ms doubling to 1 s
    until one does, so no event is lost or repeated. It ends only by
    cancellation or by an error: EtcdCompacted when its revision was compacted away,
    EtcdError when etcd cancels it otherwise. `revision` is the revision the next event will
    be at or after.
    """

    def __init__(self, client: EtcdClient, prefix: str, start_revision: int) -> None:
        self._client = client
        self.prefix = prefix
        self.revision = start_revision
        self._pending: collections.deque[WatchEvent] = collections.deque()
        self._connection: trio.abc.Stream | None = None
        self._parser = ResponseParser(EtcdError)
        self._lines: collections.deque[bytes] = collections.deque()
        self._splitter = LineSplitter()
        self._opened = False
        self._closed = False
        # etcd refused the last token: the next open asks for a new one.
        self._token_refused = False
        # A create request is out and not yet confirmed.
        self._creating = False
        # The endpoint the watch is open on (or was, last).
        self._index = client._preferred

    async def __aenter__(self) -> "Watch":
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    def __aiter__(self) -> "Watch":
        return self

    async def __anext__(self) -> WatchEvent:
        while not self._pending:
            if self._closed:
                raise StopAsyncIteration
            await self._receive()
        return self._pending.popleft()

    async def open(self) -> None:
        """Open the watch now (iteration does it otherwise); EtcdUnavailable when no
        endpoint answers within the client's timeout."""
        if self._opened:
            return
        if self._creating:
            # An open cancelled after its create request went out: etcd may have created the
            # watch "from now" already, so its confirmation is read on that connection rather
            # than a new watch made later (which would miss what happened in between).
            with trio.move_on_after(self._client.timeout):
                try:
                    await self._await_created()
                except _CONNECTION_ERRORS:
                    self._drop()
                else:
                    self._opened = True
                    return
            self._drop()
        client = self._client
        failures: list[str] = []
        deadline = trio.current_time() + client.timeout
        count = len(client._endpoints)
        attempt = refused = 0
        while (left := deadline - trio.current_time()) > 0:
            index = (client._preferred + attempt) % count
            attempt += 1
            outcome = await self._try_open(index, min(left, client.attempt_timeout), failures)
            if outcome == "opened":
                self._opened = True
                return
            refused += outcome == "refused"
            if attempt % count == 0:
                if refused == count:
                    break  # nothing listens anywhere: no answer can come
                refused = 0
                await trio.sleep(min(LEASE_RETRY_DELAY, max(deadline - trio.current_time(), 0)))
        raise client._unavailable(
            f"no etcd endpoint opened a watch on {self.prefix!r} "
            f"(timeout {client.timeout:g} s): " + _each_endpoint(failures)
        )

    async def _try_open(
        self, index: int, budget: float, failures: list[str]
    ) -> Literal["opened", "refused", "failed"]:
        """Open the watch on endpoint `index` within `budget` seconds: "opened", or what
        failed is added to `failures` ("refused": the connection was refused)."""
        client = self._client
        endpoint = client._endpoints[index]
        with trio.move_on_after(budget):
            try:
                await self._open_on(endpoint)
            except _CONNECTION_ERRORS as error:
                self._drop()
                client._endpoint_failed(endpoint, str(error), failures)
                return "refused" if isinstance(error, _NotSent) else "failed"
            self._index = index
            client._preferred = index
            client.health.answered(endpoint.url)
            return "opened"
        self._drop()
        client._endpoint_failed(endpoint, f"no answer within {budget:.3g} s", failures)
        return "failed"

    async def aclose(self) -> None:
        """Stop watching and close the connection."""
        self._closed = True
        self._drop()
        await trio.lowlevel.checkpoint()

    async def _open_on(self, endpoint: _Endpoint) -> None:
        """Send the create request on a new connection and read until etcd confirms it."""
        self._drop()
        # A watch holds its connection for as long as it lives, so it never takes one from
        # (or gives one back to) the pool.
        client = self._client
        token = await client.token(renew=self._token_refused)
        connection = self._connection = await client.network.connect(endpoint, client._ssl_context)
        body = watch_request(self.prefix, self.revision)
        await connection.send_all(
            encode_request(endpoint.authority, API_PREFIX + "/watch", body, token)
        )
        self._creating = True
        await self._await_created()

    async def _await_created(self) -> None:
        """Read the watch's stream until etcd confirms it was created."""
        while True:
            try:
                message = await self._next_message()
            except EtcdError as error:
                if not _token_refused(error):
                    raise
                # An expired token: a new one for the next try (a connection error for now).
                self._token_refused = True
                raise _NoAnswer(str(error)) from None
            self._token_refused = False
            if message.created:
                self._creating = False
                if self.revision <= 0:
                    # "From now": pin it, so a re-open does not skip what happens meanwhile.
                    self.revision = message.revision + 1
                return
            self._take(message)

    async def _receive(self) -> None:
        if not self._opened:
            await self.open()
            return
        try:
            self._take(await self._next_message())
        except _CONNECTION_ERRORS:
            await self._reopen()

    async def _reopen(self) -> None:
        """Open the watch again from its revision, the endpoint it was on last (it failed),
        until one answers: a member stopped or cut off is left for the others at once."""
        client = self._client
        count = len(client._endpoints)
        delay = WATCH_RETRY_DELAY
        failures: list[str] = []
        while True:
            for step in range(1, count + 1):
                index = (self._index + step) % count
                try:
                    if await self._try_open(index, client.attempt_timeout, failures) == "opened":
                        return
                except EtcdAuthError:
                    # A refused password after a restart of etcd is waited out too.
                    self._drop()
            client.health.failed(
                f"no etcd endpoint reopened the watch on {self.prefix!r}: "
                + _each_endpoint(failures[-count:])
            )
            await trio.sleep(delay)
            delay = min(delay * 2, WATCH_RETRY_MAX_DELAY)

    def _take(self, message: WatchMessage) -> None:
        if message.canceled:
            self._closed = True
            self._drop()
            if message.compact_revision:
                raise EtcdCompacted(
                    f"etcd watch on {self.prefix!r} from revision {self.revision}: compacted "
                    f"up to revision {message.compact_revision}",
                    message.compact_revision,
                )
            raise EtcdError(f"etcd canceled the watch on {self.prefix!r}: {message.cancel_reason}")
        if message.events:
            self._pending.extend(message.events)
            # etcd sends all the events of one revision in one message, so once a message is
            # in, everything up to its last revision is.
            self.revision = message.events[-1].kv.mod_revision + 1
        elif not message.created and message.revision >= self.revision:
            # A progress notification: every event up to its revision has been sent.
            self.revision = message.revision + 1

    async def _next_message(self) -> WatchMessage:
        connection = self._connection
        assert connection is not None
        while not self._lines:
            if self._parser.complete:
                if self._parser.status != 200:
                    decode_answer(self._parser.status, self._parser.take_body())
                raise _NoAnswer("watch stream ended")
            data = None
            with trio.move_on_after(WATCH_PROBE_INTERVAL):
                data = await connection.receive_some(RECEIVE_SIZE)
            if data is None:
                if self._opened:
                    await self._probe()
                continue
            if not data:
                raise _NoAnswer("connection closed")
            self._parser.feed(data)
            if self._parser.status == 200:
                self._lines.extend(self._splitter.feed(self._parser.take_body()))
        return decode_watch(decode_stream_line(self._lines.popleft()))

    async def _probe(self) -> None:
        """The stream was silent: ask its member for a linearizable read of the prefix (one
        it cannot serve while paused, stuck or cut off from the majority); _NoAnswer when it
        does not answer one in `attempt_timeout`, so the watch moves to another member."""
        client = self._client
        endpoint = client._endpoints[self._index]
        body = {**key_range(self.prefix, prefix=True), "count_only": True}
        token = await client.token() if client._username else ""
        request = encode_request(endpoint.authority, API_PREFIX + "/kv/range", body, token)
        with trio.move_on_after(client.attempt_timeout):
            try:
                connection = await client._connect(endpoint)
                await client._exchange(endpoint, connection, request, False)
            except EtcdError as error:
                if not isinstance(error, EtcdUnavailable):
                    return  # it answers, if only to refuse
                client.health.endpoint_failed(endpoint.url, str(error))
                raise _NoAnswer(f"{endpoint.url} does not serve reads: {error}") from None
            except _CONNECTION_ERRORS as error:
                client.health.endpoint_failed(endpoint.url, str(error))
                raise _NoAnswer(f"{endpoint.url} stopped answering: {error}") from None
            return
        client.health.endpoint_failed(endpoint.url, "stopped answering")
        raise _NoAnswer(f"{endpoint.url} answered no read within {client.attempt_timeout:g} s")

    def _drop(self) -> None:
        if self._connection is not None:
            self._client.network.close(self._connection)
            self._connection = None
        self._parser = ResponseParser(EtcdError)
        self._splitter = LineSplitter()
        self._lines.clear()
        self._creating = False


def _each_endpoint(failures: list[str]) -> str:
    """What failed, the last failure of each endpoint once ("<url> <reason>" each)."""
    last: dict[str, str] = {}
    for failure in failures:
        url, _, reason = failure.partition(" ")
        last.pop(url, None)
        last[url] = reason
    return "; ".join(f"{url} {reason}" for url, reason in last.items())


def _token_refused(error: EtcdError) -> bool:
    return error.code == GRPC_UNAUTHENTICATED or any(
        refusal in str(error) for refusal in _TOKEN_REFUSALS
    )


async def release_lease(client: "EtcdClient", lease: int, timeout: float = 1.0) -> None:
    """Revoke `lease` now, shielded from cancellation and within `timeout` (a clean stop, a
    lost campaign): what it guarded moves on at once, not a TTL later. An etcd that does not
    answer is left to let the lease expire."""
    with trio.CancelScope(shield=True), trio.move_on_after(timeout):
        try:
            await client.revoke(lease)
        except EtcdError:
            pass


async def keep_lease_alive(
    client: EtcdClient,
    lease: int,
    ttl: float,
    *,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Refresh `lease` every `ttl`/3 seconds until cancelled; with `nursery.start`, started
    once the first refresh succeeded.

    Raises LeaseLost when etcd says the lease is gone, or when no refresh succeeded before
    its TTL ran out (counted from before the last successful request was sent, so never
    later than etcd's own count): the holder must then give up what the lease guarded. A
    refresh that finds no endpoint is retried every 0.2 s meanwhile.
    """
    sent = trio.current_time()
    remaining = await client.keep_alive_once(lease)
    if remaining <= 0:
        raise LeaseLost(f"etcd lease {lease} is gone (expired or revoked)")
    expires = sent + remaining
    task_status.started()
    next_refresh = trio.current_time() + ttl / 3
    while True:
        await trio.sleep_until(next_refresh)
        sent = trio.current_time()
        if sent >= expires:
            # The process did not run in time (frozen, SIGSTOP, an overloaded machine): the
            # lease may be gone already, and whatever it guarded with it.
            raise LeaseLost(f"etcd lease {lease}: not refreshed within its TTL of {ttl:g} s")
        with trio.move_on_after(expires - sent):
            try:
                remaining = await client.keep_alive_once(lease)
            except EtcdUnavailable:
                next_refresh = trio.current_time() + min(ttl / 3, LEASE_RETRY_DELAY)
                continue
            if remaining <= 0:
                raise LeaseLost(f"etcd lease {lease} is gone (expired or revoked)")
            expires = sent + remaining
            next_refresh = sent + ttl / 3
            continue
        # Nothing answered for as long as the lease lasts: etcd is away, whether or not an
        # attempt of its own ran out first (its timeout may be longer than what was left).
        client.health.failed(f"no answer within the lease's TTL of {ttl:g} s")
        raise LeaseLost(f"etcd lease {lease}: no refresh succeeded within its TTL of {ttl:g} s")


def etcd_client(options, *, timeout: float = 3.0, network: EtcdNetwork = SOCKETS) -> EtcdClient:
    """The etcd client of a daemon's cluster options: its endpoints (a bare `host:port` is
    plain HTTP), TLS files and credentials; `network`, how it reaches them."""
    endpoints = [a.strip() for a in options.cluster_leadership_addresses.split(",") if a.strip()]
    context = None
    if any(a.startswith("https://") for a in endpoints):
        context = ssl.create_default_context(
            cafile=options.cluster_leadership_tls_root_ca_file or None
        )
        if options.cluster_leadership_tls_cert:
            context.load_cert_chain(
                options.cluster_leadership_tls_cert, options.cluster_leadership_tls_key or None
            )
    return EtcdClient(
        [a if "://" in a else f"http://{a}" for a in endpoints],
        timeout=timeout,
        ssl_context=context,
        username=options.cluster_leadership_username,
        password=options.cluster_leadership_password,
        network=network,
    )
