"""The topic registry: partitions by (name, partition), and the default partition classic
commands use kept right as partitions come and go."""

from types import SimpleNamespace

import pytest

from nsqpy.nsqd.topic_registry import TopicRegistry


def partition(name: str, number: int):
    return SimpleNamespace(name=name, partition=number)


def test_the_default_is_the_lowest_local_partition_as_they_come_and_go():
    registry = TopicRegistry()
    p3, p1, p5 = partition("t", 3), partition("t", 1), partition("t", 5)
    for topic in (p3, p1, p5):
        registry.add(topic)
    assert registry.default("t") is p1 and registry.defaults["t"] is p1 and "t" in registry
    assert registry.partitions("t") == [p1, p3, p5]
    assert registry.get("t", 5) is p5 and registry.get("t", 2) is None
    assert registry.remove("t", 1) is p1
    assert registry.default("t") is p3
    registry.remove("t", 3)
    registry.remove("t", 5)
    assert registry.default("t") is None and "t" not in registry
    assert registry.partitions("t") == [] and list(registry) == []


def test_every_partition_by_name_then_number():
    registry = TopicRegistry()
    topics = [partition("b", 0), partition("a", 2), partition("a", 0)]
    for topic in topics:
        registry.add(topic)
    assert [(t.name, t.partition) for t in registry] == [("a", 0), ("a", 2), ("b", 0)]


def test_the_defaults_view_is_read_only():
    registry = TopicRegistry()
    registry.add(partition("t", 0))
    with pytest.raises(TypeError):
        registry.defaults["u"] = partition("u", 0)  # type: ignore[index]
    assert registry.remove("nope", 0) is None
