"""A seeded fault schedule for the cluster simulator (`nsqpy/simulation.py`), and the checks
after it.

One schedule: a topic of `PARTITIONS` partitions on three replicas; a producer per partition
publishing over HTTP to the partition's leader, as the master names it, and keeping what was
acknowledged, in order; meanwhile one to `FAULTS` faults drawn from the seed, each beginning
within `FAULT_WINDOW` seconds and lasting up to six (they may overlap):

* a node crashes, and starts again on the same disk a moment later;
* a node loses its disk: it starts again on an empty one (at most one a schedule: a cluster of
  three replicas keeps a message through one lost disk, not two);
* the master nsqlookupd crashes and starts again (the standby takes over meanwhile);
* etcd stops answering for a while (as under SIGSTOP);
* the link between two nodes is slow (each chunk waits up to half a second more, in order);
* a node is cut off from every other host, both ways, for a while;
* a node's messages to one other host are lost (one way) for a while.

Then every fault heals, every node runs, and the cluster must converge within
`CONVERGE_SECONDS` (virtual): each partition with a leader, its ISR full; or, where the
faults left no complete replica in the ISR (a crash, an isolation and the lost disk together),
the master must refuse to elect one and say so, and every acknowledged message must still be
on some replica, for an operator's unclean election. Checked then:

* every acknowledged message is in the log of every ISR replica of its partition;
* a producer's acknowledged messages are in its partition's log in the order they were
  acknowledged;
* no message is stored twice in a replica's log (the producers never publish one twice).
"""

import random
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field

import trio

from nsqpy.simulation import (
    CLIENT_HOST,
    ETCD_URL,
    SimulatedLookupd,
    SimulatedNode,
    Simulation,
    run_schedule,
)

PARTITIONS = 2
REPLICAS = 3
FAULTS = 4
# Faults begin within this many seconds of the producers' start.
FAULT_WINDOW = 8.0
TOPIC = "sim"
CONVERGE_SECONDS = 60.0


@dataclass
class _Producer:
    partition: int
    acknowledged: list[bytes] = field(default_factory=list)
    # Publishes refused without `MAYBE_STORED`: none may be stored.
    refused: list[bytes] = field(default_factory=list)
    sent: int = 0


async def schedule(simulation: Simulation) -> list[str]:
    """Run one schedule on `simulation`; what the checks found wrong (empty: nothing)."""
    rng = simulation.rng
    await _create_topic(simulation)
    producers = [_Producer(partition) for partition in range(PARTITIONS)]
    async with trio.open_nursery() as nursery:
        for producer in producers:
            nursery.start_soon(_produce, simulation, producer, random.Random(rng.getrandbits(64)))
        async with trio.open_nursery() as faults:
            for _fault in range(rng.randint(1, FAULTS)):
                faults.start_soon(_fault_task, simulation, random.Random(rng.getrandbits(64)))
        nursery.cancel_scope.cancel()
    simulation.network.heal()
    simulation.etcd.resume(ETCD_URL)
    for member in simulation.lookupds:
        if not member.running:
            await simulation.start_lookupd(member)
    for node in simulation.nodes:
        if not node.running:
            await simulation.start_node(node)
    simulation.note("schedule", "HEALED")
    partitions = range(PARTITIONS)
    with trio.move_on_after(CONVERGE_SECONDS):
        while not _converged(simulation, partitions):
            await trio.sleep(0.05)
    unavailable = _unavailable(simulation)
    waiting = [p for p in partitions if p not in unavailable and not _converged(simulation, [p])]
    if waiting:
        return [f"not converged within {CONVERGE_SECONDS:g} s: partitions {waiting}"]
    if unavailable:
        # More faults than the replicas tolerate (every complete ISR member lost its disk):
        # the master refuses to elect an incomplete replica, as it must, until an operator
        # does (an unclean election). What was acknowledged must still be somewhere.
        simulation.note("schedule", f"UNAVAILABLE {unavailable}")
    simulation.note("schedule", "CONVERGED")
    return _check(simulation, producers, unavailable)


async def _create_topic(simulation: Simulation) -> None:
    address = simulation.master_http()
    assert address is not None
    target = f"/topic/create?topic={TOPIC}&partition_num={PARTITIONS}&replicator={REPLICAS}"
    status, body = await simulation.http(*address, "POST", target)
    if status != 200:
        raise AssertionError(f"creating the topic: {status} {body!r}")
    await simulation.until(
        lambda: _converged(simulation, range(PARTITIONS)), "the topic's leaders", 30
    )


