"""Proved, not assumed: with one of the cluster's fixes reverted, schedules of the default run
(`test_fault_schedules.py`, seeds 0 to 999) fail. Each check names the seeds of that run that
find the defect (found with `python -m nsqpy.fault_schedule --seeds 0:1000` and the fix
reverted); a change to how schedules are drawn moves them, and this test then says to look
for them again. A defect whose window the default run reaches rarely also has a directed
schedule (`DIRECTED`), which reaches it every time."""

import sys
from types import SimpleNamespace

import pytest

from nsqpy.common.cluster_meta import ReplicaInfo
from nsqpy.daemon import http_server
from nsqpy.fault_schedule import schedule
from nsqpy.nsqd import cluster, leader_sync
from nsqpy.simulation import run_schedule
from tests.simulation.directed_schedules import a_refused_write_reaches_a_follower


def old_refusal_response(error):
    """What HTTP `/pub` answered before: the code alone, `MAYBE_STORED` dropped."""
    code = getattr(error, "code", None)
    if not isinstance(code, str):
        return http_server.v1_response(500, "INTERNAL_ERROR")
    return http_server.v1_response(400, code)


answer_match = leader_sync.LeaderSync.answer_match


def match_from_anyone(self, topic, header):
    """MATCH as it was answered before: by any node the info names, leading or not (the
    leadership check off for this call alone; the answer has no checkpoint in it)."""
    refuse = leader_sync.refuse_unless_leading
    leader_sync.refuse_unless_leading = lambda topic: None
    try:
        return answer_match(self, topic, header)
    finally:
        leader_sync.refuse_unless_leading = refuse


_data_incarnation = cluster.data_incarnation


def same_run_after_any_stop(path, starting=False, log=None):
    """The incarnation as it was kept before: the same after a crash or a power loss as after
    a clean stop."""
    return _data_incarnation(path)


held_replica = leader_sync.held_replica


def held_pushing_when_named(topic):
    """The channel push's leadership test as it was: the info naming this node leader, the
    data it proves or not (every other caller of `held_replica` gets the replica itself)."""
    replica = held_replica(topic)
    if sys._getframe(1).f_code.co_name == "push_channels":
        return SimpleNamespace(is_leader=replica.info.leader == replica.node.node_id)
    return replica


# Each reverted fix: what it patches, with what, and the seeds of the default run that then
# fail with the symptom (none: the run reaches its window too rarely; see DIRECTED).
MUTATIONS = {
    # An ISR member back on an emptied disk counted as holding the data: elected with 0
    # messages, every acknowledged one lost (209 of 209 in the chaos test that found it).
    "an emptied replica counted in the ISR": (
        ReplicaInfo,
        "proven",
        lambda self, node, incarnation: True,
        [976, 986, 987],
        "acknowledged missing",
    ),
    # A node back on an empty disk that the info still names answering a follower's MATCH:
    # the follower walked its log, the only complete copy, back to nothing (found by the
    # simulator).
    "MATCH answered by a node that cannot lead": (
        leader_sync.LeaderSync,
        "answer_match",
        match_from_anyone,
        [755],
        "acknowledged missing",
    ),
    # A node that lost power kept its incarnation: as the leader within its lease it led on
    # with a shorter log, and its followers cut acknowledged messages back to its end (found
    # by the simulator).
    "an unclean restart counted as the same run": (
        cluster,
        "data_incarnation",
        same_run_after_any_stop,
        [25, 27, 69],
        "acknowledged missing",
    ),
    # A leader that cannot prove its data (back after a power loss) pushing its channels and
    # its end: the followers cut their logs back to that end (found by the simulator: first
    # as emptied channels after a lost disk, then as this).
    "a channel push from a leader that proves nothing": (
        leader_sync,
        "held_replica",
        held_pushing_when_named,
        [468, 601],
        "acknowledged missing",
    ),
    # HTTP refusals that dropped `MAYBE_STORED`: a publish refused as not stored was stored
    # by the follower that led next (found by the simulator in an earlier form of the
    # schedule; today's default run does not reach it).
    "an HTTP refusal without MAYBE_STORED": (
        http_server,
        "refusal_response",
        old_refusal_response,
        [],
        "",
    ),
}
FOUND_BY_DEFAULT_SEEDS = [name for name, mutation in MUTATIONS.items() if mutation[3]]

# Mutations a directed schedule finds every time (with the fix in place, its own test
# passes): the schedule and the symptom.
DIRECTED = {
    "an HTTP refusal without MAYBE_STORED": (
        a_refused_write_reaches_a_follower,
        "refused as not stored",
    ),
}


def test_every_mutation_is_found_by_seeds_or_a_directed_schedule():
    assert all(mutation[3] or name in DIRECTED for name, mutation in MUTATIONS.items())


@pytest.mark.parametrize("name", DIRECTED)
def test_a_directed_schedule_finds_the_defect_when_its_fix_is_reverted(name, monkeypatch):
    owner, attribute, mutant, _seeds, _symptom = MUTATIONS[name]
    directed, symptom = DIRECTED[name]
    monkeypatch.setattr(owner, attribute, mutant)
    _trace, failures = run_schedule(0, directed)
    assert any(symptom in failure for failure in failures), failures


@pytest.mark.parametrize("name", FOUND_BY_DEFAULT_SEEDS)
def test_the_default_schedules_find_the_defect_when_its_fix_is_reverted(name, monkeypatch):
    owner, attribute, mutant, seeds, symptom = MUTATIONS[name]
    monkeypatch.setattr(owner, attribute, mutant)
    for seed in seeds:
        _trace, failures = run_schedule(seed, schedule)
        assert any(symptom in failure for failure in failures), (
            f"seed {seed} no longer finds {name!r} ({failures}): look for the seeds again with"
            " the fix reverted and `python -m nsqpy.fault_schedule --seeds 0:1000`"
        )


@pytest.mark.parametrize("name", FOUND_BY_DEFAULT_SEEDS)
def test_those_seeds_pass_with_the_fix(name):
    for seed in MUTATIONS[name][3]:
        _trace, failures = run_schedule(seed, schedule)
        assert not failures, (seed, failures)
