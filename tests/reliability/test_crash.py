"""nsqd killed with SIGKILL at seeded-random moments while a publisher streams numbered
messages over TCP and a consumer FINs them; restarted on the same data directory each time,
consumption resumes (issue #10). The trial runner is tests/reliability/crash_trials.py.

What each scenario proves, over a chain of seeded trials on one data directory:

* `--mem-queue-size=0 --sync-every=1`: every message that got `OK` is delivered at least
  once (before the kill or after the restart); nothing delivered was never sent or corrupt.
* defaults (`--mem-queue-size=10000`), and `--mem-queue-size=20` so that the bound bites
  (10 trials in the default suite):
  every write reaches the OS before its `OK`, so a kill -9 (a process crash, not a power
  loss) can only take what nsqd held in memory: at most mem-queue-size per queue (the
  topic's and the channel's) plus the messages the consumer's RDY let nsqd take from its
  queues but not yet write to the socket. Losses are counted in the report.
* a queue file roll every few messages (`--max-bytes-per-file=1024`): no acknowledged loss.
* topics and channels created and deleted over HTTP all along, so nsqd.dat is rewritten
  constantly: every restart succeeds, no acknowledged message of the durable topic is lost,
  and every topic, channel and pause flag is as its last answer left it (each change is
  journaled before its answer).

The figures are printed at the end of the session (`crash trials:` lines); seeds are fixed,
and NSQPY_CRASH_SEED picks another one.
"""

import os

import pytest

from tests.reliability.crash_trials import Report, Scenario, run_trials

SEED = int(os.environ.get("NSQPY_CRASH_SEED", "20261122"))
DURABLE = ("-mem-queue-size=0", "-sync-every=1")

SCENARIOS = {
    "durable": Scenario("durable", DURABLE, lossless=True, mem_queue_size=0),
    "defaults": Scenario("defaults", (), lossless=False, mem_queue_size=10_000),
    "small-memory": Scenario(
        "small-memory", ("-mem-queue-size=20",), lossless=False, mem_queue_size=20, ready=(1, 5)
    ),
    "file-roll": Scenario(
        "file-roll",
        (*DURABLE, "-max-bytes-per-file=1024"),
        lossless=True,
        mem_queue_size=0,
        body_size=(8, 300),
    ),
    "metadata-write": Scenario(
        "metadata-write", DURABLE, lossless=True, mem_queue_size=0, churn=(3, 40)
    ),
}

_reports: list[Report] = []


def seed_of(name: str) -> int:
    return SEED + list(SCENARIOS).index(name)


@pytest.fixture(scope="module", autouse=True)
def crash_report(request):
    """Print every run's figures once the module's tests are done."""
    yield
    plugins = request.config.pluginmanager
    reporter = plugins.get_plugin("terminalreporter")
    capture = plugins.get_plugin("capturemanager")
    if reporter is None or capture is None:
        return
    with capture.global_and_fixture_disabled():
        reporter.write_line("")
        for report in _reports:
            reporter.write_line(f"crash trials: {report.line()}")


def check(report: Report, trials: int) -> None:
    _reports.append(report)
    assert len(report.trials) == trials
    assert report.total("acked") > 0
    if report.scenario.lossless:
        assert report.total("lost") == 0
        assert report.total("delivered") == report.total("acked")


# small-memory is not one of the scenarios, and every trial costs an nsqd start.
TRIALS = {"small-memory": 10}


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_kill_9_trials(tmp_path, name):
    scenario = SCENARIOS[name]
    trials = TRIALS.get(name, 20)
    report = run_trials(scenario, tmp_path, trials=trials, seed=seed_of(name))
    check(report, trials)
    if scenario.churn:
        assert report.total("metadata_checked") > 0


@pytest.mark.slow
@pytest.mark.parametrize("name", list(SCENARIOS))
def test_kill_9_trials_long(tmp_path, name):
    scenario = SCENARIOS[name]
    longer = Scenario(
        scenario.name + "-long",
        scenario.flags,
        scenario.lossless,
        scenario.mem_queue_size,
        kill_after=(20, 3000),
        body_size=scenario.body_size,
        ready=scenario.ready,
        churn=(3, 200) if scenario.churn else None,
    )
    report = run_trials(longer, tmp_path, trials=200, seed=seed_of(name) + 1000)
    check(report, 200)
