"""Youzan nsqadmin's statistics: the ten topics or channels of the cluster that stand out
by one measure (`/api/statistics/<sort>`, the Statistics page).

* `channel-depth`: topics by the depth of all their channels, on every node;
* `hourly-pubsize`: topics by the bytes published to them in the last full hour (each
  partition's as its nodes report it in `/message/historystats`, replicas counted once);
* `channel-timeout`, `channel-requeue`, `channel-delayedqueue`: channels (`topic/channel`)
  by messages timed out, requeued, or waiting in the delay queue.

Topics with neither depth nor messages, and channels with none of the three counts, are left
out, as Youzan's; ties go by name.
"""

from dataclasses import dataclass
from typing import TYPE_CHECKING

from nsqpy.nsqadmin.stats import NodeStats

if TYPE_CHECKING:
    from nsqpy.nsqadmin.cluster import ClusterInfo

FILTERS = (
    "channel-depth",
    "hourly-pubsize",
    "channel-timeout",
    "channel-requeue",
    "channel-delayedqueue",
)
RANK_NAMES = {
    "channel-depth": "Top10 topics in Total Channel Depth",
    "channel-timeout": "Top10 channels in Timeout",
    "channel-requeue": "Top10 channels in Requeue",
    "channel-delayedqueue": "Top10 channels in Delayed Queue",
}
# Any other sort is Youzan's default ranking.
DEFAULT_RANK_NAME = "Top10 topics in Hourly Pub Size(in bytes)"
TOP = 10


@dataclass
class Ranked:
    """One topic or channel of a ranking; Go leaves out the fields that are 0."""

    name: str
    total_channel_depth: int = 0
    message_count: int = 0
    hourly_pubsize: int = 0
    requeue_count: int = 0
    delayed_queue_count: int = 0
    timeout_count: int = 0

    def to_json(self) -> dict:
        fields = {
            "total_channel_depth": self.total_channel_depth,
            "message_count": self.message_count,
            "hourly_pubsize": self.hourly_pubsize,
            "requeue_count": self.requeue_count,
            "delayed_queue_count": self.delayed_queue_count,
            "timeout_count": self.timeout_count,
        }
        return {"name": self.name, **{key: value for key, value in fields.items() if value}}


def rank_name(sort_by: str) -> str:
    return RANK_NAMES.get(sort_by, DEFAULT_RANK_NAME)


def ranking(sort_by: str, stats: NodeStats, hourly: dict[tuple[str, str], int]) -> list[Ranked]:
    """The top ten by `sort_by` of the cluster's `stats`; `hourly` is each partition's
    bytes of the last full hour, by (topic, partition)."""
    if sort_by in ("channel-timeout", "channel-requeue", "channel-delayedqueue"):
        channels: dict[str, Ranked] = {}
        for channel in stats.channels.values():
            name = f"{channel.topic_name}/{channel.channel_name}"
            item = channels.setdefault(name, Ranked(name))
            item.requeue_count += channel.requeue_count
            item.timeout_count += channel.timeout_count
            item.delayed_queue_count += channel.delayed_queue_count or 0
        key = {
            "channel-timeout": lambda item: item.timeout_count,
            "channel-requeue": lambda item: item.requeue_count,
            "channel-delayedqueue": lambda item: item.delayed_queue_count,
        }[sort_by]
        # Only the channels the rank is about: one that timed out but never requeued is no
        # entry among the requeues.
        ranked = [item for item in channels.values() if key(item)]
    else:
        topics: dict[str, Ranked] = {}
        for topic in stats.topics:
            item = topics.setdefault(topic.topic_name, Ranked(topic.topic_name))
            item.total_channel_depth += sum(channel.depth for channel in topic.channels or [])
            item.message_count += topic.message_count
        for (name, _partition), size in hourly.items():
            if name in topics:
                topics[name].hourly_pubsize += size
        ranked = [
            item for item in topics.values() if item.total_channel_depth or item.message_count
        ]
        if sort_by == "channel-depth":
            key = lambda item: item.total_channel_depth  # noqa: E731
        else:
            key = lambda item: item.hourly_pubsize  # noqa: E731
    ranked.sort(key=lambda item: (-key(item), item.name))
    return ranked[:TOP]


def last_hour_by_partition(histories: list[dict]) -> dict[tuple[str, str], int]:
    """Each partition's bytes of the last full hour from nodes' `/message/historystats`
    answers; a partition its replicas each report counts once (the most any reports)."""
    sizes: dict[tuple[str, str], int] = {}
    for history in histories:
        for entry in history.get("node_hourly_pub_size_stats") or []:
            key = (str(entry.get("topic_name", "")), str(entry.get("topic_partition", "")))
            sizes[key] = max(sizes.get(key, 0), int(entry.get("hourly_pub_size", 0)))
    return sizes


async def statistics(
    cluster: "ClusterInfo", lookupds: list[str], nsqds: list[str], sort_by: str
) -> tuple[list[Ranked], list[str]]:
    """The top ten by `sort_by`, and the warnings of the nodes that did not answer;
    UpstreamError when none did."""
    producers, messages = await cluster.get_producers(lookupds, nsqds)
    stats, more = await cluster.get_nsqd_stats(producers, include_clients=False)
    hourly: dict[tuple[str, str], int] = {}
    if sort_by not in ("channel-timeout", "channel-requeue", "channel-delayedqueue"):
        hourly = last_hour_by_partition(await cluster.get_message_histories(producers))
    return ranking(sort_by, stats, hourly), messages + more
