"""Byte compatibility with go-diskqueue, both ways.

The directories here are built by hand from the format description (nsqio/go-diskqueue,
diskqueue.go), never by DiskQueue: data files ``<name>.diskqueue.%06d.dat`` holding
``[4-byte big-endian int32 size][data]`` records, and ``<name>.diskqueue.meta.dat`` holding
``"%d\\n%d,%d\\n%d,%d\\n"`` (depth, readFileNum, readPos, writeFileNum, writePos). And our
files are read back by a reader written here from the same description.
"""

import os
import re
import struct
from pathlib import Path

from nsqpy.diskqueue import DiskQueue

# nsqd's bounds: minValidMsgLength = MsgIDLength(16) + 8 + 2; max = --max-msg-size + that.
MIN_MSG_SIZE = 26
MAX_MSG_SIZE = 1024 * 1024 + MIN_MSG_SIZE
# nsqd names a channel's queue "<topic>:<channel>".
NAME = "orders:archive"


def wire_message(n: int, body_size: int = 40) -> bytes:
    """A record as nsqd stores it: [8 timestamp][2 attempts][16 hex id][body]."""
    return (
        struct.pack(">qH", 1_700_000_000_000_000_000 + n, 1)
        + b"%016x" % n
        + bytes([n % 256]) * body_size
    )


def go_file(path: Path, file_num: int, records: list[bytes]) -> int:
    raw = b"".join(struct.pack(">i", len(r)) + r for r in records)
    (path / f"{NAME}.diskqueue.{file_num:06d}.dat").write_bytes(raw)
    return len(raw)


def go_meta(path: Path, depth: int, read: tuple[int, int], write: tuple[int, int]) -> None:
    text = f"{depth}\n{read[0]},{read[1]}\n{write[0]},{write[1]}\n"
    (path / f"{NAME}.diskqueue.meta.dat").write_bytes(text.encode())


def open_queue(path: Path, max_bytes_per_file: int = 1000) -> DiskQueue:
    return DiskQueue(NAME, path, max_bytes_per_file, MIN_MSG_SIZE, MAX_MSG_SIZE, 2500, 2.0)


def test_reads_a_go_directory_with_several_files_and_a_partial_read_position(
    tmp_path: Path,
) -> None:
    # Files 7..9, as a Go nsqd that had already consumed files 0..6 would leave them.
    file7 = [wire_message(n) for n in range(0, 10)]
    file8 = [wire_message(n) for n in range(10, 20)]
    file9 = [wire_message(n) for n in range(20, 24)]
    go_file(tmp_path, 7, file7)
    go_file(tmp_path, 8, file8)
    write_pos = go_file(tmp_path, 9, file9)
    consumed = 3
    read_pos = sum(4 + len(r) for r in file7[:consumed])
    go_meta(tmp_path, 24 - consumed, (7, read_pos), (9, write_pos))

    q = open_queue(tmp_path)
    assert q.depth == 21
    assert q.get() == wire_message(3)
    assert q.get_many(100) == [wire_message(n) for n in range(4, 24)]
    assert q.depth == 0
    assert q.get() is None
    q.close()
    assert (tmp_path / f"{NAME}.diskqueue.meta.dat").read_text() == (
        f"0\n9,{write_pos}\n9,{write_pos}\n"
    )
    assert sorted(os.listdir(tmp_path)) == [
        f"{NAME}.diskqueue.000009.dat",
        f"{NAME}.diskqueue.meta.dat",
    ]


def test_appends_to_a_go_write_file_where_go_would(tmp_path: Path) -> None:
    records = [wire_message(n) for n in range(5)]
    write_pos = go_file(tmp_path, 2, records)
    go_meta(tmp_path, 5, (2, 0), (2, write_pos))

    q = open_queue(tmp_path, max_bytes_per_file=10_000)
    q.put(wire_message(5))
    q.close()
    raw = (tmp_path / f"{NAME}.diskqueue.000002.dat").read_bytes()
    assert raw == b"".join(struct.pack(">i", len(r)) + r for r in records + [wire_message(5)])
    meta = (tmp_path / f"{NAME}.diskqueue.meta.dat").read_text()
    assert meta == f"6\n2,0\n2,{len(raw)}\n"


