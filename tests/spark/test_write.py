"""The sinks against a real nsqd: a batch write, a stream -> transform -> stream trip, and how
bodies are cut into MPUBs."""

import time

import pyarrow as pa
import pytest
from pyspark.sql import functions as F
from pyspark.sql.types import BinaryType, StructField, StructType

from nsqpy.client.blocking import Consumer, http_publish
from nsqpy.spark.writer import NSQWriter
from tests.harness import start_nsqd
from tests.spark.support import addresses
from tests.support.polling import poll
from tests.support.stats import topic_stats

pytestmark = pytest.mark.spark


def consume(nsqd_tcp: str, topic: str, count: int, timeout: float = 30.0) -> list[bytes]:
    """`count` bodies from a fresh channel (FINished), failing if they do not arrive."""
    bodies = []
    deadline = time.monotonic() + timeout
    with Consumer(nsqd_tcp, topic, "verify", max_in_flight=200) as consumer:
        while len(bodies) < count:
            remaining = deadline - time.monotonic()
            assert remaining > 0, f"only {len(bodies)} of {count} messages arrived on {topic}"
            message = consumer.receive(timeout=remaining)
            if message is not None:
                bodies.append(message.body)
                message.finish()
        # Nothing beyond `count`: no duplicate from the writer.
        assert consumer.receive(timeout=0.3) is None
    return bodies


def test_batch_write_publishes_every_row(spark, nsqd):
    tcp, http = addresses(nsqd)
    frame = spark.range(1000).select(F.format_string("row-%d", "id").alias("body"))
    (
        frame.repartition(2)
        .write.format("nsq")
        .option("nsqd_http", http)
        .option("topic", "rows")
        .option("publishChunk", "128")
        .mode("append")
        .save()
    )
    assert topic_stats(http, "rows")["message_count"] == 1000
    bodies = consume(tcp, "rows", 1000)
    assert sorted(bodies) == sorted(f"row-{i}".encode() for i in range(1000))


def test_stream_transform_stream_round_trip(spark, nsqd, tmp_path):
    tcp, http = addresses(nsqd)
    words = [f"word-{i}".encode() for i in range(200)]
    http_publish(http, "words", words)
    shouted = (
        spark.readStream.format("nsq")
        .option("nsqd", tcp)
        .option("nsqd_http", http)
        .option("topic", "words")
        .option("channel", "shout")
        .option("maxBatch", "64")
        .option("idleTimeout", "10s")
        .load()
        .select(F.upper(F.col("body").cast("string")).alias("body"))
    )
    query = (
        shouted.writeStream.format("nsq")
        .option("nsqd_http", http)
        .option("topic", "shouted")
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(120)
    assert query.exception() is None

    assert sorted(consume(tcp, "shouted", 200)) == sorted(w.upper() for w in words)

    def drained():
        channel = topic_stats(http, "words")["channels"][0]
        return channel["depth"] == 0 and channel["in_flight_count"] == 0

    poll(drained, "the source channel to drain")


def test_large_bodies_are_cut_into_mpubs_nsqd_accepts(tmp_path):
    """Chunks stop at 1 MiB of bodies, below this nsqd's -max-body-size of 1.2 MB, whatever
    publishChunk says; an empty body fails the write before anything of its batch is sent.
    The writer is driven without Spark, with the Arrow batches Spark would hand it."""
    data = tmp_path / "nsqd"
    data.mkdir()
    nsqd = start_nsqd(data, "-max-body-size=1200000")
    try:
        http = nsqd.addresses["HTTP"]
        schema = StructType([StructField("body", BinaryType())])
        writer = NSQWriter({"nsqd_http": http, "topic": "big", "publishchunk": "1000"}, schema)
        bodies = [bytes([i]) * 100_000 for i in range(30)]
        published = writer.write(iter([pa.record_batch([pa.array(bodies)], names=["body"])]))
        assert published.messages == 30
        assert topic_stats(http, "big")["message_count"] == 30
        assert sorted(consume(nsqd.addresses["TCP"], "big", 30)) == sorted(bodies)

        with pytest.raises(ValueError, match="empty"):
            writer.write(iter([pa.record_batch([pa.array([b"a", b""])], names=["body"])]))
        assert topic_stats(http, "big")["message_count"] == 30
    finally:
        nsqd.stop()
