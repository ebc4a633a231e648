"""Where a partition's files are: Youzan's names, in `<data path>/<topic>/`.

* `<topic>-<p>.diskqueue.NNNNNN.dat`: segments of records, rolled at the log's size limit;
* `<segment>.offsetmeta.dat`, written when a segment is rolled: `count\\nstart,end\\n`;
* `<topic>-<p>.diskqueue.meta.writer.dat`: `count\\nfile,pos,end\\n` and 2 magic bytes;
* `<topic>_<p>.commit.log`: the commit-log index, rolled into `.commit.log.NNNNNNNN` files,
  with `.current` naming the number of the active one;
* `<topic>-<p>.diskqueue.meta.extra.dat`: where the retained log begins once retention removed
  its first segments;
* `<topic>-<p>:<channel>.diskqueue.meta.v2.reader.dat`: a channel's cursor, and nsqpy's own
  `<topic>-<p>:<channel>.delayed.json` (its deferred messages; Youzan has no DPUB) and
  `<topic>-<p>:<channel>.acked.json` (the ranges acknowledged beyond its confirmed position);
* nsqpy's own `<topic>-<p>.delayed.sqlite`: the partition's delay queue, an index of its
  delayed records by channel and due time (`nsqd/delay_queue.py`);
* `magic<p>`: the MagicCode of the cluster topic the log was written for;
* nsqpy's own `<topic>-<p>.producers.<offset>.json`: a producer snapshot
  (`producer_snapshots.py`).
"""

import os
import re

from nsqpy import disk

META_MAGIC = b"\xae\x83"


class LogFiles:
    def __init__(self, data_path: str, topic: str, partition: int) -> None:
        self.topic = topic
        self.partition = partition
        self.name = f"{topic}-{partition}"
        self.directory = os.path.join(data_path, topic)

    def segment(self, number: int) -> str:
        width = 6 if number < 999_990 else 9
        return os.path.join(self.directory, f"{self.name}.diskqueue.{number:0{width}d}.dat")

    def segment_meta(self, number: int) -> str:
        """A rolled segment's range: `count\\nstart,end\\n`."""
        return self.segment(number) + ".offsetmeta.dat"

    def segment_numbers(self) -> list[int]:
        return self._numbers(r"\.diskqueue\.(\d{6,9})\.dat$")

    def producer_snapshot(self, offset: int) -> str:
        return os.path.join(self.directory, f"{self.name}.producers.{offset:020d}.json")

    def producer_snapshot_offsets(self) -> list[int]:
        return self._numbers(r"\.producers\.(\d{20})\.json$")

    def _numbers(self, suffix: str) -> list[int]:
        """The numbers in the names of this partition's files that end as `suffix` (a
        pattern with one group, the number), ascending."""
        pattern = re.compile(re.escape(self.name) + suffix)
        numbers = []
        for name in os.listdir(self.directory):
            match = pattern.match(name)
            if match:
                numbers.append(int(match.group(1)))
        return sorted(numbers)

    @property
    def writer_meta(self) -> str:
        return os.path.join(self.directory, f"{self.name}.diskqueue.meta.writer.dat")

    @property
    def start_meta(self) -> str:
        return os.path.join(self.directory, f"{self.name}.diskqueue.meta.extra.dat")

    @property
    def index_base(self) -> str:
        return os.path.join(self.directory, index_file_name(self.topic, self.partition))

    def index(self, number: int | None = None) -> str:
        """The active index file, or a rolled one by number."""
        base = self.index_base
        return base if number is None else f"{base}.{number:08d}"

    @property
    def index_current(self) -> str:
        return self.index_base + ".current"

    def reader_meta(self, channel: str) -> str:
        return os.path.join(self.directory, f"{self.name}:{channel}.diskqueue.meta.v2.reader.dat")

    def delays(self, channel: str) -> str:
        return os.path.join(self.directory, f"{self.name}:{channel}.delayed.json")

    def acked(self, channel: str) -> str:
        return os.path.join(self.directory, f"{self.name}:{channel}.acked.json")

    @property
    def delay_queue(self) -> str:
        return os.path.join(self.directory, f"{self.name}.delayed.sqlite")

    @property
    def magic_code(self) -> str:
        return os.path.join(self.directory, f"magic{self.partition}")

    def remove_all(self) -> None:
        """Remove every file of the partition (one already gone is no error)."""
        for path in self.all_files():
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass

    def all_files(self) -> list[str]:
        """Every file of the partition (not another partition's of the same topic)."""
        prefixes = (f"{self.name}.", f"{self.name}:", index_file_name(self.topic, self.partition))
        magic = os.path.basename(self.magic_code)
        return [
            os.path.join(self.directory, name)
            for name in os.listdir(self.directory)
            if name.startswith(prefixes) or name == magic
        ]


def index_file_name(topic: str, partition: int) -> str:
    return f"{topic}_{partition}.commit.log"


def partitions_on_disk(data_path: str, topic: str) -> list[int]:
    """The partitions of `topic` whose logs are on disk (their commit-log indexes)."""
    pattern = re.compile(re.escape(topic) + r"_(\d+)\.commit\.log$")
    try:
        names = os.listdir(os.path.join(data_path, topic))
    except OSError:
        return []
    return sorted(int(match.group(1)) for name in names if (match := pattern.match(name)))


def log_exists(data_path: str, topic: str, partition: int) -> bool:
    """Whether a partition's log is on disk (its commit-log index)."""
    return os.path.exists(os.path.join(data_path, topic, index_file_name(topic, partition)))


def write_atomically(path: str, data: bytes) -> None:
    temporary = path + ".tmp"
    disk.write_file(temporary, data)
    os.replace(temporary, path)
