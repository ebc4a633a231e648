"""Latency of one etcd call, put and get: our trio client (nsqpy/etcd.py) against etcd3gw.

    .venv/bin/python -m bench.etcd_client [--count 2000] [--runs 3] [--quick] [--endpoint URL]

Settles the project brief's "a small trio client over etcd's v3 JSON gateway, or etcd3gw in
a worker thread: choose by measurement". Every run starts a fresh etcd (Debian's
etcd-server, `make etcd`) on 127.0.0.1 with a fresh data dir, the cluster tests' way
(tests/cluster/etcd_server.py), unless ``--endpoint`` names a running one. Each client then
does ``--count`` sequential puts of a 100-byte value over 100 keys, then as many gets of
them, one call at a time from one trio task, after 100 calls of warm-up:

* **trio client**: `EtcdClient`, keep-alive connection, on the trio loop;
* **etcd3gw in a thread**: etcd3gw 2.x (sync, requests) through `trio.to_thread.run_sync`,
  as trio code would have to call it;
* **etcd3gw direct**: the same calls without the thread, for what the hop costs.

etcd3gw is not a dependency: `.venv/bin/pip install etcd3gw` to include its rows. Figures:
µs per call (the run's total time / count), median (min–max) over runs, and the p50 and p99
of single calls in the median run. A put waits for etcd's WAL fsync, so it measures the
disk as much as the client; a get is a linearizable read (one raft read-index round) and
measures the client and the gateway.
"""

import argparse
import statistics
import time
import urllib.parse
from collections.abc import Awaitable, Callable

import trio

from bench._support import Record, Report, add_common_arguments, banner, load_average, runs_of
from nsqpy.etcd import EtcdClient

KEYS = 100
VALUE = b"v" * 100
WARMUP = 100

# (client label, operation) -> one list of per-call seconds per run
Timings = dict[tuple[str, str], list[list[float]]]


def key(index: int) -> str:
    return f"bench/{index % KEYS:03d}"


async def time_calls(call: Callable[[int], Awaitable[object]], count: int) -> list[float]:
    """Seconds of each of `count` sequential calls, after the warm-up."""
    for index in range(WARMUP):
        await call(index)
    timings = []
    clock = time.perf_counter
    for index in range(count):
        started = clock()
        await call(index)
        timings.append(clock() - started)
    return timings


async def measure_trio_client(url: str, count: int) -> dict[str, list[float]]:
    async with EtcdClient([url]) as client:

        async def put(index: int) -> None:
            await client.put(key(index), VALUE)

        async def get(index: int) -> None:
            await client.get(key(index))

        return {"put": await time_calls(put, count), "get": await time_calls(get, count)}


async def measure_etcd3gw(url: str, count: int, in_thread: bool) -> dict[str, list[float]]:
    import etcd3gw

    parts = urllib.parse.urlsplit(url)
    client = etcd3gw.client(host=parts.hostname, port=parts.port, timeout=5)

    async def call(function, *args):
        if in_thread:
            return await trio.to_thread.run_sync(function, *args)
        return function(*args)

    async def put(index: int) -> None:
        await call(client.put, key(index), VALUE)

    async def get(index: int) -> None:
        await call(client.get, key(index))

    return {"put": await time_calls(put, count), "get": await time_calls(get, count)}


Measure = Callable[[str, int], Awaitable[dict[str, list[float]]]]


def clients() -> list[tuple[str, Measure]]:
    found = [("trio client", measure_trio_client)]
    try:
        import etcd3gw  # noqa: F401
    except ImportError:
        print("  etcd3gw is not installed (.venv/bin/pip install etcd3gw): its rows are left out")
        return found
    found.append(("etcd3gw in a thread", lambda url, n: measure_etcd3gw(url, n, True)))
    found.append(("etcd3gw direct", lambda url, n: measure_etcd3gw(url, n, False)))
    return found


def run_once(
    args: argparse.Namespace, measures: list[tuple[str, Measure]], timings: Timings
) -> None:
    """One run: a fresh etcd (unless --endpoint), every client in turn."""
    server = None
    url = args.endpoint
    if url is None:
        # The cluster tests' helper: ports chosen in Python (etcd 3.4's gateway cannot use
        # port 0), a temporary data dir, SIGKILL and removal at the end.
        from tests.cluster.etcd_server import EtcdServer

        server = EtcdServer().start()
        url = server.client_url
    try:
        for label, measure in measures:
            per_operation = trio.run(measure, url, args.count)
            for operation, values in per_operation.items():
                timings.setdefault((label, operation), []).append(values)
    finally:
        if server is not None:
            server.close()


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=2000, help="calls per operation")
    parser.add_argument("--endpoint", default=None, help="a running etcd instead of a fresh one")
    add_common_arguments(parser)
    args = parser.parse_args(argv)
    runs = runs_of(args)

    banner(
        "etcd_client",
        f"{args.count:,} sequential puts then gets of {len(VALUE)}-byte values, {runs} run(s)",
    )
    measures = clients()
    report = Report(args.json)
    timings: Timings = {}
    loads = []
    for _ in range(runs):
        run_once(args, measures, timings)
        loads.append(load_average())
    for operation in ("put", "get"):
        for label, _ in measures:
            per_run = timings[(label, operation)]
            means = [sum(values) / len(values) * 1e6 for values in per_run]
            median_run = per_run[sorted(range(runs), key=lambda index: means[index])[runs // 2]]
            p50 = percentile(median_run, 0.50) * 1e6
            p99 = percentile(median_run, 0.99) * 1e6
            print(
                f"  {operation}  {label:<20} {statistics.median(means):7,.0f} µs/call "
                f"({min(means):,.0f}–{max(means):,.0f})   p50 {p50:,.0f}  p99 {p99:,.0f}",
                flush=True,
            )
            report.add(Record("etcd_client", f"etcd {operation}, {label}", "µs/call", means, loads))
    report.write()


if __name__ == "__main__":
    main()
