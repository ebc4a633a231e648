"""The long fuzz campaign against a real nsqd subprocess (issue #10):

    python -m fuzz.run --protocol-inputs 1000000 --http-requests 100000 --seed 1

The TCP fuzzer (fuzz/tcp_fuzz.py) and the HTTP fuzzer (fuzz/http_fuzz.py) run side by side
over many connections, with slowloris connections on both ports and a canary producer and
consumer throughout. The run fails (exit status 1) on any of: nsqd dying, a reply the oracle
does not allow, an internal error in nsqd's log, a canary message lost, a slowloris TCP
connection never cut off or a slowloris HTTP connection never answered, nsqd's RSS past
--max-rss-mb, or nsqd not stopping cleanly (exit 0) on SIGTERM at the end.
"""

import argparse
import json
import socket
import sys
import tempfile
import threading
import time
from pathlib import Path

from fuzz.canary import Canary
from fuzz.daemon import NSQDProcess, RSSSampler
from fuzz.http_fuzz import VALID_CHANNELS as HTTP_CHANNELS
from fuzz.http_fuzz import VALID_TOPICS as HTTP_TOPICS
from fuzz.http_fuzz import HTTPFuzzer, HTTPSlowloris, HTTPStats
from fuzz.tcp_fuzz import TCPFuzzer, TCPStats, slowloris_session
from fuzz.tcp_grammar import VALID_CHANNELS as TCP_CHANNELS
from fuzz.tcp_grammar import VALID_TOPICS as TCP_TOPICS

# Small in-memory queues, so that what the fuzzers publish goes to disk and nsqd's RSS
# measures nsqd, not the backlog of channels nobody reads.
NSQD_FLAGS = ["-mem-queue-size=100", "-log-level=info"]


def _http(port: int, method: str, target: str, body: bytes = b"") -> int:
    with socket.create_connection(("127.0.0.1", port), timeout=60) as sock:
        sock.sendall(
            f"{method} {target} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
            f"Content-Length: {len(body)}\r\n\r\n".encode()
            + body
        )
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    return int(data.split(b" ", 2)[1])


class Janitor:
    """Empties the fuzzers' topics and channels every `every` seconds, as an operator would:
    fuzz consumers take messages and never FIN them, durable channels nobody reads keep what
    they are sent, so without it RSS and disk would measure the backlog nsqd was told to keep
    (in flight, deferred for up to an hour), not nsqd."""

    def __init__(self, http_port: int, every: float = 5.0) -> None:
        self.http_port = http_port
        self.every = every
        self.stop = threading.Event()
        self.passes = 0
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> "Janitor":
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self.stop.wait(self.every):
            self.sweep()

    def sweep(self) -> None:
        pools = [(TCP_TOPICS, TCP_CHANNELS), (HTTP_TOPICS, HTTP_CHANNELS)]
        for topic, channels in [(t, cs) for ts, cs in pools for t in ts]:
            quoted = topic.replace("#", "%23")
            _http(self.http_port, "POST", f"/topic/empty?topic={quoted}")
            for channel in channels:
                target = f"/channel/empty?topic={quoted}&channel={channel.replace('#', '%23')}"
                _http(self.http_port, "POST", target)
        self.passes += 1

    def finish(self) -> None:
        self.stop.set()
        self._thread.join(60)


def _tcp_slowloris_loop(port: int, stats: TCPStats, stop: threading.Event, gap: float) -> None:
    while not stop.is_set():
        slowloris_session(port, stats, gap)


