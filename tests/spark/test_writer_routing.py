"""The sink routes each row as Kafka's does: a `topic` column (the `topic` option wins over it)
and a `partition` column (else the key's partition, else round-robin). Driven as Spark drives
a writer on an executor (no JVM): `write` over Arrow batches, as task 0."""

import copy

import pyarrow as pa
import pytest
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    IntegerType,
    StringType,
    StructField,
    StructType,
)

from nsqpy.spark.log_reader import NSQLogBatchReader
from nsqpy.spark.source import HEADERS_FIELD, NSQDataSource
from nsqpy.spark.writer import NSQWriter
from tests.harness import create_partitioned_topic
from tests.spark.support import partition_counts, standalone_lookupd_and_nsqd
from tests.support.stats import topic_stats

pytestmark = pytest.mark.spark


@pytest.fixture
def cluster(tmp_path):
    with standalone_lookupd_and_nsqd(tmp_path) as addresses:
        yield addresses


SCHEMA = StructType(
    [
        StructField("topic", StringType()),
        StructField("partition", IntegerType()),
        StructField("body", BinaryType()),
    ]
)


def rows(*entries: tuple[str | None, int | None, bytes]) -> pa.RecordBatch:
    topics, partitions, bodies = zip(*entries, strict=True)
    return pa.RecordBatch.from_arrays(
        [pa.array(topics, pa.string()), pa.array(partitions, pa.int32()), pa.array(bodies)],
        names=["topic", "partition", "body"],
    )


def test_rows_go_to_their_topic_and_partition_exactly_once_through_nsqlookupd(cluster):
    lookupd_http, nsqd_http = cluster
    for topic in ("orders", "refunds"):
        create_partitioned_topic(lookupd_http, nsqd_http, topic, 2, "c")
    writer = NSQWriter({"lookupd": lookupd_http}, SCHEMA)
    batch = rows(
        ("orders", 1, b"o-1"),
        ("refunds", 0, b"r-0"),
        ("orders", 1, b"o-2"),
        ("orders", 0, b"o-3"),
        ("refunds", None, b"r-any"),
    )
    assert writer.write(iter([batch])).messages == 5
    # The task run again (a retry of the same attempt's rows): stored once.
    assert copy.deepcopy(writer).write(iter([batch])).messages == 5
    assert partition_counts(nsqd_http, "orders") == {0: 1, 1: 2}
    assert sum(partition_counts(nsqd_http, "refunds").values()) == 2
    assert partition_counts(nsqd_http, "refunds")[0] >= 1


def test_the_topic_option_wins_over_the_column_and_classic_topics_take_no_partition(cluster):
    _, nsqd_http = cluster
    overridden = NSQWriter({"nsqd_http": nsqd_http, "topic": "everything"}, SCHEMA)
    assert overridden.write(iter([rows(("a", None, b"1"), ("b", None, b"2"))])).messages == 2
    assert topic_stats(nsqd_http, "everything")["message_count"] == 2
    by_column = NSQWriter({"nsqd_http": nsqd_http}, SCHEMA)
    by_column.write(iter([rows(("left", None, b"l"), ("right", None, b"r"), ("left", None, b"m"))]))
    assert topic_stats(nsqd_http, "left")["message_count"] == 2
    assert topic_stats(nsqd_http, "right")["message_count"] == 1
    with pytest.raises(ValueError, match="partition 3 of topic 'left', which has no partitions"):
        by_column.write(iter([rows(("left", 3, b"x"))]))
    with pytest.raises(ValueError, match="a row's topic is null or empty"):
        by_column.write(iter([rows((None, None, b"x"))]))
    with pytest.raises(ValueError, match='needs the option "topic" or a "topic" column'):
        NSQWriter({"nsqd_http": nsqd_http}, StructType([StructField("body", BinaryType())]))


HEADERS_SCHEMA = StructType(
    [
        StructField("body", BinaryType()),
        StructField("headers", HEADERS_FIELD.dataType),
    ]
)


def with_headers(*entries: tuple[bytes, list | None]) -> pa.RecordBatch:
    schema = to_arrow_schema(HEADERS_SCHEMA)
    bodies, headers = zip(*entries, strict=True)
    return pa.RecordBatch.from_arrays(
        [pa.array(bodies, pa.binary()), pa.array(headers, schema.field("headers").type)],
        schema=schema,
    )


def test_a_headers_column_is_an_ext_topics_header_written_exactly_once(cluster):
    """Kafka's sink `headers` column: each row's entries become its message's JSON header
    (MPUB_EXT_SEQ, so a task run again stores nothing twice), and the source's `headers`
    column reads them back; a row without headers is a message without one."""
    lookupd_http, nsqd_http = cluster
    create_partitioned_topic(lookupd_http, nsqd_http, "tagged", 1, "c", extend="true")
    writer = NSQWriter({"lookupd": lookupd_http, "topic": "tagged"}, HEADERS_SCHEMA)
    batch = with_headers(
        (b"blue", [{"key": "##client_dispatch_tag", "value": b"blue"}]),
        (b"traced", [{"key": "##trace_id", "value": b"77"}, {"key": "region", "value": b"eu"}]),
        (b"bare", None),
    )
    assert writer.write(iter([batch])).messages == 3
    assert copy.deepcopy(writer).write(iter([batch])).messages == 3
    assert partition_counts(nsqd_http, "tagged") == {0: 3}
    options = {"nsqd_http": nsqd_http, "topic": "tagged", "includeheaders": "true"}
    reader = NSQLogBatchReader(options, NSQDataSource(options).schema())
    batches = [b for piece in reader.partitions() for b in reader.read(piece)]
    table = pa.Table.from_batches(batches, schema=reader.arrow_schema)
    by_body = dict(
        zip(table.column("body").to_pylist(), table.column("headers").to_pylist(), strict=True)
    )
    assert by_body == {
        b"blue": [{"key": "##client_dispatch_tag", "value": b"blue"}],
        b"traced": [{"key": "##trace_id", "value": b"77"}, {"key": "region", "value": b"eu"}],
        b"bare": [],
    }


def test_headers_need_a_write_through_lookupd_and_text_values(cluster):
    lookupd_http, nsqd_http = cluster
    direct = NSQWriter({"nsqd_http": nsqd_http, "topic": "plain"}, HEADERS_SCHEMA)
    with pytest.raises(ValueError, match='written to ext topics through "lookupd"'):
        direct.write(iter([with_headers((b"x", [{"key": "k", "value": b"v"}]))]))
    assert direct.write(iter([with_headers((b"y", None), (b"z", []))])).messages == 2
    create_partitioned_topic(lookupd_http, nsqd_http, "binary", 1, "c", extend="true")
    writer = NSQWriter({"lookupd": lookupd_http, "topic": "binary"}, HEADERS_SCHEMA)
    with pytest.raises(ValueError, match="header 'k' is not UTF-8 text"):
        writer.write(iter([with_headers((b"x", [{"key": "k", "value": b"\xff"}]))]))
    wrong = StructType(
        [StructField("body", BinaryType()), StructField("headers", ArrayType(IntegerType()))]
    )
    with pytest.raises(ValueError, match="array of \\(key string, value binary or string\\)"):
        NSQWriter({"lookupd": lookupd_http, "topic": "binary"}, wrong)
