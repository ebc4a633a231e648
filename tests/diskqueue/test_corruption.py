"""Unreadable data never reaches the caller as an exception.

go-diskqueue's handleReadError: a record with an impossible length, a record or length
prefix cut short by the end of the file (a kill -9 mid-write, a truncated disk), or a data
file that cannot be opened makes the reader rename that file ``.bad`` and carry on with the
next one. checkTailCorruption then resets depth when the reader reaches the writer.
"""

import logging
import os
import random
import struct
from pathlib import Path

import pytest

from nsqpy.diskqueue import DiskQueue

MIN_MSG_SIZE = 26
MAX_MSG_SIZE = 1024 * 1024 + MIN_MSG_SIZE
MAX_BYTES = 200  # 4 records of 46 bytes (42 + header) per file


def record(n: int) -> bytes:
    return b"%026d" % n + b"." * 16


def open_queue(path: Path) -> DiskQueue:
    return DiskQueue("t", path, MAX_BYTES, MIN_MSG_SIZE, MAX_MSG_SIZE, 1000)


def data_file(path: Path, n: int) -> Path:
    return path / f"t.diskqueue.{n:06d}.dat"


def fill_three_files(path: Path) -> None:
    """Records 0-3 in file 0, 4-7 in file 1, 8-11 in file 2 (the write file); closed."""
    q = open_queue(path)
    q.put_many([record(n) for n in range(12)])
    q.close()
    assert data_file(path, 2).exists() and not data_file(path, 3).exists()


def bad_files(path: Path) -> list[str]:
    return sorted(p.name for p in path.iterdir() if p.name.endswith(".bad"))


def drain(q: DiskQueue) -> list[bytes]:
    got = []
    while (r := q.get()) is not None:
        got.append(r)
    return got


@pytest.mark.parametrize("chop", [1, 20, 45])
def test_truncated_middle_file(tmp_path: Path, chop: int, caplog: pytest.LogCaptureFixture) -> None:
    fill_three_files(tmp_path)
    with open(data_file(tmp_path, 1), "r+b") as f:
        f.truncate(4 * 46 - chop)  # the last record of file 1 loses its tail

    caplog.set_level(logging.INFO, logger="diskqueue")
    q = open_queue(tmp_path)
    assert q.depth == 12
    got = drain(q)
    assert got == [record(n) for n in range(12) if n != 7]
    assert bad_files(tmp_path) == ["t.diskqueue.000001.dat.bad"]
    assert q.depth == 0  # reset at the tail: one record was lost
    q.put(record(99))
    assert q.get() == record(99)
    q.close()
    messages = [r.getMessage() for r in caplog.records]
    assert any("jump to next file and saving bad file as" in m for m in messages)
    assert any("positive depth at tail (1), data loss, resetting 0" in m for m in messages)


def test_truncated_write_file_after_a_kill(tmp_path: Path) -> None:
    # The metadata says writePos 138 but a crash left file 2 shorter, mid-record.
    fill_three_files(tmp_path)
    with open(data_file(tmp_path, 2), "r+b") as f:
        f.truncate(3 * 46 - 10)

    q = open_queue(tmp_path)
    # New records must not go after the damaged tail: they start a new file...
    q.put(record(50))
    q.put(record(51))
    got = drain(q)
    # ...so the reader gets every whole record, skips the torn one, and reaches them.
    assert got == [record(n) for n in range(10)] + [record(50), record(51)]
    assert bad_files(tmp_path) == ["t.diskqueue.000002.dat.bad"]
    assert q.depth == 0
    q.close()
    q = open_queue(tmp_path)
    assert q.get() is None
    q.close()


def test_torn_length_prefix_at_the_end_of_a_file(tmp_path: Path) -> None:
    fill_three_files(tmp_path)
    with open(data_file(tmp_path, 0), "ab") as f:
        f.write(b"\x00\x00")  # half a length prefix after the last record
    q = open_queue(tmp_path)
    assert drain(q) == [record(n) for n in range(12)]
    assert bad_files(tmp_path) == ["t.diskqueue.000000.dat.bad"]
    q.close()


