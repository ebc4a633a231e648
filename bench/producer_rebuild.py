"""How long a new leader takes to rebuild its idempotent producers, from the newest producer
snapshot and the records after it, against reading every record of the expiration period.

    .venv/bin/python -m bench.producer_rebuild [--megabytes 512] [--segment 64] [--runs 3] [--quick]

A partition log of `--megabytes` of sequenced publishes (MPUB_SEQ of 10 messages of 100 bytes,
from 2,000 producers in turn, as a Spark sink's tasks are), rolled every `--segment` MiB and
synced as nsqd does, so each roll leaves a snapshot. `PartitionLog.producer_state` (what
`nsqd/idempotence.py` calls on a write-epoch change) is timed with the snapshots and with them
removed, which is what a rebuild read before snapshots existed; both must find the same
producers. The log is in the system's temporary directory; the page cache holds it, so the
figures are CPU, not disk.
"""

import argparse
import shutil
import sys
import tempfile
import time

from bench._support import Record, Report, add_common_arguments, banner, runs_of, spread
from nsqpy.nsqd.message import Message
from nsqpy.partition_log import PartitionLog, ProducerMark
from nsqpy.partition_log.producer_snapshots import remove_snapshots

PRODUCERS = 2000
BATCH = 10
BODY = b"x" * 100


def build(directory: str, megabytes: int, segment_mib: int) -> PartitionLog:
    log = PartitionLog(
        directory,
        "rebuild",
        0,
        message_type=Message,
        max_bytes_per_file=segment_mib << 20,
        sync_every=1 << 30,
    )
    log.producer_expiration = lambda: 3600.0
    sequences = [0] * PRODUCERS
    turn = 0
    while log.written.offset < megabytes << 20:
        for _ in range(100):
            producer = turn % PRODUCERS
            turn += 1
            now = time.time_ns()
            messages = [Message(mid, BODY, now) for mid in log.next_ids(BATCH)]
            sequences[producer] += BATCH
            mark = ProducerMark(b"spark-query-%d" % producer, sequences[producer] - 1)
            log.append(messages, mark)
        segments = len(log.segments)
        log.commit()
        if len(log.segments) > segments:
            assert log.prepare_sync()()
            snapshot = log.prepare_producer_snapshot()
            assert snapshot is not None
            snapshot()
    return log


def timed_state(log: PartitionLog, since_ns: int) -> tuple[float, dict]:
    start = time.perf_counter()
    state = log.producer_state(since_ns)
    return time.perf_counter() - start, state


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--megabytes", type=int, default=512, help="size of the log")
    parser.add_argument("--segment", type=int, default=64, help="MiB per segment")
    add_common_arguments(parser)
    args = parser.parse_args(argv)
    runs = runs_of(args)
    megabytes = args.megabytes // 4 if args.quick else args.megabytes
    segment = max(1, args.segment // 4) if args.quick else args.segment
    report = Report(args.json)
    banner("producer_rebuild", f"a {megabytes} MiB log, {segment} MiB segments, {runs} run(s)")
    directory = tempfile.mkdtemp(prefix="nsqpy-producer-rebuild-")
    try:
        log = build(directory, megabytes, segment)
        since_ns = time.time_ns() - 3600 * 10**9
        print(
            f"  {log.written.count:,} messages in {len(log.segments)} segments,"
            f" snapshots at {log.files.producer_snapshot_offsets()}"
        )
        with_snapshot, without = [], []
        for _ in range(runs):
            seconds, fast = timed_state(log, since_ns)
            with_snapshot.append(seconds)
        remove_snapshots(log.files, log.files.producer_snapshot_offsets())
        for _ in range(runs):
            seconds, slow = timed_state(log, since_ns)
            without.append(seconds)
        assert fast == slow and len(fast) == PRODUCERS, "the two rebuilds disagree"
        log.close()
    finally:
        shutil.rmtree(directory)
    for label, values in (("from the newest snapshot", with_snapshot), ("every record", without)):
        print(f"  rebuild {label}: {spread(values, '.3f')} s")
        report.add(Record("producer_rebuild", f"rebuild, {label}", "s", values, []))
    ratio = sorted(without)[len(without) // 2] / sorted(with_snapshot)[len(with_snapshot) // 2]
    print(f"  every record ÷ from the snapshot, medians: {ratio:.1f}×")
    report.write()


if __name__ == "__main__":
    sys.exit(main())
