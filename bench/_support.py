"""What every benchmark shares: our nsqd as a subprocess, CPU and memory from /proc, the
client-process runner, median (min–max) formatting, the targets, and the JSON records the
`python -m bench` runner collects into its summary.

Conventions (bench/RESULTS.md): every run starts a fresh nsqd (port 0, a fresh temporary
data dir, SIGKILL at the end: nothing to keep); every figure is the median of ``--runs`` runs
(``--quick``: one) with min and max; every run notes the 1-minute load average and how busy
the machine was besides nsqd and the bench clients, since other engineers share these cores.
"""

import argparse
import datetime
import json
import os
import platform
import queue
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

BIN = Path(sys.executable).parent
ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "RESULTS.md"
PROFILES = ROOT / "bench" / "profiles"
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
MIB = 1024 * 1024
_LISTENING = re.compile(r"(TCP|HTTP|HTTPS): listening on (\S+)")


# -- /proc -----------------------------------------------------------------------------------


def process_cpu_seconds(pid: int) -> float:
    """utime + stime (fields 14 and 15 of /proc/<pid>/stat) of a process, all its threads,
    and its workers."""
    counters = process_counters(pid)
    return counters["user"] + counters["system"]


def process_tree(pid: int) -> list[int]:
    """`pid` and its descendants (an nsqd with `--workers` and its worker processes)."""
    pids = [pid]
    for parent in pids:
        try:
            threads = os.listdir(f"/proc/{parent}/task")
        except OSError:
            continue
        for thread in threads:
            try:
                with open(f"/proc/{parent}/task/{thread}/children") as children:
                    pids.extend(int(child) for child in children.read().split())
            except OSError:
                continue
    return pids


