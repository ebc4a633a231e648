"""What the Spark source's `headers` column costs: `records_to_batch` over one fetch of an ext
topic's records (each with a JSON header and a trace ID), with and without the column.

    python -m bench.log_records_headers with|without|distinct [RECORDS] [starts]

Builds RECORDS stored records of 100-byte bodies in memory, as nsqd's `/partition/fetch`
returns them (`with` and `without`: one header for every record; `distinct`: each record's
header names its own trace ID, as `bench.spark_log_read --ext` publishes them), and turns
them into record batches of the source's schema 20 times; prints rows/s. With `starts`, each
conversion is given where the records start, as nsqd's `/partition/fetch?starts=true` sends
them (found once, before the timing). Run the modes against each other with farm-bench
(bench/RESULTS.md).
"""

import json
import struct
import sys
import time

from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import StructType

from nsqpy.spark.log_records import _record_starts, records_to_batch
from nsqpy.spark.source import HEADERS_FIELD, SCHEMA

_EXT_FLAG = 0xA000
ROUNDS = 20


def ext_records(count: int, distinct: bool) -> bytes:
    """`count` records of an ext topic: `[4 size][8 ts][2 attempts|0xA000][8 id][8 trace]
    [1 version 4][2 length][header][body]`."""
    header = json.dumps({"##client_dispatch_tag": "blue", "region": "eu"}).encode()
    body = b"x" * 100
    parts = []
    for number in range(count):
        if distinct:
            entries = {"##client_dispatch_tag": "blue", "##trace_id": str(number)}
            header = json.dumps(entries).encode()
        rest = struct.pack(">qH8sQ", time.time_ns(), 1 | _EXT_FLAG, number.to_bytes(8, "big"), 7)
        rest += b"\x04" + len(header).to_bytes(2, "big") + header + body
        parts.append(len(rest).to_bytes(4, "big") + rest)
    return b"".join(parts)


def main() -> None:
    mode = sys.argv[1]
    count = int(sys.argv[2]) if len(sys.argv) > 2 else 50_000
    fields = SCHEMA.fields if mode == "without" else [*SCHEMA.fields, HEADERS_FIELD]
    schema = to_arrow_schema(StructType(fields), timezone="UTC")
    data = ext_records(count, distinct=mode == "distinct")
    starts = None
    if sys.argv[3:] == ["starts"]:
        starts = _record_starts(data, None)
    started = time.perf_counter()
    for _ in range(ROUNDS):
        batch = records_to_batch(
            data, 0, topic="t", partition=0, nsqd="n", schema=schema, starts=starts
        )
        assert batch.num_rows == count
    elapsed = time.perf_counter() - started
    print(f"{mode}: {count * ROUNDS / elapsed:,.0f} rows/s")


if __name__ == "__main__":
    main()
