"""NSQ log topic → Spark → NSQ log topic on a replicated cluster (etcd, nsqlookupd, three
nsqds; both topics of 2 partitions with replicator 3): while a streaming query carries "in"
into "out" through the exactly-once sink, the leader of an input partition is killed with
SIGKILL in the middle of a micro-batch (and started again), then the leader of an output
partition, then the driver while a batch is partly published; the query finishes from its
checkpoint. "out" stores each input
message exactly once, compared by the input message's ID and body."""

import json
import signal
from collections import Counter

import pytest

from nsqpy.client.smart import SmartConsumer, SmartProducer
from tests.cluster.etcd_server import EtcdServer
from tests.cluster.local_cluster import LocalCluster
from tests.spark.exactly_once_sink_driver import start_query
from tests.spark.support import (
    SINK_DRIVER,
    batch_logs,
    hold_after_publishing,
    start_driver,
    wait_mid_batch,
)
from tests.support.polling import poll

pytestmark = pytest.mark.spark

PARTITIONS = 2
REPLICAS = 3


@pytest.fixture
def cluster(tmp_path):
    with EtcdServer(tmp_path / "etcd") as etcd, LocalCluster(tmp_path, etcd) as running:
        yield running


def prepare(cluster: LocalCluster) -> str:
    """Topics "in" (channel "check", the test's own reading) and "out" (channel "c", so
    nsqlookupd lists it to writers); nsqlookupd's HTTP address."""
    cluster.create_writable_topic("in", PARTITIONS, REPLICAS, channel="check")
    cluster.create_writable_topic("out", PARTITIONS, REPLICAS, channel="c")
    return f"127.0.0.1:{cluster.lookupds[0].port('HTTP')}"


def publish(producer: SmartProducer, first: int, count: int) -> None:
    for number in range(first, first + count, 50):
        bodies = [b"row-%05d" % n for n in range(number, min(number + 50, first + count))]
        producer.multi_publish("in", bodies, partition=number // 50 % PARTITIONS)


def kill_leader(cluster: LocalCluster, topic: str) -> None:
    """SIGKILL the leader of `topic`'s partition 0; once another node leads it, start the
    killed one again and wait for every ISR to be whole."""
    leader = cluster.node_leading(topic, 0)
    leader.kill()
    poll(lambda: cluster.node_leading(topic, 0) not in (None, leader), f"a new leader of {topic}")
    leader.start()
    for name in ("in", "out"):
        for partition in range(PARTITIONS):
            poll(
                lambda n=name, p=partition: len(cluster.partition(n, p)["isr"]) == REPLICAS,
                f"{name}/{partition}'s ISR whole",
                timeout=60,
            )


def read_all(lookupd: str, topic: str, channel: str, count: int) -> list:
    """Every distinct message of `topic` through `channel` (a failover may deliver one again),
    once `count` distinct ones came."""
    seen: dict[bytes, object] = {}
    with SmartConsumer([lookupd], topic, channel, max_in_flight=200) as consumer:

        def complete() -> bool:
            for message in consumer.receive_many(200, timeout=1, finish=True):
                seen[message.id] = message
            return len(seen) >= count

        poll(complete, f"{count} messages of {topic}", timeout=90)
    return list(seen.values())


def stored_counts(cluster: LocalCluster, topic: str) -> dict[int, int]:
    """How many messages each partition's log holds, by its leader's committed end."""
    counts = {}
    for partition in range(PARTITIONS):
        leader = poll(lambda p=partition: cluster.node_leading(topic, p), f"{topic}'s leader")
        reply = leader.http("GET", f"/partition/offsets?topic={topic}&partition={partition}")
        (entry,) = json.loads(reply.body)["partitions"]
        counts[partition] = entry["end"]["count"] - entry["start"]["count"]
    return counts


def test_leader_and_driver_kills_leave_each_input_message_once_in_the_output(
    cluster, spark, tmp_path
):
    lookupd = prepare(cluster)
    checkpoint, hold = tmp_path / "ck", tmp_path / "hold"
    arguments = [str(SINK_DRIVER), lookupd, str(checkpoint), str(hold), "local[2,3]"]
    with SmartProducer(lookupd, publish_timeout=30) as producer:
        publish(producer, 0, 1200)
        driver = start_driver([*arguments, "continuous", "id-body"])
        try:
            wait_mid_batch(checkpoint, after=2)
            kill_leader(cluster, "in")
            publish(producer, 1200, 600)
            wait_mid_batch(checkpoint, after=len(batch_logs(checkpoint)[1]) + 1)
            kill_leader(cluster, "out")
            publish(producer, 1800, 600)
            # A task of the next batch publishes part of its rows and waits: the driver is
            # killed with a batch partly written and not committed.
            hold_after_publishing(hold)
            driver.send_signal(signal.SIGKILL)
        finally:
            driver.kill()
            output, _ = driver.communicate(timeout=30)
    planned, done = batch_logs(checkpoint)
    assert len(planned) > len(done), "the driver was killed between batches"

    # The query again from its checkpoint, in the tests' session (without another JVM to
    # start), its Arrow batches as small as the driver's.
    spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", "100")
    try:
        rerun = start_query(spark, lookupd, str(checkpoint), str(hold), "available-now", "id-body")
        assert rerun.awaitTermination(240), "the query did not drain the topic in 240 s"
        assert rerun.exception() is None, output[-3000:] + str(rerun.exception())
    finally:
        spark.conf.unset("spark.sql.execution.arrow.maxRecordsPerBatch")

    inputs = read_all(lookupd, "in", "check", 2400)
    assert sorted(message.body for message in inputs) == [b"row-%05d" % n for n in range(2400)]
    # The smart consumer speaks Youzan's binary IDs, [8 record id][8 trace id]; the source's
    # "id" is the record ID in hex.
    expected = Counter(message.id[:8].hex().encode() + b" " + message.body for message in inputs)
    counts = stored_counts(cluster, "out")
    assert sum(counts.values()) == 2400, f"stored twice or lost: {counts}"
    outputs = read_all(lookupd, "out", "c", 2400)
    assert Counter(message.body for message in outputs) == expected
