"""Consume throughput of our nsqd over a negotiated connection: plain, snappy, deflate, TLS,
TLS+snappy.

    .venv/bin/python -m bench.security_bench [--count 200000] [--runs 3] [--quick]
                                             [--modes plain,tls] [--client blocking]

Every run starts a fresh nsqd (subprocess, temporary data dir, port 0, ``--mem-queue-size``
above ``--count`` so every message stays in memory, a trustme certificate for TLS) and stops it
with SIGKILL. The channel is created and filled over a plain connection (MPUB batches of 200,
not timed). Then one consumer — in this process, on raw sockets with our codec, the stdlib
``ssl`` and python-snappy / zlib, as go-nsq negotiates — sends IDENTIFY with the mode's
features, checks that the reply granted them and that each upgrade answered ``OK`` through its
new layer, SUBs, and times from ``RDY --rdy`` to the last message, answering each received
chunk with all its FINs in one send (compressed when the connection is). Bodies are
``--size``-byte JSON-like log lines padded with ``x`` (the message frames compress about 7:1
with snappy, 14:1 with deflate), the workload compression is meant for. The figure is the
median (min–max) of ``--runs`` runs; nsqd's CPU seconds over the timed window come from
/proc/<pid>/stat (CPU/wall 1.0 = one saturated core), the consumer's from
time.process_time(), so one can tell which side limits a mode; CPU µs per message is the
figure that survives a busy machine.

`--client blocking` consumes with `nsqpy.client.blocking.Consumer` instead (plain and TLS
only): `receive` and `finish` a message at a time, as a program on the blocking client does,
so its read path's cost shows in the client's CPU.
"""

import argparse
import json
import os
import socket
import ssl
import struct
import sys
import tempfile
import time
import zlib
from dataclasses import dataclass

import snappy
import trustme

from bench._clients import RECEIVE_SIZE, connect
from bench._support import (
    Nsqd,
    Record,
    Report,
    Window,
    add_common_arguments,
    banner,
    load_range,
    median_of,
    runs_of,
    spread,
)
from nsqpy.client.blocking import Consumer
from nsqpy.client.security import Security
from nsqpy.common.command import (
    MAGIC_V2,
    NOP,
    encode_identify,
    encode_mpub,
    encode_rdy,
    encode_sub,
)
from nsqpy.common.frame import FRAME_TYPE_MESSAGE, FRAME_TYPE_RESPONSE

TOPIC = "bench_security"
CHANNEL = "bench_channel"
FRAME_HEADER = struct.Struct(">Ii")
_ID_START = 18  # [4 size][4 type][8 timestamp][2 attempts][16 id][body]
_ID_END = 34
# IDENTIFY fields of each mode.
MODES = {
    "plain": {},
    "snappy": {"snappy": True},
    "deflate": {"deflate": True, "deflate_level": 6},
    "tls": {"tls_v1": True},
    "tls+snappy": {"tls_v1": True, "snappy": True},
}


# -- nsqd's certificate ----------------------------------------------------------------------


class Certificates:
    def __init__(self, directory: str) -> None:
        ca = trustme.CA()
        server = ca.issue_cert("127.0.0.1", "localhost")
        self.ca = os.path.join(directory, "ca.pem")
        self.cert = os.path.join(directory, "cert.pem")
        self.key = os.path.join(directory, "key.pem")
        ca.cert_pem.write_to_path(self.ca)
        server.cert_chain_pems[0].write_to_path(self.cert)
        server.private_key_pem.write_to_path(self.key)


# -- the client ------------------------------------------------------------------------------


