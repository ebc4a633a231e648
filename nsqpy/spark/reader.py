"""The streaming reader of classic topics: NSQ messages become micro-batches, FINished when Spark
commits.

Everything here runs in Spark's driver-side source runner process (one per source per query),
except `readBetweenOffsets`, which runs on an executor. The offset is `{"seq": n}`, a batch
counter: NSQ cannot replay, so an offset names a batch, not a position in the stream.

At-least-once: batch n's messages stay in flight (TOUCHed) until Spark calls `commit` with
an end offset >= n, which happens once batch n's sink has committed and batch n+1 is being
planned; only then are they FINished, on the connection that received them. Anything not
FINished (crash, stop, restart) is redelivered by nsqd after its msg timeout, with attempts + 1.
Duplicates are possible, order is not kept.

Throughput: Spark pays a fixed cost per micro-batch (offset and commit logs, planning: ~0.1 s
on a small machine), so batches must be large (`maxBatch`, 10,000 rows by default). Batch n-1
is still un-FINished while batch n is read, so two batches are in flight per nsqd, spread over
`connectionsPerNsqd` connections, because nsqd caps each connection's RDY at its
--max-rdy-count; by default there are as many connections as that cap requires (8 for the
default cap of 2500), which the first connection learns from IDENTIFY. The source runner
holds up to 2 x `maxBatch` messages per nsqd: lower it for large bodies. Each batch goes to
Spark as one Arrow record batch with the source's schema (columns are matched by name; the
`partition` and `offset` columns of log topics are null here).
"""

import logging
import math
import queue
import time
from collections import deque
from collections.abc import Iterator, Mapping

import pyarrow as pa
from pyspark.sql.datasource import SimpleDataSourceStreamReader
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.streaming.datasource import SupportsTriggerAvailableNow
from pyspark.sql.types import (
    StructType,
)

from nsqpy.client.blocking import http_json
from nsqpy.client.security import Security
from nsqpy.spark import options as opts
from nsqpy.spark.log_records import LOG_APPEND_TIME
from nsqpy.spark.source import SCHEMA
from nsqpy.spark.subscription import Delivery, Subscription

log = logging.getLogger("nsqpy.spark")

# Spark's per-batch cost is amortised over this many rows; two batches are in flight, which
# nsqd's default --max-rdy-count of 2500 spreads over 8 connections per nsqd.
DEFAULT_MAX_BATCH = 10_000
# A lost connection is retried at most this often, so a down nsqd costs no busy loop.
RECONNECT_INTERVAL = 1.0
# How often lookupd is asked again for nsqds that started carrying the topic.
LOOKUPD_POLL_INTERVAL = 15.0
# availableNow, with batches still pending: how long a read waits for more before it returns a
# flush batch so that Spark commits (and we FIN) them.
FLUSH_WAIT = 0.1
# How long a commit waits for its FINs to reach the sockets: the runner process may be killed
# right after the last commit of an availableNow query.
FIN_FLUSH_TIMEOUT = 10.0


class ClassicTopicOptions:
    """What the readers of a classic topic (this stream reader, the batch reader of
    nsqpy/spark/classic_batch.py) take: one topic, its channel, where its nsqds are, how
    many rows a batch holds, the consumer's timeouts and TLS/AUTH. No I/O: Spark builds
    readers in several processes (docs/design.md §10)."""

    def __init__(self, options: Mapping[str, str]) -> None:
        selection = opts.topic_selection(options)
        if selection.single is None:
            raise ValueError(
                f"nsq: {selection.describe()} are classic topics, which are read one at a"
                " time (the channel's consumers are the reader's); log topics can be read"
                " together"
            )
        self.topic = selection.single
        self.channel = opts.required(options, "channel")
        self.nsqd_addresses = opts.address_list(options.get("nsqd"))
        self.nsqd_http_addresses = opts.address_list(options.get("nsqd_http"))
        self.lookupd_addresses = opts.address_list(options.get("lookupd"))
        if not self.nsqd_addresses and not self.lookupd_addresses:
            raise ValueError('the nsq source needs the option "nsqd" or "lookupd"')
        self.max_batch = opts.positive_int(options, "maxBatch", DEFAULT_MAX_BATCH)
        self.msg_timeout = opts.duration_seconds(options, "msgTimeout", opts.DEFAULT_MSG_TIMEOUT)
        self.idle_timeout = opts.duration_seconds(options, "idleTimeout", opts.DEFAULT_IDLE_TIMEOUT)
        self.security = opts.security(options)

    def backlog(self, address: str, http: str | None) -> int | None:
        """What the channel holds at the nsqd of TCP `address` now (`channel_backlog`); None
        when that cannot be read (no `nsqd_http` for it, or no answer from its /stats): the
        reader then reads until `idleTimeout` passes without a message."""
        if http is None:
            log.info("nsq: no nsqd_http for %s; reading it ends after idleTimeout", address)
            return None
        try:
            return channel_backlog(http, self.topic, self.channel, self.security)
        except OSError as error:
            log.warning("nsq: no /stats from %s (%s); relying on idleTimeout", http, error)
            return None


