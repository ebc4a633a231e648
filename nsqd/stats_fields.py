"""The topic and channel figures nsqd exports, named once for both exporters: `/metrics`
(Prometheus, `nsqd/metrics.py`) and the statsd pusher (Go nsqd's metric names,
`nsqd/statsd.py`). Each is a field of `/stats`, a counter (statsd pushes its difference since
the last push) or a gauge, in the order Go's statsd pushes them."""

from typing import NamedTuple


class StatsField(NamedTuple):
    key: str  # the `/stats` field
    counter: bool
    statsd: str | None  # Go's statsd name after `topic.<t>.` or `...channel.<c>.`; None: not pushed
    metric: str  # the Prometheus family
    help: str

    def value(self, stats: dict) -> int:
        """The figure in one topic's or channel's `/stats` (a flag as 0 or 1)."""
        return int(stats.get(self.key, 0))


TOPIC_FIELDS = (
    StatsField(
        "message_count", True, "message_count", "nsq_topic_messages_total",
        "Messages published to the topic",
    ),
    StatsField(
        "message_bytes", True, "message_bytes", "nsq_topic_message_bytes_total",
        "Bytes published to the topic",
    ),
    StatsField("depth", False, "depth", "nsq_topic_depth", "Messages queued in the topic"),
    StatsField(
        "backend_depth", False, "backend_depth", "nsq_topic_backend_depth",
        "Topic messages on disk",
    ),
    StatsField("paused", False, None, "nsq_topic_paused", "1 while the topic is paused"),
)  # fmt: skip

CHANNEL_FIELDS = (
    StatsField(
        "message_count", True, "message_count", "nsq_channel_messages_total",
        "Messages the channel received",
    ),
    StatsField("depth", False, "depth", "nsq_channel_depth", "Messages queued in the channel"),
    StatsField(
        "backend_depth", False, "backend_depth", "nsq_channel_backend_depth",
        "Channel messages on disk",
    ),
    StatsField(
        "in_flight_count", False, "in_flight_count", "nsq_channel_in_flight",
        "Messages delivered, not yet finished",
    ),
    StatsField(
        "deferred_count", False, "deferred_count", "nsq_channel_deferred",
        "Messages deferred (DPUB, REQ)",
    ),
    StatsField(
        "requeue_count", True, "requeue_count", "nsq_channel_requeues_total",
        "Messages requeued by clients",
    ),
    StatsField(
        "timeout_count", True, "timeout_count", "nsq_channel_timeouts_total",
        "In-flight messages timed out",
    ),
    StatsField(
        "client_count", False, "clients", "nsq_channel_clients",
        "Clients subscribed to the channel",
    ),
    StatsField("paused", False, None, "nsq_channel_paused", "1 while the channel is paused"),
    StatsField(
        "skipped", False, None, "nsq_channel_skipped",
        "1 while the channel drops what is published",
    ),
)  # fmt: skip
