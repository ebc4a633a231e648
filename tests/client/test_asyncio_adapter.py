"""The asyncio adapter's consumer (`nsqpy.client.asyncio.Subscription`, nsq_pubsub's) with
Youzan's tag and consume start, against a partitioned topic on real daemons; its other
behaviour is nsq_pubsub's (tests/tools/test_nsq_pubsub.py)."""

import asyncio
import logging

import pytest

from nsqpy.client.asyncio import Subscription
from nsqpy.client.core import targets_of
from nsqpy.client.smart import LookupdDiscovery
from tests.support.partitioned import Cluster


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    cluster = Cluster(tmp_path_factory.mktemp("asyncio-client"), lookupds=1)
    yield cluster
    cluster.close()


def test_a_subscription_reads_its_tag_from_where_it_is_told(cluster):
    owners = cluster.create_topic("tagged", partitions=2, channels=("d",), extend="true")
    cluster.publish_tagged("tagged", owners)
    discovery = LookupdDiscovery(cluster.lookupd_addresses)

    async def discover(topic: str):
        return targets_of(await asyncio.to_thread(discovery.lookup, topic, "r"))

    async def read() -> list[bytes]:
        subscription = Subscription(
            "tagged",
            "d",
            discover,
            max_in_flight=4,
            identify={},
            tls=None,
            poll_interval=60.0,
            log=logging.getLogger("test"),
            desired_tag="a",
            start_from="msgcount:2",
        )
        await subscription.start()
        bodies: list[bytes] = []
        try:
            async with asyncio.timeout(20):
                while len(bodies) < 4:
                    batch = await subscription.next_batch()
                    bodies.extend(delivery.body for delivery in batch)
                    subscription.finish(batch)
        finally:
            await subscription.close()
        return bodies

    bodies = asyncio.run(read())
    assert sorted(bodies) == sorted(f"a{p}-{n}".encode() for p in owners for n in (1, 2))