class Layers:
    """The transport (socket or SSLSocket) and the compression codec of one connection, and
    the received bytes (after every layer) not yet parsed into frames."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.transport = sock
        self.compress = None
        self.decompress = None
        self.buffer = b""

    def send(self, data: bytes) -> None:
        self.transport.sendall(self.compress(data) if self.compress else data)

    def receive(self) -> bytes:
        data = self.transport.recv(RECEIVE_SIZE)
        if not data:
            raise ConnectionError("nsqd closed the connection")
        return self.decompress(data) if self.decompress else data

    def expect_response(self) -> bytes:
        """The next response frame (heartbeats skipped); what follows it stays buffered."""
        while True:
            while len(self.buffer) >= 8:
                size, frame_type = FRAME_HEADER.unpack_from(self.buffer)
                if len(self.buffer) < 4 + size:
                    break
                data, self.buffer = self.buffer[8 : 4 + size], self.buffer[4 + size :]
                if frame_type != FRAME_TYPE_RESPONSE:
                    raise RuntimeError(f"unexpected frame {frame_type} {data[:200]!r}")
                if data != b"_heartbeat_":
                    return data
            self.buffer += self.receive()

    def start_compression(self, compress, decompress) -> None:
        # Whatever arrived after the last plain frame is already compressed.
        self.compress, self.decompress = compress, decompress
        self.buffer = decompress(self.buffer) if self.buffer else b""


def negotiate(port: int, features: dict, ca: str) -> Layers:
    """IDENTIFY with these features, then TLS and compression as granted, OK after each."""
    layers = Layers(connect(port))
    layers.send(MAGIC_V2 + encode_identify({"feature_negotiation": True, **features}))
    reply = json.loads(layers.expect_response())
    for feature in ("tls_v1", "snappy", "deflate"):
        if reply[feature] != features.get(feature, False):
            raise RuntimeError(f"nsqd granted {feature}={reply[feature]}: {reply}")
    if reply["tls_v1"]:
        if layers.buffer:
            raise RuntimeError("bytes after the IDENTIFY reply before the TLS handshake")
        context = ssl.create_default_context(cafile=ca)
        layers.transport = context.wrap_socket(layers.sock, server_hostname="localhost")
        if layers.expect_response() != b"OK":
            raise RuntimeError("no OK after TLS")
    if reply["snappy"]:
        compressor, decompressor = snappy.StreamCompressor(), snappy.StreamDecompressor()
        layers.start_compression(compressor.add_chunk, decompressor.decompress)
    elif reply["deflate"]:
        compressor = zlib.compressobj(reply["deflate_level"], zlib.DEFLATED, -15)
        decompressor = zlib.decompressobj(-15)

        def deflate(data: bytes) -> bytes:
            return compressor.compress(data) + compressor.flush(zlib.Z_SYNC_FLUSH)

        layers.start_compression(deflate, decompressor.decompress)
    if (reply["snappy"] or reply["deflate"]) and layers.expect_response() != b"OK":
        raise RuntimeError("no OK after the compression upgrade")
    return layers


def fill(port: int, count: int, size: int) -> None:
    """Create the channel, then MPUB `count` bodies over a plain connection."""
    layers = negotiate(port, {}, "")
    layers.send(encode_sub(TOPIC, CHANNEL))
    if layers.expect_response() != b"OK":
        raise RuntimeError("SUB failed")
    layers.sock.close()
    layers = negotiate(port, {}, "")
    batch = 200
    template = b'{"seq":%08d,"event":"page_view","user":"user-%05d","path":"/products/%04d"'
    for start in range(0, count, batch):
        bodies = []
        for seq in range(start, min(start + batch, count)):
            body = template % (seq, seq % 7919, seq % 1000)
            bodies.append(body + b',"pad":"' + b"x" * max(0, size - len(body) - 10) + b'"}')
        layers.send(encode_mpub(TOPIC, bodies))
        if layers.expect_response() != b"OK":
            raise RuntimeError("MPUB failed")
    layers.sock.close()


def consume(port: int, features: dict, ca: str, count: int, rdy: int) -> tuple[float, float]:
    """Negotiate, SUB, RDY; (wall seconds, client CPU seconds) of receiving `count` messages
    and sending their FINs."""
    layers = negotiate(port, features, ca)
    layers.send(encode_sub(TOPIC, CHANNEL))
    if layers.expect_response() != b"OK":
        raise RuntimeError("SUB failed")
    unpack_from = FRAME_HEADER.unpack_from
    received = 0
    pending = layers.buffer
    start = time.monotonic()
    cpu = time.process_time()
    layers.send(encode_rdy(rdy))
    while received < count:
        data = layers.receive()
        if pending:
            data = pending + data
        ids = []
        position = 0
        available = len(data)
        while available - position >= 8:
            frame_size, frame_type = unpack_from(data, position)
            end = position + 4 + frame_size
            if end > available:
                break
            if frame_type == FRAME_TYPE_MESSAGE:
                ids.append(data[position + _ID_START : position + _ID_END])
            elif data[position + 8 : end] == b"_heartbeat_":
                layers.send(NOP)
            else:
                raise RuntimeError(f"unexpected frame {data[position:end]!r}")
            position = end
        pending = data[position:]
        if ids:
            layers.send(b"FIN " + b"\nFIN ".join(ids) + b"\n")
            received += len(ids)
    wall = time.monotonic() - start
    cpu = time.process_time() - cpu
    layers.transport.close()
    return wall, cpu


def consume_blocking(
    port: int, features: dict, ca: str, count: int, rdy: int
) -> tuple[float, float]:
    """`consume` with the blocking client: a message received and finished at a time."""
    security = Security(tls_v1=bool(features.get("tls_v1")), tls_root_ca_file=ca)
    start = time.monotonic()
    cpu = time.process_time()
    with Consumer(f"127.0.0.1:{port}", TOPIC, CHANNEL, max_in_flight=rdy, security=security) as c:
        for _ in range(count):
            message = c.receive(timeout=10)
            if message is None:
                raise RuntimeError("no message within 10 s")
            message.finish()
    return time.monotonic() - start, time.process_time() - cpu


# -- runs ------------------------------------------------------------------------------------


@dataclass
class Sample:
    rate: float
    wall: float
    nsqd_cpu: float
    client_cpu: float
    others_cpu: float
    load: float


def rate(sample: Sample) -> float:
    return sample.rate


def run(mode: str, args, certs: Certificates) -> Sample:
    flags = [f"-mem-queue-size={args.count + 10_000}", f"-tls-cert={certs.cert}"]
    flags.append(f"-tls-key={certs.key}")
    with Nsqd(flags, https=True) as nsqd:
        fill(nsqd.port, args.count, args.size)
        window = Window(nsqd)
        client = consume_blocking if args.client == "blocking" else consume
        wall, client_cpu = client(nsqd.port, MODES[mode], certs.ca, args.count, args.rdy)
        window.close()
    return Sample(
        args.count / wall,
        wall,
        window.nsqd_cpu,
        client_cpu,
        window.others(client_cpu),
        window.load,
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, default=200_000)
    parser.add_argument("--size", type=int, default=200)
    parser.add_argument("--rdy", type=int, default=2500)
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--client", choices=("raw", "blocking"), default="raw")
    add_common_arguments(parser)
    args = parser.parse_args()
    runs = runs_of(args)
    modes = args.modes.split(",")
    for mode in modes:
        if mode not in MODES:
            parser.error(f"unknown mode {mode}; known: {', '.join(MODES)}")
        if args.client == "blocking" and mode not in ("plain", "tls"):
            parser.error(f"the blocking client speaks plain and tls, not {mode}")
    started = time.monotonic()
    banner(
        "security_bench",
        f"{args.count:,} messages of {args.size} B, RDY {args.rdy}, 1 {args.client} consumer,"
        f" median (min–max) of {runs} run(s)",
    )
    print(
        "| mode | msgs/s median (min–max) | vs plain | wall s | nsqd CPU s | nsqd CPU/wall "
        "| nsqd CPU µs/msg | client CPU s | others CPU/wall | load avg |"
    )
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    report = Report(args.json)
    plain_rate = None
    with tempfile.TemporaryDirectory(prefix="nsqpy-bench-certs-") as directory:
        certs = Certificates(directory)
        for mode in modes:
            samples = [run(mode, args, certs) for _ in range(runs)]
            median = median_of(samples, rate)
            if mode == "plain":
                plain_rate = median.rate
            ratio = f"{median.rate / plain_rate:.2f}×" if plain_rate else "–"
            loads = [sample.load for sample in samples]
            print(
                f"| {mode} | {spread([s.rate for s in samples])} | {ratio} "
                f"| {median.wall:.2f} | {median.nsqd_cpu:.2f} "
                f"| {median.nsqd_cpu / median.wall:.2f} "
                f"| {median.nsqd_cpu / args.count * 1e6:.2f} | {median.client_cpu:.2f} "
                f"| {median.others_cpu / median.wall:.2f} | {load_range(loads)} |",
                flush=True,
            )
            report.add(
                Record(
                    "security",
                    f"TCP consume x1 over {mode}",
                    "msgs/s",
                    [s.rate for s in samples],
                    loads,
                    None,
                    {"nsqd µs/msg": round(median.nsqd_cpu / args.count * 1e6, 2)},
                )
            )
    report.write()
    print(f"\nsecurity_bench: done in {time.monotonic() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
