"""TCP publish and consume throughput of our nsqd, like Go's bench_writer and bench_reader.

    .venv/bin/python -m bench.pub_sub [--count 1000000] [--runs 3] [--no-profile]

Every run starts a fresh nsqd (subprocess, temporary data dir, port 0, ``--mem-queue-size``
1,000,000 by default, as Go's bench.sh runs it, so every message stays in memory) and stops it
with SIGKILL (nothing to keep). The clients are separate processes (multiprocessing, spawn)
on raw sockets and our codec:

* **publish**: N connections, each sending MPUB batches of ``--batch`` x ``--size``-byte
  messages, ``--window`` batches outstanding; every OK read sends as many new batches in one
  send. The topic has no channel (Go's bench_writer), so messages stay in the topic.
* **publish, 1 channel**: the same into a topic whose channel exists (fan-out on publish);
  this is how the consume runs fill the queue, timed as a figure of its own.
* **consume**: with ``--count`` messages queued in the channel, M connections SUB the same
  channel with ``RDY --rdy``; each received chunk is answered with all its FINs in one send.
  The clock starts when RDY is sent and stops when the last message arrives.

Each figure is the median of ``--runs`` runs with min and max. CPU seconds are measured over
the timed window: nsqd's from /proc/<pid>/stat, the clients' from time.process_time() in each
client process (summed), so one can tell who was busy (nsqd is single-threaded: 1.0 CPU-s per
wall-s is one saturated core). Then nsqd is profiled with py-spy (if installed in the venv)
under one publish and one consume run, and the top functions by own time are printed
(``--runs 0``: only the profile). ``--nsqd-gc off|T0,T1,T2`` starts nsqd's entry point with
the cyclic GC disabled or re-tuned, an experiment that leaves nsqd's code alone.
"""

import argparse
import datetime
import multiprocessing
import os
import platform
import queue
import re
import shutil
import signal
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from common.command import MAGIC_V2, NOP, encode_mpub, encode_rdy, encode_sub
from common.frame import FRAME_TYPE_MESSAGE, FRAME_TYPE_RESPONSE, FrameDecoder

BIN = Path(sys.executable).parent
TOPIC = "bench_topic"
CHANNEL = "bench_channel"
SOCKET_BUFFER = 4 * 1024 * 1024
RECEIVE_SIZE = 1024 * 1024
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
_LISTENING = re.compile(r"TCP: listening on (\S+)")
FRAME_HEADER = struct.Struct(">Ii")
_FRAME_HEADER_SIZE = FRAME_HEADER.size
# Offsets inside a message frame: [4 size][4 type][8 timestamp][2 attempts][16 id][body].
_ID_START = 18
_ID_END = 34


# -- nsqd ------------------------------------------------------------------------------------


# `--nsqd-gc`: run nsqd's console entry point with the cyclic GC tuned, nsqd itself unchanged.
_GC_PRELUDE = """import gc, sys
mode = {mode!r}
if mode == "off":
    gc.disable()
else:
    gc.set_threshold(*map(int, mode.split(",")))
from nsqd.__main__ import main
sys.exit(main())
"""


def nsqd_command(gc_mode: str) -> list[str]:
    if gc_mode == "default":
        return [str(BIN / "nsqd")]
    return [sys.executable, "-c", _GC_PRELUDE.format(mode=gc_mode)]


class Nsqd:
    """Our nsqd as a subprocess on port 0 in a fresh temporary data dir."""

    def __init__(self, extra_args: list[str], gc_mode: str = "default") -> None:
        self.data_path = tempfile.mkdtemp(prefix="nsqpy-bench-")
        self.lines: list[str] = []
        self.process = subprocess.Popen(
            [
                *nsqd_command(gc_mode),
                "-tcp-address=127.0.0.1:0",
                "-http-address=127.0.0.1:0",
                f"-data-path={self.data_path}",
                *extra_args,
            ],
            cwd=self.data_path,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.port = 0
        deadline = time.monotonic() + 20
        for line in self.process.stderr:
            self.lines.append(line.rstrip("\n"))
            match = _LISTENING.search(line)
            if match:
                self.port = int(match.group(1).rsplit(":", 1)[1])
                break
            if time.monotonic() > deadline:
                break
        if not self.port:
            self.stop()
            raise RuntimeError("nsqd did not start:\n" + "\n".join(self.lines))
        threading.Thread(target=self._drain, daemon=True).start()

    def _drain(self) -> None:
        for line in self.process.stderr:
            self.lines.append(line.rstrip("\n"))

    @property
    def pid(self) -> int:
        return self.process.pid

    def cpu_seconds(self) -> float:
        """utime + stime of the nsqd process (fields 14 and 15 of /proc/<pid>/stat)."""
        with open(f"/proc/{self.pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS

    def check_alive(self) -> None:
        if self.process.poll() is not None:
            raise RuntimeError(
                f"nsqd exited with {self.process.returncode}:\n" + "\n".join(self.lines[-30:])
            )

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()  # nothing to keep: skip the shutdown flush of queued messages
            self.process.wait()
        shutil.rmtree(self.data_path, ignore_errors=True)

    def __enter__(self) -> "Nsqd":
        return self

    def __exit__(self, *exc_info) -> None:
        self.stop()


# -- clients (each runs in its own process) --------------------------------------------------


def _connect(port: int) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=30)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, SOCKET_BUFFER)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SOCKET_BUFFER)
    return sock


