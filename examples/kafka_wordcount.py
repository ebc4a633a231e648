"""Spark's own Kafka word count (`examples/src/main/python/sql/streaming/
structured_kafka_wordcount.py`, Apache License 2.0), ported to NSQ by renaming the format
(`kafka` -> `nsq`) and the servers option (`kafka.bootstrap.servers` -> `lookupd`); nothing
else changed.

Consumes messages from one or more log topics and counts their words:

    PYSPARK_PYTHON=.venv/bin/python .venv/bin/spark-submit examples/kafka_wordcount.py \\
        <lookupd-http-addresses> <subscribe-type> <topics>

* `<lookupd-http-addresses>`: nsqlookupd's HTTP addresses (`host1:port1,host2:port2`), where
  Kafka's example takes its bootstrap servers;
* `<subscribe-type>`: `assign`, `subscribe` or `subscribePattern`, as Kafka's;
* `<topics>`: for `assign` a JSON string (`{"topicA":[0,1],"topicB":[2,4]}`), for `subscribe`
  a comma-separated list of topics, for `subscribePattern` a regular expression.

`format("nsq")` is found without `nsqpy.spark.register(spark)`: installing nsqpy installs the
`pyspark_nsq` module that PySpark registers data sources from, as long as `PYSPARK_PYTHON`
names the interpreter nsqpy is installed in. The `value` column is the message body, as
Kafka's is the record's value.
"""

import sys

from pyspark.sql import SparkSession
from pyspark.sql.functions import explode, split

if __name__ == "__main__":
    if len(sys.argv) != 4:
        print(
            "Usage: kafka_wordcount.py <lookupd-http-addresses> <subscribe-type> <topics>",
            file=sys.stderr,
        )
        sys.exit(-1)

    bootstrapServers = sys.argv[1]  # noqa: N816 (Spark's example's names)
    subscribeType = sys.argv[2]  # noqa: N816
    topics = sys.argv[3]

    spark = SparkSession.builder.appName("StructuredKafkaWordCount").getOrCreate()

    # Create DataSet representing the stream of input lines from kafka
    lines = (
        spark.readStream.format("nsq")
        .option("lookupd", bootstrapServers)
        .option(subscribeType, topics)
        .load()
        .selectExpr("CAST(value AS STRING)")
    )

    # Split the lines into words
    words = lines.select(
        # explode turns each item in an array into a separate row
        explode(split(lines.value, " ")).alias("word")
    )

    # Generate running word count
    wordCounts = words.groupBy("word").count()  # noqa: N816

    # Start running the query that prints the running counts to the console
    query = wordCounts.writeStream.outputMode("complete").format("console").start()

    query.awaitTermination()
