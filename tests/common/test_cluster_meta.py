"""The cluster metadata kept in etcd, in Youzan's JSON."""

import json

from nsqpy.common.cluster_meta import ClusterKeys, ReplicaInfo, TopicMeta, TopicsView


def test_topic_meta_is_youzans_json_and_reads_back():
    meta = TopicMeta(4, 3, sync_every=100, retention_day=2, ext=True, magic_code=17)
    document = json.loads(meta.to_json())
    assert document == {
        "PartitionNum": 4,
        "Replica": 3,
        "SuggestLF": False,
        "SyncEvery": 100,
        "MagicCode": 17,
        "RetentionDay": 2,
        "OrderedMulti": False,
        "MultiPart": False,
        "Ext": True,
        "DisableChannelAutoCreate": False,
    }
    assert TopicMeta.from_json(meta.to_json()) == meta


def test_a_topic_meta_without_a_magic_code_reads_as_none_recorded():
    assert TopicMeta.from_json(b'{"PartitionNum": 1, "Replica": 2}').magic_code == 0


def test_an_older_revision_never_replaces_a_newer_one():
    """A write's caller learns its result after awaiting it; by then the watch may have
    delivered a newer write of the key, or its deletion. The view keeps the newer one (a
    master holding the older revision retried its next write against it for ever)."""
    keys = ClusterKeys("NSQMetaData", "test")
    view = TopicsView(keys)
    key = keys.replica_info("t", 1)
    joined = ReplicaInfo(leader="a", isr=("a", "b", "c"))
    dropped = ReplicaInfo(leader="a", isr=("a", "c"))
    view.take(key, dropped.to_json(), 12)
    view.take(key, joined.to_json(), 11)
    assert view.infos[("t", 1)].isr == ("a", "c")
    assert view.infos[("t", 1)].epoch == 12
    view.take(key, None, 13)
    view.take(key, dropped.to_json(), 12)
    assert ("t", 1) not in view.infos
    meta_key = keys.topic_meta("t")
    view.take(meta_key, TopicMeta(2, 2).to_json(), 20)
    view.take(meta_key, TopicMeta(1, 2).to_json(), 19)
    assert view.metas["t"].partition_num == 2
