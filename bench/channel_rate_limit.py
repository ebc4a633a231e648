"""Youzan's channel rate limit: the body bytes a rate-limited channel delivers each second
against its limit (`/channel/ratelimit`).

    .venv/bin/python -m bench.channel_rate_limit [--limit-kb 2048] [--size 10240]
        [--window 10] [--runs 3]

Every run starts a fresh nsqd, publishes enough messages of `--size` bytes for the whole run
to a topic whose channel is limited to `--limit-kb` KiB/s, then one consumer (RDY 100, a FIN
for each) reads it. The bucket holds four seconds of the limit, which the consumer gets at
once; the figure is what it gets over the `--window` seconds after the first two
(delivered KiB/s, and that over the limit), when only the refill lets messages through.
"""

import argparse
import socket
import sys
import time
import urllib.request

from bench import _clients
from bench._support import Nsqd, banner, spread
from nsqpy.common.command import MAGIC_V2, encode_fin, encode_rdy, encode_sub
from nsqpy.common.frame import FRAME_TYPE_MESSAGE, FrameDecoder

TOPIC = "bench_rate"
CHANNEL = "limited"
BURST_SECONDS = 4
WARM_UP_SECONDS = 2
READY = 100


def post(nsqd: Nsqd, target: str, body: bytes = b"") -> None:
    url = f"http://127.0.0.1:{nsqd.http_port}{target}"
    with urllib.request.urlopen(urllib.request.Request(url, data=body, method="POST")) as reply:
        reply.read()


def publish(nsqd: Nsqd, count: int, size: int) -> None:
    body = b"x" * size
    batch = max(1, (4 << 20) // size)
    for start in range(0, count, batch):
        bodies = [body] * min(batch, count - start)
        payload = len(bodies).to_bytes(4, "big") + b"".join(
            len(b).to_bytes(4, "big") + b for b in bodies
        )
        post(nsqd, f"/mpub?topic={TOPIC}&binary=true", payload)


def consume(nsqd: Nsqd, seconds: float) -> list[tuple[float, int]]:
    """(arrival time, body bytes) of each message received for `seconds`."""
    sock = _clients.connect(nsqd.tcp_port)
    sock.settimeout(0.2)
    sock.sendall(MAGIC_V2 + encode_sub(TOPIC, CHANNEL))
    _clients.expect_ok(sock)
    sock.sendall(encode_rdy(READY))
    decoder = FrameDecoder()
    arrivals: list[tuple[float, int]] = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            data = sock.recv(_clients.RECEIVE_SIZE)
        except TimeoutError:
            continue
        if not data:
            raise ConnectionError("nsqd closed the connection")
        now = time.monotonic()
        fins = []
        for frame in decoder.receive_data(data):
            if frame.frame_type == FRAME_TYPE_MESSAGE:
                arrivals.append((now, len(frame.data) - 26))
                fins.append(encode_fin(frame.data[10:26]))
        if fins:
            sock.sendall(b"".join(fins))
    sock.close()
    return arrivals


def one_run(limit_kb: int, size: int, window: float) -> float:
    """KiB/s of bodies delivered over the window."""
    nsqd = Nsqd(["-mem-queue-size=1000000"])
    try:
        seconds = WARM_UP_SECONDS + window
        # What the run can take, and a quarter more: the bucket, then the refill.
        count = int((BURST_SECONDS + seconds) * limit_kb * 1024 * 1.25 / size) + 1
        _clients.create_channel(nsqd.tcp_port, TOPIC, CHANNEL)
        post(nsqd, f"/channel/ratelimit?topic={TOPIC}&channel={CHANNEL}&ratekilobytes={limit_kb}")
        publish(nsqd, count, size)
        arrivals = consume(nsqd, seconds + 0.5)
    finally:
        nsqd.stop()
    if not arrivals:
        raise RuntimeError("nothing delivered")
    first = arrivals[0][0]
    start, end = first + WARM_UP_SECONDS, first + WARM_UP_SECONDS + window
    delivered = sum(size for at, size in arrivals if start <= at < end)
    return delivered / 1024 / window


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--limit-kb", type=int, default=2048)
    parser.add_argument("--size", type=int, default=10240)
    parser.add_argument("--window", type=float, default=10.0)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    banner("channel_rate_limit", __doc__.splitlines()[0])
    rates = [one_run(args.limit_kb, args.size, args.window) for _ in range(args.runs)]
    ratios = [rate / args.limit_kb for rate in rates]
    print(f"limit {args.limit_kb:,} KiB/s, bodies of {args.size:,} bytes")
    print(f"delivered KiB/s {spread(rates)}; over the limit {spread(ratios, '.3f')}")
    for rate, ratio in zip(rates, ratios, strict=True):
        print(f"  run: {rate:,.1f} KiB/s ({ratio:.3f} of the limit)")


if __name__ == "__main__":
    socket.setdefaulttimeout(60)
    sys.exit(main())