@pytest.mark.parametrize(
    "garbage",
    [
        struct.pack(">i", 2**31 - 1) + b"x" * 100,  # absurd length
        struct.pack(">i", -1) + b"x" * 100,  # negative length
        struct.pack(">i", 3) + b"x" * 100,  # below min_msg_size
        random.Random(7).randbytes(4096),  # noise
    ],
    ids=["absurd", "negative", "too-small", "random"],
)
def test_garbage_file_is_set_aside(tmp_path: Path, garbage: bytes) -> None:
    fill_three_files(tmp_path)
    data_file(tmp_path, 1).write_bytes(garbage)
    q = open_queue(tmp_path)
    got = drain(q)
    assert got == [record(n) for n in range(12) if not 4 <= n < 8]
    assert bad_files(tmp_path) == ["t.diskqueue.000001.dat.bad"]
    assert data_file(tmp_path, 1).with_name("t.diskqueue.000001.dat.bad").read_bytes() == garbage
    assert q.depth == 0
    q.close()


def test_bad_length_in_the_middle_of_a_file_keeps_the_records_before_it(tmp_path: Path) -> None:
    fill_three_files(tmp_path)
    with open(data_file(tmp_path, 1), "r+b") as f:
        f.seek(2 * 46)
        f.write(struct.pack(">i", 10**9))
    q = open_queue(tmp_path)
    assert q.get_many(100) == [record(n) for n in range(12) if n not in (6, 7)]
    assert bad_files(tmp_path) == ["t.diskqueue.000001.dat.bad"]
    q.close()


def test_garbage_in_the_write_file_moves_the_writer_on(tmp_path: Path) -> None:
    q = open_queue(tmp_path)
    q.put(record(0))
    with open(data_file(tmp_path, 0), "r+b") as f:
        f.write(struct.pack(">i", -5))
    assert q.get() is None  # the only file was bad; nothing else to read
    assert bad_files(tmp_path) == ["t.diskqueue.000000.dat.bad"]
    q.put(record(1))  # goes to file 1, not after the garbage
    assert q.get() == record(1)
    assert data_file(tmp_path, 1).exists()
    q.close()


def test_missing_data_file(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    fill_three_files(tmp_path)
    os.remove(data_file(tmp_path, 1))
    q = open_queue(tmp_path)
    assert drain(q) == [record(n) for n in range(12) if not 4 <= n < 8]
    assert q.depth == 0
    q.close()
    assert any("reading at 0 of" in r.getMessage() for r in caplog.records)


def test_unreadable_data_file(tmp_path: Path) -> None:
    if os.geteuid() == 0:
        # root reads through permissions; a directory in the file's place fails for all.
        fill_three_files(tmp_path)
        os.remove(data_file(tmp_path, 1))
        data_file(tmp_path, 1).mkdir()
    else:
        fill_three_files(tmp_path)
        data_file(tmp_path, 1).chmod(0)
    q = open_queue(tmp_path)
    got = drain(q)
    assert got[:4] == [record(n) for n in range(4)]
    assert got[-4:] == [record(n) for n in range(8, 12)]
    q.close()


def test_garbled_metadata_falls_back_to_the_files(tmp_path: Path) -> None:
    fill_three_files(tmp_path)
    (tmp_path / "t.diskqueue.meta.dat").write_text("not metadata\n")
    q = open_queue(tmp_path)
    assert q.depth == 12
    assert drain(q) == [record(n) for n in range(12)]
    q.close()


@pytest.mark.parametrize(
    "meta",
    [
        "5\n0,100\n0,46\n",  # readPos > writePos in the same file
        "5\n3,0\n1,46\n",  # readFileNum > writeFileNum
        "-4\n0,46\n0,46\n",  # negative depth at the tail
    ],
)
def test_impossible_metadata_is_reset_at_the_tail(tmp_path: Path, meta: str) -> None:
    q = open_queue(tmp_path)
    q.put(record(0))
    q.close()
    (tmp_path / "t.diskqueue.meta.dat").write_text(meta)
    q = open_queue(tmp_path)
    assert q.depth == 0
    assert q.get() is None
    q.put(record(1))
    assert q.get() == record(1)
    q.close()
