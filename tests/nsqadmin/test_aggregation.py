"""The aggregation logic (nsqadmin/stats.py) against Go nsqadmin v1.3.0's own answers.

The reference captures hold what Go nsqlookupd and Go nsqd answered and what Go nsqadmin made
of it (`nsqadmin_api_*.http`, taken from the same cluster at the same moment). Fed the
nsqlookupd and nsqd bodies, our aggregation must write Go nsqadmin's bodies byte for byte.
Then the cases the captures do not show: several nodes, e2e percentiles, counters, versions.
"""

import copy

from nsqpy.common.goformat import go_float, go_json
from nsqpy.nsqadmin.statistics import ranking
from nsqpy.nsqadmin.stats import (
    ChannelStats,
    E2eLatency,
    NodeStats,
    Producer,
    TopicStats,
    aggregate_topic,
    aggregate_topics,
    counter_stats,
    find_producer,
    merge_lookupd_producers,
    merge_topic_producers,
    semver_key,
    warning_message,
)
from tests.nsqadmin.support import reference

LOOKUPD = "127.0.0.1:24161"  # the capture's nsqlookupd, as nsqadmin was given it
NSQD = "127.0.0.1:24151"


def stats_without_clients(name: str) -> dict:
    """A captured /stats body as nsqd answers it with include_clients=false (Go nsqadmin's
    topic request): the same numbers, `clients` null."""
    body = reference(name).json()
    for topic in body["topics"]:
        for channel in topic["channels"]:
            channel["clients"] = None
    return body


def test_api_nodes_is_gos_byte_for_byte():
    producers = merge_lookupd_producers([(LOOKUPD, reference("nsqlookupd_nodes.http").json())])
    body = {"nodes": [p.to_json() for p in producers], "message": warning_message([])}
    assert go_json(body) == reference("nsqadmin_api_nodes.http").body


def test_api_topics_is_gos_byte_for_byte():
    topics = sorted(set(reference("nsqlookupd_topics.http").json()["topics"]))
    body = {"topics": topics, "message": ""}
    assert go_json(body) == reference("nsqadmin_api_topics.http").body


def test_api_topic_is_gos_byte_for_byte():
    # nsqadmin asks nsqlookupd who produces the topic, then each producer for its /stats.
    producers = merge_topic_producers([reference("nsqlookupd_lookup.http").json()])
    assert [p.http_address for p in producers] == [NSQD]
    stats = NodeStats()
    for producer in producers:
        body = stats_without_clients("nsqd_stats_json_with_producer.http")
        stats.add_node(producer.http_address, producer.hostname, body, "test")
    total = aggregate_topic("test", stats.finish().topics)
    body = {**total.to_json(), "message": ""}
    assert go_json(body) == reference("nsqadmin_api_topic.http").body


def test_nodes_from_two_lookupds_are_merged_and_remember_both():
    nodes = reference("nsqlookupd_nodes.http").json()
    producers = merge_lookupd_producers([(LOOKUPD, nodes), ("127.0.0.1:24261", nodes)])
    assert len(producers) == 1
    assert producers[0].remote_addresses == [
        f"{LOOKUPD}/127.0.0.1:45306",
        "127.0.0.1:24261/127.0.0.1:45306",
    ]
    assert not producers[0].is_inconsistent(2)
    assert producers[0].is_inconsistent(3)
    assert find_producer(producers, NSQD) is producers[0]
    assert find_producer(producers, "127.0.0.1:1") is None


def test_tombstoned_topics_and_out_of_date_versions():
    nodes = {
        "producers": [
            {
                "remote_address": "10.0.0.1:1",
                "hostname": "b-host",
                "broadcast_address": "10.0.0.1",
                "tcp_port": 4150,
                "http_port": 4151,
                "version": "1.2.1",
                "tombstones": [False, True],
                "topics": ["zeta", "alpha"],
            },
            {
                "remote_address": "10.0.0.2:1",
                "hostname": "a-host",
                "broadcast_address": "10.0.0.2",
                "tcp_port": 4150,
                "http_port": 4151,
                "version": "1.3.0+nsqpy.0.1.0",
                "tombstones": [],
                "topics": [],
            },
        ]
    }
    producers = merge_lookupd_producers([(LOOKUPD, nodes)])
    # Sorted by hostname; topics by name, each keeping its own tombstone.
    assert [p.hostname for p in producers] == ["a-host", "b-host"]
    old = producers[1]
    assert [(t.topic, t.tombstoned) for t in old.topics] == [("alpha", True), ("zeta", False)]
    assert old.out_of_date and not producers[0].out_of_date
    assert producers[0].to_json()["topics"] is None  # Go's nil slice


