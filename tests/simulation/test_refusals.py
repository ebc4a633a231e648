"""A publish refused after its write reached a follower, directed under the simulator: the
leader's answers from one follower are lost and its writes to the other, so the write cannot
be acknowledged; the follower that has it leads next and keeps it. The refusal must say so
(`MAYBE_STORED`), over HTTP as over TCP: a publisher told "not stored" would otherwise count
as lost a message every consumer then gets."""

from nsqpy.simulation import run_schedule
from tests.simulation.directed_schedules import a_refused_write_reaches_a_follower


def test_a_refusal_after_the_write_reached_a_follower_says_maybe_stored() -> None:
    trace, failures = run_schedule(0, a_refused_write_reaches_a_follower)
    assert not failures, failures
    assert any("PUBLISHED 400" in line and "MAYBE_STORED" in line for line in trace)
