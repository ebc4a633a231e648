"""A small HTTP/1.1 server on trio streams, parsing with httptools (llhttp), for nsqd and
nsqlookupd (docs/design.md §2: measured ~48k req/s here against hypercorn's 1.7k and h11's 10k).

It does what the daemons' APIs need and nothing more: keep-alive, pipelining (every request
complete in one receive is answered in order, with one send), a body size cap so a hostile
Content-Length cannot make us buffer without bound, and a router with httprouter's 404/405
behaviour as Go NSQ uses it. Responses carry Go's headers (`Date`, `Content-Length`,
`Content-Type` only when there is a body).
"""

import email.utils
import inspect
import os
import socket
import time
from collections.abc import Awaitable, Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from typing import TYPE_CHECKING, Protocol, cast
from urllib.parse import unquote_plus

import httptools
import trio

from nsqpy.common.errors import refused_write_text
from nsqpy.common.goformat import go_json
from nsqpy.daemon.net import accept_forever, peer_address, peer_common_name
from nsqpy.daemon.tls_stream import TLSStream

if TYPE_CHECKING:
    from nsqpy.daemon.http_access import HTTPAccess, Need, NeedOf
    from nsqpy.daemon.http_poller import HTTPPoller

RECEIVE_SIZE = 64 * 1024

_REASONS = {
    200: "OK",
    400: "Bad Request",
    401: "Unauthorized",
    403: "Forbidden",
    404: "Not Found",
    405: "Method Not Allowed",
    409: "Conflict",
    413: "Request Entity Too Large",
    429: "Too Many Requests",
    500: "Internal Server Error",
    501: "Not Implemented",
    503: "Service Unavailable",
}

JSON_CONTENT_TYPE = "application/json; charset=utf-8"
TEXT_CONTENT_TYPE = "text/plain; charset=utf-8"
# Go NSQ's V1 API marks every response with this header.
NSQ_V1_HEADER = ("X-Nsq-Content-Type", "nsq; version=1.0")


class QueryError(ValueError):
    """A query string Go's url.ParseQuery refuses (bad escape, `;`)."""


def parse_query(raw: str) -> dict[str, list[str]]:
    """Go's url.ParseQuery: `a=1&a=2&b` → {"a": ["1", "2"], "b": [""]}, order kept."""
    values: dict[str, list[str]] = {}
    if not raw:
        return values
    for part in raw.split("&"):
        if not part:
            continue
        if ";" in part:
            raise QueryError("invalid semicolon separator in query")
        key, _, value = part.partition("=")
        values.setdefault(_unescape(key), []).append(_unescape(value))
    return values


def _unescape(text: str) -> str:
    # Go refuses a `%` not followed by two hex digits; Python would keep it as is.
    index = text.find("%")
    while index >= 0:
        escape = text[index + 1 : index + 3]
        if len(escape) < 2 or any(c not in "0123456789abcdefABCDEF" for c in escape):
            raise QueryError(f"invalid URL escape {text[index : index + 3]!r}")
        index = text.find("%", index + 3)
    return unquote_plus(text, errors="surrogateescape")


def query_params(request: "Request") -> dict[str, list[str]]:
    """The request's query, or Go's 400 INVALID_REQUEST when it cannot be parsed."""
    try:
        return request.query()
    except QueryError:
        raise HTTPError(400, "INVALID_REQUEST") from None


def first_param(params: dict[str, list[str]], key: str) -> str | None:
    """Go's `reqParams.Get(key)`: the first value, None when the key is absent."""
    values = params.get(key)
    return values[0] if values else None


# A request's place before a router placed it (`Request.placed`).
UNPLACED = object()
# A request's verdict before the router judged it.
_UNJUDGED = object()


