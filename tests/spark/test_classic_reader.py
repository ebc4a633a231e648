"""The classic-topic reader's connections and batches, driven without Spark the way Spark's
source runner drives it (read batch n, then commit batch n-1), against a real nsqd whose
--max-rdy-count is small, so that two batches need several connections."""

import time

import pytest
from pyspark.sql.pandas.types import to_arrow_schema

from nsqpy.client.blocking import http_publish
from nsqpy.spark.reader import NSQStreamReader
from nsqpy.spark.source import SCHEMA
from tests.harness import start_nsqd
from tests.spark.support import wait_channel_drained
from tests.support.polling import poll
from tests.support.stats import channel_stats

pytestmark = pytest.mark.spark


@pytest.fixture
def nsqd(tmp_path):
    data = tmp_path / "nsqd"
    data.mkdir()
    daemon = start_nsqd(data, "-max-rdy-count=100", "-msg-timeout=30s")
    yield daemon.addresses["TCP"], daemon.addresses["HTTP"]
    daemon.stop()


def ready_counts(http: str, topic: str, channel: str) -> list[int]:
    """The RDY count of each client of the channel."""
    stats = channel_stats(http, topic, channel) or {}
    return sorted(client["ready_count"] for client in stats.get("clients") or [])


def test_batches_come_from_several_connections_and_are_finished_on_commit(nsqd):
    tcp, http = nsqd
    bodies = [f"message-{i}".encode() for i in range(1000)]
    http_publish(http, "classic", bodies)
    # Two batches of 150 in flight need 3 connections of RDY 100.
    reader = NSQStreamReader(
        {"nsqd": tcp, "nsqd_http": http, "topic": "classic", "channel": "c", "maxbatch": "150"}
    )
    expected_schema = to_arrow_schema(SCHEMA, timezone="UTC")
    received = []
    try:
        reader.prepareForTriggerAvailableNow()
        offset = reader.initialOffset()
        assert poll(lambda: ready_counts(http, "classic", "c") == [100, 100, 100])
        previous = 0
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            batches, end = reader.read(offset)
            batches = list(batches)
            if end == offset:
                break
            rows = [row for batch in batches for row in batch.to_pylist()]
            assert len(rows) <= 150
            assert all(batch.schema == expected_schema for batch in batches)
            received.extend(rows)
            # Nothing of the previous batch is FINished before Spark commits it.
            assert channel_stats(http, "classic", "c")["in_flight_count"] >= previous + len(rows)
            reader.commit(offset)
            offset, previous = end, len(rows)
        else:
            raise AssertionError("the reader never ran out of data")
    finally:
        reader.stop()

    assert sorted(row["body"] for row in received) == sorted(bodies)
    assert len({row["id"] for row in received}) == 1000
    assert all(row["attempts"] == 1 and row["nsqd"] == tcp for row in received)
    # Columns only log topics fill (partition, offset) are null for a classic topic;
    # timestampType is Kafka's LogAppendTime, as nsqd stamps a message when it stores it.
    filled = {"id", "body", "attempts", "timestamp", "topic", "nsqd", "timestampType"}
    unfilled = set(expected_schema.names) - filled
    assert all(row[name] is None for row in received for name in unfilled)
    assert {row["timestampType"] for row in received} == {1}
    assert wait_channel_drained(http, "classic", "c")["message_count"] == 1000


def test_connections_per_nsqd_sets_the_connection_count(nsqd):
    tcp, http = nsqd
    reader = NSQStreamReader(
        {
            "nsqd": tcp,
            "topic": "classic",
            "channel": "c",
            "maxbatch": "50",
            "connectionspernsqd": "2",
        }
    )
    try:
        reader.initialOffset()
        # Two batches of 50 over 2 connections.
        assert poll(lambda: ready_counts(http, "classic", "c") == [50, 50])
    finally:
        reader.stop()
