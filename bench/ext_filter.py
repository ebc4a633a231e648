"""Youzan's IDENTIFY `ext_filter`: how fast a channel gets through an ext topic's messages when
its consumer's filter matches 10 % or 100 % of them, against no filter.

    .venv/bin/python -m bench.ext_filter [--count 100000] [--runs 3]

Every run starts a fresh nsqd, creates an ext log topic (one partition), publishes `--count`
messages of 100 bytes with MPUB_EXT, each with a JSON header `{"##client_dispatch_tag":"t",
"region":"eu"|"us"}` (eu one in ten), then one consumer (`extend_support`, RDY 200, a FIN for
each) subscribes with the filter of the mode and reads until the channel has confirmed them
all. The figure is messages the channel got through a second (delivered or finished unsent
by the filter) from the SUB to the last confirmation; nsqd then spends for the filtered ones
what it does for a delivery, less the send. Modes: `none` (every message delivered), `all`
(an exact filter on the key every header has, `##client_dispatch_tag` = t), `tenth`
(`region` = eu).
"""

import argparse
import json
import time
import urllib.request

from bench import _clients
from bench._support import Nsqd, banner, spread
from nsqpy.common.command import (
    MAGIC_V2,
    encode_command,
    encode_fin,
    encode_identify,
    encode_mpub_ext,
    encode_rdy,
    encode_sub,
)
from nsqpy.common.frame import FRAME_TYPE_MESSAGE, FRAME_TYPE_RESPONSE, FrameDecoder

TOPIC = "bench_filter"
CHANNEL = "c"
BATCH = 500
READY = 200
FILTERS = {
    "none": None,
    "all": {"type": 1, "filter_ext_key": "##client_dispatch_tag", "filter_data": "t"},
    "tenth": {"type": 1, "filter_ext_key": "region", "filter_data": "eu"},
}


def publish(port: int, http_port: int, count: int) -> None:
    sock = _clients.connect(port)
    sock.sendall(MAGIC_V2 + encode_command("INTERNAL_CREATE_TOPIC", TOPIC, 0, "true"))
    _clients.expect_ok(sock)
    # A log topic's new channel starts at the end: created first, it gets every message.
    url = f"http://127.0.0.1:{http_port}/channel/create?topic={TOPIC}&channel={CHANNEL}"
    urllib.request.urlopen(urllib.request.Request(url, method="POST"), timeout=30).read()
    body = b"x" * 100
    for start in range(0, count, BATCH):
        size = min(BATCH, count - start)
        headers = [
            {"##client_dispatch_tag": "t", "region": "eu" if (start + n) % 10 == 0 else "us"}
            for n in range(size)
        ]
        sock.sendall(encode_mpub_ext(TOPIC, [body] * size, headers, 0))
        _clients.expect_ok(sock)
    sock.close()


def confirmed(nsqd: Nsqd) -> bool:
    url = f"http://127.0.0.1:{nsqd.http_port}/stats?format=json&topic={TOPIC}&channel={CHANNEL}"
    with urllib.request.urlopen(url, timeout=30) as reply:
        channel = json.load(reply)["topics"][0]["channels"][0]
    return channel["depth"] == 0 and channel["in_flight_count"] == 0


def one_run(mode: str, count: int) -> tuple[float, int]:
    """(messages through the channel a second, messages delivered)."""
    nsqd = Nsqd()
    try:
        publish(nsqd.tcp_port, nsqd.http_port, count)
        sock = _clients.connect(nsqd.tcp_port)
        identify = {"extend_support": True}
        if FILTERS[mode] is not None:
            identify["ext_filter"] = FILTERS[mode]
        sock.sendall(MAGIC_V2 + encode_identify(identify))
        decoder = FrameDecoder()
        while not [f for f in decoder.receive_data(sock.recv(65536))]:
            pass
        started = time.monotonic()
        sock.sendall(encode_sub(TOPIC, CHANNEL, 0))
        sock.settimeout(0.05)
        subscribed = False
        delivered = 0
        while True:
            try:
                data = sock.recv(_clients.RECEIVE_SIZE)
            except TimeoutError:
                if subscribed and confirmed(nsqd):
                    break
                continue
            if not data:
                raise ConnectionError("nsqd closed the connection")
            fins = []
            for frame in decoder.receive_data(data):
                if frame.frame_type == FRAME_TYPE_MESSAGE:
                    delivered += 1
                    fins.append(encode_fin(frame.data[10:26]))
                elif frame.frame_type == FRAME_TYPE_RESPONSE and frame.data == b"OK":
                    subscribed = True
                    fins.append(encode_rdy(READY))
            if fins:
                sock.sendall(b"".join(fins))
        elapsed = time.monotonic() - started
        sock.close()
    finally:
        nsqd.stop()
    return count / elapsed, delivered


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=100_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--modes", default="none,all,tenth")
    args = parser.parse_args()
    banner("ext_filter", __doc__.splitlines()[0])
    modes = args.modes.split(",")
    rates: dict[str, list[float]] = {mode: [] for mode in modes}
    delivered: dict[str, int] = {}
    for _ in range(args.runs):
        for mode in modes:  # alternated, run by run
            rate, delivered[mode] = one_run(mode, args.count)
            rates[mode].append(rate)
    for mode in modes:
        print(
            f"{mode:>6}: {spread(rates[mode])} msgs/s through the channel, "
            f"{delivered[mode]:,} of {args.count:,} delivered"
        )


if __name__ == "__main__":
    main()
