"""The sink routes each row as Kafka's does: a `topic` column (the `topic` option wins over it)
and a `partition` column (else the key's partition, else round-robin). Driven as Spark drives
a writer on an executor (no JVM): `write` over Arrow batches, as task 0."""

import copy

import pyarrow as pa
import pytest
from pyspark.sql.types import BinaryType, IntegerType, StringType, StructField, StructType

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
