"""Option parsing for the `nsq` data source.

Spark hands options over as a case-insensitive dict with lower-cased keys, so every lookup
here goes through `get`, never through a camel-cased key.
"""

from collections.abc import Mapping

from common.client import http_json
from common.duration import parse_duration

# nsqd's default -max-rdy-count; RDY above the server's cap is E_INVALID and fatal, so the
# reader checks the IDENTIFY reply too (subscription.py).
DEFAULT_MAX_BATCH = 1000
DEFAULT_MSG_TIMEOUT = 60.0
DEFAULT_IDLE_TIMEOUT = 10.0
# /mpub bodies: comfortably below nsqd's default -max-body-size (5 MB) for small rows.
DEFAULT_PUBLISH_CHUNK = 500


def _get(options: Mapping[str, str], name: str) -> str | None:
    value = options.get(name.lower())
    return None if value is None or value == "" else str(value)


def required(options: Mapping[str, str], name: str) -> str:
    value = _get(options, name)
    if value is None:
        raise ValueError(f'the nsq data source needs the option "{name}"')
    return value


def duration_seconds(options: Mapping[str, str], name: str, default: float) -> float:
    """A Go duration ("2s", "1m30s") or a bare number of milliseconds, in seconds."""
    value = _get(options, name)
    if value is None:
        return default
    if value.replace(".", "", 1).isdigit():
        return float(value) / 1000.0
    return parse_duration(value)


def positive_int(options: Mapping[str, str], name: str, default: int) -> int:
    value = _get(options, name)
    if value is None:
        return default
    number = int(value)
    if number < 1:
        raise ValueError(f'the nsq option "{name}" must be at least 1, not {number}')
    return number


def address_list(value: str | None) -> list[str]:
    return [part.strip() for part in (value or "").split(",") if part.strip()]


def lookupd_producers(lookupd_http_addresses: list[str], topic: str | None) -> list[dict]:
    """nsqlookupd's producer records: those with `topic`, or every registered nsqd."""
    producers: dict[str, dict] = {}
    for lookupd in lookupd_http_addresses:
        if topic is None:
            document = http_json(lookupd, "/nodes")
        else:
            try:
                document = http_json(lookupd, "/lookup", topic=topic)
            except OSError:
                # 404 (topic unknown) or lookupd down: other lookupds may know it.
                continue
        for producer in (document or {}).get("producers") or []:
            key = f"{producer['broadcast_address']}:{producer['tcp_port']}"
            producers[key] = producer
    return list(producers.values())


def producer_addresses(producer: dict) -> tuple[str, str]:
    """(TCP address, HTTP address) of one lookupd producer record."""
    host = producer["broadcast_address"]
    return f"{host}:{producer['tcp_port']}", f"{host}:{producer['http_port']}"
