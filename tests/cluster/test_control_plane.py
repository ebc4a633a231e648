"""The control plane (docs/design.md §14, docs/RELIABILITY.md): no daemon exits over its
coordination, each says what changed in one log line, a standby nsqlookupd is master within
the lease and a second when the master dies, stops or loses etcd, and a degraded cluster says
so in `/stats` and `/cluster/stats` while it lasts. (The nemesis, faults under writes:
tests/cluster/test_control_plane_*.py.)"""

import json
import time

import pytest

from tests.cluster.etcd_server import EtcdServer, EtcdTLS
from tests.cluster.local_cluster import LocalCluster
from tests.cluster.proxy import BlackholeProxy
from tests.harness import start_nsqlookupd
from tests.support.http import request
from tests.support.polling import poll

LEASE = 2.0
# Past a lease: what refreshed a lease through the faulted part has lost it meanwhile.
OUTAGE = LEASE + 1.0


def lookupd_stats(lookupd) -> dict:
    reply = request(lookupd.port("HTTP"), "GET", "/stats")
    assert reply.status == 200, reply
    return json.loads(reply.body)


def nsqd_stats(node) -> dict:
    reply = node.http("GET", "/stats?format=json")
    assert reply.status == 200, reply
    return json.loads(reply.body)


def lines_with(process, text: str) -> list[str]:
    return [line for line in process.lines if text in line]


@pytest.mark.parametrize("outage", ["paused", "killed and restarted"])
def test_nsqlookupd_outlives_etcd_away_past_its_lease_and_says_so_once(tmp_path, outage):
    """The reported failure: etcd stopped (SIGSTOP) or killed past nsqlookupd's lease. The
    lease's keeper raised LeaseLost inside the campaign's nursery, which the campaign's
    plain `except` never saw: nsqlookupd exited with a traceback. Now it campaigns again and
    is master once etcd is back, with one line when etcd went and one when it came back."""
    with EtcdServer(tmp_path / "etcd") as etcd:
        lookupd = start_nsqlookupd(
            "-broadcast-address=127.0.0.1",
            f"-cluster-leadership-addresses={etcd.client_url}",
            "-cluster-id=t",
            f"-cluster-node-ttl={LEASE:g}s",
            cwd=tmp_path,
        )
        try:
            poll(lambda: lookupd_stats(lookupd)["is_master"], "the master")
            if outage == "paused":
                etcd.pause()
                time.sleep(OUTAGE)  # the outage itself
                etcd.resume()
            else:
                etcd.kill()
                time.sleep(OUTAGE)
                etcd.start()
            poll(
                lambda: lookupd.process.poll() is not None or lookupd_stats(lookupd)["is_master"],
                "the master again",
            )
            assert lookupd.process.poll() is None, lookupd.log
            poll(lambda: lookupd_stats(lookupd)["control_plane"]["healthy"], "healthy again")
            assert len(lines_with(lookupd, "this nsqlookupd is the master")) >= 2, lookupd.log
            assert not lines_with(lookupd, "Traceback"), lookupd.log
            # A line when etcd went and one when it came back, not one a retry (the campaign
            # retries every 0.2 s): a loaded etcd may be late once more as it comes back,
            # which is a change of state of its own.
            went = lines_with(lookupd, "CLUSTER: etcd unreachable -")
            back = lines_with(lookupd, "etcd unreachable no more")
            assert 1 <= len(went) == len(back) <= 3, lookupd.log
            assert 1 <= len(lines_with(lookupd, "etcd lease lost -")) <= 2, lookupd.log
            assert len(lines_with(lookupd, "campaign stopped")) <= 3, lookupd.log
        finally:
            lookupd.kill()


def standby_cluster(tmp_path, etcd, **options) -> LocalCluster:
    return LocalCluster(tmp_path, etcd, lookupds=2, ttl=LEASE, **options)


def timed_takeover(cluster: LocalCluster, old: int) -> float:
    """Seconds until the other nsqlookupd says it is the master."""
    other = 1 - old
    started = time.monotonic()
    poll(lambda: cluster.stats(other)["is_master"], "the standby the master", timeout=30)
    return time.monotonic() - started


