"""Disk faults under the simulator, directed: what the seeded schedules reach only now and
then. A node that stops uncleanly comes back as a new run of its disk
(`nsqd/data_path.py`), which proves nothing of what it holds; when every replica of a
partition lost power at once, none proves anything, and the longest of them leads without an
operator (what none of them kept, no replica has). A write that fails during a stop's last
flush does not turn the stop into a crash."""

import errno

import pytest

from nsqpy import fault_schedule
from nsqpy.fault_schedule import PARTITIONS, TOPIC, _converged, _leader_node, _log_bodies
from nsqpy.nsqd.message_queue import LogTopicQueue
from nsqpy.nsqlookupd import elections
from nsqpy.simulation import Simulation, run_schedule


async def _publish(simulation: Simulation, partition: int, body: bytes) -> bool:
    node = _leader_node(simulation, partition)
    assert node is not None and node.nsqd is not None
    target = f"/pub?topic={TOPIC}&partition={partition}"
    status, answer = await simulation.http(node.host, node.nsqd.http_port, "POST", target, body)
    return status == 200 and answer == b"OK"


async def every_node_loses_power(simulation: Simulation) -> list[str]:
    await fault_schedule._create_topic(simulation)
    synced = {partition: [] for partition in range(PARTITIONS)}
    for index in range(20):
        for partition in range(PARTITIONS):
            body = f"p{partition}-{index}".encode()
            if await _publish(simulation, partition, body):
                synced[partition].append(body)
    # Past `--sync-timeout` (1 s): the logs fsynced what they hold.
    await simulation.until(
        lambda: all(
            not node.nsqd.cluster.log_of(topic).dirty
            for node in simulation.nodes
            for topic in node.nsqd.all_partitions()
        ),
        "every log synced",
        10,
    )
    for partition in range(PARTITIONS):
        await _publish(simulation, partition, f"p{partition}-unsynced".encode())
    for node in simulation.nodes:
        assert await simulation.crash(node, power_loss=True)
    for node in simulation.nodes:
        await simulation.start_node(node)
    failures = []
    try:
        await simulation.until(
            lambda: _converged(simulation, range(PARTITIONS)), "every partition led", 60
        )
    except AssertionError as failure:
        failures.append(f"{failure}; leaderless: {simulation.master().leaderless}")
        return failures
    for partition in range(PARTITIONS):
        for node in simulation.nodes:
            bodies = _log_bodies(node, partition)
            missing = [body for body in synced[partition] if body not in bodies]
            if missing:
                failures.append(f"{TOPIC}/{partition} on {node.host}: synced {missing} lost")
    return failures


@pytest.mark.parametrize("seed", range(5))
def test_every_node_losing_power_at_once_leaves_no_partition_waiting_for_an_operator(
    seed,
) -> None:
    _trace, failures = run_schedule(seed, every_node_loses_power)
    assert not failures, failures


def test_without_the_longest_restarted_replica_leading_the_partition_waits(monkeypatch):
    """The rule proved: with it off, the partitions stay without a leader."""
    monkeypatch.setattr(
        elections.Elections, "_restarted_on_their_disks", lambda self, info, lost: []
    )
    _trace, failures = run_schedule(0, every_node_loses_power)
    assert failures and "every partition led" in failures[0], failures


async def a_write_fails_after_the_stop(simulation: Simulation) -> list[str]:
    """The found defect: a stop's last flush, on a disk that refuses it, told the cluster
    side, which started its resignation in the nursery that had closed; the stop ended in
    `RuntimeError`, before the topics were closed and the metadata written."""
    await fault_schedule._create_topic(simulation)
    node = _leader_node(simulation, 0)
    assert node is not None and node.nsqd is not None
    nsqd = node.nsqd
    queue = nsqd.get_partition(TOPIC, 0).queue
    assert isinstance(queue, LogTopicQueue) and queue.writer.on_disk_state is not None
    await simulation.stop(node)
    queue.writer.on_disk_state(OSError(errno.ENOSPC, "No space left on device"))
    return []


def test_a_write_refused_during_a_stop_starts_nothing_after_it() -> None:
    _trace, failures = run_schedule(0, a_write_fails_after_the_stop)
    assert not failures, failures
