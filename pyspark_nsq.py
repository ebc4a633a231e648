"""`format("nsq")` in every SparkSession, without `nsqpy.spark.register(spark)`.

PySpark (4.0 and later) registers the Python data sources it finds at a session's start: the
`DefaultSource` of each top-level module named `pyspark_*` that its Python workers can import
(so `PYSPARK_PYTHON` must name an interpreter with nsqpy installed). `register(spark)` still
works, and also points the workers at the driver's interpreter.
"""

from nsqpy.spark.source import NSQDataSource as DefaultSource

__all__ = ["DefaultSource"]