def _leader_node(simulation: Simulation, partition: int) -> SimulatedNode | None:
    """The node the master names the partition's leader, if it runs."""
    master = simulation.master()
    info = master.infos.get((TOPIC, partition)) if master is not None else None
    if info is None or not info.leader:
        return None
    host = info.leader.split(":")[0]
    for node in simulation.nodes:
        if node.host == host and node.running:
            return node
    return None


def _unavailable(simulation: Simulation) -> list[int]:
    """The partitions the master refuses to give a leader: no complete replica is left."""
    master = simulation.master()
    if master is None:
        return []
    return [p for p in range(PARTITIONS) if master.leaderless.get((TOPIC, p))]


def _converged(simulation: Simulation, partitions: Iterable[int]) -> bool:
    master = simulation.master()
    if master is None:
        return False
    for partition in partitions:
        info = master.infos.get((TOPIC, partition))
        if info is None or not info.leader or len(info.isr) < REPLICAS:
            return False
        node = _leader_node(simulation, partition)
        if node is None or node.nsqd is None:
            return False
        topic = node.nsqd.get_partition(TOPIC, partition)
        if topic is None or not node.nsqd.cluster.describe(topic).get("writable"):
            return False
    return True


async def _produce(simulation: Simulation, producer: _Producer, rng: random.Random) -> None:
    while True:
        await trio.sleep(rng.uniform(0.01, 0.2))
        node = _leader_node(simulation, producer.partition)
        if node is None or node.nsqd is None:
            continue
        body = f"p{producer.partition}-{producer.sent}".encode()
        target = f"/pub?topic={TOPIC}&partition={producer.partition}"
        status, answer = await simulation.http(node.host, node.nsqd.http_port, "POST", target, body)
        if status == 200 and answer == b"OK":
            producer.acknowledged.append(body)
        elif status and b"MAYBE_STORED" not in answer:
            # A refusal that says it stored nothing (docs/protocol.md §3.10).
            simulation.note("schedule", f"REFUSED {body.decode()}: {status} {answer[:120]!r}")
            producer.refused.append(body)
        # Otherwise (no answer, or a refusal: a leader deposed after its write reached a
        # follower refuses it, and the follower that leads next has it) the message may be
        # stored or not, as NSQ's at-least-once delivery allows; the checks ask nothing of
        # it, and the next publish is another message, so that a message stored twice is
        # the cluster's doing.
        producer.sent += 1


FAULT_KINDS = ("crash", "lose disk", "isolate", "one way", "slow", "etcd pause", "master crash")


async def _fault_task(simulation: Simulation, rng: random.Random) -> None:
    """One fault: it begins within `FAULT_WINDOW` seconds and lasts a while."""
    await trio.sleep(rng.uniform(0.5, FAULT_WINDOW))
    kind = rng.choice(FAULT_KINDS)
    duration = rng.uniform(0.2, 6.0)
    node = rng.choice(simulation.nodes)
    network = simulation.network
    note = simulation.note
    if kind in ("crash", "lose disk"):
        if not node.running:
            return
        if kind == "lose disk" and not any(n.disk_lost for n in simulation.nodes):
            # One lost disk a schedule: an acknowledged message is on a majority of the
            # replicas, and no cluster of three keeps what two lost disks held.
            await simulation.lose_disk(node)
        else:
            await simulation.crash(node)
        await trio.sleep(duration)
        await simulation.start_node(node)
    elif kind == "isolate":
        note("schedule", f"ISOLATE {node.host} for {duration:.3f} s")
        others = _other_hosts(simulation, node)
        for host in others:
            network.cut(node.host, host)
        await trio.sleep(duration)
        for host in others:
            network.uncut(node.host, host)
        note("schedule", f"REJOIN {node.host}")
    elif kind == "one way":
        other = rng.choice([n for n in simulation.nodes if n is not node])
        note("schedule", f"DROP {node.host} -> {other.host} for {duration:.3f} s")
        network.cut(node.host, other.host, one_way=True)
        await trio.sleep(duration)
        network.uncut(node.host, other.host, one_way=True)
        note("schedule", f"UNDROP {node.host} -> {other.host}")
    elif kind == "slow":
        other = rng.choice([n for n in simulation.nodes if n is not node])
        jitter = rng.uniform(0.01, 0.5)
        note("schedule", f"SLOW {node.host} <-> {other.host} by {jitter:.3f} s")
        network.slow(node.host, other.host, jitter)
        await trio.sleep(duration)
        network.unslow(node.host, other.host)
        note("schedule", f"UNSLOW {node.host} <-> {other.host}")
    elif kind == "etcd pause":
        note("schedule", f"ETCD PAUSE for {duration:.3f} s")
        simulation.etcd.pause(ETCD_URL)
        await trio.sleep(duration)
        simulation.etcd.resume(ETCD_URL)
        note("schedule", "ETCD RESUME")
    else:
        member = next((m for m in simulation.lookupds if _is_master(m)), None)
        if member is None:
            return
        await simulation.crash(member)
        await trio.sleep(duration)
        await simulation.start_lookupd(member)


