"""The sink on partitioned topics: with `lookupd`, rows go over TCP MPUB to the partitions'
leaders through the smart client; with `nsqd_http`, to `/mpub?partition=`; by key when the rows
have a `key` column, else round-robin.

nsqlookupd and one nsqd run as subprocesses; the topics are created with Youzan's
`POST /topic/create?partition_num=4` on nsqlookupd (no etcd), and their channel on every
partition first, since nsqlookupd lists a partition to writers only once it has one.
"""

import pytest
from pyspark.sql import functions as F

from nsqpy.client.smart import SmartConsumer, partition_for_key
from tests.harness import create_partitioned_topic
from tests.spark.support import partition_counts, standalone_lookupd_and_nsqd

pytestmark = pytest.mark.spark

PARTITIONS = 4


@pytest.fixture
def cluster(tmp_path):
    """(nsqlookupd HTTP, nsqd HTTP), the nsqd registered with the nsqlookupd."""
    with standalone_lookupd_and_nsqd(tmp_path) as addresses:
        yield addresses


def test_keyed_rows_go_to_their_partition_in_order(spark, cluster):
    lookupd_http, nsqd_http = cluster
    create_partitioned_topic(
        lookupd_http, nsqd_http, "orders", PARTITIONS, "c", orderedmulti="true"
    )
    # Two Spark partitions holding ids 0-199 and 200-399; seven keys in both.
    rows = spark.range(400, numPartitions=2).select(
        F.format_string("k%d", F.col("id") % 7).alias("key"),
        F.format_string("k%d %d", F.col("id") % 7, "id").alias("body"),
    )
    (
        rows.write.format("nsq")
        .option("lookupd", lookupd_http)
        .option("topic", "orders")
        .option("publishChunk", "16")
        .mode("append")
        .save()
    )
    assert sum(partition_counts(nsqd_http, "orders").values()) == 400

    with SmartConsumer([lookupd_http], "orders", "c", max_in_flight=8) as consumer:
        messages = consumer.receive_many(400, timeout=30, finish=True)
    assert len(messages) == 400
    ids_by_key: dict[str, list[int]] = {}
    for message in messages:
        key, number = message.body.decode().split()
        assert message.partition == partition_for_key(key, PARTITIONS)
        ids_by_key.setdefault(key, []).append(int(number))
    assert sorted(i for ids in ids_by_key.values() for i in ids) == list(range(400))
    # An ordered topic hands each partition's messages out in the order they were stored:
    # each Spark partition's rows of a key kept theirs.
    for ids in ids_by_key.values():
        for spark_partition in (range(0, 200), range(200, 400)):
            mine = [i for i in ids if i in spark_partition]
            assert mine == sorted(mine)


@pytest.mark.parametrize("through", ["lookupd", "nsqd_http"])
def test_rows_without_a_key_are_spread_over_the_partitions(spark, cluster, through):
    """Through lookupd, the smart client's round-robin; through an nsqd, `/mpub?partition=`."""
    lookupd_http, nsqd_http = cluster
    create_partitioned_topic(lookupd_http, nsqd_http, "spread", PARTITIONS, "c")
    (
        spark.range(400, numPartitions=2)
        .select(F.col("id").cast("string").alias("body"))
        .write.format("nsq")
        .option(through, lookupd_http if through == "lookupd" else nsqd_http)
        .option("topic", "spread")
        .option("publishChunk", "25")
        .mode("append")
        .save()
    )
    counts = partition_counts(nsqd_http, "spread")
    assert sum(counts.values()) == 400 and all(counts.values()), counts


def test_a_write_into_partitions_without_a_channel_fails_at_once_saying_what_to_do(spark, cluster):
    """nsqlookupd lists a new topic's partitions to writers only once they have a channel:
    the sink says so, and how to proceed, instead of retrying until its deadline."""
    lookupd_http, nsqd_http = cluster
    create_partitioned_topic(lookupd_http, nsqd_http, "fresh", PARTITIONS, None)
    write = (
        spark.range(10, numPartitions=1)
        .select(F.col("id").cast("string").alias("body"))
        .write.format("nsq")
        .option("lookupd", lookupd_http)
        .option("topic", "fresh")
        .mode("append")
    )
    with pytest.raises(Exception, match="create one first .*--allow-write-with-nochannels"):
        write.save()
    assert sum(partition_counts(nsqd_http, "fresh").values()) == 0
