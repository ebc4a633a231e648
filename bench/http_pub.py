"""HTTP publish throughput of our nsqd: `POST /pub` and `POST /mpub` over keep-alive connections.

    .venv/bin/python -m bench.http_pub [--connections 32] [--duration 5] [--runs 3]
                                       [--client auto|wrk|python] [--append-results]

Every run starts a fresh nsqd (subprocess, port 0, temporary data dir, nsqd's defaults
otherwise: `--mem-queue-size` 10,000, so the topic, which has no channel, overflows to its
diskqueue as a real one would) and stops it with SIGKILL afterwards. The load is
`--connections` keep-alive connections, one request outstanding on each (no pipelining), for
`--duration` seconds:

* **/pub**: `POST /pub?topic=...` with a `--size`-byte body (one message per request);
* **/mpub**: `POST /mpub?topic=...` with `--batch` messages of `--size` bytes, text mode
  (messages separated by newlines), so one request publishes `--batch` messages.

The client is `wrk` when it is installed (`--client auto`, the default; one wrk thread, a Lua
script sets the method and body), otherwise a multi-process raw-socket client
(`--processes` processes, the connections shared among them, each process a selectors loop
that sends the next request on a connection as soon as its response is complete). Each figure
is the median of `--runs` runs with min and max. CPU seconds are over the timed window:
nsqd's from /proc/<pid>/stat (one thread: CPU/wall 1.00 is one saturated core), the client's
from getrusage of the wrk child or process_time() of the Python clients. After each run the
topic's message_count from `/stats` is checked against the requests that got `200 OK`.
`--append-results` appends the table to bench/RESULTS.md.
"""

import argparse
import datetime
import json
import multiprocessing
import os
import platform
import re
import resource
import selectors
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from bench.pub_sub import git_revision, load_average

BIN = Path(sys.executable).parent
RESULTS = Path(__file__).resolve().parent / "RESULTS.md"
TOPIC = "http_bench"
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
TARGET_PUB_RATE = 15_000
_LISTENING = re.compile(r"(TCP|HTTP): listening on (\S+)")
_CONTENT_LENGTH = re.compile(rb"(?i)\r\ncontent-length: *(\d+)")


# -- nsqd ------------------------------------------------------------------------------------


