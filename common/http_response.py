"""One HTTP/1.1 response parsed by httptools as its bytes arrive, without I/O: the etcd client
(`nsqpy.etcd`) and the trio client's nsqlookupd questions (`nsqpy.client.trio`) read their
answers with it."""

import httptools


class ResponseParser:
    """`status` once the headers are in, the body as it comes (`take_body`, for streams),
    `complete` at its end. Bytes that are not HTTP raise `error` (ValueError unless the
    caller names its own)."""

    __slots__ = ("_parser", "_error", "status", "complete", "keep_alive", "_body")

    def __init__(self, error: type[Exception] = ValueError) -> None:
        self._parser = httptools.HttpResponseParser(self)
        self._error = error
        self.status = 0
        self.complete = False
        self.keep_alive = False
        self._body = bytearray()

    def feed(self, data: bytes | bytearray) -> None:
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as error:
            raise self._error(f"bad HTTP answer: {error}") from None

    def take_body(self) -> bytes:
        body = bytes(self._body)
        self._body.clear()
        return body

    # httptools callbacks
    def on_headers_complete(self) -> None:
        self.status = self._parser.get_status_code()

    def on_body(self, body: bytes) -> None:
        self._body += body

    def on_message_complete(self) -> None:
        self.complete = True
        self.keep_alive = self._parser.should_keep_alive()
