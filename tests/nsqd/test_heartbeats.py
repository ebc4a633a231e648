"""The heartbeat clock: one task waking each pump when its heartbeat is due."""

import trio

from nsqpy.nsqd.heartbeats import RESOLUTION, HeartbeatClock
from nsqpy.nsqd.wakeup import Wakeup


async def test_each_wakeup_is_set_at_its_time_within_the_resolution(autojump_clock):
    clock = HeartbeatClock()
    woken: dict[str, float] = {}

    async def waiter(name: str, wakeup: Wakeup) -> None:
        await wakeup.wait()
        woken[name] = trio.current_time()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(clock.run)
        start = trio.current_time()
        wakeups = {name: Wakeup() for name in ("late", "early", "middle")}
        for name, wakeup in wakeups.items():
            nursery.start_soon(waiter, name, wakeup)
        await trio.sleep(0.5)
        clock.wake_at(start + 30, wakeups["late"])
        # Booked later but due sooner: the clock must not sleep through it.
        clock.wake_at(start + 1, wakeups["early"])
        clock.wake_at(start + 15, wakeups["middle"])
        while len(woken) < 3:
            await trio.sleep(1)
        nursery.cancel_scope.cancel()
    for name, due in (("early", 1), ("middle", 15), ("late", 30)):
        assert start + due <= woken[name] <= start + due + RESOLUTION


async def test_wakeups_due_together_are_set_in_one_pass(autojump_clock):
    clock = HeartbeatClock()
    wakeups = [Wakeup() for _ in range(1000)]
    async with trio.open_nursery() as nursery:
        nursery.start_soon(clock.run)
        due = trio.current_time() + 5
        for wakeup in wakeups:
            clock.wake_at(due, wakeup)
        await trio.sleep(5 + RESOLUTION)
        assert all(wakeup.is_set() for wakeup in wakeups)
        nursery.cancel_scope.cancel()
