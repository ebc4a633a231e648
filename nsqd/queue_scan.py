"""The queue-scan loop: requeue timed-out in-flight messages and release due deferred ones.

Go nsqd's queueScanLoop (nsqd.go), same options and algorithm: every `queue_scan_interval`
pick `queue_scan_selection_count` channels at random, have the worker pool process each, and
go again at once while more than `queue_scan_dirty_percent` of them had work. The pool is
resized to a quarter of the channel count (1..`queue_scan_worker_pool_max`) whenever the
channel list is refreshed (every `queue_scan_refresh_interval`, and here also as soon as a
channel is added or removed, so a new channel's timeouts are never late).

Each worker is a trio task; processing is synchronous, so the pool bounds how many channels
are in hand at once rather than adding parallelism.
"""

import random
from typing import TYPE_CHECKING

import trio

if TYPE_CHECKING:
    from nsqd.channel import Channel
    from nsqd.server import NSQD


class QueueScanner:
    def __init__(self, nsqd: "NSQD") -> None:
        self.nsqd = nsqd
        self.options = nsqd.options
        self.refresh_needed = True
        self._channels: list[Channel] = []
        self._workers: list[trio.CancelScope] = []
        self._random = random.Random()

    async def run(self) -> None:
        options = self.options
        selection_count = options.queue_scan_selection_count
        work_send, work_receive = trio.open_memory_channel(max(1, selection_count))
        response_send, response_receive = trio.open_memory_channel(max(1, selection_count))
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            next_refresh = trio.current_time() + options.queue_scan_refresh_interval
            next_scan = trio.current_time() + options.queue_scan_interval
            while True:
                now = trio.current_time()
                if self.refresh_needed or now >= next_refresh:
                    self.refresh_needed = False
                    next_refresh = now + options.queue_scan_refresh_interval
                    self._channels = self.nsqd.all_channels()
                    self._resize_pool(len(self._channels), work_receive, response_send)
                if now < next_scan:
                    await trio.sleep_until(min(next_scan, next_refresh))
                    continue
                next_scan = now + options.queue_scan_interval
                channels = self._channels
                if not channels:
                    continue
                count = min(selection_count, len(channels))
                while True:
                    for channel in self._random.sample(channels, count):
                        await work_send.send(channel)
                    dirty = 0
                    for _ in range(count):
                        dirty += await response_receive.receive()
                    if dirty / count <= options.queue_scan_dirty_percent:
                        break

    def _resize_pool(self, channel_count: int, work_receive, response_send) -> None:
        ideal = min(max(1, int(channel_count * 0.25)), self.options.queue_scan_worker_pool_max)
        while len(self._workers) < ideal:
            scope = trio.CancelScope()
            self._workers.append(scope)
            self._nursery.start_soon(self._worker, scope, work_receive, response_send)
        while len(self._workers) > ideal:
            self._workers.pop().cancel()

    @staticmethod
    async def _worker(scope: trio.CancelScope, work_receive, response_send) -> None:
        with scope:
            async for channel in work_receive:
                now = trio.current_time()
                dirty = False
                if not channel.deleted:
                    dirty = channel.process_in_flight(now)
                    dirty = channel.process_deferred(now) or dirty
                await response_send.send(dirty)
