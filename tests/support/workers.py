"""`--workers` in tests: topic names each worker owns, and the workers' processes."""

import os

from nsqpy.nsqd.worker import owner_of

WORKERS = 2


def topics_on_both(count: int, prefix: str = "w") -> list[str]:
    """`count` topic names, half owned by each worker."""
    owned: dict[int, list[str]] = {0: [], 1: []}
    index = 0
    while min(len(names) for names in owned.values()) < count // 2:
        name = f"{prefix}{index}"
        owned[owner_of(name, 0, WORKERS)].append(name)
        index += 1
    return [name for pair in zip(owned[0], owned[1], strict=False) for name in pair][:count]


def worker_pids(daemon) -> list[int]:
    """The worker processes of an nsqd started with `-workers` (its supervisor's children)."""
    pid = daemon.process.pid
    children = []
    for thread in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{thread}/children") as listed:
            children += [int(child) for child in listed.read().split()]
    return children
