"""The cluster simulator's disk (`nsqpy/disk.py`): one node's data directory, with what each
file held at its last fsync, so that a crash can take back what was never made durable, and a
switch that fills it.

The files are real (on tmpfs where there is one); what the disk adds is the page cache's
view. A file's bytes are durable up to its size at its last `fsync`; a file that was there
when the node started is durable as it was. Then:

* `crash()`: the process ends. From this instant nothing more reaches the disk (a write or an
  fsync fails with EIO): the shutdown code a cancelled task still runs cannot write what a
  killed process never would. What was written before stays, as a `kill -9` keeps it.
* `lose_unsynced()`: the machine ended too (a power loss). Every file written since the node
  started is cut back to what its last fsync made durable; one never synced is left empty,
  as a file whose data the kernel had not yet allocated. Files the disk never saw written
  (the delay queue's sqlite database syncs itself) are left as they are.
* `full`: writes fail with ENOSPC, as on a full file system; fsyncs of what is written work.

Files are known by their inode, which a rename keeps (a file written, fsynced and renamed over
another is durable under its new name). What is not modelled: directory entries (a rename,
a creation, an unlink is durable at once), torn writes inside a page, and reordering between
files beyond their fsyncs.
"""

import errno
import os
from pathlib import Path


class SimulatedDisk:
    """One node's disk under `root`."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.full = False
        self.down = False
        # inode -> the bytes of the file that are durable (its size at its last fsync, or
        # when the node started).
        self._durable: dict[int, int] = {}
        # Inodes written to since the node started.
        self._written: set[int] = set()

    def start(self) -> None:
        """The node starts (again): what is on the disk now is durable."""
        self.down = False
        self._durable = {stat.st_ino: stat.st_size for _path, stat in self._files()}
        self._written = set()

    # -- what the node does (`nsqpy/disk.Disk`) --------------------------------------------

    def write(self, fd: int, data: bytes | memoryview) -> int:
        if self.down:
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        if self.full and len(data):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        self._written.add(os.fstat(fd).st_ino)
        return os.write(fd, data)

    def fsync(self, fd: int) -> None:
        if self.down:
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        stat = os.fstat(fd)
        # tmpfs has nothing to flush: what the simulation needs is the record.
        self._durable[stat.st_ino] = stat.st_size

    # -- what happens to it ----------------------------------------------------------------

    def crash(self) -> None:
        """The process ends now: nothing it does from here reaches the disk."""
        self.down = True

    def lose_unsynced(self) -> list[str]:
        """The machine lost power: what was not durable is gone. The files cut back,
        relative to the root, with the bytes each lost."""
        cut = []
        for path, stat in self._files():
            if stat.st_ino not in self._written:
                continue
            durable = min(self._durable.get(stat.st_ino, 0), stat.st_size)
            if durable < stat.st_size:
                os.truncate(path, durable)
                cut.append(f"{path.relative_to(self.root)} -{stat.st_size - durable}")
        return sorted(cut)

    def _files(self) -> list[tuple[Path, os.stat_result]]:
        found = []
        for directory, _directories, names in os.walk(self.root):
            for name in names:
                path = Path(directory, name)
                try:
                    stat = path.lstat()
                except FileNotFoundError:
                    continue
                if not path.is_symlink():
                    found.append((path, stat))
        return found
