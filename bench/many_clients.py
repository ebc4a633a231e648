"""Many connections: does nsqd stay responsive with 10,000 consumers? `/ping` latency.

``--consumers`` consumers (10,000 by default) subscribe to one channel with 1 s heartbeats and
RDY 1, answering each heartbeat with NOP and each message with FIN; a publisher sends
``--rate`` messages a second (100). Once every consumer is subscribed, `/ping` is asked
``--pings`` times a second for ``--duration`` seconds on a keep-alive connection of its own:
its p50, p99 and max are the figures (the "every core" issue asks p99 ≤ 50 ms), with nsqd's
GC pauses over the same window from `/stats`, and its memory per connection: the growth of its
resident memory (VmRSS) from before the consumers connect to the end of the window, over the
consumers subscribed.

The consumers are asyncio connections in ``--client-processes`` processes (a few % of a core
per 1,000 consumers); the benchmark raises its open-file limit, which nsqd inherits, to what
they need, as far as the hard limit allows.
"""

import argparse
import asyncio
import http.client
import multiprocessing
import resource
import statistics
import sys
import time

from bench._support import (
    Nsqd,
    Record,
    Report,
    add_common_arguments,
    banner,
    load_average,
    runs_of,
)
from nsqpy.common.command import (
    MAGIC_V2,
    NOP,
    encode_fin,
    encode_identify,
    encode_pub,
    encode_rdy,
    encode_sub,
)
from nsqpy.common.frame import FRAME_TYPE_MESSAGE, FrameDecoder
from nsqpy.common.message import decode_message

TOPIC = "many"
CHANNEL = "c"


async def _consumer(port: int, subscribed: asyncio.Event, counts: list[int]) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(
        MAGIC_V2
        + encode_identify({"heartbeat_interval": 1000, "feature_negotiation": False})
        + encode_sub(TOPIC, CHANNEL)
        + encode_rdy(1)
    )
    decoder = FrameDecoder()
    answered = 0
    while True:
        data = await reader.read(65536)
        if not data:
            return
        out = []
        for frame in decoder.receive_data(data):
            if frame.frame_type == FRAME_TYPE_MESSAGE:
                out.append(encode_fin(decode_message(frame.data).id))
            elif frame.data == b"_heartbeat_":
                out.append(NOP)
            else:
                answered += 1
                if answered == 2:  # IDENTIFY's and SUB's OK
                    counts[0] += 1
                    if counts[0] == counts[1]:
                        subscribed.set()
        if out:
            writer.write(b"".join(out))


def _client_process(port: int, consumers: int, ready, stop) -> None:
    async def run() -> None:
        subscribed = asyncio.Event()
        counts = [0, consumers]
        tasks = []
        for index in range(consumers):
            tasks.append(asyncio.create_task(_consumer(port, subscribed, counts)))
            if index % 200 == 199:
                await asyncio.sleep(0.05)  # nsqd's listen backlog
        await subscribed.wait()
        ready.set()
        while not stop.is_set():
            await asyncio.sleep(0.2)
        for task in tasks:
            task.cancel()

    asyncio.run(run())


def _publisher(port: int, rate: int, stop) -> None:
    import socket

    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.sendall(MAGIC_V2)
        interval = 1 / rate
        next_at = time.monotonic()
        while not stop.is_set():
            sock.sendall(encode_pub(TOPIC, b"x" * 100))
            sock.recv(65536)
            next_at += interval
            time.sleep(max(0.0, next_at - time.monotonic()))