@pytest.mark.parametrize("fault", ["killed", "stopped", "cut off from etcd"])
def test_a_standby_is_master_within_the_lease_and_a_second(tmp_path, etcd_server, fault):
    """The master nsqlookupd killed (kill -9), stopped (SIGSTOP) or cut off from etcd: the
    standby is master within the lease + 1 s, elects for a node that then dies, and the old
    master, back, is a standby."""
    proxies = [BlackholeProxy(("127.0.0.1", etcd_server.client_port)) for _ in range(2)]
    urls = {index: f"http://{proxy.address}" for index, proxy in enumerate(proxies)}
    try:
        with standby_cluster(tmp_path, etcd_server, lookupd_etcd_urls=urls) as cluster:
            cluster.create_writable_topic("t", 1, 3)
            old = poll(lambda: (index := cluster.master_index()) is not None and (index,))[0]
            if fault == "killed":
                cluster.kill_lookupd(old)
            elif fault == "stopped":
                cluster.pause_lookupd(old)
            else:
                proxies[old].blackhole()
            took = timed_takeover(cluster, old)
            assert took <= LEASE + 1.0, f"the standby took {took:.2f} s"
            # The new master carries on: the leader's death is its election to make.
            leader = cluster.node_leading("t", 0)
            leader.kill()
            poll(lambda: cluster.node_leading("t", 0) not in (None, leader), "a new leader")
            if fault == "killed":
                cluster.restart_lookupd(old)
            elif fault == "stopped":
                cluster.resume_lookupd(old)
            else:
                proxies[old].heal()
            poll(
                lambda: cluster.stats(old)["master"] == cluster.stats(1 - old)["master"],
                "the old master following the new one",
            )
            assert cluster.stats(1 - old)["is_master"] and not cluster.stats(old)["is_master"]
            assert cluster.lookupds[old].process.poll() is None, cluster.lookupds[old].log
    finally:
        for proxy in proxies:
            proxy.close()


def test_every_nodes_lease_revoked_at_once_moves_no_partition(tmp_path, etcd_server):
    """etcd 3.4.23 revokes every lease when a paused leader runs again (etcd-io/etcd#15247):
    every node's key goes at once while every node lives. The master asks the nodes (they
    answer), each registers again on its next refresh, and no partition moves; the nodes say
    they lost their lease and got it back."""
    with LocalCluster(tmp_path, etcd_server, ttl=LEASE) as cluster:
        cluster.create_writable_topic("t", 3, 3)

        def placement() -> dict:
            return {
                (entry["topic"], entry["partition"]): (
                    entry["leader"],
                    sorted(entry["isr"]),
                    entry["write_epoch"],
                )
                for entry in cluster.stats()["partitions"]
            }

        before = placement()
        passes = cluster.stats()["control_plane"]["elections"]["passes"]
        leases = etcd_server.leases_under("/NSQMetaData/test/NsqdNodes/")
        assert len(leases) == 3
        for lease in leases:
            etcd_server.revoke(lease)
        poll(
            lambda: (
                len(set(etcd_server.leases_under("/NSQMetaData/test/NsqdNodes/")) - set(leases))
                == 3
            ),
            "every node registered again on a new lease",
        )
        assert placement() == before
        assert cluster.stats()["control_plane"]["elections"]["passes"] == passes
        for node in cluster.nodes:
            assert lines_with(node.process, "this nsqd's etcd lease lost -"), node.process.log
            assert lines_with(node.process, "lease lost no more"), node.process.log


