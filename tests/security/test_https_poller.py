"""HTTPS served by the HTTP poller (nsqpy/daemon/http_poller.py) once each handshake is done:
keep-alive, pipelined requests, bodies over many TLS records, a client that stops reading, a
request refused with a close, and a client that closes mid-record, each over a real TLS
socket."""

import json
import os
import socket
import ssl

import pytest

from tests.security.support import Certificates, make_certificates, running_nsqd


@pytest.fixture(scope="module")
def certs(tmp_path_factory) -> Certificates:
    return make_certificates(tmp_path_factory.mktemp("certs"))


@pytest.fixture(scope="module")
def nsqd(certs, tmp_path_factory):
    with running_nsqd(tmp_path_factory.mktemp("https"), *certs.tls_flags()) as daemon:
        yield daemon


def _connect(nsqd, certs) -> ssl.SSLSocket:
    raw = socket.create_connection(("127.0.0.1", nsqd.port("HTTPS")), timeout=10)
    return certs.client_context().wrap_socket(raw, server_hostname="localhost")


def _request(method: str, target: str, body: bytes = b"") -> bytes:
    return (
        f"{method} {target} HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n\r\n".encode()
        + body
    )


def _read_answers(sock: ssl.SSLSocket, count: int) -> list[tuple[int, bytes]]:
    """`count` answers: (status, body)."""
    buffer = b""
    answers = []
    while len(answers) < count:
        head_end = buffer.find(b"\r\n\r\n")
        if head_end >= 0:
            head = buffer[:head_end].decode()
            length = int(
                next(
                    line.split(":", 1)[1]
                    for line in head.split("\r\n")
                    if line.lower().startswith("content-length")
                )
            )
            if len(buffer) >= head_end + 4 + length:
                status = int(head.split(" ", 2)[1])
                answers.append((status, buffer[head_end + 4 : head_end + 4 + length]))
                buffer = buffer[head_end + 4 + length :]
                continue
        data = sock.recv(65536)
        assert data, f"closed after {len(answers)} answers"
        buffer += data
    return answers


def _depth(nsqd, certs, topic: str) -> int:
    with _connect(nsqd, certs) as sock:
        sock.sendall(_request("GET", f"/stats?format=json&topic={topic}"))
        ((status, body),) = _read_answers(sock, 1)
    assert status == 200
    return json.loads(body)["topics"][0]["depth"]


def test_keep_alive_publishes_are_answered_one_after_another(nsqd, certs):
    with _connect(nsqd, certs) as sock:
        for number in range(200):
            sock.sendall(_request("POST", "/pub?topic=keep", b"m%d" % number))
            assert _read_answers(sock, 1) == [(200, b"OK")]
    assert _depth(nsqd, certs, "keep") == 200


def test_pipelined_requests_in_one_record_are_answered_in_order(nsqd, certs):
    with _connect(nsqd, certs) as sock:
        sock.sendall(
            b"".join(_request("POST", "/pub?topic=piped", b"x") for _ in range(20))
            + _request("GET", "/ping")
        )
        assert _read_answers(sock, 21) == [(200, b"OK")] * 20 + [(200, b"OK")]
    assert _depth(nsqd, certs, "piped") == 20


def test_a_body_over_many_records_is_read_whole(nsqd, certs):
    bodies = [b"%06d" % n + b"y" * 2000 for n in range(500)]  # ~1 MB, 64 records or more
    body = b"\n".join(bodies)
    with _connect(nsqd, certs) as sock:
        sock.sendall(_request("POST", "/mpub?topic=big", body))
        assert _read_answers(sock, 1) == [(200, b"OK")]
    assert _depth(nsqd, certs, "big") == 500


def test_a_client_that_stops_reading_gets_every_answer_once_it_reads(nsqd, certs):
    with _connect(nsqd, certs) as sock:
        for _ in range(30):
            sock.sendall(b"".join(_request("GET", "/stats?format=json") for _ in range(10)))
        answers = _read_answers(sock, 300)
    assert {status for status, _body in answers} == {200}
    assert all(json.loads(body)["version"] for _status, body in answers)


def test_a_refused_request_is_answered_and_the_connection_closes(nsqd, certs):
    with _connect(nsqd, certs) as sock:
        sock.sendall(b"NOT HTTP\r\n\r\n")
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    assert data.startswith(b"HTTP/1.1 400 Bad Request")


def test_a_client_gone_mid_record_leaves_the_others_served(nsqd, certs):
    raw = socket.create_connection(("127.0.0.1", nsqd.port("HTTPS")), timeout=10)
    tls = certs.client_context().wrap_socket(raw, server_hostname="localhost")
    tls.sendall(_request("GET", "/ping"))
    assert _read_answers(tls, 1) == [(200, b"OK")]
    # A record cut short, written under the TLS layer, then the connection gone.
    os.write(tls.fileno(), b"\x17\x03\x03\x40\x00" + b"\x00" * 100)
    tls.close()
    with _connect(nsqd, certs) as sock:
        sock.sendall(_request("GET", "/ping"))
        assert _read_answers(sock, 1) == [(200, b"OK")]
