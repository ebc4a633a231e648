"""Proved, not assumed: with one of the cluster's fixes reverted, schedules of the default run
(`test_fault_schedules.py`, seeds 0 to 999) fail. Each check names the seeds of that run that
find the defect (found with `python -m nsqpy.fault_schedule --seeds 0:1000` and the fix
reverted); a change to how schedules are drawn moves them, and this test then says to look
for them again."""

import pytest

from nsqpy.common.cluster_meta import ReplicaInfo
from nsqpy.daemon import http_server
from nsqpy.fault_schedule import schedule
from nsqpy.nsqd import cluster
from nsqpy.simulation import run_schedule


def old_refusal_response(error):
    """What HTTP `/pub` answered before: the code alone, `MAYBE_STORED` dropped."""
    code = getattr(error, "code", None)
    if not isinstance(code, str):
        return http_server.v1_response(500, "INTERNAL_ERROR")
    return http_server.v1_response(400, code)


_answer_match = cluster.ClusterNode._answer_match


def match_from_anyone(self, topic, header):
    """MATCH as it was answered before: by any node the info names, leading or not (the
    leadership check off for this call alone; the answer has no checkpoint in it)."""
    refuse = cluster._refuse_unless_leading
    cluster._refuse_unless_leading = lambda topic: None
    try:
        return _answer_match(self, topic, header)
    finally:
        cluster._refuse_unless_leading = refuse


MUTATIONS = {
    # An ISR member back on an emptied disk counted as holding the data: elected with 0
    # messages, every acknowledged one lost (209 of 209 in the chaos test that found it).
    "an emptied replica counted in the ISR": (
        ReplicaInfo,
        "proven",
        lambda self, node, incarnation: True,
        [468, 524, 538],
        "acknowledged missing",
    ),
    # A node back on an empty disk that the info still names answering a follower's MATCH:
    # the follower walked its log, the only complete copy, back to nothing (found by the
    # simulator).
    "MATCH answered by a node that cannot lead": (
        cluster.ClusterNode,
        "_answer_match",
        match_from_anyone,
        [524, 538, 755],
        "on no replica",
    ),
    # HTTP refusals that dropped `MAYBE_STORED`: a publish refused as not stored was stored
    # by the follower that led next (found by the simulator).
    "an HTTP refusal without MAYBE_STORED": (
        http_server,
        "refusal_response",
        old_refusal_response,
        [704, 987],
        "refused as not stored are stored",
    ),
}


@pytest.mark.parametrize("name", MUTATIONS)
def test_the_default_schedules_find_the_defect_when_its_fix_is_reverted(name, monkeypatch):
    owner, attribute, mutant, seeds, symptom = MUTATIONS[name]
    monkeypatch.setattr(owner, attribute, mutant)
    for seed in seeds:
        _trace, failures = run_schedule(seed, schedule)
        assert any(symptom in failure for failure in failures), (
            f"seed {seed} no longer finds {name!r} ({failures}): look for the seeds again with"
            " the fix reverted and `python -m nsqpy.fault_schedule --seeds 0:1000`"
        )


@pytest.mark.parametrize("name", MUTATIONS)
def test_those_seeds_pass_with_the_fix(name):
    for seed in MUTATIONS[name][3]:
        _trace, failures = run_schedule(seed, schedule)
        assert not failures, (seed, failures)
