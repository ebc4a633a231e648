"""Rows per second through the nsq sink and source on a local Spark.

    .venv/bin/python examples/spark_bench.py [--rows 50000] [--max-batch 1250]

Starts its own nsqd (this checkout's, on ephemeral ports) and a local[2] SparkSession, then
times (1) a batch `df.write.format("nsq")` of `--rows` rows into a topic and (2) an
availableNow `readStream.format("nsq")` query draining that topic into the `noop` sink. Both
times are wall clock and include Spark's job and micro-batch overheads; the read includes the
FIN of every message.
"""

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pyspark.sql import SparkSession  # noqa: E402
from pyspark.sql import functions as F  # noqa: E402

from nsq_spark import register  # noqa: E402
from tests.harness import start_nsqd  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=50_000)
    parser.add_argument("--max-batch", type=int, default=1250)
    parser.add_argument("--body-size", type=int, default=100)
    args = parser.parse_args()

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    with tempfile.TemporaryDirectory() as scratch:
        data = Path(scratch) / "nsqd"
        data.mkdir()
        nsqd = start_nsqd(data, "-mem-queue-size=1000000")
        tcp, http = nsqd.addresses["TCP"], nsqd.addresses["HTTP"]
        spark = (
            SparkSession.builder.master("local[2]")
            .config("spark.ui.enabled", "false")
            .config("spark.ui.showConsoleProgress", "false")
            .config("spark.sql.shuffle.partitions", "2")
            .getOrCreate()
        )
        spark.sparkContext.setLogLevel("ERROR")
        register(spark)
        try:
            padding = "x" * max(0, args.body_size - 12)
            rows = spark.range(args.rows, numPartitions=2).select(
                F.concat(F.format_string("%010d", "id"), F.lit(padding)).alias("body")
            )
            rows.cache().count()
            # Warm up: Python workers forked and nsq_spark imported before the clock starts.
            rows.limit(10).write.format("nsq").option("nsqd_http", http).option(
                "topic", "warmup"
            ).mode("append").save()
            started = time.perf_counter()
            (
                rows.write.format("nsq")
                .option("nsqd_http", http)
                .option("topic", "bench")
                .mode("append")
                .save()
            )
            write_seconds = time.perf_counter() - started

            started = time.perf_counter()
            query = (
                spark.readStream.format("nsq")
                .option("nsqd", tcp)
                .option("nsqd_http", http)
                .option("topic", "bench")
                .option("channel", "bench")
                .option("maxBatch", str(args.max_batch))
                .option("idleTimeout", "5s")
                .load()
                .writeStream.format("noop")
                .option("checkpointLocation", str(Path(scratch) / "checkpoint"))
                .trigger(availableNow=True)
                .start()
            )
            query.awaitTermination()
            read_seconds = time.perf_counter() - started
            progress = query.recentProgress
            read_rows = sum(p["numInputRows"] for p in progress)
            # Micro-batch time only, without the query's start-up and availableNow's end.
            batch_seconds = sum(p["durationMs"].get("triggerExecution", 0) for p in progress) / 1e3
        finally:
            spark.stop()
            nsqd.stop()
    print(
        f"write: {args.rows} rows in {write_seconds:.2f}s = {args.rows / write_seconds:,.0f} rows/s"
    )
    print(
        f"read: {read_rows} rows in {read_seconds:.2f}s = {read_rows / read_seconds:,.0f} rows/s"
        f" ({len(progress)} micro-batches taking {batch_seconds:.2f}s:"
        f" {read_rows / batch_seconds:,.0f} rows/s)"
    )


if __name__ == "__main__":
    main()
