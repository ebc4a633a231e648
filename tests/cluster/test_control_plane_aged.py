"""The control-plane nemesis of tests/cluster/nemesis.py on an aged topic (retention has run on
every replica: each log starts past offset 0) with every nsqd at `-workers=2`: the etcd
leader killed, all of etcd paused, the master nsqlookupd killed, each followed by the kill -9
of a data node that leads a partition."""

import json

from tests.cluster.aging import AGED_NSQD_ARGS, age_topic
from tests.cluster.local_cluster import SUITE_NSQD_ARGS
from tests.cluster.nemesis import PARTITIONS, TOPIC, nemesis_cluster

# `make test-cluster-workers` gives every node -workers=2 already.
NSQD_ARGS = (*AGED_NSQD_ARGS, *(() if SUITE_NSQD_ARGS else ("-workers=2",)))


def aged(cluster) -> None:
    for partition in range(PARTITIONS):
        assert age_topic(cluster, TOPIC, partition) > 0


def test_the_control_plane_faulted_on_an_aged_topic_with_two_workers(tmp_path, etcd_cluster):
    with nemesis_cluster(tmp_path, etcd_cluster, nsqd_args=NSQD_ARGS, prepare=aged) as nemesis:
        for fault in ("etcd_leader_kill", "etcd_all_pause", "master_kill"):
            nemesis.run(fault, then_kill_node=True)
        print("control plane:", json.dumps(nemesis.finish()))
