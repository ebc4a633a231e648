"""A seeded fault schedule for the cluster simulator (`nsqpy/simulation.py`), and the checks
after it.

One schedule: a topic of `PARTITIONS` partitions on three replicas; a producer per partition
publishing over HTTP to the partition's leader, as the master names it, and keeping what was
acknowledged, in order; meanwhile one to `FAULTS` faults drawn from the seed, each beginning
within `FAULT_WINDOW` seconds and lasting up to six (they may overlap):

* a node crashes, and starts again on the same disk a moment later;
* a node loses its disk: it starts again on an empty one (at most one a schedule: a cluster of
  three replicas keeps a message through one lost disk, not two);
* a node loses power: it starts again on its disk as its last fsyncs left it (counted with
  the lost disk: one damaged disk a schedule);
* a node's disk is full for a while (writes fail with ENOSPC);
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
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import trio

from nsqpy.simulated_clients import (
    Consumer,
    IdempotentProducer,
    consume_forever,
    publish_forever,
)
from nsqpy.simulation import (
    CLIENT_HOST,
    ETCD_URL,
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
# How long the consumers may take, once the cluster converged, to have every acknowledged
# message.
DELIVER_SECONDS = 30.0
# A FIN its leader took this long before it stopped leading is on the followers.
FIN_GRACE = 1.0


@dataclass
class _Producer:
    partition: int
    acknowledged: list[bytes] = field(default_factory=list)
    # Publishes refused without `MAYBE_STORED`: none may be stored.
    refused: list[bytes] = field(default_factory=list)
    sent: int = 0
    # The node that acknowledged each publish.
    written_by: dict[bytes, str] = field(default_factory=dict)


@dataclass
class _Run:
    """What one schedule's clients did and saw."""

    producers: list[_Producer]
    idempotent: list[IdempotentProducer]
    consumers: list[Consumer]
    # When each partition's leader changed (another node, or its node stopped), as seen.
    leader_changes: dict[int, list[float]]
    # Each partition's ISR hosts as the master had them, from when.
    isr_history: dict[int, list[tuple[float, frozenset[str]]]]
    # Each partition's leader host (None: its node down), from when.
    leader_history: dict[int, list[tuple[float, str | None]]]


async def schedule(simulation: Simulation) -> list[str]:
    """Run one schedule on `simulation`; what the checks found wrong (empty: nothing)."""
    rng = simulation.rng
    await _create_topic(simulation)
    run = _Run(
        producers=[_Producer(partition) for partition in range(PARTITIONS)],
        idempotent=[IdempotentProducer(f"idem{p}", p) for p in range(PARTITIONS)],
        consumers=[Consumer(partition) for partition in range(PARTITIONS)],
        leader_changes={partition: [] for partition in range(PARTITIONS)},
        isr_history={partition: [] for partition in range(PARTITIONS)},
        leader_history={partition: [] for partition in range(PARTITIONS)},
    )

    def leader_address(partition: int) -> tuple[str, int] | None:
        node = _leader_node(simulation, partition)
        return (node.host, node.nsqd.tcp_port) if node is not None and node.nsqd else None

    def start_client(nursery: trio.Nursery, client: Callable, actor: Any) -> None:
        """A V2 client on the client host, with a generator of its own from the seed."""
        random_of_its_own = random.Random(rng.getrandbits(64))
        nursery.start_soon(
            client, simulation.client, actor, TOPIC, leader_address, random_of_its_own
        )

    async with trio.open_nursery() as clients:
        clients.start_soon(_watch_leaders, simulation, run)
        for consumer in run.consumers:
            start_client(clients, consume_forever, consumer)
        async with trio.open_nursery() as nursery:
            for producer in run.producers:
                nursery.start_soon(
                    _produce, simulation, producer, random.Random(rng.getrandbits(64))
                )
            for idempotent in run.idempotent:
                start_client(nursery, publish_forever, idempotent)
            async with trio.open_nursery() as faults:
                for _fault in range(rng.randint(1, FAULTS)):
                    faults.start_soon(_fault_task, simulation, random.Random(rng.getrandbits(64)))
            nursery.cancel_scope.cancel()
        failures = await _heal_and_converge(simulation)
        unavailable = _unavailable(simulation)
        if not failures:
            # The consumers go on until they had every acknowledged message.
            with trio.move_on_after(DELIVER_SECONDS):
                while not _all_delivered(run, unavailable):
                    await trio.sleep(0.05)
        clients.cancel_scope.cancel()
    if failures:
        return failures
    return _check(simulation, run, unavailable)


