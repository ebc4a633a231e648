"""DiskQueue unit tests: order, depth, rolling, size limits, empty/delete/close, syncing."""

import itertools
import os
import shutil
import struct
import threading
from pathlib import Path

import pytest

from nsqpy.diskqueue import DiskQueue, MessageSizeError, QueueClosedError


def open_queue(path: Path, **kwargs: object) -> DiskQueue:
    params: dict[str, object] = {
        "max_bytes_per_file": 1024,
        "min_msg_size": 1,
        "max_msg_size": 512,
        "sync_every": 100,
    }
    params.update(kwargs)
    return DiskQueue("test", path, **params)  # type: ignore[arg-type]


def data_files(path: Path, suffix: str = ".dat") -> list[str]:
    return sorted(
        p.name for p in path.iterdir() if p.name.endswith(suffix) and "meta" not in p.name
    )


def meta_text(path: Path, name: str = "test") -> str:
    return (path / f"{name}.diskqueue.meta.dat").read_text()


def test_put_get_in_order_with_depth(tmp_path: Path) -> None:
    q = open_queue(tmp_path)
    assert q.get() is None
    assert q.depth == 0
    for i in range(50):
        q.put(b"record %d" % i)
    assert q.depth == 50
    assert q.get() == b"record 0"
    assert q.get_many(3) == [b"record 1", b"record 2", b"record 3"]
    assert q.depth == 46
    rest = q.get_many(1000)
    assert rest == [b"record %d" % i for i in range(4, 50)]
    assert q.depth == 0
    assert q.get() is None
    assert q.get_many(10) == []
    q.close()


def test_interleaved_put_and_get_sees_new_records(tmp_path: Path) -> None:
    q = open_queue(tmp_path)
    q.put(b"a")
    assert q.get() == b"a"
    assert q.get() is None
    q.put(b"b")
    q.put_many([b"c", b"d"])
    assert q.get_many(10) == [b"b", b"c", b"d"]
    q.close()


def test_roll_happens_before_the_write_that_would_overflow(tmp_path: Path) -> None:
    # 20-byte records take 24 bytes on disk: four fill 96 bytes exactly; a fifth would
    # make 120 > 100, so go-diskqueue's writeOne rolls first.
    q = open_queue(tmp_path, max_bytes_per_file=100)
    for i in range(9):
        q.put(bytes([i]) * 20)
    assert data_files(tmp_path) == [
        "test.diskqueue.000000.dat",
        "test.diskqueue.000001.dat",
        "test.diskqueue.000002.dat",
    ]
    sizes = [(tmp_path / f).stat().st_size for f in data_files(tmp_path)]
    assert sizes == [96, 96, 24]
    q.close()
    assert meta_text(tmp_path) == "9\n0,0\n2,24\n"


def test_exact_fit_does_not_roll(tmp_path: Path) -> None:
    q = open_queue(tmp_path, max_bytes_per_file=96)
    for _ in range(4):
        q.put(b"x" * 20)
    assert data_files(tmp_path) == ["test.diskqueue.000000.dat"]
    q.put(b"x" * 20)
    assert len(data_files(tmp_path)) == 2
    q.close()


def test_oversized_record_gets_a_file_of_its_own(tmp_path: Path) -> None:
    # max_msg_size may exceed max_bytes_per_file: an empty file still takes the record.
    q = open_queue(tmp_path, max_bytes_per_file=64)
    q.put(b"big" * 50)
    q.put(b"small")
    q.put(b"big" * 50)
    sizes = [(tmp_path / f).stat().st_size for f in data_files(tmp_path)]
    assert sizes == [154, 9, 154]
    assert q.get_many(5) == [b"big" * 50, b"small", b"big" * 50]
    q.close()


def test_put_many_lays_out_files_exactly_like_put(tmp_path: Path) -> None:
    records = [bytes([i % 251]) * (1 + (i * 37) % 90) for i in range(300)]
    one, many = tmp_path / "one", tmp_path / "many"
    one.mkdir()
    many.mkdir()
    q1 = open_queue(one, max_bytes_per_file=500)
    for r in records:
        q1.put(r)
    q1.close()
    q2 = open_queue(many, max_bytes_per_file=500)
    q2.put_many(records[:7])
    q2.put_many(iter(records[7:250]))  # any iterable
    q2.put_many(tuple(records[250:]))
    q2.put_many([])
    q2.close()
    assert data_files(one) == data_files(many)
    for name in data_files(one):
        assert (one / name).read_bytes() == (many / name).read_bytes()
    assert meta_text(one) == meta_text(many)


