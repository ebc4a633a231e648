"""The replayable source of log topics: batch reads of history, availableNow streams that move
their channel cursor, positions by offset and by timestamp, and data lost to retention."""

import json
import time

import numpy as np
import pytest

from nsqpy.client.blocking import http_json
from nsqpy.spark.log_reader import LogRange, NSQLogBatchReader
from nsqpy.spark.log_records import records_to_batch
from nsqpy.spark.source import SCHEMA
from tests.harness import start_nsqd
from tests.spark.support import aged_topic, collect_available_now, create_topic, publish

pytestmark = pytest.mark.spark


@pytest.fixture
def nsqd(tmp_path):
    data = tmp_path / "nsqd"
    data.mkdir()
    # Small segments, so retention can remove some of a partition.
    daemon = start_nsqd(data, "-max-bytes-per-file=4096")
    yield daemon
    daemon.stop()


def partition_ends(http: str, topic: str) -> dict[int, dict]:
    document = http_json(http, "/partition/offsets", topic=topic)
    return {entry["partition"]: entry for entry in document["partitions"]}


def channel_cursors(http: str, topic: str, channel: str) -> dict[int, dict]:
    """The channel's stats in each partition of the topic."""
    stats = http_json(http, "/stats", format="json", topic=topic)
    return {
        entry["topic_partition"]: found
        for entry in stats["topics"]
        if entry["topic_name"] == topic
        for found in entry["channels"]
        if found["channel_name"] == channel
    }


def bodies_of(rows) -> list[bytes]:
    return sorted(bytes(row.body) for row in rows)


def test_a_batch_read_returns_a_range_of_history_by_offsets(spark, nsqd):
    http = nsqd.addresses["HTTP"]
    create_topic(http, "history", 2)
    for partition in (0, 1):
        publish(http, "history", partition, [b"p%d-%03d" % (partition, i) for i in range(300)])
    ends = partition_ends(http, "history")
    # Partition 0 from its 100th message's offset, partition 1 up to its 50th.
    rows = (
        spark.read.format("nsq")
        .option("nsqd_http", http)
        .option("topic", "history")
        .load()
        .collect()
    )
    assert len(rows) == 600
    by_body = {bytes(row.body): row for row in rows}
    hundredth = by_body[b"p0-100"].offset
    fiftieth = by_body[b"p1-050"].offset
    assert all(row.topic == "history" and row.nsqd == http for row in rows)
    assert len({row.id for row in rows}) == 600

    ranged = (
        spark.read.format("nsq")
        .option("nsqd_http", http)
        .option("topic", "history")
        .option("startingOffsets", json.dumps({"history": {"0": hundredth, "1": -2}}))
        .option("endingOffsets", json.dumps({"0": -1, "1": fiftieth}))
        .option("minPartitions", "5")
        .load()
    )
    assert ranged.rdd.getNumPartitions() >= 5
    expected = [b"p0-%03d" % i for i in range(100, 300)] + [b"p1-%03d" % i for i in range(50)]
    assert bodies_of(ranged.collect()) == sorted(expected)
    assert ends[0]["end"]["count"] == 300


def test_a_read_starts_at_a_timestamp(spark, nsqd, tmp_path):
    http = nsqd.addresses["HTTP"]
    create_topic(http, "stamped", 1)
    publish(http, "stamped", 0, [b"before-%d" % i for i in range(20)])
    boundary_ms = int(time.time() * 1000) + 1
    # Every later message gets a later timestamp: wait for the clock to pass the boundary.
    deadline = time.monotonic() + 5
    while time.time() * 1000 <= boundary_ms and time.monotonic() < deadline:
        time.sleep(0.001)
    publish(http, "stamped", 0, [b"after-%d" % i for i in range(20)])
    expected = sorted(b"after-%d" % i for i in range(20))

    batch = (
        spark.read.format("nsq")
        .option("nsqd_http", http)
        .option("topic", "stamped")
        .option("startingTimestamp", str(boundary_ms))
        .load()
    )
    assert bodies_of(batch.collect()) == expected
    stream = (
        spark.readStream.format("nsq")
        .option("nsqd_http", http)
        .option("topic", "stamped")
        .option("channel", "from-the-boundary")
        .option("startingOffsetsByTimestamp", json.dumps({"0": boundary_ms}))
        .load()
    )
    assert bodies_of(collect_available_now(stream, tmp_path / "checkpoint")) == expected