async def _heal_and_converge(simulation: Simulation) -> list[str]:
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
    return []


async def _watch_leaders(simulation: Simulation, run: _Run) -> None:
    """Note each time a partition's leader changes: another node named, or its node down."""
    seen: dict[int, tuple[str, bool]] = {}
    while True:
        master = simulation.master()
        for partition in range(PARTITIONS):
            info = master.infos.get((TOPIC, partition)) if master is not None else None
            if info is None:
                continue
            node = _leader_node(simulation, partition)
            now = (info.leader, node is not None)
            if partition in seen and seen[partition] != now:
                run.leader_changes[partition].append(trio.current_time())
            seen[partition] = now
            isr = frozenset(member.split(":")[0] for member in info.isr)
            history = run.isr_history[partition]
            if not history or history[-1][1] != isr:
                history.append((trio.current_time(), isr))
            leading = node.host if node is not None else None
            leaders = run.leader_history[partition]
            if not leaders or leaders[-1][1] != leading:
                leaders.append((trio.current_time(), leading))
        await trio.sleep(0.05)


def _all_delivered(run: _Run, unavailable: list[int]) -> bool:
    for consumer in run.consumers:
        if consumer.partition in unavailable:
            continue
        delivered = set(consumer.delivered)
        wanted = [
            *run.producers[consumer.partition].acknowledged,
            *run.idempotent[consumer.partition].acknowledged,
        ]
        if any(body not in delivered for body in wanted):
            return False
    return True


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
    for partition in range(PARTITIONS):
        # The consumers' channel, before anything is published: it has every message.
        node = _leader_node(simulation, partition)
        assert node is not None and node.nsqd is not None
        target = f"/channel/create?topic={TOPIC}&channel=c&partition={partition}"
        status, body = await simulation.http(node.host, node.nsqd.http_port, "POST", target)
        if status != 200:
            raise AssertionError(f"creating the channel: {status} {body!r}")


def _leader_node(simulation: Simulation, partition: int) -> SimulatedNode | None:
    """The node the master names the partition's leader, if it runs."""
    master = simulation.master()
    info = master.infos.get((TOPIC, partition)) if master is not None else None
    if info is None or not info.leader:
        return None
    node = _node_of(simulation, info.leader)
    return node if node.running else None


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
        if master.lost_members(info):
            return False  # an ISR member back on an empty disk, not yet moved out
        node = _leader_node(simulation, partition)
        if node is None or node.nsqd is None:
            return False
        topic = node.nsqd.get_partition(TOPIC, partition)
        if topic is None or not node.nsqd.cluster.describe(topic).get("writable"):
            return False
        end = node.nsqd.cluster.log_of(topic).written
        for member in info.isr:
            # Every ISR member runs, holds the partition as the ISR counts on, and ends
            # where the leader does (nothing is published once the faults stop).
            nsqd = _node_of(simulation, member).nsqd
            held = nsqd.get_partition(TOPIC, partition) if nsqd is not None else None
            if nsqd is None or held is None or nsqd.cluster.log_of(held).written != end:
                return False
            if getattr(held.replication, "lost", True):
                return False
    return True


def _node_of(simulation: Simulation, node_id: str) -> SimulatedNode:
    return next(n for n in simulation.nodes if n.host == node_id.split(":")[0])


async def _produce(simulation: Simulation, producer: _Producer, rng: random.Random) -> None:
    while True:
        await trio.sleep(rng.uniform(0.05, 0.5))
        node = _leader_node(simulation, producer.partition)
        if node is None or node.nsqd is None:
            continue
        body = f"p{producer.partition}-{producer.sent}".encode()
        target = f"/pub?topic={TOPIC}&partition={producer.partition}"
        status, answer = await simulation.http(node.host, node.nsqd.http_port, "POST", target, body)
        if status == 200 and answer == b"OK":
            producer.acknowledged.append(body)
            producer.written_by[body] = node.host
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


