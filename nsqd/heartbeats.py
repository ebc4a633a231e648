"""When each connection's next heartbeat is due, for every connection at once.

A message pump waiting for messages with a timeout of its own (a cancel scope around the
wait) pays for a trio Cancelled exception at every heartbeat: with thousands of idle clients
that was most of nsqd's work. Instead, one task keeps a heap of due times and wakes each pump
when its heartbeat is due; the pumps wait on their plain wake-up flag. The task itself wakes
at most every `RESOLUTION` seconds (each timed wake-up is one such exception), so a heartbeat
may go out up to that much late: far inside the two intervals a client's read deadline allows.
"""

import heapq
import itertools
import math

import trio

from nsqpy.nsqd.wakeup import Wakeup

RESOLUTION = 0.05


class HeartbeatClock:
    def __init__(self) -> None:
        self._due: list[tuple[float, int, Wakeup]] = []
        self._order = itertools.count()
        self._changed = Wakeup()

    def wake_at(self, when: float, wakeup: Wakeup) -> None:
        """Set `wakeup` at `when` (trio time). A wake-up set early is harmless: the pump
        checks whether its heartbeat is really due."""
        due = self._due
        earliest = due[0][0] if due else math.inf
        heapq.heappush(due, (when, next(self._order), wakeup))
        if when < earliest:
            self._changed.set()

    async def run(self) -> None:
        due = self._due
        while True:
            now = trio.current_time()
            while due and due[0][0] <= now:
                heapq.heappop(due)[2].set()
            # Sleep until the earliest due time, or until an earlier one is added.
            wake = max(due[0][0], now + RESOLUTION) if due else math.inf
            with trio.move_on_at(wake):
                await self._changed.wait()
