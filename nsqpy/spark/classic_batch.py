"""A classic topic's batch read: `spark.read.format("nsq")` drains what the channel holds when
the read starts.

A classic topic cannot be read by position, only consumed through a channel. The driver reads
what each nsqd's channel holds (its depth, what is in flight, and the topic's own depth:
`channel_backlog`) and plans shares of at most `maxRecordsPerPartition` messages (2,500 by
default, Go nsqd's --max-rdy-count: a task holds its whole share in flight on one
connection); each task subscribes to its nsqd's channel and takes its share. Where the count
cannot be read (no HTTP address for the nsqd), one share takes what comes, up to that many,
until `idleTimeout` passes without a message. Messages published during the read are left for
the next reader.

At-least-once: a task FINishes its messages only after Spark has taken every row of its
partition. A task that fails, is killed or is stopped early (a `limit`) FINishes nothing: its
messages come back after `msgTimeout` for a later read, with attempts + 1. What is not
covered is a failure after that point within the same task (its output's commit), which
loses them, as any consumer that acknowledges before its own write is durable would.
"""

import logging
import queue
import time
from collections.abc import Iterator, Mapping

import pyarrow as pa
from pyspark.sql.datasource import DataSourceReader, InputPartition
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import StructType

from nsqpy.spark import options as opts
from nsqpy.spark.reader import FIN_FLUSH_TIMEOUT, ClassicTopicOptions, deliveries_to_batch
from nsqpy.spark.subscription import (
    DEFAULT_MAX_RDY_COUNT,
    Delivery,
    Subscription,
    TooFewInFlight,
)

log = logging.getLogger("nsqpy.spark")


class ChannelShare(InputPartition):
    """One nsqd's part of a read: its TCP address, and how many messages to take (None: until
    `idleTimeout` passes without one)."""

    def __init__(self, address: str, expected: int | None) -> None:
        super().__init__((address, expected))
        self.address = address
        self.expected = expected


class NSQClassicBatchReader(ClassicTopicOptions, DataSourceReader):
    def __init__(self, options: Mapping[str, str], schema: StructType) -> None:
        super().__init__(options)
        self.share = opts.positive_int(options, "maxRecordsPerPartition", DEFAULT_MAX_RDY_COUNT)
        self.arrow_schema = to_arrow_schema(schema, timezone="UTC")

    def partitions(self) -> list[ChannelShare]:
        """What each nsqd's channel holds now, in shares of at most `maxRecordsPerPartition`;
        none for an nsqd whose channel holds nothing."""
        http_addresses: dict[str, str] = dict(
            zip(self.nsqd_addresses, self.nsqd_http_addresses, strict=False)
        )
        addresses = list(self.nsqd_addresses)
        for producer in opts.lookupd_producers(self.lookupd_addresses, self.topic):
            tcp, producer_http = opts.producer_addresses(producer)
            if tcp not in addresses:
                addresses.append(tcp)
            http_addresses[tcp] = producer_http
        shares = []
        for address in addresses:
            expected = self.backlog(address, http_addresses.get(address))
            if expected is None:
                shares.append(ChannelShare(address, None))
                continue
            while expected > 0:
                shares.append(ChannelShare(address, min(expected, self.share)))
                expected -= self.share
        return shares

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, ChannelShare)  # planned by this reader
        expected = partition.expected
        holding = expected or self.share
        inbox: queue.SimpleQueue[tuple[Subscription, list[Delivery]]] = queue.SimpleQueue()
        try:
            subscription = Subscription(
                partition.address,
                self.topic,
                self.channel,
                max_in_flight=holding,
                msg_timeout=self.msg_timeout,
                inbox=inbox,
                security=self.security,
                hold=holding,
            )
        except TooFewInFlight as refusal:
            raise ValueError(
                f"{refusal}: set the option maxRecordsPerPartition to"
                f" {refusal.max_rdy_count} or less"
            ) from None
        taken: list[Delivery] = []
        try:
            batch: list[Delivery] = []
            idle_until = time.monotonic() + self.idle_timeout
            while expected is None or len(taken) < expected:
                if subscription.error is not None:
                    raise RuntimeError(
                        f"nsq: reading {self.topic}/{self.channel} at {partition.address}"
                        f" failed: {subscription.error}"
                    )
                try:
                    _source, chunk = inbox.get(timeout=min(0.5, self.idle_timeout))
                except queue.Empty:
                    if time.monotonic() >= idle_until:
                        break  # nothing more came: what the channel held was taken
                    continue
                idle_until = time.monotonic() + self.idle_timeout
                if expected is not None and len(taken) + len(chunk) > expected:
                    room = expected - len(taken)
                    subscription.requeue(chunk[room:])
                    chunk = chunk[:room]
                taken += chunk
                batch += chunk
                while len(batch) >= self.max_batch:
                    rows, batch = batch[: self.max_batch], batch[self.max_batch :]
                    yield deliveries_to_batch(
                        [(partition.address, rows)], self.topic, self.arrow_schema
                    )
            subscription.pause()
            if batch:
                yield deliveries_to_batch(
                    [(partition.address, batch)], self.topic, self.arrow_schema
                )
            # Every row was taken by Spark: the messages are done.
            subscription.finish(taken)
            while True:
                try:
                    _source, late = inbox.get_nowait()
                except queue.Empty:
                    break
                subscription.requeue(late)  # came after the pause: the next reader's
            if not subscription.flush(FIN_FLUSH_TIMEOUT):
                log.warning(
                    "nsq: the FINs of %d messages did not reach %s; they come back after"
                    " msgTimeout",
                    len(taken),
                    partition.address,
                )
        finally:
            subscription.close()