FAULT_KINDS = (
    "crash",
    "lose disk",
    "power loss",
    "isolate",
    "one way",
    "slow",
    "etcd pause",
    "master crash",
    "full disk",
)


async def _fault_task(simulation: Simulation, rng: random.Random) -> None:
    """One fault: it begins within `FAULT_WINDOW` seconds and lasts a while."""
    await trio.sleep(rng.uniform(0.5, FAULT_WINDOW))
    kind = rng.choice(FAULT_KINDS)
    duration = rng.uniform(0.2, 6.0)
    # Half the faults strike a partition's leader as the master names it when they begin:
    # failovers are where the defects were.
    leader = _leader_node(simulation, rng.randrange(PARTITIONS)) if rng.random() < 0.5 else None
    node = leader if leader is not None else rng.choice(simulation.nodes)
    network = simulation.network
    note = simulation.note
    if kind in ("crash", "lose disk", "power loss"):
        damaged = any(n.disk_lost for n in simulation.nodes)
        if kind == "lose disk" and not damaged:
            # One damaged disk a schedule (lost, or short of its unsynced writes): an
            # acknowledged message is on a majority of the replicas, written but not
            # necessarily synced, and no cluster of three keeps what two such disks held.
            crashed = await simulation.lose_disk(node)
        else:
            crashed = await simulation.crash(node, power_loss=kind == "power loss" and not damaged)
        if crashed:
            began = trio.current_time()
            await trio.sleep(duration)
            await simulation.start_node(node)
            _disturbed(simulation, began, node.host)
    elif kind == "isolate":
        note("schedule", f"ISOLATE {node.host} for {duration:.3f} s")
        others = _other_hosts(simulation, node)
        for host in others:
            network.cut(node.host, host)
        began = trio.current_time()
        await trio.sleep(duration)
        for host in others:
            network.uncut(node.host, host)
        _disturbed(simulation, began, node.host)
        note("schedule", f"REJOIN {node.host}")
    elif kind == "one way":
        other = rng.choice([n for n in simulation.nodes if n is not node])
        note("schedule", f"DROP {node.host} -> {other.host} for {duration:.3f} s")
        network.cut(node.host, other.host, one_way=True)
        began = trio.current_time()
        await trio.sleep(duration)
        network.uncut(node.host, other.host, one_way=True)
        _disturbed(simulation, began, node.host, other.host)
        note("schedule", f"UNDROP {node.host} -> {other.host}")
    elif kind == "slow":
        other = rng.choice([n for n in simulation.nodes if n is not node])
        jitter = rng.uniform(0.01, 0.5)
        note("schedule", f"SLOW {node.host} <-> {other.host} by {jitter:.3f} s")
        network.slow(node.host, other.host, jitter)
        began = trio.current_time()
        await trio.sleep(duration)
        network.unslow(node.host, other.host)
        _disturbed(simulation, began, node.host, other.host)
        note("schedule", f"UNSLOW {node.host} <-> {other.host}")
    elif kind == "full disk":
        note("schedule", f"DISK FULL {node.host} for {duration:.3f} s")
        node.disk.full = True
        began = trio.current_time()
        await trio.sleep(duration)
        node.disk.full = False
        _disturbed(simulation, began, node.host)
        note("schedule", f"DISK FREED {node.host}")
    elif kind == "etcd pause":
        note("schedule", f"ETCD PAUSE for {duration:.3f} s")
        simulation.etcd.pause(ETCD_URL)
        await trio.sleep(duration)
        simulation.etcd.resume(ETCD_URL)
        note("schedule", "ETCD RESUME")
    else:
        member = simulation.master_member()
        if member is not None and await simulation.crash(member):
            await trio.sleep(duration)
            await simulation.start_lookupd(member)


def _disturbed(simulation: Simulation, began: float, *hosts: str) -> None:
    """Note that `hosts` could not count on their links from `began` until now (a FIN they
    took or should have heard of meanwhile may be lost with a failover)."""
    simulation.disturbed.append((began, trio.current_time(), frozenset(hosts)))


def _other_hosts(simulation: Simulation, node: SimulatedNode) -> list[str]:
    hosts = [other.host for other in simulation.nodes if other is not node]
    return [*hosts, *(member.host for member in simulation.lookupds), CLIENT_HOST]


