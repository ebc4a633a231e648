"""Where a cluster's partitions go and when they move (Youzan's data placement,
`consistence/data_placement_mgr.go`): load factors, placing new partitions and replicas, and the
one move at a time that balances leaders and replicas. Pure functions over the cluster's
metadata and the load the master measured; `nsqlookupd/replica_moves.py` carries the moves out.

* **Load factors**, Youzan's formulas: a node's *leader load factor* weighs what it leads,
  80 % by write rate (Youzan's write level, 1–100, from bytes published per hour), 10 % by data
  its channels have yet to consume and 10 % by the data it keeps as leader; its *node load
  factor* adds 5 % by all the data it keeps, led or followed.
* **Placement**: the new partitions' leaders first, each on the node leading the fewest
  partitions of the topic, then of the cluster, then with the lowest leader load factor; then
  their followers, each on the node holding the fewest replicas of the topic, then of the
  cluster, then with the lowest node load factor, then leading the fewest. On an empty cluster
  every node leads and holds as many as the others, give or take one.
* **Balance** (`next_leader_move`, `next_replica_move`): no node leads more than
  ⌈partitions / nodes⌉ of a topic's partitions, nor of the cluster's; a leader moves only to a
  caught-up member of its ISR, the partition with the least load first (moving a busy one
  costs its publishers most). Replicas even out once the leaders are: a follower replica moves
  from the node holding most to the one holding fewest when they differ by two or more.
"""

import math
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from nsqpy.common.cluster_meta import ReplicaInfo

# Youzan's caps (data_placement_mgr.go).
HIGHEST_PUB_QPS_LEVEL = 100.0
HIGHEST_LEFT_CONSUME_MB = 50 * 1024
HIGHEST_LEFT_DATA_MB = 200 * 1024
MB = 1024 * 1024

PartitionKey = tuple[str, int]


@dataclass(frozen=True)
class PartitionLoad:
    """What a partition's leader measured of it."""

    write_bytes_per_hour: float = 0.0
    depth_bytes: int = 0
    data_bytes: int = 0


def write_level(bytes_per_hour: float) -> float:
    """Youzan's convertQPSLevel: 1–13 below 30 KB/s, up to 31 below 1 MB/s, up to 74 below
    8 MB/s, 100 at most."""
    qps = int(bytes_per_hour / 3600 / 1024)
    if qps <= 3:
        return 1.0 + qps
    if qps <= 30:
        return 4.0 + (qps - 3) / 3
    if qps <= 300:
        return 13.0 + (qps - 30) / 15
    if qps <= 1000:
        return 31.0 + (qps - 300) / 35
    if qps <= 2000:
        return 51.0 + math.log2(1.0 + qps - 1000)
    if qps <= 8000:
        return 61.0 + math.log2(1.0 + qps - 2000)
    if qps <= 16000:
        return 74.0 + math.log2(1.0 + qps - 8000)
    return HIGHEST_PUB_QPS_LEVEL


