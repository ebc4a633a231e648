"""nsqd's statistics in Go nsqd v1.3.0's shapes: the `/stats` JSON (keys in Go's struct order)
and the text report, plus the memory figures of this Python process under Go's key names.
"""

import datetime
import gc
import os
import sys
import time
from typing import TYPE_CHECKING, Protocol

import trio

from nsqpy.common.duration import format_duration
from nsqpy.common.version import version_line
from nsqpy.nsqd import dead_letters
from nsqpy.nsqd.client import DEFAULT_LIMITED_READY
from nsqpy.nsqd.cursor_queue import CursorQueue
from nsqpy.nsqd.e2e import merged_result

if TYPE_CHECKING:
    from nsqpy.nsqd.channel import Channel
    from nsqpy.nsqd.client import Client
    from nsqpy.nsqd.options import Options
    from nsqpy.nsqd.topic import Topic


class StatsSource(Protocol):
    """What the stats read of nsqd (`NSQD`): its options, start, clients and partitions."""

    @property
    def options(self) -> "Options": ...

    @property
    def start_time(self) -> int: ...

    @property
    def start_time_precise(self) -> float: ...

    @property
    def clients(self) -> dict[int, "Client"]: ...

    def all_partitions(self) -> list["Topic"]: ...


# -- memory ----------------------------------------------------------------------------------