def test_semver_precedence_ignores_build_metadata():
    assert semver_key("1.3.0+nsqpy.0.1.0") == semver_key("1.3.0")
    assert semver_key("1.3.0-rc.1") < semver_key("1.3.0") < semver_key("1.10.0")
    assert semver_key("1.3.0-alpha") < semver_key("1.3.0-alpha.1") < semver_key("1.3.0-beta")
    assert semver_key("garbage") == semver_key("0.0.0")


def _node_body(depth, backend, messages, channel_depth, in_flight, clients, percentiles=None):
    body = copy.deepcopy(reference("nsqd_stats_json_with_producer.http").json())
    topic = body["topics"][0]
    topic.update(depth=depth, backend_depth=backend, message_count=messages)
    channel = topic["channels"][0]
    channel.update(
        depth=channel_depth,
        backend_depth=0,
        in_flight_count=in_flight,
        message_count=messages,
        client_count=len(clients),
        clients=clients,
    )
    if percentiles is not None:
        e2e = {"count": 10, "percentiles": percentiles}
        channel["e2e_processing_latency"] = topic["e2e_processing_latency"] = e2e
    return body


def _client(address: str, hostname: str) -> dict:
    client = copy.deepcopy(
        reference("nsqd_stats_json.http").json()["topics"][0]["channels"][0]["clients"][0]
    )
    client.update(remote_address=address, hostname=hostname)
    return client


def test_two_nodes_add_up_and_keep_their_own_rows():
    stats = NodeStats()
    stats.add_node(
        "10.0.0.2:4151",
        "node-b",
        _node_body(5, 2, 70, 4, 3, [_client("10.9.0.1:1000", "consumer-z")]),
        "test",
        now=1795300805,
    )
    stats.add_node(
        "10.0.0.1:4151",
        "node-a",
        _node_body(7, 0, 30, 6, 1, [_client("10.9.0.2:2000", "consumer-a")]),
        "test",
        now=1795300805,
    )
    stats.finish()
    assert [t.hostname for t in stats.topics] == ["node-a", "node-b"]

    total = aggregate_topic("test", stats.topics)
    assert (total.node, total.depth, total.memory_depth, total.backend_depth) == ("*", 12, 10, 2)
    assert total.message_count == 100
    assert [n.node for n in total.nodes] == ["10.0.0.1:4151", "10.0.0.2:4151"]
    [channel] = total.channels
    assert channel.node == "*"
    assert (channel.depth, channel.in_flight_count, channel.client_count) == (10, 4, 2)
    assert [n.hostname for n in channel.nodes] == ["node-a", "node-b"]
    # Go would have folded node-b into node-a's own channel entry; ours stays node-a's.
    node_a_channel = stats.topics[0].channels[0]
    assert (node_a_channel.node, node_a_channel.depth, node_a_channel.nodes) == (
        "10.0.0.1:4151",
        6,
        None,
    )
    assert [c.hostname for c in channel.clients] == ["consumer-a", "consumer-z"]
    assert channel.clients[0].node == "10.0.0.1:4151"
    # connected = now (whole seconds) - connect_ts, in nanoseconds, as Go computes it.
    assert channel.clients[0].connected == 10 * 1_000_000_000
    assert channel.clients[0].hostname_port == "consumer-a:2000"

    # The channel map Go's /api/topics/:topic/:channel reads: always an aggregate.
    by_channel = stats.channels["ch"]
    assert by_channel.node == "*" and by_channel.depth == 10
    assert len(by_channel.clients) == 2
    assert by_channel.e2e_processing_latency.to_json()["host"] == "*"


def test_e2e_percentiles_merge_weighted_by_count():
    first = E2eLatency.from_nsqd({"count": 10, "percentiles": [{"quantile": 0.99, "value": 1000}]})
    second = E2eLatency.from_nsqd({"count": 30, "percentiles": [{"quantile": 0.99, "value": 2000}]})
    # One node's view, as Go unmarshals it: min = max = average = value, count = count.
    assert first.to_json()["percentiles"] == [
        {
            "average": 1000.0,
            "count": 10.0,
            "max": 1000.0,
            "min": 1000.0,
            "quantile": 0.99,
            "value": 1000.0,
        }
    ]
    total = E2eLatency(topic="t", host="*")
    total.add(first)
    total.add(second)
    [merged] = total.percentiles
    assert total.count == 40
    assert merged["count"] == 40
    assert merged["min"] == 1000 and merged["max"] == 2000
    assert merged["average"] == 1750  # (10 * 1000 + 30 * 2000) / 40
    assert go_json(total.to_json()).decode() == (
        '{"count":40,"percentiles":[{"average":1750,"count":40,"max":2000,"min":1000,'
        '"quantile":0.99}],"topic":"t","channel":"","host":"*"}'
    )


