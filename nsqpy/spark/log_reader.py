"""The replayable source of log topics: Spark's Kafka source, for NSQ partitions.

A log topic keeps every message in its partitions' logs at a virtual offset that is the same
on every replica (docs/design.md §13, §14). So, as Spark reads Kafka:

* an offset is `{"<partition>": <virtual offset>}`; `latestOffset` takes each partition's
  committed end from its leader (`/partition/offsets`), capped by `maxOffsetsPerTrigger`
  (messages) or `maxBytesPerTrigger`;
* `partitions(start, end)` plans one input partition per NSQ partition range, splitting large
  ranges (and more, up to `minPartitions`) at record boundaries;
* `read()` runs on the executors: it fetches `[start, end)` straight from a replica
  (`/partition/fetch`), trying the others and then asking nsqlookupd again when one stops
  answering, and hands Spark Arrow record batches. A batch read again after a restart gets the
  same rows, which is what makes the query exactly-once with an idempotent or transactional sink
  (Spark's file sinks);
* `commit(end)` moves the query's channel to `end` on every leader, so retention keeps what
  the query has not committed and nsqadmin shows its lag. The channel is the `channel`
  option, or else one the query names itself (`spark-nsq-source-<32 hex>`, as Spark's Kafka
  source makes its group id) and keeps in its offsets, so the checkpoint holds it and a
  restarted query goes on with the same one.

`NSQLogBatchReader` reads a range of history with `spark.read` (`startingOffsets`,
`endingOffsets`, or timestamps).

A query reads one `topic`, or, as Kafka's source, the topics of `subscribe`,
`subscribePattern` (asked again at each trigger: a new matching topic is read from its
beginning, as a new partition is) or `assign`; its offsets are then Kafka's
`{"<topic>": {"<partition>": offset}}`.
"""

import http.client
import logging
import time
import uuid
from collections.abc import Iterator, Mapping
from typing import Any
from urllib.parse import quote

import numpy as np
import pyarrow as pa
from pyspark.sql.datasource import DataSourceReader, DataSourceStreamReader, InputPartition
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxBytes,
    ReadMaxRows,
    ReadMinRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

from nsqpy.client.blocking import http_connection, learn_tls_required, nsqd_http_base
from nsqpy.common.names import is_ephemeral, is_valid_name
from nsqpy.spark import options as opts
from nsqpy.spark.log_records import records_to_batch
from nsqpy.spark.partition_directory import (
    NotALogTopic,
    PartitionDirectory,
    PartitionRange,
    refused_credential,
)

log = logging.getLogger("nsqpy.spark")

# A range larger than this is split, so that one Spark task does not read it all.
SPLIT_BYTES = 64 * 1024 * 1024
DEFAULT_FETCH_MAX_BYTES = 4 * 1024 * 1024
# How long a task keeps trying replicas, and nsqlookupd for new ones, before it fails.
DEFAULT_FETCH_TIMEOUT = 60.0
# Kafka's defaults: maxTriggerDelay, and the prefix of a query's own channel (groupIdPrefix).
DEFAULT_MAX_TRIGGER_DELAY = 15 * 60.0
DEFAULT_CHANNEL_PREFIX = "spark-nsq-source"
_RETRY_PAUSE = 0.25

Offsets = dict[str, Any]
# A partition of a topic.
TopicPartition = tuple[str, int]
# (topic, partition) -> (messages before a range's start, messages before its end).
MessageCounts = dict[TopicPartition, tuple[int, int]]


class LogRange(InputPartition):
    """`[start, end)` of one partition of a topic, and where to read it (the leader first)."""

    def __init__(
        self, topic: str, partition: int, start: int, end: int, replicas: tuple[str, ...]
    ) -> None:
        super().__init__((topic, partition, start, end))
        self.topic = topic
        self.partition = partition
        self.start = start
        self.end = end
        self.replicas = replicas


class DataLoss(RuntimeError):
    """A range's messages were removed by retention before the query read them."""


