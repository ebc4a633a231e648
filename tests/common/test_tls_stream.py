"""The daemons' TLS stream (`nsqpy/daemon/tls_stream.py`) over a socket pair, with
trio's own SSLStream as the client: the handshake (also from bytes read before the upgrade),
a burst of records taken in one receive, a send larger than the socket buffer, and both ways
a connection ends."""

import ssl

import pytest
import trio
import trio.testing
import trustme

from nsqpy.daemon.tls_stream import TLSStream

CA = trustme.CA()
SERVER_CERTIFICATE = CA.issue_cert("localhost")


def contexts() -> tuple[ssl.SSLContext, ssl.SSLContext]:
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    SERVER_CERTIFICATE.configure_cert(server)
    client = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    CA.configure_trust(client)
    return server, client


async def connected(
    nursery, *, prefix_size: int = 0, https_compatible: bool = False
) -> tuple[TLSStream, trio.SSLStream]:
    """The daemon's side and the client's, handshaken; `prefix_size` bytes of the client's
    hello are read off the socket first and handed over as the prefix, as IDENTIFY leaves
    them."""
    server_context, client_context = contexts()
    server_socket, client_socket = trio.socket.socketpair()
    client = trio.SSLStream(
        trio.SocketStream(client_socket), client_context, server_hostname="localhost"
    )
    nursery.start_soon(client.do_handshake)
    prefix = b""
    while len(prefix) < prefix_size:
        prefix += await server_socket.recv(prefix_size - len(prefix))
    server = TLSStream(server_socket, server_context, prefix, https_compatible=https_compatible)
    await server.do_handshake()
    # nsqd's OK after the upgrade; reading it, the client takes the session tickets too.
    await server.send_all(b"OK")
    assert await client.receive_some() == b"OK"
    return server, client


@pytest.mark.parametrize("prefix_size", [0, 5, 100])
async def test_the_handshake_takes_the_bytes_read_before_the_upgrade(nursery, prefix_size):
    server, client = await connected(nursery, prefix_size=prefix_size)
    await client.send_all(b"SUB t c\n")
    assert await server.receive_some() == b"SUB t c\n"
    assert server.ssl_object.version() in ("TLSv1.2", "TLSv1.3")


async def test_a_burst_of_records_is_one_receive(nursery):
    """A consumer finishing each message in its own write sends a record a FIN: what came
    together is decrypted together."""
    server, client = await connected(nursery)
    fins = [b"FIN %016d\n" % number for number in range(50)]
    for fin in fins:
        await client.send_all(fin)
    await trio.testing.wait_all_tasks_blocked()
    assert await server.receive_some() == b"".join(fins)


async def test_a_receive_gives_at_most_max_bytes_and_keeps_the_rest(nursery):
    server, client = await connected(nursery)
    for record in (b"a" * 10, b"b" * 10, b"c" * 10):
        await client.send_all(record)
    await trio.testing.wait_all_tasks_blocked()
    assert await server.receive_some(15) == b"a" * 10 + b"b" * 5
    assert await server.receive_some() == b"b" * 5 + b"c" * 10


async def test_a_send_larger_than_the_socket_buffer_arrives_whole(nursery):
    server, client = await connected(nursery)
    payload = bytes(range(256)) * 16384  # 4 MiB, far above a socket pair's buffer
    received = bytearray()

    async def read_all() -> None:
        while len(received) < len(payload):
            received.extend(await client.receive_some())

    async with trio.open_nursery() as readers:
        readers.start_soon(read_all)
        await server.send_all(payload)
    assert bytes(received) == payload


async def test_what_a_send_now_leaves_goes_first_with_the_next_send(nursery):
    """nsqd's pump writes without waiting when the socket takes it all (`send_now`); what it
    does not take waits in the stream and leaves, in order, with the next send."""
    server, client = await connected(nursery)
    payload = bytes(range(256)) * 16384
    received = bytearray()
    assert not server.send_now(payload)  # 4 MiB: more than a socket pair's buffer takes
    async with trio.open_nursery() as readers:

        async def read_all() -> None:
            while len(received) < len(payload) + 4:
                received.extend(await client.receive_some())

        readers.start_soon(read_all)
        await server.send_all(b"next")
    assert bytes(received) == payload + b"next"


async def test_a_close_notify_is_the_end_of_the_stream(nursery):
    server, client = await connected(nursery)
    await client.send_all(b"last")
    await client.aclose()
    assert await server.receive_some() == b"last"
    assert await server.receive_some() == b""


async def test_a_connection_ended_without_close_notify_is_broken(nursery):
    """As trio.SSLStream has it: the client's process died, or it closed the socket alone."""
    server, client = await connected(nursery)
    await client.transport_stream.aclose()
    with pytest.raises(trio.BrokenResourceError):
        await server.receive_some()


async def test_over_https_a_bare_end_is_the_end_of_the_stream(nursery):
    """HTTPS clients close without close_notify (as trio.SSLStream's https_compatible)."""
    server, client = await connected(nursery, https_compatible=True)
    await client.send_all(b"GET /ping HTTP/1.1\r\n\r\n")
    await client.transport_stream.aclose()
    assert await server.receive_some() == b"GET /ping HTTP/1.1\r\n\r\n"
    assert await server.receive_some() == b""


async def test_a_client_that_refuses_the_certificate_breaks_the_handshake(nursery):
    server_context, _client_context = contexts()
    stranger = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    trustme.CA().configure_trust(stranger)
    server_socket, client_socket = trio.socket.socketpair()
    client = trio.SSLStream(trio.SocketStream(client_socket), stranger, server_hostname="localhost")

    async def refuse() -> None:
        with pytest.raises(trio.BrokenResourceError):
            await client.do_handshake()
        await client.transport_stream.aclose()

    nursery.start_soon(refuse)
    server = TLSStream(server_socket, server_context, b"")
    with pytest.raises(trio.BrokenResourceError):
        await server.do_handshake()


async def test_a_closed_stream_refuses_to_be_used(nursery):
    server, _client = await connected(nursery)
    await server.aclose()
    with pytest.raises(trio.ClosedResourceError):
        await server.send_all(b"late")
    with pytest.raises(trio.ClosedResourceError):
        await server.receive_some()
