"""Youzan's data placement as nsqpy computes it (`nsqlookupd/placement.py`): load factors,
where new partitions and replicas go, and the balancing moves, without a cluster."""

import math
from collections import Counter
from dataclasses import replace

import pytest

from nsqpy.common.cluster_meta import ReplicaInfo
from nsqpy.nsqlookupd.options import Options, OptionsError, balance_window
from nsqpy.nsqlookupd.placement import (
    MB,
    PartitionLoad,
    leader_load_factor,
    new_replica_node,
    next_leader_move,
    next_replica_move,
    node_load_factor,
    node_loads,
    place_partitions,
    write_level,
)

NODES = ["a", "b", "c"]


def infos_of(topic: str, placement: dict[int, tuple[str, ...]]) -> dict:
    return {
        (topic, partition): ReplicaInfo(nodes[0], nodes, replica=len(nodes))
        for partition, nodes in placement.items()
    }


def always_in_sync(_key, _node) -> bool:
    return True


def test_write_level_is_youzans_convert_qps_level():
    kb_per_second = 1024 * 3600
    assert write_level(0) == 1.0
    assert write_level(3 * kb_per_second) == 4.0
    assert write_level(30 * kb_per_second) == 13.0
    assert write_level(300 * kb_per_second) == 31.0
    assert write_level(1000 * kb_per_second) == 51.0
    assert write_level(10**12) == 100.0


def test_load_factors_weigh_writes_backlog_and_data_as_youzan():
    idle = PartitionLoad()
    assert leader_load_factor([]) == 0.0
    # One idle partition: write level 1 of 100 at 80 %, one MB counted for each of the rest.
    assert leader_load_factor([idle]) == pytest.approx(0.8 + 10 / 51200 + 10 / 204800)
    busy = PartitionLoad(write_bytes_per_hour=300 * 1024 * 3600, depth_bytes=100 * MB)
    assert leader_load_factor([busy]) > leader_load_factor([idle])
    factor = leader_load_factor([idle])
    assert node_load_factor(factor, [PartitionLoad(data_bytes=1024 * MB)]) > factor


@pytest.mark.parametrize(
    "partitions,replicas,nodes",
    [(6, 2, 3), (3, 2, 3), (4, 3, 3), (5, 2, 4), (1, 3, 3), (8, 3, 5), (2, 2, 4)],
)
def test_an_empty_cluster_gets_leaders_and_replicas_evenly(partitions, replicas, nodes):
    names = [f"n{i}" for i in range(nodes)]
    placement = place_partitions("t", range(partitions), replicas, names, {})
    loads = node_loads(names, infos_of("t", placement), {})
    assert all(len(set(chosen)) == replicas for chosen in placement.values())
    leaders = [loads[n].leaders for n in names]
    held = [loads[n].replicas for n in names]
    assert max(leaders) - min(leaders) <= 1, leaders
    assert max(held) - min(held) <= 1, held


def test_a_new_topic_leads_where_the_others_do_not():
    infos = infos_of("first", place_partitions("first", [0], 3, NODES, {}))
    [(leader, *followers)] = place_partitions("second", [0], 2, NODES, infos).values()
    assert leader != infos[("first", 0)].leader
    # Its follower is the node that leads nothing yet.
    assert followers[0] not in (leader, infos[("first", 0)].leader)


def test_placement_needs_as_many_nodes_as_replicas():
    with pytest.raises(ValueError, match="2 nsqd node"):
        place_partitions("t", [0], 3, ["a", "b"], {})


def test_a_new_replica_goes_to_the_least_loaded_node_without_one():
    infos = infos_of("t", {0: ("a", "b"), 1: ("a", "c")})
    assert new_replica_node("t", ["a", "b", "c", "d"], infos, exclude=["a", "b"]) == "d"
    assert new_replica_node("t", ["a", "b"], infos, exclude=["a", "b"]) is None


def apply(infos: dict, move) -> dict:
    key = (move.topic, move.partition)
    info = infos[key]
    if move.leader:
        infos[key] = replace(info, leader=move.destination)
    else:
        isr = tuple(move.destination if n == move.source else n for n in info.isr)
        infos[key] = replace(info, isr=isr)
    return infos


def test_leaders_move_back_to_a_node_that_returned():
    infos = infos_of("t", place_partitions("t", range(6), 2, NODES, {}))
    # "c" died: its partitions are led by their other replica, and it came back.
    for key, info in infos.items():
        if info.leader == "c":
            infos[key] = replace(info, leader=next(n for n in info.isr if n != "c"))
    assert Counter(info.leader for info in infos.values())["c"] == 0
    moves = 0
    while (move := next_leader_move(NODES, infos, always_in_sync)) is not None:
        assert move.leader and move.destination in infos[(move.topic, move.partition)].isr
        infos = apply(infos, move)
        moves += 1
    counts = Counter(info.leader for info in infos.values())
    assert moves == 2
    assert max(counts.values()) <= math.ceil(6 / 3) and len(counts) == 3


def test_a_leader_moves_only_to_a_caught_up_follower():
    infos = {("t", p): ReplicaInfo("a", ("a", "b"), replica=2) for p in range(4)}
    assert next_leader_move(["a", "b"], infos, lambda key, node: False) is None
    move = next_leader_move(["a", "b"], infos, always_in_sync)
    assert (move.source, move.destination) == ("a", "b")


def test_the_least_loaded_partition_moves_first():
    infos = {("t", p): ReplicaInfo("a", ("a", "b"), replica=2) for p in range(4)}
    busy = PartitionLoad(write_bytes_per_hour=1000 * 1024 * 3600)
    loads = {("t", 0): busy, ("t", 1): busy, ("t", 2): PartitionLoad(), ("t", 3): busy}
    move = next_leader_move(["a", "b"], infos, always_in_sync, loads)
    assert move.partition == 2


def test_the_cluster_is_balanced_across_topics_too():
    # Four one-partition topics, all led by "a": each topic alone is balanced.
    infos = {(f"t{i}", 0): ReplicaInfo("a", ("a", "b"), replica=2) for i in range(4)}
    move = next_leader_move(["a", "b"], infos, always_in_sync)
    assert move is not None and move.destination == "b"


def test_replicas_spread_to_a_new_node():
    infos = infos_of("t", place_partitions("t", range(4), 2, ["a", "b"], {}))
    move = next_replica_move(["a", "b", "c"], infos)
    assert move is not None and not move.leader and move.destination == "c"
    assert move.source in infos[(move.topic, move.partition)].followers()
    assert next_replica_move(["a", "b"], infos) is None


@pytest.mark.parametrize(
    "values,window",
    [((), (0, 23)), (("off",), None), (("2,4",), (2, 4)), (("2", "4"), (2, 4))],
)
def test_balance_interval(values, window):
    assert balance_window(Options(balance_interval=values)) == window


@pytest.mark.parametrize("values", [("4,2",), ("2",), ("2,25",), ("x,y",), ("1,2,3",)])
def test_a_bad_balance_interval_is_refused(values):
    with pytest.raises(OptionsError, match="balance-interval"):
        balance_window(Options(balance_interval=values))
