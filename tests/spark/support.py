"""What the Spark connector tests share: addresses, stats, draining and availableNow runs."""

from nsqpy.client.blocking import http_request
from tests.support.polling import poll
from tests.support.stats import channel_stats

# Messages left un-FINished come back after this; short so the restart test is quick.
MSG_TIMEOUT = "2s"


def addresses(daemon) -> tuple[str, str]:
    return daemon.addresses["TCP"], daemon.addresses["HTTP"]


def collect_available_now(stream, checkpoint) -> list:
    """Run `stream` (a loaded nsq source) with trigger(availableNow=True) into a list of rows;
    the rows, once the query ended by itself without an error."""
    received = []
    query = (
        stream.writeStream.foreachBatch(lambda batch, _batch_id: received.extend(batch.collect()))
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(120)
    assert not query.isActive and query.exception() is None
    return received


def wait_channel_drained(http_address: str, topic: str, channel: str) -> dict:
    """Poll until the channel exists with nothing queued and nothing in flight; its stats."""

    def drained():
        stats = channel_stats(http_address, topic, channel)
        return stats and stats["depth"] == 0 and stats["in_flight_count"] == 0 and stats

    return poll(drained, f"{topic}:{channel} to drain (depth 0, in flight 0)")


def create_topic(http: str, topic: str, partitions: int) -> None:
    http_request(http, "/topic/create", method="POST", topic=topic, partition_num=str(partitions))


def publish(http: str, topic: str, partition: int, bodies: list[bytes]) -> None:
    payload = b"".join(len(body).to_bytes(4, "big") + body for body in bodies)
    http_request(
        http,
        "/mpub",
        method="POST",
        body=len(bodies).to_bytes(4, "big") + payload,
        topic=topic,
        partition=str(partition),
        binary="true",
    )
