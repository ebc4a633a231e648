"""The control-plane nemesis of tests/cluster/nemesis.py on all of etcd at once (paused, killed)
and on the master nsqlookupd (paused, killed: the standby becomes master within the lease and
carries on the elections), alone and followed by the kill -9 of a data node that leads a
partition. Writes resume within the lease + 2 s of each fault's end, the cluster heals by
itself, nothing acknowledged is lost and the replicas are equal."""

import json

import pytest

from tests.cluster.nemesis import nemesis_cluster


@pytest.mark.parametrize("target", ["etcd_all", "master"])
def test_all_of_etcd_or_the_master_paused_or_killed_alone_and_then_a_node(
    tmp_path, etcd_cluster, target
):
    with nemesis_cluster(tmp_path, etcd_cluster) as nemesis:
        for fault in (f"{target}_pause", f"{target}_kill"):
            for then_kill_node in (False, True):
                nemesis.run(fault, then_kill_node=then_kill_node)
        print("control plane:", json.dumps(nemesis.finish()))
