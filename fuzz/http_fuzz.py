"""A seeded HTTP request generator for nsqd's API, and a checker of every response against
fuzz/http_spec.py (the table docs/openapi.yaml is generated from).

Requests are built as raw bytes: real endpoints with mutated methods and paths, query strings
with hostile topic and channel names (63/64/65 characters, `#ephemeral` tricks, unicode, NUL,
bad escapes), bodies at and over the limits, wrong Content-Length, chunked bodies, HTTP/1.0,
pipelining, and headers past Go's 1 MiB limit. Slowloris connections dribble their headers
through the whole run and must still be answered at the end.
"""

import json
import random
import socket
import struct
import threading
from collections import Counter
from dataclasses import dataclass, field
from urllib.parse import quote

from fuzz import http_spec
from fuzz.tcp_grammar import CANARY_TOPIC, INVALID_NAMES
from fuzz.workers import run_workers

MAX_MSG_SIZE = 1024 * 1024
MAX_BODY_SIZE = 5 * 1024 * 1024
RESPONSE_DEADLINE = 60.0  # safety net against a hang, never a measure of speed

# The HTTP fuzzer's own names, apart from the TCP fuzzer's (it deletes what it creates).
VALID_TOPICS = ["fh", "fh.x-y_z", "fh" + "h" * 62, "fh" + "h" * 61, "fhe#ephemeral",
                "h" * 54 + "#ephemeral", "fhp"]  # fmt: skip
VALID_CHANNELS = ["hc", "hc#ephemeral", "c" * 64, "H" * 54 + "#ephemeral"]
PARTITION_TOPIC = "fhp"  # the only topic the fuzzer gives many partitions
BAD_QUERY_VALUES = [
    "",
    "%",
    "%zz",
    "%0",
    "a;b",
    "%00",
    "%FF%FE",
    "a+b",
    "%C2%B2",
    "%D9%A3",
    "-1",
    "1e3",
    "+5",
    " 5",
    "1_0",
    "99999999999999999999",
    "18446744073709551616",
    "%F0%9F%9A%80",
]
PATH_OPTS = ["log_level", "nsqlookupd_tcp_addresses", "max_msg_size", "mem_queue_size",
             "tcp_address", "nope", "", "LOG_LEVEL", "log_level/x", "%00", "ü"]  # fmt: skip


@dataclass
class Request:
    raw: bytes
    method: str
    path: str  # as the server will route it (unescaped)
    malformed: bool = False  # may get the bare 400 and a close
    terminal: bool = False  # the connection's framing may be off after it
    huge_headers: bool = False  # over Go's header limit: 431
    too_big: bool = False  # Content-Length over the route's limit: 413 and close
    truncated: bool = False  # body cut short, then half-close: no answer is fine


@dataclass
class HTTPStats:
    requests: int = 0
    responses: int = 0
    connections: int = 0
    status: Counter = field(default_factory=Counter)
    # The routes that answered 5xx, and how often.
    server_errors: Counter = field(default_factory=Counter)
    messages: Counter = field(default_factory=Counter)
    violations: list[str] = field(default_factory=list)
    violation_count: int = 0
    slowloris: int = 0
    slowloris_answered: int = 0

    def violation(self, text: str) -> None:
        self.violation_count += 1
        if len(self.violations) < 50:
            self.violations.append(text)

    def merge(self, other: "HTTPStats") -> None:
        self.requests += other.requests
        self.responses += other.responses
        self.connections += other.connections
        self.status.update(other.status)
        self.server_errors.update(other.server_errors)
        self.messages.update(other.messages)
        self.violation_count += other.violation_count
        self.violations.extend(other.violations[: max(0, 50 - len(self.violations))])
        self.slowloris += other.slowloris
        self.slowloris_answered += other.slowloris_answered