def _check(simulation: Simulation, run: _Run, unavailable: list[int]) -> list[str]:
    master = simulation.master()
    failures: list[str] = []
    for partition in range(PARTITIONS):
        producer = run.producers[partition]
        idempotent = run.idempotent[partition].acknowledged
        acknowledged = [*producer.acknowledged, *idempotent]
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
            node = _node_of(simulation, member)
            bodies = _log_bodies(node, partition)
            simulation.note(
                "schedule",
                f"CHECK {TOPIC}/{partition} on {node.host}: {len(bodies)} stored,"
                f" {len(acknowledged)} acknowledged",
            )
            where = f"{TOPIC}/{partition} on {node.host}"
            failures += _check_replica(
                where, bodies, f"p{partition}-", producer.acknowledged, producer.refused
            )
            idempotent_prefix = f"{run.idempotent[partition].name}-"
            failures += _check_replica(
                f"{where} (idempotent)", bodies, idempotent_prefix, idempotent, []
            )
        failures += _check_consumer(simulation, run, partition)
        failures += _check_epochs(simulation, run, partition, info.leader)
    return failures


def _check_replica(
    where: str, bodies: list[bytes], prefix: str, acknowledged: list[bytes], refused: list[bytes]
) -> list[str]:
    """One producer's messages (their bodies start with `prefix`) in one replica's log."""
    failures = []
    own = [body for body in bodies if body.startswith(prefix.encode())]
    stored = set(own)
    lost = [body for body in acknowledged if body not in stored]
    if lost:
        failures.append(
            f"{where}: {len(lost)} of {len(acknowledged)} acknowledged missing (first {lost[0]!r})"
        )
    if len(stored) != len(own):
        twice = next(body for body in own if own.count(body) > 1)
        failures.append(f"{where}: a message stored twice ({twice!r})")
    stored_refused = [body for body in refused if body in stored]
    if stored_refused:
        failures.append(
            f"{where}: {len(stored_refused)} publish(es) refused as not stored are stored"
            f" (first {stored_refused[0]!r})"
        )
    wanted = set(acknowledged)
    if [body for body in own if body in wanted] != [b for b in acknowledged if b in stored]:
        failures.append(f"{where}: acknowledged messages out of their order")
    return failures


def _check_epochs(simulation: Simulation, run: _Run, partition: int, leader: str) -> list[str]:
    """At most one node acknowledged writes in each write epoch: the epoch each group is
    stamped with in the log, against the node that acknowledged its messages."""
    node = _node_of(simulation, leader)
    assert node.nsqd is not None
    topic = node.nsqd.get_partition(TOPIC, partition)
    assert topic is not None
    log = node.nsqd.cluster.log_of(topic)
    epochs: dict[int, int] = {}  # a message's count -> its group's epoch
    for entry in log.entries_from(log.start.offset, 1 << 30):
        first = entry[5] - 1
        for count in range(first, first + entry[6]):
            epochs[count] = entry[1]
    writers: dict[int, set[str]] = {}
    written_by = {**run.producers[partition].written_by, **run.idempotent[partition].written_by}
    for index, body in enumerate(_log_bodies(node, partition)):
        host = written_by.get(body)
        epoch = epochs.get(log.start.count + index)
        if host is not None and epoch is not None:
            writers.setdefault(epoch, set()).add(host)
    shared = {epoch: hosts for epoch, hosts in writers.items() if len(hosts) > 1}
    if shared:
        epoch, hosts = next(iter(shared.items()))
        return [f"{TOPIC}/{partition}: write epoch {epoch} acknowledged by {sorted(hosts)}"]
    return []


def _at(history: list[tuple[float, Any]], at: float, default: Any = None) -> Any:
    """What a history of (since, value) held at `at`."""
    value = default
    for since, then in history:
        if since > at:
            break
        value = then
    return value