class NSQStreamReader(
    ClassicTopicOptions, SimpleDataSourceStreamReader, SupportsTriggerAvailableNow
):
    def __init__(self, options: Mapping[str, str], schema: StructType = SCHEMA) -> None:
        # Only the source runner's copy ever reads (see docs/design.md §10).
        super().__init__(options)
        # 0 when not given: as many as two batches need (see _connect).
        self.connections_per_nsqd = opts.positive_int(options, "connectionsPerNsqd", 0)
        self.schema = schema
        self._started = False

    def _start(self) -> None:
        """Connection state, created on the first driver-side call."""
        if self._started:
            return
        self._started = True
        self.arrow_schema = to_arrow_schema(self.schema, timezone="UTC")
        self.inbox: queue.SimpleQueue[tuple[Subscription, list[Delivery]]] = queue.SimpleQueue()
        # Chunks taken off the inbox but not handed to Spark yet (a batch ended inside them).
        self.leftover: deque[tuple[Subscription, list[Delivery]]] = deque()
        self.subscriptions: dict[tuple[str, int], Subscription] = {}
        self.http_addresses: dict[str, str] = dict(
            zip(self.nsqd_addresses, self.nsqd_http_addresses, strict=False)
        )
        self.last_attempt: dict[tuple[str, int], float] = {}
        # Per nsqd, once its first connection told its max_rdy_count: how many connections,
        # and the RDY of each.
        self.connection_counts: dict[str, int] = {}
        self.rdy_per_connection: dict[str, int] = {}
        self.last_lookup = 0.0
        # seq -> [(subscription, deliveries)]: handed to Spark, FINished on commit.
        self.pending: dict[int, list[tuple[Subscription, list[Delivery]]]] = {}
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
        """Open every connection that is not live (each retried at most every
        RECONNECT_INTERVAL): `connectionsPerNsqd` per known nsqd, by default as many as its
        max_rdy_count needs to hold two batches, which the first connection learns."""
        self._discover()
        now = time.monotonic()
        for address in self.nsqd_addresses:
            index = 0
            while index < self.connection_counts.get(address, 1):
                self._ensure_connection(address, index, now)
                index += 1

    def _ensure_connection(self, address: str, index: int, now: float) -> None:
        key = (address, index)
        current = self.subscriptions.get(key)
        if current is not None and current.alive:
            return
        if now - self.last_attempt.get(key, -RECONNECT_INTERVAL) < RECONNECT_INTERVAL:
            return
        self.last_attempt[key] = now
        if current is not None:
            log.warning("nsq: lost %s (%s), reconnecting", address, current.error)
            current.close()
            self._forget(current)
        # Batch n-1 is still in flight while batch n is read: two batches per nsqd, shared by
        # its connections.
        window = 2 * self.max_batch
        try:
            subscription = Subscription(
                address,
                self.topic,
                self.channel,
                max_in_flight=self.rdy_per_connection.get(address, window),
                msg_timeout=self.msg_timeout,
                inbox=self.inbox,
                http_address=self.http_addresses.get(address),
                security=self.security,
            )
        except OSError as error:
            log.warning("nsq: cannot subscribe at %s: %s", address, error)
            return
        self.subscriptions[key] = subscription
        if address not in self.connection_counts:
            max_rdy = subscription.max_rdy_count
            count = self.connections_per_nsqd or math.ceil(window / max_rdy)
            per_connection = math.ceil(window / count)
            if per_connection > max_rdy:
                log.warning(
                    "nsq: %d connections to %s with max_rdy_count %d hold %d messages, less"
                    " than two batches of maxBatch %d: batches will alternate with empty ones;"
                    " leave connectionsPerNsqd unset or raise it",
                    count,
                    address,
                    max_rdy,
                    count * max_rdy,
                    self.max_batch,
                )
            self.connection_counts[address] = count
            self.rdy_per_connection[address] = per_connection
            if subscription.max_in_flight != min(per_connection, max_rdy):
                subscription.ready(per_connection)

    def _forget(self, subscription: Subscription) -> None:
        """Drop a dead connection's pending state: nsqd redelivers its messages anyway, and a
        FIN on another connection would be refused."""
        for seq, batch in self.pending.items():
            self.pending[seq] = [(s, chunk) for s, chunk in batch if s is not subscription]

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
            held = self.backlog(address, self.http_addresses.get(address))
            expected = math.inf if held is None else expected + held
        self.available_now_remaining = expected
        self.last_message_at = time.monotonic()

    def read(self, start: dict) -> tuple[Iterator[pa.RecordBatch], dict]:
        self._start()
        seq = start["seq"]
        self._connect()
        taken, count = self._take_batch()
        if count:
            self.pending[seq + 1] = taken
            # A list iterator, not a generator: Spark copies it (copy.copy) to replay its cache.
            chunks = [(subscription.address, chunk) for subscription, chunk in taken]
            batch = deliveries_to_batch(chunks, self.topic, self.arrow_schema)
            return iter([batch]), {"seq": seq + 1}
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
        finished: dict[Subscription, list[list[Delivery]]] = {}
        for seq in sorted(s for s in self.pending if s <= end["seq"]):
            for subscription, chunk in self.pending.pop(seq):
                finished.setdefault(subscription, []).append(chunk)
            # The FINs reopen the RDY window: availableNow's idle time starts again from here.
            self.last_message_at = time.monotonic()
        # Queue every connection's FINs before waiting for any, so they go out in parallel.
        live = [s for s in finished if s.alive]
        for subscription in live:
            subscription.finish(d for chunk in finished[subscription] for d in chunk)
        for subscription in live:
            subscription.flush(FIN_FLUSH_TIMEOUT)

    def stop(self) -> None:
        """Close the connections. Spark never calls this on a simple reader (its runner process
        is killed on query stop); it is for callers that drive the reader themselves."""
        if self._started:
            for subscription in self.subscriptions.values():
                subscription.close()

    # -- batches ------------------------------------------------------------------------------

    def _take_batch(self) -> tuple[list[tuple[Subscription, list[Delivery]]], int]:
        """Up to maxBatch deliveries (and, in availableNow, no more than still expected), as
        (subscription, deliveries) chunks, and their count."""
        taken: list[tuple[Subscription, list[Delivery]]] = []
        count = 0
        while count < self.max_batch and not self.available_now_done:
            limit = self.max_batch - count
            if self.available_now_remaining is not None:
                if self.available_now_remaining <= 0:
                    self.available_now_done = True
                    break
                if self.available_now_remaining < limit:
                    limit = math.ceil(self.available_now_remaining)
            item = self._next_chunk(have_rows=count > 0, limit=limit)
            if item is None:
                break
            taken.append(item)
            count += len(item[1])
            if self.available_now_remaining is not None:
                self.available_now_remaining -= len(item[1])
        if self.available_now_done:
            self._release_unwanted()
        return taken, count

    def _next_chunk(
        self, have_rows: bool, limit: int
    ) -> tuple[Subscription, list[Delivery]] | None:
        """The next deliveries of a live connection, at most `limit`: a dead connection's
        messages are skipped, nsqd redelivers them on the new one."""
        while True:
            item = self.leftover.popleft() if self.leftover else self._next_arrival(have_rows)
            if item is None:
                return None
            subscription, chunk = item
            if not subscription.alive:
                continue
            if len(chunk) > limit:
                self.leftover.appendleft((subscription, chunk[limit:]))
                chunk = chunk[:limit]
            return subscription, chunk

    def _next_arrival(self, have_rows: bool) -> tuple[Subscription, list[Delivery]] | None:
        if self.available_now_remaining is None:
            try:
                return self.inbox.get_nowait()
            except queue.Empty:
                return None
        # availableNow: an empty read ends the query, so wait for what is still expected.
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
                item = self.inbox.get(timeout=wait) if wait > 0 else self.inbox.get_nowait()
            except queue.Empty:
                if have_rows or self.pending:
                    return None
                self._connect()
                continue
            self.last_message_at = time.monotonic()
            return item

    def _release_unwanted(self) -> None:
        """After availableNow's snapshot is consumed: RDY 0 and REQ whatever else arrived, so
        other consumers get it now rather than after a msg timeout."""
        for subscription in self.subscriptions.values():
            if subscription.alive:
                subscription.pause()
        unwanted: dict[Subscription, list[Delivery]] = {}
        while self.leftover:
            subscription, chunk = self.leftover.popleft()
            unwanted.setdefault(subscription, []).extend(chunk)
        while True:
            try:
                subscription, chunk = self.inbox.get_nowait()
            except queue.Empty:
                break
            unwanted.setdefault(subscription, []).extend(chunk)
        for subscription, deliveries in unwanted.items():
            if subscription.alive:
                subscription.requeue(deliveries)


