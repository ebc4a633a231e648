"""The catch-up tasks' bookkeeping (nsqd/catch_up.py `CatchUps`) when a partition leaves the
node before its catch-up task began: a leader moved off its partition is first told it is a
follower (a catch-up starts) and, in the next revision, that it holds it no more (forgotten),
both before the task runs. That task once met no progress of its own and ended the nsqd with
a KeyError (found by tests/cluster/test_operations.py under load). A partition's other
background tasks (restoring writes, ending a handover, resigning) are contained the same way:
an unexpected error costs the task, not the node."""

import logging
from functools import partial
from types import SimpleNamespace

import trio
import trio.testing

from nsqpy.common.cluster_meta import ReplicaInfo
from nsqpy.nsqd.catch_up import CatchUps
from nsqpy.nsqd.cluster import ClusterNode


def _follower_partition() -> SimpleNamespace:
    info = ReplicaInfo(leader="leader", isr=("leader",), catchup=("me",), replica=2)
    return SimpleNamespace(
        name="t", partition=0, deleted=False, replication=SimpleNamespace(info=info)
    )


def _node(nursery: trio.Nursery | None = None) -> SimpleNamespace:
    node = SimpleNamespace(
        nursery=nursery,
        node_id="me",
        session=None,
        nsqd=SimpleNamespace(log=logging.getLogger("test_catch_ups")),
    )
    node.contained = partial(ClusterNode.contained, node)
    return node


async def test_a_catch_up_forgotten_before_its_task_began_ends_without_harm():
    async with trio.open_nursery() as nursery:
        catch_ups = CatchUps(_node(nursery))
        topic = _follower_partition()
        catch_ups.start(topic)
        assert catch_ups.running(topic)
        catch_ups.forget(topic)
        await trio.testing.wait_all_tasks_blocked()
        assert not catch_ups.running(topic)


async def test_an_unexpected_error_in_a_partitions_background_task_is_logged_not_raised(caplog):
    async def _restore_writes(topic, info):
        raise RuntimeError("a bug")

    topic = _follower_partition()
    await _node().contained(_restore_writes, topic, topic.replication.info)
    assert "TOPIC(t) partition 0: internal error in restore writes" in caplog.text
    assert "RuntimeError: a bug" in caplog.text
