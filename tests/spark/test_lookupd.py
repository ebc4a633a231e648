"""Discovery through nsqlookupd: one connection per nsqd carrying the topic, and a sink that
spreads partitions over the registered nsqds."""

import pytest
from pyspark.sql import functions as F

from nsqpy.client.blocking import http_publish
from nsqpy.spark.options import lookupd_producers
from tests.harness import start_nsqd, start_nsqlookupd
from tests.spark.support import MSG_TIMEOUT, collect_available_now
from tests.support.polling import poll
from tests.support.stats import topic_stats

pytestmark = pytest.mark.spark


@pytest.fixture
def cluster(tmp_path):
    lookupd = start_nsqlookupd()
    nsqds = []
    try:
        for index in range(2):
            data = tmp_path / f"nsqd{index}"
            data.mkdir()
            nsqds.append(
                start_nsqd(
                    data,
                    f"-lookupd-tcp-address={lookupd.addresses['TCP']}",
                    "-broadcast-address=127.0.0.1",
                    f"-msg-timeout={MSG_TIMEOUT}",
                )
            )
        yield lookupd, nsqds
    finally:
        for daemon in [*nsqds, lookupd]:
            daemon.stop()


def test_lookupd_reader_and_writer_use_every_nsqd(spark, cluster, tmp_path):
    lookupd, nsqds = cluster
    lookupd_http = lookupd.addresses["HTTP"]
    expected = set()
    for index, nsqd in enumerate(nsqds):
        bodies = [f"nsqd{index}-{i}".encode() for i in range(30)]
        http_publish(nsqd.addresses["HTTP"], "spread", bodies)
        expected.update(bodies)
    poll(
        lambda: len(lookupd_producers([lookupd_http], "spread")) == 2,
        "both nsqds registered with lookupd",
    )
    stream = (
        spark.readStream.format("nsq")
        .option("lookupd", lookupd_http)
        .option("topic", "spread")
        .option("channel", "spark")
        .option("idleTimeout", "10s")
        .load()
    )
    received = collect_available_now(stream, tmp_path / "checkpoint")
    assert {bytes(row.body) for row in received} == expected
    assert {row.nsqd for row in received} == {n.addresses["TCP"] for n in nsqds}

    (
        spark.range(100, numPartitions=2)
        .select(F.col("id").cast("string").alias("body"))
        .write.format("nsq")
        .option("lookupd", lookupd_http)
        .option("topic", "gathered")
        .mode("append")
        .save()
    )
    counts = [topic_stats(n.addresses["HTTP"], "gathered")["message_count"] for n in nsqds]
    assert sum(counts) == 100 and all(counts), counts
