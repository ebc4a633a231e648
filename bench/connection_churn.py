"""Clients that connect and close by the thousand: connections a second, and whether nsqd's
memory stays flat.

    .venv/bin/python -m bench.connection_churn [--seconds 60] [--runs 1]
        [--reference ../go/nsqd] [--mode sub|pub] [--nsqd-args=-workers=2]

One client process makes one connection after another, each `IDENTIFY`, then `SUB t
c#ephemeral` and `RDY 1` (`--mode sub`, as a consumer that comes and goes) or one `PUB t`
(`--mode pub`, a PHP producer's connection per publish), then closes without CLS; for
`--seconds`. nsqd's RSS is read every second. Figures: connections a second, RSS at the start
and at the end, and its growth a minute over the second half of the run (after start-up's
own). With `--reference`, Go's nsqd (or another tree's) runs the same workload right after,
in the same invocation.
"""

import argparse
import multiprocessing
import socket
import struct
import sys
import time

from bench._support import (
    MIB,
    Nsqd,
    Report,
    add_common_arguments,
    banner,
    record_against_reference,
    runs_of,
)
from nsqpy.common.command import MAGIC_V2, encode_identify, encode_pub, encode_rdy, encode_sub

IDENTIFY = encode_identify(
    {"client_id": "churn", "feature_negotiation": True, "heartbeat_interval": 30000}
)


def _read_frame(sock: socket.socket) -> bytes:
    header = b""
    while len(header) < 4:
        chunk = sock.recv(4 - len(header))
        if not chunk:
            raise ConnectionError("closed")
        header += chunk
    (size,) = struct.unpack(">i", header)
    body = b""
    while len(body) < size:
        chunk = sock.recv(size - len(body))
        if not chunk:
            raise ConnectionError("closed")
        body += chunk
    return body


def churn(port: int, seconds: float, mode: str, results) -> None:
    """The client process: connections one after another until `seconds` have passed."""
    commands = [MAGIC_V2 + IDENTIFY]
    if mode == "sub":
        after = [encode_sub("t", "c#ephemeral"), encode_rdy(1)]
        answers = 1
    else:
        after = [encode_pub("t", b"x" * 100)]
        answers = 1
    deadline = time.monotonic() + seconds
    count = failed = 0
    started = time.monotonic()
    while time.monotonic() < deadline:
        sock = socket.create_connection(("127.0.0.1", port))
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            sock.sendall(commands[0])
            _read_frame(sock)  # IDENTIFY's answer
            sock.sendall(b"".join(after))
            for _ in range(answers):
                _read_frame(sock)
            count += 1
        except OSError:
            failed += 1  # closed before its answers (counted apart)
        finally:
            sock.close()
    results.put((count, failed, time.monotonic() - started))


def drive(nsqd, seconds: float, mode: str, samples: list[tuple[float, int]]):
    """The client process against a running nsqd, its RSS put in `samples` every second;
    (connections, closed early, seconds)."""
    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    client = context.Process(target=churn, args=(nsqd.tcp_port, seconds, mode, results))
    started = time.monotonic()
    client.start()
    while client.is_alive():
        samples.append((time.monotonic() - started, nsqd.memory()["VmRSS"]))
        client.join(1.0)
    return results.get(timeout=30)


def run_once(seconds: float, mode: str, extra: list[str]) -> dict:
    samples: list[tuple[float, int]] = []
    with Nsqd(extra) as nsqd:
        cpu_before = nsqd.cpu_seconds()
        count, failed, elapsed = drive(nsqd, seconds, mode, samples)
        cpu = nsqd.cpu_seconds() - cpu_before
        nsqd.check_alive()
    half = [sample for sample in samples if sample[0] >= seconds / 2]
    growth = 0.0
    if len(half) >= 2:
        (t0, r0), (t1, r1) = half[0], half[-1]
        growth = (r1 - r0) / MIB / max(t1 - t0, 1e-9) * 60
    return {
        "connections_per_s": count / elapsed,
        "connections": count,
        "closed_early": failed,
        "rss_start_mib": samples[0][1] / MIB if samples else 0.0,
        "rss_end_mib": samples[-1][1] / MIB if samples else 0.0,
        "rss_peak_mib": max(rss for _t, rss in samples) / MIB if samples else 0.0,
        "rss_growth_mib_per_min": growth,
        "cpu_us_per_connection": cpu / count * 1e6 if count else 0.0,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--mode", choices=("sub", "pub"), default="sub")
    add_common_arguments(parser, runs=1, reference=True)
    args = parser.parse_args(argv)
    runs = runs_of(args)
    banner(
        "connection churn (bench.connection_churn)",
        f"{args.mode}: one client, a connection after another, {args.seconds:g} s; {runs} run(s)",
    )
    report = Report(args.json)
    record_against_reference(
        report,
        "connection_churn",
        args,
        lambda: run_once(args.seconds, args.mode, []),
        lambda label, key: f"{args.mode} churn {args.seconds:g} s, {label}: {key}",
        (
            ("connections_per_s", "conn/s"),
            ("rss_growth_mib_per_min", "MiB/min"),
            ("rss_end_mib", "MiB"),
            ("cpu_us_per_connection", "µs"),
        ),
    )
    report.write()


if __name__ == "__main__":
    main(sys.argv[1:])
