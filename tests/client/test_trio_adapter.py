"""The trio adapter (`nsqpy.client.trio`) against real daemons: a consumer that follows
nsqlookupd over every partition of a topic, one reading nsqds directly, and the producer."""

import itertools

import pytest
import trio

from nsqpy.client.blocking import NSQError
from nsqpy.client.core import partition_for_key
from nsqpy.client.discovery import LookupUnavailable
from nsqpy.client.trio import LookupdDiscovery, Producer, SmartProducer, open_consumer
from tests.harness import start_nsqd
from tests.support.partitioned import Cluster
from tests.support.polling import wait_until
from tests.support.stats import channel_stats

_topics = itertools.count()


@pytest.fixture(scope="module", params=["1", "2"], ids=["one process", "two workers"])
def cluster(request, tmp_path_factory):
    """Also with each nsqd as two worker processes (`--workers=2`), whose partitioned topics
    are registered, looked up and served as one nsqd's."""
    cluster = Cluster(
        tmp_path_factory.mktemp("trio-client"),
        lookupds=1,
        nsqd_flags=(f"-workers={request.param}",),
    )
    yield cluster
    cluster.close()


@pytest.fixture
def topic(request) -> str:
    return f"trio_{request.node.name[5:30]}_{next(_topics)}"


async def receive(consumer, count: int) -> list:
    received = []
    with trio.fail_after(20):
        async for message in consumer:
            received.append(message)
            await message.finish()
            if len(received) == count:
                return received
    return received


async def test_a_consumer_reads_every_partition_its_lookup_lists(cluster, topic):
    owners = cluster.create_topic(topic, partitions=4)
    async with open_consumer(
        topic, "c", lookupd_http_addresses=cluster.lookupd_addresses, max_in_flight=8
    ) as consumer:
        await wait_until(lambda: len(consumer.connected_partitions()) == 4, "four partitions")
        # max_in_flight 8 spread as RDY over the four connections: 2 each.
        await wait_until(
            lambda: sorted(sum(cluster.ready_counts(topic, "c").values(), [])) == [2] * 4,
            "RDY 2 on each partition",
        )
        for partition, index in owners.items():
            async with Producer(cluster.tcp_address(index)) as producer:
                await producer.multi_publish(
                    topic, [b"%d-%d" % (partition, n) for n in range(5)], partition
                )
        received = await receive(consumer, 20)
    assert sorted(m.body for m in received) == sorted(
        b"%d-%d" % (p, n) for p in range(4) for n in range(5)
    )
    assert {m.partition for m in received} == {0, 1, 2, 3}
    assert {m.address for m in received} == {cluster.tcp_address(i) for i in owners.values()}
    # Every message acknowledged.
    for partition, index in owners.items():
        nsqd = cluster.nsqds[index]
        stats = cluster.partition_stats(index, topic)[partition]["channels"][0]
        assert (stats["depth"], stats["in_flight_count"]) == (0, 0), nsqd


async def test_a_consumer_of_an_nsqd_reads_a_classic_topic_and_requeues(tmp_path, topic):
    nsqd = start_nsqd(tmp_path)
    try:
        address = nsqd.addresses["TCP"]
        async with Producer(address) as producer:
            await producer.publish(topic, b"first")
            await producer.multi_publish(topic, [b"second", b"third"])
            with pytest.raises(NSQError, match="E_BAD_TOPIC"):
                await producer.publish("bad!topic", b"x")
            await producer.publish(topic, b"after the refusal")
        async with open_consumer(topic, "c", nsqd_tcp_addresses=[address]) as consumer:
            first = await consumer.__anext__()
            assert first.body == b"first" and first.attempts == 1
            await first.requeue()
            again = []
            with trio.fail_after(20):
                async for message in consumer:
                    again.append(message)
                    await message.finish()
                    if len(again) == 4:
                        break
        assert sorted(m.body for m in again) == [
            b"after the refusal",
            b"first",
            b"second",
            b"third",
        ]
        assert [m.attempts for m in again if m.body == b"first"] == [2]
        stats = channel_stats(nsqd, topic, "c")
        assert (stats["depth"], stats["in_flight_count"], stats["requeue_count"]) == (0, 0, 1)
    finally:
        nsqd.kill()