def test_a_node_without_percentiles_leaves_them_null():
    total = E2eLatency()
    total.add(E2eLatency.from_nsqd({"count": 0, "percentiles": None}))
    assert total.to_json()["percentiles"] is None


def test_selected_topic_and_channel_filter_the_node_stats():
    body = reference("nsqd_stats_json_with_producer.http").json()
    extra = copy.deepcopy(body["topics"][0])
    extra["topic_name"] = "other"
    body["topics"].append(extra)
    body["topics"][0]["channels"].append(
        dict(copy.deepcopy(body["topics"][0]["channels"][0]), channel_name="ch2")
    )
    everything = NodeStats()
    everything.add_node(NSQD, "vm", body)
    assert [t.topic_name for t in everything.topics] == ["test", "other"]
    assert sorted(everything.channels) == ["other:ch", "test:ch", "test:ch2"]

    one_channel = NodeStats()
    one_channel.add_node(NSQD, "vm", body, "test", "ch2")
    assert [t.topic_name for t in one_channel.topics] == ["test"]
    assert list(one_channel.channels) == ["ch2"]


def test_topics_are_aggregated_per_name_for_the_streams_page():
    stats = NodeStats()
    body = reference("nsqd_stats_json_with_producer.http").json()
    stats.add_node("10.0.0.1:4151", "a", body)
    stats.add_node("10.0.0.2:4151", "b", body)
    totals = aggregate_topics(stats.topics)
    assert list(totals) == ["test"]
    assert totals["test"].message_count == 14
    assert totals["test"].client_count == 2
    assert totals["test"].in_flight_count == 0
    assert len(totals["test"].nodes) == 2


def test_counter_counts_each_channel_on_each_node():
    stats = NodeStats()
    body = reference("nsqd_stats_json_with_producer.http").json()
    stats.add_node("10.0.0.1:4151", "a", body)
    stats.add_node("10.0.0.2:4151", "b", body)
    counters = counter_stats(stats.channels)
    assert counters == {
        "test:ch:10.0.0.1:4151": {
            "node": "10.0.0.1:4151",
            "topic_name": "test",
            "channel_name": "ch",
            "message_count": 7,
        },
        "test:ch:10.0.0.2:4151": {
            "node": "10.0.0.2:4151",
            "topic_name": "test",
            "channel_name": "ch",
            "message_count": 7,
        },
    }


def test_an_nsqd_asked_directly_describes_itself():
    info = reference("nsqd_info.http").json()
    stats = reference("nsqd_stats_json.http").json()
    producer = Producer.from_nsqd("127.0.0.1:24151", info, stats)
    assert producer.http_address == "127.0.0.1:24151"
    assert producer.tcp_address == "127.0.0.1:24150"
    assert producer.hostname == "vm"
    assert [t.topic for t in producer.topics] == ["test"]
    assert producer.remote_addresses is None  # no nsqlookupd involved
    # A very old nsqd without broadcast_address: the address it was asked at.
    old = Producer.from_nsqd("10.1.1.1:4151", {"version": "0.3.8"}, {"topics": []})
    assert (old.http_address, old.hostname, old.topics) == ("10.1.1.1:4151", "10.1.1.1", None)


def test_empty_aggregates_are_go_nils():
    total = aggregate_topic("nothing", [])
    assert total.to_json() == {
        "node": "",
        "hostname": "",
        "topic_name": "nothing",
        "depth": 0,
        "memory_depth": 0,
        "backend_depth": 0,
        "message_count": 0,
        "nodes": None,
        "channels": None,
        "paused": False,
        "e2e_processing_latency": None,
    }
    assert TopicStats().in_flight_count == 0
    assert ChannelStats.aggregate("t", "c").to_json()["clients"] is None


def test_paused_anywhere_is_paused_in_the_total():
    paused = reference("nsqd_stats_json.http").json()
    paused["topics"][0]["paused"] = True
    paused["topics"][0]["channels"][0]["paused"] = True
    stats = NodeStats()
    stats.add_node("10.0.0.1:4151", "a", reference("nsqd_stats_json.http").json())
    stats.add_node("10.0.0.2:4151", "b", paused)
    total = aggregate_topic("test", stats.topics)
    assert total.paused and total.channels[0].paused
    assert not total.nodes[0].paused


def test_warning_message_is_gos():
    assert warning_message([]) == ""
    assert warning_message(["a", "b"]) == "WARNING: a; b"


def test_go_json_encoding():
    assert go_json({"b": 1, "a": [1.0, 0.5, None, True]}) == b'{"b":1,"a":[1,0.5,null,true]}'
    assert go_json("<a&b>") == b'"\\u003ca\\u0026b\\u003e"'
    assert go_json("é\u2028").decode() == '"é\\u2028"'
    assert [go_float(v) for v in (1e-7, 1.5e-5, 1e21, 123456789.0)] == [
        "1e-7",
        "0.000015",
        "1e+21",
        "123456789",
    ]


