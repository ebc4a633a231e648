"""A live cluster shared by the nsqadmin tests: nsqlookupd, two nsqd, nsqadmin. Each test
works on topics of its own, so that the tests do not see each other's actions. Tests of
replicated topics get a cluster-mode cluster of their own (`replicated`): they kill nodes."""

import itertools

import pytest

from tests.cluster.etcd_server import EtcdServer
from tests.cluster.local_cluster import LocalCluster
from tests.harness import start_nsqlookupd
from tests.nsqadmin.support import (
    Cluster,
    ReplicatedCluster,
    start_cluster_nsqd,
    start_nsqadmin,
)

_names = itertools.count(1)


@pytest.fixture(scope="session")
def cluster(tmp_path_factory) -> Cluster:
    data = tmp_path_factory.mktemp("nsqadmin-cluster")
    lookupd = start_nsqlookupd()
    # The second nsqd runs as two worker processes (`--workers=2`): nsqadmin sees one nsqd.
    nsqds = [
        start_cluster_nsqd(data / "nsqd1", lookupd),
        start_cluster_nsqd(data / "nsqd2", lookupd, "-workers=2"),
    ]
    admin = start_nsqadmin(f"-lookupd-http-address=127.0.0.1:{lookupd.port('HTTP')}")
    running = Cluster(lookupd, nsqds, admin)
    yield running
    running.stop()


@pytest.fixture
def topic_name(request) -> str:
    """A topic name no other test uses."""
    return f"t{next(_names)}-{request.node.name[:30].replace('[', '-').replace(']', '')}"


@pytest.fixture
def replicated(tmp_path) -> ReplicatedCluster:
    """etcd, one nsqlookupd and three nsqd in cluster mode, and an nsqadmin asking the
    nsqlookupd; all killed afterwards. Balancing is off: the only moves are the ones a test
    makes, so what the master shows after one is that move's outcome."""
    with (
        EtcdServer(tmp_path / "etcd") as etcd,
        LocalCluster(tmp_path, etcd, lookupd_args=("-balance-interval=off",)) as local,
    ):
        admin = start_nsqadmin(f"-lookupd-http-address=127.0.0.1:{local.lookupds[0].port('HTTP')}")
        try:
            yield ReplicatedCluster(local, admin)
        finally:
            admin.stop()
