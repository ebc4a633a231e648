"""The simulator's disk (`nsqpy/simulated_disk.py`) keeps what a real one would: through a
process's crash, everything written; through a power loss, what was fsynced; and it fills."""

import errno
import os

import pytest

from nsqpy import disk
from nsqpy.simulated_disk import SimulatedDisk


def _append(path, data: bytes) -> int:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    disk.write_all(fd, data)
    return fd


def test_a_power_loss_keeps_what_was_fsynced_and_what_was_there_at_start(tmp_path) -> None:
    (tmp_path / "old").write_bytes(b"from before")
    simulated = SimulatedDisk(tmp_path)
    simulated.start()
    with disk.using(simulated):
        old = _append(tmp_path / "old", b" and after")
        log = _append(tmp_path / "log", b"synced")
        simulated.fsync(log)
        disk.write_all(log, b" not synced")
        fresh = _append(tmp_path / "fresh", b"never synced")
        for fd in (old, log, fresh):
            os.close(fd)
    simulated.crash()
    assert simulated.lose_unsynced() == ["fresh -12", "log -11", "old -10"]
    assert (tmp_path / "old").read_bytes() == b"from before"
    assert (tmp_path / "log").read_bytes() == b"synced"
    assert (tmp_path / "fresh").read_bytes() == b""


def test_a_file_fsynced_and_renamed_over_another_is_durable_under_its_new_name(
    tmp_path,
) -> None:
    simulated = SimulatedDisk(tmp_path)
    simulated.start()
    with disk.using(simulated):
        disk.write_file(str(tmp_path / "meta.tmp"), b"new")
        os.replace(tmp_path / "meta.tmp", tmp_path / "meta")
        disk.write_file(str(tmp_path / "other.tmp"), b"unsynced", sync=False)
        os.replace(tmp_path / "other.tmp", tmp_path / "other")
    assert simulated.lose_unsynced() == ["other -8"]
    assert (tmp_path / "meta").read_bytes() == b"new"


def test_nothing_reaches_the_disk_after_a_crash(tmp_path) -> None:
    """The shutdown code a cancelled task runs cannot write what a killed process would not:
    its writes and fsyncs fail; what it wrote before stays."""
    simulated = SimulatedDisk(tmp_path)
    simulated.start()
    with disk.using(simulated):
        fd = _append(tmp_path / "log", b"written")
        simulated.crash()
        for call in (lambda: simulated.write(fd, b"late"), lambda: simulated.fsync(fd)):
            with pytest.raises(OSError) as raised:
                call()
            assert raised.value.errno == errno.EIO
        os.close(fd)
    assert (tmp_path / "log").read_bytes() == b"written"


def test_a_full_disk_refuses_writes_until_space_returns(tmp_path) -> None:
    simulated = SimulatedDisk(tmp_path)
    simulated.start()
    with disk.using(simulated):
        fd = _append(tmp_path / "log", b"before")
        simulated.full = True
        with pytest.raises(OSError) as raised:
            disk.write_all(fd, b"refused")
        assert raised.value.errno == errno.ENOSPC
        simulated.fsync(fd)
        simulated.full = False
        disk.write_all(fd, b" after")
        os.close(fd)
    assert (tmp_path / "log").read_bytes() == b"before after"