def _expect_ok(sock: socket.socket) -> None:
    decoder = FrameDecoder()
    while True:
        data = sock.recv(RECEIVE_SIZE)
        if not data:
            raise ConnectionError("nsqd closed the connection")
        for frame in decoder.receive_data(data):
            if frame.frame_type == FRAME_TYPE_RESPONSE and frame.data == b"OK":
                return
            if frame.data != b"_heartbeat_":
                raise RuntimeError(f"unexpected frame {frame}")


def publisher(port, topic, batches, batch, size, window, barrier, results) -> None:
    """MPUB `batches` batches, `window` outstanding; put (messages, start, end, cpu)."""
    bodies = [os.urandom(size) for _ in range(batch)]
    command = encode_mpub(topic, bodies)
    sock = _connect(port)
    sock.sendall(MAGIC_V2)
    decoder = FrameDecoder()
    barrier.wait()
    cpu = time.process_time()
    start = time.monotonic()
    sent = min(window, batches)
    sock.sendall(command * sent)
    acked = 0
    while acked < batches:
        data = sock.recv(RECEIVE_SIZE)
        if not data:
            raise ConnectionError("nsqd closed the connection")
        oks = 0
        for frame in decoder.receive_data(data):
            if frame.frame_type == FRAME_TYPE_RESPONSE and frame.data == b"OK":
                oks += 1
            elif frame.data == b"_heartbeat_":
                sock.sendall(NOP)
            else:
                raise RuntimeError(f"publish failed: {frame}")
        acked += oks
        more = min(oks, batches - sent)
        if more:
            sock.sendall(command * more)
            sent += more
    end = time.monotonic()
    results.put((acked * batch, start, end, time.process_time() - cpu, 0))
    sock.close()


def consumer(port, topic, channel, rdy, target, total, barrier, results) -> None:
    """Receive and FIN until `total` (shared by all consumers) reaches `target`."""
    sock = _connect(port)
    sock.sendall(MAGIC_V2 + encode_sub(topic, channel))
    _expect_ok(sock)
    barrier.wait()
    cpu = time.process_time()
    start = last = time.monotonic()
    sock.sendall(encode_rdy(rdy))
    sock.settimeout(0.05)
    unpack_from = FRAME_HEADER.unpack_from
    received = chunks = 0
    pending = b""
    while True:
        try:
            data = sock.recv(RECEIVE_SIZE)
        except TimeoutError:
            if total.value >= target:
                break
            continue
        if not data:
            raise ConnectionError("nsqd closed the connection")
        if pending:
            data = pending + data
        ids = []
        append = ids.append
        position = 0
        available = len(data)
        while available - position >= _FRAME_HEADER_SIZE:
            frame_size, frame_type = unpack_from(data, position)
            end = position + 4 + frame_size
            if end > available:
                break
            if frame_type == FRAME_TYPE_MESSAGE:
                append(data[position + _ID_START : position + _ID_END])
            elif data[position + 8 : end] == b"_heartbeat_":
                sock.sendall(NOP)
            else:
                raise RuntimeError(f"unexpected frame {data[position:end]!r}")
            position = end
        pending = data[position:]
        if ids:
            sock.sendall(b"FIN " + b"\nFIN ".join(ids) + b"\n")
            received += len(ids)
            chunks += 1
            last = time.monotonic()
            with total.get_lock():
                total.value += len(ids)
                done = total.value >= target
            if done:
                break
        elif total.value >= target:
            break
    results.put((received, start, last, time.process_time() - cpu, chunks))
    sock.close()


# -- runs ------------------------------------------------------------------------------------


