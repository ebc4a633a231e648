"""Word counts per minute from an NSQ topic, to another NSQ topic and to Parquet.

    python examples/spark_wordcount.py --nsqd 127.0.0.1:4150 --nsqd-http 127.0.0.1:4151 \\
        --topic lines --out-topic word_counts --parquet /tmp/word_counts \\
        --checkpoint /tmp/word_counts.checkpoint

Every message body is a line of text. The source is at-least-once, so the stream is first
deduplicated on the NSQ message `id` (stable across redeliveries) within the watermark; the
per-minute counts are emitted once the watermark has passed the minute (append mode) and
written by `foreachBatch` to both sinks. A redelivered *output* batch (a crash between the two
writes) can still publish a count twice: consumers of `word_counts` should key on
(window_start, word).
"""

import argparse
import os
import sys
from functools import partial

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from nsqpy.spark import register


def write_both(batch, batch_id: int, args: argparse.Namespace) -> None:
    """One micro-batch of finished windows, to Parquet and as JSON messages to NSQ."""
    batch.persist()
    batch.write.mode("append").parquet(args.parquet)
    (
        batch.select(F.to_json(F.struct("window_start", "word", "count")).alias("body"))
        .write.format("nsq")
        .option("nsqd_http", args.nsqd_http)
        .option("topic", args.out_topic)
        .mode("append")
        .save()
    )
    batch.unpersist()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nsqd", default="127.0.0.1:4150", help="nsqd TCP address")
    parser.add_argument("--nsqd-http", default="127.0.0.1:4151", help="nsqd HTTP address")
    parser.add_argument("--topic", default="lines")
    parser.add_argument("--channel", default="wordcount")
    parser.add_argument("--out-topic", default="word_counts")
    parser.add_argument("--parquet", default="/tmp/word_counts")
    parser.add_argument("--checkpoint", default="/tmp/word_counts.checkpoint")
    parser.add_argument("--watermark", default="1 minute", help="how late a message may be")
    parser.add_argument(
        "--available-now", action="store_true", help="process what is queued, then stop"
    )
    args = parser.parse_args()

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    spark = (
        SparkSession.builder.appName("nsq-wordcount")
        .config("spark.sql.shuffle.partitions", "2")
        .getOrCreate()
    )
    register(spark)

    messages = (
        spark.readStream.format("nsq")
        .option("nsqd", args.nsqd)
        .option("nsqd_http", args.nsqd_http)
        .option("topic", args.topic)
        .option("channel", args.channel)
        .load()
        .withWatermark("timestamp", args.watermark)
        .dropDuplicatesWithinWatermark(["id"])
    )
    counts = (
        messages.select(
            "timestamp",
            F.explode(F.split(F.lower(F.col("body").cast("string")), r"\W+")).alias("word"),
        )
        .where(F.col("word") != "")
        .groupBy(F.window("timestamp", "1 minute"), "word")
        .count()
        .select(
            F.col("window.start").alias("window_start"),
            F.col("window.end").alias("window_end"),
            "word",
            "count",
        )
    )

    writer = (
        counts.writeStream.outputMode("append")
        .foreachBatch(partial(write_both, args=args))
        .option("checkpointLocation", args.checkpoint)
    )
    if args.available_now:
        writer = writer.trigger(availableNow=True)
    writer.start().awaitTermination()


if __name__ == "__main__":
    main()
