"""Writers: every Spark partition publishes its rows' `body` column, taken as Arrow batches.

* Classic topics: `/mpub?binary=true` to an nsqd (`nsqd_http`, or with `lookupd` every nsqd
  registered there, spread over the Spark partitions round-robin).
* Partitioned topics through `lookupd` (given without `nsqd_http`): `MPUB <topic> <partition>`
  over TCP to each partition's leader with the smart client (nsqpy/client/smart.py
  `SmartProducer`), which looks the topic up again and retries when a leader moved
  (`E_FAILED_ON_NOT_LEADER`), writes are refused or a connection breaks.
* Partitioned topics on the nsqds of `nsqd_http`: `/mpub?binary=true&partition=p` to the nsqd
  holding each partition (no failover: use `lookupd` for a cluster).

Bodies go in chunks of at most `publishChunk` bodies and MAX_CHUNK_BYTES. On a partitioned
topic, rows without a `key` column go round-robin over the partitions, a chunk at a time. With
one (string, binary or integer), each row goes to the partition of its key
(`partition_for_key`: CRC-32 of the key modulo the partition count), and a partition gets a
Spark partition's rows in their order, as an ordered topic requires; a null key goes
round-robin, which an ordered topic refuses. A key means nothing to a classic topic.

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
_KEY_TYPES = (StringType, BinaryType, ByteType, ShortType, IntegerType, LongType)


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
        self.topic = opts.required(options, "topic")
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
        self.key_index: int | None = None
        if "key" in names:
            self.key_index = names.index("key")
            key_type = schema.fields[self.key_index].dataType
            if not isinstance(key_type, _KEY_TYPES):
                raise ValueError(
                    f'the nsq sink needs "key" as a string, binary or integer, not {key_type}'
                )

    def write(self, iterator: Iterator[pa.RecordBatch]) -> PublishedCount:
        if self.nsqd_http_addresses:
            partitions = self._partitions_at(self.nsqd_http_addresses)
            if partitions:
                return self._write_http_partitioned(iterator, partitions)
            return self._write_http(iterator, self._target(self.nsqd_http_addresses))
        producers = opts.lookupd_producers(self.lookupd_addresses, self.topic)
        if self._partitions_at([opts.producer_addresses(p)[1] for p in producers]):
            return self._write_smart(iterator)
        return self._write_http(iterator, self._target(self._registered_nsqds()))

    def _partitions_at(self, http_addresses: list[str]) -> dict[int, str]:
        """partition -> HTTP address, for the partitions of the topic these nsqds hold (their
        /stats name each one); empty for a classic topic or one nobody has yet, which nsqd
        creates on publish. (nsqlookupd lists a classic topic as partition 0 too, so a lookup
        cannot tell the two apart.)"""
        partitions: dict[int, str] = {}
        for address in http_addresses:
            try:
                stats = http_json(
                    address, "/stats", security=self.security, format="json", topic=self.topic
                )
            except OSError:
                continue  # a publish to it fails with the reason, if it is needed
            for entry in (stats or {}).get("topics") or []:
                if entry.get("topic_name") == self.topic and "topic_partition" in entry:
                    partitions.setdefault(int(entry["topic_partition"]), address)
        return partitions

    def _groups(
        self, batch: pa.RecordBatch, partition_num: int
    ) -> Iterator[tuple[int | None, list[bytes]]]:
        """The batch's bodies by the partition of their key, in row order (None: no key, to
        go round-robin)."""
        bodies = self._bodies(batch)
        if self.key_index is None:
            yield None, bodies
            return
        groups: dict[int | None, list[bytes]] = {}
        keys = batch.column(self.key_index).to_pylist()
        for key, body in zip(keys, bodies, strict=True):
            partition = None if key is None else partition_for_key(key, partition_num)
            groups.setdefault(partition, []).append(body)
        yield from groups.items()

    # -- HTTP /mpub ---------------------------------------------------------------------------

    def _registered_nsqds(self) -> list[str]:
        producers = opts.lookupd_producers(self.lookupd_addresses, None)
        addresses = sorted(opts.producer_addresses(p)[1] for p in producers)
        if not addresses:
            raise RuntimeError(f"no nsqd is registered with lookupd {self.lookupd_addresses}")
        return addresses

    @staticmethod
    def _task_number() -> int:
        from pyspark import TaskContext

        context = TaskContext.get()
        return context.partitionId() if context is not None else 0

    def _target(self, addresses: list[str]) -> str:
        """The nsqd for this Spark partition: partitions spread over the nsqds round-robin."""
        return addresses[self._task_number() % len(addresses)]

    def _write_http(self, iterator: Iterator[pa.RecordBatch], target: str) -> PublishedCount:
        count = 0
        for batch in iterator:
            for chunk in self._chunks(self._bodies(batch)):
                http_mpub(target, self.topic, chunk, security=self.security)
                count += len(chunk)
        return PublishedCount(count, target)

    def _write_http_partitioned(
        self, iterator: Iterator[pa.RecordBatch], partitions: dict[int, str]
    ) -> PublishedCount:
        """`/mpub?partition=` to the nsqds given, which must hold every partition a key
        names; keyless chunks go round-robin, each task starting at its own partition."""
        partition_num = max(partitions) + 1
        rotation = sorted(partitions)
        turn = self._task_number()
        count = 0
        for batch in iterator:
            for partition, bodies in self._groups(batch, partition_num):
                for chunk in self._chunks(bodies):
                    if partition is None:
                        target = rotation[turn % len(rotation)]
                        turn += 1
                    else:
                        target = partition
                    if target not in partitions:
                        raise RuntimeError(
                            f"partition {target} of topic {self.topic!r} is on none of the nsqds"
                            f" {self.nsqd_http_addresses}: give them all, or lookupd"
                        )
                    http_mpub(partitions[target], self.topic, chunk, target, security=self.security)
                    count += len(chunk)
        return PublishedCount(count, ",".join(self.nsqd_http_addresses))

    # -- TCP MPUB to partition leaders: the smart client ------------------------------------

    def _write_smart(self, iterator: Iterator[pa.RecordBatch]) -> PublishedCount:
        self._check_listed_to_writers()
        count = 0
        with SmartProducer(
            self.lookupd_addresses, producer_id=self._producer_id(), security=self.security
        ) as producer:
            partition_num = producer.refresh(self.topic).partition_num
            if not partition_num:
                raise RuntimeError(
                    f"nsqlookupd lists no writable partition of topic {self.topic!r}: a"
                    " partition is listed to writers once it has a channel"
                )
            # Keyless chunks: the same partitions in every attempt of the task.
            turn = self._task_number()
            for batch in iterator:
                for partition, bodies in self._groups(batch, partition_num):
                    for chunk in self._chunks(bodies):
                        target = partition
                        if target is None:
                            target = turn % partition_num
                            turn += 1
                        producer.multi_publish(self.topic, chunk, partition=target)
                    count += len(bodies)
        return PublishedCount(count, ",".join(self.lookupd_addresses))

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

    def _check_listed_to_writers(self) -> None:
        """Fail at once, saying what to do, when every nsqlookupd refuses to list the topic's
        partitions to writers because none has a channel yet (Youzan's rule for a new topic):
        a publish would only retry until its deadline."""
        refusals = []
        for lookupd in self.lookupd_addresses:
            try:
                http_request(lookupd, "/lookup", topic=self.topic, access="w")
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
                f" {self.topic!r} to writers: {NO_CHANNEL_FOR_WRITERS}. A partition is listed to"
                " writers once it has a channel: create one first (POST"
                f" /channel/create?topic={self.topic}&channel=<name> on nsqlookupd or each nsqd),"
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

    def _chunks(self, bodies: list[bytes]) -> Iterator[list[bytes]]:
        """`bodies` in order, cut into MPUBs of at most `publishChunk` bodies and, unless a
        single body is larger, MAX_CHUNK_BYTES."""
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
            yield bodies[start:end]
            start = end


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
