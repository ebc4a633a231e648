"""The HTTP poller: one task answering every plain keep-alive connection, handing a connection
to a task of its own when a route may wait or the client does not read."""

import contextlib
import logging
from collections.abc import Awaitable, Callable

import pytest
import trio

from nsqpy.daemon.http_server import Request, Response, Router, serve_http
from nsqpy.daemon.net import open_listener
from tests.support.http import RawConnection, encode_request


async def answer(connection: RawConnection) -> tuple[int, bytes]:
    response = await connection.read_response()
    return response.status, response.body


async def serve(router: Router, nursery, errors: list) -> Callable[[], Awaitable]:
    """Serve `router` on an ephemeral port (errors logged into `errors`); a connect function."""
    listener = await open_listener("127.0.0.1:0")
    log = logging.getLogger(f"test-http-poller-{id(router)}")
    log.error = lambda *args, exc_info=None, **kwargs: errors.append(exc_info)  # type: ignore
    nursery.start_soon(lambda: serve_http(listener, router, nursery, log, max_body_size=1 << 20))
    address = f"127.0.0.1:{listener.socket.getsockname()[1]}"

    async def connect() -> RawConnection:
        return await RawConnection.open(address)

    return connect


@pytest.fixture
async def server(nursery):
    """A router with an inline echo, a route that waits until released, a failing handler
    and a route whose answer the router itself fails to judge."""
    release = trio.Event()
    errors: list[BaseException] = []

    class Routes(Router):
        def waits_for_commit(self, response: Response):
            if response.body == b"/broken-router":
                raise RuntimeError("router bug")
            return super().waits_for_commit(response)

    router = Routes()

    def echo(request: Request) -> Response:
        return Response(200, request.body or request.path.encode())

    async def wait(request: Request) -> Response:
        await release.wait()
        return Response(200, b"waited")

    def fail(request: Request) -> Response:
        raise ValueError("handler bug")

    router.add("POST", "/echo", echo)
    router.add("GET", "/echo", echo)
    router.add("GET", "/wait", wait)
    router.add("GET", "/fail", fail)
    router.add("GET", "/broken-router", echo)
    connect = await serve(router, nursery, errors)
    return connect, release, errors


async def test_pipelined_inline_and_waiting_routes_are_answered_in_order(server):
    connect, release, _errors = server
    connection = await connect()
    await connection.send(
        encode_request("POST", "/echo", b"one")
        + encode_request("GET", "/wait")
        + encode_request("POST", "/echo", b"three")
    )
    assert await answer(connection) == (200, b"one")
    release.set()
    assert await answer(connection) == (200, b"waited")
    assert await answer(connection) == (200, b"three")
    # Back on the poller afterwards: the connection keeps serving.
    await connection.send(encode_request("POST", "/echo", b"four"))
    assert await answer(connection) == (200, b"four")


async def test_a_waiting_route_does_not_hold_up_other_connections(server):
    connect, release, _errors = server
    waiting = await connect()
    await waiting.send(encode_request("GET", "/wait"))
    other = await connect()
    for i in range(20):
        await other.send(encode_request("POST", "/echo", b"%d" % i))
        assert await answer(other) == (200, b"%d" % i)
    release.set()
    assert await answer(waiting) == (200, b"waited")


async def test_a_client_that_does_not_read_gets_every_answer_later(server):
    connect, _release, _errors = server
    idle = await connect()
    body = b"x" * 60_000
    count = 200  # ~12 MB of answers: far more than the socket buffers hold
    async with trio.open_nursery() as nursery:
        # The requests are sent while nobody reads, so nsqd's writes fill the buffers.
        nursery.start_soon(idle.send, encode_request("POST", "/echo", body) * count)
        other = await connect()
        for i in range(20):
            await other.send(encode_request("POST", "/echo", b"%d" % i))
            assert await answer(other) == (200, b"%d" % i)
        for _ in range(count):
            assert await answer(idle) == (200, body)


async def test_a_failing_handler_is_a_500_and_the_connection_goes_on(server):
    connect, _release, errors = server
    connection = await connect()
    await connection.send(encode_request("GET", "/fail") + encode_request("GET", "/echo"))
    status, body = await answer(connection)
    assert status == 500 and b"INTERNAL_ERROR" in body
    assert await answer(connection) == (200, b"/echo")
    assert isinstance(errors[0], ValueError)


async def test_a_bug_outside_the_handler_closes_only_that_connection(server):
    connect, _release, errors = server
    bystander = await connect()
    broken = await connect()
    await broken.send(encode_request("GET", "/broken-router"))
    assert await broken.closed_by_peer()
    assert isinstance(errors[0], RuntimeError)
    await bystander.send(encode_request("GET", "/echo"))
    assert await answer(bystander) == (200, b"/echo")


