"""A classic topic's batch read (`spark.read.format("nsq")`), driven as Spark drives a reader
(plan on the driver, each partition read to its end by a task), against a real nsqd: what the
channel holds when the read starts is taken and FINished once every row was handed over, what
comes later is left, and a task stopped early FINishes nothing (its messages come back)."""

import pyarrow as pa
import pytest
from pyspark.sql.pandas.types import to_arrow_schema

from nsqpy.client.blocking import http_publish, http_request
from nsqpy.spark.source import SCHEMA, NSQDataSource
from tests.harness import start_nsqd
from tests.support.polling import poll
from tests.support.stats import channel_stats

pytestmark = pytest.mark.spark


@pytest.fixture
def nsqd(tmp_path):
    data = tmp_path / "nsqd"
    data.mkdir()
    daemon = start_nsqd(data)
    yield daemon.addresses["TCP"], daemon.addresses["HTTP"]
    daemon.stop()


def reader_of(tcp: str, http: str, **given: str):
    options = {"nsqd": tcp, "nsqd_http": http, "topic": "plain", "channel": "c"}
    options.update((key.lower(), value) for key, value in given.items())
    return NSQDataSource(options).reader(SCHEMA)


def fill(http: str, count: int) -> None:
    """Topic "plain" with channel "c", holding `count` messages m00, m01, ..."""
    http_request(http, "/topic/create", method="POST", topic="plain")
    http_request(http, "/channel/create", method="POST", topic="plain", channel="c")
    http_publish(http, "plain", [b"m%02d" % i for i in range(count)])


def held(http: str) -> tuple[int, int]:
    stats = channel_stats(http, "plain", "c") or {}
    return stats.get("depth", 0), stats.get("in_flight_count", 0)


def test_a_batch_read_drains_what_the_channel_holds_when_it_starts(nsqd):
    tcp, http = nsqd
    fill(http, 25)
    reader = reader_of(tcp, http, maxBatch="10", idleTimeout="2s")
    (share,) = reader.partitions()
    assert share.expected == 25
    http_publish(http, "plain", [b"later"])  # after the plan: the next reader's
    batches = list(reader.read(share))
    assert [batch.num_rows for batch in batches] == [10, 10, 5]
    assert all(batch.schema == to_arrow_schema(SCHEMA, timezone="UTC") for batch in batches)
    table = pa.Table.from_batches(batches)
    assert sorted(table.column("body").to_pylist()) == [b"m%02d" % i for i in range(25)]
    assert set(table.column("topic").to_pylist()) == {"plain"}
    poll(lambda: held(http) == (1, 0), lambda: f"the 25 finished, 1 left: {held(http)}")
    (rest,) = reader_of(tcp, http).partitions()
    assert [row["body"] for b in reader_of(tcp, http).read(rest) for row in b.to_pylist()] == [
        b"later"
    ]
    assert reader_of(tcp, http).partitions() == []


def test_a_task_stopped_early_finishes_nothing_and_its_messages_come_back(nsqd):
    tcp, http = nsqd
    fill(http, 20)
    reader = reader_of(tcp, http, maxBatch="5", msgTimeout="1s")
    (share,) = reader.partitions()
    rows = reader.read(share)
    assert next(rows).num_rows == 5
    rows.close()  # Spark stops pulling (a limit, a failed task)
    poll(lambda: held(http) == (20, 0), lambda: f"all 20 back in the channel: {held(http)}")
    again = reader_of(tcp, http, idleTimeout="2s")
    (share,) = again.partitions()
    table = pa.Table.from_batches(list(again.read(share)))
    assert sorted(table.column("body").to_pylist()) == [b"m%02d" % i for i in range(20)]
    assert max(table.column("attempts").to_pylist()) == 2


def test_shares_are_cut_to_what_a_connection_may_hold(tmp_path):
    """A task holds its share in flight on one connection until Spark took its rows, so
    shares are at most `maxRecordsPerPartition`; one larger than the nsqd's --max-rdy-count
    fails saying which option to lower."""
    data = tmp_path / "nsqd"
    data.mkdir()
    daemon = start_nsqd(data, "-max-rdy-count=10")
    tcp, http = daemon.addresses["TCP"], daemon.addresses["HTTP"]
    try:
        fill(http, 25)
        too_large = reader_of(tcp, http, maxRecordsPerPartition="20")
        (first, _second) = too_large.partitions()
        with pytest.raises(ValueError, match="set the option maxRecordsPerPartition to 10 or"):
            list(too_large.read(first))
        reader = reader_of(tcp, http, maxRecordsPerPartition="10", idleTimeout="2s")
        shares = reader.partitions()
        assert [share.expected for share in shares] == [10, 10, 5]
        bodies = [row["body"] for s in shares for b in reader.read(s) for row in b.to_pylist()]
        assert sorted(bodies) == [b"m%02d" % i for i in range(25)]
        poll(lambda: held(http) == (0, 0), lambda: f"all 25 finished: {held(http)}")
    finally:
        daemon.stop()
