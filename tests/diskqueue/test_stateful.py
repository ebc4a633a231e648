"""DiskQueue against a list, under random sequences of operations (hypothesis).

Small files make the queue roll every few records, so rolls, reads across files, the reader
catching the writer at a roll, reopening and syncing in between are all exercised. The crash
rule abandons the queue without closing it and reopens a copy of the directory as a kill -9
would leave it (every put on disk, metadata as of the last sync): the records read since
that sync come again, nothing is lost, and depth is exact.
"""

import shutil
import tempfile
import threading
from pathlib import Path

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from nsqpy.diskqueue import DiskQueue, SyncJob

MIN_MSG_SIZE = 8  # the 8-digit sequence number
MAX_MSG_SIZE = 8 + 60
MAX_BYTES_PER_FILE = 150

padding = st.binary(max_size=MAX_MSG_SIZE - MIN_MSG_SIZE)


class DiskQueueMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.root = Path(tempfile.mkdtemp(prefix="dq-stateful-"))
        self.generation = 0
        self.path = self._new_dir()
        self.queue = self._open()
        self.written: list[bytes] = []  # every record ever put, in order
        self.next_index = 0  # index in written of the next record get() must return
        self.synced_index = 0  # next_index as of the metadata snapshot on disk
        self.synced_seq = 0  # which snapshot that is (the order jobs were prepared in)
        self.seq = 0
        # Prepared sync jobs not yet run, with their snapshot's seq and next_index: on a
        # trio loop, jobs lag behind the puts and gets that follow them.
        self.jobs: list[tuple[int, int, SyncJob]] = []

    def _new_dir(self) -> Path:
        self.generation += 1
        path = self.root / str(self.generation)
        path.mkdir()
        return path

    def _open(self) -> DiskQueue:
        return DiskQueue("sm", self.path, MAX_BYTES_PER_FILE, MIN_MSG_SIZE, MAX_MSG_SIZE, 7)

    def _record(self, pad: bytes) -> bytes:
        data = b"%08d" % len(self.written) + pad
        self.written.append(data)
        return data

    def _expect(self, got: bytes | None) -> None:
        if self.next_index == len(self.written):
            assert got is None
        else:
            assert got == self.written[self.next_index]
            self.next_index += 1

    @rule(pad=padding)
    def put(self, pad: bytes) -> None:
        self.queue.put(self._record(pad))

    @rule(pads=st.lists(padding, max_size=12))
    def put_many(self, pads: list[bytes]) -> None:
        self.queue.put_many([self._record(p) for p in pads])

    @rule()
    def get(self) -> None:
        self._expect(self.queue.get())

    @rule(count=st.integers(0, 15))
    def get_many(self, count: int) -> None:
        got = self.queue.get_many(count)
        expected = self.written[self.next_index : self.next_index + count]
        assert got == expected
        self.next_index += len(got)

    def _synced(self) -> None:
        """A sync that will write its metadata just happened (close, sync())."""
        self.seq += 1
        self.synced_seq = self.seq
        self.synced_index = self.next_index

    @rule()
    def sync(self) -> None:
        assert self.queue.sync()
        self._synced()

    @rule()
    def prepare_sync(self) -> None:
        self.seq += 1
        self.jobs.append((self.seq, self.next_index, self.queue.prepare_sync()))

    @rule(data=st.data())
    def run_a_prepared_sync(self, data: st.DataObject) -> None:
        if not self.jobs:
            return
        seq, index, job = self.jobs.pop(data.draw(st.integers(0, len(self.jobs) - 1)))
        assert job()
        if seq > self.synced_seq:  # an older job must not overwrite newer metadata
            self.synced_seq = seq
            self.synced_index = index

    @rule(pad=padding)
    def sync_in_thread_while_putting(self, pad: bytes) -> None:
        job = self.queue.prepare_sync()
        self._synced()
        results: list[bool] = []
        worker = threading.Thread(target=lambda: results.append(job()))
        worker.start()
        self.queue.put(self._record(pad))
        self._expect(self.queue.get())
        worker.join()
        assert results == [True]

    def _retire_jobs(self) -> None:
        """close/delete/empty make jobs still in flight harmless; run them anyway."""
        for _, _, job in self.jobs:
            job()
        self.jobs.clear()

    @rule()
    def reopen(self) -> None:
        self.queue.close()
        self._retire_jobs()
        self._synced()
        self.queue = self._open()

    @rule()
    def crash(self) -> None:
        crashed = self._new_dir()
        shutil.copytree(self.path, crashed, dirs_exist_ok=True)
        self.queue.delete()  # drop the old queue without persisting anything
        self._retire_jobs()
        self.path = crashed
        self.queue = self._open()
        # Delivery resumes exactly at the last synced read position (finished files are
        # only removed once metadata past them is on disk), and depth counts from there.
        self.next_index = self.synced_index
        assert self.queue.depth == len(self.written) - self.next_index

    @rule()
    def empty(self) -> None:
        self.queue.empty()
        self._retire_jobs()
        # The metadata is gone; without it the queue starts from the files on disk, which
        # hold only what is put from now on.
        self.next_index = len(self.written)
        self.synced_index = self.next_index

    @invariant()
    def depth_matches(self) -> None:
        assert self.queue.depth == len(self.written) - self.next_index

    @invariant()
    def no_bad_files(self) -> None:
        assert not any(p.name.endswith(".bad") for p in self.path.iterdir())

    def teardown(self) -> None:
        self.queue.close()
        shutil.rmtree(self.root, ignore_errors=True)


DiskQueueMachine.TestCase.settings = settings(
    max_examples=150, stateful_step_count=50, deadline=None
)
test_disk_queue_against_a_list = DiskQueueMachine.TestCase
