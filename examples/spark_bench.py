"""Rows per second through the nsq sink and both sources (classic and log topics) on a local
Spark.

    .venv/bin/python examples/spark_bench.py [--rows 500000] [--body-size 100]
        [--max-batch N] [--connections N] [--master spark://HOST:PORT]

Starts its own nsqlookupd and nsqd (this checkout's, on ephemeral ports, the nsqd registered
with the nsqlookupd) and a local[2] SparkSession, then times, each in its own function:

1. `write_classic`: a batch `df.write.format("nsq")` of `--rows` cached rows (2 partitions)
   into a classic topic, `/mpub?binary=true` to the nsqd;
2. `write_partitioned`: the same rows into a topic of 4 partitions created through nsqlookupd,
   through `lookupd` (the smart client's TCP MPUB to each partition's leader), round-robin and
   then by a `key` column;
3. `read_classic`: an availableNow `readStream.format("nsq")` query draining the classic topic
   into the `noop` sink, FINishing every message (`--max-batch`, `--connections`: the source's
   `maxBatch` and `connectionsPerNsqd`, its defaults when not given);
4. `read_log`: availableNow queries of the replayable source through nsqlookupd, each over a
   log topic's whole history into the `noop` sink: `--rows` rows in 2 partitions (written,
   untimed, before), and the 4-partition topic of step 2 (2 × `--rows`).

Times are wall clock and include Spark's job and micro-batch overheads. Before the clock starts,
a small write of 2 partitions forks both Python workers and imports nsqpy.spark in them, and a
small availableNow read loads Spark's streaming classes, so that the numbers are the
connector's and not Spark's one-time start-up; the read's time still includes the query's own
start (its source runner process, the planning of its first batch), which the micro-batch
rate leaves out.
"""

import argparse
import os
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pyspark.sql import DataFrame, SparkSession  # noqa: E402
from pyspark.sql import functions as F  # noqa: E402

from nsqpy.client.blocking import http_json  # noqa: E402
from nsqpy.spark import register  # noqa: E402
from tests.harness import DaemonProcess, create_partitioned_topic, start_nsqd  # noqa: E402

PARTITIONS = 4


@dataclass
class ReadResult:
    rows: int
    seconds: float
    batches: int
    batch_seconds: float
    largest_batch: int


def wait_for(predicate, what: str, timeout: float = 30.0):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}")
        time.sleep(0.05)


def write_classic(rows: DataFrame, nsqd_http: str, topic: str) -> float:
    started = time.perf_counter()
    (
        rows.select("body")
        .write.format("nsq")
        .option("nsqd_http", nsqd_http)
        .option("topic", topic)
        .mode("append")
        .save()
    )
    return time.perf_counter() - started


def write_partitioned(rows: DataFrame, lookupd_http: str, topic: str, keyed: bool) -> float:
    frame = rows if keyed else rows.select("body")
    started = time.perf_counter()
    (
        frame.write.format("nsq")
        .option("lookupd", lookupd_http)
        .option("topic", topic)
        .mode("append")
        .save()
    )
    return time.perf_counter() - started


