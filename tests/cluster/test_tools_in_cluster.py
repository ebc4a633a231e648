"""The utilities on a replicated cluster, through the smart client (docs/client.md):
`to_nsq --lookupd-http-address` spreads stdin over a partitioned topic's leaders, `nsq_tail
--partitioned` reads every partition; both follow a leader that moves."""

import json
import subprocess

import pytest

from tests.cluster.local_cluster import LocalCluster
from tests.harness import BIN


@pytest.fixture
def cluster(tmp_path, etcd_server):
    with LocalCluster(tmp_path, etcd_server) as running:
        yield running


def messages_on(node, topic: str, partition: int) -> int:
    reply = node.http("GET", f"/partition/offsets?topic={topic}")
    for entry in json.loads(reply.body)["partitions"]:
        if entry["partition"] == partition:
            return entry["end"]["count"]
    return 0


def test_to_nsq_and_nsq_tail_use_every_partitions_leader(cluster):
    cluster.create_writable_topic("t", 2, 2)
    lookupd = f"127.0.0.1:{cluster.lookupds[0].port('HTTP')}"
    lines = [b"line %d" % i for i in range(20)]
    published = subprocess.run(
        [str(BIN / "to_nsq"), "-topic=t", f"-lookupd-http-address={lookupd}"],
        input=b"\n".join(lines) + b"\n",
        capture_output=True,
        timeout=60,
    )
    assert published.returncode == 0, published.stderr
    counts = [messages_on(cluster.node_leading("t", p), "t", p) for p in range(2)]
    assert counts == [10, 10]
    tail = subprocess.run(
        [
            str(BIN / "nsq_tail"),
            "-topic=t",
            "-channel=c",
            "-partitioned",
            f"-lookupd-http-address={lookupd}",
            "-n=20",
        ],
        capture_output=True,
        timeout=60,
    )
    assert tail.returncode == 0, tail.stderr
    assert sorted(tail.stdout.splitlines()) == sorted(lines)


def test_tools_refuse_a_partitioned_tail_without_nsqlookupd():
    tail = subprocess.run(
        [str(BIN / "nsq_tail"), "-topic=t", "-partitioned", "-nsqd-tcp-address=127.0.0.1:1"],
        capture_output=True,
        timeout=30,
    )
    assert tail.returncode != 0
    assert b"--partitioned needs --lookupd-http-address" in tail.stderr