# -- cluster partitions: one row each ---------------------------------------------------------


def replica_body(
    role: str,
    write_epoch: int = 1,
    *,
    messages: int = 0,
    isr: tuple[str, ...] = ("10.0.0.1:4200:4150:1", "10.0.0.2:4200:4150:2"),
    catchup: tuple[str, ...] = (),
) -> dict:
    """An nsqd's /stats with partition 0 of topic `t` in a cluster, as `role` sees it, and
    its channel `ch` holding what was published."""
    body = copy.deepcopy(reference("nsqd_stats_json.http").json())
    topic = body["topics"][0]
    channel = topic["channels"][0]
    topic.update(
        topic_name="t",
        message_count=messages,
        topic_partition=0,
        cluster_role=role,
        cluster_leader="10.0.0.1:4150",
        cluster_isr=list(isr),
        cluster_catchup=list(catchup),
        cluster_write_epoch=write_epoch,
        cluster_writable=role == "leader",
        cluster_replicas=3,
        under_replicated=len(isr) < 3,
    )
    channel.update(channel_name="ch", depth=messages, message_count=messages)
    return body


def test_a_cluster_partition_is_its_leaders_row_once():
    stats = NodeStats()
    stats.add_node("10.0.0.2:4151", "b", replica_body("follower", messages=0), "t")
    stats.add_node("10.0.0.1:4151", "a", replica_body("leader", messages=5), "t")
    stats.add_node("10.0.0.3:4151", "c", replica_body("catchup", messages=0), "t")
    total = aggregate_topic("t", stats.finish().topics)
    [row] = total.nodes
    assert (row.node, row.replica.role) == ("10.0.0.1:4151", "leader")
    assert total.message_count == 5
    # The channel too: the leader's, not the sum of the replicas'.
    assert stats.channels["ch"].depth == 5 and len(stats.channels["ch"].nodes) == 1
    assert total.under_replicated_partitions == 1
    body = total.to_json()
    assert body["under_replicated_partitions"] == 1
    assert body["nodes"][0]["cluster_isr"] == ["10.0.0.1:4200:4150:1", "10.0.0.2:4200:4150:2"]
    assert body["nodes"][0]["under_replicated"] is True


def test_of_two_leaders_the_newer_write_epoch_wins():
    stats = NodeStats()
    stats.add_node("10.0.0.1:4151", "a", replica_body("leader", 3, messages=7), "t")
    stats.add_node("10.0.0.2:4151", "b", replica_body("leader", 4, messages=2), "t")
    [row] = stats.finish().topics
    assert (row.node, row.replica.write_epoch, row.message_count) == ("10.0.0.2:4151", 4, 2)


def test_without_a_leader_a_follower_stands_in():
    stats = NodeStats()
    stats.add_node("10.0.0.3:4151", "c", replica_body("catchup", 2), "t")
    stats.add_node("10.0.0.2:4151", "b", replica_body("follower", 2), "t")
    [row] = stats.finish().topics
    assert (row.node, row.replica.role) == ("10.0.0.2:4151", "follower")


def test_partitions_outside_a_cluster_stay_one_row_per_node():
    stats = NodeStats()
    for node in ("10.0.0.1:4151", "10.0.0.2:4151"):
        body = copy.deepcopy(reference("nsqd_stats_json.http").json())
        body["topics"][0]["topic_partition"] = 0
        stats.add_node(node, node, body)
    total = aggregate_topic("test", stats.finish().topics)
    assert len(total.nodes) == 2
    assert "under_replicated_partitions" not in total.to_json()
    assert "cluster_role" not in total.nodes[0].to_json()


def test_a_channel_rank_lists_only_the_channels_it_is_about():
    """Youzan's `/api/statistics/channel-requeue`: a channel that timed out but never requeued
    is no entry among the requeues, and the other way round."""
    body = copy.deepcopy(reference("nsqd_stats_json.http").json())
    [topic] = body["topics"][:1]
    [channel] = topic["channels"][:1]
    requeued = {**channel, "channel_name": "requeued", "requeue_count": 3, "timeout_count": 0}
    timed_out = {**channel, "channel_name": "timed_out", "requeue_count": 0, "timeout_count": 2}
    topic["channels"] = [requeued, timed_out]
    body["topics"] = [topic]
    stats = NodeStats()
    stats.add_node(NSQD, "host", body)
    stats.finish()
    name = topic["topic_name"]
    assert [item.name for item in ranking("channel-requeue", stats, {})] == [f"{name}/requeued"]
    assert [item.name for item in ranking("channel-timeout", stats, {})] == [f"{name}/timed_out"]
    assert ranking("channel-delayedqueue", stats, {}) == []