def _check_consumer(simulation: Simulation, run: _Run, partition: int) -> list[str]:
    consumer = run.consumers[partition]
    failures = []
    delivered = set(consumer.delivered)
    wanted = [*run.producers[partition].acknowledged, *run.idempotent[partition].acknowledged]
    missing = [body for body in wanted if body not in delivered]
    if missing:
        failures.append(
            f"{TOPIC}/{partition}: {len(missing)} acknowledged never delivered within"
            f" {DELIVER_SECONDS:g} s of converging (first {missing[0]!r})"
        )
    changes = run.leader_changes[partition]
    for body, when, host in consumer.again:
        finished_at, finished_on = consumer.finished[body]
        if finished_at >= when:
            continue
        # A FIN reaches the followers within a few milliseconds (`CURSOR_PUSH_INTERVAL`):
        # one the partition's leader took more than FIN_GRACE before it stopped leading,
        # while the node that delivered it again was in the ISR, must hold, unless a fault
        # touched either of them meanwhile (a follower cut off, slow or down misses the
        # push). A FIN sent to a node that no longer led is lost with its connection.
        change = next((at for at in changes if at >= finished_at), None)
        led = _at(run.leader_history[partition], finished_at) == finished_on
        in_sync = led and host in _at(run.isr_history[partition], finished_at, frozenset())
        touched = any(
            began <= finished_at + FIN_GRACE
            and finished_at <= ended
            and hosts & {host, finished_on}
            for began, ended, hosts in simulation.disturbed
        )
        if in_sync and not touched and (change is None or change - finished_at > FIN_GRACE):
            failures.append(
                f"{TOPIC}/{partition}: {body!r} finished on {finished_on} at {finished_at:.3f}"
                f" came again from {host} at {when:.3f}"
                + (f" (the leader changed at {change:.3f})" if change is not None else "")
            )
            break
    return failures


def _log_bodies(node: SimulatedNode, partition: int) -> list[bytes]:
    assert node.nsqd is not None
    topic = node.nsqd.get_partition(TOPIC, partition)
    if topic is None:
        return []
    log = node.nsqd.cluster.log_of(topic)
    return [message.body for message in log.read(log.start, 1 << 30, log.written.offset)]


def failures_of(seed: int) -> list[str]:
    """One schedule's failures (a worker process's job in `run_seeds`)."""
    return run_schedule(seed, schedule)[1]


def run_seeds(seeds: range, jobs: int = 1) -> dict[int, list[str]]:
    """The failures of each failed schedule of `seeds`, run by `jobs` processes side by side
    (each schedule is one trio run of its own: they share nothing)."""
    if jobs <= 1:
        return _failed(seeds, map(failures_of, seeds))
    import multiprocessing

    with multiprocessing.get_context("fork").Pool(jobs) as pool:
        return _failed(seeds, pool.imap(failures_of, seeds, chunksize=16))


def _failed(seeds: range, outcomes: Iterable[list[str]]) -> dict[int, list[str]]:
    return {seed: failures for seed, failures in zip(seeds, outcomes, strict=True) if failures}


def main(argv: list[str] | None = None) -> int:
    """`python -m nsqpy.fault_schedule --seed N` replays one schedule (`--trace` prints its
    trace); `--seeds FIRST:END` runs a range (`--jobs N` processes side by side). Exit status
    1 when a schedule failed."""
    import argparse
    import os

    parser = argparse.ArgumentParser(prog="python -m nsqpy.fault_schedule")
    parser.add_argument("--seed", type=int, help="one schedule's seed")
    parser.add_argument("--seeds", help="a range of seeds, FIRST:END")
    parser.add_argument("--trace", action="store_true", help="print each schedule's trace")
    parser.add_argument(
        "--jobs", type=int, default=os.cpu_count() or 1, help="processes for --seeds"
    )
    arguments = parser.parse_args(argv)
    if arguments.seed is not None and not arguments.seeds:
        trace, failures = run_schedule(arguments.seed, schedule)
        if arguments.trace:
            print("\n".join(trace))
        for failure in failures:
            print(f"seed {arguments.seed}: {failure}")
        print(f"1 schedule(s), {int(bool(failures))} failed")
        return 1 if failures else 0
    if not arguments.seeds:
        parser.error("give --seed or --seeds")
    first, _, end = arguments.seeds.partition(":")
    seeds = range(int(first), int(end))
    failed = run_seeds(seeds, arguments.jobs)
    for seed, failures in failed.items():
        for failure in failures:
            print(f"seed {seed}: {failure}")
    print(f"{len(seeds)} schedule(s), {len(failed)} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
