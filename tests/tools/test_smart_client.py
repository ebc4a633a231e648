"""The smart client (nsqpy/client/smart.py, docs/client.md) against real daemons.

Two nsqlookupds and two nsqds run as subprocesses on 127.0.0.1 ephemeral ports, each nsqd
registered with both lookupds. Topics are created with Youzan's
`POST /topic/create?partition_num=4&replicator=1` on the first lookupd, which places partitions
0 and 2 on one nsqd and 1 and 3 on the other; the consumers' channels are created on every
partition first, since `/lookup?access=w` lists only partitions that have one (docs/protocol.md
§5.3) and a channel made later would not see the messages already published. Where the messages
went is checked with the nsqds' own /stats, not only with what the client reports. Every wait
is a poll with a deadline.
"""

import itertools
import os
import re
import signal
import socket
import threading
import time
import urllib.error
from pathlib import Path

import pytest

from nsqpy.client.blocking import NSQError, http_json, http_request
from nsqpy.client.smart import (
    LookupdDiscovery,
    LookupUnavailable,
    PublishFailed,
    SmartConsumer,
    SmartProducer,
    partition_for_key,
)
from tests.cluster.etcd_server import ETCD, EtcdServer
from tests.cluster.local_cluster import LocalCluster
from tests.harness import DaemonProcess
from tests.support.partitioned import DEADLINE, Cluster
from tests.support.polling import poll

DOC = Path(__file__).resolve().parents[2] / "docs" / "client.md"
needs_etcd = pytest.mark.skipif(
    not os.access(ETCD, os.X_OK), reason="cluster mode needs etcd (`make etcd`)"
)
_topics = itertools.count()


def producers_of(lookupd: DaemonProcess, topic: str) -> list:
    """/lookup's producers on this lookupd ([] while it does not know the topic)."""
    try:
        document = http_json(lookupd.addresses["HTTP"], "/lookup", topic=topic)
    except urllib.error.HTTPError as error:
        if error.code == 404:
            return []
        raise
    return document.get("producers") or []