def test_a_degraded_control_plane_says_so_while_it_lasts(tmp_path, etcd_server):
    """etcd unreachable, no master nsqlookupd, a node whose lease is lost: each in nsqd's
    and nsqlookupd's `/stats` and in `/cluster/stats` while it lasts, gone once it is over."""
    with LocalCluster(tmp_path, etcd_server, ttl=LEASE) as cluster:
        # Replicas on every node: a node whose lease is lost is a partition's missing replica.
        cluster.create_topic("t", 1, 3)
        node = cluster.nodes[0]
        lookupd = cluster.lookupds[0]
        assert nsqd_stats(node)["control_plane"]["healthy"]
        assert cluster.stats()["control_plane"]["healthy"]

        # A node frozen past its lease: the master lists it, and it says so itself, awake.
        frozen = cluster.nodes[1]
        frozen.pause()
        try:
            lost = poll(
                lambda: cluster.stats()["control_plane"]["nodes_lease_lost"],
                "the frozen node's lease lost, as the master sees it",
            )
            assert [entry["node"] for entry in lost] == [frozen.node_id]
            assert lost[0]["state"] == "not answering"
            problems = cluster.stats()["control_plane"]["problems"]
            assert any(f"node {frozen.node_id}: its lease is lost" in p for p in problems)
        finally:
            frozen.resume()
        poll(lambda: not cluster.stats()["control_plane"]["nodes_lease_lost"], "it back")
        assert lines_with(frozen.process, "this nsqd's etcd lease lost -")
        poll(lambda: nsqd_stats(frozen)["control_plane"]["healthy"], "the node healthy again")

        # etcd away: every daemon says since when.
        etcd_server.pause()
        try:
            down = poll(
                lambda: nsqd_stats(node)["control_plane"]["etcd"]["unreachable_since"],
                "nsqd: etcd unreachable",
            )
            assert down.endswith("Z")
            problems = nsqd_stats(node)["control_plane"]["problems"]
            assert any(problem.startswith("etcd unreachable since ") for problem in problems)
            poll(
                lambda: lookupd_stats(lookupd)["control_plane"]["etcd"]["unreachable_since"],
                "nsqlookupd: etcd unreachable",
            )
            assert cluster.stats()["control_plane"]["etcd"]["reachable"] is False
        finally:
            etcd_server.resume()
        poll(lambda: nsqd_stats(node)["control_plane"]["healthy"], "nsqd healthy again")
        poll(lambda: cluster.stats()["control_plane"]["healthy"], "nsqlookupd healthy again")

        # No master: the only nsqlookupd killed; the nodes say since when.
        cluster.kill_lookupd(0)
        since = poll(
            lambda: nsqd_stats(node)["control_plane"]["no_master_since"],
            "nsqd: no master",
            timeout=LEASE + 10,
        )
        assert any(
            problem.startswith(f"no master nsqlookupd since {since}")
            for problem in nsqd_stats(node)["control_plane"]["problems"]
        )
        cluster.restart_lookupd(0)
        poll(lambda: not nsqd_stats(node)["control_plane"]["no_master_since"], "a master again")
        assert len(lines_with(node.process, "CLUSTER: no master nsqlookupd -")) <= 1
        assert lines_with(node.process, "no master nsqlookupd no more")


def test_a_cluster_on_etcd_whose_auth_tokens_expire_each_second(tmp_path):
    """etcd's simple tokens live 1 s here (`--auth-token-ttl=1`): every daemon renews its
    token when etcd refuses it, and the cluster keeps electing."""

    tls = EtcdTLS.make(tmp_path / "etcd-tls")
    with EtcdServer(tmp_path / "etcd", tls=tls, extra_args=("--auth-token-ttl=1",)) as etcd:
        etcd.enable_auth("root", "s3cret")
        flags = tls.daemon_flags("s3cret")
        with LocalCluster(
            tmp_path, etcd, ttl=LEASE, nsqd_args=flags, lookupd_args=flags
        ) as cluster:
            cluster.create_topic("t", 1, 3)
            time.sleep(3)  # three tokens' lives
            old = cluster.node_leading("t", 0)
            old.kill()
            poll(lambda: cluster.node_leading("t", 0) not in (None, old), "a failover")
            old.start()
            poll(lambda: cluster.stats()["control_plane"]["healthy"], "the killed node back")
            for process in [*cluster.lookupds, *(node.process for node in cluster.nodes)]:
                assert not lines_with(process, "Traceback"), process.log
                assert not lines_with(process, "cannot register"), process.log