def measure(args, context) -> dict:
    with Nsqd(gc_mode=args.nsqd_gc) as nsqd:
        rss_idle = nsqd.memory()["VmRSS"]
        stop = context.Event()
        readies = []
        processes = []
        share = args.consumers // args.client_processes
        for index in range(args.client_processes):
            ready = context.Event()
            count = share + (args.consumers % args.client_processes if index == 0 else 0)
            process = context.Process(
                target=_client_process, args=(nsqd.tcp_port, count, ready, stop), daemon=True
            )
            process.start()
            readies.append(ready)
            processes.append(process)
        started = time.monotonic()
        for ready in readies:
            if not ready.wait(max(1.0, 120 - (time.monotonic() - started))):
                raise RuntimeError("the consumers did not all subscribe within 120 s")
        subscribe_seconds = time.monotonic() - started
        publisher = context.Process(
            target=_publisher, args=(nsqd.tcp_port, args.rate, stop), daemon=True
        )
        publisher.start()
        time.sleep(2)  # heartbeats and publishes under way
        connection = http.client.HTTPConnection("127.0.0.1", nsqd.http_port, timeout=10)
        latencies = []
        interval = 1 / args.pings
        next_at = time.monotonic()
        end = next_at + args.duration
        cpu_before = nsqd.cpu_seconds()
        while time.monotonic() < end:
            began = time.perf_counter()
            connection.request("GET", "/ping")
            response = connection.getresponse()
            response.read()
            latencies.append((time.perf_counter() - began) * 1000)
            next_at += interval
            time.sleep(max(0.0, next_at - time.monotonic()))
        cpu = nsqd.cpu_seconds() - cpu_before
        rss_busy = nsqd.memory()["VmRSS"]
        nsqd.check_alive()
        stats = nsqd.stats(TOPIC)
        channel = stats["topics"][0]["channels"][0]
        stop.set()
        for process in [*processes, publisher]:
            process.join(5)
            if process.is_alive():
                process.kill()
    latencies.sort()
    return {
        "p50": statistics.median(latencies),
        "p99": latencies[int(len(latencies) * 0.99) - 1],
        "max": latencies[-1],
        "clients": channel["client_count"],
        "subscribe_s": subscribe_seconds,
        "nsqd_cpu": cpu / args.duration,
        "gc_pause_max_ms": stats.get("memory", {}).get("gc_pause_usec_100", 0) / 1000,
        "kib_per_connection": (rss_busy - rss_idle) / 1024 / max(1, channel["client_count"]),
    }


def _raise_open_files(needed: int) -> None:
    """Every consumer is a file descriptor here and in nsqd (which inherits the limit): the
    soft limit goes up to what is needed, as far as the hard limit lets it."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = needed if hard == resource.RLIM_INFINITY else min(needed, hard)
    if soft != resource.RLIM_INFINITY and soft < wanted:
        resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
    if wanted < needed:
        raise SystemExit(f"{needed:,} open files are needed; the hard limit is {hard:,}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--consumers", type=int, default=10_000)
    parser.add_argument("--client-processes", type=int, default=2)
    parser.add_argument("--rate", type=int, default=100, help="publishes a second")
    parser.add_argument("--pings", type=int, default=20, help="/ping requests a second")
    parser.add_argument("--duration", type=float, default=20.0, help="seconds of pings")
    parser.add_argument(
        "--nsqd-gc",
        default="default",
        help="nsqd's cyclic GC: default, off, or gen0,gen1,gen2 thresholds",
    )
    add_common_arguments(parser, runs=3)
    args = parser.parse_args(argv)
    _raise_open_files(args.consumers + 1000)
    runs = runs_of(args)
    context = multiprocessing.get_context("spawn")
    banner(
        "many_clients",
        f"{args.consumers:,} consumers (1 s heartbeats, RDY 1), {args.rate} publishes/s,"
        f" /ping {args.pings}/s for {args.duration:g} s, {runs} run(s)",
    )
    report = Report(args.json)
    samples = []
    loads = []
    for _ in range(runs):
        sample = measure(args, context)
        samples.append(sample)
        loads.append(load_average())
        print(
            f"  /ping p50 {sample['p50']:.2f} ms, p99 {sample['p99']:.2f} ms, max"
            f" {sample['max']:.1f} ms; {sample['clients']:,} clients subscribed in"
            f" {sample['subscribe_s']:.1f} s; nsqd CPU/wall {sample['nsqd_cpu']:.2f};"
            f" longest GC pause {sample['gc_pause_max_ms']:.1f} ms;"
            f" {sample['kib_per_connection']:.1f} KiB a connection",
            flush=True,
        )
    workload = f"{args.consumers:,} consumers, 1 s heartbeats, {args.rate} publishes/s"
    for figure in ("p50", "p99", "max"):
        report.add(
            Record(
                "many_clients",
                f"/ping {figure}, {workload}",
                "ms",
                [sample[figure] for sample in samples],
                loads,
                target="ping_p99" if figure == "p99" else None,
            )
        )
    report.add(
        Record(
            "many_clients",
            f"nsqd memory per connection (VmRSS growth / consumers), {workload}",
            "KiB",
            [sample["kib_per_connection"] for sample in samples],
            loads,
        )
    )
    report.write()


if __name__ == "__main__":
    main(sys.argv[1:])