def read_classic(
    spark: SparkSession,
    nsqd_tcp: str,
    nsqd_http: str,
    topic: str,
    checkpoint: Path,
    max_batch: int | None,
    connections: int | None,
) -> ReadResult:
    reader = (
        spark.readStream.format("nsq")
        .option("nsqd", nsqd_tcp)
        .option("nsqd_http", nsqd_http)
        .option("topic", topic)
        .option("channel", "bench")
        .option("idleTimeout", "5s")
    )
    if max_batch is not None:
        reader = reader.option("maxBatch", str(max_batch))
    if connections is not None:
        reader = reader.option("connectionsPerNsqd", str(connections))
    started = time.perf_counter()
    query = (
        reader.load()
        .writeStream.format("noop")
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    return _result(query, time.perf_counter() - started)


def read_log(spark: SparkSession, lookupd_http: str, topic: str, checkpoint: Path) -> ReadResult:
    """An availableNow query of the replayable source over a log topic's whole history into
    the `noop` sink: each micro-batch's ranges are fetched by the executors."""
    started = time.perf_counter()
    query = (
        spark.readStream.format("nsq")
        .option("lookupd", lookupd_http)
        .option("topic", topic)
        .option("channel", "spark_bench")
        .option("startingOffsets", "earliest")
        .load()
        .writeStream.format("noop")
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    return _result(query, time.perf_counter() - started)


def _result(query, seconds: float) -> ReadResult:
    progress = query.recentProgress
    return ReadResult(
        rows=sum(p["numInputRows"] for p in progress),
        seconds=seconds,
        batches=len(progress),
        # Micro-batch time only, without the query's start-up and availableNow's end.
        batch_seconds=sum(p["durationMs"].get("triggerExecution", 0) for p in progress) / 1e3,
        largest_batch=max((p["numInputRows"] for p in progress), default=0),
    )


def check_counts(nsqd_http: str, rows: int, read_rows: int) -> None:
    """Every write stored every row and the read took each once: the numbers count them all."""
    stats = http_json(nsqd_http, "/stats", format="json")
    stored: dict[str, int] = {}
    for topic in stats.get("topics") or []:
        stored[topic["topic_name"]] = stored.get(topic["topic_name"], 0) + topic["message_count"]
    expected = {"bench": rows, "bench_partitioned": 2 * rows, "bench_log2": rows}
    if any(stored.get(name) != count for name, count in expected.items()) or read_rows != rows:
        raise RuntimeError(f"stored {stored} and read {read_rows}; expected {expected}, {rows}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=500_000)
    parser.add_argument("--body-size", type=int, default=100)
    parser.add_argument("--max-batch", type=int, default=None)
    parser.add_argument("--connections", type=int, default=None)
    parser.add_argument(
        "--master", default="local[2]", help="Spark master, e.g. a standalone cluster's spark://"
    )
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
            data,
            "-mem-queue-size=10000000",
            f"-lookupd-tcp-address={lookupd.addresses['TCP']}",
            "-broadcast-address=127.0.0.1",
        )
        tcp, http = nsqd.addresses["TCP"], nsqd.addresses["HTTP"]
        lookupd_http = lookupd.addresses["HTTP"]
        spark = (
            SparkSession.builder.master(args.master)
            .config("spark.ui.enabled", "false")
            # Executors of a cluster on this machine reach the driver here.
            .config("spark.driver.host", "127.0.0.1")
            .config("spark.driver.bindAddress", "127.0.0.1")
            .config("spark.ui.showConsoleProgress", "false")
            .config("spark.sql.shuffle.partitions", "2")
            # Every micro-batch's progress, not the last 100: the read counts its rows there.
            .config("spark.sql.streaming.numRecentProgressUpdates", "1000000")
            .getOrCreate()
        )
        spark.sparkContext.setLogLevel("ERROR")
        register(spark)
        try:
            wait_for(lambda: http_json(lookupd_http, "/nodes")["producers"], "nsqd to register")
            create_partitioned_topic(lookupd_http, http, "bench_partitioned", PARTITIONS, "bench")
            create_partitioned_topic(lookupd_http, http, "bench_log2", 2, "bench")
            padding = "x" * max(0, args.body_size - 12)
            rows = spark.range(args.rows, numPartitions=2).select(
                F.format_string("k%d", F.col("id") % 1000).alias("key"),
                F.concat(F.format_string("%010d", "id"), F.lit(padding)).alias("body"),
            )
            rows.cache().count()
            # Warm-ups (see the module docstring).
            write_classic(rows.limit(1000).repartition(2), http, "warmup")
            read_classic(spark, tcp, http, "warmup", Path(scratch) / "warmup", None, None)
            write_partitioned(rows, lookupd_http, "bench_log2", False)  # untimed: to read

            classic_seconds = write_classic(rows, http, "bench")
            round_robin_seconds = write_partitioned(rows, lookupd_http, "bench_partitioned", False)
            keyed_seconds = write_partitioned(rows, lookupd_http, "bench_partitioned", True)
            read = read_classic(
                spark,
                tcp,
                http,
                "bench",
                Path(scratch) / "checkpoint",
                args.max_batch,
                args.connections,
            )
            check_counts(http, args.rows, read.rows)
            log_reads = {}
            for topic, partitions in (("bench_log2", 2), ("bench_partitioned", PARTITIONS)):
                checkpoint = Path(scratch) / f"checkpoint-{topic}"
                log_reads[partitions] = read_log(spark, lookupd_http, topic, checkpoint)
            for partitions, log_read in log_reads.items():
                expected = args.rows * (1 if partitions == 2 else 2)
                if log_read.rows != expected:
                    raise RuntimeError(f"the log read took {log_read.rows} rows of {expected}")
        finally:
            spark.stop()
            nsqd.stop()
            lookupd.stop()
    for name, seconds in (
        ("write classic (/mpub)", classic_seconds),
        ("write partitioned (MPUB, round-robin)", round_robin_seconds),
        ("write partitioned (MPUB, by key)", keyed_seconds),
    ):
        print(f"{name}: {args.rows} rows in {seconds:.2f}s = {args.rows / seconds:,.0f} rows/s")
    print(
        f"read classic: {read.rows} rows in {read.seconds:.2f}s = {read.rows / read.seconds:,.0f}"
        f" rows/s ({read.batches} micro-batches of up to {read.largest_batch} rows taking"
        f" {read.batch_seconds:.2f}s: {read.rows / read.batch_seconds:,.0f} rows/s)"
    )
    for partitions, log_read in log_reads.items():
        print(
            f"read log topic, {partitions} partitions: {log_read.rows} rows in"
            f" {log_read.seconds:.2f}s = {log_read.rows / log_read.seconds:,.0f} rows/s"
            f" ({log_read.batches} micro-batch(es) taking {log_read.batch_seconds:.2f}s:"
            f" {log_read.rows / log_read.batch_seconds:,.0f} rows/s)"
        )


if __name__ == "__main__":
    main()
