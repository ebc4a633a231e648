"""The master's batched, fenced replica-info writes (nsqlookupd/info_writes.py) against a real
etcd: many writes asked at once go out in one transaction; a write whose key changed fails
alone while the others of its batch are written; an earlier try's write found in place is
done; no write lands once the master key is another's; and nobody waits forever when the
master's work is cancelled."""

import trio

from nsqpy.etcd import EtcdClient
from nsqpy.nsqlookupd.info_writes import NotMaster, ReplicaInfoWrites

FENCE = "/master"


async def master_writes(etcd: EtcdClient) -> ReplicaInfoWrites:
    lease = await etcd.grant_lease(30)
    writes = ReplicaInfoWrites(etcd, FENCE)
    writes.fence = await etcd.campaign(FENCE, "me", lease)
    assert writes.fence
    return writes


async def test_writes_asked_together_go_in_one_transaction_and_fail_alone(etcd):
    writes = await master_writes(etcd)
    revisions = {f"/info/{n}": await etcd.put(f"/info/{n}", "0") for n in range(200)}
    changed = "/info/7"
    await etcd.put(changed, "changed by another")
    async with trio.open_nursery() as nursery:
        nursery.start_soon(writes.run)
        items = [(key, b"1", revision) for key, revision in revisions.items()]
        results = await writes.write_many(items)
        nursery.cancel_scope.cancel()
    assert results[7] == 0
    assert all(results[n] for n in range(200) if n != 7)
    # 127 writes a transaction at most (the fence is a compare too): 200 need two, and the
    # one whose key changed made its batch go again without it.
    assert writes.transactions == 3
    assert (await etcd.get(changed)).value == b"changed by another"
    assert (await etcd.get("/info/8")).value == b"1"


async def test_a_write_already_in_place_is_done(etcd):
    """An earlier try whose answer was lost: the key holds the value asked for."""
    writes = await master_writes(etcd)
    before = await etcd.put("/info/a", "0")
    await etcd.replace("/info/a", "1", before)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(writes.run)
        assert await writes.write("/info/a", b"1", before) > before
        nursery.cancel_scope.cancel()


async def test_no_write_lands_once_the_master_key_is_another_nsqlookupds(etcd):
    writes = await master_writes(etcd)
    revision = await etcd.put("/info/b", "0")
    await etcd.delete(FENCE)
    other = await etcd.grant_lease(30)
    assert await etcd.campaign(FENCE, "another", other)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(writes.run)
        try:
            await writes.write("/info/b", b"1", revision)
            raise AssertionError("written without being the master")
        except NotMaster:
            pass
        nursery.cancel_scope.cancel()
    assert (await etcd.get("/info/b")).value == b"0"
    assert writes.fence == 0


async def test_writes_waiting_when_the_masters_work_is_cancelled_are_told(etcd, etcd_server):
    writes = await master_writes(etcd)
    revision = await etcd.put("/info/c", "0")
    outcome = []

    async def write() -> None:
        try:
            await writes.write("/info/c", b"1", revision)
            outcome.append("written")
        except NotMaster:
            outcome.append("not master")

    with trio.fail_after(10):  # a waiter nobody tells would wait forever
        await told_when_cancelled(writes, write, etcd_server)
    assert outcome == ["not master"]


async def told_when_cancelled(writes, write, etcd_server) -> None:
    async with trio.open_nursery() as outer:
        async with trio.open_nursery() as master:
            master.start_soon(writes.run)
            etcd_server.pause()  # the transaction is under way and stays so
            try:
                outer.start_soon(write)
                await trio.sleep(0.3)
                master.cancel_scope.cancel()  # the lease lost: the master's work ends
            finally:
                etcd_server.resume()
        writes.stop()
