"""`GET /metrics`: nsqd's stats in the Prometheus text exposition format (version 0.0.4).

Go nsqd has no such endpoint (operators run a separate exporter); ours serves the same figures
as `/stats` directly. Counters end in `_total`, label values are escaped as the format says
(backslash, double quote, newline), and every family has its HELP and TYPE lines.
"""

from typing import Protocol

from nsqpy.nsqd.stats import StatsSource, gather, memory_stats
from nsqpy.nsqd.stats_fields import CHANNEL_FIELDS, TOPIC_FIELDS, StatsField


class MetricsSource(StatsSource, Protocol):
    """What `/metrics` reads of nsqd (`NSQD`): the stats, and its health."""

    @property
    def health(self) -> str: ...


CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _labels(**labels: str) -> str:
    if not labels:
        return ""
    inner = ",".join(f'{key}="{_escape(str(value))}"' for key, value in labels.items())
    return "{" + inner + "}"


class _Family:
    def __init__(self, name: str, kind: str, help_text: str) -> None:
        self.name = name
        self.kind = kind
        self.help_text = help_text
        self.samples: list[str] = []

    def add(self, value: float, **labels: str) -> None:
        self.samples.append(f"{self.name}{_labels(**labels)} {value}")

    def render(self) -> str:
        head = f"# HELP {self.name} {self.help_text}\n# TYPE {self.name} {self.kind}\n"
        return head + "".join(sample + "\n" for sample in self.samples)


def render_metrics(nsqd: MetricsSource, topics: list[dict] | None = None) -> str:
    """The Prometheus text of nsqd's topics, or of `topics` (every worker's, `--workers`)."""
    if topics is None:
        topics, _producers = gather(nsqd, "", "", include_clients=True)
    families: dict[str, _Family] = {}

    def family(name: str, kind: str, help_text: str) -> _Family:
        if name not in families:
            families[name] = _Family(name, kind, help_text)
        return families[name]

    family("nsq_up", "gauge", "1 while nsqd is healthy, 0 while a disk write fails").add(
        1 if nsqd.health == "OK" else 0
    )
    family("nsq_start_time_seconds", "gauge", "When nsqd started (unix time)").add(nsqd.start_time)
    for topic in topics or []:
        t = topic["topic_name"]
        # A partitioned topic's partitions are series of their own.
        where = {"topic": t}
        if "topic_partition" in topic:
            where["partition"] = str(topic["topic_partition"])
        _fields(family, TOPIC_FIELDS, topic, **where)
        _latency(family, "nsq_topic_e2e_processing_latency_seconds", topic, **where)
        if "log_end_offset" in topic:
            # Log topics (docs/design.md §13), per partition.
            family("nsq_log_start_offset", "gauge", "Virtual offset where the log begins").add(
                topic["log_start_offset"], **where
            )
            family("nsq_log_end_offset", "gauge", "Virtual offset where the log ends").add(
                topic["log_end_offset"], **where
            )
            family("nsq_log_messages", "gauge", "Messages written to the log since it began").add(
                topic["log_end_count"], **where
            )
        if "cluster_role" in topic:
            _replicas(family, topic, **where)
        for channel in topic["channels"]:
            c = channel["channel_name"]
            labels = {**where, "channel": c}
            if "lag" in channel:
                family(
                    "nsq_channel_confirmed_offset", "gauge", "Log offset the channel confirmed"
                ).add(channel["confirmed_offset"], **labels)
                family(
                    "nsq_channel_lag", "gauge", "Log messages the channel has not confirmed"
                ).add(channel["lag"], **labels)
                family(
                    "nsq_channel_delayed_queue", "gauge", "Messages in the partition's delay queue"
                ).add(channel["delayed_queue_count"], **labels)
            if "dead_letter_count" in channel:
                family(
                    "nsq_channel_dead_letters_total",
                    "counter",
                    "Messages past the channel's attempt limit sent to its dead-letter topic",
                ).add(channel["dead_letter_count"], **labels)
            _fields(family, CHANNEL_FIELDS, channel, **labels)
            if "rate_limit_kb" in channel:
                family(
                    "nsq_channel_rate_limit_kilobytes",
                    "gauge",
                    "KiB/s the channel delivers of bodies over 1 KiB at most (0: no limit)",
                ).add(channel["rate_limit_kb"], **labels)
                family(
                    "nsq_channel_rate_limited_total",
                    "counter",
                    "Times a consumer waited for the channel's rate limit",
                ).add(channel["rate_limited_count"], **labels)
            _latency(family, "nsq_channel_e2e_processing_latency_seconds", channel, **labels)
            for client in channel["clients"] or []:
                client_labels = {
                    **labels,
                    "client_id": client["client_id"],
                    "remote_address": client["remote_address"],
                }
                family("nsq_client_ready", "gauge", "The client's RDY count").add(
                    client["ready_count"], **client_labels
                )
                family("nsq_client_in_flight", "gauge", "Messages in flight to the client").add(
                    client["in_flight_count"], **client_labels
                )
                family("nsq_client_messages_total", "counter", "Messages sent to the client").add(
                    client["message_count"], **client_labels
                )
                family("nsq_client_finishes_total", "counter", "Messages the client finished").add(
                    client["finish_count"], **client_labels
                )
                family("nsq_client_requeues_total", "counter", "Messages the client requeued").add(
                    client["requeue_count"], **client_labels
                )
    memory = memory_stats()
    family("nsq_process_resident_memory_bytes", "gauge", "Resident memory of nsqd").add(
        memory["heap_in_use_bytes"]
    )
    family("nsq_process_gc_runs_total", "counter", "Python garbage collector runs").add(
        memory["gc_total_runs"]
    )
    return "".join(f.render() for f in families.values())


def _replicas(family, stats: dict, **labels: str) -> None:
    """A cluster partition's replicas (docs/design.md §14) as this node knows them."""
    family("nsq_partition_isr_size", "gauge", "In-sync replicas of the partition").add(
        len(stats["cluster_isr"]), **labels
    )
    family("nsq_partition_replicas", "gauge", "Replicas the partition's topic asks for").add(
        stats["cluster_replicas"], **labels
    )
    family("nsq_partition_write_epoch", "gauge", "The partition's write epoch").add(
        stats["cluster_write_epoch"], **labels
    )
    family("nsq_partition_is_leader", "gauge", "1 while this nsqd leads the partition").add(
        int(stats["cluster_role"] == "leader"), **labels
    )
    family(
        "nsq_partition_under_replicated", "gauge", "1 while the ISR is smaller than the replicas"
    ).add(int(stats["under_replicated"]), **labels)


def _fields(family, fields: tuple[StatsField, ...], stats: dict, **labels: str) -> None:
    for field in fields:
        kind = "counter" if field.counter else "gauge"
        family(field.metric, kind, field.help).add(field.value(stats), **labels)


def _latency(family, name: str, stats: dict, **labels: str) -> None:
    result = stats["e2e_processing_latency"]
    for item in result["percentiles"] or []:
        family(name, "gauge", "End-to-end processing latency (publish to FIN)").add(
            item["value"] / 1e9, quantile=str(item["quantile"]), **labels
        )
