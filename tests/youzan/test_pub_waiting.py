"""Youzan's `--max-pub-waiting-size` (docs/protocol.md §7.3): a publish that would leave more
body bytes taken and not yet acknowledged in its topic than the limit is refused, over TCP
with the fatal `E_PUB_TOO_MUCH_WAITING pub too much waiting in the queue: <bytes>`, over HTTP
with 429 and the same text; what waits is a log topic's groups not yet written, replicated
or synced."""

from nsqpy.common.command import encode_pub
from tests.nsqd.wire import with_options
from tests.support.polling import wait_until
from tests.youzan.support import connect, create_partitions, http


@with_options(max_pub_waiting_size=100)
async def test_a_publish_past_the_limit_is_refused_over_tcp_and_http(nsqd):
    await create_partitions(nsqd, "yz", 0)
    reply = await http(nsqd, "POST", "/pub?topic=yz&partition=0", b"x" * 101)
    assert (reply.status, reply.json()) == (
        429,
        {"message": "E_PUB_TOO_MUCH_WAITING pub too much waiting in the queue: 101"},
    )
    writer = await connect(nsqd)
    await writer.send(encode_pub("yz", b"x" * 150, 0))
    await writer.expect_error(
        "E_PUB_TOO_MUCH_WAITING pub too much waiting in the queue: 150", fatal=True
    )
    assert (await http(nsqd, "POST", "/pub?topic=yz&partition=0", b"x" * 100)).status == 200


@with_options(max_pub_waiting_size=100)
async def test_what_waits_to_be_written_counts_against_the_limit(nsqd):
    """While the partition's writer is held, a first publish of 60 bytes waits unanswered; a
    second of 60 is refused at once (120 would wait); once the first is written, the second
    goes through."""
    await create_partitions(nsqd, "yz", 0)
    (topic,) = nsqd.registry.partitions("yz")
    first = await connect(nsqd)
    async with topic.queue.writer.exclusive():
        await first.send(encode_pub("yz", b"a" * 60, 0))

        async def waiting() -> bool:
            return topic.queue.waiting_bytes == 60

        await wait_until(waiting, "the first publish waiting to be written")
        reply = await http(nsqd, "POST", "/pub?topic=yz&partition=0", b"b" * 60)
        assert (reply.status, reply.json()["message"]) == (
            429,
            "E_PUB_TOO_MUCH_WAITING pub too much waiting in the queue: 120",
        )
    await first.expect_ok()
    assert (await http(nsqd, "POST", "/pub?topic=yz&partition=0", b"b" * 60)).status == 200
    assert topic.message_count == 2