class _LogReading:
    """What the stream and batch readers share: options, the directory, planning, reading."""

    def __init__(self, options: Mapping[str, str], schema: StructType) -> None:
        # No I/O here: Spark builds this object in several processes (docs/design.md §10).
        self.selection = opts.topic_selection(options)
        self.lookupd = opts.address_list(options.get("lookupd"))
        self.nsqd_http = opts.address_list(options.get("nsqd_http"))
        if not self.lookupd and not self.nsqd_http:
            raise ValueError('reading a log topic needs the option "lookupd" or "nsqd_http"')
        self.fail_on_data_loss = opts.boolean(options, "failOnDataLoss", True)
        self.min_partitions = opts.positive_int(options, "minPartitions", 1)
        self.fetch_max_bytes = opts.positive_int(options, "fetchMaxBytes", DEFAULT_FETCH_MAX_BYTES)
        self.fetch_timeout = opts.duration_seconds(options, "fetchTimeout", DEFAULT_FETCH_TIMEOUT)
        self.max_records = opts.optional_positive_int(options, "maxRecordsPerPartition")
        # Kafka's startingOffsetsByTimestampStrategy: a partition with no message at or after
        # the starting timestamp fails the query ("error") or starts at its end ("latest").
        self.timestamp_strategy = opts.choice(
            options, "startingOffsetsByTimestampStrategy", ("error", "latest")
        )
        self.security = opts.security(options)
        self.arrow_schema = to_arrow_schema(schema, timezone="UTC")
        self._directories: dict[str, PartitionDirectory] = {}
        # subscribePattern: the log topics matched so far, and the classic ones it skips.
        self._matched: set[str] = set()
        self._skipped: set[str] = set()

    def directory(self, topic: str) -> PartitionDirectory:
        found = self._directories.get(topic)
        if found is None:
            found = self._directories[topic] = PartitionDirectory(
                topic, lookupd=self.lookupd, nsqd_http=self.nsqd_http, security=self.security
            )
        return found

    def __getstate__(self) -> dict:
        # Executors get the options, not the driver's connections and caches.
        state = dict(self.__dict__)
        state["_directories"] = {}
        state.pop("_known", None)
        return state

    # -- topics and partitions -------------------------------------------------------------

    def topics_now(self) -> list[str]:
        """The topics read: those named, or those that match `subscribePattern` now."""
        pattern = self.selection.pattern
        if pattern is None:
            return list(self.selection.topics)
        names = opts.topic_names(self.lookupd, self.nsqd_http, self.security)
        return sorted(name for name in names if pattern.fullmatch(name))

    def partitions_now(self, *, every: bool = False) -> dict[TopicPartition, PartitionRange]:
        """Every partition of the topics read whose leader answers now (`every`: each one
        nsqlookupd announces, waiting up to `fetchTimeout` for those under election).
        subscribePattern skips the classic topics it matches (logged once each)."""
        found: dict[TopicPartition, PartitionRange] = {}
        for topic in self.topics_now():
            directory = self.directory(topic)
            try:
                ranges = (
                    directory.every_partition(self.fetch_timeout)
                    if every
                    else directory.partitions()
                )
            except NotALogTopic:
                if self.selection.pattern is None:
                    raise
                if topic not in self._skipped:
                    self._skipped.add(topic)
                    log.warning("nsq: subscribePattern skips %r, a classic topic", topic)
                continue
            for partition, where in ranges.items():
                if self.selection.takes(topic, partition):
                    found[(topic, partition)] = where
        if self.selection.assigned is not None and every:
            missing = sorted(
                (topic, partition)
                for topic, partitions in self.selection.assigned.items()
                for partition in partitions
                if (topic, partition) not in found
            )
            if missing:
                listed = ", ".join(f"{topic}:{partition}" for topic, partition in missing)
                raise ValueError(f"nsq: assign names partitions no nsqd holds: {listed}")
        return found

    # -- positions -------------------------------------------------------------------------

    def resolve(
        self,
        spec: tuple[str, Any],
        known: dict[TopicPartition, PartitionRange],
        unlisted: str,
        *,
        starting: bool = True,
    ) -> dict[TopicPartition, int]:
        """The virtual offset each known partition's `spec` points at; `unlisted` ("earliest"
        or "latest") for partitions a per-partition spec does not name. A starting timestamp
        after a partition's last message follows `startingOffsetsByTimestampStrategy`."""
        kind, values = spec
        resolved: dict[TopicPartition, int] = {}
        for key, found in known.items():
            topic, partition = key
            if kind == "earliest":
                resolved[key] = found.start
            elif kind == "latest":
                resolved[key] = found.end
            elif kind == "offsets":
                value = values.get(key, opts.EARLIEST if unlisted == "earliest" else opts.LATEST)
                if value == opts.EARLIEST:
                    resolved[key] = found.start
                elif value == opts.LATEST:
                    resolved[key] = found.end
                elif value < found.start:
                    resolved[key] = value  # gone: failOnDataLoss decides at read time
                else:
                    # A position inside a record reads from the next whole one.
                    resolved[key] = self.directory(topic).search(
                        found.replicas, partition, offset=value
                    )
            else:
                millis = values.get(key, values.get(None))
                if millis is None:
                    resolved[key] = found.start if unlisted == "earliest" else found.end
                else:
                    offset = self.directory(topic).search(
                        found.replicas, partition, timestamp=f"{millis / 1000:.3f}"
                    )
                    if offset >= found.end and self.timestamp_strategy == "error" and starting:
                        raise ValueError(
                            f"nsq: no message of topic {topic!r} partition {partition} was"
                            f" published at or after {millis} ms (its log ends at offset"
                            f" {found.end}). Set the option startingOffsetsByTimestampStrategy"
                            " to latest to start such a partition at its end."
                        )
                    resolved[key] = offset
        return resolved

    # -- planning --------------------------------------------------------------------------

    def plan(
        self,
        start: dict[TopicPartition, int],
        end: dict[TopicPartition, int],
        known: dict[TopicPartition, PartitionRange],
    ) -> list[LogRange]:
        """The input partitions of `[start, end)`: one per NSQ partition with something to
        read, split at record boundaries when larger than SPLIT_BYTES, and further, the
        largest first, until there are `minPartitions`."""
        pieces: dict[TopicPartition, int] = {}
        ranges = {k: (start.get(k, 0), e) for k, e in end.items() if e > start.get(k, 0)}
        for key, (first, last) in ranges.items():
            pieces[key] = -(-(last - first) // SPLIT_BYTES)
        while ranges and sum(pieces.values()) < self.min_partitions:
            widest = max(ranges, key=lambda k: (ranges[k][1] - ranges[k][0]) / pieces[k])
            if (ranges[widest][1] - ranges[widest][0]) // (pieces[widest] + 1) < 1:
                break
            pieces[widest] += 1
        planned: list[LogRange] = []
        for key, (first, last) in sorted(ranges.items()):
            topic, partition = key
            directory = self.directory(topic)
            replicas = known[key].replicas if key in known else ()
            cuts = {first, last}
            count = pieces[key]
            try:
                for k in range(1, count):
                    target = first + (last - first) * k // count
                    cuts.add(directory.search(replicas, partition, offset=target))
                if self.max_records is not None:
                    cuts |= self._record_cuts(directory, replicas, partition, first, last)
            except OSError:
                pass  # no replica answers now: the range is cut where it could be
            bounds = sorted(cut for cut in cuts if first <= cut <= last)
            for low, high in zip(bounds, bounds[1:], strict=False):
                planned.append(LogRange(topic, partition, low, high, replicas))
        return planned

    def _record_cuts(
        self,
        directory: PartitionDirectory,
        replicas: tuple[str, ...],
        partition: int,
        first: int,
        last: int,
    ) -> set[int]:
        """Where `[first, last)` is cut so that no piece holds more than
        `maxRecordsPerPartition` messages (Kafka's option): every N-th record's offset."""
        assert self.max_records is not None
        low, high = _count_span(directory, replicas, partition, first, last)
        return {
            directory.search(replicas, partition, count=number)
            for number in range(low + self.max_records, high, self.max_records)
        }

    # -- reading, on the executors ---------------------------------------------------------

    def read_range(self, piece: LogRange) -> Iterator[pa.RecordBatch]:
        """The records of `piece` as record batches, from whichever replica answers."""
        position = piece.start
        replicas = list(piece.replicas)
        deadline = time.monotonic() + self.fetch_timeout
        connections: dict[str, http.client.HTTPConnection] = {}
        failures: dict[str, str] = {}
        try:
            while position < piece.end:
                fetched = None
                for address in replicas:
                    try:
                        fetched = self._fetch(connections, address, piece, position)
                    except _PositionRemoved as removed:
                        position = self._after_data_loss(piece, position, removed.start)
                        fetched = (b"", position, None)
                        break
                    except (OSError, http.client.HTTPException, _ReplicaBehind) as error:
                        failures[address] = str(error) or type(error).__name__
                        connections.pop(address, None)
                        continue
                    if fetched[0]:
                        break
                    failures[address] = f"nothing from offset {position}"
                    fetched = None
                if fetched is None:
                    if time.monotonic() >= deadline:
                        detail = "; ".join(f"{a}: {why}" for a, why in failures.items())
                        raise RuntimeError(
                            f"nsq: no replica of topic {piece.topic!r} partition"
                            f" {piece.partition} served offset {position} within"
                            f" {self.fetch_timeout:g}s ({detail or 'none known'})"
                        )
                    time.sleep(_RETRY_PAUSE)
                    replicas = self._replicas_now(piece) or replicas
                    continue
                data, following, starts = fetched
                if data:
                    yield records_to_batch(
                        data,
                        position,
                        topic=piece.topic,
                        partition=piece.partition,
                        nsqd=address,
                        schema=self.arrow_schema,
                        starts=starts,
                    )
                position = following
        finally:
            for connection in connections.values():
                connection.close()

    def _replicas_now(self, piece: LogRange) -> list[str]:
        try:
            return list(self.directory(piece.topic).replicas(piece.partition))
        except Exception as error:  # any failure here means: try again later
            log.warning(
                "nsq: looking up partition %d of %r again failed: %s",
                piece.partition,
                piece.topic,
                error,
            )
            return []

    def _fetch(
        self,
        connections: dict[str, http.client.HTTPConnection],
        address: str,
        piece: LogRange,
        position: int,
    ) -> tuple[bytes, int, np.ndarray | None]:
        connection = connections.get(address)
        if connection is None:
            connection = connections[address] = http_connection(
                nsqd_http_base(address, self.security), self.security, timeout=30
            )
        connection.request(
            "GET",
            f"/partition/fetch?topic={quote(piece.topic)}&partition={piece.partition}"
            f"&offset={position}&end={piece.end}&max_bytes={self.fetch_max_bytes}&starts=true",
            headers=self.security.http_headers(),
        )
        response = connection.getresponse()
        body = response.read()
        if learn_tls_required(address, response.status, body, self.security):
            # That nsqd requires TLS: its HTTPS port from now on.
            connections.pop(address).close()
            return self._fetch(connections, address, piece, position)
        if response.status in (401, 403):
            raise refused_credential(address, "/partition/fetch", response.status, body)
        if response.status == 416:
            raise _PositionRemoved(self._retained_start(address, piece))
        if response.status == 400:
            raise ValueError(f"nsq: /partition/fetch at {address}: {body[:200]!r}")
        if response.status != 200:
            raise _ReplicaBehind(f"HTTP {response.status} {body[:200]!r}")
        following = int(response.getheader("X-NSQ-Next-Offset") or position)
        if not body and following < piece.end:
            raise _ReplicaBehind(f"its log ends at {following}")
        # Where each record starts, ahead of them (an nsqd older than that option sends the
        # records alone, and they are walked here instead).
        counted = response.getheader("X-NSQ-Record-Starts")
        if counted:
            table = 4 * int(counted)
            return body[table:], following, np.frombuffer(body, ">u4", int(counted))
        return body, following, None

    def _retained_start(self, address: str, piece: LogRange) -> int:
        return self.directory(piece.topic).search((address,), piece.partition, offset=0)

    def _after_data_loss(self, piece: LogRange, position: int, retained_start: int) -> int:
        message = (
            f"nsq: topic {piece.topic!r} partition {piece.partition}: the messages from offset"
            f" {position} to {retained_start} were removed by retention before this query read"
            " them"
        )
        if self.fail_on_data_loss:
            raise DataLoss(
                f"{message}. Set the option failOnDataLoss to false to skip what is gone."
            )
        log.warning("%s; skipped (failOnDataLoss is false)", message)
        return min(retained_start, piece.end)


class _PositionRemoved(Exception):
    def __init__(self, start: int) -> None:
        super().__init__(start)
        self.start = start


class _ReplicaBehind(Exception):
    """A replica that cannot serve the position now; another may."""


class NSQLogStreamReader(_LogReading, DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, options: Mapping[str, str], schema: StructType) -> None:
        super().__init__(options, schema)
        # The query's cursor on every partition: what retention keeps, and its lag. Without
        # the option, the one its offsets carry (`_query_channel`), made at its first batch.
        self.channel: str | None = options.get("channel")
        self._channel_in_offsets = self.channel is None
        if self.channel is not None and (
            not is_valid_name(self.channel) or is_ephemeral(self.channel)
        ):
            raise ValueError(
                f"nsq: {self.channel!r} cannot be the query's channel: a channel name is 1-64"
                " characters of [.a-zA-Z0-9_-], and not #ephemeral (its cursor must last)"
            )
        self.starting = opts.position_spec(options, "starting", self.selection, "latest")
        self.max_rows = opts.optional_positive_int(options, "maxOffsetsPerTrigger")
        self.max_bytes = opts.optional_positive_int(options, "maxBytesPerTrigger")
        if self.max_rows is not None and self.max_bytes is not None:
            raise ValueError(
                'the nsq options "maxOffsetsPerTrigger" and "maxBytesPerTrigger" cannot be given'
                " together"
            )
        # Kafka's minOffsetsPerTrigger and maxTriggerDelay: a trigger with fewer new messages
        # makes no batch, until the delay since the last batch has passed.
        self.min_rows = opts.optional_positive_int(options, "minOffsetsPerTrigger")
        self.max_trigger_delay = opts.duration_seconds(
            options, "maxTriggerDelay", DEFAULT_MAX_TRIGGER_DELAY
        )
        if (
            self.min_rows is not None
            and self.max_rows is not None
            and self.min_rows > self.max_rows
        ):
            raise ValueError(
                f'the nsq option "minOffsetsPerTrigger" ({self.min_rows}) is more than'
                f' "maxOffsetsPerTrigger" ({self.max_rows})'
            )
        # The automatic channel's prefix (Kafka's groupIdPrefix).
        self.channel_prefix = options.get("groupidprefix") or DEFAULT_CHANNEL_PREFIX
        if not is_valid_name(f"{self.channel_prefix}-{uuid.uuid4().hex}"):
            raise ValueError(
                f"nsq: {self.channel_prefix!r} cannot begin a channel name: with the 33"
                " characters added, a channel name is 1-64 characters of [.a-zA-Z0-9_-]"
            )
        self._known: dict[TopicPartition, PartitionRange] = {}
        self._available_now: dict[TopicPartition, int] | None = None
        self._last_batch_at = time.monotonic()

    def _refresh(self) -> dict[TopicPartition, PartitionRange]:
        found = self.partitions_now()
        self._known.update(found)
        return found

    def initialOffset(self) -> dict:
        found = self.partitions_now(every=True)
        self._known.update(found)
        return self._with_channel(self._offsets(self.resolve(self.starting, found, "earliest")))

    # -- offsets as Spark keeps them ---------------------------------------------------------

    def _offsets(self, positions: dict[TopicPartition, int]) -> Offsets:
        """Spark compares offsets as JSON text: always in topic and partition order. With
        `topic`, `{"<partition>": offset}`; otherwise Kafka's by topic."""
        if not self.selection.by_topic:
            return {str(partition): positions[(t, partition)] for t, partition in sorted(positions)}
        nested: dict[str, dict[str, int]] = {}
        for topic, partition in sorted(positions):
            nested.setdefault(topic, {})[str(partition)] = positions[(topic, partition)]
        return nested

    def _positions(self, offsets: dict) -> dict[TopicPartition, int]:
        if not self.selection.by_topic:
            topic = self.selection.topics[0]
            return {
                (topic, int(partition)): int(offset)
                for partition, offset in offsets.items()
                if partition != _CHANNEL_KEY
            }
        return {
            (topic, int(partition)): int(offset)
            for topic, partitions in offsets.items()
            if isinstance(partitions, dict)
            for partition, offset in partitions.items()
        }

    def _channel_key(self) -> str:
        return _TOPICS_CHANNEL_KEY if self.selection.by_topic else _CHANNEL_KEY

    def _query_channel(self, offsets: dict) -> str:
        """The `channel` option; without it, the channel the checkpointed offsets name, or a
        new one (the query's first batch)."""
        if self.channel is None:
            self.channel = (
                offsets.get(self._channel_key()) or f"{self.channel_prefix}-{uuid.uuid4().hex}"
            )
        return self.channel

    def _with_channel(self, offsets: Offsets) -> Offsets:
        """The offsets Spark checkpoints, with the query's own channel when it made one."""
        if not self._channel_in_offsets:
            return offsets
        return {**offsets, self._channel_key(): self._query_channel(offsets)}

    def _begin(self, key: TopicPartition, begin: dict[TopicPartition, int]) -> int:
        """Where a batch starts in a partition: where the last one ended, or, for a
        partition (or a topic subscribePattern found) the query has not read yet, its start."""
        if key in begin:
            return begin[key]
        found = self._known.get(key)
        return found.start if found is not None else 0

    # -- triggers ----------------------------------------------------------------------------

    def prepareForTriggerAvailableNow(self) -> None:
        self._available_now = {key: found.end for key, found in self._refresh().items()}

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.max_rows is not None:
            return ReadMaxRows(self.max_rows)
        if self.min_rows is not None:
            return ReadMinRows(self.min_rows)
        if self.max_bytes is not None:
            return ReadMaxBytes(self.max_bytes)
        return ReadAllAvailable()

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        self._query_channel(start)
        begin = self._positions(start)
        end = dict(begin)
        for key, found in self._refresh().items():
            first = self._begin(key, begin)
            last = found.end
            if self._available_now is not None:
                last = min(last, self._available_now.get(key, first))
            end[key] = max(first, last)
        begin = {key: self._begin(key, begin) for key in end}
        counts = None
        waits = self.min_rows is not None and self._available_now is None
        if waits and not isinstance(limit, ReadAllAvailable):
            due, counts = self._enough_or_due(begin, end)
            if not due:
                return self._with_channel(self._offsets(self._positions(start)))
        if isinstance(limit, ReadMaxRows):
            end = self._limit_rows(begin, end, limit.max_rows, counts)
        elif isinstance(limit, ReadMaxBytes):
            end = self._limit_bytes(begin, end, limit.max_bytes)
        if end != begin:
            self._last_batch_at = time.monotonic()
        return self._with_channel(self._offsets(end))

    def _enough_or_due(
        self, begin: dict[TopicPartition, int], end: dict[TopicPartition, int]
    ) -> tuple[bool, MessageCounts | None]:
        """Whether a batch is due: `minOffsetsPerTrigger` new messages, or some and
        `maxTriggerDelay` since the last batch (Kafka's rule; availableNow reads regardless);
        and the counts it took to tell, if any (for `_limit_rows`)."""
        assert self.min_rows is not None
        if time.monotonic() - self._last_batch_at >= self.max_trigger_delay:
            return True, None
        counts = self._message_counts(begin, end)
        return sum(high - low for low, high in counts.values()) >= self.min_rows, counts

    def _message_counts(
        self, begin: dict[TopicPartition, int], end: dict[TopicPartition, int]
    ) -> MessageCounts:
        """Each partition with messages in `[begin, end)`: the counts of messages before its
        begin and before its end."""
        return {
            key: _count_span(self.directory(key[0]), self._known[key].replicas, key[1], first, last)
            for key, last in end.items()
            if last > (first := begin.get(key, 0))
        }

    def reportLatestOffset(self) -> dict | None:
        """Where each partition ended at the last look (the query's progress shows it as
        `latestOffset`, as the Kafka source's does); no I/O."""
        if not self._known:
            return None
        return self._offsets({key: found.end for key, found in self._known.items()})

    def _limit_rows(
        self,
        begin: dict[TopicPartition, int],
        end: dict[TopicPartition, int],
        limit: int,
        counts: MessageCounts | None = None,
    ) -> dict[TopicPartition, int]:
        """At most `limit` messages in all, shared out in proportion to what each partition
        has (the Kafka source's rule); `counts` when `_message_counts` was already asked."""
        if counts is None:
            counts = self._message_counts(begin, end)
        total = sum(high - low for low, high in counts.values())
        if total <= limit:
            return end
        limited = dict(end)
        granted = 0
        for key, (low, high) in sorted(counts.items()):
            share = max(1 if granted < limit else 0, (high - low) * limit // total)
            share = min(share, high - low, limit - granted)
            granted += share
            replicas = self._known[key].replicas
            limited[key] = self.directory(key[0]).search(replicas, key[1], count=low + share)
        return limited

    def _limit_bytes(
        self, begin: dict[TopicPartition, int], end: dict[TopicPartition, int], limit: int
    ) -> dict[TopicPartition, int]:
        spans = {k: (begin.get(k, 0), last) for k, last in end.items() if last > begin.get(k, 0)}
        total = sum(last - first for first, last in spans.values())
        if total <= limit:
            return end
        limited = dict(end)
        for key, (first, last) in spans.items():
            share = max(1, (last - first) * limit // total)
            replicas = self._known[key].replicas
            # The first boundary at or after the share: at least one record moves on.
            limited[key] = self.directory(key[0]).search(replicas, key[1], offset=first + share)
        return limited

    def partitions(self, start: dict, end: dict) -> list[LogRange]:
        begin, finish = self._positions(start), self._positions(end)
        if any(key not in self._known for key in finish):
            self._refresh()
        begin = {key: self._begin(key, begin) for key in finish}
        return self.plan(begin, finish, self._known)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, LogRange)  # planned by this reader
        return self.read_range(partition)

    def commit(self, end: dict) -> None:
        channel = self._query_channel(end)
        for key, offset in self._positions(end).items():
            topic, partition = key
            found = self._known.get(key)
            if found is None or not found.replicas:
                continue
            try:
                self.directory(topic).set_cursor(channel, partition, found.replicas[0], offset)
            except OSError as error:
                # The next commit moves it further; until then retention keeps more.
                log.warning(
                    "nsq: moving channel %r of partition %d of %r to %d failed: %s",
                    channel,
                    partition,
                    topic,
                    offset,
                    error,
                )
                self._known.pop(key, None)

    def stop(self) -> None:
        pass


class NSQLogBatchReader(_LogReading, DataSourceReader):
    def __init__(self, options: Mapping[str, str], schema: StructType) -> None:
        super().__init__(options, schema)
        self.starting = opts.position_spec(options, "starting", self.selection, "earliest")
        self.ending = opts.position_spec(options, "ending", self.selection, "latest")

    def partitions(self) -> list[LogRange]:
        known = self.partitions_now(every=True)
        start = self.resolve(self.starting, known, "earliest")
        end = self.resolve(self.ending, known, "latest", starting=False)
        for (topic, partition), last in end.items():
            if last < start[(topic, partition)]:
                raise ValueError(
                    f"nsq: partition {partition} of {topic!r} would end at offset {last}, before"
                    f" its start {start[(topic, partition)]}"
                )
        return self.plan(start, end, known)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, LogRange)  # planned by this reader
        return self.read_range(partition)


def _count_span(
    directory: PartitionDirectory, replicas: tuple[str, ...], partition: int, first: int, last: int
) -> tuple[int, int]:
    """The counts of messages before offsets `first` and `last` (`/partition/search`)."""
    low = directory.search_position(replicas, partition, offset=first)[1]
    high = directory.search_position(replicas, partition, offset=last)[1]
    return low, high


# The offsets' entry naming the channel a query made for itself (no `channel` option): beside
# the partitions of its `topic`, or (not a topic name) beside the topics of the others.
_CHANNEL_KEY = "channel"
_TOPICS_CHANNEL_KEY = "#channel"
