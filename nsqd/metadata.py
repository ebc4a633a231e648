"""`nsqd.dat`: which topics and channels exist and which are paused, across restarts.

Go nsqd v1.3.0 writes `{"topics":[{"name":..,"paused":..,"channels":[{"name":..,"paused":..}]}],
"version":..}` (json.Marshal of its Metadata struct, fields in that order, #ephemeral ones left
out) to a temporary file, fsyncs it and renames it over `nsqd.dat`. We read and write the same
file, so a data directory moves between Go nsqd and ours.
"""

import json
import logging
import os
import random
import re
from dataclasses import dataclass, field

from nsqpy import disk

METADATA_FILE_NAME = "nsqd.dat"


class MetadataError(Exception):
    """nsqd.dat exists but cannot be used. Go nsqd refuses to start then; we set the file
    aside and rebuild the topic list from the diskqueue files (NSQD.load_metadata)."""


@dataclass
class ChannelMetadata:
    name: str
    paused: bool = False
    # nsqpy's, written only when set (Go ignores them): the channel's own attempt limit, and
    # the dead-letter topic it uses.
    max_attempts: int | None = None
    dead_letter_topic: str = ""
    # Youzan's skip (`/channel/skip`) and delivery in order (`/channel/setorder`,
    # SUB_ORDERED) on a topic that is not ordered, written only when set.
    skipped: bool = False
    in_order: bool = False
    # Youzan's `/channel/ratelimit` (KiB/s) and `/channel/setclientlimit` (address prefix to
    # RDY cap, in the order set), written only when set.
    rate_limit_kb: int | None = None
    client_limits: dict[str, int] = field(default_factory=dict)

    def encode(self) -> dict:
        entry: dict = {"name": self.name, "paused": self.paused}
        if self.max_attempts is not None:
            entry["max_attempts"] = self.max_attempts
        if self.dead_letter_topic:
            entry["dead_letter_topic"] = self.dead_letter_topic
        if self.skipped:
            entry["skipped"] = True
        if self.in_order:
            entry["in_order"] = True
        if self.rate_limit_kb is not None:
            entry["rate_limit_kb"] = self.rate_limit_kb
        if self.client_limits:
            entry["client_limits"] = [
                {"prefix": prefix, "ready": ready} for prefix, ready in self.client_limits.items()
            ]
        return entry

    @classmethod
    def decode(cls, entry: dict) -> "ChannelMetadata":
        max_attempts = entry.get("max_attempts")
        dead_letter_topic = entry.get("dead_letter_topic") or ""
        if not isinstance(dead_letter_topic, str):
            raise TypeError("cannot unmarshal dead_letter_topic: not a string")
        rate_limit_kb = entry.get("rate_limit_kb")
        client_limits = entry.get("client_limits") or []
        if not isinstance(client_limits, list):
            raise TypeError("cannot unmarshal client_limits: not a list")
        return cls(
            _name(entry),
            bool(entry.get("paused", False)),
            None if max_attempts is None else int(max_attempts),
            dead_letter_topic,
            bool(entry.get("skipped", False)),
            bool(entry.get("in_order", False)),
            None if rate_limit_kb is None else int(rate_limit_kb),
            {str(limit["prefix"]): int(limit["ready"]) for limit in client_limits},
        )


@dataclass
class TopicMetadata:
    name: str
    paused: bool = False
    channels: list[ChannelMetadata] = field(default_factory=list)
    # Youzan partitions (docs/protocol.md §3.2). Written only for partitioned topics, after Go's
    # keys, so Go nsqd reading the file still sees its own shape (and ignores the rest).
    partition: int | None = None
    ordered: bool = False
    ext: bool = False
    next_offset: int = 0
    sync_every: int = 0  # Youzan's `syncdisk`; 0: nsqd's --sync-every


def metadata_path(data_path: str) -> str:
    return os.path.join(data_path, METADATA_FILE_NAME)


def encode_topic(topic: TopicMetadata) -> dict:
    """A topic's entry in nsqd.dat (and in a journal line, `nsqd/metadata_journal.py`)."""
    entry = {
        "name": topic.name,
        "paused": topic.paused,
        "channels": [c.encode() for c in topic.channels],
    }
    if topic.partition is not None:
        entry.update(
            partition=topic.partition,
            ordered=topic.ordered,
            ext=topic.ext,
            next_offset=topic.next_offset,
        )
        if topic.sync_every:
            entry["syncdisk"] = topic.sync_every
    return entry


def encode_metadata(topics: list[TopicMetadata], version: str) -> bytes:
    document = {"topics": [encode_topic(topic) for topic in topics], "version": version}
    return json.dumps(document, separators=(",", ":")).encode()


def decode_topic(topic: dict) -> TopicMetadata:
    """A topic's entry as `encode_topic` writes it; ValueError, TypeError, KeyError or
    AttributeError for one Go's json.Unmarshal would refuse."""
    channels = [ChannelMetadata.decode(c) for c in topic.get("channels") or []]
    entry = TopicMetadata(_name(topic), bool(topic.get("paused", False)), channels)
    partition = topic.get("partition")
    if partition is not None:
        entry.partition = int(partition)
        entry.ordered = bool(topic.get("ordered", False))
        entry.ext = bool(topic.get("ext", False))
        entry.next_offset = int(topic.get("next_offset", 0))
        entry.sync_every = int(topic.get("syncdisk", 0))
    return entry


def decode_metadata(raw: bytes, path: str) -> list[TopicMetadata]:
    """The topics in `raw`; MetadataError for anything Go's json.Unmarshal into its Metadata
    struct would refuse (not JSON, or a name that is not a string) or that has no topic list
    where one belongs."""
    try:
        document = json.loads(raw)
        if not isinstance(document, dict):
            raise TypeError(f"cannot unmarshal {type(document).__name__} into Go value")
        return [decode_topic(topic) for topic in document.get("topics") or []]
    except (ValueError, TypeError, KeyError, AttributeError) as error:
        raise MetadataError(f"failed to parse metadata in {path} - {error}") from None


