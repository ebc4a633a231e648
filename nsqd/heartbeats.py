"""Every connection's timers on one heap: when its next heartbeat is due and when its read
deadline passes.

A connection that waited with a timeout of its own (a cancel scope around each read, another
around the pump's wait) paid for trio's deadline bookkeeping at every command, and for a
Cancelled exception at every heartbeat: with thousands of idle clients that was most of
nsqd's work. Instead one task keeps a heap of due times, one live entry per connection, and
calls the connection when its time comes (`ConnectionTimers.timers_due`): the connection
writes its heartbeat then and there when it can (a plain socket, no send under way), wakes
its pump when it cannot, and ends itself when its read deadline passed. One pass handles
every connection that is due, without a task switch each.

The task wakes at most every `RESOLUTION` seconds (each timed wake-up is one Cancelled
exception), so a heartbeat may go out, and a read deadline be enforced, up to that much late:
far inside the two heartbeat intervals a client's read deadline allows.
"""

import heapq
import itertools
import math
from typing import Protocol

import trio

from nsqpy.nsqd.wakeup import Wakeup

RESOLUTION = 0.05


class ConnectionTimers(Protocol):
    # When the connection's entry on the heap is due (inf: none). Written by the clock only.
    timers_at: float

    def timers_due(self, now: float) -> float:
        """Do what is due at `now`; return when the connection is due next (inf: never)."""
        ...


class HeartbeatClock:
    def __init__(self) -> None:
        self._due: list[tuple[float, int, ConnectionTimers]] = []
        self._order = itertools.count()
        self._changed = Wakeup()

    def book(self, connection: ConnectionTimers, when: float) -> None:
        """Call `connection` at `when` if that is earlier than it was due. Entries a later
        booking replaced stay on the heap until their time and are then skipped."""
        if not when < connection.timers_at:
            return
        connection.timers_at = when
        due = self._due
        earliest = due[0][0] if due else math.inf
        heapq.heappush(due, (when, next(self._order), connection))
        if when < earliest:
            self._changed.set()

    def forget(self, connection: ConnectionTimers) -> None:
        """The connection ended: its entry is skipped when it comes up."""
        connection.timers_at = -math.inf

    async def run(self) -> None:
        due = self._due
        order = self._order
        heappop, heappush = heapq.heappop, heapq.heappush
        while True:
            now = trio.current_time()
            while due and due[0][0] <= now:
                when, _, connection = heappop(due)
                if connection.timers_at != when:
                    continue  # replaced by an earlier booking, or the connection ended
                following = connection.timers_due(now)
                if following < math.inf and connection.timers_at == when:
                    connection.timers_at = following
                    heappush(due, (following, next(order), connection))
                elif connection.timers_at == when:
                    connection.timers_at = math.inf
            # Sleep until the earliest due time, or until an earlier one is added.
            wake = max(due[0][0], now + RESOLUTION) if due else math.inf
            with trio.move_on_at(wake):
                await self._changed.wait()