def test_an_available_now_stream_reads_everything_once_and_moves_its_channel(spark, nsqd, tmp_path):
    http = nsqd.addresses["HTTP"]
    create_topic(http, "events", 2)
    published = []
    for partition in (0, 1):
        bodies = [b"e%d-%04d" % (partition, i) for i in range(1000)]
        publish(http, "events", partition, bodies)
        published += bodies
    batches: list[tuple[int, int]] = []

    def collect(batch, batch_id):
        rows = batch.collect()
        batches.append((batch_id, len(rows)))
        received.extend(rows)

    received: list = []
    query = (
        spark.readStream.format("nsq")
        .option("nsqd_http", http)
        .option("topic", "events")
        .option("channel", "spark-query")
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", "700")
        .load()
        .writeStream.foreachBatch(collect)
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(120)
    assert not query.isActive and query.exception() is None
    assert bodies_of(received) == sorted(published)
    assert [size for _, size in sorted(batches)] == [700, 700, 600]
    # Each partition's end at the last look, as the Kafka source's progress reports it.
    last = query.recentProgress[-1].sources[0]
    ends = {
        str(partition["partition"]): partition["end"]["offset"]
        for partition in http_json(http, "/partition/offsets", topic="events")["partitions"]
    }
    assert json.loads(last.latestOffset) == ends
    # Spark commits a batch to the source when it plans the next one: the channel stands at the
    # end of the second batch, and shows the last one as lag, like any consumer's.
    cursors = channel_cursors(http, "events", "spark-query")
    assert sum(cursor["confirmed_count"] for cursor in cursors.values()) == 1400
    assert sum(cursor["lag"] for cursor in cursors.values()) == 600


def test_data_removed_by_retention_fails_the_read_unless_failOnDataLoss_is_false(spark, nsqd):
    http = nsqd.addresses["HTTP"]
    aged_topic(http, "short")
    start = partition_ends(http, "short")[0]["start"]
    assert start["count"] > 0
    reader = (
        spark.read.format("nsq")
        .option("nsqd_http", http)
        .option("topic", "short")
        .option("startingOffsets", '{"0": 0}')
    )
    with pytest.raises(Exception, match="removed by retention before this query read them"):
        reader.load().collect()
    rows = reader.option("failOnDataLoss", "false").load().collect()
    assert bodies_of(rows) == [b"m%03d" % i for i in range(start["count"], 400)]


def query_channels(http: str, topic: str) -> set[str]:
    stats = http_json(http, "/stats", format="json", topic=topic)
    return {
        found["channel_name"]
        for entry in stats["topics"]
        if entry["topic_name"] == topic
        for found in entry["channels"]
    }


def test_without_a_channel_a_query_names_its_own_and_its_checkpoint_keeps_it(spark, nsqd, tmp_path):
    http = nsqd.addresses["HTTP"]
    create_topic(http, "own", 1)
    first = [b"first-%03d" % i for i in range(100)]
    publish(http, "own", 0, first)

    def stream():
        return (
            spark.readStream.format("nsq")
            .option("nsqd_http", http)
            .option("topic", "own")
            .option("startingOffsets", "earliest")
            .option("maxOffsetsPerTrigger", "40")
            .load()
        )

    checkpoint = tmp_path / "checkpoint"
    assert bodies_of(collect_available_now(stream(), checkpoint)) == sorted(first)
    (channel,) = query_channels(http, "own")
    assert channel.startswith("spark-nsq-source-") and len(channel) == 49, channel
    # Restarted from its checkpoint, the query reads on from where it was, on its channel.
    second = [b"second-%03d" % i for i in range(100)]
    publish(http, "own", 0, second)
    assert bodies_of(collect_available_now(stream(), checkpoint)) == sorted(second)
    assert query_channels(http, "own") == {channel}
    assert channel_cursors(http, "own", channel)[0]["confirmed_count"] >= 160
    # Another checkpoint is another query: a channel of its own, from the earliest again.
    again = collect_available_now(stream(), tmp_path / "another")
    assert bodies_of(again) == sorted(first + second)
    assert len(query_channels(http, "own") - {channel}) == 1


def test_a_stream_subscribed_to_several_topics_goes_on_from_its_checkpoint(spark, nsqd, tmp_path):
    """Kafka's `subscribe`: two log topics in one query, its offsets by topic in Spark's
    checkpoint, so the query started again reads only what came since."""
    http = nsqd.addresses["HTTP"]
    create_topic(http, "clicks", 2)
    create_topic(http, "views", 1)
    publish(http, "clicks", 0, [b"c0-%d" % i for i in range(50)])
    publish(http, "clicks", 1, [b"c1-%d" % i for i in range(50)])
    publish(http, "views", 0, [b"v-%d" % i for i in range(30)])

    def stream():
        return (
            spark.readStream.format("nsq")
            .option("nsqd_http", http)
            .option("subscribe", "clicks,views")
            .option("startingOffsets", "earliest")
            .load()
        )

    checkpoint = tmp_path / "checkpoint"
    first = collect_available_now(stream(), checkpoint)
    assert sorted((row.topic, row.body) for row in first) == sorted(
        [("clicks", b"c%d-%d" % (p, i)) for p in (0, 1) for i in range(50)]
        + [("views", b"v-%d" % i) for i in range(30)]
    )
    publish(http, "views", 0, [b"later"])
    second = collect_available_now(stream(), checkpoint)
    assert [(row.topic, row.partition, row.body) for row in second] == [("views", 0, b"later")]
    logs = (checkpoint / "offsets").iterdir()
    offsets = sorted((p for p in logs if p.name.isdigit()), key=lambda path: int(path.name))
    last = json.loads(offsets[-1].read_text().splitlines()[-1])
    assert set(last) == {"clicks", "views", "#channel"} and set(last["clicks"]) == {"0", "1"}


def test_a_fetch_brings_where_each_record_starts_and_reads_as_without(nsqd):
    """The executors' fetch asks nsqd for where each record starts (`starts=true`), across the
    segments of an aged partition, and builds the same batch as from the records alone."""
    http = nsqd.addresses["HTTP"]
    removed = aged_topic(http, "aged")
    reader = NSQLogBatchReader({"topic": "aged", "nsqd_http": http}, SCHEMA)
    start = partition_ends(http, "aged")[0]["start"]["offset"]
    end = partition_ends(http, "aged")[0]["end"]["offset"]
    piece = LogRange("aged", 0, start, end, (http,))
    data, following, starts = reader._fetch({}, http, piece, start)
    assert following == end and starts is not None and len(starts) == 400 - removed
    walked, at = [], 0
    while at < len(data):
        walked.append(at)
        at += 4 + int.from_bytes(data[at : at + 4], "big")
    assert starts.tolist() == walked
    where = {"topic": "aged", "partition": 0, "nsqd": http, "schema": reader.arrow_schema}
    with_starts = records_to_batch(data, start, starts=starts, **where)
    assert with_starts.equals(records_to_batch(data, start, **where))
    assert with_starts.column("body").to_pylist() == [b"m%03d" % i for i in range(removed, 400)]
    assert np.all(np.diff(with_starts.column("offset").to_numpy()) > 0)