def test_put_framed_lays_out_files_exactly_like_put(tmp_path: Path) -> None:
    """Records framed once (a batch many channels take) land as `put` would put them, rolls
    included, from any first record on."""
    records = [bytes([i % 251]) * (1 + (i * 37) % 90) for i in range(300)]
    framed = b"".join(struct.pack(">i", len(r)) + r for r in records)
    ends = list(itertools.accumulate(4 + len(r) for r in records))
    largest = max(map(len, records))
    one, framed_dir = tmp_path / "one", tmp_path / "framed"
    one.mkdir()
    framed_dir.mkdir()
    q1 = open_queue(one, max_bytes_per_file=500)
    for r in records[3:]:
        q1.put(r)
    q1.close()
    q2 = open_queue(framed_dir, max_bytes_per_file=500)
    q2.put_framed(framed, ends, 3, 10, largest)
    q2.put_framed(framed, ends, 10, 10, largest)  # nothing
    q2.put_framed(framed, ends, 10, 300, largest)
    q2.close()
    assert data_files(one) == data_files(framed_dir)
    for name in data_files(one):
        assert (one / name).read_bytes() == (framed_dir / name).read_bytes()
    assert meta_text(one) == meta_text(framed_dir)


def test_sizes_outside_bounds_are_refused_with_go_text(tmp_path: Path) -> None:
    q = open_queue(tmp_path, min_msg_size=4, max_msg_size=8)
    with pytest.raises(MessageSizeError) as info:
        q.put(b"abc")
    assert str(info.value) == "invalid message write size (3) minMsgSize=4 maxMsgSize=8"
    assert isinstance(info.value, ValueError)
    with pytest.raises(MessageSizeError, match=r"\(9\)"):
        q.put(b"123456789")
    q.put(b"1234")
    q.put(b"12345678")
    # put_many checks every size before writing anything.
    with pytest.raises(MessageSizeError, match=r"\(2\)"):
        q.put_many([b"good", b"go", b"goodgood"])
    assert q.depth == 2
    assert q.get_many(10) == [b"1234", b"12345678"]
    q.close()


def test_empty_deletes_files_and_moves_to_next_file_number(tmp_path: Path) -> None:
    q = open_queue(tmp_path, max_bytes_per_file=100)
    for _ in range(10):
        q.put(b"x" * 20)
    q.sync()
    assert data_files(tmp_path)
    q.empty()
    assert q.depth == 0
    assert data_files(tmp_path) == []
    assert not (tmp_path / "test.diskqueue.meta.dat").exists()
    assert q.get() is None
    q.put(b"after")
    assert data_files(tmp_path) == ["test.diskqueue.000003.dat"]
    q.close()
    assert meta_text(tmp_path) == "1\n3,0\n3,9\n"
    q = open_queue(tmp_path)
    assert q.get_many(10) == [b"after"]
    q.close()


def test_delete_closes_without_persisting(tmp_path: Path) -> None:
    # go-diskqueue Delete only closes; nsqd calls Empty first to remove the files.
    q = open_queue(tmp_path)
    q.put(b"kept on disk")
    q.delete()
    assert data_files(tmp_path) == ["test.diskqueue.000000.dat"]
    assert not (tmp_path / "test.diskqueue.meta.dat").exists()
    with pytest.raises(QueueClosedError):
        q.put(b"x")
    with pytest.raises(QueueClosedError):
        q.get()
    q.delete()
    q.close()


def test_empty_then_delete_leaves_nothing(tmp_path: Path) -> None:
    q = open_queue(tmp_path, max_bytes_per_file=100)
    for _ in range(10):
        q.put(b"y" * 20)
    q.sync()
    q.empty()
    q.delete()
    assert list(tmp_path.iterdir()) == []


def test_close_and_reopen_keeps_unread_records(tmp_path: Path) -> None:
    q = open_queue(tmp_path, max_bytes_per_file=200)
    q.put_many([b"r%03d" % i for i in range(100)])
    assert q.get_many(42) == [b"r%03d" % i for i in range(42)]
    q.close()
    assert meta_text(tmp_path) == "58\n1,136\n3,200\n"
    with pytest.raises(QueueClosedError):
        q.put(b"closed")
    q.close()  # idempotent

    with open_queue(tmp_path, max_bytes_per_file=200) as q:
        assert q.depth == 58
        assert q.get_many(8) == [b"r%03d" % i for i in range(42, 50)]
        q.put(b"new")
    with open_queue(tmp_path, max_bytes_per_file=200) as q:
        assert q.depth == 51
        assert q.get_many(100) == [b"r%03d" % i for i in range(50, 100)] + [b"new"]
        assert q.depth == 0


