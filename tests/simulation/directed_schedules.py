"""Schedules the simulator runs on purpose, each reaching one window the seeded schedules reach
only now and then (their tests: `test_refusals.py`; the mutation checks use them too)."""

from nsqpy import fault_schedule
from nsqpy.fault_schedule import TOPIC, _converged, _leader_node, _log_bodies, _node_of
from nsqpy.simulation import Simulation

BODY = b"refused-but-replicated"


async def a_refused_write_reaches_a_follower(simulation: Simulation) -> list[str]:
    await fault_schedule._create_topic(simulation)
    leader = _leader_node(simulation, 0)
    assert leader is not None and leader.nsqd is not None
    info = simulation.master().infos[(TOPIC, 0)]
    keeping, missing = (_node_of(simulation, node) for node in info.followers())
    network = simulation.network
    # The leader's write reaches `keeping`, whose answer never comes back; `missing` never
    # gets it. Neither can count for the write: no majority, refused.
    network.cut(keeping.host, leader.host, one_way=True)
    network.cut(leader.host, missing.host, one_way=True)
    target = f"/pub?topic={TOPIC}&partition=0"
    status, answer = await simulation.http(leader.host, leader.nsqd.http_port, "POST", target, BODY)
    simulation.note("schedule", f"PUBLISHED {status} {answer!r}")
    # The master gives the partition to the follower that holds the most: `keeping`.
    await simulation.until(
        lambda: (node := _leader_node(simulation, 0)) is not None and node is keeping,
        "the follower holding the write leading",
        30,
    )
    network.heal()
    await simulation.until(lambda: _converged(simulation, [0]), "the ISR whole again", 60)
    if status == 200:
        return [f"the publish was acknowledged ({answer!r}): the schedule missed its window"]
    stored = [node.host for node in simulation.nodes if BODY in _log_bodies(node, 0)]
    if stored and b"MAYBE_STORED" not in answer:
        return [f"refused as not stored ({status} {answer!r}), stored on {stored}"]
    if not stored:
        return [f"the follower that led next did not keep the write (refused {answer!r})"]
    return []