class Nsqd:
    """Our nsqd as a subprocess on port 0 in a fresh temporary data dir."""

    def __init__(self, extra_args: list[str]) -> None:
        self.data_path = tempfile.mkdtemp(prefix="nsqpy-http-bench-")
        self.command = [
            str(BIN / "nsqd"),
            "-tcp-address=127.0.0.1:0",
            "-http-address=127.0.0.1:0",
            f"-data-path={self.data_path}",
            *extra_args,
        ]
        self.lines: list[str] = []
        self.process = subprocess.Popen(
            self.command,
            cwd=self.data_path,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        addresses: dict[str, str] = {}
        deadline = time.monotonic() + 20
        for line in self.process.stderr:
            self.lines.append(line.rstrip("\n"))
            match = _LISTENING.search(line)
            if match:
                addresses[match.group(1)] = match.group(2)
            if "HTTP" in addresses or time.monotonic() > deadline:
                break
        if "HTTP" not in addresses:
            self.stop()
            raise RuntimeError("nsqd did not start:\n" + "\n".join(self.lines))
        self.http_port = int(addresses["HTTP"].rsplit(":", 1)[1])
        threading.Thread(target=self._drain, daemon=True).start()

    def _drain(self) -> None:
        for line in self.process.stderr:
            self.lines.append(line.rstrip("\n"))

    def cpu_seconds(self) -> float:
        """utime + stime of the nsqd process (fields 14 and 15 of /proc/<pid>/stat)."""
        with open(f"/proc/{self.process.pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS

    def message_count(self) -> int:
        url = f"http://127.0.0.1:{self.http_port}/stats?format=json&topic={TOPIC}"
        with urllib.request.urlopen(url, timeout=30) as reply:
            topics = json.load(reply)["topics"]
        return topics[0]["message_count"] if topics else 0

    def check_alive(self) -> None:
        if self.process.poll() is not None:
            raise RuntimeError(
                f"nsqd exited with {self.process.returncode}:\n" + "\n".join(self.lines[-30:])
            )

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()  # nothing to keep
            self.process.wait()
        shutil.rmtree(self.data_path, ignore_errors=True)

    def __enter__(self) -> "Nsqd":
        return self

    def __exit__(self, *exc_info) -> None:
        self.stop()


# -- workloads -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Workload:
    label: str
    path: str
    messages_per_request: int
    body: bytes


def workloads(size: int, batch: int) -> list[Workload]:
    message = (b"0123456789abcdefghijklmnopqrstuvwxyz" * (size // 36 + 1))[:size]
    return [
        Workload("/pub", f"/pub?topic={TOPIC}", 1, message),
        Workload(
            f"/mpub ({batch} msgs)", f"/mpub?topic={TOPIC}", batch, b"\n".join([message] * batch)
        ),
    ]


@dataclass
class Sample:
    requests: int  # answered 200 OK inside the window
    errors: int  # answered otherwise
    wall: float
    nsqd_cpu: float
    client_cpu: float
    published: int  # message_count of the topic afterwards
    latency_ms: float | None = None  # wrk's mean latency

    @property
    def rate(self) -> float:
        return self.requests / self.wall

    @property
    def cpu_per_request(self) -> float:
        """nsqd CPU seconds per answered request: what the rate would be per saturated core,
        whatever else shares the machine."""
        return self.nsqd_cpu / max(self.requests + self.errors, 1)


@dataclass
class Figure:
    workload: Workload
    client: str
    connections: int
    samples: list[Sample] = field(default_factory=list)


# -- the wrk client --------------------------------------------------------------------------

_WRK_SCRIPT = """wrk.method = "POST"
wrk.headers["Content-Type"] = "application/octet-stream"
local file = io.open("{body}", "rb")
wrk.body = file:read("*a")
file:close()
"""


def _wrk_duration_of(text: str) -> float:
    match = re.search(r"requests in ([\d.]+)(us|ms|s|m)", text)
    if not match:
        raise RuntimeError(f"unexpected wrk output:\n{text}")
    scale = {"us": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0}[match.group(2)]
    return float(match.group(1)) * scale


def _wrk_latency_ms(text: str) -> float | None:
    match = re.search(r"Latency\s+([\d.]+)(us|ms|s)", text)
    if not match:
        return None
    return float(match.group(1)) * {"us": 1e-3, "ms": 1.0, "s": 1e3}[match.group(2)]


def run_wrk(nsqd: Nsqd, workload: Workload, args) -> Sample:
    with tempfile.TemporaryDirectory(prefix="nsqpy-wrk-") as scratch:
        body_path = os.path.join(scratch, "body")
        with open(body_path, "wb") as body_file:
            body_file.write(workload.body)
        script_path = os.path.join(scratch, "post.lua")
        with open(script_path, "w") as script:
            script.write(_WRK_SCRIPT.format(body=body_path))
        command = [
            "wrk",
            f"-t{args.wrk_threads}",
            f"-c{args.connections}",
            f"-d{args.duration}s",
            "--latency",
            "-s",
            script_path,
            f"http://127.0.0.1:{nsqd.http_port}{workload.path}",
        ]
        children_before = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu_before = nsqd.cpu_seconds()
        completed = subprocess.run(command, capture_output=True, text=True, check=False)
        cpu_after = nsqd.cpu_seconds()
        children_after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if completed.returncode != 0:
        raise RuntimeError(
            f"wrk failed ({completed.returncode}):\n{completed.stdout}{completed.stderr}"
        )
    text = completed.stdout
    total = int(re.search(r"(\d+) requests in", text).group(1))
    non_2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", text)
    errors = int(non_2xx.group(1)) if non_2xx else 0
    socket_errors = re.search(r"Socket errors: (.*)", text)
    if socket_errors:
        print(f"    wrk socket errors: {socket_errors.group(1)}")
    client_cpu = (children_after.ru_utime - children_before.ru_utime) + (
        children_after.ru_stime - children_before.ru_stime
    )
    return Sample(
        requests=total - errors,
        errors=errors,
        wall=_wrk_duration_of(text),
        nsqd_cpu=cpu_after - cpu_before,
        client_cpu=client_cpu,
        published=nsqd.message_count(),
        latency_ms=_wrk_latency_ms(text),
    )


# -- the Python client (each process runs this) ----------------------------------------------


def _parse_responses(buffer: bytearray) -> tuple[int, int]:
    """Complete responses at the start of `buffer` (removed): (200 OK count, other count)."""
    ok = other = 0
    while True:
        end = buffer.find(b"\r\n\r\n")
        if end < 0:
            break
        head = bytes(buffer[:end])
        match = _CONTENT_LENGTH.search(head)
        total = end + 4 + (int(match.group(1)) if match else 0)
        if len(buffer) < total:
            break
        if head.startswith(b"HTTP/1.1 200 "):
            ok += 1
        else:
            other += 1
        del buffer[:total]
    return ok, other


def python_client(port, request, connections, duration, barrier, results) -> None:
    """Keep `connections` connections busy, one request each, until `duration` has passed."""
    selector = selectors.DefaultSelector()
    sockets = []
    for _ in range(connections):
        sock = socket.create_connection(("127.0.0.1", port), timeout=30)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.setblocking(False)
        sockets.append(sock)
        selector.register(sock, selectors.EVENT_READ, bytearray())
    barrier.wait()
    cpu = time.process_time()
    start = time.monotonic()
    stop = start + duration
    for sock in sockets:
        sock.send(request)  # a few hundred bytes: always fits the empty send buffer
    ok = other = 0
    while True:
        now = time.monotonic()
        if now >= stop:
            break
        for key, _events in selector.select(timeout=stop - now):
            sock = key.fileobj
            data = sock.recv(65536)
            if not data:
                raise ConnectionError("nsqd closed a connection")
            buffer = key.data
            buffer += data
            answered, failed = _parse_responses(buffer)
            ok += answered
            other += failed
            if answered or failed:
                sock.sendall(request * (answered + failed))
    end = time.monotonic()
    results.put((ok, other, start, end, time.process_time() - cpu))
    for sock in sockets:
        sock.close()


def run_python(nsqd: Nsqd, workload: Workload, args, context) -> Sample:
    request = (
        f"POST {workload.path} HTTP/1.1\r\nHost: 127.0.0.1:{nsqd.http_port}\r\n"
        f"Content-Type: application/octet-stream\r\nContent-Length: {len(workload.body)}\r\n\r\n"
    ).encode() + workload.body
    processes = max(1, min(args.processes, args.connections))
    shares = [
        args.connections // processes + (i < args.connections % processes) for i in range(processes)
    ]
    barrier = context.Barrier(processes + 1)
    results = context.Queue()
    clients = [
        context.Process(
            target=python_client,
            args=(nsqd.http_port, request, share, args.duration, barrier, results),
            daemon=True,
        )
        for share in shares
    ]
    for client in clients:
        client.start()
    barrier.wait(timeout=60)
    cpu_before = nsqd.cpu_seconds()
    collected = [results.get(timeout=args.duration + 60) for _ in clients]
    cpu_after = nsqd.cpu_seconds()
    for client in clients:
        client.join()
    nsqd.check_alive()
    return Sample(
        requests=sum(r[0] for r in collected),
        errors=sum(r[1] for r in collected),
        wall=max(r[3] for r in collected) - min(r[2] for r in collected),
        nsqd_cpu=cpu_after - cpu_before,
        client_cpu=sum(r[4] for r in collected),
        published=nsqd.message_count(),
    )


# -- runs and report -------------------------------------------------------------------------


def one_run(workload: Workload, client: str, args, context) -> Sample:
    with Nsqd(args.nsqd_arg) as nsqd:
        if client == "wrk":
            sample = run_wrk(nsqd, workload, args)
        else:
            sample = run_python(nsqd, workload, args, context)
        nsqd.check_alive()
    expected = sample.requests * workload.messages_per_request
    if sample.published < expected:
        raise RuntimeError(
            f"{workload.label}: {sample.requests:,} requests answered OK but the topic holds"
            f" only {sample.published:,} messages (expected at least {expected:,})"
        )
    return sample


def _spread(values: list[float], fmt: str) -> str:
    return f"{statistics.median(values):{fmt}} ({min(values):{fmt}}–{max(values):{fmt}})"


def table(figures: list[Figure]) -> str:
    rows = [
        "| workload | client | conns | req/s median (min–max) | msgs/s median | errors |"
        " mean latency ms | nsqd CPU/wall | nsqd CPU µs/req | req per nsqd CPU-s |"
        " client CPU s per run |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for figure in figures:
        samples = figure.samples
        ordered = sorted(samples, key=lambda s: s.rate)
        median = ordered[len(ordered) // 2]
        latency = f"{median.latency_ms:.2f}" if median.latency_ms is not None else "–"
        rows.append(
            f"| {figure.workload.label} | {figure.client} | {figure.connections} |"
            f" {_spread([s.rate for s in samples], ',.0f')} |"
            f" {median.rate * figure.workload.messages_per_request:,.0f} |"
            f" {sum(s.errors for s in samples)} | {latency} |"
            f" {median.nsqd_cpu / median.wall:.2f} | {median.cpu_per_request * 1e6:,.0f} |"
            f" {1 / median.cpu_per_request:,.0f} | {median.client_cpu:.2f} |"
        )
    return "\n".join(rows)


def choose_client(requested: str) -> str:
    if requested == "auto":
        return "wrk" if shutil.which("wrk") else "python"
    if requested == "wrk" and not shutil.which("wrk"):
        raise SystemExit("--client wrk: wrk is not installed (apt-get install wrk)")
    return requested


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--connections", type=int, default=32)
    parser.add_argument("--duration", type=int, default=5, help="seconds per run")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--size", type=int, default=200, help="message body bytes")
    parser.add_argument("--batch", type=int, default=100, help="messages per /mpub")
    parser.add_argument("--client", choices=("auto", "wrk", "python"), default="auto")
    parser.add_argument("--wrk-threads", type=int, default=1)
    parser.add_argument(
        "--processes",
        type=int,
        default=max(1, min(4, (os.cpu_count() or 2) - 1)),
        help="Python client processes (default: one per CPU but one, at most 4)",
    )
    parser.add_argument(
        "--nsqd-arg", action="append", default=[], help="extra nsqd flag (repeatable)"
    )
    parser.add_argument("--append-results", action="store_true", help="append to RESULTS.md")
    args = parser.parse_args(argv)

    client = choose_client(args.client)
    context = multiprocessing.get_context("spawn")
    started = time.monotonic()
    command = " ".join(
        [".venv/bin/python -m bench.http_pub", *(argv if argv is not None else sys.argv[1:])]
    )
    date = f"{datetime.datetime.now(datetime.UTC):%Y-%m-%d}"
    machine = (
        f"{os.cpu_count()} cores (`nproc`), {platform.python_implementation()}"
        f" {platform.python_version()}"
    )
    revision = git_revision()
    print(
        f"http_pub: {args.connections} keep-alive connections, {args.duration:g} s per run,"
        f" {args.runs} runs, {args.size}-byte messages, /mpub batches of {args.batch},"
        f" client {client}" + (f" ({args.processes} processes)" if client == "python" else "")
    )
    print(f"  {date}, commit {revision}, {machine}, load average {load_average()}")
    figures = []
    for workload in workloads(args.size, args.batch):
        figure = Figure(workload, client, args.connections)
        for _ in range(args.runs):
            sample = one_run(workload, client, args, context)
            figure.samples.append(sample)
            print(
                f"  {workload.label}: {sample.rate:,.0f} req/s"
                f" ({sample.rate * workload.messages_per_request:,.0f} msgs/s),"
                f" {sample.errors} errors, nsqd CPU/wall {sample.nsqd_cpu / sample.wall:.2f}"
                f" ({sample.cpu_per_request * 1e6:,.0f} µs/req),"
                f" client CPU {sample.client_cpu:.2f} s",
                flush=True,
            )
        figures.append(figure)
    report = table(figures)
    print()
    print(report)
    pub_rate = statistics.median(s.rate for s in figures[0].samples)
    verdict = "met" if pub_rate >= TARGET_PUB_RATE else "NOT met"
    print(f"\ntarget /pub >= {TARGET_PUB_RATE:,} req/s: {verdict} ({pub_rate:,.0f})")
    print(f"http_pub: done in {time.monotonic() - started:.0f} s, load average {load_average()}")
    if args.append_results:
        section = (
            f"\n## nsqd HTTP publish (`bench/http_pub.py`), {date}\n\n"
            f"* date {date}, commit {revision}, {machine}, load average {load_average()}\n"
            f"* command: `{command}`\n"
            f"* {args.connections} keep-alive connections, one request outstanding each,"
            f" {args.duration:g} s per run, median (min–max) of {args.runs} runs, fresh nsqd"
            f" per run with its defaults (topic without channel, `--mem-queue-size` 10000)\n\n"
            f"{report}\n\nTarget /pub ≥ {TARGET_PUB_RATE:,} req/s: {verdict}.\n"
        )
        with open(RESULTS, "a") as results:
            results.write(section)
        print(f"appended to {RESULTS}")


if __name__ == "__main__":
    main()
