"""Option parsing for the `nsq` data source.

Spark hands options over as a case-insensitive dict with lower-cased keys, so every lookup
here goes through `get`, never through a camel-cased key.
"""

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass

from nsqpy.client.blocking import http_json
from nsqpy.client.security import Security, SecurityError
from nsqpy.common.duration import parse_duration

DEFAULT_MSG_TIMEOUT = 60.0
DEFAULT_IDLE_TIMEOUT = 10.0


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


def optional_positive_int(options: Mapping[str, str], name: str) -> int | None:
    """`positive_int` for an option without a default: None when not given."""
    return None if _get(options, name) is None else positive_int(options, name, 1)


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


def topic_names(
    lookupd_http_addresses: list[str], nsqd_http_addresses: list[str], security: Security
) -> set[str]:
    """Every topic nsqlookupd knows (`/topics`), or, without nsqlookupd, every topic the nsqds
    hold (`/stats`): what `subscribePattern` is matched against."""
    names: set[str] = set()
    for lookupd in lookupd_http_addresses:
        try:
            names.update((http_json(lookupd, "/topics") or {}).get("topics") or ())
        except OSError:
            continue  # another nsqlookupd may answer
    if lookupd_http_addresses:
        return names
    for address in nsqd_http_addresses:
        try:
            stats = http_json(address, "/stats", security=security, format="json")
        except OSError:
            continue
        names.update(topic["topic_name"] for topic in (stats or {}).get("topics") or ())
    return names


def producer_addresses(producer: dict) -> tuple[str, str]:
    """(TCP address, HTTP address) of one lookupd producer record."""
    host = producer["broadcast_address"]
    return f"{host}:{producer['tcp_port']}", f"{host}:{producer['http_port']}"


def choice(options: Mapping[str, str], name: str, choices: tuple[str, ...]) -> str:
    """One of `choices` (case-insensitive), the first by default."""
    value = (_get(options, name) or choices[0]).lower()
    if value not in choices:
        raise ValueError(f'the nsq option "{name}" is one of {", ".join(choices)}, not {value!r}')
    return value


def boolean(options: Mapping[str, str], name: str, default: bool) -> bool:
    value = _get(options, name)
    if value is None:
        return default
    if value.lower() in ("true", "1", "yes"):
        return True
    if value.lower() in ("false", "0", "no"):
        return False
    raise ValueError(f'the nsq option "{name}" is true or false, not {value!r}')


# -- TLS and AUTH ------------------------------------------------------------------------------

# Option -> the go-nsq name it sets (nsqpy.client.security.Security).
SECURITY_OPTIONS = {
    "tls": "tls_v1",
    "tlsRootCaFile": "tls_root_ca_file",
    "tlsCert": "tls_cert",
    "tlsKey": "tls_key",
    "tlsInsecureSkipVerify": "tls_insecure_skip_verify",
    "tlsMinVersion": "tls_min_version",
    "authSecret": "auth_secret",
}


def security(options: Mapping[str, str]) -> Security:
    """How the connector proves itself to nsqd: TLS (`tls` true, with `tlsRootCaFile`, a
    client certificate `tlsCert` and `tlsKey`, `tlsInsecureSkipVerify`, `tlsMinVersion`) and
    `authSecret` for nsqd's AUTH and its HTTP routes (`Authorization: Bearer`). Checked on
    the driver (a file that cannot be read fails the query at once); the executors get the
    settings and build their own TLS context."""
    settings: dict[str, object] = {}
    for option, field in SECURITY_OPTIONS.items():
        if field in ("tls_v1", "tls_insecure_skip_verify"):
            settings[field] = boolean(options, option, False)
        else:
            settings[field] = _get(options, option) or ""
    try:
        return Security(**settings).check()  # type: ignore[arg-type]
    except SecurityError as error:
        raise ValueError(f"the nsq TLS options: {error}") from None


# -- which topics a query reads (the Kafka source's subscribe, subscribePattern, assign) -----

TOPIC_OPTIONS = ("topic", "subscribe", "subscribePattern", "assign")