def _name(entry: dict) -> str:
    name = entry["name"]
    if not isinstance(name, str):
        raise TypeError(f"cannot unmarshal {type(name).__name__} into Go struct field .name")
    return name


def read_metadata(data_path: str) -> list[TopicMetadata]:
    """The topics of `nsqd.dat`; none when the file does not exist (a fresh data path)."""
    path = metadata_path(data_path)
    try:
        with open(path, "rb") as file:
            raw = file.read()
    except FileNotFoundError:
        return []
    except OSError as error:
        raise MetadataError(f"failed to read metadata from {path} - {error}") from None
    return decode_metadata(raw, path)


def write_metadata(data_path: str, encoded: bytes) -> None:
    """Atomically replace `nsqd.dat` (temp file, fsync, rename), blocking: run it in a thread."""
    path = metadata_path(data_path)
    temporary = f"{path}.{random.getrandbits(63)}.tmp"
    try:
        # Owner-only from the moment it exists, as Go writes it (os.OpenFile(..., 0600)).
        descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            disk.write_all(descriptor, encoded)
            disk.current().fsync(descriptor)
        finally:
            os.close(descriptor)
        os.replace(temporary, path)
    except BaseException:
        # A full disk must not leave a stray temporary file behind to fill it further.
        try:
            os.unlink(temporary)
        except OSError:
            pass
        raise


def set_aside(data_path: str) -> str:
    """Move an unusable `nsqd.dat` out of the way, to `nsqd.dat.corrupt` (or
    `nsqd.dat.corrupt.<n>` when an earlier one is there); the new name. OSError if the
    rename fails."""
    path = metadata_path(data_path)
    target = f"{path}.corrupt"
    number = 0
    while os.path.lexists(target):
        number += 1
        target = f"{path}.corrupt.{number}"
    os.rename(path, target)
    return target


def scan_queue_names(data_path: str) -> list[str]:
    """The diskqueue names (`<topic>`, `<topic>#<p>`, `<topic>:<channel>`, ...) that have a
    metadata or data file in `data_path`: what nsqd.dat listed, as far as the disk knows."""
    names = set()
    try:
        entries = os.listdir(data_path)
    except OSError:
        return []
    for entry in entries:
        match = _QUEUE_FILE.fullmatch(entry)
        if match is not None:
            names.add(match.group(1))
    return sorted(names)


def topics_from_queue_names(names: list[str]) -> list[TopicMetadata]:
    """What `nsqd.dat` would have said, from queue names: `<topic>`, `<topic>#<p>` (a Youzan
    partition, nsqpy.nsqd.topic.Topic.backend_name) and either with `:<channel>`. Pause flags,
    and a partition's ordered/ext flags and offset, were only in nsqd.dat and come back off."""
    topics: dict[tuple[str, int], TopicMetadata] = {}
    for name in names:
        queue, _, channel = name.partition(":")
        topic_name, sep, number = queue.partition("#")
        if sep and not (number.isdigit() and number.isascii()):
            continue
        partition = int(number) if sep else None
        key = (topic_name, partition or 0)
        topic = topics.get(key)
        if topic is None:
            topic = topics[key] = TopicMetadata(topic_name, partition=partition)
        if channel:
            topic.channels.append(ChannelMetadata(channel))
    return [topics[key] for key in sorted(topics)]


def scan_log_names(data_path: str) -> list[str]:
    """The partitions and channels of log topics (docs/design.md §13) that have files in
    `<data_path>/<topic>/`, named as `scan_queue_names` names them: `<topic>#<p>` and
    `<topic>#<p>:<channel>`."""
    names = set()
    try:
        entries = os.listdir(data_path)
    except OSError:
        return []
    for topic in entries:
        directory = os.path.join(data_path, topic)
        if not os.path.isdir(directory):
            continue
        files = re.compile(
            re.escape(topic) + r"(?:-(\d+)\.diskqueue\.\d{6,9}\.dat|_(\d+)\.commit\.log"
            r"|-(\d+):(.+)\.diskqueue\.meta\.v2\.reader\.dat)"
        )
        try:
            listing = os.listdir(directory)
        except OSError:
            continue
        for entry in listing:
            match = files.fullmatch(entry)
            if match is None:
                continue
            segment, index, reader, channel = match.groups()
            names.add(f"{topic}#{int(segment or index or reader)}")
            if channel:
                names.add(f"{topic}#{int(reader)}:{channel}")
    return sorted(names)


# go-diskqueue's `<name>.diskqueue.meta.dat` and `<name>.diskqueue.%06d.dat`.
_QUEUE_FILE = re.compile(r"(.+)\.diskqueue\.(?:meta|\d{6,})\.dat")


def recover_metadata(
    data_path: str, error: MetadataError, log: logging.Logger
) -> list[TopicMetadata]:
    """The topic list rebuilt from the queue and log files when `nsqd.dat` cannot be read:
    the file is set aside as `nsqd.dat.corrupt` and one ERROR line says what was found."""
    try:
        moved_to = set_aside(data_path)
    except OSError as rename_error:
        moved_to = f"nowhere ({rename_error})"
    names = scan_queue_names(data_path) + scan_log_names(data_path)
    topics = topics_from_queue_names(names)
    log.error(
        "%s; moved it to %s and recovered %d topics and %d channels from the diskqueue files in %s",
        error,
        moved_to,
        len(topics),
        sum(len(topic.channels) for topic in topics),
        data_path,
    )
    return topics
