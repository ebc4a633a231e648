"""A data path nsqd cannot use is refused at start with one line and exit status 1, as Go nsqd
refuses to start when it cannot write its metadata, instead of answering publishes it would lose."""

import contextlib
import os
import stat
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.harness import start_nsqd
from tests.nsqd.support import nsqd_process, publish


@contextlib.contextmanager
def unwritable_directory(root: Path) -> Iterator[Path]:
    """A directory nobody may write in: a read-only tmpfs for root (which ignores permission
    bits), a directory without write permission for anyone else."""
    directory = root / "read-only"
    directory.mkdir()
    if os.geteuid() != 0:
        directory.chmod(0o555)
        try:
            yield directory
        finally:
            directory.chmod(0o755)
        return
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "ro,size=64k", "tmpfs", str(directory)],
        capture_output=True,
        text=True,
    )
    assert mounted.returncode == 0, f"root could not mount a read-only tmpfs: {mounted.stderr}"
    try:
        yield directory
    finally:
        subprocess.run(["umount", str(directory)], check=True)


def refused(data_path: Path, cwd: Path) -> tuple[int, list[str]]:
    """Start nsqd on `data_path`; its exit status and log lines (it must exit by itself)."""
    daemon = nsqd_process(data_path)
    daemon.cwd = cwd
    try:
        with pytest.raises(RuntimeError, match="nsqd exited"):
            daemon.start()
    finally:
        daemon.kill()  # an nsqd that started after all must not outlive the test
    return daemon.process.returncode, daemon.lines


def test_an_unwritable_data_path_is_refused_at_start(tmp_path) -> None:
    with unwritable_directory(tmp_path) as directory:
        status, lines = refused(directory, tmp_path)
    assert status == 1
    assert lines[-1].endswith(
        f"FATAL: --data-path {directory} is not writable: Read-only file system"
        if os.geteuid() == 0
        else f"FATAL: --data-path {directory} is not writable: Permission denied"
    )
    assert not any("listening on" in line for line in lines)


def test_a_data_path_that_is_a_file_is_refused_in_words(tmp_path) -> None:
    a_file = tmp_path / "data"
    a_file.write_text("not a directory")
    status, lines = refused(a_file, tmp_path)
    assert status == 1
    assert lines[-1].endswith(f"FATAL: --data-path {a_file} is not a directory")


def test_a_data_path_below_a_file_is_refused_in_words(tmp_path) -> None:
    a_file = tmp_path / "file"
    a_file.write_text("not a directory")
    status, lines = refused(a_file / "data", tmp_path)
    assert status == 1
    assert lines[-1].endswith(
        f"FATAL: --data-path {a_file / 'data'} cannot be created: Not a directory"
    )


def test_a_missing_data_path_is_created_and_left_clean(tmp_path) -> None:
    data_path = tmp_path / "new" / "data"
    daemon = start_nsqd(tmp_path, f"-data-path={data_path}")
    try:
        assert data_path.is_dir()
    finally:
        assert daemon.stop() == 0, daemon.log
    assert sorted(path.name for path in data_path.iterdir()) == ["nsqd.dat"]


def test_nsqd_dat_and_queue_files_are_readable_by_their_owner_only(tmp_path) -> None:
    """Go writes nsqd.dat and its diskqueue files with mode 0600."""
    old_umask = os.umask(0o022)
    try:
        daemon = start_nsqd(tmp_path, "-mem-queue-size=0")
    finally:
        os.umask(old_umask)
    try:
        publish(daemon.port(), "t", [b"on disk"])
    finally:
        assert daemon.stop() == 0, daemon.log
    files = sorted(tmp_path.iterdir())
    assert "nsqd.dat" in [path.name for path in files]
    modes = {path.name: stat.S_IMODE(path.stat().st_mode) for path in files if path.is_file()}
    assert modes and set(modes.values()) == {0o600}, modes
