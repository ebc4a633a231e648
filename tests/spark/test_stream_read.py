"""The streaming source against a real nsqd: delivery, FIN on commit, restart after failure."""

from datetime import datetime, timedelta

import pytest

from nsqpy.client.blocking import http_publish
from tests.spark.support import addresses, collect_available_now, wait_channel_drained
from tests.support.polling import poll
from tests.support.stats import channel_stats

pytestmark = pytest.mark.spark


def nsq_stream(spark, nsqd_tcp, nsqd_http, topic, channel, **extra):
    reader = (
        spark.readStream.format("nsq")
        .option("nsqd", nsqd_tcp)
        .option("nsqd_http", nsqd_http)
        .option("topic", topic)
        .option("channel", channel)
        .option("idleTimeout", "10s")
    )
    for name, value in extra.items():
        reader = reader.option(name, value)
    return reader.load()


def test_available_now_receives_everything_and_finishes_it(spark, nsqd, tmp_path):
    tcp, http = addresses(nsqd)
    bodies = {f"message-{i}".encode() for i in range(100)}
    published_at = datetime.now()
    http_publish(http, "events", sorted(bodies))
    received = collect_available_now(
        nsq_stream(spark, tcp, http, "events", "spark", maxBatch="30", msgTimeout="5s"),
        tmp_path / "checkpoint",
    )

    assert sorted(bytes(row.body) for row in received) == sorted(bodies)
    assert all(row.attempts == 1 and row.topic == "events" for row in received)
    assert {row.nsqd for row in received} == {tcp}
    assert len({row.id for row in received}) == 100
    # nsqd's nanosecond timestamp, as a Spark timestamp (local time, like datetime.now()).
    assert all(abs(row.timestamp - published_at) < timedelta(minutes=1) for row in received)

    channel = wait_channel_drained(http, "events", "spark")
    assert channel["message_count"] == 100 and channel["timeout_count"] == 0


def test_available_now_without_nsqd_http_drains_the_channel(spark, nsqd, tmp_path):
    """With no HTTP address the depth cannot be read up front: the run reads until idleTimeout
    passes without a message, and every message is taken and FINished."""
    tcp, http = addresses(nsqd)
    bodies = [f"message-{i}".encode() for i in range(500)]
    http_publish(http, "no-http", bodies)
    stream = (
        spark.readStream.format("nsq")
        .option("nsqd", tcp)
        .option("topic", "no-http")
        .option("channel", "spark")
        .option("idleTimeout", "2s")
        .option("maxBatch", "200")
        .load()
    )
    received = collect_available_now(stream, tmp_path / "checkpoint")
    assert sorted(bytes(row.body) for row in received) == sorted(bodies)

    assert wait_channel_drained(http, "no-http", "spark")["message_count"] == 500


def test_failed_batch_is_redelivered_after_restart(spark, nsqd, tmp_path):
    tcp, http = addresses(nsqd)
    bodies = {f"job-{i}".encode() for i in range(60)}
    http_publish(http, "jobs", sorted(bodies))
    processed = []
    failed_ids = set()

    def flaky_sink(batch, batch_id):
        rows = batch.select("id", "body", "attempts").collect()
        if rows and not failed_ids and processed:
            # Fail once, mid-stream: after a batch succeeded, on a batch with data.
            failed_ids.update(row.id for row in rows)
            raise RuntimeError("sink down")
        processed.extend(rows)

    def run_query():
        return (
            nsq_stream(spark, tcp, http, "jobs", "spark", maxBatch="20", msgTimeout="2s")
            .writeStream.foreachBatch(flaky_sink)
            .option("checkpointLocation", str(tmp_path / "checkpoint"))
            .trigger(availableNow=True)
            .start()
        )

    first = run_query()
    with pytest.raises(Exception, match="sink down"):
        first.awaitTermination(120)
    assert failed_ids and len(processed) < len(bodies)
    before_failure = list(processed)

    second = run_query()  # same checkpoint: Spark replays the failed batch, then continues
    second.awaitTermination(120)
    assert second.exception() is None

    assert {bytes(row.body) for row in processed} == bodies
    redelivered = [row for row in processed if row.id in failed_ids]
    assert {row.id for row in redelivered} == failed_ids
    assert all(row.attempts > 1 for row in redelivered)
    # Besides the failed batch, what the dead runner had buffered comes back too, so the
    # first run's rows are the only ones known to be first deliveries.
    assert all(row.attempts == 1 for row in before_failure)

    wait_channel_drained(http, "jobs", "spark")


def test_running_query_finishes_messages_while_it_waits_for_more(spark, nsqd, tmp_path):
    """The default trigger: messages published while the query runs are processed, and the
    flush batch FINishes the last of them without any new data arriving."""
    tcp, http = addresses(nsqd)
    received = []

    def collect(batch, batch_id):
        received.extend(batch.select("body").collect())

    query = (
        nsq_stream(spark, tcp, http, "live", "spark", maxBatch="25")
        .writeStream.foreachBatch(collect)
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .start()
    )
    try:
        bodies = {f"live-{i}".encode() for i in range(80)}
        http_publish(http, "live", sorted(bodies))

        def drained():
            channel = channel_stats(http, "live", "spark")
            return (
                channel
                and channel["message_count"] == len(bodies)
                and channel["depth"] == 0
                and channel["in_flight_count"] == 0
            )

        poll(drained, "every message FINished by the running query", timeout=60)
        assert {bytes(row.body) for row in received} == bodies
        assert query.isActive and query.exception() is None
    finally:
        query.stop()


def test_a_batch_read_of_a_classic_topic_drains_its_channel(spark, nsqd):
    """`spark.read.format("nsq")` of a classic topic: what the channel holds, each once,
    FINished once Spark took the rows."""
    tcp, http = addresses(nsqd)
    bodies = sorted(f"message-{i}".encode() for i in range(60))
    http_publish(http, "drained", bodies)
    rows = (
        spark.read.format("nsq")
        .option("nsqd", tcp)
        .option("nsqd_http", http)
        .option("topic", "drained")
        .option("channel", "batch")
        .option("maxRecordsPerPartition", "25")
        .load()
        .collect()
    )
    assert sorted(bytes(row.body) for row in rows) == bodies
    channel = wait_channel_drained(http, "drained", "batch")
    assert channel["message_count"] == 60 and channel["timeout_count"] == 0
