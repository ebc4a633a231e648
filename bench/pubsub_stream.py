"""nsq_pubsub streaming: messages/s from nsqd through nsq_pubsub to HTTP subscribers.

    .venv/bin/python -m bench.pubsub_stream [--count 200000] [--fanout-count 10000]
                                            [--size 100] [--runs 3] [--quick]

Every run starts a fresh nsqd (``--mem-queue-size`` 1,000,000: nothing goes to disk) and a
fresh nsq_pubsub (``--max-in-flight`` as given, 100 by default as Go's; heartbeats off) on it.
The subscribers, one client process with aiohttp's client, open their ``GET /sub`` streams
(chunked, one message a line) first; then a publisher process MPUBs straight to nsqd (batches of
200, 8 outstanding) while they read. Three workloads:

* 1 subscriber: ``--count`` messages;
* 100 subscribers on one channel: ``--count`` messages shared out between them;
* 100 subscribers without a channel (each its own ephemeral channel): every one receives
  ``--fanout-count`` messages, 100 times that streamed in all.

Figure: messages streamed / time from the publisher's start to the last line received (median
of the runs, min–max), with the CPU seconds of nsqd, nsq_pubsub and the clients over the run.
Bodies are printable (``x`` repeated) so that lines can be counted.
"""

import argparse
import asyncio
import multiprocessing
import re
import subprocess
import sys
import threading
import time
from dataclasses import dataclass

from bench._support import (
    BIN,
    Nsqd,
    Record,
    Report,
    add_common_arguments,
    banner,
    load_range,
    median_of,
    process_cpu_seconds,
    run_clients,
    runs_of,
    spread,
)

TOPIC = "bench_pubsub"
BATCH = 200
WINDOW = 8
_LISTENING = re.compile(r"HTTP: listening on (\S+)")


