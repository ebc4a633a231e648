"""One HTTP/1.1 response parsed by httptools as its bytes arrive, without I/O: the etcd client
(`nsqpy.etcd`) and the trio client's nsqlookupd questions (`nsqpy.client.trio`) read their
answers with it."""

import httptools


class ResponseParser:
    """`status` once the headers are in, the body as it comes (`take_body`, for streams),
    `complete` at its end. Bytes that are not HTTP raise `error` (ValueError unless the
    caller names its own)."""

    __slots__ = ("_parser", "_callbacks", "_error", "status", "complete", "keep_alive", "_body")

    def __init__(self, error: type[Exception] = ValueError) -> None:
        # The parser holds its callbacks, and they reach back only while it feeds them: a
        # parser and its owner that held each other would wait for the cycle collector
        # after every answer (the etcd client makes one an answer, for months).
        self._callbacks = _Callbacks()
        self._parser = httptools.HttpResponseParser(self._callbacks)
        self._error = error
        self.status = 0
        self.complete = False
        self.keep_alive = False
        self._body = bytearray()

    def feed(self, data: bytes | bytearray) -> None:
        self._callbacks.owner = self
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as error:
            raise self._error(f"bad HTTP answer: {error}") from None
        finally:
            self._callbacks.owner = None

    def take_body(self) -> bytes:
        body = bytes(self._body)
        self._body.clear()
        return body


class _Callbacks:
    """httptools' callbacks for a `ResponseParser`, which is `owner` while it feeds."""

    __slots__ = ("owner",)

    def __init__(self) -> None:
        self.owner: ResponseParser | None = None

    def on_headers_complete(self) -> None:
        owner = self.owner
        assert owner is not None  # called inside `feed`
        owner.status = owner._parser.get_status_code()

    def on_body(self, body: bytes) -> None:
        owner = self.owner
        assert owner is not None
        owner._body += body

    def on_message_complete(self) -> None:
        owner = self.owner
        assert owner is not None
        owner.complete = True
        owner.keep_alive = owner._parser.should_keep_alive()