class RequestGrammar:
    def __init__(self, rng: random.Random) -> None:
        self.rng = rng

    def name_value(self, valid: list[str]) -> str:
        """A query value for topic or channel, already percent-encoded."""
        rng = self.rng
        roll = rng.random()
        if roll < 0.6:
            return quote(rng.choice(valid), safe="")
        if roll < 0.65:
            return rng.choice(valid).replace("#", "%23")
        if roll < 0.7:
            return rng.choice(valid)  # a raw '#': read as part of the query, as Go does
        if roll < 0.9:
            return quote(rng.choice(INVALID_NAMES), safe="")
        return rng.choice(BAD_QUERY_VALUES)

    def value(self, name: str) -> str:
        rng = self.rng
        good = {
            "defer": ["0", "1000", "3600000", "3600001", "-1"],
            "binary": ["true", "false", "1", "0", "yes", ""],
            "format": ["json", "text", ""],
            "include_clients": ["true", "false", "x"],
            "include_mem": ["true", "false", "0"],
            "partition": ["0", "1", "-1", "", "254", "255", "x"],
            "partition_num": ["1", "2", "255", "256", "0", "x"],
            "orderedmulti": ["true", "false"],
            "ext": ["true", "false"],
            "trace_id": ["0", "1", "18446744073709551615", "18446744073709551616", "x", ""],
            "type": ["ordered", "none", "", "x"],
        }.get(name, ["x"])
        if rng.random() < 0.85:
            return quote(rng.choice(good), safe="")
        return rng.choice(BAD_QUERY_VALUES)

    def query(self, endpoint: http_spec.Endpoint | None) -> str:
        rng = self.rng
        parts = []
        params = endpoint.params if endpoint else ()
        for param in params:
            if param.name == "opt":
                continue
            if rng.random() < (0.92 if param.required else 0.35):
                if param.name == "topic":
                    topics = VALID_TOPICS
                    if endpoint.path == "/topic/create" and rng.random() < 0.7:
                        topics = [t for t in VALID_TOPICS if t != PARTITION_TOPIC]
                    value = self.name_value(topics)
                elif param.name == "channel":
                    value = self.name_value(VALID_CHANNELS)
                else:
                    value = self.value(param.name)
                parts.append(f"{param.name}={value}")
        if endpoint is not None and endpoint.path == "/topic/create":
            # Many partitions only on one topic, so what the fuzzer creates stays bounded.
            has_partitions = any(p.startswith(("partition_num=", "partition=")) for p in parts)
            if has_partitions:
                parts = [p for p in parts if not p.startswith("topic=")]
                parts.append(f"topic={PARTITION_TOPIC}")
        roll = rng.random()
        if roll < 0.05 and parts:
            parts.append(rng.choice(parts))  # a repeated parameter: the first one counts
        elif roll < 0.08:
            parts.append(rng.choice(["&", "=", "x", "topic", "%", ";", "a=%G0"]))
        elif roll < 0.1:
            parts.append("pad=" + "p" * rng.choice([1000, 60_000]))
        rng.shuffle(parts)
        return "&".join(parts)

    def body(self, endpoint: http_spec.Endpoint | None, query: str) -> bytes:
        rng = self.rng
        path = endpoint.path if endpoint else ""
        if path == "/mpub" and ("binary=true" in query or "binary=1" in query):
            count = rng.choice([1, 2, 0, -1, 2**31 - 1])
            bodies = [rng.randbytes(rng.randrange(1, 50)) for _ in range(max(0, min(count, 5)))]
            data = struct.pack(">i", count) + b"".join(
                struct.pack(">i", len(b)) + b for b in bodies
            )
            if rng.random() < 0.3:
                data = data[: rng.randrange(len(data) + 1)]
            return data
        if path == "/mpub":
            lines = [rng.randbytes(rng.randrange(0, 40)).replace(b"\n", b"") for _ in range(5)]
            return b"\n".join(lines)
        if path == "/config/{opt}":
            return rng.choice(
                [b"[]", b'["127.0.0.1:1"]', b"null", b"{}", b"[1]", b'"x"', b"info", b"warn",
                 b"error", b"bogus", b"", b"[" * 100_000, b"\x00", "ü".encode(), b"WARN"]
            )  # fmt: skip
        roll = rng.random()
        if roll < 0.7:
            return rng.randbytes(rng.randrange(1, 300))
        if roll < 0.8:
            return b""
        if roll < 0.9:
            return rng.choice([b"\x00", b"\r\n\r\n", "ü😀".encode(), b"GET / HTTP/1.1\r\n\r\n"])
        if roll < 0.995:
            return rng.randbytes(rng.randrange(300, 20_000))
        return b"m" * rng.choice([MAX_MSG_SIZE, MAX_MSG_SIZE + 1])

    def request(self) -> Request:
        rng = self.rng
        endpoint = rng.choice(http_spec.ENDPOINTS)
        method = endpoint.method
        if rng.random() < 0.07:
            method = rng.choice(["GET", "POST", "PUT", "DELETE", "PATCH", "OPTIONS", "HEAD"])
        path = endpoint.path.replace("{opt}", rng.choice(PATH_OPTS))
        raw_path = quote(path, safe="/%")
        route_path = path
        roll = rng.random()
        if roll < 0.03:
            raw_path = route_path = path + "/"
        elif roll < 0.05:
            raw_path = route_path = path.upper()
        elif roll < 0.06:
            raw_path = route_path = "/" + path
        elif roll < 0.07:
            raw_path = "".join(f"%{ord(c):02X}" if c.isalpha() else c for c in path)
        elif roll < 0.08:
            raw_path = route_path = rng.choice(["/nope", "/debug/pprof/", "/", "/stats/x"])
        elif roll < 0.085:
            raw_path = route_path = "/" + "a" * rng.choice([1000, 100_000])
        query = self.query(endpoint)
        target = raw_path + ("?" + query if query or rng.random() < 0.05 else "")
        body = self.body(endpoint, query)
        if method in ("GET", "HEAD", "OPTIONS", "DELETE") and rng.random() < 0.8:
            body = b""
        version = "HTTP/1.1" if rng.random() < 0.95 else "HTTP/1.0"
        headers = [("Host", "127.0.0.1")]
        malformed = terminal = huge = too_big = truncated = False
        if version == "HTTP/1.0" and rng.random() < 0.5:
            headers.append(("Connection", "keep-alive"))
        elif rng.random() < 0.03:
            headers.append(("Connection", "close"))
            terminal = True
        framing = rng.random()
        payload = body
        declared_limit = MAX_BODY_SIZE if endpoint.path == "/mpub" else MAX_MSG_SIZE
        if framing < 0.85:
            if body or method in ("POST", "PUT"):
                headers.append(("Content-Length", str(len(body))))
            too_big = len(body) > declared_limit
        elif framing < 0.9:
            chunked = b"".join(b"%x\r\n%s\r\n" % (len(c), c) for c in _pieces(rng, body) if c)
            payload = chunked + b"0\r\n\r\n"
            headers.append(("Transfer-Encoding", "chunked"))
            if rng.random() < 0.2:
                payload = rng.choice([b"zz\r\n", b"5\r\nab\r\n0\r\n\r\n", b"-1\r\n"])
                malformed = terminal = True
        elif framing < 0.93:  # a declared length far past every limit
            headers.append(("Content-Length", str(rng.choice([2**31, 10**12, 2**63 - 1]))))
            payload = body[:10]
            too_big = True
            terminal = True
        elif framing < 0.96:  # a declared length longer than what comes: cut off, then EOF
            headers.append(("Content-Length", str(len(body) + rng.randrange(1, 5000))))
            truncated = terminal = True
        else:  # unparseable framing
            value = rng.choice(["abc", "-1", "1 2", "99999999999999999999999", "0x10", ""])
            headers.append(("Content-Length", value))
            if rng.random() < 0.5:
                headers.append(("Content-Length", "7"))
            malformed = terminal = True
        roll = rng.random()
        if roll < 0.02:
            headers.append(("X-Fuzz", "\x00ü".encode().decode("latin-1")))
            malformed = terminal = True  # llhttp refuses a NUL in a header value
        elif roll < 0.025:
            headers.append(("X-Big", "b" * ((1 << 20) + 8192)))
            huge = terminal = True
        elif roll < 0.04:
            headers.extend((f"X-H{n}", "v" * 100) for n in range(rng.choice([10, 500])))
        elif roll < 0.05:
            headers.append(("Expect", "100-continue"))
        if len(raw_path) > 1 << 20:
            huge = terminal = True
        if any(c in target for c in " \x7f") or not target.isascii() or not target.isprintable():
            malformed = terminal = True  # a raw space, control or non-ASCII byte in the target
        head = f"{method} {target} {version}\r\n" + "".join(f"{k}: {v}\r\n" for k, v in headers)
        raw = head.encode("latin-1") + b"\r\n" + payload
        if rng.random() < 0.005:  # not HTTP at all
            raw = rng.choice([b"\x16\x03\x01\x02\x00", b"GET\r\n\r\n", b"  V2", b"\r\n" * 3])
            raw += rng.randbytes(rng.randrange(0, 100)) + b"\r\n\r\n"
            malformed = terminal = True
        if version == "HTTP/1.0" and ("Connection", "keep-alive") not in headers:
            terminal = True
        return Request(raw, method, _unescape_path(raw_path, route_path), malformed, terminal,
                       huge, too_big, truncated)  # fmt: skip


