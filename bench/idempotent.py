"""Idempotent publishing (docs/protocol.md §3.10) against plain publishing, in the same run.

    .venv/bin/python -m bench.idempotent [--count 1000000] [--batch 200] [--runs 3] [--quick]

One connection publishes `--count` 200-byte messages to partition 0 of a log topic
(`/topic/create?partition_num=1`) in MPUBs of `--batch`, 4 outstanding: `MPUB <topic> 0`, or
`MPUB_SEQ <topic> 0 <producer> <sequence>` with the sequences a producer numbers them with.
Plain and idempotent runs alternate, each on a fresh nsqd with nsqd's defaults; the figure is
msgs/s, and idempotent ÷ plain (the goal: at least 0.9).
"""

import argparse
import os
import socket
import sys
import time
import urllib.request

from bench._support import Nsqd, Record, Report, add_common_arguments, banner, runs_of, spread
from nsqpy.common.command import MAGIC_V2, encode_identify, encode_mpub, encode_mpub_seq
from nsqpy.common.frame import FRAME_TYPE_RESPONSE, FrameDecoder

TOPIC = "bench_idempotent"
WINDOW = 4


def create_log_topic(nsqd: Nsqd) -> None:
    request = urllib.request.Request(
        f"http://127.0.0.1:{nsqd.http_port}/topic/create?topic={TOPIC}&partition_num=1",
        method="POST",
        data=b"",
    )
    urllib.request.urlopen(request, timeout=30).read()


def publish(port: int, count: int, batch: int, idempotent: bool) -> float:
    """msgs/s of one connection publishing `count` messages."""
    bodies = [os.urandom(200) for _ in range(batch)]
    batches = count // batch
    sock = socket.create_connection(("127.0.0.1", port))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.sendall(MAGIC_V2 + encode_identify({"feature_negotiation": True}))
    decoder = FrameDecoder()
    _read_responses(sock, decoder, 1)

    def command(number: int) -> bytes:
        if idempotent:
            return encode_mpub_seq(TOPIC, 0, "bench-producer", number * batch, bodies)
        return encode_mpub(TOPIC, bodies, 0)

    start = time.monotonic()
    sent = min(WINDOW, batches)
    sock.sendall(b"".join(command(n) for n in range(sent)))
    acked = 0
    while acked < batches:
        oks = _read_responses(sock, decoder, 1)
        acked += oks
        more = min(oks, batches - sent)
        if more:
            sock.sendall(b"".join(command(n) for n in range(sent, sent + more)))
            sent += more
    elapsed = time.monotonic() - start
    sock.close()
    return batches * batch / elapsed


def _read_responses(sock: socket.socket, decoder: FrameDecoder, at_least: int) -> int:
    oks = 0
    while oks < at_least:
        data = sock.recv(65536)
        if not data:
            raise ConnectionError("nsqd closed the connection")
        for frame in decoder.receive_data(data):
            if frame.frame_type != FRAME_TYPE_RESPONSE:
                raise RuntimeError(f"publish failed: {frame}")
            oks += 1
    return oks


def run(count: int, batch: int, idempotent: bool) -> float:
    with Nsqd() as nsqd:
        create_log_topic(nsqd)
        return publish(nsqd.tcp_port, count, batch, idempotent)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=1_000_000)
    parser.add_argument("--batch", type=int, default=200, help="messages per MPUB")
    add_common_arguments(parser)
    args = parser.parse_args(argv)
    runs = runs_of(args)
    count = args.count // 5 if args.quick else args.count
    report = Report(args.json)
    banner("idempotent", f"{count:,} messages, MPUB of {args.batch}, {runs} run(s)")
    plain: list[float] = []
    sequenced: list[float] = []
    for _ in range(runs):
        plain.append(run(count, args.batch, idempotent=False))
        sequenced.append(run(count, args.batch, idempotent=True))
    ratio = sorted(s / p for s, p in zip(sequenced, plain, strict=True))[len(plain) // 2]
    for label, rates in (("plain MPUB", plain), ("MPUB_SEQ", sequenced)):
        print(f"  {label}: {spread(rates, ',.0f')} msgs/s")
        report.add(Record("idempotent", f"log topic publish, {label}", "msgs/s", rates, []))
    print(f"  idempotent ÷ plain, median of the pairs: {ratio:.2f} (goal ≥ 0.9)")
    report.write()


if __name__ == "__main__":
    sys.exit(main())
