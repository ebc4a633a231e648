"""The queue-scan loop: requeue timed-out in-flight messages and release due deferred ones.

Go nsqd's queueScanLoop (nsqd.go), same options and algorithm: every `queue_scan_interval`
pick `queue_scan_selection_count` channels at random, process each, and go again at once while
more than `queue_scan_dirty_percent` of them had work. The channel list is refreshed every
`queue_scan_refresh_interval`, and here also as soon as a channel is added or removed, so a new
channel's timeouts are never late.

Go hands the selected channels to a pool of goroutines (`--queue-scan-worker-pool-max`) to
process them in parallel. Processing a channel here is synchronous and runs on the one event
loop, so a pool of tasks would add only scheduling: the channels are processed in a plain loop
(the flag is still accepted), with a checkpoint between passes so a dirty run never starves the
connections.
"""

import random
from typing import TYPE_CHECKING, Protocol

import trio

if TYPE_CHECKING:
    from nsqpy.nsqd.channel import Channel
    from nsqpy.nsqd.options import Options


class ChannelSource(Protocol):
    """What the scan asks of nsqd (`NSQD`): its options and its channels."""

    @property
    def options(self) -> "Options": ...

    def all_channels(self) -> list["Channel"]: ...


class QueueScanner:
    def __init__(self, nsqd: ChannelSource) -> None:
        self.nsqd = nsqd
        self.options = nsqd.options
        self.refresh_needed = True
        self._channels: list[Channel] = []
        self._random = random.Random()

    async def run(self) -> None:
        options = self.options
        next_refresh = trio.current_time() + options.queue_scan_refresh_interval
        next_scan = trio.current_time() + options.queue_scan_interval
        while True:
            now = trio.current_time()
            if self.refresh_needed or now >= next_refresh:
                self.refresh_needed = False
                next_refresh = now + options.queue_scan_refresh_interval
                self._channels = self.nsqd.all_channels()
            if now < next_scan:
                await trio.sleep_until(min(next_scan, next_refresh))
                continue
            next_scan = now + options.queue_scan_interval
            if self._channels:
                await self._scan(self._channels)

    async def _scan(self, channels: list["Channel"]) -> None:
        """Process random selections until no more than the dirty fraction had work."""
        options = self.options
        count = min(options.queue_scan_selection_count, len(channels))
        while True:
            now = trio.current_time()
            dirty = 0
            for channel in self._random.sample(channels, count):
                if not channel.deleted:
                    # Both, always: a channel with due deferred messages but no timed-out
                    # ones must not wait for the next interval.
                    expired = channel.process_in_flight(now)
                    released = channel.process_deferred(now)
                    dirty += expired or released
            if dirty / count <= options.queue_scan_dirty_percent:
                return
            await trio.lowlevel.checkpoint()