def _unescape_path(raw_path: str, route_path: str) -> str:
    if "%" in raw_path:
        from urllib.parse import unquote_plus

        return unquote_plus(raw_path)
    return route_path


def _pieces(rng: random.Random, body: bytes) -> list[bytes]:
    if len(body) < 2:
        return [body]
    cut = rng.randrange(1, len(body))
    return [body[:cut], body[cut:]]


# -- responses -----------------------------------------------------------------------------


@dataclass
class Response:
    status: int
    reason: str
    headers: dict[str, str]
    body: bytes
    raw_head: bytes


class ResponseReader:
    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buffer = b""
        self.eof = False

    def _fill(self) -> bool:
        try:
            data = self.sock.recv(262144)
        except (ConnectionResetError, BrokenPipeError):
            data = b""
        if not data:
            self.eof = True
            return False
        self.buffer += data
        return True

    def read(self, head_request: bool) -> Response | None:
        """The next response, None on a clean EOF before one began."""
        while b"\r\n\r\n" not in self.buffer:
            if not self._fill():
                if self.buffer:
                    raise ValueError(f"EOF inside a response head: {self.buffer[:200]!r}")
                return None
        head, _, self.buffer = self.buffer.partition(b"\r\n\r\n")
        lines = head.split(b"\r\n")
        version, _, rest = lines[0].partition(b" ")
        status_text, _, reason = rest.partition(b" ")
        if version not in (b"HTTP/1.1", b"HTTP/1.0") or not status_text.isdigit():
            raise ValueError(f"bad status line {lines[0][:200]!r}")
        headers = {}
        for line in lines[1:]:
            name, sep, value = line.partition(b":")
            if not sep:
                raise ValueError(f"bad header line {line[:200]!r}")
            headers[name.decode("latin-1").lower()] = value.strip().decode("latin-1")
        if head_request:
            body = b""
        elif "content-length" in headers:
            length = int(headers["content-length"])
            while len(self.buffer) < length:
                if not self._fill():
                    raise ValueError("EOF inside a response body")
            body, self.buffer = self.buffer[:length], self.buffer[length:]
        else:  # Go's bare 400/431: the body runs to the close
            while self._fill():
                pass
            body, self.buffer = self.buffer, b""
        return Response(int(status_text), reason.decode("latin-1"), headers, body, head)