def test_finished_files_are_deleted_by_the_sync_after_the_reader_leaves_them(
    tmp_path: Path,
) -> None:
    q = open_queue(tmp_path, max_bytes_per_file=100)
    for i in range(12):
        q.put(bytes([i]) * 20)
    q.sync()
    assert len(data_files(tmp_path)) == 3
    q.get_many(4)
    # Leaving a file makes a sync due (go-diskqueue syncs on every new read file); the file
    # goes once metadata that no longer points into it is on disk.
    assert q.sync_due
    assert len(data_files(tmp_path)) == 3
    q.sync()
    assert meta_text(tmp_path) == "8\n1,0\n2,96\n"
    assert data_files(tmp_path) == ["test.diskqueue.000001.dat", "test.diskqueue.000002.dat"]
    q.get_many(8)
    q.close()
    assert data_files(tmp_path) == ["test.diskqueue.000002.dat"]


def test_a_finished_file_outlives_metadata_that_points_into_it(tmp_path: Path) -> None:
    q = open_queue(tmp_path, max_bytes_per_file=100)
    q.put_many([b"x" * 20] * 6)  # four records in file 0, two in file 1
    early_job = q.prepare_sync()  # its snapshot has the reader in file 0
    assert len(q.get_many(5)) == 5  # the reader leaves file 0
    assert early_job()
    assert meta_text(tmp_path) == "6\n0,0\n1,48\n"
    # A crash now restarts the reader in file 0, so file 0 must still be there.
    assert (tmp_path / "test.diskqueue.000000.dat").exists()
    q.sync()
    assert meta_text(tmp_path) == "1\n1,24\n1,48\n"
    assert not (tmp_path / "test.diskqueue.000000.dat").exists()
    q.close()


def test_reader_caught_up_at_a_roll_leaves_no_bad_file(tmp_path: Path) -> None:
    # go-diskqueue issue #42: a reader that has read all of the current write file when the
    # writer rolls gets EOF on its next read and renames a good file to .bad.
    q = open_queue(tmp_path, max_bytes_per_file=100)
    for round_ in range(10):
        q.put(bytes([round_]) * 40)
        assert q.get() == bytes([round_]) * 40
        if q.sync_due:
            q.sync()
    assert data_files(tmp_path, ".bad") == []
    assert len(data_files(tmp_path)) == 1
    # The metadata has the reader on the new file at once, so a Go nsqd opening this
    # directory does not hit #42 either.
    q.put(b"z" * 40)
    q.put(b"z" * 40)
    assert q.get_many(2) == [b"z" * 40] * 2
    q.put(b"z" * 40)  # rolls to file 6 with the reader at the end of file 5
    q.sync()
    assert meta_text(tmp_path) == "1\n6,0\n6,44\n"
    q.close()
    with open_queue(tmp_path, max_bytes_per_file=100) as q:
        assert q.get_many(5) == [b"z" * 40]
    assert data_files(tmp_path, ".bad") == []


def test_sync_due_after_sync_every_ops_and_on_roll(tmp_path: Path) -> None:
    q = open_queue(tmp_path, sync_every=3, max_bytes_per_file=100)
    assert not q.sync_due and not q.dirty
    q.put(b"a" * 20)
    assert q.dirty and not q.sync_due
    q.put(b"b" * 20)
    assert q.get() == b"a" * 20  # reads count too, as in go-diskqueue's ioLoop
    assert q.sync_due
    assert q.prepare_sync()()
    assert not q.sync_due and not q.dirty
    assert meta_text(tmp_path) == "1\n0,24\n0,48\n"
    q.put(b"c" * 20)
    q.put(b"d" * 20)  # 96 bytes: fits
    assert not q.sync_due
    q.put(b"e" * 20)  # rolls: go-diskqueue syncs on every roll
    assert q.sync_due
    q.sync()
    assert meta_text(tmp_path) == "4\n0,24\n1,24\n"
    q.close()


def test_auto_sync_writes_metadata_without_being_asked(tmp_path: Path) -> None:
    q = open_queue(tmp_path, sync_every=5, auto_sync=True)
    for _ in range(4):
        q.put(b"x")
    assert not (tmp_path / "test.diskqueue.meta.dat").exists()
    q.put(b"x")
    assert meta_text(tmp_path) == "5\n0,0\n0,25\n"
    q.get_many(5)
    assert meta_text(tmp_path) == "0\n0,25\n0,25\n"
    q.delete()


def test_sync_job_in_a_thread_while_writing_and_reading(tmp_path: Path) -> None:
    q = open_queue(tmp_path, max_bytes_per_file=4096, sync_every=50)
    jobs_ok: list[bool] = []
    threads: list[threading.Thread] = []
    written = 0
    read: list[bytes] = []
    for i in range(3000):
        q.put(b"%06d" % i)
        written += 1
        if i % 3 == 0:
            read.extend(q.get_many(2))
        if q.sync_due:
            job = q.prepare_sync()
            t = threading.Thread(target=lambda job=job: jobs_ok.append(job()))
            t.start()
            threads.append(t)
    for t in threads:
        t.join()
    assert jobs_ok and all(jobs_ok)
    q.close()
    with open_queue(tmp_path, max_bytes_per_file=4096) as q:
        read.extend(q.get_many(10_000))
    assert read == [b"%06d" % i for i in range(3000)]


