"""Writers: every Spark partition publishes its rows' `body` column, taken as Arrow batches.

* Classic topics: `/mpub?binary=true` to an nsqd (`nsqd_http`, or with `lookupd` every nsqd
  registered there, spread over the Spark partitions round-robin).
* Partitioned topics through `lookupd` (given without `nsqd_http`): `MPUB <topic> <partition>`
  over TCP to each partition's leader with the smart client (nsqpy/client/smart.py
  `SmartProducer`), which looks the topic up again and retries when a leader moved
  (`E_FAILED_ON_NOT_LEADER`), writes are refused or a connection breaks.
* Partitioned topics on the nsqds of `nsqd_http`: `/mpub?binary=true&partition=p` to the nsqd
  holding each partition (no failover: use `lookupd` for a cluster).

As Kafka's sink, a row goes to its `topic` column's topic unless the `topic` option is set
(the option wins), and to its `partition` column's partition when it names one. A `headers`
column (Kafka's: an array of `key` string, `value` binary or string) becomes the JSON header
of an ext topic's message, each value its UTF-8 text (a later entry of a key wins), written
through `lookupd` with MPUB_EXT_SEQ (MPUB_EXT where idempotence is not served), so a job can
route by Youzan's `##client_dispatch_tag`; a chunk whose rows have no headers goes as before.
Bodies go in chunks of at most `publishChunk` bodies and MAX_CHUNK_BYTES. On a partitioned
topic, rows without a partition or a key go round-robin over the partitions, a chunk at a
time. With a `key` column (string, binary or integer), each row goes to the partition of its key
(`partition_for_key`: CRC-32 of the key modulo the partition count), and a partition gets a
Spark partition's rows in their order, as an ordered topic requires; a null key goes
round-robin, which an ordered topic refuses. A key means nothing to a classic topic, and a
partition named for one is an error.

`write` runs on executors, once per task attempt; `commit` runs in a separate driver-side
Python worker, so the only state it sees is the commit messages.

Through `lookupd`, a log topic (every partitioned topic) is written exactly once: each task
publishes idempotently (`PUB_SEQ`/`MPUB_SEQ`, docs/protocol.md §3.10) as the producer
`spark-<query id>-<batch id>-<Spark partition>` (a batch write: `spark-<write id>-<Spark
partition>`), numbering its messages on each NSQ partition from 0, and sends keyless chunks
to partitions chosen from the Spark partition and the chunk's place, not round-robin. A task
run again, or a batch replayed after the driver restarted from its checkpoint, sends the
same chunks with the same producer and sequences, which the partitions acknowledge without
storing them twice (as long as the replay comes within `--producer-id-expiration` and reads
the same rows, as the log-topic source does). Classic topics, and partitioned ones through
`nsqd_http`, are written at least once: a retried task publishes its rows again.
"""

import json
import urllib.error
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.datasource import (
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    ByteType,
    IntegerType,
    LongType,
    ShortType,
    StringType,
    StructType,
)

from nsqpy.client.blocking import http_json, http_request
from nsqpy.client.security import Security
from nsqpy.client.smart import SmartProducer, partition_for_key
from nsqpy.common.command import encode_mpub_body
from nsqpy.common.errors import NO_CHANNEL_FOR_WRITERS
from nsqpy.spark import options as opts

# Bodies per MPUB: large chunks cost nsqd and the network less per message (nsqd's default
# -max-body-size is 5 MB, so the byte bound below keeps a chunk well under it).
DEFAULT_PUBLISH_CHUNK = 5000
MAX_CHUNK_BYTES = 1024 * 1024
_INTEGER_TYPES = (ByteType, ShortType, IntegerType, LongType)
_KEY_TYPES = (StringType, BinaryType, *_INTEGER_TYPES)


@dataclass
class PublishedCount(WriterCommitMessage):
    """What one task published: the message count and where to (an nsqd's HTTP address, or
    the lookupds of a partitioned topic)."""

    messages: int
    target: str


def http_mpub(
    nsqd_http: str,
    topic: str,
    bodies: list[bytes],
    partition: int | None = None,
    security: Security | None = None,
) -> None:
    """One `/mpub?binary=true`, to a partition when one is given (Youzan's `&partition=`)."""
    http_request(
        nsqd_http,
        "/mpub",
        method="POST",
        body=encode_mpub_body(bodies),
        security=security,
        topic=topic,
        binary="true",
        partition=None if partition is None else str(partition),
    )


