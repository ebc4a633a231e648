"""The HTTP poller: one task answering every plain keep-alive connection, handing a connection
to a task of its own when a route may wait or the client does not read."""

import logging

import pytest
import trio

from common.http_server import Request, Response, Router, serve_http
from common.net import open_listener

READ_TIMEOUT = 10.0


def request_bytes(method: str, path: str, body: bytes = b"") -> bytes:
    head = f"{method} {path} HTTP/1.1\r\nHost: t\r\nContent-Length: {len(body)}\r\n\r\n"
    return head.encode() + body


class Answers:
    """Reads responses off a stream: (status, body) in order."""

    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        self.buffer = b""

    async def next(self) -> tuple[int, bytes]:
        with trio.fail_after(READ_TIMEOUT):
            while b"\r\n\r\n" not in self.buffer:
                chunk = await self.stream.receive_some(65536)
                assert chunk, "connection closed before a response"
                self.buffer += chunk
            head, _, rest = self.buffer.partition(b"\r\n\r\n")
            lines = head.decode().split("\r\n")
            length = next(
                int(line.split(":")[1])
                for line in lines
                if line.lower().startswith("content-length")
            )
            while len(rest) < length:
                chunk = await self.stream.receive_some(65536)
                assert chunk, "connection closed inside a body"
                rest += chunk
            self.buffer = rest[length:]
            return int(lines[0].split()[1]), rest[:length]

    async def closed(self) -> bool:
        with trio.fail_after(READ_TIMEOUT):
            return await self.stream.receive_some(1) == b""


@pytest.fixture
async def server(nursery):
    """A router with an inline echo, a route that waits until released, a failing handler
    and a route whose inline check itself fails."""
    release = trio.Event()
    errors: list[BaseException] = []

    class Routes(Router):
        def answers_inline(self, request: Request) -> bool:
            if request.path == "/broken-router":
                raise RuntimeError("router bug")
            return super().answers_inline(request)

    router = Routes(inline=True)

    async def echo(request: Request) -> Response:
        return Response(200, request.body or request.path.encode())

    async def wait(request: Request) -> Response:
        await release.wait()
        return Response(200, b"waited")

    async def fail(request: Request) -> Response:
        raise ValueError("handler bug")

    router.add("POST", "/echo", echo)
    router.add("GET", "/echo", echo)
    router.add("GET", "/wait", wait, inline=False)
    router.add("GET", "/fail", fail)
    router.add("GET", "/broken-router", echo)
    listener = await open_listener("127.0.0.1:0")
    log = logging.getLogger("test-http-poller")
    log.error = lambda *args, exc_info=None, **kwargs: errors.append(exc_info)  # type: ignore
    nursery.start_soon(lambda: serve_http(listener, router, nursery, log, max_body_size=1 << 20))
    port = listener.socket.getsockname()[1]

    async def connect() -> tuple[trio.SocketStream, Answers]:
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        return stream, Answers(stream)

    return connect, release, errors


async def test_pipelined_inline_and_waiting_routes_are_answered_in_order(server):
    connect, release, _errors = server
    stream, answers = await connect()
    await stream.send_all(
        request_bytes("POST", "/echo", b"one")
        + request_bytes("GET", "/wait")
        + request_bytes("POST", "/echo", b"three")
    )
    assert await answers.next() == (200, b"one")
    release.set()
    assert await answers.next() == (200, b"waited")
    assert await answers.next() == (200, b"three")
    # Back on the poller afterwards: the connection keeps serving.
    await stream.send_all(request_bytes("POST", "/echo", b"four"))
    assert await answers.next() == (200, b"four")


async def test_a_waiting_route_does_not_hold_up_other_connections(server):
    connect, release, _errors = server
    waiting, waiting_answers = await connect()
    await waiting.send_all(request_bytes("GET", "/wait"))
    other, other_answers = await connect()
    for i in range(20):
        await other.send_all(request_bytes("POST", "/echo", b"%d" % i))
        assert await other_answers.next() == (200, b"%d" % i)
    release.set()
    assert await waiting_answers.next() == (200, b"waited")


async def test_a_client_that_does_not_read_gets_every_answer_later(server):
    connect, _release, _errors = server
    idle, idle_answers = await connect()
    body = b"x" * 60_000
    count = 200  # ~12 MB of answers: far more than the socket buffers hold
    async with trio.open_nursery() as nursery:
        # The requests are sent while nobody reads, so nsqd's writes fill the buffers.
        nursery.start_soon(idle.send_all, request_bytes("POST", "/echo", body) * count)
        other, other_answers = await connect()
        for i in range(20):
            await other.send_all(request_bytes("POST", "/echo", b"%d" % i))
            assert await other_answers.next() == (200, b"%d" % i)
        for _ in range(count):
            assert await idle_answers.next() == (200, body)


async def test_a_failing_handler_is_a_500_and_the_connection_goes_on(server):
    connect, _release, errors = server
    stream, answers = await connect()
    await stream.send_all(request_bytes("GET", "/fail") + request_bytes("GET", "/echo"))
    status, body = await answers.next()
    assert status == 500 and b"INTERNAL_ERROR" in body
    assert await answers.next() == (200, b"/echo")
    assert isinstance(errors[0], ValueError)


async def test_a_bug_outside_the_handler_closes_only_that_connection(server):
    connect, _release, errors = server
    bystander, bystander_answers = await connect()
    broken, broken_answers = await connect()
    await broken.send_all(request_bytes("GET", "/broken-router"))
    assert await broken_answers.closed()
    assert isinstance(errors[0], RuntimeError)
    await bystander.send_all(request_bytes("GET", "/echo"))
    assert await bystander_answers.next() == (200, b"/echo")


async def test_unknown_paths_and_methods_are_answered_inline(server):
    connect, _release, _errors = server
    stream, answers = await connect()
    await stream.send_all(request_bytes("GET", "/nope") + request_bytes("DELETE", "/echo"))
    assert (await answers.next())[0] == 404
    assert (await answers.next())[0] == 405


async def test_connection_close_and_garbage_end_the_connection(server):
    connect, _release, _errors = server
    stream, answers = await connect()
    await stream.send_all(
        b"GET /echo HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n" + request_bytes("GET", "/x")
    )
    assert await answers.next() == (200, b"/echo")
    assert await answers.closed()
    stream, answers = await connect()
    await stream.send_all(request_bytes("GET", "/echo") + b"NOT HTTP\r\n\r\n")
    assert await answers.next() == (200, b"/echo")
    assert (await answers.next())[0] == 400
    assert await answers.closed()


async def test_a_refused_connection_gets_its_whole_answer_even_with_unread_input(server):
    """The server closes after a request it cannot parse; input the client sent after it
    must not turn the close into a reset that destroys the answers still unread."""
    connect, _release, _errors = server
    stream, answers = await connect()
    body = b"x" * 500_000
    await stream.send_all(request_bytes("POST", "/echo", body) + b"NOT HTTP\r\n\r\n")
    # More input after the garbage, which the server never reads.
    await stream.send_all(b"y" * 200_000)
    # A slow reader: it pauses before reading (the behaviour under test, not a wait for a
    # condition), so the server closes while its answers still sit unread in the buffers.
    await trio.sleep(0.3)
    assert await answers.next() == (200, body)
    assert (await answers.next())[0] == 400
    assert await answers.closed()
