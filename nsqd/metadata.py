"""`nsqd.dat`: which topics and channels exist and which are paused, across restarts.

Go nsqd v1.3.0 writes `{"topics":[{"name":..,"paused":..,"channels":[{"name":..,"paused":..}]}],
"version":..}` (json.Marshal of its Metadata struct, fields in that order, #ephemeral ones left
out) to a temporary file, fsyncs it and renames it over `nsqd.dat`. We read and write the same
file, so a data directory moves between Go nsqd and ours.
"""

import json
import os
import random
from dataclasses import dataclass, field

METADATA_FILE_NAME = "nsqd.dat"


class MetadataError(Exception):
    """nsqd.dat exists but cannot be used; Go nsqd refuses to start then."""


@dataclass
class ChannelMetadata:
    name: str
    paused: bool = False


@dataclass
class TopicMetadata:
    name: str
    paused: bool = False
    channels: list[ChannelMetadata] = field(default_factory=list)
    # Youzan partitions (SPEC.md §3.2). Written only for partitioned topics, after Go's keys,
    # so Go nsqd reading the file still sees its own shape (and ignores the rest).
    partition: int | None = None
    ordered: bool = False
    ext: bool = False
    next_offset: int = 0


def metadata_path(data_path: str) -> str:
    return os.path.join(data_path, METADATA_FILE_NAME)


def encode_metadata(topics: list[TopicMetadata], version: str) -> bytes:
    entries = []
    for topic in topics:
        entry = {
            "name": topic.name,
            "paused": topic.paused,
            "channels": [{"name": c.name, "paused": c.paused} for c in topic.channels],
        }
        if topic.partition is not None:
            entry.update(
                partition=topic.partition,
                ordered=topic.ordered,
                ext=topic.ext,
                next_offset=topic.next_offset,
            )
        entries.append(entry)
    document = {"topics": entries, "version": version}
    return json.dumps(document, separators=(",", ":")).encode()


def decode_metadata(raw: bytes, path: str) -> list[TopicMetadata]:
    try:
        document = json.loads(raw)
        topics = []
        for topic in document.get("topics") or []:
            channels = [
                ChannelMetadata(str(c["name"]), bool(c.get("paused", False)))
                for c in topic.get("channels") or []
            ]
            topics.append(
                TopicMetadata(str(topic["name"]), bool(topic.get("paused", False)), channels)
            )
        return topics
    except (ValueError, TypeError, KeyError, AttributeError) as error:
        raise MetadataError(f"failed to parse metadata in {path} - {error}") from None


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
    with open(temporary, "wb") as file:
        file.write(encoded)
        file.flush()
        os.fsync(file.fileno())
    os.replace(temporary, path)
