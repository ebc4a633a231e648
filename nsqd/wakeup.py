"""A level-triggered wake-up flag for one waiting task, on trio.

`set()` may be called any number of times by anyone; the next `wait()` returns at once if it
was set and clears it. Unlike trio.Event it can be reused, so a message pump or a topic pump
keeps one for its whole life instead of allocating an Event per wait.
"""

import trio


class Wakeup:
    __slots__ = ("_is_set", "_lot")

    def __init__(self) -> None:
        self._is_set = False
        self._lot = trio.lowlevel.ParkingLot()

    def set(self) -> None:
        # While set, no task is parked (`wait` parks only when not set): a publish that sets
        # it again costs one test, not a look at the parking lot.
        if self._is_set:
            return
        self._is_set = True
        if self._lot:
            self._lot.unpark_all()

    def is_set(self) -> bool:
        return self._is_set

    async def wait(self) -> None:
        if not self._is_set:
            await self._lot.park()
        else:
            await trio.lowlevel.checkpoint()
        self._is_set = False
