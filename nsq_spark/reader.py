"""The streaming reader: NSQ messages become micro-batches, FINished when Spark commits.

Everything here runs in Spark's driver-side source runner process (one per source per query),
except `readBetweenOffsets`, which runs on an executor. The offset is `{"seq": n}`, a batch
counter: NSQ cannot replay, so an offset names a batch, not a position in the stream.

At-least-once: batch n's messages stay in flight (TOUCHed) until Spark calls `commit` with
an end offset >= n, which happens once batch n's sink has committed and batch n+1 is being
planned; only then are they FINished. Anything not FINished (crash, stop, restart) is
redelivered by nsqd after its msg timeout, with attempts + 1.
"""

import datetime
import logging
import math
import queue
import time
from collections.abc import Iterator, Mapping

from pyspark.sql.datasource import SimpleDataSourceStreamReader
from pyspark.sql.streaming.datasource import SupportsTriggerAvailableNow

from common.client import Message, http_json
from nsq_spark import options as opts
from nsq_spark.subscription import Subscription

log = logging.getLogger("nsq_spark")

# A lost connection is retried at most this often, so a down nsqd costs no busy loop.
RECONNECT_INTERVAL = 1.0
# How often lookupd is asked again for nsqds that started carrying the topic.
LOOKUPD_POLL_INTERVAL = 15.0
# availableNow, with batches still pending: how long a read waits for more before it returns a
# flush batch so that Spark commits (and we FIN) them.
FLUSH_WAIT = 0.1


