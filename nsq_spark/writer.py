"""Writers: every partition POSTs its rows' bodies to nsqd's /mpub?binary=true in chunks.

`write` runs on executors, once per task attempt; `commit` runs in a separate driver-side
Python worker, so the only state it sees is the commit messages. A retried task publishes its
rows again: the sink is at-least-once like the source.
"""

from collections.abc import Iterator, Mapping
from dataclasses import dataclass

from pyspark.sql.datasource import DataSourceStreamWriter, DataSourceWriter, WriterCommitMessage
from pyspark.sql.types import BinaryType, StringType, StructType

from common.client import http_publish
from nsq_spark import options as opts


@dataclass
class PublishedCount(WriterCommitMessage):
    messages: int
    nsqd_http: str


class NSQWriter(DataSourceWriter):
    def __init__(self, options: Mapping[str, str], schema: StructType) -> None:
        self.topic = opts.required(options, "topic")
        self.nsqd_http_addresses = opts.address_list(options.get("nsqd_http"))
        self.lookupd_addresses = opts.address_list(options.get("lookupd"))
        if not self.nsqd_http_addresses and not self.lookupd_addresses:
            raise ValueError('the nsq sink needs the option "nsqd_http" or "lookupd"')
        self.chunk = opts.positive_int(options, "publishChunk", opts.DEFAULT_PUBLISH_CHUNK)
        names = [field.name.lower() for field in schema.fields]
        if "body" not in names:
            raise ValueError(f'the nsq sink needs a "body" column; the columns are {names}')
        body_type = schema.fields[names.index("body")].dataType
        if not isinstance(body_type, BinaryType | StringType):
            raise ValueError(f'the nsq sink needs "body" as binary or string, not {body_type}')
        self.body_index = names.index("body")

    def _target(self) -> str:
        """The nsqd for this partition: spread partitions over the nsqds round-robin."""
        from pyspark import TaskContext

        addresses = self.nsqd_http_addresses
        if not addresses:
            producers = opts.lookupd_producers(self.lookupd_addresses, None)
            addresses = sorted(opts.producer_addresses(p)[1] for p in producers)
            if not addresses:
                raise RuntimeError(f"no nsqd is registered with lookupd {self.lookupd_addresses}")
        context = TaskContext.get()
        partition = context.partitionId() if context is not None else 0
        return addresses[partition % len(addresses)]

    def write(self, iterator: Iterator) -> PublishedCount:
        target = self._target()
        count = 0
        chunk: list[bytes] = []
        for row in iterator:
            body = row[self.body_index]
            if isinstance(body, str):
                body = body.encode("utf-8")
            if not body:
                raise ValueError(f"E_BAD_MESSAGE nsq cannot publish an empty body (row {row})")
            chunk.append(bytes(body))
            if len(chunk) >= self.chunk:
                http_publish(target, self.topic, chunk)
                count += len(chunk)
                chunk = []
        if chunk:
            http_publish(target, self.topic, chunk)
            count += len(chunk)
        return PublishedCount(count, target)


class NSQStreamWriter(NSQWriter, DataSourceStreamWriter):
    def commit(self, messages: list, batchId: int) -> None:  # noqa: N803 (Spark's name)
        # Nothing to do: each task published its rows before reporting success.
        pass

    def abort(self, messages: list, batchId: int) -> None:  # noqa: N803
        # Published messages cannot be taken back; a retry publishes again (at-least-once).
        pass
