"""The control-plane nemesis of tests/cluster/nemesis.py on etcd's members one at a time: its
leader and a follower, each paused (SIGSTOP) and killed (kill -9) past a lease, alone and
followed by the kill -9 of a data node that leads a partition. Writes resume within the lease
+ 2 s of each fault's end, the cluster heals by itself, nothing acknowledged is lost and the
replicas are equal (tests/cluster/nemesis.py says how each is checked)."""

import json

import pytest

from tests.cluster.nemesis import nemesis_cluster


@pytest.mark.parametrize("role", ["leader", "follower"])
def test_an_etcd_member_paused_or_killed_alone_and_then_a_node(tmp_path, etcd_cluster, role):
    with nemesis_cluster(tmp_path, etcd_cluster) as nemesis:
        for fault in (f"etcd_{role}_pause", f"etcd_{role}_kill"):
            for then_kill_node in (False, True):
                nemesis.run(fault, then_kill_node=then_kill_node)
        print("control plane:", json.dumps(nemesis.finish()))
