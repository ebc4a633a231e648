"""The Spark source's reader of stored records (`nsqpy/spark/log_records.py`) against records
the partition log wrote, its ext and producer sections included."""

import pyarrow as pa
import pytest

from nsqpy.nsqd.message import Message
from nsqpy.partition_log import PartitionLog, Position, ProducerMark
from nsqpy.spark.log_records import records_to_batch

SCHEMA = pa.schema([("body", pa.binary()), ("offset", pa.int64()), ("attempts", pa.int32())])


@pytest.mark.parametrize("ext", [False, True])
def test_bodies_come_without_the_producer_and_ext_sections(tmp_path, ext):
    log = PartitionLog(
        str(tmp_path),
        "t",
        0,
        message_type=Message,
        max_bytes_per_file=1 << 20,
        sync_every=1,
        ext=ext,
    )
    bodies = (b"a", b"bb", b"ccc")
    messages = [Message(mid, body, 5) for mid, body in zip(log.next_ids(3), bodies, strict=True)]
    messages[2].ext_header = b'{"k":"v"}'
    log.append(messages[:1])
    log.append(messages[1:], ProducerMark(b"spark-q-b1-p0", 41))
    log.commit()
    data, _end = log.read_raw(Position(0, 0), log.end.offset, 1 << 20)
    batch = records_to_batch(data, 0, topic="t", partition=0, nsqd="n", schema=SCHEMA)
    assert batch.column("body").to_pylist() == list(bodies)
    assert batch.column("offset").to_pylist() == [m.offset for m in messages]
    assert batch.column("attempts").to_pylist() == [0, 0, 0]
    log.close()
