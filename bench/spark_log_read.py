"""Rows per second of the Spark source over a log topic: an availableNow query of a 2-partition
topic's whole history (`--rows` messages of `--body-size` bytes, written before, untimed) into
the `noop` sink on local[2], through nsqlookupd, as issue 41's throughput item measures it.

    .venv/bin/python -m bench.spark_log_read [--rows 200000] [--body-size 100] [--runs 1]
        [--ext] [--headers]

Prints one line per run: rows, micro-batches, rows/s over the micro-batches (Spark's
`triggerExecution` times, without the query's start) and over the wall clock. A warm-up query
runs first (Spark's streaming classes, the Python workers). `--ext` makes the topics ext topics
whose every message carries a JSON header (a tag and a trace ID), published with MPUB_EXT;
`--headers` selects the `headers` column. The checkout it runs from is the
one measured: copied into an older checkout, it measures that one (A/B).
"""

import argparse
import os
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pyspark.sql import SparkSession  # noqa: E402

from nsqpy.spark import register  # noqa: E402
from tests.harness import DaemonProcess, create_partitioned_topic, start_nsqd  # noqa: E402

PARTITIONS = 2
PUBLISH_BATCH = 5000


def publish(http: str, topic: str, partition: int, bodies: list[bytes]) -> None:
    payload = b"".join(len(body).to_bytes(4, "big") + body for body in bodies)
    url = f"http://{http}/mpub?topic={topic}&partition={partition}&binary=true"
    request = urllib.request.Request(
        url, data=len(bodies).to_bytes(4, "big") + payload, method="POST"
    )
    with urllib.request.urlopen(request, timeout=60) as response:
        response.read()


def fill(http: str, topic: str, rows: int, body_size: int, lookupd_http: str, ext: bool) -> None:
    padding = b"x" * max(0, body_size - 10)
    producer = None
    if ext:
        from nsqpy.client.smart import SmartProducer

        producer = SmartProducer([lookupd_http])
    for first in range(0, rows, PUBLISH_BATCH):
        numbers = range(first, min(rows, first + PUBLISH_BATCH))
        bodies = [b"%010d" % n + padding for n in numbers]
        partition = first // PUBLISH_BATCH % PARTITIONS
        if producer is None:
            publish(http, topic, partition, bodies)
        else:
            headers = [{"##client_dispatch_tag": "blue", "##trace_id": str(n)} for n in numbers]
            producer.multi_publish(topic, bodies, partition=partition, ext_headers=headers)
    if producer is not None:
        producer.close()


def read(spark: SparkSession, lookupd_http: str, topic: str, checkpoint: Path, headers: bool):
    reader = (
        spark.readStream.format("nsq")
        .option("lookupd", lookupd_http)
        .option("topic", topic)
        .option("channel", "spark_bench")
        .option("startingOffsets", "earliest")
    )
    if headers:
        reader = reader.option("includeHeaders", "true")
    started = time.perf_counter()
    query = (
        reader.load()
        .writeStream.format("noop")
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    wall = time.perf_counter() - started
    progress = query.recentProgress
    rows = sum(p["numInputRows"] for p in progress)
    batch_seconds = sum(p["durationMs"].get("triggerExecution", 0) for p in progress) / 1e3
    return rows, len(progress), batch_seconds, wall


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--body-size", type=int, default=100)
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--ext", action="store_true", help="ext topics, a header per message")
    parser.add_argument("--headers", action="store_true", help="select the headers column")
    args = parser.parse_args()
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    with tempfile.TemporaryDirectory() as scratch:
        lookupd = DaemonProcess(
            "nsqlookupd",
            [
                "-tcp-address=127.0.0.1:0",
                "-http-address=127.0.0.1:0",
                "-broadcast-address=127.0.0.1",
            ],
        ).start(wait_for=("TCP", "HTTP"))
        data = Path(scratch) / "nsqd"
        data.mkdir()
        nsqd = start_nsqd(
            data, f"-lookupd-tcp-address={lookupd.addresses['TCP']}", "-broadcast-address=127.0.0.1"
        )
        http, lookupd_http = nsqd.addresses["HTTP"], lookupd.addresses["HTTP"]
        spark = (
            SparkSession.builder.master("local[2]")
            .config("spark.ui.enabled", "false")
            .config("spark.ui.showConsoleProgress", "false")
            .config("spark.sql.streaming.numRecentProgressUpdates", "1000000")
            .getOrCreate()
        )
        spark.sparkContext.setLogLevel("ERROR")
        register(spark)
        try:
            deadline = time.monotonic() + 30
            while (
                b'"producers":[]' in urllib.request.urlopen(f"http://{lookupd_http}/nodes").read()
            ):
                if time.monotonic() > deadline:
                    raise RuntimeError("nsqd did not register with nsqlookupd")
                time.sleep(0.05)
            flags = {"extend": "true"} if args.ext else {}
            create_partitioned_topic(lookupd_http, http, "warmup", PARTITIONS, "bench", **flags)
            create_partitioned_topic(lookupd_http, http, "bench", PARTITIONS, "bench", **flags)
            fill(http, "warmup", 2000, args.body_size, lookupd_http, args.ext)
            fill(http, "bench", args.rows, args.body_size, lookupd_http, args.ext)
            read(spark, lookupd_http, "warmup", Path(scratch) / "warmup", args.headers)
            for run in range(args.runs):
                checkpoint = Path(scratch) / f"checkpoint-{run}"
                rows, batches, batch_seconds, wall = read(
                    spark, lookupd_http, "bench", checkpoint, args.headers
                )
                if rows != args.rows:
                    raise RuntimeError(f"the read took {rows} rows of {args.rows}")
                print(
                    f"rows {rows} batches {batches} micro-batch {rows / batch_seconds:,.0f} rows/s"
                    f" wall {rows / wall:,.0f} rows/s",
                    flush=True,
                )
        finally:
            spark.stop()
            nsqd.stop()
            lookupd.stop()


if __name__ == "__main__":
    main()
