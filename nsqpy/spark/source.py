"""The `nsq` data source: `spark.readStream.format("nsq")` and `df.write.format("nsq")`."""

from pyspark.sql.datasource import DataSource
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

# A StructType, not a DDL string: the readers build their Arrow schema from it in processes
# that have no JVM to parse DDL. `partition` is null for an unpartitioned classic topic;
# `offset`, a message's virtual offset in its partition's log, only for log topics.
# `timestampType` is Kafka's column: always 1 (LogAppendTime), since nsqd stamps a message
# when it stores it.
SCHEMA = StructType(
    [
        StructField("id", StringType()),
        StructField("body", BinaryType()),
        StructField("attempts", IntegerType()),
        StructField("timestamp", TimestampType()),
        StructField("topic", StringType()),
        StructField("nsqd", StringType()),
        StructField("partition", IntegerType()),
        StructField("offset", LongType()),
        StructField("timestampType", IntegerType()),
    ]
)

# Kafka's name of the body, in the schema of a source that names its topics with Kafka's
# options (`subscribe`, `subscribePattern`, `assign`), so that a job written for the Kafka
# source (`CAST(value AS STRING)`) reads NSQ unchanged. Not otherwise: Spark copies every
# column of every row, and a second copy of the body costs a read ~10 % of its rows/s
# (bench/RESULTS.md).
VALUE_FIELD = StructField("value", BinaryType())


HEADERS_FIELD = StructField(
    "headers",
    ArrayType(
        StructType(
            [StructField("key", StringType(), False), StructField("value", BinaryType(), False)]
        ),
        containsNull=False,
    ),
)


class NSQDataSource(DataSource):
    """Options are read lazily by the reader and writers: this object is pickled into
    several Spark worker processes and must do no I/O."""

    @classmethod
    def name(cls) -> str:
        return "nsq"

    def schema(self) -> StructType:
        """SCHEMA; Kafka's `value` column when the topics are named with Kafka's options;
        with `includeHeaders` Kafka's `headers` column (log topics: an ext topic's JSON
        header entries and the trace ID; null on classic topics)."""
        from nsqpy.spark.options import boolean, names_topics_as_kafka

        fields = list(SCHEMA.fields)
        if names_topics_as_kafka(self.options):
            fields.append(VALUE_FIELD)
        if boolean(self.options, "includeHeaders", False):
            fields.append(HEADERS_FIELD)
        return SCHEMA if len(fields) == len(SCHEMA.fields) else StructType(fields)

    def streamReader(self, schema: StructType):
        """The replayable reader for log topics; for classic topics Spark falls back to
        `simpleStreamReader` (at-least-once, through the driver)."""
        from pyspark.errors import PySparkNotImplementedError

        from nsqpy.spark.log_reader import NSQLogStreamReader
        from nsqpy.spark.topic_kind import reads_a_log

        if not reads_a_log(self.options):
            raise PySparkNotImplementedError(
                errorClass="NOT_IMPLEMENTED", messageParameters={"feature": "streamReader"}
            )
        return NSQLogStreamReader(self.options, schema)

    def reader(self, schema: StructType):
        """`spark.read.format("nsq")`: a range of a log topic's history, or what a classic
        topic's channel holds when the read starts (drained, at-least-once)."""
        from nsqpy.spark.topic_kind import reads_a_log

        if not reads_a_log(self.options):
            from nsqpy.spark.classic_batch import NSQClassicBatchReader

            return NSQClassicBatchReader(self.options, schema)
        from nsqpy.spark.log_reader import NSQLogBatchReader

        return NSQLogBatchReader(self.options, schema)

    def simpleStreamReader(self, schema: StructType):
        from nsqpy.spark.reader import NSQStreamReader

        return NSQStreamReader(self.options, schema)

    def writer(self, schema: StructType, overwrite: bool):
        from nsqpy.spark.writer import NSQWriter

        return NSQWriter(self.options, schema)

    def streamWriter(self, schema: StructType, overwrite: bool):
        from nsqpy.spark.writer import NSQStreamWriter

        return NSQStreamWriter(self.options, schema)
