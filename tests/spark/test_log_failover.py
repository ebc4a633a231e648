"""The log-topic source follows a failover: a replicated cluster (etcd, nsqlookupd, three nsqds;
replicator 3, so the partition stays writable) loses a partition's leader with SIGKILL while a
streaming query reads through nsqlookupd; the query reads the rest from the new leader and the
other replicas, at the same offsets."""

import json
import threading

import pytest

from common.smart_client import SmartProducer
from tests.cluster.etcd_server import EtcdServer
from tests.cluster.local_cluster import LocalCluster, wait_for

pytestmark = pytest.mark.spark


@pytest.fixture
def cluster(tmp_path):
    with EtcdServer(tmp_path / "etcd") as etcd, LocalCluster(tmp_path, etcd) as running:
        yield running


def test_a_stream_reads_on_through_a_leader_failover(spark, cluster, tmp_path):
    cluster.create_topic("flow", 2, 3)
    lookupd = f"127.0.0.1:{cluster.lookupds[0].port('HTTP')}"
    # nsqlookupd lists a partition for writers once it has a channel.
    for partition in range(2):
        leader = cluster.node_leading("flow", partition)
        target = f"/channel/create?topic=flow&channel=spark-ha&partition={partition}"
        assert leader.http("POST", target).status == 200

    def writable() -> bool:
        reply = cluster.lookupd_http("GET", "/lookup?topic=flow&access=w")
        return reply.status == 200 and len(json.loads(reply.body).get("partitions") or {}) == 2

    wait_for(writable, "both partitions writable")
    acknowledged: list[bytes] = []
    with SmartProducer(lookupd, publish_timeout=30) as producer:
        for i in range(400):
            body = b"before-%04d" % i
            producer.publish("flow", body, partition=i % 2)
            acknowledged.append(body)

        received: list = []
        lock = threading.Lock()

        def collect(batch, _batch_id) -> None:
            rows = batch.collect()
            with lock:
                received.extend(rows)

        query = (
            spark.readStream.format("nsq")
            .option("lookupd", lookupd)
            .option("topic", "flow")
            .option("channel", "spark-ha")
            .option("startingOffsets", "earliest")
            .option("maxOffsetsPerTrigger", "100")
            .load()
            .writeStream.foreachBatch(collect)
            .option("checkpointLocation", str(tmp_path / "checkpoint"))
            .trigger(processingTime="0 seconds")
            .start()
        )
        try:
            wait_for(lambda: len(received) >= 100, "the first rows", timeout=60)
            old_leader = cluster.node_leading("flow", 0)
            old_http = f"127.0.0.1:{old_leader.http_port}"
            old_leader.kill()
            for i in range(200):
                body = b"after-%04d" % i
                producer.publish("flow", body, partition=i % 2)
                acknowledged.append(body)

            def read_everything() -> bool:
                assert query.exception() is None, query.exception()
                with lock:
                    bodies = {bytes(row.body) for row in received}
                return bodies >= set(acknowledged)

            wait_for(read_everything, "every acknowledged message read", timeout=120)
        finally:
            query.stop()
    positions = [(row.partition, row.offset) for row in received]
    assert len(positions) == len(set(positions)), "a position was read twice"
    late = [row for row in received if row.partition == 0 and row.body.startswith(b"after-")]
    assert late and all(row.nsqd != old_http for row in late)
    # The same offsets on every replica: partition 0's rows are contiguous records.
    offsets = sorted(row.offset for row in received if row.partition == 0)
    assert offsets[0] == 0 and len(offsets) == len(set(offsets))
