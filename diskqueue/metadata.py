"""The metadata file: where reading and writing stand, and how many records are queued.

go-diskqueue writes it with ``fmt.Fprintf(f, "%d\\n%d,%d\\n%d,%d\\n", depth, readFileNum,
readPos, writeFileNum, writePos)`` to a temporary file, fsyncs it and renames it over the old
one (persistMetaData), and reads it back with the same format through ``fmt.Fscanf``
(retrieveMetaData). We do both the same way, so either implementation opens the other's
data directory.
"""

import os
import random
import re
from dataclasses import dataclass

# Fscanf's %d takes an optional sign; spaces (not newlines) may precede a number, and the
# newlines and the comma must be where the format puts them. Go treats "\r\n" as "\n".
_METADATA_PATTERN = re.compile(
    rb"[ \t]*([+-]?\d+)[ \t]*\r?\n"
    rb"[ \t]*([+-]?\d+),[ \t]*([+-]?\d+)[ \t]*\r?\n"
    rb"[ \t]*([+-]?\d+),[ \t]*([+-]?\d+)"
)


@dataclass(frozen=True, slots=True)
class Metadata:
    """One snapshot of a queue's persisted state."""

    depth: int
    read_file_num: int
    read_pos: int
    write_file_num: int
    write_pos: int

    def encode(self) -> bytes:
        """The file's exact bytes, as Go's ``"%d\\n%d,%d\\n%d,%d\\n"`` prints them."""
        return b"%d\n%d,%d\n%d,%d\n" % (
            self.depth,
            self.read_file_num,
            self.read_pos,
            self.write_file_num,
            self.write_pos,
        )

    @classmethod
    def parse(cls, raw: bytes) -> "Metadata":
        """Parse the file's bytes; ValueError if they are not what Go would write.

        Negative file numbers or positions cannot come from either implementation, so they
        are rejected here rather than sending the reader to a nonsense offset.
        """
        match = _METADATA_PATTERN.match(raw)
        if match is None:
            raise ValueError(f"unexpected metadata {raw[:64]!r}")
        depth, read_file_num, read_pos, write_file_num, write_pos = map(int, match.groups())
        if min(read_file_num, read_pos, write_file_num, write_pos) < 0:
            raise ValueError(f"negative file number or position in metadata {raw[:64]!r}")
        return cls(depth, read_file_num, read_pos, write_file_num, write_pos)


def read_metadata(path: str) -> Metadata | None:
    """The metadata at ``path``, or None when there is no such file (a new queue).

    Raises OSError if the file exists but cannot be read, ValueError if it is garbled.
    """
    try:
        with open(path, "rb") as f:
            raw = f.read(4096)
    except FileNotFoundError:
        return None
    return Metadata.parse(raw)


def write_metadata(path: str, encoded: bytes) -> None:
    """Replace the metadata file atomically: temporary file, fsync, rename.

    The temporary name is Go's ``"%s.%d.tmp" % (path, rand.Int())``: unique per write, so
    two writers never share a temporary file, and a crash leaves at worst a stray ``.tmp``
    beside an intact metadata file.
    """
    tmp_path = f"{path}.{random.getrandbits(63)}.tmp"
    fd = os.open(tmp_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        try:
            view = memoryview(encoded)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp_path, path)
    except BaseException:
        try:
            os.unlink(tmp_path)
        except OSError:
            pass
        raise
