"""One connection publishing MPUBs to one topic, or alternately to two topics that different
workers own (`--workers=2`): what forwarding a publish to another worker costs.

    .venv/bin/nsqd --workers=2 --mem-queue-size=1000000 --tcp-address=127.0.0.1:0 ...
    .venv/bin/python -m bench.forwarding 127.0.0.1:PORT one|both

MPUBs of 200 × 200 B, 8 outstanding, 2,000 of them, after one MPUB that moves the connection
to the first topic's owner; prints messages per second. With `--workers=1` both topics are
local and the two forms should be alike.
"""

import socket
import sys
import time

from nsqpy.common.command import MAGIC_V2, encode_identify, encode_mpub
from nsqpy.common.frame import FrameDecoder
from nsqpy.nsqd.worker import owner_of

BODIES = [b"x" * 200] * 200
WINDOW = 8
COUNT = 2000


class Publisher:
    def __init__(self, address: str) -> None:
        host, port = address.rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)))
        self.decoder = FrameDecoder()
        self.answered = 0
        self.sock.sendall(MAGIC_V2 + encode_identify({"client_id": "bench-forwarding"}))
        self.wait(1)

    def wait(self, count: int) -> None:
        """Until `count` more OKs arrived (heartbeats skipped)."""
        while self.answered < count:
            for frame in self.decoder.receive_data(self.sock.recv(1 << 20)):
                if frame.data == b"_heartbeat_":
                    continue
                assert frame.data == b"OK", frame.data
                self.answered += 1
        self.answered -= count


def main() -> None:
    address, form = sys.argv[1], sys.argv[2]
    first = next(f"fa{i}" for i in range(100) if owner_of(f"fa{i}", 0, 2) == 0)
    second = next(f"fb{i}" for i in range(100) if owner_of(f"fb{i}", 0, 2) == 1)
    topics = [first, second] if form == "both" else [first]
    commands = [encode_mpub(topic, BODIES) for topic in topics]
    publisher = Publisher(address)
    publisher.sock.sendall(commands[0])
    publisher.wait(1)
    started = time.monotonic()
    sent = outstanding = 0
    while sent < COUNT:
        while outstanding < WINDOW and sent < COUNT:
            publisher.sock.sendall(commands[sent % len(commands)])
            sent += 1
            outstanding += 1
        publisher.wait(1)
        outstanding -= 1
    publisher.wait(outstanding)
    elapsed = time.monotonic() - started
    print(f"{form}: {COUNT * len(BODIES) / elapsed:,.0f} msgs/s")


if __name__ == "__main__":
    main()
