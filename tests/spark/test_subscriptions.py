"""Kafka's `subscribe`, `subscribePattern` and `assign` on log topics, driving the readers as
Spark does (no JVM): several topics in one query, offsets by topic, a topic the pattern finds
later read from its start, and only the assigned partitions."""

import pyarrow as pa
import pytest
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows

from nsqpy.client.blocking import http_request
from nsqpy.spark.log_reader import NSQLogBatchReader, NSQLogStreamReader
from nsqpy.spark.reader import NSQStreamReader
from nsqpy.spark.source import SCHEMA, NSQDataSource
from nsqpy.spark.topic_kind import reads_a_log
from tests.harness import start_nsqd
from tests.spark.support import aged_topic, create_topic, publish

pytestmark = pytest.mark.spark


@pytest.fixture(scope="module")
def http(tmp_path_factory):
    # Small segments, so that retention can remove some.
    daemon = start_nsqd(tmp_path_factory.mktemp("nsqd"), "-max-bytes-per-file=4096")
    yield daemon.addresses["HTTP"]
    daemon.stop()


def options(http: str, **given: str) -> dict[str, str]:
    """Spark hands a source its options with lower-cased keys."""
    return {"nsqd_http": http, **{k.lower(): v for k, v in given.items()}}


def rows(reader, pieces) -> list[tuple[str, int, bytes]]:
    batches = [batch for piece in pieces for batch in reader.read(piece)]
    table = pa.Table.from_batches(batches, schema=reader.arrow_schema)
    if "value" in table.column_names:
        assert table.column("value").equals(table.column("body"))
    return sorted(
        zip(
            table.column("topic").to_pylist(),
            table.column("partition").to_pylist(),
            table.column("body").to_pylist(),
            strict=True,
        )
    )


def fill(http: str, topic: str, partitions: int, count: int) -> list[tuple[str, int, bytes]]:
    create_topic(http, topic, partitions)
    written = []
    for partition in range(partitions):
        bodies = [b"%s-%d-%d" % (topic.encode(), partition, i) for i in range(count)]
        publish(http, topic, partition, bodies)
        written += [(topic, partition, body) for body in bodies]
    return written


def test_subscribe_reads_several_topics_with_offsets_by_topic(http):
    written = sorted(fill(http, "orders", 2, 30) + fill(http, "refunds", 1, 20))
    given = options(http, subscribe="orders,refunds", startingOffsets="earliest")
    assert reads_a_log(given)
    # Kafka's options name the topics: Kafka's `value` column too, the body's bytes.
    schema = NSQDataSource(given).schema()
    assert schema.fieldNames()[-1] == "value"
    assert "value" not in NSQDataSource(options(http, topic="orders")).schema().fieldNames()
    reader = NSQLogStreamReader(given, schema)
    start = reader.initialOffset()
    assert set(start) == {"orders", "refunds", "#channel"}
    assert set(start["orders"]) == {"0", "1"} and start["refunds"] == {"0": 0}
    end = reader.latestOffset(start, ReadAllAvailable())
    assert rows(reader, reader.partitions(start, end)) == sorted(written)
    reader.commit(end)
    # At most 20 of the 80 new messages, shared out by what each partition has.
    more = fill(http, "refunds", 1, 60)
    publish(http, "orders", 0, [b"late-%d" % i for i in range(20)])
    limited = reader.latestOffset(end, ReadMaxRows(20))
    assert len(rows(reader, reader.partitions(end, limited))) == 20
    rest = reader.latestOffset(limited, ReadAllAvailable())
    read = rows(reader, reader.partitions(end, limited) + reader.partitions(limited, rest))
    assert read == sorted(more + [("orders", 0, b"late-%d" % i) for i in range(20)])


def test_subscribe_pattern_finds_a_new_topic_and_reads_it_from_its_start(http):
    first = fill(http, "metrics-cpu", 1, 10)
    fill(http, "other-disk", 1, 10)
    reader = NSQLogStreamReader(
        options(http, subscribePattern="metrics-.*", startingOffsets="earliest"), SCHEMA
    )
    start = reader.initialOffset()
    assert set(start) == {"metrics-cpu", "#channel"}
    end = reader.latestOffset(start, ReadAllAvailable())
    assert rows(reader, reader.partitions(start, end)) == first
    # A topic created later whose retention already ran: read from where its log starts.
    removed = aged_topic(http, "metrics-mem")
    after = reader.latestOffset(end, ReadAllAvailable())
    assert set(after) == {"metrics-cpu", "metrics-mem", "#channel"}
    kept = [("metrics-mem", 0, b"m%03d" % i) for i in range(removed, 400)]
    assert rows(reader, reader.partitions(end, after)) == kept


def test_assign_reads_only_the_partitions_named(http):
    written = fill(http, "assigned", 3, 15)
    given = options(http, assign='{"assigned": [0, 2]}')
    reader = NSQLogBatchReader(given, SCHEMA)
    assert {(piece.topic, piece.partition) for piece in reader.partitions()} == {
        ("assigned", 0),
        ("assigned", 2),
    }
    expected = sorted(row for row in written if row[1] in (0, 2))
    assert rows(reader, reader.partitions()) == expected
    missing = NSQLogBatchReader(options(http, assign='{"assigned": [5]}'), SCHEMA)
    with pytest.raises(ValueError, match="assign names partitions no nsqd holds: assigned:5"):
        missing.partitions()


def test_a_batch_read_of_several_topics_takes_positions_by_topic(http):
    fill(http, "left", 1, 10)
    fill(http, "right", 1, 10)
    whole = NSQLogBatchReader(options(http, subscribe="left,right"), SCHEMA)
    ends = {(p.topic, p.partition): p.end for p in whole.partitions()}
    middle = ends[("left", 0)] // 2
    given = options(http, subscribe="left,right", startingOffsets=f'{{"left": {{"0": {middle}}}}}')
    reader = NSQLogBatchReader(given, SCHEMA)
    read = rows(reader, reader.partitions())
    assert [row for row in read if row[0] == "right"] == [
        ("right", 0, b"right-0-%d" % i) for i in range(10)
    ]
    assert 0 < len([row for row in read if row[0] == "left"]) < 10


def test_log_and_classic_topics_are_not_read_together(http):
    http_request(http, "/topic/create", method="POST", topic="plain")
    fill(http, "logged", 1, 1)
    with pytest.raises(ValueError, match="'logged' are log topics, 'plain' classic"):
        reads_a_log(options(http, subscribe="logged,plain"))
    assert not reads_a_log(options(http, subscribe="plain"))
    with pytest.raises(ValueError, match="classic topics, which are read one at a time"):
        NSQStreamReader(options(http, nsqd="127.0.0.1:1", subscribe="plain,other"), SCHEMA)