# Spark's local properties of a micro-batch's tasks (StreamExecution.QUERY_ID_KEY and
# MicroBatchExecution.BATCH_ID_KEY).
_QUERY_ID = "sql.streaming.queryId"
_BATCH_ID = "streaming.sql.batchId"


class _Publisher:
    """The write path shared by the batch and the streaming sink."""

    def __init__(self, options: Mapping[str, str], schema: StructType) -> None:
        # Made on the driver, the same in every task of this write.
        self.write_id = uuid.uuid4().hex
        # The option wins over a `topic` column, as Kafka's `topic` option does.
        self.topic = options.get("topic") or None
        self.nsqd_http_addresses = opts.address_list(options.get("nsqd_http"))
        self.lookupd_addresses = opts.address_list(options.get("lookupd"))
        if not self.nsqd_http_addresses and not self.lookupd_addresses:
            raise ValueError('the nsq sink needs the option "nsqd_http" or "lookupd"')
        self.chunk = opts.positive_int(options, "publishChunk", DEFAULT_PUBLISH_CHUNK)
        self.security = opts.security(options)
        names = [field.name.lower() for field in schema.fields]
        if "body" not in names:
            raise ValueError(f'the nsq sink needs a "body" column; the columns are {names}')
        body_type = schema.fields[names.index("body")].dataType
        if not isinstance(body_type, BinaryType | StringType):
            raise ValueError(f'the nsq sink needs "body" as binary or string, not {body_type}')
        self.body_index = names.index("body")
        self.key_index = self._column(
            schema, names, "key", _KEY_TYPES, "a string, binary or integer"
        )
        self.topic_index = self._column(schema, names, "topic", (StringType,), "a string")
        self.partition_index = self._column(
            schema, names, "partition", _INTEGER_TYPES, "an integer"
        )
        self.headers_index = self._column(
            schema, names, "headers", (ArrayType,), "an array of (key, value) structs"
        )
        if self.headers_index is not None:
            _check_headers_type(schema.fields[self.headers_index].dataType)
        if self.topic is None and self.topic_index is None:
            raise ValueError('the nsq sink needs the option "topic" or a "topic" column')
        if self.topic is not None:
            self.topic_index = None

    @staticmethod
    def _column(
        schema: StructType, names: list[str], name: str, types: tuple, described: str
    ) -> int | None:
        if name not in names:
            return None
        index = names.index(name)
        found = schema.fields[index].dataType
        if not isinstance(found, types):
            raise ValueError(f'the nsq sink needs "{name}" as {described}, not {found}')
        return index

    def write(self, iterator: Iterator[pa.RecordBatch]) -> PublishedCount:
        """Publish every row to its topic (the option, or the row's `topic`): each topic is
        written the way its kind asks (see the module's docstring), all of this task's topics
        through lookupd by one idempotent producer."""
        routes: dict[str, _Route] = {}
        producer: SmartProducer | None = None
        count = 0
        try:
            for batch in iterator:
                for topic, rows in self._by_topic(batch):
                    route = routes.get(topic)
                    if route is None:
                        if producer is None and not self.nsqd_http_addresses:
                            producer = SmartProducer(
                                self.lookupd_addresses,
                                producer_id=self._producer_id(),
                                security=self.security,
                            )
                        route = routes[topic] = self._route(topic, producer)
                    count += route.publish(rows)
        finally:
            if producer is not None:
                producer.close()
        targets = self.nsqd_http_addresses or self.lookupd_addresses
        return PublishedCount(count, ",".join(targets))

    def _by_topic(self, batch: pa.RecordBatch) -> Iterator[tuple[str, pa.RecordBatch]]:
        """The batch's rows by topic, each topic's in their order."""
        if self.topic is not None:
            yield self.topic, batch
            return
        assert self.topic_index is not None
        topics = batch.column(self.topic_index).to_pylist()
        rows: dict[str, list[int]] = {}
        for index, topic in enumerate(topics):
            if not topic:
                raise ValueError("nsq: a row's topic is null or empty, and no topic option is set")
            rows.setdefault(topic, []).append(index)
        if len(rows) == 1:
            yield topics[0], batch
            return
        for topic, indices in rows.items():
            yield topic, batch.take(pa.array(indices, pa.int64()))

    def _route(self, topic: str, producer: "SmartProducer | None") -> "_Route":
        if self.nsqd_http_addresses:
            partitions = self._partitions_at(topic, self.nsqd_http_addresses)
            if partitions:
                return _HTTPPartitionedRoute(self, topic, partitions)
            return _HTTPRoute(self, topic, self._target(self.nsqd_http_addresses))
        producers = opts.lookupd_producers(self.lookupd_addresses, topic)
        if producer is not None and self._partitions_at(
            topic, [opts.producer_addresses(p)[1] for p in producers]
        ):
            self._check_listed_to_writers(topic)
            return _SmartRoute(self, topic, producer)
        return _HTTPRoute(self, topic, self._target(self._registered_nsqds()))

    def _partitions_at(self, topic: str, http_addresses: list[str]) -> dict[int, str]:
        """partition -> HTTP address, for the partitions of the topic these nsqds hold (their
        /stats name each one); empty for a classic topic or one nobody has yet, which nsqd
        creates on publish. (nsqlookupd lists a classic topic as partition 0 too, so a lookup
        cannot tell the two apart.)"""
        partitions: dict[int, str] = {}
        for address in http_addresses:
            try:
                stats = http_json(
                    address, "/stats", security=self.security, format="json", topic=topic
                )
            except OSError:
                continue  # a publish to it fails with the reason, if it is needed
            for entry in (stats or {}).get("topics") or []:
                if entry.get("topic_name") == topic and "topic_partition" in entry:
                    partitions.setdefault(int(entry["topic_partition"]), address)
        return partitions

    def groups(
        self, batch: pa.RecordBatch, topic: str, partition_num: int | None
    ) -> Iterator[tuple[int | None, list[bytes], list[bytes | None] | None]]:
        """The batch's bodies by partition, in row order, with their ext headers (None when
        no row has one): a row's `partition`, else its key's (None: neither, to go
        round-robin). `partition_num` None: a classic topic, which has no partitions to
        name."""
        bodies = self._bodies(batch)
        headers = self._headers(batch)
        named = None
        if self.partition_index is not None:
            named = batch.column(self.partition_index).to_pylist()
        keys = None if self.key_index is None else batch.column(self.key_index).to_pylist()
        if named is None and (keys is None or partition_num is None):
            yield None, bodies, headers
            return
        groups: dict[int | None, list[int]] = {}
        for index in range(len(bodies)):
            partition = None if named is None else named[index]
            if partition is not None and (
                partition_num is None or not 0 <= partition < partition_num
            ):
                having = "no partitions" if partition_num is None else f"{partition_num} partitions"
                raise ValueError(
                    f"nsq: a row names partition {partition} of topic {topic!r}, which has {having}"
                )
            if partition is None and keys is not None and keys[index] is not None and partition_num:
                partition = partition_for_key(keys[index], partition_num)
            groups.setdefault(partition, []).append(index)
        for partition, rows in groups.items():
            yield (
                partition,
                [bodies[row] for row in rows],
                None if headers is None else [headers[row] for row in rows],
            )

    # -- HTTP /mpub ---------------------------------------------------------------------------

    def _registered_nsqds(self) -> list[str]:
        producers = opts.lookupd_producers(self.lookupd_addresses, None)
        addresses = sorted(opts.producer_addresses(p)[1] for p in producers)
        if not addresses:
            raise RuntimeError(f"no nsqd is registered with lookupd {self.lookupd_addresses}")
        return addresses

    @staticmethod
    def task_number() -> int:
        from pyspark import TaskContext

        context = TaskContext.get()
        return context.partitionId() if context is not None else 0

    def _target(self, addresses: list[str]) -> str:
        """The nsqd for this Spark partition: partitions spread over the nsqds round-robin."""
        return addresses[self.task_number() % len(addresses)]

    def _producer_id(self) -> str:
        """The same in every attempt of this task: `spark-<query>-<batch>-<partition>` in a
        streaming query (its ID survives restarts from the checkpoint), else
        `spark-<write>-<partition>`."""
        from pyspark import TaskContext

        context = TaskContext.get()
        partition = context.partitionId() if context is not None else 0
        query = context.getLocalProperty(_QUERY_ID) if context is not None else None
        batch = context.getLocalProperty(_BATCH_ID) if context is not None else None
        if query and batch:
            return f"spark-{query.replace('-', '')}-{batch}-{partition}"
        return f"spark-{self.write_id}-{partition}"

    def _check_listed_to_writers(self, topic: str) -> None:
        """Fail at once, saying what to do, when every nsqlookupd refuses to list the topic's
        partitions to writers because none has a channel yet (Youzan's rule for a new topic):
        a publish would only retry until its deadline."""
        refusals = []
        for lookupd in self.lookupd_addresses:
            try:
                http_request(lookupd, "/lookup", topic=topic, access="w")
                return
            except urllib.error.HTTPError as error:
                if error.code != 404:
                    return
                try:
                    message = json.loads(error.read() or b"{}").get("message")
                except ValueError:
                    message = None
                if message != NO_CHANNEL_FOR_WRITERS:
                    return
                refusals.append(lookupd)
            except OSError:
                return  # a lookupd down: the producer finds the others, or says why
        if refusals:
            raise RuntimeError(
                f"nsq: nsqlookupd {', '.join(refusals)} lists no partition of topic"
                f" {topic!r} to writers: {NO_CHANNEL_FOR_WRITERS}. A partition is listed to"
                " writers once it has a channel: create one first (POST"
                f" /channel/create?topic={topic}&channel=<name> on nsqlookupd or each nsqd),"
                " or run nsqlookupd with --allow-write-with-nochannels"
            )

    # -- rows ---------------------------------------------------------------------------------

    def _bodies(self, batch: pa.RecordBatch) -> list[bytes]:
        """The batch's bodies as bytes (a string body is its UTF-8); nsqd refuses an empty
        message, so a null or empty body fails the task before anything of the batch goes."""
        column = batch.column(self.body_index)
        if pa.types.is_string(column.type) or pa.types.is_large_string(column.type):
            column = column.cast(pa.binary())
        if column.null_count or (len(column) and pc.min(pc.binary_length(column)).as_py() == 0):
            raise ValueError("E_BAD_MESSAGE nsq cannot publish an empty or null body")
        return column.to_pylist()

    def _headers(self, batch: pa.RecordBatch) -> list[bytes | None] | None:
        """Each row's ext header, the JSON of its `headers` entries (None: none); None when
        no row has any (or there is no such column)."""
        if self.headers_index is None:
            return None
        column = batch.column(self.headers_index)
        if column.null_count == len(column) or not pc.max(pc.list_value_length(column)).as_py():
            return None
        headers: list[bytes | None] = []
        for entries in column.to_pylist():
            if not entries:
                headers.append(None)
                continue
            fields = {}
            for entry in entries:
                key, value = entry["key"], entry["value"]
                if key is None:
                    raise ValueError("nsq: a row's headers hold an entry with a null key")
                if isinstance(value, bytes):
                    try:
                        value = value.decode()
                    except UnicodeDecodeError:
                        raise ValueError(
                            f"nsq: header {key!r} is not UTF-8 text: an ext topic's header is JSON"
                        ) from None
                fields[key] = value
            headers.append(json.dumps(fields, separators=(",", ":")).encode())
        return headers

    def chunks(self, bodies: list[bytes]) -> Iterator[tuple[int, int]]:
        """`bodies` in order, cut into MPUBs of at most `publishChunk` bodies and, unless a
        single body is larger, MAX_CHUNK_BYTES: each chunk's start and end."""
        start = 0
        while start < len(bodies):
            end = min(start + self.chunk, len(bodies))
            if sum(map(len, bodies[start:end])) > MAX_CHUNK_BYTES:
                size = 0
                for index in range(start, end):
                    size += len(bodies[index])
                    if size > MAX_CHUNK_BYTES:
                        end = max(index, start + 1)
                        break
            yield start, end
            start = end