def check_response(request: Request, response: Response, stats: HTTPStats) -> str | None:
    """None when the response is one nsqd may give to this request, else what is wrong."""
    status = response.status
    stats.status[status] += 1
    if status >= 500:
        stats.server_errors[request.path] += 1
    if status == 400 and response.headers.get("content-type") == http_spec.TEXT:
        if request.method != "HEAD" and response.body != http_spec.BAD_REQUEST_TEXT:
            return f"bare 400 with body {response.body[:100]!r}"
        return None if request.malformed else "bare 400 to a well-formed request"
    if status == 431:
        # Go writes it raw, body included, whatever the method (we do not read a HEAD's).
        expected = b"" if request.method == "HEAD" else http_spec.HEADERS_TOO_LARGE_TEXT
        if response.body != expected:
            return f"431 with body {response.body[:100]!r}"
        return None if request.huge_headers else "431 to a request with small headers"
    if request.huge_headers:
        return f"{status} to a request with over 1 MiB of headers (Go: 431)"
    endpoint = http_spec.route(request.method, request.path)
    methods = http_spec.methods_of(request.path)
    if request.method == "OPTIONS" and methods and endpoint is None:
        allow = response.headers.get("allow", "")
        if status != 200 or set(allow.split(", ")) != methods | {"OPTIONS"}:
            return f"OPTIONS answered {status} Allow {allow!r}"
        return None
    message = None
    if status != 200:
        if request.method == "HEAD":
            message = "(HEAD: no body)"
            if response.body:
                return "a body in the response to HEAD"
        else:
            if response.headers.get("content-type") != http_spec.JSON:
                return f"{status} with Content-Type {response.headers.get('content-type')!r}"
            try:
                document = json.loads(response.body)
            except ValueError:
                return f"{status} body is not JSON: {response.body[:100]!r}"
            if not isinstance(document, dict) or not isinstance(document.get("message"), str):
                return f"{status} body is not Go's error envelope: {response.body[:100]!r}"
            message = document["message"]
            stats.messages[f"{status} {message}"] += 1
            if response.headers.get("x-nsq-content-type") != "nsq; version=1.0":
                return f"{status} {message} without X-NSQ-Content-Type"
    if not methods:
        if status == 404 and message in ("NOT_FOUND", "(HEAD: no body)"):
            return None
        return f"{status} {message} for the unknown path {request.path[:80]!r}"
    if endpoint is None:
        allow = response.headers.get("allow", "")
        if status == 405 and set(allow.split(", ")) == methods | {"OPTIONS"}:
            return None
        return f"{status} {message} Allow {allow!r} for {request.method} {request.path[:80]!r}"
    if status == 200:
        return _check_ok(endpoint, request, response)
    if message == "(HEAD: no body)":
        return None
    if status == 413 and request.too_big and message in ("MSG_TOO_BIG", "BODY_TOO_BIG",
                                                          "INVALID_VALUE"):  # fmt: skip
        return None
    allowed = endpoint.errors.get(status)
    if allowed is None or (allowed and message not in allowed):
        return f"{status} {message!r} is not documented for {endpoint.method} {endpoint.path}"
    return None