def run_campaign(
    *,
    protocol_inputs: int,
    http_requests: int,
    seed: int,
    data_path: Path,
    tcp_workers: int = 8,
    http_workers: int = 4,
    http_slowloris: int = 4,
    slowloris_gap: float = 0.25,
    max_rss_mb: int = 1024,
    progress_every: float = 0.0,
) -> dict:
    """Run the campaign; the report, whose "failures" list is empty when all held."""
    started = time.monotonic()
    daemon = NSQDProcess(data_path, *NSQD_FLAGS).start()
    failures: list[str] = []
    try:
        tcp_port, http_port = daemon.port("TCP"), daemon.port("HTTP")
        rss = RSSSampler(daemon.pid).start()
        canary = Canary(tcp_port).start()
        janitor = Janitor(http_port).start()
        slow_http = HTTPSlowloris(http_port, http_slowloris, slowloris_gap).start()
        slow_tcp_stats = TCPStats()
        stop_slow_tcp = threading.Event()
        slow_tcp = threading.Thread(
            target=_tcp_slowloris_loop,
            args=(tcp_port, slow_tcp_stats, stop_slow_tcp, slowloris_gap),
            daemon=True,
        )
        slow_tcp.start()

        last_print = [time.monotonic()]

        def progress(_stats) -> None:
            if not progress_every or time.monotonic() - last_print[0] < progress_every:
                return
            last_print[0] = time.monotonic()
            print(
                f"[{time.monotonic() - started:7.1f}s] tcp inputs parsed "
                f"{tcp.stats.inputs_parsed:,} sessions {tcp.stats.sessions:,} | http requests "
                f"{http.stats.requests:,} | rss {rss.samples[-1] // 1024} MiB | canary "
                f"{len(canary.received):,} | violations "
                f"{tcp.stats.violation_count + http.stats.violation_count}",
                flush=True,
            )

        tcp = TCPFuzzer(tcp_port, seed, protocol_inputs, tcp_workers, progress)
        http = HTTPFuzzer(http_port, seed, http_requests, http_workers, progress)
        threads = [
            threading.Thread(target=tcp.run, daemon=True),
            threading.Thread(target=http.run, daemon=True),
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        fuzz_seconds = time.monotonic() - started

        janitor.finish()
        stop_slow_tcp.set()
        slow_tcp.join(60)
        http_slow_stats: HTTPStats = slow_http.finish()
        failures += canary.finish()
        if not daemon.alive():
            failures.append(f"nsqd died: exit {daemon.process.returncode}")
        else:
            # Back to a quiet state: the options the HTTP fuzzer changed, what it created.
            _http(http_port, "PUT", "/config/log_level", b"info")
            _http(http_port, "PUT", "/config/nsqlookupd_tcp_addresses", b"[]")
            _http(http_port, "POST", "/disable/write?type=none")
            for topic in TCP_TOPICS + HTTP_TOPICS:
                _http(http_port, "POST", f"/topic/delete?topic={topic.replace('#', '%23')}")
            _http(http_port, "POST", "/debug/freememory")
        rss.stop()
        tcp_stats, http_stats = tcp.stats, http.stats
        failures += tcp_stats.violations + http_stats.violations
        failures += slow_tcp_stats.violations + http_slow_stats.violations
        if daemon.internal_error_count:
            failures.append(f"{daemon.internal_error_count} internal errors in nsqd's log")
            failures += daemon.internal_errors
        if tcp_stats.inputs_parsed < protocol_inputs:
            failures.append(f"only {tcp_stats.inputs_parsed} of {protocol_inputs} inputs ran")
        if http_stats.requests < http_requests:
            failures.append(f"only {http_stats.requests} of {http_requests} requests ran")
        if rss.peak > max_rss_mb * 1024:
            failures.append(f"nsqd RSS peaked at {rss.peak // 1024} MiB > {max_rss_mb} MiB")
        if slow_tcp_stats.slowloris and slow_tcp_stats.slowloris_cut != slow_tcp_stats.slowloris:
            failures.append("a TCP slowloris connection was never cut off")
        exit_status = daemon.stop() if daemon.alive() else daemon.process.returncode
        if exit_status != 0:
            failures.append(f"nsqd exited {exit_status} on SIGTERM")
        report = {
            "seed": seed,
            "wall_seconds": round(time.monotonic() - started, 1),
            "fuzz_seconds": round(fuzz_seconds, 1),
            "tcp": {
                "inputs_parsed": tcp_stats.inputs_parsed,
                "inputs_sent": tcp_stats.inputs_sent,
                "connections": tcp_stats.sessions,
                "bytes_sent": tcp_stats.bytes_sent,
                "replies": tcp_stats.replies,
                "messages_received": tcp_stats.messages_received,
                "errors_by_code": dict(tcp_stats.errors_by_code.most_common()),
                "endings": dict(tcp_stats.endings),
                "violations": tcp_stats.violation_count,
                "slowloris_connections": slow_tcp_stats.slowloris,
                "slowloris_cut_off": slow_tcp_stats.slowloris_cut,
            },
            "http": {
                "requests": http_stats.requests,
                "responses": http_stats.responses,
                "connections": http_stats.connections,
                "status": dict(sorted(http_stats.status.items())),
                "errors_by_message": dict(http_stats.messages.most_common()),
                "violations": http_stats.violation_count,
                "slowloris_connections": http_slow_stats.slowloris,
                "slowloris_answered": http_slow_stats.slowloris_answered,
            },
            "janitor_passes": janitor.passes,
            "canary": {
                "published": len(canary.published),
                "received": len(canary.received),
                "longest_gap_seconds": round(canary.longest_gap, 2),
            },
            "rss_kib": {"start": rss.samples[0], "peak": rss.peak, "end": rss.samples[-1]},
            "nsqd": {
                "log_lines": daemon.line_count,
                "internal_errors": daemon.internal_error_count,
                "exit_status": exit_status,
            },
            "failures": failures,
        }
        return report
    finally:
        daemon.kill()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--protocol-inputs", type=int, default=1_000_000)
    parser.add_argument("--http-requests", type=int, default=100_000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--tcp-workers", type=int, default=8)
    parser.add_argument("--http-workers", type=int, default=4)
    parser.add_argument("--max-rss-mb", type=int, default=1024)
    parser.add_argument("--data-path", type=Path, help="default: a temporary directory")
    parser.add_argument("--report", type=Path, help="also write the JSON report here")
    options = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="nsqpy-fuzz-") as temporary:
        data_path = options.data_path or Path(temporary)
        data_path.mkdir(parents=True, exist_ok=True)
        report = run_campaign(
            protocol_inputs=options.protocol_inputs,
            http_requests=options.http_requests,
            seed=options.seed,
            data_path=data_path,
            tcp_workers=options.tcp_workers,
            http_workers=options.http_workers,
            max_rss_mb=options.max_rss_mb,
            progress_every=10.0,
        )
    text = json.dumps(report, indent=2)
    print(text)
    if options.report:
        options.report.write_text(text + "\n")
    sys.exit(1 if report["failures"] else 0)


if __name__ == "__main__":
    main()
