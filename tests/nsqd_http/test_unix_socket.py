"""`--tcp-address` and `--http-address` take a unix socket path as well as host:port, as Go's
nsqd does (an address that is not host:port is a path)."""

import dataclasses

import trio

from nsqpy.common.command import MAGIC_V2, encode_pub
from nsqpy.common.frame import OK_FRAME
from nsqpy.nsqd.server import NSQD


async def test_tcp_and_http_on_unix_sockets(nsqd_options, tmp_path, nursery):
    tcp_path = str(tmp_path / "nsqd.tcp.sock")
    http_path = str(tmp_path / "nsqd.http.sock")
    options = dataclasses.replace(nsqd_options, tcp_address=tcp_path, http_address=http_path)
    server = NSQD(options)
    await nursery.start(server.serve)
    assert (server.tcp_address, server.http_address) == (tcp_path, http_path)

    stream = await trio.open_unix_socket(tcp_path)
    await stream.send_all(MAGIC_V2 + encode_pub("t", b"over a unix socket"))
    reply = b""
    with trio.fail_after(10):
        while len(reply) < len(OK_FRAME):
            reply += await stream.receive_some(100)
    assert reply == OK_FRAME
    await stream.aclose()

    http = await trio.open_unix_socket(http_path)
    await http.send_all(b"GET /ping HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    answer = b""
    with trio.fail_after(10):
        while chunk := await http.receive_some(4096):
            answer += chunk
    assert answer.startswith(b"HTTP/1.1 200 OK") and answer.endswith(b"\r\n\r\nOK")
    await http.aclose()
    assert server.topics["t"].message_count == 1
    server.shutdown()