def _check_ok(endpoint: http_spec.Endpoint, request: Request, response: Response) -> str | None:
    if request.method == "HEAD":
        return None if not response.body else "a body in the response to HEAD"
    if endpoint.ok == "text:OK" and response.body != b"OK":
        return f"200 with body {response.body[:100]!r}"
    kind = response.headers.get("content-type", "")
    if endpoint.ok in ("json", "stats", "config") and kind == http_spec.JSON:
        try:
            json.loads(response.body)
        except ValueError:
            return f"200 JSON that does not parse: {response.body[:100]!r}"
    if endpoint.ok == "json" and kind != http_spec.JSON:
        return f"200 with Content-Type {kind!r}"
    if endpoint.path.startswith(("/topic/", "/channel/")) and response.body:
        return f"200 with a body {response.body[:100]!r}"
    return None


# -- running -----------------------------------------------------------------------------


class HTTPFuzzer:
    def __init__(self, port: int, seed: int, total: int, workers: int = 4, progress=None) -> None:
        self.port = port
        self.seed = seed
        self.total = total
        self.workers = workers
        self.progress = progress
        self.stats = HTTPStats()
        self._lock = threading.Lock()
        self._claimed = 0

    def _claim(self, count: int) -> int:
        with self._lock:
            granted = max(0, min(count, self.total - self._claimed))
            self._claimed += granted
            return granted

    def _worker(self, number: int) -> None:
        rng = random.Random(f"{self.seed}-http-{number}")
        grammar = RequestGrammar(rng)
        local = HTTPStats()
        sock = None
        reader = None
        history: list[bytes] = []
        try:
            while True:
                batch = self._claim(rng.choice([1, 1, 1, 1, 2, 5]))
                if not batch:
                    break
                requests = [grammar.request() for _ in range(batch)]
                # Only the last request of a pipeline may leave the framing out of step.
                cut = next((i for i, r in enumerate(requests) if r.terminal), None)
                if cut is not None:
                    requests = requests[: cut + 1]
                    with self._lock:
                        self._claimed -= batch - len(requests)
                if sock is None:
                    sock = socket.create_connection(("127.0.0.1", self.port))
                    sock.settimeout(RESPONSE_DEADLINE)
                    reader = ResponseReader(sock)
                    local.connections += 1
                    history = []
                closed = self._exchange(sock, reader, requests, local, history)
                history = (history + [r.raw[:120] for r in requests])[-4:]
                if closed or requests[-1].terminal:
                    sock.close()
                    sock = None
                if local.requests % 500 < batch:
                    with self._lock:
                        self.stats.merge(local)
                    local = HTTPStats()
                    if self.progress is not None:
                        self.progress(self.stats)
        except Exception as error:
            local.violation(f"http w{number}: fuzzer error {error!r}")
        finally:
            if sock is not None:
                sock.close()
            with self._lock:
                self.stats.merge(local)

    def _exchange(
        self, sock, reader, requests: list[Request], stats: HTTPStats, history: list[bytes]
    ) -> bool:
        """Send the requests (pipelined), judge each response. True: the connection is gone."""
        stats.requests += len(requests)
        try:
            sock.sendall(b"".join(r.raw for r in requests))
            if requests[-1].terminal:
                # nsqd must answer and close on EOF; bytes that never start a request (a
                # lone CRLF) would otherwise hold the connection open for ever, as in Go.
                sock.shutdown(socket.SHUT_WR)
        except (BrokenPipeError, ConnectionResetError, OSError):
            # nsqd answered early and closed (431, 413, a bare 400): the answer is still
            # readable (shutdown() of a socket already reset raises ENOTCONN).
            pass
        for request in requests:
            try:
                response = reader.read(request.method == "HEAD")
            except TimeoutError:
                stats.violation(f"no answer in {RESPONSE_DEADLINE}s to {request.raw[:200]!r}")
                return True
            except ValueError as error:
                stats.violation(f"unreadable response ({error}) to {request.raw[:200]!r}")
                return True
            if response is None:
                if request.truncated or request.malformed or request.too_big:
                    return True
                before = b" | ".join(history + [r.raw[:150] for r in requests])
                stats.violation(
                    f"closed without an answer to {request.raw[:300]!r} after {before!r}"
                )
                return True
            stats.responses += 1
            problem = check_response(request, response, stats)
            if problem is not None:
                stats.violation(f"{problem}; request {request.raw[:300]!r}")
            if response.headers.get("connection", "").lower() == "close":
                return True
        return reader.eof

    def run(self) -> HTTPStats:
        run_workers(self._worker, self.workers)
        return self.stats


