"""HTTP publish throughput of our nsqd: `POST /pub` and `POST /mpub` over keep-alive connections.

    .venv/bin/python -m bench.http_pub [--connections 32] [--duration 5] [--runs 3] [--quick]
                                       [--client auto|wrk|python] [--pub-only] [--https]
                                       [--append-results]

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

`--auth` runs nsqd with `--auth-http-address` (an auth server in this process granting
`publish` and `subscribe` for an hour) and `--http-auth-required`: every request carries
`Authorization: Bearer`, and nsqd asks the auth server once per client address and TTL.

`--https` sends the requests to nsqd's HTTPS port (`--tls-cert` and `--tls-key` of a trustme
certificate; wrk speaks TLS 1.3 to it): a request's cost with its TLS records.
"""

import argparse
import http.server
import json
import multiprocessing
import os
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
from dataclasses import dataclass, field

from bench._support import (
    RESULTS,
    TARGETS,
    Nsqd,
    Record,
    Report,
    Window,
    add_common_arguments,
    banner,
    git_revision,
    load_average,
    load_range,
    machine,
    median_of,
    run_clients,
    runs_of,
    spread,
    today,
    verdict,
)

TOPIC = "http_bench"
_CONTENT_LENGTH = re.compile(rb"(?i)\r\ncontent-length: *(\d+)")


def message_count(nsqd: Nsqd) -> int:
    return nsqd.topic_depth(TOPIC)[0]


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
    others_cpu: float = 0.0  # the rest of the machine, busy CPU seconds over the window
    load: float = 0.0
    preempted: int = 0  # nsqd's nonvoluntary context switches over the window
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
            f"-d{args.duration:g}s",  # wrk takes no "5.0s"
            "--latency",
            "-s",
            script_path,
            f"https://127.0.0.1:{nsqd.https_port}{workload.path}"
            if args.https
            else f"http://127.0.0.1:{nsqd.http_port}{workload.path}",
        ]
        children_before = resource.getrusage(resource.RUSAGE_CHILDREN)
        window = Window(nsqd)
        completed = subprocess.run(command, capture_output=True, text=True, check=False)
        window.close()
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
        nsqd_cpu=window.nsqd_cpu,
        client_cpu=client_cpu,
        published=message_count(nsqd),
        others_cpu=window.others(client_cpu),
        load=window.load,
        preempted=window.preempted,
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
    credential = f"Authorization: Bearer {AUTH_SECRET}\r\n" if args.auth else ""
    request = (
        f"POST {workload.path} HTTP/1.1\r\nHost: 127.0.0.1:{nsqd.http_port}\r\n{credential}"
        f"Content-Type: application/octet-stream\r\nContent-Length: {len(workload.body)}\r\n\r\n"
    ).encode() + workload.body
    processes = max(1, min(args.processes, args.connections))
    shares = [
        args.connections // processes + (i < args.connections % processes) for i in range(processes)
    ]
    jobs = [(python_client, (nsqd.http_port, request, share, args.duration)) for share in shares]
    run = run_clients(nsqd, context, jobs, timeout=args.duration + 60)
    client_cpu = sum(run.column(4))
    return Sample(
        requests=sum(run.column(0)),
        errors=sum(run.column(1)),
        wall=max(run.column(3)) - min(run.column(2)),
        nsqd_cpu=run.window.nsqd_cpu,
        client_cpu=client_cpu,
        published=message_count(nsqd),
        others_cpu=run.window.others(client_cpu),
        load=run.window.load,
        preempted=run.window.preempted,
    )


# -- the auth server of --auth ---------------------------------------------------------------

AUTH_SECRET = "bench"
_GRANT = json.dumps(
    {
        "ttl": 3600,
        "authorizations": [
            {"topic": ".*", "channels": [".*"], "permissions": ["publish", "subscribe"]}
        ],
    }
).encode()


class _AuthHandler(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(_GRANT)))
        self.end_headers()
        self.wfile.write(_GRANT)

    def log_message(self, *args) -> None:
        pass


def server_certificate(directory: str) -> list[str]:
    """nsqd's flags for a trustme certificate written to `directory`."""
    import trustme

    certificate = trustme.CA().issue_cert("127.0.0.1", "localhost")
    cert, key = os.path.join(directory, "cert.pem"), os.path.join(directory, "key.pem")
    certificate.cert_chain_pems[0].write_to_path(cert)
    certificate.private_key_pem.write_to_path(key)
    return [f"--tls-cert={cert}", f"--tls-key={key}"]


