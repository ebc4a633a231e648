"""nsqd's `/stats` as the tests read it: a topic's entry, its channels, one channel's entry."""

from typing import Any

from tests.support.http import get_json, raw_get_json


def _http_address(nsqd: Any) -> str | int:
    """An nsqd's HTTP address: `host:port`, a port, or a daemon process (its HTTP address)."""
    addresses = getattr(nsqd, "addresses", None)
    return addresses["HTTP"] if addresses is not None else nsqd


def topic_stats(nsqd: Any, topic: str) -> dict | None:
    """The topic's entry of nsqd's `/stats` (its first partition's); None when unknown."""
    stats = get_json(_http_address(nsqd), f"/stats?format=json&topic={topic}")
    for entry in stats.get("topics") or []:
        if entry["topic_name"] == topic:
            return entry
    return None


def topic_channels(nsqd: Any, topic: str) -> list[dict]:
    return (topic_stats(nsqd, topic) or {}).get("channels") or []


def channel_stats(nsqd: Any, topic: str, channel: str) -> dict | None:
    for entry in topic_channels(nsqd, topic):
        if entry["channel_name"] == channel:
            return entry
    return None


async def raw_stats(address: str | int, **params: object) -> dict:
    """`GET /stats?format=json` with these filters, from a trio test (`raw_request`)."""
    return await raw_get_json(address, "/stats", format="json", **params)
