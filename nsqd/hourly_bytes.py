"""The bytes a topic's partition received each hour of the last day: Youzan's
`HourlyPubSize`, served by `/message/historystats`.

Nothing is counted on the publish path: nsqd's clock closes each hour at its end (local
time, as Youzan's) from the partition's running total of published bytes, so an hour's bucket
is what the total grew by within it. The buckets live in memory (Youzan's are written to a
history file); a restart starts a new day of them.
"""

HOURS = 24


class HourlyBytes:
    __slots__ = ("buckets", "_hour", "_at_hour_start")

    def __init__(self, hour: int, total: int) -> None:
        self.buckets = [0] * HOURS
        self._hour = hour
        self._at_hour_start = total

    def close_hours(self, hour: int, total: int) -> None:
        """The clock reached `hour` (0-23) with `total` bytes published: the hour that ended
        gets what was published in it, and any hour it skipped (a sleeping machine) nothing."""
        if hour == self._hour:
            return
        self.buckets[self._hour] = total - self._at_hour_start
        skipped = (self._hour + 1) % HOURS
        while skipped != hour:
            self.buckets[skipped] = 0
            skipped = (skipped + 1) % HOURS
        self._hour = hour
        self._at_hour_start = total

    def current(self, total: int) -> list[int]:
        """Every hour's bucket, the running hour's what it received so far."""
        buckets = list(self.buckets)
        buckets[self._hour] = total - self._at_hour_start
        return buckets
