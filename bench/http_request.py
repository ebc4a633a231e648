"""What one HTTP `POST /pub` costs nsqd's HTTP poller, without TCP: 32 connections over
socket pairs, each with one request outstanding as wrk keeps them, answered by the poller
(`nsqpy/daemon/http_poller.py`) and nsqd's routes, `--requests` in all; prints µs a request
per round.

    .venv/bin/python -m bench.http_request [--requests 300000] [--rounds 3]

nsqd has its defaults, so its topic (no channel) keeps 10,000 messages in memory and writes
the rest to its diskqueue, once a poller pass, as `bench.http_pub` measures it over TCP. The
parse, the route, the publish, the answer and the poller's bookkeeping are in the figure, and
a Unix socket's read and write instead of loopback TCP's (whose write alone costs ~4.5 µs
here), so the Python part of a request stands out. The client's own sends and reads are in
it too, the same for any nsqd. Run it against another checkout with farm-bench.
"""

import argparse
import socket
import tempfile
import time

import trio

from nsqpy.daemon.http_poller import HTTPPoller
from nsqpy.nsqd.http_api import HTTPAPI
from nsqpy.nsqd.options import Options
from nsqpy.nsqd.server import NSQD

CONNECTIONS = 32
REQUEST = (
    b"POST /pub?topic=t HTTP/1.1\r\nHost: 127.0.0.1:4151\r\n"
    b"Content-Type: application/octet-stream\r\nContent-Length: 200\r\n\r\n" + b"x" * 200
)


def _fail(error: BaseException) -> None:
    raise error


async def _answers(client: socket.socket) -> None:
    """Read until one complete answer (an OK of 2 bytes, whose last bytes are `OK`) came,
    waiting only when nothing is there yet."""
    received = b""
    while not received.endswith(b"\r\n\r\nOK"):
        try:
            chunk = client.recv(65536)
        except BlockingIOError:
            await trio.lowlevel.wait_readable(client)
            continue
        if not chunk:
            raise RuntimeError(f"nsqd closed the connection after {received!r}")
        received += chunk


async def measure(requests: int, rounds: int) -> None:
    with tempfile.TemporaryDirectory() as data:
        nsqd = NSQD(Options(data_path=data, node_id=1))
        router = HTTPAPI(nsqd).router
        async with trio.open_nursery() as nursery:
            poller = HTTPPoller(router, nursery, nsqd.options.max_body_size, _fail)
            nursery.start_soon(poller.run)
            clients = []
            for number in range(CONNECTIONS):
                ours, theirs = socket.socketpair()
                ours.setblocking(False)
                theirs.setblocking(False)
                poller.add(trio.SocketStream(trio.socket.from_stdlib_socket(ours)), f"c{number}")
                clients.append(theirs)
            passes = max(1, requests // CONNECTIONS)
            for _ in range(rounds):
                started = time.perf_counter()
                for _ in range(passes):
                    for client in clients:
                        client.send(REQUEST)
                    for client in clients:
                        await _answers(client)
                elapsed = time.perf_counter() - started
                print(f"{elapsed / (passes * CONNECTIONS) * 1e6:.2f} µs a request", flush=True)
            nursery.cancel_scope.cancel()
        for topic in nsqd.registry:
            topic.close()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=300_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    trio.run(measure, args.requests, args.rounds)


if __name__ == "__main__":
    main()
