"""What one batch of V2 commands costs a connection, without the client's side of the wire: a
PUB fed to a `V2Connection` (nsqd/connection.py) over a socket pair, its batch run and its
reply written, `--batches` times; prints µs a batch per round.

    .venv/bin/python -m bench.command_batch [--batches 100000] [--rounds 3]

The interpreter's batch (`ProtocolV2.batches`), its effects, the commit, the reply's write
and the read deadline's re-arming are all in it; the read itself and the client are not, so
the figure is the per-round-trip cost the connection layer adds to a publish. Run it against
another checkout with farm-bench (bench/RESULTS.md).
"""

import argparse
import socket
import tempfile
import time

import trio

from nsqpy.common.command import MAGIC_V2, encode_pub
from nsqpy.nsqd.connection import V2Connection
from nsqpy.nsqd.options import Options
from nsqpy.nsqd.server import NSQD


async def measure(batches: int, rounds: int) -> None:
    with tempfile.TemporaryDirectory() as data:
        nsqd = NSQD(Options(data_path=data, node_id=1, mem_queue_size=10_000_000))
        ours, theirs = socket.socketpair()
        theirs.setblocking(False)
        stream = trio.SocketStream(trio.socket.from_stdlib_socket(ours))
        connection = V2Connection(nsqd, stream, "127.0.0.1:1")
        protocol = connection.protocol
        protocol.receive_data(MAGIC_V2)
        publish = encode_pub("t", b"x" * 100)
        for _ in range(rounds):
            started = time.perf_counter()
            for number in range(batches):
                protocol.receive_data(publish)
                await connection._run_commands()
                if number % 64 == 0:
                    try:
                        while theirs.recv(65536):
                            pass
                    except BlockingIOError:
                        pass
            elapsed = time.perf_counter() - started
            print(f"{elapsed / batches * 1e6:.2f} µs a batch", flush=True)
        for topic in nsqd.topics.values():
            topic.close()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--batches", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    trio.run(measure, args.batches, args.rounds)


if __name__ == "__main__":
    main()
