"""Fixtures of the cluster tests: a real etcd (Debian's etcd-server, `make etcd`) started for
each test on 127.0.0.1 ephemeral ports (~0.2 s), and a client connected to it."""

from collections.abc import AsyncIterator, Iterator

import pytest
import trustme

from nsqpy.etcd import EtcdClient
from tests.cluster.cluster_tls import write_identity
from tests.cluster.etcd_server import EtcdCluster, EtcdServer


@pytest.fixture
def etcd_server(tmp_path) -> Iterator[EtcdServer]:
    """A running etcd with its data and log in the test's `tmp_path`; killed afterwards."""
    with EtcdServer(tmp_path / "etcd") as server:
        yield server


@pytest.fixture
def etcd_cluster(tmp_path) -> Iterator[EtcdCluster]:
    """Three etcd members, one cluster, as production runs etcd; killed afterwards."""
    with EtcdCluster(tmp_path / "etcd-cluster") as cluster:
        yield cluster


@pytest.fixture
async def etcd(etcd_server) -> AsyncIterator[EtcdClient]:
    """An EtcdClient on `etcd_server`, closed after the test."""
    async with EtcdClient([etcd_server.client_url]) as client:
        yield client


@pytest.fixture
def cluster_ca(tmp_path) -> dict:
    """A CA of the test's own and the identity every node of its cluster presents: `ca`,
    `cert` and `key` (files), the `authority` and its `dir`."""
    authority = trustme.CA()
    directory = tmp_path / "cluster-tls"
    directory.mkdir()
    ca = directory / "cluster-ca.pem"
    authority.cert_pem.write_to_path(ca)
    cert, key = write_identity(authority, directory, "nsqd")
    return {"ca": str(ca), "cert": cert, "key": key, "authority": authority, "dir": directory}