def test_go_reader_left_at_the_end_of_a_finished_file(tmp_path: Path) -> None:
    # go-diskqueue issue #42 leaves readPos at the end of a file the writer has left.
    # Go's next read would hit EOF and rename the file .bad; we just move on.
    size = go_file(tmp_path, 0, [wire_message(n) for n in range(3)])
    write_pos = go_file(tmp_path, 1, [wire_message(3)])
    go_meta(tmp_path, 1, (0, size), (1, write_pos))
    q = open_queue(tmp_path)
    assert q.get_many(10) == [wire_message(3)]
    q.close()
    assert not any(name.endswith(".bad") for name in os.listdir(tmp_path))


def test_metadata_is_parsed_like_fscanf(tmp_path: Path) -> None:
    write_pos = go_file(tmp_path, 0, [wire_message(0), wire_message(1)])
    # No trailing newline, and a CRLF: Fscanf accepts both.
    text = f"2\r\n0,0\n0,{write_pos}"
    (tmp_path / f"{NAME}.diskqueue.meta.dat").write_text(text)
    q = open_queue(tmp_path)
    assert q.depth == 2
    assert q.get_many(5) == [wire_message(0), wire_message(1)]
    q.close()


def read_like_go(path: Path, name: str) -> tuple[list[bytes], str]:
    """An independent reader: every record in every data file, in file-number order."""
    pattern = re.compile(re.escape(name) + r"\.diskqueue\.(\d{6,})\.dat")
    numbered = sorted(
        (int(m.group(1)), m.group(0)) for m in map(pattern.fullmatch, os.listdir(path)) if m
    )
    records = []
    for _, file_name in numbered:
        raw = (path / file_name).read_bytes()
        pos = 0
        while pos < len(raw):
            (size,) = struct.unpack(">i", raw[pos : pos + 4])
            assert 0 <= size <= len(raw) - pos - 4, f"bad record at {pos} of {file_name}"
            records.append(raw[pos + 4 : pos + 4 + size])
            pos += 4 + size
    meta = (path / f"{name}.diskqueue.meta.dat").read_text()
    return records, meta


def test_our_files_parse_with_an_independent_reader(tmp_path: Path) -> None:
    max_bytes = 600
    records = [wire_message(n, body_size=(n * 53) % 300) for n in range(200)]
    q = open_queue(tmp_path, max_bytes_per_file=max_bytes)
    q.put_many(records[:120])
    for r in records[120:]:
        q.put(r)
    q.close()

    found, meta = read_like_go(tmp_path, NAME)
    assert found == records

    # The metadata text is Go's "%d\n%d,%d\n%d,%d\n" and agrees with the files.
    m = re.fullmatch(r"(\d+)\n(\d+),(\d+)\n(\d+),(\d+)\n", meta)
    assert m is not None
    depth, read_num, read_pos, write_num, write_pos = map(int, m.groups())
    assert (depth, read_num, read_pos) == (200, 0, 0)
    files = sorted(
        p for p in tmp_path.iterdir() if p.name.endswith(".dat") and "meta" not in p.name
    )
    assert files[-1].name == f"{NAME}.diskqueue.{write_num:06d}.dat"
    assert write_pos == files[-1].stat().st_size

    # Rolling follows go-diskqueue's writeOne: a file is left only when the next record
    # would take it past max_bytes_per_file, and never overflows unless it holds one record.
    position = 0
    file_index = 0
    sizes = [f.stat().st_size for f in files]
    for r in records:
        total = 4 + len(r)
        if position > 0 and position + total > max_bytes:
            assert sizes[file_index] == position
            file_index += 1
            position = 0
        position += total
    assert file_index == len(files) - 1 and sizes[-1] == position


def test_metadata_after_a_partial_read_is_go_text(tmp_path: Path) -> None:
    q = open_queue(tmp_path, max_bytes_per_file=200)
    q.put_many([wire_message(n) for n in range(10)])  # 70 bytes each on disk: 2 per file
    assert q.get_many(3) == [wire_message(n) for n in range(3)]
    q.close()
    assert (tmp_path / f"{NAME}.diskqueue.meta.dat").read_bytes() == b"7\n1,70\n4,140\n"
    # And the leftover files hold exactly the unread records, in order.
    found, _ = read_like_go(tmp_path, NAME)
    assert found == [wire_message(n) for n in range(2, 10)]
