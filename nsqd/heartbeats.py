"""Every connection's timers on one clock: when its next heartbeat is due and when its read
deadline passes.

A connection that waited with a timeout of its own (a cancel scope around each read, another
around the pump's wait) paid for trio's deadline bookkeeping at every command, and for a
Cancelled exception at every heartbeat: with thousands of idle clients that was most of
nsqd's work. Instead one task keeps the connections in sets by the tick they are due at (a
heap of ticks, one entry per connection), and calls each when its tick comes
(`ConnectionTimers.timers_due`): the connection writes its heartbeat then and there when it
can (a plain socket, no send under way), wakes its pump when it cannot, and ends itself when
its read deadline passed. One pass handles every connection that is due, without a task
switch each (in slices, so that a request waits for no more than one slice of it).

The task wakes at most every `RESOLUTION` seconds (each timed wake-up is one Cancelled
exception), so a heartbeat may go out, and a read deadline be enforced, up to that much late:
far inside the two heartbeat intervals a client's read deadline allows.
"""

import heapq
import math
from typing import Protocol

import trio

from nsqpy.nsqd.wakeup import Wakeup

RESOLUTION = 0.05
# How many connections one slice of a pass calls before the other tasks get their turn. A
# request that arrives meanwhile waits for the slice: 256 connections' heartbeats took 10-13 ms
# of wall time on a busy 2-core machine, most of the `/ping` p99 (bench/RESULTS.md).
PASS_SLICE = 64


class ConnectionTimers(Protocol):
    # When the connection is due (inf: never; -inf: it ended). Written by the clock only.
    timers_at: float

    def timers_due(self, now: float) -> float:
        """Do what is due at `now`; return when the connection is due next (inf: never)."""
        ...


def _slot(when: float) -> int:
    """The first tick at or after `when`: a connection due at `when` is called then."""
    return math.ceil(when / RESOLUTION)


def _tick_time(tick: int) -> float:
    """The first time the clock's pass counts `tick` as come (`floor(now / RESOLUTION)`
    reaches it). `tick * RESOLUTION` alone can fall a rounding short of it: woken then, the
    pass would find the tick not yet due and sleep until that same time again, for ever on a
    clock that does not move while every task waits (trio's MockClock)."""
    at = tick * RESOLUTION
    while math.floor(at / RESOLUTION) < tick:
        at = math.nextafter(at, math.inf)
    return at


class HeartbeatClock:
    def __init__(self) -> None:
        # Connections by the tick they are due at (each tick's an insertion-ordered set: a
        # dict of None), and a heap of those ticks. A booking adds an entry to a tick's set:
        # no object per booking that the cyclic GC would promote and scan (10,000 connections
        # book 10,000 times a second); and a connection that ends or moves to another tick
        # leaves its set at once, so the clock holds no connection that ended (a closed
        # connection kept until its tick, a heartbeat interval later, was most of nsqd's
        # memory under clients that connect and close by the thousand).
        self._slots: dict[int, dict[ConnectionTimers, None]] = {}
        self._ticks: list[int] = []
        self._changed = Wakeup()

    def book(self, connection: ConnectionTimers, when: float) -> None:
        """Call `connection` at `when` if that is earlier than it was due."""
        due = connection.timers_at
        if not when < due:
            return
        if due != math.inf:
            self._leave(connection, due)
        connection.timers_at = when
        slot = _slot(when)
        entries = self._slots.get(slot)
        if entries is not None:
            entries[connection] = None
            return
        self._slots[slot] = {connection: None}
        ticks = self._ticks
        earliest = ticks[0] if ticks else None
        heapq.heappush(ticks, slot)
        if earliest is None or slot < earliest:
            self._changed.set()

    def forget(self, connection: ConnectionTimers) -> None:
        """The connection ended: it leaves the clock now."""
        due = connection.timers_at
        connection.timers_at = -math.inf
        if due != math.inf and due != -math.inf:
            self._leave(connection, due)

    def _leave(self, connection: ConnectionTimers, due: float) -> None:
        # A tick being called was taken out of `_slots` first: what it calls may book or end
        # connections of that tick without changing the set it goes through.
        entries = self._slots.get(_slot(due))
        if entries is not None:
            entries.pop(connection, None)

    def booked(self) -> int:
        """How many connections the clock holds (the tests' and the stats' count)."""
        return sum(len(entries) for entries in self._slots.values())

    async def run(self) -> None:
        slots = self._slots
        ticks = self._ticks
        heappop = heapq.heappop
        inf = math.inf
        while True:
            now = trio.current_time()
            current = math.floor(now / RESOLUTION)
            called = 0
            while ticks and ticks[0] <= current:
                slot = heappop(ticks)
                for connection in slots.pop(slot):
                    when = connection.timers_at
                    if when == -inf or when == inf or _slot(when) != slot:
                        continue  # ended, or booked again, while this tick was called
                    if called == PASS_SLICE:
                        # Let the others run between slices: a /ping does not wait for a pass.
                        called = 0
                        await trio.lowlevel.checkpoint()
                    called += 1
                    following = connection.timers_due(now)
                    if connection.timers_at != when:
                        continue  # it ended or booked itself meanwhile
                    connection.timers_at = inf
                    if following < inf:
                        self.book(connection, following)
            # Sleep until the earliest tick, or until an earlier one is added.
            wake = _tick_time(ticks[0]) if ticks else inf
            with trio.move_on_at(wake):
                await self._changed.wait()