class Request:
    __slots__ = (
        "method",
        "url",
        "path",
        "query_string",
        "headers",
        "body",
        "keep_alive",
        "remote",
        "content_length",
        "http10",
        "tls",
        "common_name",
        "verdict",
        "placed",
    )

    def __init__(self, method: str, url: bytes, headers: dict[str, str], body: bytes) -> None:
        self.method = method
        self.url = url
        path, _, query = url.partition(b"?")
        text = path.decode("latin-1")
        # Most paths need no unescaping; unquote_plus costs more than the check.
        self.path = unquote_plus(text) if "%" in text or "+" in text else text
        self.query_string = query.decode("latin-1")
        self.headers = headers  # lower-cased names
        self.body = body
        self.keep_alive = True
        self.http10 = False
        self.remote = ""
        # Over HTTPS: True, and the client certificate's subject CN (for the auth server).
        self.tls = False
        self.common_name = ""
        # The router's access verdict once judged (`Router._verdict`), so it is judged once.
        self.verdict: object = _UNJUDGED
        # Where a worker's router placed the request (`WorkerRouter._route`), once it
        # did: asked for the move, the inline answer and the dispatch of each request.
        self.placed: object = UNPLACED
        # The declared Content-Length (Go's req.ContentLength; -1 when not given), which
        # handlers check before the body, as Go's do.
        try:
            self.content_length = int(headers.get("content-length", "-1"))
        except ValueError:
            self.content_length = -1

    def query(self) -> dict[str, list[str]]:
        return parse_query(self.query_string)

    def encode(self) -> bytes:
        """The request as a client sends it (to hand its connection to another server)."""
        version = "HTTP/1.0" if self.http10 else "HTTP/1.1"
        lines = [f"{self.method} {self.url.decode('latin-1')} {version}"]
        lines += [
            f"{name}: {value}"
            for name, value in self.headers.items()
            if name not in ("content-length", "transfer-encoding")
        ]
        lines.append(f"Content-Length: {len(self.body)}")
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + self.body


class Response:
    # `after_commit`: the answer says the request's writes are durable, so it goes out only
    # after the router's commit (one fsync for every such answer of a poller pass).
    # `write_group`: the group commit that carries the request's write, when it has one; if
    # the commit sets its `error`, the answer is 500 INTERNAL_ERROR instead (`refused`).
    __slots__ = ("status", "headers", "body", "after_commit", "write_group")

    def __init__(
        self,
        status: int = 200,
        body: bytes = b"",
        headers: list[tuple[str, str]] | None = None,
        *,
        after_commit: bool = False,
        write_group=None,
    ) -> None:
        self.status = status
        self.body = body
        self.headers = headers if headers is not None else []
        self.after_commit = after_commit
        self.write_group = write_group

    def for_write(self, write_group) -> "Response":
        """The same answer to one request whose write `write_group` carries."""
        return Response(
            self.status,
            self.body,
            self.headers,
            after_commit=self.after_commit,
            write_group=write_group,
        )


def refusal_response(error: Exception) -> Response:
    code = getattr(error, "code", None)
    if not isinstance(code, str):
        return v1_response(500, "INTERNAL_ERROR")
    return v1_response(400, refused_write_text(code, getattr(error, "maybe_stored", False)))


def v1_response(status: int, data=None) -> Response:
    """Go's http_api.RespondV1: 200 with a string, bytes, nothing or JSON; errors as
    `{"message": TEXT}`; always the `X-NSQ-Content-Type` header."""
    if status != 200:
        return Response(
            status,
            go_json({"message": data}),
            [("Content-Type", JSON_CONTENT_TYPE), NSQ_V1_HEADER],
        )
    if data is None:
        return Response(200, b"", [NSQ_V1_HEADER])
    if isinstance(data, str):
        return Response(200, data.encode(), [NSQ_V1_HEADER, ("Content-Type", TEXT_CONTENT_TYPE)])
    if isinstance(data, bytes):
        return Response(200, data, [NSQ_V1_HEADER, ("Content-Type", TEXT_CONTENT_TYPE)])
    return Response(200, go_json(data), [("Content-Type", JSON_CONTENT_TYPE), NSQ_V1_HEADER])


# Go's net/http answers a request it cannot parse with a plain-text 400 and closes.
_BAD_REQUEST = Response(400, b"400 Bad Request", [("Content-Type", "text/plain; charset=utf-8")])

# Go's http.Server reads at most DefaultMaxHeaderBytes (1 MiB) plus 4096 bytes of request line
# and headers, then answers this (its exact bytes: no Date, no Content-Length) and closes; a
# client streaming an endless header or URL never makes us buffer more.
MAX_HEADER_BYTES = (1 << 20) + 4096
_HEADERS_TOO_LARGE = (
    b"HTTP/1.1 431 Request Header Fields Too Large\r\n"
    b"Content-Type: text/plain; charset=utf-8\r\nConnection: close\r\n\r\n"
    b"431 Request Header Fields Too Large"
)


