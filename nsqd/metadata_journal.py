"""The changes to `nsqd.dat` since it was last written, one line each, so a topic or channel
made, changed or deleted costs one small write however many there are.

Go nsqd rewrites the whole of `nsqd.dat` for each topic or channel it creates: at 5,000
topics that is most of its work, and the rewrite happens after the answer, so a creation that
was answered is lost by a crash before it. Here each change is one JSON line appended to a
journal before the answer (a `write`, which a killed process cannot undo: it is in the page
cache), and `nsqd.dat` itself is rewritten whole in the background, at most a twentieth of the
time, and on exit. Go's file keeps its format and its meaning: a Go nsqd reading the data
directory after a clean exit finds every topic; after a kill -9, what `nsqd.dat` held when it
was last written.

A line is `{"put": <the topic's entry, as in nsqd.dat>}` (the topic and its channels as they
are now) or `{"delete": {"name": .., "partition": ..}}`; applying a journal sets each topic it
names to its last line, so applying one twice, or on a `nsqd.dat` written after it, gives the
same topics. Files are `nsqd.dat.journal-<generation>-<worker>`: a snapshot of `nsqd.dat`
starts a new generation first and removes the older ones once the snapshot is in place; they
are applied in generation order on start (a worker's records only ever name its own topics).
"""

import json
import logging
import os
import re
from collections.abc import Callable, Iterable

from nsqpy import disk
from nsqpy.nsqd.metadata import (
    METADATA_FILE_NAME,
    TopicMetadata,
    decode_topic,
    encode_topic,
)

JOURNAL_PREFIX = METADATA_FILE_NAME + ".journal-"
_JOURNAL_NAME = re.compile(re.escape(JOURNAL_PREFIX) + r"(\d+)-(\d+)")

TopicKey = tuple[str, int | None]


def journal_files(data_path: str) -> list[tuple[int, int, str]]:
    """(generation, worker, path) of every journal in the data path, oldest first."""
    try:
        names = os.listdir(data_path)
    except OSError:
        return []
    found = []
    for name in names:
        match = _JOURNAL_NAME.fullmatch(name)
        if match:
            generation, worker = int(match.group(1)), int(match.group(2))
            found.append((generation, worker, os.path.join(data_path, name)))
    return sorted(found)


def apply_journals(
    topics: list[TopicMetadata],
    data_path: str,
    log: logging.Logger,
    owns: Callable[[str, int], bool] | None = None,
) -> list[TopicMetadata]:
    """`topics` (nsqd.dat's) with every journal's lines applied in order (only those about
    topics `owns` says are this process's, when given). A line that cannot be read (a disk
    that filled in the middle of a write) is skipped with a warning: each line is whole."""
    current: dict[TopicKey, TopicMetadata] = {(t.name, t.partition): t for t in topics}
    for _generation, _worker, path in journal_files(data_path):
        try:
            with open(path, "rb") as file:
                lines = file.read().splitlines()
        except OSError as error:
            log.error("NSQ: failed to read metadata journal %s - %s", path, error)
            continue
        for number, line in enumerate(lines, 1):
            try:
                key, entry = _decode_line(line)
            except (ValueError, TypeError, KeyError, AttributeError) as error:
                log.warning("NSQ: skipping line %d of %s - %s", number, path, error)
                continue
            if owns is not None and not owns(key[0], key[1] or 0):
                continue
            if entry is None:
                current.pop(key, None)
                continue
            earlier = current.get(key)
            if earlier is not None:
                # A log's offsets only grow: a line written before a later nsqd.dat must not
                # take them back.
                entry.next_offset = max(entry.next_offset, earlier.next_offset)
            current[key] = entry
    return list(current.values())


def _decode_line(line: bytes) -> tuple[TopicKey, TopicMetadata | None]:
    record = json.loads(line)
    if "put" in record:
        entry = decode_topic(record["put"])
        return (entry.name, entry.partition), entry
    deleted = record["delete"]
    name, partition = deleted["name"], deleted["partition"]
    if not isinstance(name, str) or not (partition is None or isinstance(partition, int)):
        raise TypeError("a deletion names a topic by a string and a partition by a number")
    return (name, partition), None


def remove_files(paths: Iterable[str]) -> None:
    """Remove journals a written nsqd.dat now holds (blocking: run it in a thread)."""
    for path in paths:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass


class MetadataJournal:
    """This process's journal: lines appended as changes are made; `rotate` before each
    snapshot of nsqd.dat, `written` once it is in place."""

    def __init__(self, data_path: str, worker: int, *, owns_every_file: bool) -> None:
        self.data_path = data_path
        self.worker = worker
        existing = journal_files(data_path)
        # Later than any journal there (another run's, another worker's): applied after them.
        self._generation = max((generation for generation, _w, _p in existing), default=0) + 1
        # The journals the first snapshot holds and then removes: all of them for a lone nsqd
        # (it applied them all), this worker's own under --workers (the others are live).
        self._retired = [path for _g, owner, path in existing if owns_every_file or owner == worker]
        self._descriptor = -1
        self.failed = False

    @property
    def path(self) -> str:
        return os.path.join(self.data_path, f"{JOURNAL_PREFIX}{self._generation}-{self.worker}")

    def put(self, topic: TopicMetadata) -> None:
        self._append({"put": encode_topic(topic)})

    def delete(self, name: str, partition: int | None) -> None:
        self._append({"delete": {"name": name, "partition": partition}})

    def _append(self, record: dict) -> None:
        """One line, written before the change is answered; OSError when the disk refuses it
        (the journal then goes on in a new file, so a torn line stays the last of its own)."""
        line = json.dumps(record, separators=(",", ":")).encode() + b"\n"
        try:
            if self._descriptor < 0:
                self._descriptor = os.open(
                    self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600
                )
            written = disk.current().write(self._descriptor, line)
            if written != len(line):
                raise OSError(f"short write to {self.path} ({written} of {len(line)} bytes)")
        except OSError:
            self.failed = True
            self.rotate()
            raise

    def rotate(self) -> list[str]:
        """Further lines go to a new file. The journals before it, which a snapshot taken now
        holds: the caller removes them once that snapshot is written (`written`)."""
        if self._descriptor >= 0:
            os.close(self._descriptor)
            self._descriptor = -1
            self._retired.append(self.path)
        self._generation += 1
        return list(self._retired)

    def written(self, paths: list[str]) -> None:
        """A snapshot holding `paths` is in place: they are no longer this journal's."""
        done = set(paths)
        self._retired = [path for path in self._retired if path not in done]
        self.failed = False

    def close(self) -> None:
        if self._descriptor >= 0:
            os.close(self._descriptor)
            self._descriptor = -1
