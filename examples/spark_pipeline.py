"""Order events on a log topic, summed per minute and kind by Spark into Parquet, exactly once.

    make run                                   # in another terminal: nsqd on 127.0.0.1:4151
    .venv/bin/python -m examples.spark_pipeline --nsqd-http 127.0.0.1:4151 \\
        --output /tmp/order_totals --checkpoint /tmp/order_totals.checkpoint

The job publishes `--events` JSON order events (`{"order", "kind", "amount", "at"}`, the event
times spread over ten minutes) to a partitioned topic, a log topic, with the `nsq` sink. Then a
streaming query reads the topic with the replayable `nsq` source, parses the events, keeps a
watermark on their event time, and sums each minute's orders per kind into Parquet (append
mode: a minute is written once the watermark has passed it). The query runs with
`trigger(availableNow=True)`: it takes in what the topic holds and ends, and run again it goes
on from its checkpoint. Spark's checkpoint and the file sink make the totals exactly-once: a
query killed at any point and started again neither loses nor counts an order twice.

At the end the job reads the Parquet output back and checks it against the events it
published: every finished minute, with the same count and sum.
"""

import argparse
import datetime
import json
import random
import sys
from collections import defaultdict

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from nsqpy.client.blocking import http_request
from nsqpy.spark import register

EVENT_SCHEMA = "order string, kind string, amount long, at timestamp"
KINDS = ("book", "music", "garden")
WINDOW_SECONDS = 60
WATERMARK_SECONDS = 30
START = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)


def make_events(count: int, seed: int) -> list[dict]:
    """Orders whose event times spread over ten minutes, a little out of order."""
    chance = random.Random(seed)
    events = []
    for number in range(count):
        at = START + datetime.timedelta(seconds=number * 600 / count + chance.uniform(-5, 5))
        events.append(
            {
                "order": f"o{seed}-{number}",
                "kind": chance.choice(KINDS),
                "amount": chance.randint(1, 500),
                "at": max(at, START).isoformat(),
            }
        )
    return events


def expected_totals(events: list[dict]) -> dict[tuple[str, str], tuple[int, int]]:
    """(window start, kind) -> (orders, amount) for every minute the watermark has closed."""
    times = [datetime.datetime.fromisoformat(event["at"]) for event in events]
    watermark = max(times) - datetime.timedelta(seconds=WATERMARK_SECONDS)
    totals: dict[tuple[str, str], list[int]] = defaultdict(lambda: [0, 0])
    for event, at in zip(events, times, strict=True):
        offset = int((at - START).total_seconds()) // WINDOW_SECONDS * WINDOW_SECONDS
        window_start = START + datetime.timedelta(seconds=offset)
        if window_start + datetime.timedelta(seconds=WINDOW_SECONDS) <= watermark:
            total = totals[(window_start.strftime("%Y-%m-%d %H:%M:%S"), event["kind"])]
            total[0] += 1
            total[1] += event["amount"]
    return {key: (orders, amount) for key, (orders, amount) in totals.items()}


def publish(spark: SparkSession, args: argparse.Namespace, events: list[dict]) -> None:
    http_request(
        args.nsqd_http,
        "/topic/create",
        method="POST",
        topic=args.topic,
        partition_num=str(args.partitions),
    )
    # Spread the events over the partitions by order, in the `key` column; one task, so that
    # each partition gets its events in time order (two tasks would publish their halves in
    # whatever order they run, and the watermark would pass minutes still to come).
    rows = [(json.dumps(event), event["order"]) for event in events]
    (
        spark.createDataFrame(rows, "body string, key string")
        .coalesce(1)
        .write.format("nsq")
        .option("nsqd_http", args.nsqd_http)
        .option("topic", args.topic)
        .mode("append")
        .save()
    )


def run_pipeline(spark: SparkSession, args: argparse.Namespace) -> None:
    events = (
        spark.readStream.format("nsq")
        .option("nsqd_http", args.nsqd_http)
        .option("topic", args.topic)
        .option("channel", "order_totals")  # the query's cursor: nsqadmin shows its lag
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", str(args.max_per_batch))
        .load()
        .select(F.from_json(F.col("body").cast("string"), EVENT_SCHEMA).alias("event"))
        .select("event.*")
    )
    totals = (
        events.withWatermark("at", f"{WATERMARK_SECONDS} seconds")
        .groupBy(F.window("at", f"{WINDOW_SECONDS} seconds"), "kind")
        .agg(F.count("*").alias("orders"), F.sum("amount").alias("amount"))
        .select(
            F.date_format("window.start", "yyyy-MM-dd HH:mm:ss").alias("window_start"),
            "kind",
            "orders",
            "amount",
        )
    )
    query = (
        totals.writeStream.format("parquet")
        .outputMode("append")
        .option("checkpointLocation", args.checkpoint)
        .trigger(availableNow=True)
        .start(args.output)
    )
    query.awaitTermination()


def check(spark: SparkSession, args: argparse.Namespace, events: list[dict]) -> bool:
    written = {
        (row.window_start, row.kind): (row.orders, row.amount)
        for row in spark.read.parquet(args.output).collect()
    }
    expected = expected_totals(events)
    if written != expected:
        missing = sorted(set(expected) - set(written))
        wrong = sorted(k for k in written if k in expected and written[k] != expected[k])
        extra = sorted(set(written) - set(expected))
        print(f"MISMATCH: missing {missing}, wrong {wrong}, unexpected {extra}")
        return False
    print(f"checked: {len(written)} (minute, kind) totals match the {len(events)} events")
    return True


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nsqd-http", default="127.0.0.1:4151", help="nsqd HTTP address")
    parser.add_argument("--topic", default="orders")
    parser.add_argument("--partitions", type=int, default=2)
    parser.add_argument("--events", type=int, default=5000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--max-per-batch", type=int, default=2000)
    parser.add_argument("--output", default="/tmp/order_totals")
    parser.add_argument("--checkpoint", default="/tmp/order_totals.checkpoint")
    parser.add_argument(
        "--master",
        default="local[2]",
        help="Spark master: spark://host:7077 (a cluster), or sc://host:15002 (Spark Connect)",
    )
    args = parser.parse_args()

    if args.master.startswith("sc://"):
        spark = SparkSession.builder.remote(args.master).getOrCreate()
        spark.conf.set("spark.sql.shuffle.partitions", "2")
        spark.conf.set("spark.sql.session.timeZone", "UTC")
    else:
        spark = (
            SparkSession.builder.master(args.master)
            .appName("nsq-order-totals")
            .config("spark.sql.shuffle.partitions", "2")
            .config("spark.sql.session.timeZone", "UTC")
            .getOrCreate()
        )
        spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    events = make_events(args.events, args.seed)
    publish(spark, args, events)
    run_pipeline(spark, args)
    ok = check(spark, args, events)
    spark.stop()
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
