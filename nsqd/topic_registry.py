"""Every topic partition an nsqd hosts, in one place, keyed by (name, partition).

A classic topic is partition 0 and nothing else; a Youzan topic has the partitions it was
created with (docs/protocol.md §3.2). A command without a partition means a topic's lowest
local partition (docs/protocol.md §8 #3): the registry keeps that answer ready, since every
classic publish asks it, and keeps it right itself whenever a partition comes or goes.
"""

from collections.abc import Iterator, Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from nsqpy.nsqd.topic import Topic


class TopicRegistry:
    __slots__ = ("_partitions", "_defaults", "defaults")

    def __init__(self) -> None:
        self._partitions: dict[str, dict[int, Topic]] = {}
        # name -> the lowest local partition: derived from `_partitions`, only ever written
        # by `_refresh`.
        self._defaults: dict[str, Topic] = {}
        # The same, read-only, for whoever asks by name (classic commands, tests).
        self.defaults: Mapping[str, Topic] = MappingProxyType(self._defaults)

    def __contains__(self, name: str) -> bool:
        return name in self._defaults

    def default(self, name: str) -> "Topic | None":
        """The partition a command without a partition means; None for an unknown topic."""
        return self._defaults.get(name)

    def get(self, name: str, partition: int) -> "Topic | None":
        return self._partitions.get(name, {}).get(partition)

    def partitions(self, name: str) -> list["Topic"]:
        """The topic's local partitions, lowest first."""
        partitions = self._partitions.get(name, {})
        return [partitions[number] for number in sorted(partitions)]

    def add(self, topic: "Topic") -> None:
        self._partitions.setdefault(topic.name, {})[topic.partition] = topic
        self._refresh(topic.name)

    def remove(self, name: str, partition: int) -> "Topic | None":
        topic = self._partitions.get(name, {}).pop(partition, None)
        self._refresh(name)
        return topic

    def __iter__(self) -> Iterator["Topic"]:
        """Every partition of every topic, by name then partition."""
        for name in sorted(self._partitions):
            yield from self.partitions(name)

    def _refresh(self, name: str) -> None:
        partitions = self._partitions.get(name)
        if partitions:
            self._defaults[name] = partitions[min(partitions)]
        else:
            self._partitions.pop(name, None)
            self._defaults.pop(name, None)