class HTTPSlowloris:
    """Connections that send a request's headers a byte at a time, `gap` apart, for as long
    as the run lasts, then finish it: nsqd must serve everyone else meanwhile and answer
    each of them in the end."""

    def __init__(self, port: int, connections: int, gap: float) -> None:
        self.port = port
        self.gap = gap
        self.stop = threading.Event()
        self.stats = HTTPStats()
        self._threads = [
            threading.Thread(target=self._run, args=(n,), daemon=True) for n in range(connections)
        ]

    def start(self) -> "HTTPSlowloris":
        for thread in self._threads:
            thread.start()
        return self

    def _run(self, number: int) -> None:
        head = (
            f"GET /stats?format=json&topic={CANARY_TOPIC} HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            f"X-Slow-{number}: "
        ).encode()
        try:
            sock = socket.create_connection(("127.0.0.1", self.port))
            sock.settimeout(RESPONSE_DEADLINE)
            sock.sendall(head[:5])
            sent = 5
            with self._lock_stats():
                self.stats.slowloris += 1
            # The request line a byte at a time, then an endless header value (under Go's
            # limit), until the run is over.
            while not self.stop.wait(self.gap):
                if sent < len(head):
                    sock.sendall(head[sent : sent + 1])
                    sent += 1
                elif sent < 200_000:
                    sock.sendall(b"z")
                    sent += 1
            sock.sendall(head[sent:] + b"\r\n\r\n")
            response = ResponseReader(sock).read(False)
            sock.close()
            with self._lock_stats():
                if response is not None and response.status == 200:
                    self.stats.slowloris_answered += 1
                else:
                    self.stats.violation(f"slowloris {number}: answered {response!r}")
        except Exception as error:
            with self._lock_stats():
                self.stats.violation(f"slowloris {number}: {error!r}")

    _lock = threading.Lock()

    def _lock_stats(self):
        return self._lock

    def finish(self, timeout: float = 60.0) -> HTTPStats:
        self.stop.set()
        for thread in self._threads:
            thread.join(timeout)
        return self.stats
