"""A PySpark data source for NSQ: at-least-once streaming reads, batch and streaming writes.

from nsqpy.spark import register
register(spark)
spark.readStream.format("nsq").option("nsqd", "127.0.0.1:4150")...
"""

import os
import sys

from nsqpy.spark.source import SCHEMA, NSQDataSource

__all__ = ["NSQDataSource", "SCHEMA", "register"]


def register(spark) -> None:
    """Make `format("nsq")` available in this SparkSession.

    Spark runs the connector in Python worker processes, which must import nsqpy.spark and
    pyarrow. When neither `PYSPARK_PYTHON` nor `spark.pyspark.python` names their interpreter,
    Spark would start the `python3` on the PATH, which has neither; the workers then use the
    interpreter running this driver instead (a virtualenv's `python job.py` just works).

    A Spark Connect session (`SparkSession.builder.remote(...)`) only registers the source:
    its Python workers are the Connect server's, started with the server's `PYSPARK_PYTHON`.
    """
    if type(spark).__module__.startswith("pyspark.sql.connect"):
        spark.dataSource.register(NSQDataSource)
        return
    context = spark.sparkContext
    if not os.environ.get("PYSPARK_PYTHON") and not spark.conf.get("spark.pyspark.python", ""):
        context.pythonExec = sys.executable
        os.environ["PYSPARK_PYTHON"] = sys.executable
    spark.dataSource.register(NSQDataSource)