def process_counters(pid: int) -> dict[str, float]:
    """User and system CPU seconds and context switches (voluntary: it waited; nonvoluntary:
    the scheduler took the CPU away while it could run) of a process and its workers."""
    counters = {"user": 0.0, "system": 0.0, "voluntary": 0, "nonvoluntary": 0}
    for member in process_tree(pid):
        try:
            with open(f"/proc/{member}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
            with open(f"/proc/{member}/status") as status:
                lines = status.read().splitlines()
        except OSError:
            continue  # it exited meanwhile
        counters["user"] += int(fields[11]) / CLOCK_TICKS
        counters["system"] += int(fields[12]) / CLOCK_TICKS
        for line in lines:
            key, _, value = line.partition(":")
            if key.endswith("voluntary_ctxt_switches"):
                counters[key.removesuffix("_ctxt_switches")] += int(value)
    return counters


def machine_busy_seconds() -> float:
    """CPU seconds all cores spent busy (not idle, not iowait) since boot, from /proc/stat."""
    with open("/proc/stat") as stat:
        fields = [int(value) for value in stat.readline().split()[1:]]
    user, nice, system, _idle, _iowait, irq, softirq, steal = fields[:8]
    return (user + nice + system + irq + softirq + steal) / CLOCK_TICKS


def process_memory(pid: int) -> dict[str, int]:
    """VmRSS and VmHWM (peak RSS) in bytes, from /proc/<pid>/status, of a process and its
    workers together."""
    found = {"VmRSS": 0, "VmHWM": 0}
    for member in process_tree(pid):
        try:
            with open(f"/proc/{member}/status") as status:
                lines = status.read().splitlines()
        except OSError:
            continue
        for line in lines:
            key, _, value = line.partition(":")
            if key in found:
                found[key] += int(value.split()[0]) * 1024  # reported in kB
    return found


def load_average() -> float:
    """The 1-minute load average: other work on the machine makes the figures noisy."""
    return os.getloadavg()[0]


class Window:
    """CPU accounting over a timed window: nsqd's CPU seconds and the whole machine's busy
    seconds, so that `others` (busy minus nsqd minus the bench clients) shows interference,
    and how often the scheduler preempted nsqd (nonvoluntary context switches)."""

    def __init__(self, nsqd: "Nsqd") -> None:
        self.nsqd = nsqd
        self._start = process_counters(nsqd.pid)
        self._busy = machine_busy_seconds()

    def close(self) -> "Window":
        end = process_counters(self.nsqd.pid)
        self.nsqd_cpu = end["user"] + end["system"] - self._start["user"] - self._start["system"]
        self.nsqd_system = end["system"] - self._start["system"]
        self.preempted = end["nonvoluntary"] - self._start["nonvoluntary"]
        self.busy = machine_busy_seconds() - self._busy
        self.load = load_average()
        return self

    def others(self, client_cpu: float) -> float:
        """Busy CPU seconds of everything else on the machine during the window."""
        return max(0.0, self.busy - self.nsqd_cpu - client_cpu)


# -- nsqd ------------------------------------------------------------------------------------


# `gc_mode`: run nsqd's console entry point with the cyclic GC changed, nsqd itself unchanged:
# "off", "gen0,gen1,gen2" thresholds, or "freeze:SECONDS" (gc.freeze() that long after start).
_GC_PRELUDE = """import gc, sys
import nsqpy.nsqd.__main__ as entry
mode = {mode!r}
original = entry._build
def build(options, log):
    daemon = original(options, log)
    if mode == "off":
        gc.disable()
    elif mode.startswith("freeze:"):
        # gc.freeze() that many seconds after the start: what exists then (the clients of a
        # benchmark that connected meanwhile) is never scanned again.
        import threading
        threading.Timer(float(mode.split(":", 1)[1]), gc.freeze).start()
    else:
        gc.set_threshold(*map(int, mode.split(",")))
    return daemon
entry._build = build
sys.exit(entry.main())
"""


# `python -m bench --reference PATH` runs a benchmark again with this nsqd binary (Go's), so
# that both daemons meet the same clients in one run.
REFERENCE_NSQD = "NSQPY_BENCH_REFERENCE_NSQD"
NSQD_ARGS = "NSQPY_BENCH_NSQD_ARGS"


def nsqd_command(gc_mode: str = "default") -> list[str]:
    reference = os.environ.get(REFERENCE_NSQD)
    if reference:
        return [reference]
    if gc_mode == "default":
        return [str(BIN / "nsqd")]
    return [sys.executable, "-c", _GC_PRELUDE.format(mode=gc_mode)]


class Nsqd:
    """Our nsqd as a subprocess: TCP and HTTP on port 0 of 127.0.0.1 (HTTPS too with
    `https`), a fresh temporary data dir, stderr kept for error reports."""

    def __init__(
        self,
        extra_args: Sequence[str] = (),
        *,
        gc_mode: str = "default",
        https: bool = False,
        data_path: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        # What the benchmark's own reads of /stats carry (an Authorization, under AUTH).
        self.headers = headers or {}
        # A given data path is the caller's: kept when nsqd stops (restart benchmarks).
        self.keep_data = data_path is not None
        self.data_path = data_path or tempfile.mkdtemp(prefix="nsqpy-bench-")
        self.started = time.monotonic()
        self.command = [
            *nsqd_command(gc_mode),
            "-tcp-address=127.0.0.1:0",
            "-http-address=127.0.0.1:0",
            *(["-https-address=127.0.0.1:0"] if https else []),
            f"-data-path={self.data_path}",
            *extra_args,
        ]
        if not os.environ.get(REFERENCE_NSQD):
            # Flags for our nsqd in every benchmark, e.g. NSQPY_BENCH_NSQD_ARGS=-workers=2.
            self.command += os.environ.get(NSQD_ARGS, "").split()
        self.lines: list[str] = []
        # nsqd's code from the same tree as the bench (the venv's editable install points at
        # the main checkout; this also serves a `git archive` snapshot); a reference nsqd (Go's,
        # or another tree's console script) runs as it is.
        environment = dict(os.environ)
        if not environment.get(REFERENCE_NSQD):
            environment["PYTHONPATH"] = os.pathsep.join(
                filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])
            )
        self.process = subprocess.Popen(
            self.command,
            cwd=self.data_path,
            env=environment,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        wanted = {"TCP", "HTTP", *(["HTTPS"] if https else [])}
        addresses: dict[str, str] = {}
        deadline = time.monotonic() + 30
        for line in self.process.stderr:
            self.lines.append(line.rstrip("\n"))
            match = _LISTENING.search(line)
            if match:
                addresses[match.group(1)] = match.group(2)
            if wanted <= addresses.keys() or time.monotonic() > deadline:
                break
        if not wanted <= addresses.keys():
            self.stop()
            raise RuntimeError("nsqd did not start:\n" + "\n".join(self.lines))
        self.tcp_port = int(addresses["TCP"].rsplit(":", 1)[1])
        self.http_port = int(addresses["HTTP"].rsplit(":", 1)[1])
        self.https_port = int(addresses["HTTPS"].rsplit(":", 1)[1]) if https else None
        threading.Thread(target=self._drain, daemon=True).start()

    def _drain(self) -> None:
        for line in self.process.stderr:
            self.lines.append(line.rstrip("\n"))

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def port(self) -> int:
        return self.tcp_port

    def cpu_seconds(self) -> float:
        return process_cpu_seconds(self.pid)

    def memory(self) -> dict[str, int]:
        return process_memory(self.pid)

    def stats(self, topic: str | None = None) -> dict:
        """`/stats?format=json` (of one topic when given)."""
        import urllib.parse
        import urllib.request

        query = "format=json" + (f"&topic={urllib.parse.quote(topic)}" if topic else "")
        url = f"http://127.0.0.1:{self.http_port}/stats?{query}"
        request = urllib.request.Request(url, headers=self.headers)
        with urllib.request.urlopen(request, timeout=30) as reply:
            return json.load(reply)

    def topic_depth(self, topic: str) -> tuple[int, int]:
        """(message_count, depth) of a topic, from /stats."""
        topics = self.stats(topic)["topics"]
        if not topics:
            return 0, 0
        return topics[0]["message_count"], topics[0]["depth"]

    def check_alive(self) -> None:
        if self.process.poll() is not None:
            raise RuntimeError(
                f"nsqd exited with {self.process.returncode}:\n" + "\n".join(self.lines[-30:])
            )

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()  # nothing to keep: skip the shutdown flush of queued messages
            self.process.wait()
        if not self.keep_data:
            shutil.rmtree(self.data_path, ignore_errors=True)

    def terminate(self, timeout: float = 120) -> int:
        """A clean stop (SIGTERM): nsqd writes what it holds and exits."""
        self.process.terminate()
        return self.process.wait(timeout)

    def __enter__(self) -> "Nsqd":
        return self

    def __exit__(self, *exc_info) -> None:
        self.stop()


# -- client processes ------------------------------------------------------------------------


@dataclass
class ClientRun:
    """The result tuple of each client of one run (in the order the jobs were given) and
    the CPU accounting of the window from their common start to the last result."""

    results: list[tuple]
    window: Window

    def column(self, index: int) -> list:
        return [result[index] for result in self.results]


class _Tagged:
    """A client's `results`: puts (its index, its result) on the shared queue."""

    def __init__(self, results, index: int) -> None:
        self.results = results
        self.index = index

    def put(self, result: tuple) -> None:
        self.results.put((self.index, result))


def _client_main(index: int, target, arguments: tuple, barrier, results) -> None:
    try:
        target(*arguments, barrier, _Tagged(results, index))
    except BaseException:
        barrier.abort()  # the others (and the runner) stop waiting at once
        raise


def run_clients(nsqd: Nsqd, context, jobs: list[tuple], timeout: float = 600) -> ClientRun:
    """One process per `(target, args)` job, running `target(*args, barrier, results)`: all
    connect, then a barrier releases them together (and starts the CPU window); each puts
    one result tuple. Raises if nsqd or a client dies."""
    parties = len(jobs)
    barrier = context.Barrier(parties + 1)
    results = context.Queue()
    processes = [
        context.Process(
            target=_client_main, args=(index, target, arguments, barrier, results), daemon=True
        )
        for index, (target, arguments) in enumerate(jobs)
    ]
    for process in processes:
        process.start()
    try:
        try:
            barrier.wait(timeout=60)
        except threading.BrokenBarrierError:
            for process in processes:
                process.join(timeout=5)
            codes = [process.exitcode for process in processes]
            raise RuntimeError(f"the clients did not start: exit codes {codes}") from None
        window = Window(nsqd)
        collected: dict[int, tuple] = {}
        deadline = time.monotonic() + timeout
        while len(collected) < parties:
            try:
                index, result = results.get(timeout=2)
                collected[index] = result
            except queue.Empty:
                nsqd.check_alive()
                codes = [process.exitcode for process in processes]
                if any(code not in (None, 0) for code in codes):
                    raise RuntimeError(f"a client process failed: exit codes {codes}") from None
                if time.monotonic() > deadline:
                    raise RuntimeError(f"clients still running after {timeout} s") from None
        window.close()
        for process in processes:
            process.join(timeout=30)
    finally:
        for process in processes:
            if process.is_alive():
                process.kill()
    return ClientRun([collected[index] for index in range(parties)], window)


# -- figures ---------------------------------------------------------------------------------


def spread(values: list[float], fmt: str = ",.0f") -> str:
    """`median (min–max)`."""
    return f"{statistics.median(values):{fmt}} ({min(values):{fmt}}–{max(values):{fmt}})"


def median_of(samples: list, key):
    """The sample whose key is the median (the upper middle one for an even count)."""
    ordered = sorted(samples, key=key)
    return ordered[len(ordered) // 2]


def load_range(loads: list[float]) -> str:
    """The 1-minute load averages of a figure's runs, `low–high`."""
    low, high = f"{min(loads):.1f}", f"{max(loads):.1f}"
    return low if low == high else f"{low}–{high}"


@dataclass(frozen=True)
class Target:
    text: str  # as the issue states it
    value: float
    higher_is_better: bool = True


# The performance issue's targets (Go nsqd on this machine: ~583k publish, ~352k consume,
# 46k HTTP req/s, 1M queued in 16 MiB RSS).
TARGETS = {
    "tcp_publish": Target("≥ 290,000 msgs/s", 290_000),
    "tcp_consume": Target("≥ 175,000 msgs/s", 175_000),
    "http_pub": Target("≥ 23,000 req/s", 23_000),
    "rss": Target("≤ 64 MiB", 64, higher_is_better=False),
    "latency_p50": Target("≤ 5 ms", 5, higher_is_better=False),
    "ping_p99": Target("≤ 50 ms", 50, higher_is_better=False),
}


def verdict(median: float, target: Target) -> str:
    """`met (1.52×)` or `missed by 23% (needs 1.30×)`."""
    if target.higher_is_better:
        if median >= target.value:
            return f"met ({median / target.value:.2f}× the target)"
        return f"MISSED by {1 - median / target.value:.0%} (needs {target.value / median:.2f}×)"
    if median <= target.value:
        return f"met ({median / target.value:.2f}× the limit)"
    return f"MISSED: {median / target.value:.2f}× the limit"


@dataclass
class Record:
    """One figure: a workload's values over its runs, for the runner's summary."""

    bench: str
    workload: str
    unit: str
    values: list[float]
    loads: list[float]
    target: str | None = None  # a key of TARGETS
    notes: dict = field(default_factory=dict)
    runs: int = 0  # when `values` holds more than one value per run (fan-out's per channel)

    @property
    def median(self) -> float:
        return statistics.median(self.values)


class Report:
    """The figures of one benchmark process, written as JSON to `--json` at the end."""

    def __init__(self, path: str | None) -> None:
        self.path = path
        self.records: list[Record] = []

    def add(self, record: Record) -> Record:
        self.records.append(record)
        return record

    def write(self) -> None:
        if self.path:
            with open(self.path, "w") as out:
                json.dump([asdict(record) for record in self.records], out, indent=1)


def record_against_reference(
    report: Report,
    bench: str,
    args: argparse.Namespace,
    run_once: Callable[[], dict],
    title: Callable[[str, str], str],
    fields: Sequence[tuple[str, str]],
    label: str = "",
) -> None:
    """`run_once()` on our nsqd and, with `args.reference` (`add_common_arguments(...,
    reference=True)`), on that one right after, `runs_of(args)` times; a Record for each
    server and each (key, unit) of `fields`, named `title(server label, key)`."""
    figures = _against_reference(args.reference, runs_of(args), run_once, label)
    for name, results in figures.items():
        load = [os.getloadavg()[0]] * len(results)
        for key, unit in fields:
            values = [float(result[key]) for result in results]
            report.add(Record(bench, title(server_label(name), key), unit, values, load))


def _against_reference(
    reference: str, runs: int, run_once: Callable[[], dict], label: str
) -> dict[str, list[dict]]:
    """`run_once()` `runs` times on our nsqd and, with `reference` (another nsqd's path: Go's,
    or another tree's console script), as often on that one, each right after ours in this
    invocation; every result printed as it comes. The results by server: "nsqpy" (with the
    flags of NSQPY_BENCH_NSQD_ARGS in its label, `server_label`) and "reference"."""
    servers = [("nsqpy", "")]
    if reference:
        servers.append(("reference", os.path.abspath(reference)))
    figures: dict[str, list[dict]] = {name: [] for name, _path in servers}
    try:
        for _run in range(runs):
            for name, path in servers:
                if path:
                    os.environ[REFERENCE_NSQD] = path
                else:
                    os.environ.pop(REFERENCE_NSQD, None)
                result = run_once()
                figures[name].append(result)
                shown = {
                    key: round(value, 2) if isinstance(value, float) else value
                    for key, value in result.items()
                }
                print(f"  {label}{name}: {json.dumps(shown)}", flush=True)
    finally:
        os.environ.pop(REFERENCE_NSQD, None)
    return figures


def server_label(name: str) -> str:
    """ "nsqpy" with the flags NSQPY_BENCH_NSQD_ARGS gives it; another server's name as it is."""
    extra = os.environ.get(NSQD_ARGS, "")
    return f"{name} {extra}" if extra and name == "nsqpy" else name


def http_post(port: int, path: str) -> None:
    """POST `path` to nsqd's HTTP port on 127.0.0.1; an error status raises."""
    import urllib.request

    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", method="POST")
    with urllib.request.urlopen(request, timeout=30) as reply:
        reply.read()


def add_rates(report: Report, bench: str, name: str, samples: list) -> None:
    """Record and print the published and consumed msgs/s of `samples` (each with
    `published`, `consumed`, `nsqd_cpu`, `wall` and `load`), noting nsqd's CPU/wall."""
    loads = [sample.load for sample in samples]
    cpu = statistics.median(sample.nsqd_cpu / sample.wall for sample in samples)
    for figure in ("published", "consumed"):
        values = [getattr(sample, figure) for sample in samples]
        notes = {"nsqd CPU/wall": f"{cpu:.2f}"}
        report.add(Record(bench, f"{name}: {figure}", "msgs/s", values, loads, notes=notes))
        print(f"  {figure}: {spread(values, ',.0f')} msgs/s, load {load_range(loads)}")


def read_records(path: str) -> list[Record]:
    with open(path) as data:
        return [Record(**item) for item in json.load(data)]


def add_common_arguments(
    parser: argparse.ArgumentParser, runs: int = 3, *, reference: bool = False
) -> None:
    """--runs, --quick and --json; with `reference`, --reference too (for
    `record_against_reference`)."""
    if reference:
        parser.add_argument("--reference", default="", help="another nsqd to run the same workload")
    parser.add_argument("--runs", type=int, default=runs, help="runs per figure (median)")
    parser.add_argument("--quick", action="store_true", help="one run per figure")
    parser.add_argument("--json", default=None, help="write the figures as JSON to this file")


def runs_of(args: argparse.Namespace) -> int:
    if args.runs < 1:
        raise SystemExit("--runs must be at least 1 (profiles: python -m bench.profile)")
    return 1 if args.quick else args.runs


# -- provenance ------------------------------------------------------------------------------


def git_revision() -> str:
    """The short commit of the tree the bench runs from: `+uncommitted` when tracked files
    differ from it (with the paths outside bench/ that do, since they change what is
    measured). `NSQPY_BENCH_REVISION` overrides it, for a `git archive` snapshot."""
    if os.environ.get("NSQPY_BENCH_REVISION"):
        return os.environ["NSQPY_BENCH_REVISION"]
    try:
        revision = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=ROOT,
            capture_output=True,
            text=True,
        ).stdout.splitlines()
    except OSError:
        return "unknown"
    if not revision:
        return "unknown"
    paths = [line[3:] for line in dirty if line[3:]]
    if not paths:
        return revision
    outside = [path for path in paths if not path.startswith("bench/")]
    if not outside:
        return f"{revision}+uncommitted (bench/ only)"
    return f"{revision}+uncommitted ({', '.join(outside)})"


def today() -> str:
    return f"{datetime.datetime.now(datetime.UTC):%Y-%m-%d}"


def machine() -> str:
    return f"{os.cpu_count()} cores, {platform.python_implementation()} {platform.python_version()}"


def banner(name: str, description: str) -> None:
    print(f"{name}: {description}")
    print(f"  {today()}, commit {git_revision()}, {machine()}, load average {load_average():.2f}")
    sys.stdout.flush()