async def test_a_consumer_comes_back_when_its_nsqd_restarts(tmp_path, topic):
    data = tmp_path / "nsqd"
    data.mkdir()
    nsqd = start_nsqd(data)
    address = nsqd.addresses["TCP"]
    port = nsqd.port("TCP")
    try:
        async with Producer(address) as producer:
            await producer.publish(topic, b"before")
        async with open_consumer(
            topic, "c", nsqd_tcp_addresses=[address], backoff_initial=0.05, backoff_max=0.2
        ) as consumer:
            assert [m.body for m in await receive(consumer, 1)] == [b"before"]
            assert nsqd.stop() == 0
            nsqd = start_nsqd(data, f"-tcp-address=127.0.0.1:{port}")
            await wait_until(lambda: consumer.connected_partitions(), "the new connection")
            async with Producer(address) as producer:
                await producer.publish(topic, b"after")
            assert [m.body for m in await receive(consumer, 1)] == [b"after"]
    finally:
        nsqd.kill()


async def test_the_smart_producer_spreads_publishes_and_keeps_a_key_on_its_partition(
    cluster, topic
):
    cluster.create_topic(topic, partitions=4)
    async with SmartProducer(cluster.lookupd_addresses) as producer:
        spread = [await producer.publish(topic, b"m%d" % n) for n in range(8)]
        keyed = {(await producer.publish(topic, b"k", key="order-7")).partition for _ in range(3)}
        await producer.multi_publish(topic, [b"a", b"b"], partition=2)
    assert sorted(target.partition for target in spread) == [0, 0, 1, 1, 2, 2, 3, 3]
    assert keyed == {partition_for_key("order-7", 4)}
    counts = cluster.message_counts(topic)
    assert sum(counts.values()) == 8 + 3 + 2 and counts[2] >= 4


async def test_a_consumer_reads_its_tag_from_where_it_is_told(cluster, topic):
    """`desired_tag` and `start_from` as the blocking smart consumer's: from each partition's
    third message (a1), the messages tagged `a`."""
    owners = cluster.create_topic(topic, partitions=2, channels=("d",), extend="true")
    cluster.publish_tagged(topic, owners)
    async with open_consumer(
        topic,
        "d",
        lookupd_http_addresses=cluster.lookupd_addresses,
        max_in_flight=4,
        desired_tag="a",
        start_from="msgcount:2",
    ) as consumer:
        received = await receive(consumer, 4)
    assert sorted(m.body for m in received) == sorted(
        f"a{p}-{n}".encode() for p in owners for n in (1, 2)
    )


async def test_lookups_ask_nsqlookupd_on_trio_streams_and_skip_a_silent_one(cluster, topic):
    owners = cluster.create_topic(topic, partitions=2)
    # A lookupd that takes connections and never answers.
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    silent = f"127.0.0.1:{listeners[0].socket.getsockname()[1]}"
    async with listeners[0]:
        discovery = LookupdDiscovery([silent, *cluster.lookupd_addresses], http_timeout=0.5)
        layout = await discovery.lookup(topic, "w")
        assert layout.answered == tuple(f"http://{a}" for a in cluster.lookupd_addresses)
        assert layout.partitions == {p: cluster.tcp_address(owners[p]) for p in range(2)}
        with pytest.raises(LookupUnavailable, match="did not answer in 0.5s"):
            await LookupdDiscovery([silent], http_timeout=0.5).lookup(topic)
        # Waiting for an answer holds no thread: a cancelled lookup ends at once, not when its
        # timeout would have.
        started = trio.current_time()
        with trio.move_on_after(0.2) as scope:
            await LookupdDiscovery([silent], http_timeout=60).lookup(topic)
        assert scope.cancelled_caught and trio.current_time() - started < 30
