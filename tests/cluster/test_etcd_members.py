"""nsqpy/etcd.py against a real 3-member etcd (tests/cluster/etcd_server.py's `EtcdCluster`): a
member paused, killed or cut from the others is left for the ones that answer, by every call,
by a watch (which misses and repeats nothing) and by a lease's refresh; a leader change keeps
leases; the client's health says what is wrong while it lasts, once at each change; and the
transactions the control plane builds on (a campaign whose answer was lost, a batch of
compare-and-swaps with the failure branch's reads)."""

import pytest
import trio

from nsqpy.etcd import (
    MAX_TXN_OPS,
    Compare,
    EtcdClient,
    EtcdUnavailable,
    keep_lease_alive,
    put_op,
    range_op,
)
from tests.cluster.etcd_server import summary

LEASE_TTL = 5


def client_of(cluster, **options) -> EtcdClient:
    return EtcdClient(cluster.client_urls.split(","), timeout=5, **options)


def preferring(client: EtcdClient, member, cluster) -> None:
    """Make `member` the endpoint the client tries first (the one that answered last)."""
    client._preferred = cluster.members.index(member)


async def test_a_call_leaves_a_paused_member_after_an_attempts_timeout(etcd_cluster):
    """A call to a paused member gives it one attempt's budget (0.5 s here, where the call
    has 5 s) and goes on to another, which answers: for a paused follower at once, for a
    paused leader once the others have elected one (etcd's own time, bounded only to fail)."""
    async with client_of(etcd_cluster, attempt_timeout=0.5) as client:
        await client.put("k", "v")
        for member in etcd_cluster.members:
            preferring(client, member, etcd_cluster)
            member.pause()
            try:
                with trio.fail_after(30):
                    while True:
                        try:
                            await client.put("k", member.name)
                            break
                        except EtcdUnavailable:
                            continue  # the others are electing a leader
                assert (await client.get("k")).value == member.name.encode()
                assert client._endpoints[client._preferred].url != member.client_url
                since, error = client.health.failing[member.client_url]
                assert error == "no answer within 0.5 s", error
            finally:
                member.resume()


async def test_a_watch_moves_off_a_paused_member_and_misses_nothing(etcd_cluster):
    async with client_of(etcd_cluster) as client:
        revision = await client.put("w/0", "0")
        for number, member in enumerate(etcd_cluster.members, start=1):
            preferring(client, member, etcd_cluster)
            async with client.watch_prefix("w/", revision + 1) as watch:
                await watch.open()
                assert watch._index == etcd_cluster.members.index(member)
                member.pause()
                try:
                    # Written through the others while the watch's member stands still.
                    others = EtcdClient(
                        [m.client_url for m in etcd_cluster.members if m is not member]
                    )
                    async with others:
                        with trio.fail_after(10):
                            while True:
                                try:
                                    # A put that timed out may be applied too (twice, then).
                                    written = await others.put(f"w/{number}", str(number))
                                    break
                                except EtcdUnavailable:
                                    continue  # the others are electing a leader
                    events = []
                    with trio.fail_after(10):
                        while not events or events[-1].kv.mod_revision < written:
                            events.append(await anext(watch))
                    # A put of an earlier round that timed out may land late: it is a put too.
                    expected = {("PUT", f"w/{n}", str(n).encode()) for n in range(number + 1)}
                    assert ("PUT", f"w/{number}", str(number).encode()) in summary(events)
                    assert set(summary(events)) <= expected
                    assert watch._index != etcd_cluster.members.index(member)
                    revision = events[-1].kv.mod_revision
                finally:
                    member.resume()


