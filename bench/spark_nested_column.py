"""What Spark itself spends on a Kafka-style `headers` column, without nsqd or the source: a
Python data source yields the same prebuilt Arrow batch over and over (a 100-byte body, an
offset, and in `list` mode two header entries a row as `array<struct<key string, value
binary>>`), read in batch on local[2] into the `noop` sink.

    .venv/bin/python -m bench.spark_nested_column none|list [--batches 40] [--runs 4]

Prints rows/s per run. The difference between the modes is the floor of what the `headers`
column of `bench.spark_log_read --ext --headers` can cost: Arrow to Spark's rows for the
nested column, with no parsing at all (bench/RESULTS.md).
"""

import argparse
import os
import sys
import time

import numpy as np
import pyarrow as pa
from pyspark.sql import SparkSession
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

ROWS = 10_000
HEADERS_TYPE = pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))
SCHEMAS = {
    "none": "body binary, offset long",
    "list": "body binary, offset long, headers array<struct<key:string,value:binary>>",
}


def batch(mode: str) -> pa.RecordBatch:
    columns = {
        "body": pa.array([b"x" * 100] * ROWS, pa.binary()),
        "offset": pa.array(np.arange(ROWS, dtype=np.int64)),
    }
    if mode == "list":
        keys = pa.array(["##client_dispatch_tag", "##trace_id"] * ROWS, pa.string())
        values = pa.array([b"blue", b"12345"] * ROWS, pa.binary())
        entries = pa.StructArray.from_arrays([keys, values], names=["key", "value"])
        ends = pa.array(np.arange(0, 2 * ROWS + 1, 2, dtype=np.int32))
        columns["headers"] = pa.ListArray.from_arrays(ends, entries, type=HEADERS_TYPE)
    return pa.RecordBatch.from_pydict(columns)


def source(mode: str, batches: int) -> type[DataSource]:
    class Reader(DataSourceReader):
        def partitions(self):
            return [InputPartition(0), InputPartition(1)]

        def read(self, partition):
            made = batch(mode)
            for _ in range(batches):
                yield made

    class Source(DataSource):
        @classmethod
        def name(cls) -> str:
            return "nested_column_bench"

        def schema(self) -> str:
            return SCHEMAS[mode]

        def reader(self, schema):
            return Reader()

    return Source


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("mode", choices=sorted(SCHEMAS))
    parser.add_argument("--batches", type=int, default=40, help="batches per partition")
    parser.add_argument("--runs", type=int, default=4)
    args = parser.parse_args()
    # Spark's Python workers run this interpreter, which has pyarrow.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    spark = (
        SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false").getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    spark.dataSource.register(source(args.mode, args.batches))
    rows = 2 * ROWS * args.batches
    for run in range(args.runs):
        started = time.perf_counter()
        spark.read.format("nested_column_bench").load().write.format("noop").mode(
            "overwrite"
        ).save()
        print(f"{args.mode} run {run}: {rows / (time.perf_counter() - started):,.0f} rows/s")
    spark.stop()


if __name__ == "__main__":
    main()