class PubSub:
    """nsq_pubsub as a subprocess on an ephemeral port, reading from `nsqd`."""

    def __init__(self, nsqd: Nsqd, max_in_flight: int) -> None:
        self.process = subprocess.Popen(
            [
                str(BIN / "nsq_pubsub"),
                "-http-address=127.0.0.1:0",
                f"-nsqd-tcp-address=127.0.0.1:{nsqd.tcp_port}",
                f"-max-in-flight={max_in_flight}",
                "-heartbeat-interval=0",
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.lines: list[str] = []
        for line in self.process.stderr:
            self.lines.append(line.rstrip("\n"))
            match = _LISTENING.search(line)
            if match:
                self.address = match.group(1)
                break
        else:
            raise RuntimeError("nsq_pubsub did not start:\n" + "\n".join(self.lines))
        threading.Thread(target=self._drain, daemon=True).start()

    def _drain(self) -> None:
        for line in self.process.stderr:
            self.lines.append(line.rstrip("\n"))

    def cpu_seconds(self) -> float:
        return process_cpu_seconds(self.process.pid)

    def stop(self) -> None:
        self.process.kill()
        self.process.wait()

    def __enter__(self) -> "PubSub":
        return self

    def __exit__(self, *exc_info) -> None:
        self.stop()


# -- clients (each in its own process) -------------------------------------------------------


def publisher(port, topic, batches, size, barrier, results) -> None:
    """MPUB `batches` batches of BATCH printable messages to nsqd (one line each when streamed),
    WINDOW outstanding. Puts (messages, start, end, cpu, 0)."""
    from bench._clients import publisher as mpub_publisher

    mpub_publisher(port, topic, batches, BATCH, size, WINDOW, barrier, results, printable=True)


def subscribers(address, topic, count, channel, each, total, barrier, results) -> None:
    """Open `count` `/sub` streams (on `channel`, or each its own when it is empty), wait on
    the barrier, then read lines until every stream has `each` (when given) or all of them
    together `total`. Puts (lines, start, last line, cpu, streams)."""
    results.put(asyncio.run(_read_streams(address, topic, count, channel, each, total, barrier)))


async def _read_streams(address, topic, count, channel, each, total, barrier) -> tuple:
    import aiohttp

    url = f"http://{address}/sub?topic={topic}" + (f"&channel={channel}" if channel else "")
    received = [0] * count
    done = asyncio.Event()
    last = 0.0

    async def read(index: int, response) -> None:
        nonlocal last
        async for chunk in response.content.iter_any():
            received[index] += chunk.count(b"\n")
            if each and received[index] >= each:
                last = max(last, time.monotonic())
                return
            if total and sum(received) >= total:
                last = time.monotonic()
                done.set()
                return

    connector = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=None)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        responses = await asyncio.gather(*(session.get(url) for _ in range(count)))
        barrier.wait()
        cpu = time.process_time()
        start = time.monotonic()
        readers = [asyncio.create_task(read(i, r)) for i, r in enumerate(responses)]
        if each:
            await asyncio.gather(*readers)
        else:
            await done.wait()
            for reader in readers:
                reader.cancel()
        for response in responses:
            response.close()
    return (sum(received), start, last, time.process_time() - cpu, count)


# -- one run ----------------------------------------------------------------------------------


@dataclass
class Sample:
    streamed: int  # lines received by all subscribers
    rate: float  # streamed / (last line - publish start)
    per_subscriber: float  # rate / subscribers (fan-out: each one's)
    wall: float
    nsqd_cpu: float
    pubsub_cpu: float
    client_cpu: float
    load: float


def stream(context, args, count: int, streams: int, channel: str, fan_out: bool) -> Sample:
    with (
        Nsqd([f"-mem-queue-size={args.mem_queue_size}"]) as nsqd,
        PubSub(nsqd, args.max_in_flight) as pubsub,
    ):
        batches = count // BATCH
        messages = batches * BATCH
        jobs = [
            (publisher, (nsqd.tcp_port, TOPIC, batches, args.size)),
            (
                subscribers,
                (
                    pubsub.address,
                    TOPIC,
                    streams,
                    channel,
                    messages if fan_out else 0,
                    0 if fan_out else messages,
                ),
            ),
        ]
        pubsub_cpu = pubsub.cpu_seconds()
        run = run_clients(nsqd, context, jobs)
        pubsub_cpu = pubsub.cpu_seconds() - pubsub_cpu
    published, (streamed, _start, last, _cpu, _streams) = run.results
    start = published[1]
    wall = last - start
    expected = messages * streams if fan_out else messages
    if streamed < expected:
        raise RuntimeError(f"the subscribers received {streamed:,} of {expected:,} messages")
    rate = streamed / wall
    return Sample(
        streamed=streamed,
        rate=rate,
        per_subscriber=rate / streams,
        wall=wall,
        nsqd_cpu=run.window.nsqd_cpu,
        pubsub_cpu=pubsub_cpu,
        client_cpu=sum(run.column(3)),
        load=run.window.load,
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=200_000, help="messages published")
    parser.add_argument(
        "--fanout-count", type=int, default=10_000, help="messages published (fan-out run)"
    )
    parser.add_argument("--subscribers", type=int, default=100)
    parser.add_argument("--size", type=int, default=100, help="message body bytes")
    parser.add_argument("--max-in-flight", type=int, default=100)
    parser.add_argument("--mem-queue-size", type=int, default=1_000_000)
    add_common_arguments(parser)
    args = parser.parse_args(argv)
    runs = runs_of(args)
    context = multiprocessing.get_context("spawn")
    started = time.monotonic()
    many = args.subscribers
    banner(
        "pubsub_stream",
        f"nsqd -> nsq_pubsub (--max-in-flight {args.max_in_flight}) -> GET /sub streams,"
        f" {args.size}-byte messages, {runs} run(s)",
    )
    workloads = [
        ("1 subscriber", args.count, 1, "bench", False),
        (f"{many} subscribers, one shared channel", args.count, many, "bench", False),
        (f"{many} subscribers, a channel each (fan-out)", args.fanout_count, many, "", True),
    ]
    report = Report(args.json)
    rows = []
    for label, count, streams, channel, fan_out in workloads:
        samples = []
        for _ in range(runs):
            sample = stream(context, args, count, streams, channel, fan_out)
            samples.append(sample)
            print(
                f"  {label}: {sample.streamed:,} lines in {sample.wall:.2f} s,"
                f" {sample.rate:,.0f} msgs/s",
                flush=True,
            )
        median = median_of(samples, lambda s: s.rate)
        loads = [s.load for s in samples]
        rows.append(
            f"| {label} | {count:,}{' each' if fan_out else ''} |"
            f" {spread([s.rate for s in samples])} |"
            f" {spread([s.per_subscriber for s in samples])} | {median.wall:.2f} |"
            f" {median.nsqd_cpu:.2f} | {median.pubsub_cpu:.2f} | {median.client_cpu:.2f} |"
            f" {load_range(loads)} |"
        )
        report.add(
            Record(
                "pubsub_stream",
                f"{label}: streamed",
                "msgs/s",
                [s.rate for s in samples],
                loads,
                notes={
                    "nsq_pubsub CPU s": round(median.pubsub_cpu, 2),
                    "nsqd CPU s": round(median.nsqd_cpu, 2),
                },
            )
        )
    print()
    print(
        "| workload | messages | streamed msgs/s, all subscribers | per subscriber |"
        " wall s | nsqd CPU s | nsq_pubsub CPU s | clients CPU s | load avg |"
    )
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for row in rows:
        print(row)
    report.write()
    print(f"\npubsub_stream: done in {time.monotonic() - started:.0f} s")


if __name__ == "__main__":
    main(sys.argv[1:])
