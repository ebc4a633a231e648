"""Memory a daemon freed, given back to the system: Go's runtime does it by itself (its
scavenger, and `debug.FreeOSMemory` behind `/debug/freememory`); CPython frees its objects
to glibc's malloc, which keeps the pages of free chunks between live ones.

Under a churn soak with `--workers=2` that kept each worker growing ~0.7 MiB a minute with no
more Python objects alive (tracemalloc's diff over 150 s: under 1 MiB): free heap pages, which
`malloc_trim(0)` returns (1-2 MiB a worker each time, and flat afterwards). Every daemon
process trims once a minute, in a worker thread; elsewhere than glibc this does nothing.
"""

import ctypes
import ctypes.util

import trio

# How often a daemon gives its free heap pages back.
SCAVENGE_INTERVAL = 60.0


def _malloc_trim():
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        trim = libc.malloc_trim
    except (OSError, AttributeError):  # not glibc
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return trim


_TRIM = _malloc_trim()


def release_free_memory() -> bool:
    """Give the free pages of the C heap back to the system (blocking: a few ms on a heap of
    hundreds of MiB); False where there is no way to."""
    if _TRIM is None:
        return False
    _TRIM(0)
    return True


async def scavenge_forever(interval: float = SCAVENGE_INTERVAL) -> None:
    """`release_free_memory` every `interval` seconds, off the event loop, until cancelled."""
    if _TRIM is None:
        return
    while True:
        await trio.sleep(interval)
        await trio.to_thread.run_sync(release_free_memory)