class _Route:
    """How one task writes one topic."""

    def __init__(self, publisher: _Publisher, topic: str) -> None:
        self.publisher = publisher
        self.topic = topic

    def publish(self, batch: pa.RecordBatch) -> int:
        raise NotImplementedError


class _HTTPRoute(_Route):
    """A classic topic: `/mpub?binary=true` to one nsqd."""

    def __init__(self, publisher: _Publisher, topic: str, target: str) -> None:
        super().__init__(publisher, topic)
        self.target = target

    def publish(self, batch: pa.RecordBatch) -> int:
        publisher = self.publisher
        count = 0
        for _, bodies, headers in publisher.groups(batch, self.topic, None):
            _refuse_headers(headers, self.topic)
            for start, end in publisher.chunks(bodies):
                http_mpub(self.target, self.topic, bodies[start:end], security=publisher.security)
                count += end - start
        return count


class _HTTPPartitionedRoute(_Route):
    """`/mpub?partition=` to the nsqds given, which must hold every partition a row names;
    keyless chunks go round-robin, each task starting at its own partition."""

    def __init__(self, publisher: _Publisher, topic: str, partitions: dict[int, str]) -> None:
        super().__init__(publisher, topic)
        self.partitions = partitions
        self.rotation = sorted(partitions)
        self.turn = publisher.task_number()

    def publish(self, batch: pa.RecordBatch) -> int:
        publisher = self.publisher
        count = 0
        for partition, bodies, headers in publisher.groups(
            batch, self.topic, max(self.partitions) + 1
        ):
            _refuse_headers(headers, self.topic)
            for start, end in publisher.chunks(bodies):
                chunk = bodies[start:end]
                target = partition
                if target is None:
                    target = self.rotation[self.turn % len(self.rotation)]
                    self.turn += 1
                if target not in self.partitions:
                    raise RuntimeError(
                        f"partition {target} of topic {self.topic!r} is on none of the nsqds"
                        f" {publisher.nsqd_http_addresses}: give them all, or lookupd"
                    )
                http_mpub(
                    self.partitions[target], self.topic, chunk, target, security=publisher.security
                )
                count += len(chunk)
        return count