def start_auth_server() -> int:
    """An auth server in a thread of this process, granting `publish` (and `subscribe`, for
    the benchmark's reads of /stats) on every topic; its port."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _AuthHandler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server.server_address[1]


# -- runs and report -------------------------------------------------------------------------


def one_run(workload: Workload, client: str, args, context) -> Sample:
    headers = {"Authorization": f"Bearer {AUTH_SECRET}"} if args.auth else None
    with Nsqd(args.nsqd_arg, headers=headers, https=args.https) as nsqd:  # fresh each run
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


def table(figures: list[Figure]) -> str:
    rows = [
        "| workload | client | conns | req/s median (min–max) | msgs/s median | errors |"
        " mean latency ms | nsqd CPU/wall | nsqd CPU µs/req | req per nsqd CPU-s |"
        " client CPU s per run | others CPU/wall | nsqd preempted per req | load avg |",
        "| --- | --- |" + " ---: |" * 12,
    ]
    for figure in figures:
        samples = figure.samples
        median = median_of(samples, lambda s: s.rate)
        latency = f"{median.latency_ms:.2f}" if median.latency_ms is not None else "–"
        rows.append(
            f"| {figure.workload.label} | {figure.client} | {figure.connections} |"
            f" {spread([s.rate for s in samples])} |"
            f" {median.rate * figure.workload.messages_per_request:,.0f} |"
            f" {sum(s.errors for s in samples)} | {latency} |"
            f" {median.nsqd_cpu / median.wall:.2f} | {median.cpu_per_request * 1e6:,.0f} |"
            f" {1 / median.cpu_per_request:,.0f} | {median.client_cpu:.2f} |"
            f" {median.others_cpu / median.wall:.2f} |"
            f" {median.preempted / max(median.requests, 1):.2f} |"
            f" {load_range([s.load for s in samples])} |"
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
    parser.add_argument("--size", type=int, default=200, help="message body bytes")
    parser.add_argument("--batch", type=int, default=100, help="messages per /mpub")
    parser.add_argument("--client", choices=("auto", "wrk", "python"), default="auto")
    parser.add_argument("--pub-only", action="store_true", help="only /pub, not /mpub")
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
    parser.add_argument(
        "--auth", action="store_true", help="every request authorized by an auth server"
    )
    parser.add_argument("--https", action="store_true", help="to nsqd's HTTPS port (wrk)")
    parser.add_argument("--append-results", action="store_true", help="append to RESULTS.md")
    add_common_arguments(parser)
    args = parser.parse_args(argv)
    runs = runs_of(args)
    if args.https:
        if args.client == "python" or args.auth:
            parser.error("--https takes wrk")
        args.client = "wrk"
        args.nsqd_arg += server_certificate(tempfile.mkdtemp(prefix="nsqpy-bench-certs-"))
    if args.auth:
        if args.client == "wrk":
            parser.error("--auth takes the Python client")
        args.client = "python"
        port = start_auth_server()
        args.nsqd_arg += [f"--auth-http-address=127.0.0.1:{port}", "--http-auth-required"]

    client = choose_client(args.client)
    context = multiprocessing.get_context("spawn")
    started = time.monotonic()
    command = " ".join(
        [".venv/bin/python -m bench.http_pub", *(argv if argv is not None else sys.argv[1:])]
    )
    banner(
        "http_pub",
        f"{args.connections} keep-alive connections, {args.duration:g} s per run,"
        f" {runs} run(s), {args.size}-byte messages, /mpub batches of {args.batch},"
        f" client {client}" + (f" ({args.processes} processes)" if client == "python" else ""),
    )
    figures = []
    for workload in workloads(args.size, args.batch)[: 1 if args.pub_only else None]:
        figure = Figure(workload, client, args.connections)
        for _ in range(runs):
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
    text = table(figures)
    print()
    print(text)
    report = Report(args.json)
    for figure in figures:
        median = median_of(figure.samples, lambda s: s.rate)
        report.add(
            Record(
                "http",
                f"HTTP {figure.workload.label}, {figure.connections} conns ({client})",
                "req/s",
                [s.rate for s in figure.samples],
                [s.load for s in figure.samples],
                "http_pub" if figure.workload.path.startswith("/pub") else None,
                {
                    "msgs/s": round(median.rate * figure.workload.messages_per_request),
                    "nsqd CPU/wall": round(median.nsqd_cpu / median.wall, 2),
                    "nsqd µs/req": round(median.cpu_per_request * 1e6),
                    "req per nsqd CPU-s": f"{1 / max(median.cpu_per_request, 1e-9):,.0f}",
                    "client CPU s": round(median.client_cpu, 2),
                    "others CPU/wall": round(median.others_cpu / median.wall, 2),
                    "nsqd preempted/req": round(median.preempted / max(median.requests, 1), 2),
                },
            )
        )
    report.write()
    target = TARGETS["http_pub"]
    pub_rate = statistics.median(s.rate for s in figures[0].samples)
    outcome = verdict(pub_rate, target)
    print(f"\ntarget /pub {target.text}: {outcome} ({pub_rate:,.0f})")
    print(f"http_pub: done in {time.monotonic() - started:.0f} s")
    if args.append_results:
        section = (
            f"\n## nsqd HTTP publish (`bench/http_pub.py`), {today()}\n\n"
            f"* date {today()}, commit {git_revision()}, {machine()},"
            f" load average {load_average():.2f}\n"
            f"* command: `{command}`\n"
            f"* {args.connections} keep-alive connections, one request outstanding each,"
            f" {args.duration:g} s per run, median (min–max) of {runs} runs, fresh nsqd"
            f" per run with its defaults (topic without channel, `--mem-queue-size` 10000)\n\n"
            f"{text}\n\nTarget /pub {target.text}: {outcome}.\n"
        )
        with open(RESULTS, "a") as results:
            results.write(section)
        print(f"appended to {RESULTS}")


if __name__ == "__main__":
    main()