@dataclass
class Sample:
    messages: int
    wall: float
    nsqd_cpu: float
    client_cpu: float
    chunks: int = 0  # consume: receives that held messages, all consumers

    @property
    def rate(self) -> float:
        return self.messages / self.wall


@dataclass
class Figure:
    label: str
    connections: int
    samples: list[Sample] = field(default_factory=list)


def _run_clients(nsqd: Nsqd, context, target, args_list) -> Sample:
    """Start one process per args tuple, release them together, collect and time them."""
    parties = len(args_list)
    barrier = context.Barrier(parties + 1)
    results = context.Queue()
    processes = [
        context.Process(target=target, args=(*arguments, barrier, results), daemon=True)
        for arguments in args_list
    ]
    for process in processes:
        process.start()
    barrier.wait(timeout=60)
    cpu_before = nsqd.cpu_seconds()
    collected = []
    while len(collected) < parties:
        try:
            collected.append(results.get(timeout=5))
        except queue.Empty:  # still running? nsqd and every client that has not finished
            nsqd.check_alive()
            if any(process.exitcode not in (None, 0) for process in processes):
                codes = [process.exitcode for process in processes]
                raise RuntimeError(f"a client process failed: exit codes {codes}") from None
    cpu_after = nsqd.cpu_seconds()
    for process in processes:
        process.join()
    messages = sum(r[0] for r in collected)
    wall = max(r[2] for r in collected) - min(r[1] for r in collected)
    return Sample(
        messages,
        wall,
        cpu_after - cpu_before,
        sum(r[3] for r in collected),
        sum(r[4] for r in collected),
    )


def publish(nsqd: Nsqd, context, args, connections: int) -> Sample:
    per_connection = args.count // (args.batch * connections)
    if per_connection < 1:
        raise SystemExit("--count is smaller than one batch per connection")
    arguments = [
        (nsqd.port, TOPIC, per_connection, args.batch, args.size, args.window)
    ] * connections
    return _run_clients(nsqd, context, publisher, arguments)


def create_channel(nsqd: Nsqd) -> None:
    """SUB once (the channel is not ephemeral, so it stays), then leave."""
    sock = _connect(nsqd.port)
    sock.sendall(MAGIC_V2 + encode_sub(TOPIC, CHANNEL))
    _expect_ok(sock)
    sock.close()


def consume(nsqd: Nsqd, context, args, connections: int, queued: int) -> Sample:
    total = context.Value("q", 0)
    arguments = [(nsqd.port, TOPIC, CHANNEL, args.rdy, queued, total)] * connections
    sample = _run_clients(nsqd, context, consumer, arguments)
    if sample.messages != queued:
        print(f"    note: received {sample.messages:,} messages for {queued:,} queued")
    return sample


def nsqd_args(args) -> list[str]:
    return [f"-mem-queue-size={args.mem_queue_size}", *args.nsqd_arg]


def run_publish(context, args, connections: int) -> Sample:
    with Nsqd(nsqd_args(args), args.nsqd_gc) as nsqd:
        return publish(nsqd, context, args, connections)


def run_consume(context, args, connections: int) -> tuple[Sample, Sample]:
    """Fill the channel with --fill-publishers connections, then consume it all."""
    with Nsqd(nsqd_args(args), args.nsqd_gc) as nsqd:
        create_channel(nsqd)
        filled = publish(nsqd, context, args, args.fill_publishers)
        return filled, consume(nsqd, context, args, connections, filled.messages)


# -- profiling -------------------------------------------------------------------------------


def py_spy() -> str | None:
    found = BIN / "py-spy"
    return str(found) if found.exists() else shutil.which("py-spy")


