"""The log-topic source follows a failover: a replicated cluster (etcd, nsqlookupd, three nsqds;
replicator 3, so the partition stays writable) loses a partition's leader with SIGKILL while a
streaming query reads through nsqlookupd; the query reads the rest from the new leader and the
other replicas, at the same offsets."""

import json
import threading

import pytest

from nsqpy.client.smart import SmartProducer
from nsqpy.spark.log_reader import NSQLogBatchReader, NSQLogStreamReader
from nsqpy.spark.partition_directory import PartitionsUnavailable
from nsqpy.spark.source import SCHEMA
from tests.cluster.etcd_server import EtcdServer
from tests.cluster.local_cluster import LocalCluster
from tests.support.polling import poll

pytestmark = pytest.mark.spark


@pytest.fixture
def cluster(tmp_path):
    with EtcdServer(tmp_path / "etcd") as etcd, LocalCluster(tmp_path, etcd) as running:
        yield running


def test_a_stream_reads_on_through_a_leader_failover(spark, cluster, tmp_path):
    cluster.create_writable_topic("flow", 2, 3, channel="spark-ha")
    lookupd = f"127.0.0.1:{cluster.lookupds[0].port('HTTP')}"
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
            poll(lambda: len(received) >= 100, "the first rows", timeout=60)
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

            poll(read_everything, "every acknowledged message read", timeout=120)
        finally:
            query.stop()
    positions = [(row.partition, row.offset) for row in received]
    assert len(positions) == len(set(positions)), "a position was read twice"
    late = [row for row in received if row.partition == 0 and row.body.startswith(b"after-")]
    assert late and all(row.nsqd != old_http for row in late)
    # The same offsets on every replica: partition 0's rows are contiguous records.
    offsets = sorted(row.offset for row in received if row.partition == 0)
    assert offsets[0] == 0 and len(offsets) == len(set(offsets))


def test_the_first_offsets_wait_for_a_partition_without_a_leader(cluster):
    """A query that starts with `latest` while a partition has no leader (its only replica
    is down) does not take it for a new partition read from its beginning: the first offsets
    wait for its leader, and name it when it does not come back in time."""
    cluster.create_topic("gap", 2, 1)
    lookupd = f"127.0.0.1:{cluster.lookupds[0].port('HTTP')}"
    ends = {}
    for partition in range(2):
        leader = cluster.node_leading("gap", partition)
        for i in range(5):
            reply = leader.http("POST", f"/pub?topic=gap&partition={partition}", b"m%d" % i)
            assert reply.status == 200, reply
        offsets = json.loads(leader.http("GET", "/partition/offsets?topic=gap").body)
        for entry in offsets["partitions"]:
            if entry["partition"] == partition:
                ends[str(partition)] = entry["end"]["offset"]
    assert all(end > 0 for end in ends.values())
    down = cluster.node_leading("gap", 1)
    led_by_down = {p for p in range(2) if cluster.node_leading("gap", p) is down}
    down.kill()

    def listed() -> set[int]:
        reply = cluster.lookupd_http("GET", "/lookup?topic=gap&access=r")
        return {int(p) for p in json.loads(reply.body).get("partitions") or {}}

    poll(lambda: not listed() & led_by_down, "the down node's partitions unlisted")
    options = {"lookupd": lookupd, "topic": "gap", "channel": "q", "startingoffsets": "latest"}
    missing = ", ".join(map(str, sorted(led_by_down)))
    brief = {**options, "fetchtimeout": "1s"}
    with pytest.raises(PartitionsUnavailable, match=f"partition\\(s\\) {missing} of topic 'gap'"):
        NSQLogStreamReader(brief, SCHEMA).initialOffset()
    with pytest.raises(PartitionsUnavailable, match=f"partition\\(s\\) {missing} of topic 'gap'"):
        NSQLogBatchReader(brief, SCHEMA).partitions()

    first: list[dict] = []
    reader = threading.Thread(
        target=lambda: first.append(NSQLogStreamReader(options, SCHEMA).initialOffset())
    )
    reader.start()
    down.start()
    reader.join(timeout=90)
    assert first == [ends]