class _SmartRoute(_Route):
    """A partitioned topic through lookupd: TCP MPUB (MPUB_SEQ) to each partition's leader
    with the task's idempotent producer; keyless chunks go to the same partitions in every
    attempt of the task."""

    def __init__(self, publisher: _Publisher, topic: str, producer: SmartProducer) -> None:
        super().__init__(publisher, topic)
        self.producer = producer
        self.partition_num = producer.refresh(topic).partition_num
        if not self.partition_num:
            raise RuntimeError(
                f"nsqlookupd lists no writable partition of topic {topic!r}: a"
                " partition is listed to writers once it has a channel"
            )
        self.turn = publisher.task_number()

    def publish(self, batch: pa.RecordBatch) -> int:
        publisher = self.publisher
        count = 0
        for partition, bodies, headers in publisher.groups(batch, self.topic, self.partition_num):
            for start, end in publisher.chunks(bodies):
                target = partition
                if target is None:
                    target = self.turn % self.partition_num
                    self.turn += 1
                ext = None if headers is None else headers[start:end]
                if ext is not None and all(header is None for header in ext):
                    ext = None
                self.producer.multi_publish(
                    self.topic,
                    bodies[start:end],
                    partition=target,
                    ext_headers=None if ext is None else [h or b"{}" for h in ext],
                )
            count += len(bodies)
        return count