def unused_address() -> str:
    """An address where nothing listens (a port that was free a moment ago)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{probe.getsockname()[1]}"


@pytest.fixture(scope="module", params=["1", "2"], ids=["one process", "two workers"])
def cluster(request, tmp_path_factory):
    """Also with each nsqd as two worker processes (`--workers=2`)."""
    cluster = Cluster(tmp_path_factory.mktemp("smart"), nsqd_flags=(f"-workers={request.param}",))
    yield cluster
    cluster.close()


@pytest.fixture
def own_cluster(tmp_path):
    """A cluster for one test that stops daemons."""
    cluster = Cluster(tmp_path)
    yield cluster
    cluster.close()


@pytest.fixture
def topic(request) -> str:
    return f"smart_{request.node.name[5:35]}_{next(_topics)}".replace("[", "_").replace("]", "")


def bodies_of(messages) -> list[bytes]:
    return sorted(message.body for message in messages)


def read_until(consumer: SmartConsumer, wanted: set[bytes]) -> set[bytes]:
    """Receive and finish messages until every body in `wanted` came (others may come too:
    a new leader delivers again what its predecessor's consumers had not confirmed to it)."""
    deadline = time.monotonic() + DEADLINE
    seen: set[bytes] = set()
    while not wanted <= seen:
        remaining = deadline - time.monotonic()
        assert remaining > 0, f"never received {sorted(wanted - seen)}"
        message = consumer.receive(remaining)
        if message is not None:
            seen.add(message.body)
            message.finish()
    return seen


def test_discovery_asks_every_lookupd_and_merges_their_answers(cluster, topic):
    owners = cluster.create_topic(topic)
    addresses = cluster.lookupd_addresses
    discovery = LookupdDiscovery(addresses)

    layout = discovery.lookup(topic, "w")
    assert layout.answered == tuple(f"http://{address}" for address in addresses)
    assert layout.partitions == {p: cluster.tcp_address(owners[p]) for p in range(4)}
    assert (layout.partition_num, layout.ordered, layout.complete) == (4, False, True)
    # A standalone lookupd's /listlookup names only itself: nothing more to learn here (see
    # test_lookupds_are_learnt_from_listlookup for a cluster).
    assert discovery.lookupds == [f"http://{address}" for address in addresses]
    assert discovery.lookups == 1

    # A lookupd that does not answer is skipped.
    dead = unused_address()
    layout = LookupdDiscovery([dead, addresses[1]]).lookup(topic, "r")
    assert layout.answered == (f"http://{addresses[1]}",)
    assert sorted(layout.partitions) == [0, 1, 2, 3]

    # None answering is a clear error naming each one.
    with pytest.raises(LookupUnavailable, match=re.escape(dead)) as caught:
        LookupdDiscovery([dead], http_timeout=1.0).lookup(topic)
    assert f"topic {topic!r}" in str(caught.value)
    assert list(caught.value.failures) == [f"http://{dead}"]
    # A consumer finds that out when it starts; a producer when its publish gives up.
    with pytest.raises(LookupUnavailable):
        SmartConsumer([dead], topic, "c")
    with SmartProducer([dead], publish_timeout=0.2) as producer:
        with pytest.raises(PublishFailed, match="no nsqlookupd answered") as failed:
            producer.publish(topic, b"nowhere")
    assert isinstance(failed.value.last_error, LookupUnavailable)


def test_round_robin_spreads_over_partitions_and_the_consumer_reads_them_all(cluster, topic):
    owners = cluster.create_topic(topic)
    with SmartProducer(cluster.lookupd_addresses) as producer:
        results = [producer.publish(topic, b"one %d" % number) for number in range(20)]
        batch = producer.multi_publish(topic, [b"batch %d" % number for number in range(4)])
        stats = producer.stats()

    assert sorted(r.partition for r in results) == sorted([0, 1, 2, 3] * 5)
    for result in [*results, batch]:
        assert result.address == cluster.tcp_address(owners[result.partition])
        assert result.attempts == 1
    # One connection per nsqd, reused; one lookup round.
    assert (stats.publishes, stats.messages, stats.retries) == (21, 24, 0)
    assert (stats.connections, stats.lookups) == (2, 1)
    expected_counts = {p: 5 for p in range(4)}
    expected_counts[batch.partition] += 4
    assert cluster.message_counts(topic) == expected_counts

    with SmartConsumer(cluster.lookupd_addresses, topic, "c", max_in_flight=6) as consumer:
        messages = consumer.receive_many(24, timeout=DEADLINE, finish=True)
        assert bodies_of(messages) == sorted(
            [b"one %d" % n for n in range(20)] + [b"batch %d" % n for n in range(4)]
        )
        # Each message names the partition it came from, and its nsqd.
        for message in messages:
            assert message.address == cluster.tcp_address(owners[message.partition])
        assert consumer.connected_partitions() == {
            p: cluster.tcp_address(owners[p]) for p in range(4)
        }
        assert consumer.receive(timeout=0.1) is None
        stats = consumer.stats()
        assert (stats.messages, stats.finished, stats.requeued) == (24, 24, 0)
        assert (stats.connections, stats.disconnections) == (4, 0)
        # max_in_flight spread over the four connections: 6 = 2 + 2 + 1 + 1.
        poll(
            lambda: sorted(sum(cluster.ready_counts(topic, "c").values(), [])) == [1, 1, 2, 2],
            timeout=DEADLINE,
        )


def test_a_classic_topic_is_read_from_every_nsqd_that_has_it(cluster, topic):
    # nsqpy's nsqds register a classic topic as partition 0; nsqlookupd names one of them
    # there, but every one has messages.
    for index, nsqd in enumerate(cluster.nsqds):
        http_request(
            nsqd.addresses["HTTP"], "/pub", method="POST", body=b"on %d" % index, topic=topic
        )
    for lookupd in cluster.lookupds:
        poll(lambda lookupd=lookupd: len(producers_of(lookupd, topic)) == 2, timeout=DEADLINE)
    layout = LookupdDiscovery(cluster.lookupd_addresses).lookup(topic, "r")
    assert layout.partitions == {}
    assert sorted(layout.classic_nodes) == sorted(cluster.tcp_address(i) for i in range(2))
    with SmartConsumer(cluster.lookupd_addresses, topic, "c") as consumer:
        assert read_until(consumer, {b"on 0", b"on 1"}) == {b"on 0", b"on 1"}


def _delayed_counts(cluster, topic: str) -> dict[int, int]:
    """partition -> channel `c`'s messages in the partition's delay queue."""
    return {
        partition: stats["channels"][0]["delayed_queue_count"]
        for index in range(len(cluster.nsqds))
        for partition, stats in cluster.partition_stats(index, topic).items()
    }


def _defer_on_every_partition(cluster, topic: str, owners: dict[int, int], body: bytes) -> None:
    for partition, index in owners.items():
        http_request(
            cluster.nsqds[index].addresses["HTTP"],
            "/pub",
            method="POST",
            body=b"%s %d" % (body, partition),
            topic=topic,
            partition=str(partition),
            defer="600000",
        )


def test_the_consumer_requeues_and_empties_its_channels_delayed_messages(cluster, topic):
    """`requeue_delayed` brings ten-minute DPUBs of every partition now; `empty_delayed`
    drops them from every partition's delay queue."""
    owners = cluster.create_topic(topic)
    _defer_on_every_partition(cluster, topic, owners, b"later")
    poll(lambda: _delayed_counts(cluster, topic) == dict.fromkeys(range(4), 1), timeout=DEADLINE)
    with SmartConsumer(cluster.lookupd_addresses, topic, "c", max_in_flight=4) as consumer:
        assert consumer.requeue_delayed() == []
        messages = consumer.receive_many(4, timeout=DEADLINE, finish=True)
        assert bodies_of(messages) == [b"later %d" % p for p in range(4)]
        poll(lambda: _delayed_counts(cluster, topic) == dict.fromkeys(range(4), 0))

        _defer_on_every_partition(cluster, topic, owners, b"never")
        poll(lambda: _delayed_counts(cluster, topic) == dict.fromkeys(range(4), 1))
        assert consumer.empty_delayed() == []
        assert _delayed_counts(cluster, topic) == dict.fromkeys(range(4), 0)


def test_a_handler_gets_every_message_and_each_is_finished(cluster, topic):
    cluster.create_topic(topic)
    received: list[bytes] = []
    failed_once = threading.Event()

    def handle(message) -> None:
        if message.body == b"fails once" and not failed_once.is_set():
            failed_once.set()
            raise RuntimeError("the handler refuses it the first time")
        received.append(message.body)

    with SmartProducer(cluster.lookupd_addresses) as producer:
        for number in range(7):
            producer.publish(topic, b"handled %d" % number)
        producer.publish(topic, b"fails once")
    with SmartConsumer(
        cluster.lookupd_addresses, topic, "c", handle, max_in_flight=4, requeue_delay_ms=0
    ) as consumer:
        poll(lambda: len(received) == 8, timeout=DEADLINE)
        with pytest.raises(RuntimeError):
            consumer.receive()
        poll(lambda: consumer.stats().finished == 8, timeout=DEADLINE)
        assert consumer.stats().requeued == 1
    assert sorted(received) == sorted([b"handled %d" % n for n in range(7)] + [b"fails once"])
    assert consumer.wait(0) is True


def test_an_ordered_topic_keeps_each_key_on_one_partition(cluster, topic):
    owners = cluster.create_topic(topic, channels=("c", "b"), orderedmulti="true")
    keys = [f"customer-{number}" for number in range(6)]
    with SmartProducer(cluster.lookupd_addresses) as producer:
        with pytest.raises(ValueError, match="ordered"):
            producer.publish(topic, b"no key")
        placed = {}
        for sequence in range(4):
            for key in keys:
                result = producer.publish(topic, f"{key} {sequence}".encode(), key=key)
                placed.setdefault(key, set()).add(result.partition)
        explicit = producer.publish(topic, b"to partition 3", partition=3)
        with pytest.raises(ValueError, match="0..3"):
            producer.publish(topic, b"nowhere", partition=4)
    # Same key, same partition, the one the documented hash names.
    assert placed == {key: {partition_for_key(key, 4)} for key in keys}
    assert explicit.partition == 3
    assert len({partition for partitions in placed.values() for partition in partitions}) > 1

    with SmartConsumer(cluster.lookupd_addresses, topic, "c", max_in_flight=4) as consumer:
        messages = consumer.receive_many(25, timeout=DEADLINE, finish=True)
    assert len(messages) == 25
    by_key: dict[str, list[int]] = {}
    previous_offset: dict[int, int] = {}
    for message in messages:
        assert message.address == cluster.tcp_address(owners[message.partition])
        # SUB_ORDERED: each message carries its queue position, increasing in its partition.
        assert message.offset is not None and message.record_size is not None
        assert message.offset > previous_offset.get(message.partition, -1)
        previous_offset[message.partition] = message.offset
        if message.body != b"to partition 3":
            key, sequence = message.body.decode().split()
            assert message.partition == partition_for_key(key, 4)
            by_key.setdefault(key, []).append(int(sequence))
    assert by_key == {key: [0, 1, 2, 3] for key in keys}

    # Only the lookupd the topic was not created on: a standalone one does not know the topic
    # is ordered, nsqd answers SUB with E_SUB_ORDER_IS_MUST, and the consumer switches.
    second = cluster.lookupd_addresses[1]
    with SmartConsumer(second, topic, "b", max_in_flight=4) as consumer:
        messages = consumer.receive_many(25, timeout=DEADLINE, finish=True)
        assert len(messages) == 25 and all(m.offset is not None for m in messages)
    # Insisting on plain SUB is a refusal no lookup fixes: the consumer stops with it.
    with SmartConsumer(second, topic, "b", ordered=False) as consumer:
        with pytest.raises(NSQError) as caught:
            consumer.wait(DEADLINE)
        assert caught.value.code == "E_SUB_ORDER_IS_MUST"
        with pytest.raises(NSQError):
            consumer.receive(timeout=0)
        assert consumer.connected_partitions() == {}


def test_refusals_a_lookup_cannot_fix_are_raised_at_once(cluster, topic):
    cluster.create_topic(topic)
    with SmartProducer(cluster.lookupd_addresses) as producer:
        started = time.monotonic()
        with pytest.raises(NSQError) as caught:
            producer.publish(topic, b"x" * (1024 * 1024 + 1))
        assert caught.value.code == "E_BAD_MESSAGE"
        with pytest.raises(NSQError) as caught:
            producer.publish(topic, b"")
        assert caught.value.code in ("E_BAD_MESSAGE", "E_BAD_BODY")
        assert time.monotonic() - started < 2.0
        assert producer.stats().retries == 0
        # nsqd closed those connections; the next publish opens a new one.
        assert producer.publish(topic, b"fine").attempts == 1


def test_disabled_writes_send_the_producer_to_the_other_partitions(cluster, topic):
    owners = cluster.create_topic(topic)
    disabled_nsqd = cluster.nsqds[1]
    disabled = {p for p, index in owners.items() if index == 1}
    with SmartProducer(cluster.lookupd_addresses) as producer:
        warm = [producer.publish(topic, b"before %d" % n) for n in range(4)]
        assert {result.partition for result in warm} == {0, 1, 2, 3}
        http_request(disabled_nsqd.addresses["HTTP"], "/disable/write", method="POST", type="all")
        try:
            results = [producer.publish(topic, b"during %d" % n) for n in range(20)]
            # A keyed publish stays on its partition: it fails, clearly, when that one refuses.
            key = next(
                f"k{n}" for n in itertools.count() if partition_for_key(f"k{n}", 4) in disabled
            )
            with SmartProducer(cluster.lookupd_addresses, publish_timeout=0.3) as keyed:
                with pytest.raises(PublishFailed) as caught:
                    keyed.publish(topic, b"keyed", key=key)
            assert caught.value.topic == topic
            assert isinstance(caught.value.last_error, NSQError)
            assert caught.value.last_error.code == "E_FAILED_ON_NOT_LEADER"
            assert f"topic {topic!r}" in str(caught.value)
            assert "E_FAILED_ON_NOT_LEADER" in str(caught.value)
        finally:
            http_request(
                disabled_nsqd.addresses["HTTP"], "/disable/write", method="POST", type="none"
            )
        stats = producer.stats()
    assert all(result.partition not in disabled for result in results)
    # Each refusing partition was tried once, then avoided while it cools down.
    assert stats.retries == len(disabled)
    assert sum(result.attempts - 1 for result in results) == len(disabled)

    counts = cluster.message_counts(topic)
    assert sum(counts.values()) == 24
    assert all(counts[p] == 1 for p in disabled)
    with SmartConsumer(cluster.lookupd_addresses, topic, "c", max_in_flight=10) as consumer:
        messages = consumer.receive_many(24, timeout=DEADLINE, finish=True)
    expected = [b"before %d" % n for n in range(4)] + [b"during %d" % n for n in range(20)]
    assert bodies_of(messages) == sorted(expected)


def test_a_stopped_nsqd_is_avoided_and_picked_up_again_when_it_is_back(own_cluster, topic):
    """nsqd 1 stops (its partitions leave the lookups) and starts again on its data path, on
    new ports. The producer and the consumer carry on with nsqd 0's partitions, then find
    nsqd 1's again: the consumer that lost them by looking for them after each backoff, one
    started meanwhile by its periodic lookups."""
    cluster = own_cluster
    owners = cluster.create_topic(topic, channels=("c", "late"))
    stopped = {p for p, index in owners.items() if index == 1}
    kept = {0, 1, 2, 3} - stopped
    producer = SmartProducer(cluster.lookupd_addresses, backoff_max=0.2)
    consumer = SmartConsumer(
        cluster.lookupd_addresses, topic, "c", max_in_flight=8, backoff_max=0.2
    )
    late = None
    try:
        for number in range(8):
            producer.publish(topic, b"first %d" % number)
        first = consumer.receive_many(8, timeout=DEADLINE, finish=True)
        assert bodies_of(first) == sorted(b"first %d" % n for n in range(8))

        cluster.stop_nsqd(1)
        results = [producer.publish(topic, b"second %d" % number) for number in range(8)]
        assert {result.partition for result in results} == kept
        assert producer.stats().retries >= 1
        second = consumer.receive_many(8, timeout=DEADLINE, finish=True)
        assert bodies_of(second) == sorted(b"second %d" % n for n in range(8))
        poll(lambda: set(consumer.connected_partitions()) == kept, timeout=DEADLINE)
        late = SmartConsumer(
            cluster.lookupd_addresses, topic, "late", max_in_flight=8, lookup_interval=0.2
        )
        poll(lambda: set(late.connected_partitions()) == kept, timeout=DEADLINE)

        cluster.restart_nsqd(1)
        leaders = {p: cluster.tcp_address(owners[p]) for p in range(4)}
        poll(lambda: consumer.connected_partitions() == leaders, timeout=DEADLINE)
        poll(lambda: late.connected_partitions() == leaders, timeout=DEADLINE)
        assert consumer.stats().disconnections == 2
        assert late.stats().disconnections == 0
        # The producer's lookup lacked partitions, so it looks up again soon and spreads over
        # all four again.
        results = []

        def spread_over_all_partitions_again() -> bool:
            results.append(producer.publish(topic, b"third %d" % len(results)))
            return {result.partition for result in results[-4:]} == {0, 1, 2, 3}

        poll(spread_over_all_partitions_again, timeout=DEADLINE)
        third = {b"third %d" % n for n in range(len(results))}
        messages = consumer.receive_many(len(third), timeout=DEADLINE, finish=True)
        assert set(bodies_of(messages)) == third
        assert {message.partition for message in messages} == {0, 1, 2, 3}
        # The late consumer's channel kept everything, nsqd 1's partitions across the restart.
        everything = {m.body for m in first} | {m.body for m in second} | third
        assert read_until(late, everything) == everything
    finally:
        consumer.close()
        producer.close()
        if late is not None:
            late.close()


def test_one_lookupd_down_the_other_still_serves(own_cluster, topic):
    cluster = own_cluster
    cluster.create_topic(topic)
    addresses = cluster.lookupd_addresses
    producer = SmartProducer(addresses)
    consumer = SmartConsumer(addresses, topic, "c", max_in_flight=4, lookup_interval=0.2)
    try:
        producer.publish(topic, b"before")
        assert bodies_of(consumer.receive_many(1, timeout=DEADLINE, finish=True)) == [b"before"]

        cluster.lookupds[0].kill()
        layout = producer.refresh(topic)
        assert layout.answered == (f"http://{addresses[1]}",)
        assert layout.complete
        lookups = consumer.stats().lookups
        poll(lambda: consumer.stats().lookups >= lookups + 2, timeout=DEADLINE)
        for number in range(8):
            producer.publish(topic, b"after %d" % number)
        after = consumer.receive_many(8, timeout=DEADLINE, finish=True)
        assert bodies_of(after) == sorted(b"after %d" % n for n in range(8))
        assert len(consumer.connected_partitions()) == 4

        # A client that starts now finds the topic through the lookupd left.
        with SmartProducer(addresses) as late:
            assert late.publish(topic, b"late").attempts == 1
        assert bodies_of(consumer.receive_many(1, timeout=DEADLINE, finish=True)) == [b"late"]
    finally:
        consumer.close()
        producer.close()


def test_docs_example_runs(cluster, capsys):
    """The first Python block of docs/client.md, against this cluster."""
    example = re.search(r"```python\n(.*?)```", DOC.read_text(), flags=re.S).group(1)
    topic = f"orders_{next(_topics)}"
    cluster.create_topic(topic, channels=())
    example = example.replace("127.0.0.1:4161", cluster.lookupd_addresses[0]).replace(
        '"orders"', repr(topic)
    )
    exec(compile(example, str(DOC), "exec"), {})
    lines = capsys.readouterr().out.splitlines()
    assert sorted(lines) == sorted(f"order {n}" for n in range(10))


@needs_etcd
def test_lookupds_are_learnt_from_listlookup(tmp_path, topic):
    """In a cluster (etcd), every lookupd's /listlookup names them all: a client given one
    learns the other, and keeps working through it when the first one is gone."""
    with (
        EtcdServer(tmp_path / "etcd") as etcd,
        LocalCluster(tmp_path, etcd, nsqds=2, lookupds=2) as cluster,
    ):
        cluster.create_topic(topic, 4, 1)
        for partition in range(4):
            leader = cluster.node_leading(topic, partition)
            target = f"/channel/create?topic={topic}&channel=c&partition={partition}"
            assert leader.http("POST", target).status == 200
        first, second = (f"127.0.0.1:{lookupd.port('HTTP')}" for lookupd in cluster.lookupds)

        discovery = LookupdDiscovery([first])
        assert discovery.discover_lookupds() == [f"http://{first}", f"http://{second}"]
        poll(lambda: discovery.lookup(topic, "w").complete, timeout=DEADLINE)
        assert discovery.lookup(topic, "w").answered == (f"http://{first}", f"http://{second}")

        producer = SmartProducer([first])
        consumer = SmartConsumer([first], topic, "c", max_in_flight=4, lookup_interval=0.2)
        try:
            producer.publish(topic, b"before")
            assert bodies_of(consumer.receive_many(1, DEADLINE, finish=True)) == [b"before"]
            cluster.lookupds[0].process.send_signal(signal.SIGKILL)
            cluster.lookupds[0].process.wait()
            assert producer.refresh(topic).answered == (f"http://{second}",)
            results = [producer.publish(topic, b"after %d" % n) for n in range(8)]
            assert {result.partition for result in results} == {0, 1, 2, 3}
            after = consumer.receive_many(8, timeout=DEADLINE, finish=True)
            assert bodies_of(after) == sorted(b"after %d" % n for n in range(8))
        finally:
            consumer.close()
            producer.close()


@needs_etcd
def test_a_partition_is_followed_to_its_new_leader(tmp_path, topic):
    """In a cluster with 3 replicas per partition, the leader of partition 0 is killed: a
    publish keyed to partition 0 is retried until it reaches the new leader (it never moves
    to another partition), and the consumer subscribes there; every acknowledged message is
    read."""
    with (
        EtcdServer(tmp_path / "etcd") as etcd,
        LocalCluster(tmp_path, etcd, nsqds=3, lookupds=1, nsqd_args=("-sync-every=1",)) as cluster,
    ):
        cluster.create_topic(topic, 2, 3)
        for partition in range(2):
            leader = cluster.node_leading(topic, partition)
            target = f"/channel/create?topic={topic}&channel=c&partition={partition}"
            assert leader.http("POST", target).status == 200
        lookupd = f"127.0.0.1:{cluster.lookupds[0].port('HTTP')}"
        key = next(f"k{n}" for n in itertools.count() if partition_for_key(f"k{n}", 2) == 0)
        producer = SmartProducer([lookupd], publish_timeout=DEADLINE)
        consumer = SmartConsumer([lookupd], topic, "c", max_in_flight=4, backoff_max=0.5)
        try:
            before = {b"before %d" % n for n in range(5)}
            for body in sorted(before):
                assert producer.publish(topic, body, key=key).partition == 0
            read_until(consumer, before)

            old = cluster.node_leading(topic, 0)
            old.kill()
            during = producer.publish(topic, b"during", key=key)
            new = poll(lambda: cluster.node_leading(topic, 0), timeout=DEADLINE)
            assert new is not old
            new_address = f"127.0.0.1:{new.tcp_port}"
            assert (during.partition, during.address) == (0, new_address)
            assert during.attempts >= 2 and producer.stats().retries >= 1

            after = {b"after %d" % n for n in range(5)}
            for body in sorted(after):
                assert producer.publish(topic, body, key=key).address == new_address
            read_until(consumer, {b"during", *after})
            assert consumer.connected_partitions()[0] == new_address
            assert consumer.stats().disconnections >= 1
        finally:
            consumer.close()
            producer.close()


def test_a_consumer_reads_its_tag_and_starts_where_it_is_told(cluster, topic):
    """`desired_tag` takes only the messages of its tag (no consumer has the others'); a
    consumer alone on its channel with `start_from="msgcount:4"` starts each partition at its
    fifth message (SUB_ADVANCED; only a partition's first subscription names it:
    tests/client/test_core.py)."""
    owners = cluster.create_topic(topic, partitions=2, channels=("c", "d"), extend="true")
    cluster.publish_tagged(topic, owners)
    tagged = {f"a{p}-{n}".encode() for p in owners for n in range(3)}
    with SmartConsumer(
        cluster.lookupd_addresses, topic, "c", desired_tag="a", max_in_flight=4
    ) as consumer:
        assert read_until(consumer, tagged) == tagged
    later = {f"{tag}{p}-2".encode() for p in owners for tag in ("a", "b")}
    with SmartConsumer(
        cluster.lookupd_addresses, topic, "d", start_from="msgcount:4", max_in_flight=4
    ) as consumer:
        assert read_until(consumer, later) == later
    with pytest.raises(ValueError, match="a consume start is"):
        SmartConsumer(cluster.lookupd_addresses, topic, "d", start_from="latest")
