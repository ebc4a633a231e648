"""A streaming query for the exactly-once test: a log topic's messages into parquet, with a
checkpoint. `python exactly_once_driver.py NSQD_HTTP TOPIC CHECKPOINT OUTPUT MODE`, MODE
"continuous" (runs until killed) or "available-now" (drains what is there, then ends)."""

import sys

from pyspark.sql import SparkSession

from nsqpy.spark import register


def main() -> None:
    nsqd_http, topic, checkpoint, output, mode = sys.argv[1:6]
    spark = (
        SparkSession.builder.master("local[2]")
        .appName("nsqpy-exactly-once")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.driver.host", "127.0.0.1")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    query = start_query(spark, nsqd_http, topic, checkpoint, output, mode)
    print("query started", flush=True)
    query.awaitTermination()
    spark.stop()


def start_query(spark, nsqd_http: str, topic: str, checkpoint: str, output: str, mode: str):
    """The query, started: the test runs it again from its checkpoint in a session of its own."""
    events = (
        spark.readStream.format("nsq")
        .option("nsqd_http", nsqd_http)
        .option("topic", topic)
        .option("channel", "exactly-once")
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", "150")
        .load()
        .select("id", "body", "partition", "offset")
    )
    writer = events.writeStream.format("parquet").option("checkpointLocation", checkpoint)
    if mode == "available-now":
        writer = writer.trigger(availableNow=True)
    else:
        writer = writer.trigger(processingTime="0 seconds")
    return writer.start(output)


if __name__ == "__main__":
    main()
