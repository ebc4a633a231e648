"""Write then read 1,000,000 records of 200 bytes through a DiskQueue, 3 runs.

    .venv/bin/python -m bench.diskqueue_bench [--runs 3] [--quick] [--sync thread|inline]

Options mirror nsqd's defaults (``--max-bytes-per-file`` 100 MiB, ``--sync-every`` 2500,
records bounded like nsqd's: 26 .. 1 MiB + 26). Syncs run the way nsqd runs them: whenever
``sync_due`` turns true the loop hands ``prepare_sync()``'s job to one worker thread and
carries on (``--sync inline`` blocks on each sync instead, go-diskqueue style). Timings
include waiting for the last sync job, and each run uses a fresh temporary directory.
"""

import argparse
import os
import tempfile
import time
from concurrent.futures import Future, ThreadPoolExecutor

from bench._support import (
    Record,
    Report,
    add_common_arguments,
    banner,
    load_average,
    runs_of,
    spread,
)
from nsqpy.diskqueue import DiskQueue

MIN_MSG_SIZE = 26  # nsqd: MsgIDLength + 8 + 2
MAX_MSG_SIZE = 1024 * 1024 + MIN_MSG_SIZE


class Syncer:
    """Runs sync jobs on one worker thread, like nsqd's trio.to_thread.run_sync."""

    def __init__(self, queue: DiskQueue, inline: bool) -> None:
        self.queue = queue
        self.inline = inline
        self.pool = ThreadPoolExecutor(max_workers=1)
        self.futures: list[Future[bool]] = []

    def maybe_sync(self) -> None:
        if self.queue.sync_due:
            if self.inline:
                self.queue.sync()
            else:
                self.futures.append(self.pool.submit(self.queue.prepare_sync()))

    def wait(self) -> None:
        for future in self.futures:
            future.result()
        self.futures.clear()

    def shutdown(self) -> None:
        self.wait()
        self.pool.shutdown()


def run_once(args: argparse.Namespace, batch: int | None) -> tuple[float, float]:
    """One write phase and one read phase; returns (writes/s, reads/s)."""
    record = os.urandom(args.size)
    count = args.count
    with tempfile.TemporaryDirectory(dir=args.dir) as data_path:
        queue = DiskQueue(
            "bench",
            data_path,
            args.max_bytes_per_file,
            MIN_MSG_SIZE,
            MAX_MSG_SIZE,
            args.sync_every,
        )
        syncer = Syncer(queue, inline=args.sync == "inline")
        maybe_sync = syncer.maybe_sync

        started = time.perf_counter()
        if batch is None:
            put = queue.put
            for _ in range(count):
                put(record)
                maybe_sync()
        else:
            records = [record] * batch
            put_many = queue.put_many
            for _ in range(count // batch):
                put_many(records)
                maybe_sync()
        syncer.wait()
        write_rate = count / (time.perf_counter() - started)

        received = 0
        started = time.perf_counter()
        if batch is None:
            get = queue.get
            while get() is not None:
                received += 1
                maybe_sync()
        else:
            get_many = queue.get_many
            while chunk := get_many(batch):
                received += len(chunk)
                maybe_sync()
        syncer.wait()
        read_rate = count / (time.perf_counter() - started)

        syncer.shutdown()
        queue.close()
        if received != count:
            raise SystemExit(f"read {received} records, wrote {count}")
    return write_rate, read_rate


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=1_000_000)
    parser.add_argument("--size", type=int, default=200)
    parser.add_argument("--batch", type=int, default=200)
    parser.add_argument("--sync-every", type=int, default=2500)
    parser.add_argument("--max-bytes-per-file", type=int, default=100 * 1024 * 1024)
    parser.add_argument("--sync", choices=["thread", "inline"], default="thread")
    parser.add_argument("--dir", default=None, help="parent of the temporary data dirs")
    add_common_arguments(parser)
    args = parser.parse_args(argv)
    runs = runs_of(args)

    banner(
        "diskqueue",
        f"{args.count:,} records of {args.size} bytes, sync_every={args.sync_every},"
        f" max_bytes_per_file={args.max_bytes_per_file}, sync={args.sync}, {runs} run(s)",
    )
    report = Report(args.json)
    modes: list[tuple[str, int | None]] = [("single", None), (f"batch {args.batch}", args.batch)]
    for label, batch in modes:
        results, loads = [], []
        for _ in range(runs):
            results.append(run_once(args, batch))
            loads.append(load_average())
        for index, kind in enumerate(("writes", "reads")):
            rates = [result[index] for result in results]
            print(f"  {label:<10} {kind:<6} {spread(rates)} /s", flush=True)
            name = f"DiskQueue alone, {label} {kind}"
            report.add(Record("diskqueue", name, f"{kind}/s", rates, loads))
    report.write()


if __name__ == "__main__":
    main()
