"""Fuzzers' worker threads: each runs its own seeded stream of connections."""

import threading
from collections.abc import Callable


def run_workers(worker: Callable[[int], None], count: int) -> None:
    """`worker(n)` for n in range(count), each in a thread of its own; returns when all end."""
    threads = [threading.Thread(target=worker, args=(n,), daemon=True) for n in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
