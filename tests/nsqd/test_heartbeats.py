"""The connection clock: one task calling each connection when its timers are due."""

import math

import trio

from nsqpy.nsqd.heartbeats import RESOLUTION, HeartbeatClock, _tick_time


class Recorder:
    """A connection that records when it was called and asks to be called every `period`."""

    def __init__(self, period: float = math.inf) -> None:
        self.timers_at = math.inf
        self.period = period
        self.calls: list[float] = []

    def timers_due(self, now: float) -> float:
        self.calls.append(now)
        return now + self.period


async def _run_clock(nursery: trio.Nursery) -> HeartbeatClock:
    clock = HeartbeatClock()
    nursery.start_soon(clock.run)
    await trio.lowlevel.checkpoint()
    return clock


async def test_each_connection_is_called_at_its_time_within_the_resolution(autojump_clock):
    async with trio.open_nursery() as nursery:
        clock = await _run_clock(nursery)
        start = trio.current_time()
        connections = {name: Recorder() for name in ("late", "early", "middle")}
        await trio.sleep(0.5)
        clock.book(connections["late"], start + 30)
        # Booked later but due sooner: the clock must not sleep through it.
        clock.book(connections["early"], start + 1)
        clock.book(connections["middle"], start + 15)
        await trio.sleep(31)
        nursery.cancel_scope.cancel()
    for name, due in (("early", 1), ("middle", 15), ("late", 30)):
        [called] = connections[name].calls
        assert start + due <= called <= start + due + RESOLUTION


async def test_connections_due_together_are_called_in_one_pass(autojump_clock):
    connections = [Recorder() for _ in range(1000)]
    async with trio.open_nursery() as nursery:
        clock = await _run_clock(nursery)
        due = trio.current_time() + 5
        for connection in connections:
            clock.book(connection, due)
        await trio.sleep(5 + RESOLUTION)
        assert all(len(connection.calls) == 1 for connection in connections)
        assert len({connection.calls[0] for connection in connections}) == 1
        nursery.cancel_scope.cancel()


async def test_a_connection_is_called_again_when_it_asks(autojump_clock):
    connection = Recorder(period=2)
    async with trio.open_nursery() as nursery:
        clock = await _run_clock(nursery)
        start = trio.current_time()
        clock.book(connection, start + 1)
        await trio.sleep(6.5)
        nursery.cancel_scope.cancel()
    assert [round(t - start) for t in connection.calls] == [1, 3, 5]


async def test_an_earlier_booking_replaces_a_later_one_and_a_later_one_is_ignored(autojump_clock):
    connection = Recorder()
    async with trio.open_nursery() as nursery:
        clock = await _run_clock(nursery)
        start = trio.current_time()
        clock.book(connection, start + 10)
        clock.book(connection, start + 4)
        clock.book(connection, start + 7)
        await trio.sleep(12)
        nursery.cancel_scope.cancel()
    [called] = connection.calls
    assert start + 4 <= called <= start + 4 + RESOLUTION


async def test_a_forgotten_connection_is_not_called(autojump_clock):
    connection = Recorder(period=1)
    async with trio.open_nursery() as nursery:
        clock = await _run_clock(nursery)
        clock.book(connection, trio.current_time() + 1)
        clock.forget(connection)
        await trio.sleep(3)
        nursery.cancel_scope.cancel()
    assert connection.calls == []


async def test_a_tick_whose_time_rounds_short_is_called_and_the_clock_moves_on(autojump_clock):
    """Tick 43 is at 43 * 0.05 = 2.15 s, and 2.15 / 0.05 rounds to 42.99...: woken at exactly
    2.15 the pass found tick 43 not yet due and slept until 2.15 again, for ever on a clock
    that does not move while every task waits (the cluster simulator found it)."""
    assert math.floor(43 * RESOLUTION / RESOLUTION) == 42
    connection = Recorder()
    with trio.fail_after(10):  # virtual seconds: a clock that spins never gets there
        async with trio.open_nursery() as nursery:
            clock = await _run_clock(nursery)
            assert trio.current_time() == 0.0  # the mock clock starts at 0
            clock.book(connection, 2.125)  # due on tick 43
            while not connection.calls:
                await trio.sleep(0.01)
            nursery.cancel_scope.cancel()
    assert len(connection.calls) == 1


def test_every_ticks_wake_time_counts_the_tick_as_come():
    """The time the clock sleeps until for a tick is one at which its pass finds it due."""
    short = [
        tick for tick in range(1, 100_000) if math.floor(tick * RESOLUTION / RESOLUTION) < tick
    ]
    assert short  # 43 among them: the multiplication alone falls short
    assert all(math.floor(_tick_time(tick) / RESOLUTION) >= tick for tick in range(1, 100_000))
    assert all(_tick_time(tick) - tick * RESOLUTION < 1e-9 for tick in short)