def test_an_older_sync_job_cannot_move_metadata_backwards(tmp_path: Path) -> None:
    q = open_queue(tmp_path)
    q.put(b"one")
    old_job = q.prepare_sync()
    q.put(b"two")
    new_job = q.prepare_sync()
    assert new_job()
    assert old_job()
    assert meta_text(tmp_path) == "2\n0,0\n0,14\n"
    q.close()


def test_empty_retires_sync_jobs_in_flight(tmp_path: Path) -> None:
    q = open_queue(tmp_path)
    q.put(b"one")
    stale_job = q.prepare_sync()
    q.empty()
    stale_job()
    assert not (tmp_path / "test.diskqueue.meta.dat").exists()
    q.close()
    assert meta_text(tmp_path) == "0\n1,0\n1,0\n"


def test_unsynced_state_after_kill_is_recovered(tmp_path: Path) -> None:
    # A kill -9 leaves the data files as written (every put is an os.write) and the
    # metadata as of the last sync. Copying the directory before closing is that state.
    live, crashed = tmp_path / "live", tmp_path / "crashed"
    live.mkdir()
    q = open_queue(live, max_bytes_per_file=100, sync_every=10_000)
    q.put_many([b"%02d" % i + b"-" * 18 for i in range(6)])
    assert q.get() is not None
    q.sync()  # metadata: 5 queued, read at 0:24, write at 1:48
    q.put_many([b"%02d" % i + b"-" * 18 for i in range(6, 20)])  # rolls to files 2..4
    assert q.get_many(5) == [b"%02d" % i + b"-" * 18 for i in range(1, 6)]
    shutil.copytree(live, crashed)
    q.close()

    with open_queue(crashed, max_bytes_per_file=100) as q:
        # Records read after the last sync come again (at-least-once); nothing is lost.
        assert q.depth == 19
        got = q.get_many(100)
        assert got == [b"%02d" % i + b"-" * 18 for i in range(1, 20)]
        assert q.depth == 0
        assert data_files(crashed, ".bad") == []
        q.put(b"later")
        assert q.get() == b"later"


def test_missing_metadata_reads_the_files_that_are_there(tmp_path: Path) -> None:
    # Killed before the first sync, or after empty() removed the metadata: go-diskqueue
    # would start over at file 0; we read what is on disk.
    q = open_queue(tmp_path, max_bytes_per_file=100)
    q.put(b"before")
    q.sync()
    q.empty()
    q.put_many([b"%02d" % i + b"." * 18 for i in range(10)])
    q.delete()  # like a kill: nothing persisted
    assert not (tmp_path / "test.diskqueue.meta.dat").exists()
    with open_queue(tmp_path, max_bytes_per_file=100) as q:
        assert q.depth == 10
        assert q.get_many(100) == [b"%02d" % i + b"." * 18 for i in range(10)]
        q.put(b"next")
    with open_queue(tmp_path, max_bytes_per_file=100) as q:
        assert q.get_many(100) == [b"next"]


def test_records_larger_than_a_read_chunk(tmp_path: Path) -> None:
    big = os.urandom(3 * 1024 * 1024)
    q = DiskQueue("big", tmp_path, 8 * 1024 * 1024, 1, 4 * 1024 * 1024, 100)
    q.put(b"small")
    q.put(big)
    q.put(b"tail")
    assert q.get_many(2) == [b"small", big]
    q.close()
    q = DiskQueue("big", tmp_path, 8 * 1024 * 1024, 1, 4 * 1024 * 1024, 100)
    assert q.get() == b"tail"
    q.close()


def test_records_are_length_prefixed_big_endian(tmp_path: Path) -> None:
    q = open_queue(tmp_path)
    q.put(b"hello")
    q.put(bytearray(b"bytes-like"))
    q.put(memoryview(b"view"))
    q.close()
    raw = (tmp_path / "test.diskqueue.000000.dat").read_bytes()
    assert raw == (
        struct.pack(">i", 5)
        + b"hello"
        + struct.pack(">i", 10)
        + b"bytes-like"
        + struct.pack(">i", 4)
        + b"view"
    )


def test_bad_constructor_arguments(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        DiskQueue("x", tmp_path, 0, 1, 10, 1)
    with pytest.raises(ValueError):
        DiskQueue("x", tmp_path, 100, 10, 1, 1)
    with pytest.raises(ValueError):
        DiskQueue("x", tmp_path, 100, 1, 2**31, 1)