class Profiler:
    """py-spy record attached to nsqd, collapsed stacks (--format raw), one per function."""

    def __init__(self, executable: str, pid: int, output: str, rate: int) -> None:
        self.output = output
        self.rate = rate
        self.started = time.monotonic()
        self.process = subprocess.Popen(
            [
                executable,
                "record",
                "--pid",
                str(pid),
                "--rate",
                str(rate),
                "--format",
                "raw",
                "--function",
                "--output",
                output,
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        time.sleep(1.0)  # let it attach

    def stop(self) -> float:
        seconds = time.monotonic() - self.started
        self.process.send_signal(signal.SIGINT)
        try:
            _out, err = self.process.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            self.process.kill()
            _out, err = self.process.communicate()
        if not os.path.exists(self.output):
            raise RuntimeError(f"py-spy wrote no profile:\n{err}")
        return seconds


_FRAME_NAME = re.compile(r"^(?P<function>.*) \((?P<file>[^()]*?)(?::(?P<line>\d+))?\)$")
_OUR_PACKAGES = ("nsqd/", "common/", "diskqueue/", "trio/", "bench/")


def _short(frame: str) -> str:
    """`Class.function (path/to/file.py:line)` -> `package/file.py:line Class.function`."""
    match = _FRAME_NAME.match(frame)
    if not match:
        return frame
    path = match["file"]
    for package in _OUR_PACKAGES:
        if path.startswith(package):
            break
        index = path.rfind("/" + package)
        if index >= 0:
            path = path[index + 1 :]
            break
    else:
        path = os.path.basename(path)
    line = f":{match['line']}" if match["line"] else ""
    return f"{path}{line} {match['function']}"


def summarize_profile(path: str, wall: float, rate: int, top: int) -> str:
    """Own and inclusive shares of the main thread's samples (the trio loop: all of nsqd's
    Python work). Other threads are trio's to_thread workers (fsync) and are counted apart."""
    own: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    samples = other_threads = 0
    with open(path) as raw:
        for line in raw:
            stack, _, count_text = line.rstrip("\n").rpartition(" ")
            if not stack:
                continue
            count = int(count_text)
            if not stack.startswith("<module>"):
                other_threads += count
                continue
            frames = [_short(frame) for frame in stack.split(";")]
            samples += count
            own[frames[-1]] += count
            for frame in set(frames):
                inclusive[frame] += count
    if not samples:
        return "    (no samples)"
    lines = [
        f"    {samples} main-thread samples at {rate} Hz (~{samples / rate:.1f} s on CPU; the"
        f" timed workload took {wall:.2f} s; py-spy leaves out idle samples),"
        f" {other_threads} samples in other threads (trio.to_thread workers)",
        "    own time (the function itself, not its callees):",
    ]
    for name, count in own.most_common(top):
        lines.append(f"      {count / samples:6.1%}  {name}")
    lines.append("    inclusive time (function and callees), nsqd/common/diskqueue only:")
    ours = [
        (name, count)
        for name, count in inclusive.most_common()
        if name.startswith(_OURS) and not name.startswith("nsqd/__main__.py")
    ]
    for name, count in ours[:top]:
        lines.append(f"      {count / samples:6.1%}  {name}")
    return "\n".join(lines)


_OURS = ("nsqd/", "common/", "diskqueue/")


def profile(context, args) -> None:
    executable = py_spy()
    if executable is None:
        print("\nprofile: py-spy not found (.venv/bin/pip install py-spy); skipped")
        return
    out_dir = args.profile_dir or tempfile.mkdtemp(prefix="nsqpy-bench-profile-")
    os.makedirs(out_dir, exist_ok=True)
    publishers = args.publishers[0]
    consumers = args.consumers[0]
    with Nsqd(nsqd_args(args), args.nsqd_gc) as nsqd:
        output = os.path.join(out_dir, "publish.txt")
        profiler = Profiler(executable, nsqd.pid, output, args.profile_rate)
        sample = publish(nsqd, context, args, publishers)
        profiler.stop()
        print(f"\nprofile: nsqd under publish ({publishers} connection(s), no channel),")
        print(f"  {sample.rate:,.0f} msgs/s while sampled; raw stacks in {output}")
        print(summarize_profile(output, sample.wall, args.profile_rate, args.profile_top))
    with Nsqd(nsqd_args(args), args.nsqd_gc) as nsqd:
        create_channel(nsqd)
        filled = publish(nsqd, context, args, args.fill_publishers)
        output = os.path.join(out_dir, "consume.txt")
        profiler = Profiler(executable, nsqd.pid, output, args.profile_rate)
        sample = consume(nsqd, context, args, consumers, filled.messages)
        profiler.stop()
        print(f"\nprofile: nsqd under consume ({consumers} connection(s), RDY {args.rdy}),")
        print(f"  {sample.rate:,.0f} msgs/s while sampled; raw stacks in {output}")
        print(summarize_profile(output, sample.wall, args.profile_rate, args.profile_top))


# -- report ----------------------------------------------------------------------------------


def _spread(values: list[float], fmt: str) -> str:
    return f"{statistics.median(values):{fmt}} ({min(values):{fmt}}–{max(values):{fmt}})"


def table(figures: list[Figure]) -> str:
    header = (
        "| workload | conns | msgs/run | msgs/s median (min–max) | wall s |"
        " nsqd CPU s | nsqd CPU/wall | clients CPU s |"
    )
    rows = [header, "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for figure in figures:
        samples = figure.samples
        rates = sorted(samples, key=lambda s: s.rate)
        median = rates[len(rates) // 2]
        rows.append(
            f"| {figure.label} | {figure.connections} | {median.messages:,} |"
            f" {_spread([s.rate for s in samples], ',.0f')} |"
            f" {median.wall:.2f} | {median.nsqd_cpu:.2f} |"
            f" {median.nsqd_cpu / median.wall:.2f} | {median.client_cpu:.2f} |"
        )
    return "\n".join(rows)


def git_revision() -> str:
    """The short commit, with `+uncommitted` when the work tree has uncommitted changes."""
    here = Path(__file__).resolve().parent.parent
    try:
        revision = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=here, capture_output=True, text=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=here,
            capture_output=True,
            text=True,
        ).stdout.strip()
    except OSError:
        return "unknown"
    return (revision or "unknown") + ("+uncommitted" if dirty else "")


def load_average() -> str:
    """The 1-minute load average: other work on the machine makes the figures noisy."""
    return f"{os.getloadavg()[0]:.2f}"


def _int_list(text: str) -> list[int]:
    return [int(part) for part in text.split(",") if part]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=1_000_000, help="messages per run")
    parser.add_argument("--size", type=int, default=200, help="message body bytes")
    parser.add_argument("--batch", type=int, default=200, help="messages per MPUB")
    parser.add_argument("--window", type=int, default=8, help="MPUBs outstanding per conn")
    parser.add_argument("--rdy", type=int, default=2500)
    parser.add_argument("--runs", type=int, default=3, help="0: only the profile")
    parser.add_argument("--publishers", type=_int_list, default=[1, 4], help="e.g. 1,4")
    parser.add_argument("--consumers", type=_int_list, default=[1, 4], help="e.g. 1,4")
    parser.add_argument("--fill-publishers", type=int, default=4)
    parser.add_argument("--mem-queue-size", type=int, default=1_000_000)
    parser.add_argument(
        "--nsqd-arg", action="append", default=[], help="extra nsqd flag (repeatable)"
    )
    parser.add_argument(
        "--nsqd-gc",
        default="default",
        help="experiment: 'off' (gc.disable()) or 'T0,T1,T2' (gc.set_threshold) in nsqd",
    )
    parser.add_argument("--no-profile", dest="profile", action="store_false")
    parser.add_argument("--profile-rate", type=int, default=200, help="py-spy samples/s")
    parser.add_argument("--profile-top", type=int, default=12)
    parser.add_argument("--profile-dir", default=None, help="where py-spy's stacks go")
    args = parser.parse_args(argv)

    context = multiprocessing.get_context("spawn")
    started = time.monotonic()
    print(
        f"pub_sub: {args.count:,} messages of {args.size} bytes per run, MPUB batches of"
        f" {args.batch}, window {args.window}, RDY {args.rdy}, {args.runs} runs,"
        f" nsqd {' '.join(nsqd_args(args))}"
        + ("" if args.nsqd_gc == "default" else f", nsqd GC {args.nsqd_gc}")
    )
    print(
        f"  {datetime.datetime.now(datetime.UTC):%Y-%m-%d}, commit {git_revision()},"
        f" {platform.python_implementation()} {platform.python_version()},"
        f" {os.cpu_count()} CPUs, load average {load_average()}"
    )
    figures: list[Figure] = []
    for connections in args.publishers:
        figure = Figure("TCP publish (MPUB, no channel)", connections)
        for _ in range(args.runs):
            figure.samples.append(run_publish(context, args, connections))
            print(f"  publish x{connections}: {figure.samples[-1].rate:,.0f} msgs/s", flush=True)
        figures.append(figure)
    fill = Figure("TCP publish (MPUB, 1 channel)", args.fill_publishers)
    for connections in args.consumers:
        figure = Figure("TCP consume (RDY, FIN)", connections)
        for _ in range(args.runs):
            filled, sample = run_consume(context, args, connections)
            fill.samples.append(filled)
            figure.samples.append(sample)
            print(
                f"  fill x{args.fill_publishers}: {filled.rate:,.0f} msgs/s,"
                f" consume x{connections}: {sample.rate:,.0f} msgs/s"
                f" ({sample.messages / max(sample.chunks, 1):,.0f} msgs per receive)",
                flush=True,
            )
        figures.append(figure)
    if fill.samples:
        figures.insert(len(args.publishers), fill)
    if args.runs > 0:
        print()
        print(table(figures))
    if args.profile:
        profile(context, args)
    print(f"\npub_sub: done in {time.monotonic() - started:.0f} s, load average {load_average()}")


if __name__ == "__main__":
    main()
