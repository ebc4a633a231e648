"""The Kafka source's options on log topics, driving the readers as Spark does (no JVM):
`maxRecordsPerPartition`, `minOffsetsPerTrigger` with `maxTriggerDelay`, `reportLatestOffset`,
`groupIdPrefix`, `startingOffsetsByTimestampStrategy`, and the `timestampType` and
`headers` (`includeHeaders`) columns."""

import json
import time

import pyarrow as pa
import pytest
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMinRows

from nsqpy.client.blocking import http_request
from nsqpy.spark.log_reader import NSQLogBatchReader, NSQLogStreamReader
from nsqpy.spark.source import SCHEMA, NSQDataSource
from tests.harness import start_nsqd
from tests.spark.support import aged_topic, create_topic, publish
from tests.support.polling import poll

pytestmark = pytest.mark.spark


@pytest.fixture(scope="module")
def http(tmp_path_factory):
    daemon = start_nsqd(tmp_path_factory.mktemp("nsqd"))
    yield daemon.addresses["HTTP"]
    daemon.stop()


def options(http: str, topic: str, **given: str) -> dict[str, str]:
    """Spark hands a source its options with lower-cased keys."""
    return {"nsqd_http": http, "topic": topic, **{k.lower(): v for k, v in given.items()}}


def read_all(reader: NSQLogBatchReader) -> pa.Table:
    batches = [batch for piece in reader.partitions() for batch in reader.read(piece)]
    return pa.Table.from_batches(batches, schema=reader.arrow_schema)


def test_max_records_per_partition_cuts_ranges_and_rows_say_log_append_time(http):
    create_topic(http, "counted", 2)
    for partition in (0, 1):
        publish(http, "counted", partition, [b"p%d-%03d" % (partition, i) for i in range(250)])
    reader = NSQLogBatchReader(options(http, "counted", maxRecordsPerPartition="100"), SCHEMA)
    pieces = reader.partitions()
    assert sorted(p.partition for p in pieces) == [0, 0, 0, 1, 1, 1]
    table = read_all(reader)
    sizes = [sum(b.num_rows for b in reader.read(piece)) for piece in pieces]
    assert sorted(sizes) == [50, 50, 100, 100, 100, 100]
    assert sorted(table.column("body").to_pylist()) == sorted(
        b"p%d-%03d" % (p, i) for p in (0, 1) for i in range(250)
    )
    assert set(table.column("timestampType").to_pylist()) == {1}
    whole = NSQLogBatchReader(options(http, "counted"), SCHEMA)
    assert len(whole.partitions()) == 2


def test_a_starting_timestamp_after_the_last_message_fails_unless_the_strategy_is_latest(http):
    create_topic(http, "stamped-early", 1)
    publish(http, "stamped-early", 0, [b"old"])
    future = str(int(time.time() * 1000) + 3_600_000)
    strict = NSQLogBatchReader(options(http, "stamped-early", startingTimestamp=future), SCHEMA)
    with pytest.raises(ValueError, match="startingOffsetsByTimestampStrategy to latest"):
        strict.partitions()
    lenient = options(
        http, "stamped-early", startingTimestamp=future, startingOffsetsByTimestampStrategy="latest"
    )
    assert read_all(NSQLogBatchReader(lenient, SCHEMA)).num_rows == 0
    with pytest.raises(ValueError, match="is one of error, latest, not 'never'"):
        NSQLogBatchReader(
            options(http, "stamped-early", startingOffsetsByTimestampStrategy="never"), SCHEMA
        )