async def test_unknown_paths_and_methods_are_answered_inline(server):
    connect, _release, _errors = server
    connection = await connect()
    await connection.send(encode_request("GET", "/nope") + encode_request("DELETE", "/echo"))
    assert (await answer(connection))[0] == 404
    assert (await answer(connection))[0] == 405


async def test_connection_close_and_garbage_end_the_connection(server):
    connect, _release, _errors = server
    connection = await connect()
    await connection.send(
        encode_request("GET", "/echo", headers=[("Connection", "close")])
        + encode_request("GET", "/x")
    )
    assert await answer(connection) == (200, b"/echo")
    assert await connection.closed_by_peer()
    connection = await connect()
    await connection.send(encode_request("GET", "/echo") + b"NOT HTTP\r\n\r\n")
    assert await answer(connection) == (200, b"/echo")
    assert (await answer(connection))[0] == 400
    assert await connection.closed_by_peer()


async def test_a_refused_connection_gets_its_whole_answer_even_with_unread_input(server):
    """The server closes after a request it cannot parse; input the client sent after it
    must not turn the close into a reset that destroys the answers still unread."""
    connect, _release, _errors = server
    connection = await connect()
    body = b"x" * 500_000
    await connection.send(encode_request("POST", "/echo", body) + b"NOT HTTP\r\n\r\n")

    async def send_more() -> None:
        # More input after the garbage, which the server never reads. Sent beside the reads:
        # with small socket buffers both sides would otherwise block writing to each other.
        with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
            await connection.send(b"y" * 200_000)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(send_more)
        # A slow reader: it pauses before reading (the behaviour under test, not a wait for a
        # condition), so the server closes while its answers still sit unread in the buffers.
        await trio.sleep(0.3)
        assert await answer(connection) == (200, body)
        assert (await answer(connection))[0] == 400
        assert await connection.closed_by_peer()


# -- group commit ---------------------------------------------------------------------------


@pytest.fixture
async def committing_server(nursery):
    """A router whose `/write` answers wait for its commit, which waits until `gate` is set
    (or fails when `fail` is set); `commits` counts the commits run."""
    gate = trio.Event()
    fail = []
    commits = []
    errors: list[BaseException] = []

    async def commit(write_groups: list) -> None:
        await gate.wait()
        commits.append(trio.current_time())
        if fail:
            raise OSError("disk gone")

    router = Router(commit=commit)

    def write(request: Request) -> Response:
        return Response(200, b"written " + request.body, after_commit=True)

    def echo(request: Request) -> Response:
        return Response(200, request.body or request.path.encode())

    router.add("POST", "/write", write)
    router.add("GET", "/echo", echo)
    connect = await serve(router, nursery, errors)
    return connect, gate, commits, fail, errors


async def test_a_durable_answer_waits_for_the_commit_and_others_do_not(committing_server):
    connect, gate, commits, _fail, _errors = committing_server
    writer = await connect()
    await writer.send(encode_request("POST", "/write", b"a") + encode_request("GET", "/echo"))
    # While the commit waits (a slow fsync), another connection is served at once.
    other = await connect()
    for _ in range(10):
        await other.send(encode_request("GET", "/echo"))
        assert await answer(other) == (200, b"/echo")
    assert commits == []
    gate.set()
    # The writer's answers come after the commit, in order, and it is served again after.
    assert await answer(writer) == (200, b"written a")
    assert await answer(writer) == (200, b"/echo")
    assert len(commits) == 1
    await writer.send(encode_request("POST", "/write", b"b"))
    assert await answer(writer) == (200, b"written b")


async def test_pipelined_durable_requests_share_one_commit(committing_server):
    connect, gate, commits, _fail, _errors = committing_server
    gate.set()
    writer = await connect()
    await writer.send(b"".join(encode_request("POST", "/write", b"%d" % i) for i in range(5)))
    for i in range(5):
        assert await answer(writer) == (200, b"written %d" % i)
    # One read carried all five: the poller answered them in one pass, after one commit.
    assert len(commits) == 1


async def test_a_failed_commit_acknowledges_nothing(committing_server):
    connect, gate, _commits, fail, errors = committing_server
    fail.append(True)
    gate.set()
    writer = await connect()
    await writer.send(encode_request("POST", "/write", b"lost"))
    assert await writer.closed_by_peer()
    assert isinstance(errors[0], OSError)
    bystander = await connect()
    await bystander.send(encode_request("GET", "/echo"))
    assert await answer(bystander) == (200, b"/echo")