def _is_master(member: SimulatedLookupd) -> bool:
    coordinator = member.lookupd.coordinator if member.lookupd is not None else None
    return coordinator is not None and coordinator.is_master


def _other_hosts(simulation: Simulation, node: SimulatedNode) -> list[str]:
    hosts = [other.host for other in simulation.nodes if other is not node]
    return [*hosts, *(member.host for member in simulation.lookupds), CLIENT_HOST]


def _check(simulation: Simulation, producers: list[_Producer], unavailable: list[int]) -> list[str]:
    master = simulation.master()
    failures: list[str] = []
    for producer in producers:
        partition = producer.partition
        acknowledged = producer.acknowledged
        if partition in unavailable:
            kept: set[bytes] = set()
            for node in simulation.nodes:
                kept.update(_log_bodies(node, partition))
            destroyed = [body for body in acknowledged if body not in kept]
            if destroyed:
                failures.append(
                    f"{TOPIC}/{partition} (unavailable): {len(destroyed)} of"
                    f" {len(acknowledged)} acknowledged on no replica (first {destroyed[0]!r})"
                )
            continue
        info = master.infos[(TOPIC, partition)]
        for member in info.isr:
            node = next(n for n in simulation.nodes if n.host == member.split(":")[0])
            bodies = _log_bodies(node, partition)
            simulation.note(
                "schedule",
                f"CHECK {TOPIC}/{partition} on {node.host}: {len(bodies)} stored,"
                f" {len(acknowledged)} acknowledged",
            )
            where = f"{TOPIC}/{partition} on {node.host}"
            stored = set(bodies)
            lost = [body for body in acknowledged if body not in stored]
            if lost:
                failures.append(
                    f"{where}: {len(lost)} of {len(acknowledged)} acknowledged missing"
                    f" (first {lost[0]!r})"
                )
            if len(stored) != len(bodies):
                failures.append(f"{where}: a message stored twice")
            stored_refused = [body for body in producer.refused if body in stored]
            if stored_refused:
                failures.append(
                    f"{where}: {len(stored_refused)} publish(es) refused as not stored are"
                    f" stored (first {stored_refused[0]!r})"
                )
            wanted = set(acknowledged)
            if [body for body in bodies if body in wanted] != [
                b for b in acknowledged if b in stored
            ]:
                failures.append(f"{where}: acknowledged messages out of their order")
    return failures


def _log_bodies(node: SimulatedNode, partition: int) -> list[bytes]:
    assert node.nsqd is not None
    topic = node.nsqd.get_partition(TOPIC, partition)
    if topic is None:
        return []
    log = node.nsqd.cluster.log_of(topic)
    return [message.body for message in log.read(log.start, 1 << 30, log.written.offset)]


Schedule = Callable[[Simulation], Awaitable[list[str]]]


def main(argv: list[str] | None = None) -> int:
    """`python -m nsqpy.fault_schedule --seed N` replays one schedule (`--trace` prints its
    trace); `--seeds FIRST:END` runs a range. Exit status 1 when a schedule failed."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m nsqpy.fault_schedule")
    parser.add_argument("--seed", type=int, help="one schedule's seed")
    parser.add_argument("--seeds", help="a range of seeds, FIRST:END")
    parser.add_argument("--trace", action="store_true", help="print each schedule's trace")
    arguments = parser.parse_args(argv)
    if arguments.seeds:
        first, _, end = arguments.seeds.partition(":")
        seeds = range(int(first), int(end))
    elif arguments.seed is not None:
        seeds = range(arguments.seed, arguments.seed + 1)
    else:
        parser.error("give --seed or --seeds")
    failed = 0
    for seed in seeds:
        trace, failures = run_schedule(seed, schedule)
        if arguments.trace:
            print("\n".join(trace))
        for failure in failures:
            print(f"seed {seed}: {failure}")
        failed += bool(failures)
    print(f"{len(seeds)} schedule(s), {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