def text_response(status: int, text: str) -> Response:
    return Response(status, text.encode(), [("Content-Type", TEXT_CONTENT_TYPE)])


class HTTPError(Exception):
    """Raised by a handler: answered as Go's V1 error `{"message": ...}` with `status`."""

    def __init__(self, status: int, message: str, extra: dict | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.extra = extra


# A handler that answers at once: a plain function. The HTTP poller runs it between other
# connections' requests, so it must not wait on anything; by its type it cannot.
InlineHandler = Callable[[Request], Response]
# A handler that may wait (on the network, on a lock): a coroutine function, run by a task of
# its own off the poller.
WaitingHandler = Callable[[Request], Awaitable[Response]]
Handler = InlineHandler | WaitingHandler


# Where a request's connection should go instead of being answered here: None, or a
# coroutine function taking the socket and the bytes to replay there (the request and any
# after it), which hands both over.
Mover = Callable[[Request], "Callable[[socket.socket, bytes], Awaitable[None]] | None"]


class CommitWait(Protocol):
    """A write an answer waits for (a partition log's write group, a diskqueue write put off
    to the end of a poller pass): done, or failed."""

    done: bool
    error: Exception | None
    # Made when the HTTP poller's pass ends (`WritePass`), not by the awaited commit.
    ends_with_pass: bool


class WritePass(Protocol):
    """Writes that the handlers of one HTTP poller pass put off, made together when the pass
    ends (nsqd's Storage: one diskqueue write for many `/pub`s)."""

    def deferring_writes(self) -> AbstractContextManager[None]: ...

    def write_deferred(self) -> None: ...

    def take_deferred(self) -> CommitWait | None: ...


class RequestRouter(Protocol):
    """What a connection asks of whoever answers its requests (`Router`, or a fixed answer
    such as nsqd's TLS-required 403)."""

    def body_limit(self, method: str, path: str) -> int | None: ...

    def respond_inline(self, request: Request) -> Response | None: ...

    async def dispatch(self, request: Request) -> Response: ...

    async def commit(self, write_groups: Sequence[CommitWait] = ()) -> None: ...

    def commit_due(self) -> bool: ...

    def waits_for_commit(self, response: Response) -> "bool | CommitWait": ...

    def write_pass(self) -> AbstractContextManager[None]: ...


class Router:
    """Exact-path routes by method, answering unknown paths and methods as httprouter does.

    `commit`, when given, makes durable what handlers wrote, and waits until the write
    groups it is given (the `write_group` of the answers waiting for it) are done; an answer
    marked `after_commit` is sent only once it has run, when it has a write group not yet done
    or `commit_due` says there is anything to make durable (by default: always).

    `writes`, when given, lets the routes added with `defers_writes` put their writes off to
    the end of the HTTP poller's pass (`write_pass`); every other route first has them made,
    so no handler sees a queue with writes still put off."""

    def __init__(
        self,
        *,
        commit: Callable[[list], Awaitable[None]] | None = None,
        commit_due: Callable[[], bool] | None = None,
        writes: WritePass | None = None,
        access: "HTTPAccess | None" = None,
    ) -> None:
        self._commit = commit
        # Routes added with a `need` answer only requests it allows.
        self.access = access
        self._needs: dict[tuple[str, str], NeedOf] = {}
        self._commit_due = commit_due or (lambda: commit is not None)
        self._writes = writes
        self._routes: dict[str, dict[str, Handler]] = {}
        self._prefixes: list[tuple[str, dict[str, Handler]]] = []
        self._body_limits: dict[tuple[str, str], Callable[[], int]] = {}
        self._waiting: set[tuple[str, str]] = set()
        self._deferring: set[Handler] = set()

    def commit_due(self) -> bool:
        return self._commit_due()

    def write_pass(self) -> AbstractContextManager[None]:
        """Around one pass of the HTTP poller: writes put off inside are made when it ends."""
        return self._writes.deferring_writes() if self._writes is not None else nullcontext()

    def body_limit(self, method: str, path: str) -> int | None:
        """The largest body the route takes, when it declared one. A request declaring more
        is answered from its headers alone, as Go's handlers answer from ContentLength."""
        limit = self._body_limits.get((method, path))
        return limit() if limit is not None else None

    def add(
        self,
        method: str,
        path: str,
        handler: Handler,
        *,
        max_body: Callable[[], int] | None = None,
        defers_writes: bool = False,
    ) -> None:
        """`path` ending in `/*` matches every path under it (httprouter's catch-all). A plain
        function handler is answered inline by the HTTP poller; a coroutine function by a task
        of its own. `defers_writes`: the handler's writes may wait for the end of the pass,
        its answer (`after_commit`) with them."""
        if max_body is not None:
            self._body_limits[(method, path)] = max_body
        if defers_writes:
            self._deferring.add(handler)
        if inspect.iscoroutinefunction(handler):
            self._waiting.add((method, path))
        if path.endswith("/*"):
            prefix = path[:-1]
            for existing, methods in self._prefixes:
                if existing == prefix:
                    methods[method] = handler
                    return
            self._prefixes.append((prefix, {method: handler}))
            return
        self._routes.setdefault(path, {})[method] = handler

    def routes(self) -> list[tuple[str, str]]:
        """Every route as added: (method, path), a catch-all's ending in `/*`."""
        found = [(method, path) for path, methods in self._routes.items() for method in methods]
        for prefix, methods in self._prefixes:
            found += [(method, prefix + "*") for method in methods]
        return found

    def require(self, method: str, path: str, need: "NeedOf") -> None:
        """The route (as added) answers only the requests its `need` allows, as the router's
        `access` judges them."""
        self._needs[(method, path)] = need

    async def check(self, request: Request) -> Response | None:
        """The refusal of a request its route's need does not allow (the auth servers asked
        when they must be); None when allowed, or when it has no route."""
        found = self._handler(request)
        if isinstance(found, Response):
            return None
        return await self._refusal(request, found[1])

    async def _refusal(self, request: Request, key: tuple[str, str]) -> Response | None:
        """`check` for a request to the route `key` (method, pattern)."""
        verdict = self._verdict(request, key)
        if verdict is None or isinstance(verdict, Response):
            return verdict
        need = cast("Need", self._needs[key](request))
        return await cast("HTTPAccess", self.access).ask(request, need)

    def _route(self, path: str) -> tuple[str, dict[str, Handler]] | None:
        """The route pattern `path` matches (as added: `/a/*` for a catch-all) and its
        handlers by method; None for an unknown path."""
        methods = self._routes.get(path)
        if methods is not None:
            return path, methods
        for prefix, prefixed in self._prefixes:
            if path.startswith(prefix):
                return prefix + "*", prefixed
        return None

    def respond_inline(self, request: Request) -> Response | None:
        """The answer the HTTP poller sends itself, at once: an inline handler's, or an unknown
        path's or method's (answered without a handler). None when the request must be
        answered by a task (`dispatch`): its handler may wait, or its credential must first
        be asked about at the auth servers."""
        found = self._handler(request)
        if isinstance(found, Response):
            return found
        handler, key = found
        if key in self._waiting:
            return None
        verdict = self._verdict(request, key)
        if verdict is None:
            return self._call(handler, request)
        return verdict if isinstance(verdict, Response) else None

    def _verdict(self, request: Request, key: tuple[str, str]) -> "Response | object | None":
        """The access's verdict on a request to the route `key` (method, pattern): None
        (allowed), the refusal, or pending (its auth servers to be asked)."""
        if self.access is None:
            return None
        if request.verdict is not _UNJUDGED:
            return request.verdict
        need_of = self._needs.get(key)
        need = None if need_of is None else need_of(request)
        verdict = None if need is None else self.access.verdict(request, need)
        request.verdict = verdict
        return verdict

    def _call(self, handler: Handler, request: Request) -> Response:
        """An inline handler's answer to an allowed request."""
        writes = self._writes
        if writes is not None and handler not in self._deferring:
            writes.write_deferred()
        try:
            response = cast(Response, handler(request))
        except HTTPError as error:
            response = _error_response(error)
        if writes is not None:
            # A write the handler put off: its answer goes out once it is made (or refused).
            deferred = writes.take_deferred()
            if deferred is not None and response.after_commit:
                return response.for_write(deferred)
        return response

    async def dispatch(self, request: Request) -> Response:
        """The answer to any request, waiting for it when its route waits (or its
        credential must first be asked about)."""
        found = self._handler(request)
        if isinstance(found, Response):
            return found
        handler, key = found
        refusal = await self._refusal(request, key)
        if refusal is not None:
            return refusal
        if key not in self._waiting:
            return self._call(handler, request)
        try:
            return await cast(Awaitable[Response], handler(request))
        except HTTPError as error:
            return _error_response(error)

    async def commit(self, write_groups: Sequence[CommitWait] = ()) -> None:
        if self._commit is not None:
            await self._commit(list(write_groups))

    def waits_for_commit(self, response: Response) -> "bool | CommitWait":
        """Whether an `after_commit` answer must wait for the commit: False, True, or its
        write group (not yet done), whose failure turns it into `refused`."""
        if not response.after_commit:
            return False
        group = response.write_group
        if group is not None and not group.done:
            return group
        return self.commit_due()

    def _handler(self, request: Request) -> "tuple[Handler, tuple[str, str]] | Response":
        """The route's handler and its key (method, pattern as added), or the answer when
        there is none (404, 405, OPTIONS)."""
        route = self._route(request.path)
        if route is None:
            return v1_response(404, "NOT_FOUND")
        pattern, methods = route
        handler = methods.get(request.method)
        if handler is None:
            allow = ", ".join(sorted({*methods, "OPTIONS"}))
            if request.method == "OPTIONS":
                return Response(200, b"", [("Allow", allow)])
            response = v1_response(405, "METHOD_NOT_ALLOWED")
            response.headers.insert(0, ("Allow", allow))
            return response
        return handler, (request.method, pattern)


def _error_response(error: HTTPError) -> Response:
    response = v1_response(error.status, error.message)
    if error.extra:
        response.body = go_json({"message": error.message, **error.extra})
    return response


class _DateCache:
    """`Date` changes once a second; format it once a second, not once a request."""

    def __init__(self) -> None:
        self._second = -1
        self._value = ""

    def get(self) -> str:
        now = int(time.time())
        if now != self._second:
            self._second = now
            self._value = email.utils.formatdate(now, usegmt=True)
        return self._value


_dates = _DateCache()


class CachedResponse(Response):
    """A response that never changes (`200 OK` to a publish): its bytes are encoded once per
    second (the `Date` header) instead of once per request."""

    __slots__ = ("_cache",)

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        # [the second of the Date in them, the bytes], shared with the twins of `for_write`.
        self._cache: list = [-1, b""]

    def for_write(self, write_group) -> "CachedResponse":
        """The same answer to one request whose write `write_group` carries (sharing this
        one's encoding)."""
        twin = CachedResponse.__new__(CachedResponse)
        twin.status = self.status
        twin.body = self.body
        twin.headers = self.headers
        twin.after_commit = self.after_commit
        twin.write_group = write_group
        twin._cache = self._cache
        return twin

    def encoded(self) -> bytes:
        """The bytes of the answer to a keep-alive HTTP/1.1 request."""
        cache = self._cache
        second = int(time.time())
        if cache[0] != second:
            cache[1] = _encode(self, False, False)
            cache[0] = second
        return cache[1]


def encode_response(response: Response, close: bool, http10: bool = False) -> bytes:
    if not close and not http10 and type(response) is CachedResponse:
        return response.encoded()
    return _encode(response, close, http10)


def _encode(response: Response, close: bool, http10: bool = False) -> bytes:
    """Go's net/http framing: an HTTP/1.0 request gets an HTTP/1.0 status line, with
    `Connection: keep-alive` when it asked to keep the connection and nothing when not;
    HTTP/1.1 says `Connection: close` when the server closes."""
    status = response.status
    version = "HTTP/1.0" if http10 else "HTTP/1.1"
    lines = [f"{version} {status} {_REASONS.get(status, 'Unknown')}"]
    lines.extend(f"{name}: {value}" for name, value in response.headers)
    lines.append(f"Date: {_dates.get()}")
    lines.append(f"Content-Length: {len(response.body)}")
    if http10:
        if not close:
            lines.append("Connection: keep-alive")
    elif close:
        lines.append("Connection: close")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + response.body


# A Content-Length of 5 digits or more (10,000 bytes and up) is checked against the route's
# limit as soon as the headers arrive; a smaller body is read and judged by the handler (Go
# reads and discards a small unread body too, keeping the connection).
_EARLY_CHECK_DIGITS = 5


class _AnswerEarly(Exception):
    """Raised inside the parser when a request's headers already decide its answer."""


class _HeadersTooLarge(Exception):
    """Raised inside the parser when a request's line and headers are past Go's limit."""


class _ParserEvents:
    """httptools callbacks collecting complete requests, with the body capped at `max_body`."""

    def __init__(self, max_body: int, router: RequestRouter) -> None:
        self.max_body = max_body
        self.router = router
        self.completed: list[tuple[str, bytes, dict[str, str], bytes, bool, bool]] = []
        # The parser feeding these callbacks, only while it feeds them
        # (`ConnectionState.feed`): held longer, the two would hold each other, and every
        # closed connection would wait for the cycle collector.
        self.parser: httptools.HttpRequestParser = None  # type: ignore[assignment]
        self._url = b""
        self._headers: dict[str, str] = {}
        self._body: list[bytes] = []
        self._body_size = 0
        # Whether a request has begun and not completed (its bytes are in the parser only).
        self.in_message = False
        # Bytes fed while a request's line and headers are still incomplete.
        self.in_headers = False
        self.header_bytes = 0
        self.header_size = 0  # request line and headers, as the callbacks saw them

    def on_message_begin(self) -> None:
        self.in_message = True
        self._url = b""
        self._headers = {}
        self._body = []
        self._body_size = 0
        self.in_headers = True
        self.header_bytes = 0
        self.header_size = 0

    def on_url(self, url: bytes) -> None:
        self._url += url
        self.header_size += len(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._headers[name.decode("latin-1").lower()] = value.decode("latin-1")
        self.header_size += len(name) + len(value) + 4  # ": " and CRLF

    def on_headers_complete(self) -> None:
        self.in_headers = False
        if self.header_size > MAX_HEADER_BYTES:
            # Headers that ended inside the chunk that took them past the limit; headers
            # that never end are caught by counting the bytes fed (`header_bytes`).
            raise _HeadersTooLarge
        declared = self._headers.get("content-length")
        # A small body is cheaper to read and let the handler judge than to look its route
        # up for every request; only large declared bodies are answered from the headers.
        if declared is None or len(declared) < _EARLY_CHECK_DIGITS or not declared.isdigit():
            return
        method = self.parser.get_method().decode("latin-1")
        path = unquote_plus(self._url.partition(b"?")[0].decode("latin-1"))
        limit = self.router.body_limit(method, path)
        if int(declared) > (self.max_body if limit is None else limit):
            # Answer now without the body and close afterwards, as Go does for a request
            # whose Content-Length is over the limit.
            self._complete(b"", keep_alive=False)
            raise _AnswerEarly

    def on_body(self, body: bytes) -> None:
        # Keep one byte past the cap so a handler can tell "too big" from "exactly the cap",
        # as Go's io.LimitReader(body, max+1) does; drop the rest.
        room = self.max_body + 1 - self._body_size
        if room > 0:
            self._body.append(body[:room] if len(body) > room else body)
        self._body_size += len(body)

    def on_message_complete(self) -> None:
        self._complete(b"".join(self._body), self.parser.should_keep_alive())

    def _complete(self, body: bytes, keep_alive: bool) -> None:
        self.in_message = False
        parser = self.parser
        self.completed.append(
            (
                parser.get_method().decode("latin-1"),
                self._url,
                self._headers,
                body,
                keep_alive,
                parser.get_http_version() == "1.0",
            )
        )


class ConnectionState:
    """One HTTP connection without its I/O: bytes in, complete requests out, and their
    answers as bytes. The per-connection task and the HTTP poller both drive it."""

    __slots__ = ("router", "remote", "common_name", "on_error", "events", "parser", "tls")

    def __init__(
        self,
        router: RequestRouter,
        max_body_size: int,
        remote: str = "",
        on_error: Callable[[BaseException], None] | None = None,
        common_name: str | None = None,
    ) -> None:
        self.router = router
        self.remote = remote
        # Over HTTPS, the client certificate's subject CN ("" without one); None over HTTP.
        self.common_name = common_name
        self.on_error = on_error
        self.events = _ParserEvents(max_body_size, router)
        self.parser = httptools.HttpRequestParser(self.events)
        # The connection's TLS while the HTTP poller serves it over HTTPS; None otherwise.
        self.tls: TLSStream | None = None

    def feed(self, data: bytes | bytearray) -> bytes | None:
        """Parse `data`. Returns the last answer to send (after answering the requests that
        completed before it) when the connection cannot go on: a request that does not
        parse, or headers past the limit; None otherwise."""
        events = self.events
        events.parser = self.parser
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            return encode_response(_BAD_REQUEST, True)
        except httptools.HttpParserError as error:
            if isinstance(error.__context__, _HeadersTooLarge):
                return _HEADERS_TOO_LARGE
            if not isinstance(error.__context__, _AnswerEarly):
                return encode_response(_BAD_REQUEST, True)
        finally:
            events.parser = None  # type: ignore[assignment]
        if events.in_headers:
            events.header_bytes += len(data)
            if events.header_bytes > MAX_HEADER_BYTES:
                return _HEADERS_TOO_LARGE
        return None

    def take_requests(self) -> list[Request]:
        completed = self.events.completed
        if not completed:
            return []
        self.events.completed = []
        requests = []
        for method, url, headers, body, keep_alive, http10 in completed:
            request = Request(method, url, headers, body)
            request.remote = self.remote
            if self.common_name is not None:
                request.tls = True
                request.common_name = self.common_name
            request.keep_alive = keep_alive
            request.http10 = http10
            requests.append(request)
        return requests

    def answer_inline(self, request: Request) -> "tuple[bytes, bool, bool | CommitWait] | None":
        """The encoded inline answer to a request (`RequestRouter.respond_inline`), whether
        the connection closes after it, and whether it may go out only after the router's
        commit: False, True, or the response's write group, whose failure replaces it with
        `refused(request)`. None when a task must answer it."""
        try:
            response = self.router.respond_inline(request)
        except Exception as error:
            response = self._internal_error(error)
        if response is None:
            return None
        encoded, close = self._encode(request, response)
        return encoded, close, self.router.waits_for_commit(response)

    def refused(self, request: Request, error: Exception) -> bytes:
        """The answer to a request whose write the commit failed to make: 500, as a failed
        write is answered at once, or 400 with the error's `code` when it has one (a
        cluster's `E_FAILED_ON_NOT_WRITABLE`)."""
        return self._encode(request, refusal_response(error))[0]

    async def answer(self, request: Request) -> tuple[bytes, bool]:
        """The encoded answer to `request`, and whether the connection closes after it; an
        answer that waits for the commit is returned after it."""
        try:
            response = await self.router.dispatch(request)
            waits = self.router.waits_for_commit(response)
            if waits:
                await self.router.commit([] if waits is True else [waits])
                if waits is not True and waits.error is not None:
                    response = refusal_response(waits.error)
        except Exception as error:
            response = self._internal_error(error)
        return self._encode(request, response)

    def _internal_error(self, error: Exception) -> Response:
        if self.on_error is not None:
            self.on_error(error)
        return v1_response(500, "INTERNAL_ERROR")

    def _encode(self, request: Request, response: Response) -> tuple[bytes, bool]:
        close = not request.keep_alive
        encoded = encode_response(response, close, request.http10)
        if request.method == "HEAD" and response.body:
            # A response to HEAD has no body (RFC 9110 §9.3.2), as Go's net/http writes it;
            # sent anyway, it would be read as the next response.
            encoded = encoded[: len(encoded) - len(response.body)]
        return encoded, close


async def _send_all_fd(fd: int, data: bytes) -> bool:
    """Write all of `data` to a non-blocking descriptor, waiting whenever the client is not
    reading; False when the connection broke."""
    view = memoryview(data)
    while view:
        try:
            sent = os.write(fd, view)
        except BlockingIOError:
            sent = 0
        except OSError:
            return False
        view = view[sent:]
        if view:
            try:
                await trio.lowlevel.wait_writable(fd)
            except trio.ClosedResourceError:
                return False
    return True


async def serve_http_connection(
    stream: trio.abc.Stream,
    router: RequestRouter,
    *,
    max_body_size: int,
    remote: str = "",
    on_error: Callable[[BaseException], None] | None = None,
    common_name: str | None = None,
) -> None:
    """Serve requests on one connection until the client closes it or asks to (over HTTPS,
    `common_name` is the client certificate's)."""
    state = ConnectionState(router, max_body_size, remote, on_error, common_name)
    io = _SocketIO(stream) if isinstance(stream, trio.SocketStream) else stream
    try:
        while True:
            try:
                data = await io.receive_some(RECEIVE_SIZE)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                return
            if not data:
                return
            final = state.feed(data)
            out: list[bytes] = []
            close = False
            for request in state.take_requests():
                answer, close = await state.answer(request)
                out.append(answer)
                if close:
                    break
            if final is not None and not close:
                out.append(final)
                close = True
            if out and not await _send_quietly(io, b"".join(out)) or close:
                return
    finally:
        with trio.CancelScope(shield=True):
            await stream.aclose()


class _SocketIO:
    """Receive and send on a plain TCP connection's descriptor directly.

    A keep-alive HTTP client sends its next request only after reading our answer, so after
    each answer the socket is almost never readable yet: waiting for readability first saves
    the failing recv() that trio's SocketStream tries first, and skipping its wrappers saves
    more (together about a fifth of nsqd's CPU per `POST /pub`; bench/RESULTS.md)."""

    __slots__ = ("fd",)

    def __init__(self, stream: trio.SocketStream) -> None:
        self.fd = stream.socket.fileno()

    async def receive_some(self, max_bytes: int) -> bytes:
        fd = self.fd
        while True:
            await trio.lowlevel.wait_readable(fd)
            try:
                return os.read(fd, max_bytes)
            except BlockingIOError:
                continue
            except OSError as error:
                raise trio.BrokenResourceError(str(error)) from error

    async def send_all(self, data: bytes) -> None:
        if not await _send_all_fd(self.fd, data):
            raise trio.BrokenResourceError("connection lost")


async def _send_quietly(stream: "trio.abc.Stream | _SocketIO", data: bytes) -> bool:
    try:
        await stream.send_all(data)
        return True
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        return False


async def serve_http(
    listener,
    router: RequestRouter,
    nursery: trio.Nursery,
    log,
    *,
    max_body_size: int,
    tls_context=None,
    mover: "Mover | None" = None,
    on_poller: "Callable[[HTTPPoller], None] | None" = None,
) -> None:
    """Serve HTTP (or HTTPS, with `tls_context`) on `listener` until cancelled. `mover` may
    send a plain connection elsewhere instead of answering its request here (nsqd's
    `--workers`); `on_poller` is given the poller, which takes connections handed back."""
    from nsqpy.daemon.http_poller import HTTPPoller, polls_plain_sockets

    def log_error(error: BaseException) -> None:
        log.error("HTTP: internal error - %r", error, exc_info=error)

    poller = None
    if polls_plain_sockets():
        # HTTPS too, once each connection's handshake is done.
        poller = HTTPPoller(router, nursery, max_body_size, log_error, mover)
        nursery.start_soon(poller.run)
        if on_poller is not None:
            on_poller(poller)

    async def serve(stream: trio.SocketStream) -> None:
        remote = peer_address(stream, unknown="")
        if poller is not None and tls_context is None and isinstance(stream, trio.SocketStream):
            poller.add(stream, remote)
            return
        connection: trio.abc.Stream = stream
        common_name = None
        if tls_context is not None:
            tls = TLSStream(stream.socket, tls_context, https_compatible=True)
            try:
                await tls.do_handshake()
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                await stream.aclose()
                return
            connection = tls
            common_name = peer_common_name(tls.ssl_object)
            if poller is not None:
                poller.add_tls(stream, tls, remote, common_name)
                return
        await serve_http_connection(
            connection,
            router,
            max_body_size=max_body_size,
            remote=remote,
            on_error=log_error,
            common_name=common_name,
        )

    await accept_forever(listener, serve, nursery, log, "HTTPS" if tls_context else "HTTP")