def test_min_offsets_per_trigger_waits_for_enough_or_the_max_trigger_delay(http):
    create_topic(http, "trickle", 2)
    given = options(
        http,
        "trickle",
        startingOffsets="earliest",
        minOffsetsPerTrigger="300",
        maxTriggerDelay="1s",
        groupIdPrefix="orders-job",
    )
    reader = NSQLogStreamReader(given, SCHEMA)
    assert reader.getDefaultReadLimit() == ReadMinRows(300)
    start = reader.initialOffset()
    assert start["channel"].startswith("orders-job-")
    publish(http, "trickle", 0, [b"a%d" % i for i in range(100)])
    publish(http, "trickle", 1, [b"b%d" % i for i in range(100)])
    # 200 new messages, fewer than 300, within the delay: no batch.
    assert reader.latestOffset(start, ReadMinRows(300)) == start
    assert reader.reportLatestOffset() == {
        "0": reader._known[("trickle", 0)].end,
        "1": reader._known[("trickle", 1)].end,
    }
    publish(http, "trickle", 1, [b"c%d" % i for i in range(100)])
    enough = reader.latestOffset(start, ReadMinRows(300))
    assert enough != start and enough["channel"] == start["channel"]
    publish(http, "trickle", 0, [b"d%d" % i for i in range(10)])
    # 10 more: none until maxTriggerDelay has passed since the last batch, then those.
    assert reader.latestOffset(enough, ReadMinRows(300)) == enough
    later = poll(
        lambda: (found := reader.latestOffset(enough, ReadMinRows(300))) != enough and found,
        "maxTriggerDelay to let the 10 through",
        timeout=10,
    )
    assert later["0"] > enough["0"] and later["1"] == enough["1"]
    # availableNow reads what there is regardless.
    assert reader.latestOffset(start, ReadAllAvailable()) == later


def test_a_group_id_prefix_that_cannot_begin_a_channel_name_is_refused(http):
    with pytest.raises(ValueError, match="cannot begin a channel name"):
        NSQLogStreamReader(options(http, "t", groupIdPrefix="spaces are not allowed"), SCHEMA)


def test_include_headers_gives_an_ext_topics_header_and_trace_id_and_costs_nothing_unasked(http):
    http_request(
        http, "/topic/create", method="POST", topic="tagged", partition_num="1", ext="true"
    )
    header = {"##client_dispatch_tag": "blue", "##trace_id": "77", "region": "eu"}
    http_request(
        http,
        "/pub_ext",
        method="POST",
        body=b"with",
        topic="tagged",
        partition="0",
        ext=json.dumps(header),
    )
    publish(http, "tagged", 0, [b"without"])
    source = NSQDataSource(options(http, "tagged", includeHeaders="true"))
    schema = source.schema()
    assert schema.fieldNames()[-1] == "headers"
    # Kafka's type, its entries, keys and values never null: Spark's row conversion then
    # asks no null bit of them.
    headers_type = schema["headers"].dataType
    assert headers_type.simpleString() == "array<struct<key:string,value:binary>>"
    assert not headers_type.containsNull
    assert [field.nullable for field in headers_type.elementType.fields] == [False, False]
    table = read_all(NSQLogBatchReader(options(http, "tagged"), schema))
    bodies, headers = table.column("body").to_pylist(), table.column("headers").to_pylist()
    by_body = dict(zip(bodies, headers, strict=True))
    assert by_body[b"with"] == [
        {"key": "##client_dispatch_tag", "value": b"blue"},
        {"key": "##trace_id", "value": b"77"},
        {"key": "region", "value": b"eu"},
    ]
    assert by_body[b"without"] == []
    assert NSQDataSource(options(http, "tagged")).schema() == SCHEMA


def test_max_records_per_partition_on_a_topic_whose_retention_has_run(tmp_path):
    """Counts on a log that no longer starts at offset 0: the cuts still fall every N records
    of what retention kept."""
    (tmp_path / "nsqd").mkdir()
    daemon = start_nsqd(tmp_path / "nsqd", "-max-bytes-per-file=4096")
    try:
        http = daemon.addresses["HTTP"]
        kept = 400 - aged_topic(http, "aged")
        reader = NSQLogBatchReader(
            options(http, "aged", startingOffsets="earliest", maxRecordsPerPartition="60"), SCHEMA
        )
        pieces = reader.partitions()
        sizes = [sum(batch.num_rows for batch in reader.read(piece)) for piece in pieces]
        assert sum(sizes) == kept and max(sizes) <= 60
        assert len(pieces) == -(-kept // 60)
    finally:
        daemon.stop()