@dataclass(frozen=True)
class TopicSelection:
    """The topics a source reads: `topic` (nsqpy's, one topic), Kafka's `subscribe` (a
    comma-separated list), `subscribePattern` (a regular expression matched against the
    whole topic name, asked again at every trigger) or `assign` (JSON of partitions per
    topic, `{"a": [0, 1]}`). Only with `topic` do offsets name partitions alone
    (`{"0": 42}`); with the other three they are Kafka's `{"<topic>": {"0": 42}}`."""

    topics: tuple[str, ...] = ()
    pattern: "re.Pattern[str] | None" = None
    # assign: the partitions of each topic read (no others, even when the topic has more).
    assigned: "Mapping[str, frozenset[int]] | None" = None
    # Offsets by topic (not with `topic`).
    by_topic: bool = True

    @property
    def single(self) -> str | None:
        """The topic when there is exactly one and it was not found by a pattern."""
        return self.topics[0] if len(self.topics) == 1 and self.pattern is None else None

    def takes(self, topic: str, partition: int) -> bool:
        return self.assigned is None or partition in self.assigned.get(topic, ())

    def describe(self) -> str:
        if self.pattern is not None:
            return f"the topics matching {self.pattern.pattern!r}"
        return ", ".join(repr(topic) for topic in self.topics)


def names_topics_as_kafka(options: Mapping[str, str]) -> bool:
    """Whether the topics come from Kafka's options rather than `topic`."""
    return any(_get(options, name) is not None for name in TOPIC_OPTIONS[1:])


def topic_selection(options: Mapping[str, str]) -> TopicSelection:
    from nsqpy.common.names import is_valid_name

    given = [name for name in TOPIC_OPTIONS if _get(options, name) is not None]
    if len(given) != 1:
        listed = ", ".join(f'"{name}"' for name in TOPIC_OPTIONS)
        found = " and ".join(f'"{name}"' for name in given) or "none"
        raise ValueError(f"the nsq source takes exactly one of the options {listed}, not {found}")
    name = given[0]
    value = str(_get(options, name))
    if name == "subscribePattern":
        try:
            return TopicSelection(pattern=re.compile(value))
        except re.error as error:
            raise ValueError(
                f'the nsq option "subscribePattern" is not a regular expression: {error}'
            ) from None
    if name == "assign":
        assigned = _assignment(value)
        return TopicSelection(topics=tuple(assigned), assigned=assigned)
    topics = tuple(dict.fromkeys(address_list(value)))
    for topic in topics:
        if not is_valid_name(topic):
            raise ValueError(f'the nsq option "{name}" names {topic!r}, not a valid topic name')
    if not topics:
        raise ValueError(f'the nsq option "{name}" names no topic')
    if name == "topic" and len(topics) > 1:
        raise ValueError('the nsq option "topic" names one topic: use "subscribe" for several')
    return TopicSelection(topics=topics, by_topic=name != "topic")


def _assignment(text: str) -> dict[str, frozenset[int]]:
    try:
        document = json.loads(text)
    except ValueError:
        document = None
    if not isinstance(document, dict) or not document:
        raise ValueError(
            f'the nsq option "assign" is JSON of partitions per topic, such as'
            f' {{"a": [0, 1]}}, not {text!r}'
        )
    assigned = {}
    for topic, partitions in document.items():
        if not isinstance(partitions, list) or not all(
            isinstance(p, int) and not isinstance(p, bool) and p >= 0 for p in partitions
        ):
            raise ValueError(
                f'the nsq option "assign" gives topic {topic!r} {partitions!r}, not a list of'
                " partition numbers"
            )
        assigned[str(topic)] = frozenset(partitions)
    return assigned


# -- positions in log topics (the Kafka source's option names) --------------------------------

EARLIEST = -2
LATEST = -1