class GCPauses:
    """Durations of the last collections, via gc.callbacks, for Go's gc_pause_usec_* keys."""

    KEEP = 256  # Go's runtime.MemStats.PauseNs holds the last 256 pauses

    def __init__(self) -> None:
        self.pauses_usec: list[int] = []
        self._started = 0.0

    def install(self) -> None:
        if self._callback not in gc.callbacks:
            gc.callbacks.append(self._callback)

    def _callback(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._started = time.perf_counter()
        else:
            self.pauses_usec.append(int((time.perf_counter() - self._started) * 1e6))
            if len(self.pauses_usec) > self.KEEP:
                del self.pauses_usec[: -self.KEEP]

    def percentile(self, fraction: float) -> int:
        if not self.pauses_usec:
            return 0
        ordered = sorted(self.pauses_usec)
        index = min(len(ordered) - 1, max(0, int(len(ordered) * fraction + 0.5) - 1))
        return ordered[index]


gc_pauses = GCPauses()


def _resident_bytes() -> int:
    try:
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def memory_stats() -> dict:
    """Go's memStats keys, filled from what Python can tell honestly: allocated blocks for
    heap objects, resident memory for heap in use, collector runs and pause percentiles.
    Go-only figures with no Python counterpart (idle, released, next GC) are 0."""
    return {
        "heap_objects": sys.getallocatedblocks(),
        "heap_idle_bytes": 0,
        "heap_in_use_bytes": _resident_bytes(),
        "heap_released_bytes": 0,
        "gc_pause_usec_100": gc_pauses.percentile(1.0),
        "gc_pause_usec_99": gc_pauses.percentile(0.99),
        "gc_pause_usec_95": gc_pauses.percentile(0.95),
        "next_gc_bytes": 0,
        "gc_total_runs": sum(generation["collections"] for generation in gc.get_stats()),
    }


# -- topics, channels, clients ---------------------------------------------------------------


def client_stats(client: "Client", topic_filter: str = "") -> dict:
    stats = {
        "client_id": client.client_id,
        "hostname": client.hostname,
        "version": "V2",
        "remote_address": client.remote_address,
        "state": client.state,
        "ready_count": client.ready_count,
        "in_flight_count": client.in_flight_count,
        "message_count": client.message_count,
        "finish_count": client.finish_count,
        "requeue_count": client.requeue_count,
        "connect_ts": int(client.connect_time),
        "sample_rate": client.sample_rate,
        "deflate": client.deflate,
        "snappy": client.snappy,
        "user_agent": client.user_agent,
    }
    channel = client.channel
    if client.limited_ready != DEFAULT_LIMITED_READY or (
        channel is not None and channel.topic.partitioned
    ):
        stats["limited_rdy"] = client.limited_ready  # Youzan's
    # omitempty fields, as Go's struct tags
    if client.auth_state is not None:
        stats["authed"] = True
        identity = getattr(client.auth_state, "identity", "")
        identity_url = getattr(client.auth_state, "identity_url", "")
        if identity:
            stats["auth_identity"] = identity
        if identity_url:
            stats["auth_identity_url"] = identity_url
    pub_counts = [
        {"topic": topic, "count": count}
        for topic, count in sorted(client.pub_counts.items())
        if not topic_filter or topic == topic_filter
    ]
    if pub_counts:
        stats["pub_counts"] = pub_counts
    stats.update(client.tls_stats())
    return stats


def channel_stats(channel: "Channel", include_clients: bool, now: float) -> dict:
    # Read straight from the channel's parts (its properties would add calls, and /stats at
    # thousands of topics makes this tens of thousands of times).
    members = channel.clients
    clients = [client_stats(c) for c in members.values()] if include_clients else None
    queue = channel.queue
    depth = queue.depth
    if channel.tags is not None:
        depth += channel.tags.count
    e2e = channel.e2e
    stats = {
        "channel_name": channel.name,
        "depth": depth,
        "backend_depth": queue.backend_depth,
        "in_flight_count": len(channel.in_flight),
        "deferred_count": len(channel.deferred),
        "message_count": channel.message_count,
        "requeue_count": channel.requeue_count,
        "timeout_count": channel.timeout_count,
        "client_count": len(members),
        "clients": clients,
        "paused": channel.paused,
        # Without a stream (no percentiles asked for), Go's zero quantile.Result.
        "e2e_processing_latency": (
            {"count": 0, "percentiles": None} if e2e is None else channel.e2e_result(now)
        ),
    }
    if channel.topic.partitioned:
        # Youzan's: when the oldest message the channel has not confirmed was published.
        stats["depth_ts"] = go_time_text(channel.queue.oldest_unconfirmed_ns())
        stats["skipped"] = channel.skipped
        stats["backlogs"] = _backlogs(channel)
    rate_limit = channel.rate_limit
    if rate_limit is not None or channel.topic.partitioned:
        # nsqpy's view of Youzan's rate limit: KiB/s (0: none), and how often it held back.
        stats["rate_limit_kb"] = 0 if rate_limit is None else rate_limit.kilobytes
        stats["rate_limited_count"] = 0 if rate_limit is None else rate_limit.limited_count
    # A log topic's channel is a cursor (docs/design.md §13): where it stands in the log.
    stats.update(channel.queue.position_stats())
    limit = dead_letters.attempt_limit(channel)
    if limit or channel.dead_letter_topic:
        # Poison messages (nsqpy's): only on a channel with an attempt limit or dead letters,
        # so that a Go channel's stats keep Go's keys.
        stats["max_attempts"] = limit
        stats["dead_letter_topic"] = channel.dead_letter_topic  # "" until the first one
        stats["dead_letter_count"] = channel.dead_letter_count
        stats["dead_letter_waiting"] = dead_letters.waiting(channel)
    return stats


def _backlogs(channel: "Channel") -> int:
    """Youzan's backlogs: what the channel has not read yet and what it defers in memory;
    an ordered channel's depth."""
    queue = channel.queue
    if channel.ordered or not isinstance(queue, CursorQueue):
        return channel.depth
    unread = queue.log.end.count - queue.read_position.count
    return len(channel.deferred) + max(unread, 0)


def channel_debug_text(channel: "Channel") -> str:
    """Youzan's GetChannelDebugStats, for `/message/stats`: what the channel holds in flight,
    deferred and delayed, and (a log topic's channel) where it stands in the log, with the
    ranges acknowledged beyond its confirmed position."""
    text = (
        f"topic {channel.topic_name} channel {channel.name} \n"
        f"inflight {len(channel.in_flight)}, deferred: {len(channel.deferred)}, "
        f"depth: {channel.depth}\n"
    )
    queue = channel.queue
    if isinstance(queue, CursorQueue):
        end, confirmed, ranges = queue.log.end, queue.confirmed, queue.acknowledged_ranges()
        text += (
            f"channel end : {end.offset}:{end.count},"
            f"current read:{queue.read_position.offset}, "
            f"current confirm {confirmed.offset}:{confirmed.count}, "
            f"confirmed {len(ranges)} messages: {ranges}\n"
            f"delayed: {queue.delayed_count}\n"
        )
    return text + "\n"


def topic_stats(topic: "Topic", channels: list[dict], now: float) -> dict:
    streams = [c.e2e for c in topic.channels.values() if c.e2e is not None]
    # Go merges the channels' streams; a topic without one reports no stream at all.
    percentiles = topic.nsqd.options.e2e_processing_latency_percentile if streams else []
    stats = {
        "topic_name": topic.name,
        "channels": channels,
        "depth": topic.depth,
        "backend_depth": topic.backend_depth,
        "message_count": topic.message_count,
        "message_bytes": topic.message_bytes,
        "paused": topic.paused,
        "e2e_processing_latency": merged_result(percentiles, streams, now),
    }
    if topic.partitioned:
        # Youzan's /stats names each partition (docs/protocol.md §6.2).
        stats["topic_partition"] = topic.partition
        stats["topic_full_name"] = topic.full_name
        stats["is_leader"] = not topic.replication.is_follower
        stats["is_multi_ordered"] = topic.ordered
        stats["is_ext"] = topic.ext
        # Youzan's: publishes refused because the disk refused their write.
        stats["pub_failed_cnt"] = topic.nsqd.storage.refused_publishes[topic.name, topic.partition]
    # A log topic's retained range, and a cluster partition's replicas.
    stats.update(topic.queue.position_stats())
    stats.update(topic.replication.stats())
    return stats


def gather(
    nsqd: StatsSource,
    topic_name: str,
    channel_name: str,
    include_clients: bool,
    *,
    leader_only: bool = False,
    partition: str = "",
):
    """Go's NSQD.GetStats: (topics, producers); topics None when the named topic is unknown.
    Youzan's filters: `leader_only` (`leaderOnly`) keeps the partitions this node writes,
    `partition` (its number as text) that partition."""
    now = trio.current_time()
    if topic_name:
        topics = [t for t in nsqd.all_partitions() if t.name == topic_name]
        if not topics:
            # Go's GetStats returns before it looks at producers at all.
            return None, None
    else:
        topics = nsqd.all_partitions()
    if leader_only:
        topics = [topic for topic in topics if not topic.replication.is_follower]
    if partition:
        topics = [topic for topic in topics if str(topic.partition) == partition]
    topic_list = []
    for topic in topics:
        if channel_name:
            channel = topic.channels.get(channel_name)
            if channel is None:
                continue
            channels = [channel]
        else:
            channels = [topic.channels[name] for name in sorted(topic.channels)]
        channel_list = [channel_stats(c, include_clients, now) for c in channels]
        topic_list.append(topic_stats(topic, channel_list, now))
    producers = None
    if include_clients:
        producers = [
            client_stats(c, topic_name) for c in nsqd.clients.values() if c.pub_counts
        ] or None
    return topic_list, producers


# -- the text report -------------------------------------------------------------------------


def _human_ns(value: float) -> str:
    """Go's quantile.NanoSecondToHuman."""
    if value > 1_000_000_000:
        return f"{value / 1_000_000_000:0.1f}s"
    if value > 1_000_000:
        return f"{value / 1_000_000:0.1f}ms"
    if value > 1000:
        return f"{value / 1000:0.1f}us"
    return f"{value:0.1f}ns"


def _e2e_text(result: dict) -> str:
    return ", ".join(_human_ns(p["value"]) for p in result["percentiles"] or [])


def _client_line(stats: dict) -> str:
    connected = format_duration(max(0, int(time.time()) - stats["connect_ts"]))
    port = stats["remote_address"].rsplit(":", 1)[-1]
    ident = f"{stats['hostname']}:{port} {stats['user_agent']}"
    if stats.get("pub_counts"):
        total = sum(p["count"] for p in stats["pub_counts"])
        topics = ",".join(f"{p['topic']}={p['count']}" for p in stats["pub_counts"])
        return (
            f"[{stats['version']} {ident:<21}] msgs: {total:<8} topics: {topics}"
            f" connected: {connected}"
        )
    return (
        f"[{stats['version']} {ident:<21}] state: {stats['state']}"
        f" inflt: {stats['in_flight_count']:<4} rdy: {stats['ready_count']:<4}"
        f" fin: {stats['finish_count']:<8} re-q: {stats['requeue_count']:<8}"
        f" msgs: {stats['message_count']:<8} connected: {connected}"
    )


def _replica_line(topic: dict) -> str:
    """A cluster partition's replicas, under its topic line (Go's report has no such line:
    topics outside a cluster keep Go's bytes)."""
    line = (
        f"      partition: {topic.get('topic_partition', '-')} role: {topic['cluster_role']}"
        f" leader: {topic['cluster_leader'] or '-'}"
        f" isr: {','.join(topic['cluster_isr']) or '-'}"
        f" catchup: {','.join(topic['cluster_catchup']) or '-'}"
        f" write-epoch: {topic['cluster_write_epoch']}"
        f" writable: {str(topic['cluster_writable']).lower()}"
        f" replicas: {len(topic['cluster_isr'])}/{topic['cluster_replicas']}"
    )
    if topic["under_replicated"]:
        line += " UNDER-REPLICATED"
    return line + "\n"


def go_time_text(ns: int) -> str:
    """A time as Go's `time.Time.String` writes it in the local zone:
    `2006-01-02 15:04:05.999999999 -0700 MST` (fraction without trailing zeros)."""
    seconds, fraction = divmod(ns, 1_000_000_000)
    moment = datetime.datetime.fromtimestamp(seconds).astimezone()
    text = moment.strftime("%Y-%m-%d %H:%M:%S")
    if fraction:
        text += f".{fraction:09d}".rstrip("0")
    return text + moment.strftime(" %z %Z")


def _rfc3339(seconds: int) -> str:
    moment = datetime.datetime.fromtimestamp(seconds).astimezone()
    text = moment.isoformat(timespec="seconds")
    return text[:-6] + "Z" if moment.utcoffset() == datetime.timedelta(0) else text


def text_report(nsqd: StatsSource, topics, producers, memory, health: str) -> str:
    """Go's httpServer.printStats, line for line."""
    uptime = time.time() - nsqd.start_time_precise
    lines = [
        version_line("nsqd"),
        f"start_time {_rfc3339(nsqd.start_time)}",
        f"uptime {format_duration(uptime)}",
        "",
        f"Health: {health}",
    ]
    if memory is not None:
        lines += ["", "Memory:"]
        lines += [f"   {key:<25}\t{value}" for key, value in memory.items()]
    out = "\n".join(lines) + "\n"
    if not topics:
        out += "\nTopics: None\n"
    else:
        out += "\nTopics:"
    for topic in topics or []:
        prefix = "*P " if topic["paused"] else "   "
        out += (
            f"\n{prefix}[{topic['topic_name']:<15}] depth: {topic['depth']:<5}"
            f" be-depth: {topic['backend_depth']:<5} msgs: {topic['message_count']:<8}"
            f" e2e%: {_e2e_text(topic['e2e_processing_latency'])}\n"
        )
        if "cluster_role" in topic:
            out += _replica_line(topic)
        for channel in topic["channels"]:
            prefix = "   *P " if channel["paused"] else "      "
            out += (
                f"{prefix}[{channel['channel_name']:<25}] depth: {channel['depth']:<5}"
                f" be-depth: {channel['backend_depth']:<5}"
                f" inflt: {channel['in_flight_count']:<4} def: {channel['deferred_count']:<4}"
                f" re-q: {channel['requeue_count']:<5} timeout: {channel['timeout_count']:<5}"
                f" msgs: {channel['message_count']:<8}"
                f" e2e%: {_e2e_text(channel['e2e_processing_latency'])}\n"
            )
            for client in channel["clients"] or []:
                out += f"        {_client_line(client)}\n"
    if not producers:
        out += "\nProducers: None\n"
    else:
        out += "\nProducers:\n"
        for producer in producers:
            out += f"   {_client_line(producer)}\n"
    return out
