"""The cluster metadata kept in etcd, in Youzan's JSON."""

import json

from nsqpy.common.cluster_meta import TopicMeta


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
