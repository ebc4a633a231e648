"""A PySpark data source for NSQ: at-least-once streaming reads, batch and streaming writes.

from nsq_spark import register
register(spark)
spark.readStream.format("nsq").option("nsqd", "127.0.0.1:4150")...
"""

from nsq_spark.source import SCHEMA, NSQDataSource

__all__ = ["NSQDataSource", "SCHEMA", "register"]


def register(spark) -> None:
    """Make `format("nsq")` available in this SparkSession."""
    spark.dataSource.register(NSQDataSource)