def position_spec(
    options: Mapping[str, str], prefix: str, selection: TopicSelection, default: str
) -> tuple[str, object]:
    """How a read starts or ends (`prefix` "starting" or "ending"), as the Kafka source takes
    it:

    * `<prefix>Offsets`: "earliest", "latest", or JSON of virtual offsets per partition,
      Kafka's `{"<topic>": {"0": 1234}}` or, for one topic, `{"0": 1234, "1": -2}`; -2
      meaning earliest and -1 latest;
    * `<prefix>Timestamp`: milliseconds since the epoch, for every partition;
    * `<prefix>OffsetsByTimestamp`: JSON of milliseconds per partition, as offsets are given.

    Returns ("earliest"|"latest", None), ("offsets", {(topic, partition): offset}) or
    ("timestamps", {(topic, partition) or None for all: milliseconds})."""
    offsets = _get(options, f"{prefix}Offsets")
    timestamp = _get(options, f"{prefix}Timestamp")
    by_timestamp = _get(options, f"{prefix}OffsetsByTimestamp")
    given = [
        name
        for name, value in (
            ("Offsets", offsets),
            ("Timestamp", timestamp),
            ("OffsetsByTimestamp", by_timestamp),
        )
        if value is not None
    ]
    if len(given) > 1:
        names = " and ".join(f'"{prefix}{name}"' for name in given)
        raise ValueError(f"the nsq options {names} cannot be given together")
    if timestamp is not None:
        return "timestamps", {None: _non_negative(timestamp, f"{prefix}Timestamp")}
    if by_timestamp is not None:
        values = _per_partition(by_timestamp, f"{prefix}OffsetsByTimestamp", selection)
        return "timestamps", {
            p: _non_negative(v, f"{prefix}OffsetsByTimestamp") for p, v in values.items()
        }
    text = (offsets or default).strip()
    if text.lower() in ("earliest", "latest"):
        if prefix == "ending" and text.lower() == "earliest":
            raise ValueError('the nsq option "endingOffsets" cannot be "earliest"')
        return text.lower(), None
    values = _per_partition(text, f"{prefix}Offsets", selection)
    checked: dict[tuple[str, int], int] = {}
    for (topic, partition), value in values.items():
        number = int(value) if isinstance(value, int) and not isinstance(value, bool) else None
        if number is None or number < EARLIEST:
            raise ValueError(
                f'the nsq option "{prefix}Offsets" gives partition {partition} of {topic!r}'
                f" {value!r}: a virtual offset, -2 (earliest) or -1 (latest)"
            )
        checked[(topic, partition)] = number
    return "offsets", checked


def _per_partition(
    text: str, name: str, selection: TopicSelection
) -> dict[tuple[str, int], object]:
    try:
        document = json.loads(text)
    except ValueError:
        raise ValueError(
            f'the nsq option "{name}" is "earliest", "latest" or JSON such as'
            f' {{"<topic>": {{"0": 42}}}}, not {text!r}'
        ) from None
    if not isinstance(document, dict):
        raise ValueError(f'the nsq option "{name}" must be a JSON object, not {text!r}')
    if not document:
        return {}
    if all(isinstance(value, dict) for value in document.values()):
        by_topic = document  # Kafka's {"<topic>": {"<partition>": value}}
    elif selection.single is not None and not selection.by_topic:
        by_topic = {selection.single: document}
    else:
        raise ValueError(
            f'the nsq option "{name}" gives positions by topic, such as {{"<topic>": {{"0":'
            f" 42}}}}, when the source reads {selection.describe()}; not {text!r}"
        )
    values: dict[tuple[str, int], object] = {}
    for topic, partitions in by_topic.items():
        if selection.pattern is None and topic not in selection.topics:
            raise ValueError(
                f'the nsq option "{name}" names topic {topic!r}, which the source does not'
                f" read ({selection.describe()})"
            )
        for key, value in partitions.items():
            try:
                partition = int(key)
            except ValueError:
                raise ValueError(
                    f'the nsq option "{name}" has {key!r}, not a partition number'
                ) from None
            values[(str(topic), partition)] = value
    return values


def _non_negative(value: object, name: str) -> int:
    try:
        number = int(value)  # type: ignore[call-overload]
    except (TypeError, ValueError):
        raise ValueError(
            f'the nsq option "{name}" takes milliseconds since the epoch, not {value!r}'
        ) from None
    if number < 0:
        raise ValueError(
            f'the nsq option "{name}" takes milliseconds since the epoch, not {value!r}'
        )
    return number
