"""The connection clock: one task calling each connection when its timers are due."""

import math

import trio

from nsqpy.nsqd.heartbeats import RESOLUTION, HeartbeatClock


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
