"""A small real disk for the tests of full disks: a tmpfs mounted on a directory of the test's
(as root, which `make test` is: it installs its tools with apt-get). `fill()` writes a file of
its own until the kernel answers ENOSPC; `free()` removes it."""

import errno
import subprocess
from pathlib import Path


class Tmpfs:
    def __init__(self, mount_point: Path, size: str) -> None:
        self.mount_point = mount_point
        mount_point.mkdir(parents=True, exist_ok=True)
        result = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mount_point)],
            capture_output=True,
            text=True,
            check=False,
        )
        if result.returncode != 0:
            raise RuntimeError(
                f"cannot mount a {size} tmpfs on {mount_point} (the full-disk tests run as"
                f" root, as `make test` does): {result.stderr.strip()}"
            )
        self.filler = mount_point / ".filler"

    def fill(self) -> None:
        with open(self.filler, "ab", buffering=0) as file:
            for chunk in (b"\0" * 65536, b"\0" * 4096, b"\0"):
                try:
                    while True:
                        file.write(chunk)
                except OSError as error:
                    assert error.errno == errno.ENOSPC, error

    def free(self) -> None:
        self.filler.unlink(missing_ok=True)

    def close(self) -> None:
        subprocess.run(["umount", "-l", str(self.mount_point)], check=False)