def deliveries_to_batch(
    taken: list[tuple[str, list[Delivery]]], topic: str, schema: pa.Schema
) -> pa.RecordBatch:
    """One Arrow record batch of the source's `schema` from chunks of deliveries, each with
    the nsqd it came from; columns are found by name, and a column a classic topic has no
    value for (partition, offset) is null."""
    ids: list[bytes] = []
    bodies: list[bytes] = []
    attempts: list[int] = []
    timestamps: list[int] = []
    nsqds: list[str] = []
    for address, chunk in taken:
        chunk_ids, chunk_bodies, chunk_attempts, chunk_timestamps = zip(*chunk, strict=True)
        ids += chunk_ids
        bodies += chunk_bodies
        attempts += chunk_attempts
        timestamps += chunk_timestamps
        nsqds += [address] * len(chunk)
    count = len(ids)
    columns = {
        # nsqd's IDs are 16 ASCII hex digits; the cast to string checks they are UTF-8.
        "id": pa.array(ids, pa.binary()),
        "body": pa.array(bodies, pa.binary()),
        "attempts": pa.array(attempts, pa.int32()),
        # Spark keeps microseconds: drop the nanoseconds nsqd stamps.
        "timestamp": pa.array(timestamps, pa.timestamp("ns", tz="UTC")).cast(
            pa.timestamp("us", tz="UTC"), safe=False
        ),
        "topic": pa.repeat(pa.scalar(topic, pa.string()), count),
        "nsqd": pa.array(nsqds, pa.string()),
        "timestamptype": pa.repeat(pa.scalar(LOG_APPEND_TIME, pa.int32()), count),
    }
    columns["value"] = columns["body"]
    arrays = []
    for field in schema:
        column = columns.get(field.name.lower())
        if column is None:
            arrays.append(pa.nulls(count, field.type))
        elif column.type != field.type:
            arrays.append(column.cast(field.type))
        else:
            arrays.append(column)
    return pa.RecordBatch.from_arrays(arrays, schema=schema)


def channel_backlog(http: str, topic: str, channel: str, security: Security) -> int:
    """What the channel holds at the nsqd of `http` now: its depth and what is in flight (a
    crashed reader's messages come back), and the topic's own depth (not yet copied to a new
    channel); deferred messages are not due. OSError when the nsqd does not answer."""
    stats = http_json(http, "/stats", security=security, format="json", topic=topic)
    held = 0
    for found in (stats or {}).get("topics") or []:
        if found["topic_name"] != topic:
            continue
        held += found["depth"]
        for entry in found.get("channels") or []:
            if entry["channel_name"] == channel:
                held += entry["depth"] + entry["in_flight_count"]
    return held