async def test_a_lease_outlives_the_loss_of_its_etcd_leader_and_a_paused_follower(etcd_cluster):
    """The members left elect a leader, which keeps every lease (etcd's lessor promotion), and
    the refresh finds it: the lease's key stays. (A *paused* leader is another matter on
    etcd 3.4.23: when it runs again it revokes every lease its own clock says expired,
    etcd-io/etcd#15247, fixed in 3.4.28; the daemons take that as a lost lease and register
    again, tests/cluster/test_control_plane.py.)"""
    async with client_of(etcd_cluster, attempt_timeout=0.4) as client:
        # A refresh may have to wait out the election, which a loaded machine can make long.
        lease = await client.grant_lease(LEASE_TTL)
        await client.put("held", "yes", lease=lease)
        async with trio.open_nursery() as nursery:
            await nursery.start(keep_lease_alive, client, lease, LEASE_TTL)
            for fault in ("kill", "pause a follower"):
                leader = await trio.to_thread.run_sync(etcd_cluster.leader)
                if fault == "kill":
                    preferring(client, leader, etcd_cluster)
                    leader.kill()
                    await trio.sleep(LEASE_TTL + 1)  # the lease lives only if refreshed
                    await trio.to_thread.run_sync(leader.restart)
                else:
                    follower = next(m for m in etcd_cluster.members if m is not leader)
                    preferring(client, follower, etcd_cluster)
                    follower.pause()
                    await trio.sleep(LEASE_TTL + 1)
                    follower.resume()
                assert (await client.get("held")).lease == lease, fault
            nursery.cancel_scope.cancel()


async def test_health_says_once_when_etcd_stops_answering_and_once_when_it_is_back(etcd_cluster):
    changes = []
    async with client_of(etcd_cluster, attempt_timeout=0.2) as client:
        client.timeout = 1.0
        client.health.on_change = lambda health: changes.append((health.reachable, health.error))
        await client.put("k", "v")
        assert client.health.to_json()["unreachable_since"] is None
        etcd_cluster.pause_all()
        try:
            for _ in range(3):
                with pytest.raises(EtcdUnavailable):
                    await client.get("k")
            state = client.health.to_json()
            assert state["reachable"] is False and state["unreachable_since"]
            assert {failing["endpoint"] for failing in state["failing_endpoints"]} == set(
                etcd_cluster.client_urls.split(",")
            )
        finally:
            etcd_cluster.resume_all()
        with trio.fail_after(10):
            while True:
                try:
                    await client.get("k")
                    break
                except EtcdUnavailable:
                    continue
        assert [reachable for reachable, _ in changes] == [False, True]
        assert "no etcd endpoint answered /v3/kv/range" in changes[0][1]
        # Each member asked for itself: a member still away stays listed, the others go.
        etcd_cluster.members[2].pause()
        try:
            await client.check_members()
            failing = client.health.to_json()["failing_endpoints"]
            assert [entry["endpoint"] for entry in failing] == [etcd_cluster.members[2].client_url]
        finally:
            etcd_cluster.members[2].resume()
        await client.check_members()
        state = client.health.to_json()
        assert state["failing_endpoints"] == []
        leader = await trio.to_thread.run_sync(etcd_cluster.leader)
        assert state["leader_endpoint"] == leader.client_url


async def test_a_campaign_whose_answer_was_lost_still_holds_the_key(etcd_cluster):
    async with client_of(etcd_cluster) as client:
        mine = await client.grant_lease(5)
        theirs = await client.grant_lease(5)
        created = await client.campaign("master", "me", mine)
        assert created
        # Asked again (the first answer never came): this lease holds it, so it is ours.
        assert await client.campaign("master", "me", mine) == created
        assert await client.campaign("master", "them", theirs) == 0


async def test_a_batch_of_compare_and_swaps_and_the_reads_of_its_failure_branch(etcd_cluster):
    async with client_of(etcd_cluster) as client:
        keys = [f"info/{number}" for number in range(MAX_TXN_OPS - 1)]
        revisions = {key: await client.put(key, "0") for key in keys}
        fence = await client.put("fence", "master")
        compares = [Compare("fence", "CREATE", fence)]
        compares += [Compare(key, "MOD", revisions[key]) for key in keys]
        result = await client.txn(
            compares, [put_op(key, "1") for key in keys], [range_op(key) for key in keys]
        )
        assert result.succeeded
        assert {(await client.get(key)).mod_revision for key in keys} == {result.revision}
        # The same compares again: they fail, and the failure branch says what each key holds.
        stale = await client.txn(
            compares, [put_op(key, "2") for key in keys], [range_op(key) for key in keys]
        )
        assert not stale.succeeded
        assert [kvs[0].value for kvs in stale.ranges()] == [b"1"] * len(keys)
        assert [kvs[0].mod_revision for kvs in stale.ranges()] == [result.revision] * len(keys)