def _check_headers_type(found) -> None:
    element = found.elementType
    names = [field.name.lower() for field in getattr(element, "fields", ())]
    if names != ["key", "value"] or not isinstance(element.fields[0].dataType, StringType):
        raise ValueError(
            'the nsq sink needs "headers" as Kafka\'s array of (key string, value binary or'
            f" string) structs, not {found}"
        )
    if not isinstance(element.fields[1].dataType, BinaryType | StringType):
        raise ValueError(f'the nsq sink needs a "headers" value as binary or string, not {found}')


def _refuse_headers(headers: list[bytes | None] | None, topic: str) -> None:
    if headers is not None:
        raise ValueError(
            f"nsq: rows for topic {topic!r} have headers, which are written to ext topics"
            ' through "lookupd" (MPUB_EXT); this write goes over nsqd\'s HTTP /mpub'
        )


class NSQWriter(_Publisher, DataSourceArrowWriter):
    """`df.write.format("nsq")`: every task publishes its partition's rows."""


class NSQStreamWriter(_Publisher, DataSourceStreamArrowWriter):
    """`writeStream.format("nsq")`: every micro-batch's tasks publish their rows."""

    def commit(self, messages: list, batchId: int) -> None:  # noqa: N803 (Spark's name)
        # Nothing to do: each task published its rows before reporting success.
        pass

    def abort(self, messages: list, batchId: int) -> None:  # noqa: N803
        # Published messages cannot be taken back; a retry publishes them again, stored once
        # on a log topic through lookupd, again on a classic one (at-least-once).
        pass