class NSQStreamReader(SimpleDataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, options: Mapping[str, str]) -> None:
        # No I/O here: Spark builds this object in several processes, and only the source
        # runner's copy ever reads (see docs/design.md §10).
        self.topic = opts.required(options, "topic")
        self.channel = opts.required(options, "channel")
        self.nsqd_addresses = opts.address_list(options.get("nsqd"))
        self.nsqd_http_addresses = opts.address_list(options.get("nsqd_http"))
        self.lookupd_addresses = opts.address_list(options.get("lookupd"))
        if not self.nsqd_addresses and not self.lookupd_addresses:
            raise ValueError('the nsq source needs the option "nsqd" or "lookupd"')
        self.max_batch = opts.positive_int(options, "maxBatch", opts.DEFAULT_MAX_BATCH)
        self.msg_timeout = opts.duration_seconds(options, "msgTimeout", opts.DEFAULT_MSG_TIMEOUT)
        self.idle_timeout = opts.duration_seconds(options, "idleTimeout", opts.DEFAULT_IDLE_TIMEOUT)
        self._started = False

    def _start(self) -> None:
        """Connection state, created on the first driver-side call."""
        if self._started:
            return
        self._started = True
        self.inbox: queue.SimpleQueue[tuple[Subscription, Message]] = queue.SimpleQueue()
        self.subscriptions: dict[str, Subscription] = {}
        self.http_addresses: dict[str, str] = dict(
            zip(self.nsqd_addresses, self.nsqd_http_addresses, strict=False)
        )
        self.last_attempt: dict[str, float] = {}
        self.last_lookup = 0.0
        # seq -> subscription -> [(id, attempts)]: handed to Spark, FINished on commit.
        self.pending: dict[int, dict[Subscription, list[tuple[bytes, int]]]] = {}
        # availableNow: None when not in that mode, else messages still expected (infinite
        # when some nsqd's depth is unknown: the idle timeout ends the run then).
        self.available_now_remaining: float | None = None
        self.available_now_done = False
        self.last_message_at = time.monotonic()
        self._connect()

    # -- connections --------------------------------------------------------------------------

    def _discover(self) -> None:
        if not self.lookupd_addresses:
            return
        now = time.monotonic()
        if self.last_lookup and now - self.last_lookup < LOOKUPD_POLL_INTERVAL:
            return
        self.last_lookup = now
        for producer in opts.lookupd_producers(self.lookupd_addresses, self.topic):
            tcp, http = opts.producer_addresses(producer)
            if tcp not in self.nsqd_addresses:
                self.nsqd_addresses.append(tcp)
            self.http_addresses[tcp] = http

    def _connect(self) -> None:
        """Subscribe to every known nsqd that has no live connection (rate-limited)."""
        self._discover()
        now = time.monotonic()
        for address in self.nsqd_addresses:
            current = self.subscriptions.get(address)
            if current is not None and current.alive:
                continue
            if now - self.last_attempt.get(address, -RECONNECT_INTERVAL) < RECONNECT_INTERVAL:
                continue
            self.last_attempt[address] = now
            if current is not None:
                log.warning("nsq: lost %s (%s), reconnecting", address, current.error)
                current.close()
                self._forget(current)
            try:
                self.subscriptions[address] = Subscription(
                    address,
                    self.topic,
                    self.channel,
                    max_in_flight=2 * self.max_batch,
                    msg_timeout=self.msg_timeout,
                    inbox=self.inbox,
                    http_address=self.http_addresses.get(address),
                )
            except OSError as error:
                log.warning("nsq: cannot subscribe at %s: %s", address, error)

    def _forget(self, subscription: Subscription) -> None:
        """Drop a dead connection's pending state: nsqd redelivers its messages anyway, and a
        FIN on another connection would be refused."""
        for batch in self.pending.values():
            batch.pop(subscription, None)

    # -- SimpleDataSourceStreamReader ---------------------------------------------------------

    def initialOffset(self) -> dict:
        self._start()
        return {"seq": 0}

    def prepareForTriggerAvailableNow(self) -> None:
        """Take in what the channel holds now: depth + in flight (a crashed run's messages come
        back) + the topic's own depth (not yet copied to a new channel); deferred messages are
        not available now. An nsqd whose depth cannot be read (no `nsqd_http` for it, or no
        answer from its /stats) leaves the count open: the run then reads until `idleTimeout`
        passes without a message, which drains the channel."""
        self._start()
        expected: float = 0
        for address in self.nsqd_addresses:
            http = self.http_addresses.get(address)
            if http is None:
                log.info("nsq: no nsqd_http for %s; availableNow ends after idleTimeout", address)
                expected = math.inf
                continue
            try:
                stats = http_json(http, "/stats", format="json", topic=self.topic)
            except OSError as error:
                log.warning("nsq: no /stats from %s (%s); relying on idleTimeout", http, error)
                expected = math.inf
                continue
            for topic in (stats or {}).get("topics") or []:
                if topic["topic_name"] != self.topic:
                    continue
                expected += topic["depth"]
                for channel in topic.get("channels") or []:
                    if channel["channel_name"] == self.channel:
                        expected += channel["depth"] + channel["in_flight_count"]
        self.available_now_remaining = expected
        self.last_message_at = time.monotonic()

    def read(self, start: dict) -> tuple[Iterator[tuple], dict]:
        self._start()
        seq = start["seq"]
        self._connect()
        rows, deliveries = self._take_batch()
        if rows:
            self.pending[seq + 1] = deliveries
            return iter(rows), {"seq": seq + 1}
        if any(pending_seq <= seq for pending_seq in self.pending):
            # The flush batch: Spark commits batch n only when it plans batch n+1, so without
            # an (empty) batch n+1 the last messages would never be FINished.
            return iter([]), {"seq": seq + 1}
        return iter([]), start

    def readBetweenOffsets(self, start: dict, end: dict) -> Iterator[tuple]:
        # A replayed batch after a restart: NSQ cannot replay, its messages are redelivered by
        # nsqd after their msg timeout and land in a later batch with attempts + 1.
        return iter([])

    def commit(self, end: dict) -> None:
        for seq in sorted(s for s in self.pending if s <= end["seq"]):
            for subscription, deliveries in self.pending.pop(seq).items():
                if subscription.alive:
                    subscription.finish(deliveries)
            # The FINs reopen the RDY window: availableNow's idle time starts again from here.
            self.last_message_at = time.monotonic()

    def stop(self) -> None:
        """Close the connections. Spark never calls this on a simple reader (its runner process
        is killed on query stop); it is for callers that drive the reader themselves."""
        if self._started:
            for subscription in self.subscriptions.values():
                subscription.close()

    # -- batches ------------------------------------------------------------------------------

    def _take_batch(self) -> tuple[list[tuple], dict[Subscription, list[tuple[bytes, int]]]]:
        rows: list[tuple] = []
        deliveries: dict[Subscription, list[tuple[bytes, int]]] = {}
        while len(rows) < self.max_batch and not self.available_now_done:
            item = self._next_message(have_rows=bool(rows))
            if item is None:
                break
            subscription, message = item
            rows.append(self._row(subscription, message))
            deliveries.setdefault(subscription, []).append((message.id, message.attempts))
        if self.available_now_done:
            self._release_unwanted()
        return rows, deliveries

    def _next_message(self, have_rows: bool) -> tuple[Subscription, Message] | None:
        """The next message from a live connection: a dead connection's messages are skipped,
        nsqd redelivers them on the new one."""
        while True:
            item = self._next_delivery(have_rows)
            if item is None or item[0].alive:
                return item
            if self.available_now_remaining is not None:
                self.available_now_remaining += 1  # not counted after all

    def _next_delivery(self, have_rows: bool) -> tuple[Subscription, Message] | None:
        if self.available_now_remaining is None:
            try:
                return self.inbox.get_nowait()
            except queue.Empty:
                return None
        # availableNow: an empty read ends the query, so wait for what is still expected.
        if self.available_now_remaining <= 0:
            self.available_now_done = True
            return None
        while True:
            idle_left = self.last_message_at + self.idle_timeout - time.monotonic()
            if idle_left <= 0:
                self.available_now_done = True
                return None
            if have_rows:
                wait = 0.0
            elif self.pending:
                # Our unFINished batches may fill the whole RDY window, so nothing more can
                # arrive until Spark commits them: let a flush batch through instead of waiting.
                wait = min(idle_left, FLUSH_WAIT)
            else:
                wait = min(idle_left, 0.5)
            try:
                item = self.inbox.get(timeout=wait)
            except queue.Empty:
                if have_rows or self.pending:
                    return None
                self._connect()
                continue
            self.last_message_at = time.monotonic()
            self.available_now_remaining -= 1
            return item

    def _release_unwanted(self) -> None:
        """After availableNow's snapshot is consumed: RDY 0 and REQ whatever else arrived, so
        other consumers get it now rather than after a msg timeout."""
        unwanted: dict[Subscription, list[bytes]] = {}
        for subscription in self.subscriptions.values():
            if subscription.alive:
                subscription.pause()
        while True:
            try:
                subscription, message = self.inbox.get_nowait()
            except queue.Empty:
                break
            unwanted.setdefault(subscription, []).append(message.id)
        for subscription, message_ids in unwanted.items():
            if subscription.alive:
                subscription.requeue(message_ids)

    def _row(self, subscription: Subscription, message: Message) -> tuple:
        timestamp = datetime.datetime.fromtimestamp(message.timestamp / 1e9, tz=datetime.UTC)
        return (
            message.id.decode("ascii"),
            message.body,
            message.attempts,
            timestamp,
            self.topic,
            subscription.address,
        )
