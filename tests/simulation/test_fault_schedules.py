"""The cluster under the simulator (`nsqpy/simulation.py`): seeded fault schedules
(`nsqpy/fault_schedule.py`) run on the production nsqlookupd and nsqd in one trio run on a
virtual clock, each checked for what the cluster promises; a failure names its seed, and
`python -m nsqpy.fault_schedule --seed N --trace` replays it.

The default suite runs `BLOCKS` x `SEEDS_PER_BLOCK` schedules (in blocks, so that pytest's
workers share them); `-m slow` runs `SLOW_SCHEDULES` more.
"""

import os
import subprocess
import sys

import pytest

from nsqpy.fault_schedule import run_seeds, schedule
from nsqpy.simulation import run_schedule

BLOCKS = 20
SEEDS_PER_BLOCK = 50
SLOW_SCHEDULES = 100_000


def failed_seeds(seeds: range) -> dict[int, list[str]]:
    found = {}
    for seed in seeds:
        _trace, failures = run_schedule(seed, schedule)
        if failures:
            found[seed] = failures
    return found


def replay_hint(failed: dict[int, list[str]]) -> str:
    seed, failures = next(iter(failed.items()))
    return (
        f"{len(failed)} schedule(s) failed; seed {seed}: {failures[0]}\n"
        f"replay: python -m nsqpy.fault_schedule --seed {seed} --trace"
    )


@pytest.mark.parametrize("block", range(BLOCKS))
def test_fault_schedules_keep_every_acknowledged_message_in_order(block):
    seeds = range(block * SEEDS_PER_BLOCK, (block + 1) * SEEDS_PER_BLOCK)
    failed = failed_seeds(seeds)
    assert not failed, replay_hint(failed)


@pytest.mark.parametrize("seed", [105, 200])
def test_a_seed_replays_its_schedule_bit_for_bit(seed):
    """Seed 200 has a power loss: what the disk takes back replays too."""
    first = run_schedule(seed, schedule)
    again = run_schedule(seed, schedule)
    assert first == again
    trace = first[0]
    # Every daemon's log lines and the faults, not an empty run.
    assert len(trace) > 100, trace
    faults = ("CRASH", "POWER LOSS", "DISK FULL", "ISOLATE", "DROP", "SLOW", "ETCD PAUSE")
    assert any(fault in line for line in trace for fault in faults), trace


@pytest.mark.parametrize("seed", [17, 128, 129])
def test_a_seed_replays_bit_for_bit_in_another_process(seed):
    """What the replay command does: a new process, the same trace. These seeds differed now
    and then from one process to the next while the storage's commit, a crash's resets and
    the etcd model's ended connections were ordered or known by the objects' addresses."""
    command = [sys.executable, "-m", "nsqpy.fault_schedule", "--seed", str(seed), "--trace"]
    runs = [subprocess.run(command, capture_output=True, text=True, check=False) for _ in range(3)]
    assert all(run.returncode == 0 for run in runs), [run.stdout[-500:] for run in runs]
    assert runs[0].stdout == runs[1].stdout == runs[2].stdout


@pytest.mark.slow
def test_many_fault_schedules():
    seeds = range(BLOCKS * SEEDS_PER_BLOCK, SLOW_SCHEDULES)
    failed = run_seeds(seeds, jobs=os.cpu_count() or 1)
    assert not failed, replay_hint(failed)
