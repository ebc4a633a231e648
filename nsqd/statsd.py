"""Pushing stats to statsd over UDP, with Go nsqd's metric names (nsqd/statsd.go).

Every `--statsd-interval` the counters since the last push go out as `|c` lines and the
levels as `|g` lines, `<prefix><name>:<value>|<type>\\n`, packed into UDP packets of at most
`--statsd-udp-packet-size` bytes. The prefix's `%s` becomes the host key
(`<broadcast address>_<http port>`, dots and colons turned into underscores) and always ends
in a dot, as Go makes it.
"""

import logging
import socket
from typing import Protocol

import trio

from nsqpy.common.names import is_ephemeral
from nsqpy.nsqd.stats import StatsSource, gather, memory_stats
from nsqpy.nsqd.stats_fields import CHANNEL_FIELDS, TOPIC_FIELDS, StatsField


class StatsdSource(StatsSource, Protocol):
    """What the statsd pusher reads of nsqd (`NSQD`): the stats, its HTTP port, its log."""

    @property
    def http_port(self) -> int: ...

    @property
    def log(self) -> logging.Logger: ...


def statsd_prefix(template: str, broadcast_address: str, http_port: int) -> str:
    if not template:
        return ""
    host_key = f"{broadcast_address}:{http_port}".replace(".", "_").replace(":", "_")
    prefix = template.replace("%s", host_key)
    return prefix if prefix.endswith(".") else prefix + "."


def _field_lines(
    name: str, fields: tuple[StatsField, ...], stats: dict, last: dict
) -> list[tuple[str, int, str]]:
    """Go's lines of one topic or channel: counters as differences since `last` (its
    previous stats), gauges as they stand."""
    lines = []
    for field in fields:
        if field.statsd is None:
            continue
        value = field.value(stats)
        if field.counter:
            value -= field.value(last)
        lines.append((f"{name}.{field.statsd}", value, "c" if field.counter else "g"))
    return lines


def _latency_lines(name: str, result: dict) -> list[tuple[str, int, str]]:
    return [
        (f"{name}.e2e_processing_latency_{item['quantile'] * 100:.0f}", int(item["value"]), "g")
        for item in result["percentiles"] or []
    ]


class StatsdPusher:
    def __init__(self, nsqd: StatsdSource, memory_name: str = "mem") -> None:
        self.nsqd = nsqd
        # Go's `mem.*`; each of `--workers` reports its own process as `worker_<i>.mem.*`
        # (the topics' and channels' names are one worker's each already).
        self.memory_name = memory_name
        self._last_topics: dict[str, dict] = {}
        self._last_gc_runs = 0

    def collect(self) -> list[tuple[str, int, str]]:
        """(name, value, type) for one push, counters as differences since the last one."""
        options = self.nsqd.options
        exclude_ephemeral = options.statsd_exclude_ephemeral
        topics, _producers = gather(self.nsqd, "", "", include_clients=False)
        metrics: list[tuple[str, int, str]] = []
        seen: dict[str, dict] = {}
        for topic in topics or []:
            topic_name = topic["topic_name"]
            if exclude_ephemeral and is_ephemeral(topic_name):
                continue
            last = self._last_topics.get(topic_name, {})
            base = f"topic.{topic_name}"
            metrics += _field_lines(base, TOPIC_FIELDS, topic, last)
            metrics += _latency_lines(base, topic["e2e_processing_latency"])
            last_channels = {c["channel_name"]: c for c in last.get("channels", [])}
            for channel in topic["channels"]:
                channel_name = channel["channel_name"]
                if exclude_ephemeral and is_ephemeral(channel_name):
                    continue
                previous = last_channels.get(channel_name, {})
                name = f"{base}.channel.{channel_name}"
                metrics += _field_lines(name, CHANNEL_FIELDS, channel, previous)
                metrics += _latency_lines(name, channel["e2e_processing_latency"])
            seen[topic_name] = topic
        self._last_topics = seen
        if options.statsd_mem_stats:
            memory = memory_stats()
            for key in (
                "heap_objects",
                "heap_idle_bytes",
                "heap_in_use_bytes",
                "heap_released_bytes",
                "gc_pause_usec_100",
                "gc_pause_usec_99",
                "gc_pause_usec_95",
                "next_gc_bytes",
            ):
                metrics.append((f"{self.memory_name}.{key}", memory[key], "g"))
            runs = memory["gc_total_runs"]
            metrics.append((f"{self.memory_name}.gc_runs", runs - self._last_gc_runs, "c"))
            self._last_gc_runs = runs
        return metrics

    def packets(self, metrics: list[tuple[str, int, str]]) -> list[bytes]:
        """Lines packed into packets no larger than the UDP packet size (whole lines only)."""
        options = self.nsqd.options
        prefix = statsd_prefix(
            options.statsd_prefix, options.broadcast_address, self.nsqd.http_port
        )
        limit = options.statsd_udp_packet_size
        packets: list[bytes] = []
        current = b""
        for name, value, kind in metrics:
            line = f"{prefix}{name}:{value}|{kind}\n".encode()
            if current and len(current) + len(line) > limit:
                packets.append(current)
                current = b""
            current += line
        if current:
            packets.append(current)
        return packets

    async def run(self) -> None:
        options = self.nsqd.options
        while True:
            await trio.sleep(options.statsd_interval)
            await self.push()

    async def push(self) -> None:
        address = self.nsqd.options.statsd_address
        host, _, port = address.rpartition(":")
        log = self.nsqd.log
        try:
            sock = trio.socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            with sock:
                await sock.connect((host or "127.0.0.1", int(port)))
                log.info("STATSD: pushing stats to %s", address)
                for packet in self.packets(self.collect()):
                    await sock.send(packet)
        except (OSError, ValueError) as error:
            log.error("failed to create UDP socket to statsd(%s) - %s", address, error)