def leader_load_factor(led: Iterable[PartitionLoad]) -> float:
    """Youzan's GetNodeLeaderLoadFactor over the partitions a node leads."""
    led = list(led)
    if not led:
        return 0.0
    write = min(write_level(sum(load.write_bytes_per_hour for load in led)), HIGHEST_PUB_QPS_LEVEL)
    left = min(sum(load.depth_bytes for load in led) // MB + len(led), HIGHEST_LEFT_CONSUME_MB)
    data = min(sum(load.data_bytes for load in led) // MB + len(led), HIGHEST_LEFT_DATA_MB)
    return (
        write / HIGHEST_PUB_QPS_LEVEL * 80.0
        + left / HIGHEST_LEFT_CONSUME_MB * 10.0
        + data / HIGHEST_LEFT_DATA_MB * 10.0
    )


def node_load_factor(leader_factor: float, held: Iterable[PartitionLoad]) -> float:
    """Youzan's GetNodeLoadFactor: the leader load factor plus all the data the node keeps."""
    held = list(held)
    data = min(sum(load.data_bytes for load in held) // MB + len(held), HIGHEST_LEFT_DATA_MB)
    return leader_factor + data / HIGHEST_LEFT_DATA_MB * 5.0


def partition_load_factor(load: PartitionLoad) -> float:
    """Youzan's GetTopicLeaderLoadFactor: one partition's share of its leader's load."""
    return leader_load_factor([load])


@dataclass(frozen=True)
class NodeLoad:
    node: str
    leaders: int
    replicas: int
    leader_load_factor: float
    node_load_factor: float


def node_loads(
    nodes: Iterable[str],
    infos: dict[PartitionKey, ReplicaInfo],
    loads: dict[PartitionKey, PartitionLoad],
) -> dict[str, NodeLoad]:
    """Each node's leaders, replicas (ISR and catch-up) and load factors."""
    led: dict[str, list[PartitionLoad]] = {node: [] for node in nodes}
    held: dict[str, list[PartitionLoad]] = {node: [] for node in nodes}
    for key, info in infos.items():
        load = loads.get(key, PartitionLoad())
        if info.leader in led:
            led[info.leader].append(load)
        for node in _holders(info):
            if node in held:
                held[node].append(load)
    result = {}
    for node in led:
        leader_factor = leader_load_factor(led[node])
        result[node] = NodeLoad(
            node,
            len(led[node]),
            len(held[node]),
            leader_factor,
            node_load_factor(leader_factor, held[node]),
        )
    return result


def _holders(info: ReplicaInfo) -> list[str]:
    return list(dict.fromkeys([*info.isr, *info.catchup]))


def place_partitions(
    topic: str,
    partitions: Iterable[int],
    replica: int,
    nodes: Iterable[str],
    infos: dict[PartitionKey, ReplicaInfo],
    loads: dict[PartitionKey, PartitionLoad] | None = None,
) -> dict[int, tuple[str, ...]]:
    """Each new partition's nodes, its leader first (see the module docstring). ValueError
    when there are fewer nodes than `replica`."""
    nodes = sorted(nodes)
    if len(nodes) < replica:
        raise ValueError(f"{len(nodes)} nsqd node(s) for {replica} replicas")
    factors = node_loads(nodes, infos, loads or {})
    leaders = Counter({node: factors[node].leaders for node in nodes})
    replicas = Counter({node: factors[node].replicas for node in nodes})
    topic_leaders: Counter[str] = Counter()
    topic_replicas: Counter[str] = Counter()
    for (name, _partition), info in infos.items():
        if name == topic:
            topic_leaders[info.leader] += 1
            topic_replicas.update(_holders(info))
    # The leaders first, spread over the nodes; then each partition's followers on the nodes
    # holding the fewest replicas (choosing followers partition by partition along with the
    # leaders would load a node that is yet to lead with followers too).
    partitions = list(partitions)
    placed: dict[int, list[str]] = {}
    for partition in partitions:
        leader = min(
            nodes,
            key=lambda n: (
                topic_leaders[n],
                leaders[n],
                round(factors[n].leader_load_factor, 1),
                topic_replicas[n],
                replicas[n],
                n,
            ),
        )
        topic_leaders[leader] += 1
        leaders[leader] += 1
        topic_replicas[leader] += 1
        replicas[leader] += 1
        placed[partition] = [leader]
    position = {node: index for index, node in enumerate(nodes)}
    # A follower for each partition in turn, then a second one for each, and so on.
    for _round in range(replica - 1):
        for partition in partitions:
            chosen = placed[partition]
            after = position[chosen[0]]
            follower = min(
                (n for n in nodes if n not in chosen),
                key=lambda n: (
                    topic_replicas[n],
                    replicas[n],
                    round(factors[n].node_load_factor, 1),
                    # Youzan weighs a follower 0.7 of a leader: the busier with leaders last.
                    leaders[n],
                    # Then the nodes after the leader in turn, as round-robin places them.
                    (position[n] - after) % len(nodes),
                ),
            )
            topic_replicas[follower] += 1
            replicas[follower] += 1
            chosen.append(follower)
    return {partition: tuple(chosen) for partition, chosen in placed.items()}


def new_replica_node(
    topic: str,
    nodes: Iterable[str],
    infos: dict[PartitionKey, ReplicaInfo],
    exclude: Iterable[str],
    loads: dict[PartitionKey, PartitionLoad] | None = None,
) -> str | None:
    """The node a partition's new replica goes to (a replacement, a node removal, more
    replicas): the one holding the fewest replicas of the topic, then of the cluster, then
    with the lowest node load factor; None when every node is excluded."""
    excluded = set(exclude)
    candidates = sorted(node for node in nodes if node not in excluded)
    if not candidates:
        return None
    factors = node_loads(candidates, infos, loads or {})
    topic_replicas: Counter[str] = Counter()
    for (name, _partition), info in infos.items():
        if name == topic:
            topic_replicas.update(_holders(info))
    return min(
        candidates,
        key=lambda n: (
            topic_replicas[n],
            factors[n].replicas,
            round(factors[n].node_load_factor, 1),
            n,
        ),
    )


@dataclass(frozen=True)
class Move:
    """Move a partition's leadership (`leader`) or a follower replica from one node to
    another."""

    topic: str
    partition: int
    source: str
    destination: str
    leader: bool

    def __str__(self) -> str:
        what = "leader" if self.leader else "replica"
        return f"{self.topic}/{self.partition} {what} {self.source} -> {self.destination}"


def next_leader_move(
    nodes: Iterable[str],
    infos: dict[PartitionKey, ReplicaInfo],
    in_sync: Callable[[PartitionKey, str], bool],
    loads: dict[PartitionKey, PartitionLoad] | None = None,
    groups: Iterable[Iterable[PartitionKey]] = (),
) -> Move | None:
    """The one leader move that brings the cluster closest to balance, or None when no node
    leads more than its share (⌈partitions / nodes⌉) of any topic, of any extra `group` of
    partitions (the busiest, with top-N balance), or of the cluster, or when no caught-up
    ISR member can take the excess. `in_sync(partition, node)`: whether the node has the
    partition's whole log now."""
    nodes = sorted(nodes)
    if len(nodes) < 2:
        return None
    loads = loads or {}
    by_topic: dict[str, list[PartitionKey]] = {}
    for key in infos:
        by_topic.setdefault(key[0], []).append(key)
    totals = Counter(info.leader for info in infos.values())
    rounds = [sorted(keys) for _topic, keys in sorted(by_topic.items())]
    rounds.extend(sorted(group) for group in groups)
    rounds.append(sorted(infos))
    for keys in rounds:
        move = _move_within(keys, nodes, infos, in_sync, loads, totals, by_topic)
        if move is not None:
            return move
    return None


def _move_within(
    keys: list[PartitionKey],
    nodes: list[str],
    infos: dict[PartitionKey, ReplicaInfo],
    in_sync: Callable[[PartitionKey, str], bool],
    loads: dict[PartitionKey, PartitionLoad],
    totals: Counter,
    by_topic: dict[str, list[PartitionKey]],
) -> Move | None:
    """A leader move from a node leading more than its share of `keys` to an ISR member
    leading less, without taking that member over its share of the partition's topic."""
    eligible = set(nodes)
    limit = math.ceil(len(keys) / len(nodes))
    counts = Counter(infos[key].leader for key in keys if infos[key].leader in eligible)
    overloaded = sorted(
        (node for node in nodes if counts[node] > limit), key=lambda n: (-counts[n], n)
    )
    for source in overloaded:
        led = sorted(
            (key for key in keys if infos[key].leader == source),
            key=lambda key: (partition_load_factor(loads.get(key, PartitionLoad())), key),
        )
        for key in led:
            info = infos[key]
            topic_keys = by_topic[key[0]]
            topic_limit = math.ceil(len(topic_keys) / len(nodes))
            topic_counts = Counter(infos[other].leader for other in topic_keys)
            candidates = [
                node
                for node in info.followers()
                if node in eligible
                and counts[node] + 1 <= limit
                and counts[node] + 1 < counts[source]
                and topic_counts[node] + 1 <= max(topic_limit, topic_counts[source] - 1)
                and in_sync(key, node)
            ]
            if candidates:
                destination = min(candidates, key=lambda n: (counts[n], totals[n], n))
                return Move(key[0], key[1], source, destination, leader=True)
    return None


def next_replica_move(
    nodes: Iterable[str],
    infos: dict[PartitionKey, ReplicaInfo],
) -> Move | None:
    """A follower replica from the node holding most replicas to the one holding fewest, when
    they differ by two or more and the latter holds no replica of that partition; the
    partition whose topic the destination holds least of first."""
    nodes = sorted(nodes)
    if len(nodes) < 2:
        return None
    eligible = set(nodes)
    held = Counter({node: 0 for node in nodes})
    for info in infos.values():
        for node in _holders(info):
            if node in eligible:
                held[node] += 1
    source = max(nodes, key=lambda n: (held[n], n))
    destination = min(nodes, key=lambda n: (held[n], n))
    if held[source] - held[destination] < 2:
        return None
    topic_held = Counter(key[0] for key, info in infos.items() if destination in _holders(info))
    choices = sorted(
        (
            key
            for key, info in infos.items()
            if source in info.followers()
            and source not in info.catchup
            and destination not in _holders(info)
        ),
        key=lambda key: (topic_held[key[0]], key),
    )
    if not choices:
        return None
    topic, partition = choices[0]
    return Move(topic, partition, source, destination, leader=False)
