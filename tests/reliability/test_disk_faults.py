"""A full disk: nsqd says so, refuses what it cannot store, loses nothing, and recovers.

Issue #10. nsqd runs as a real process with `--mem-queue-size=0 --sync-every=1`, so every
message goes to a diskqueue file before its `OK`. Its data directory is on a disk that fills
up and frees again. That disk is, in order of preference:

* a real 2 MiB tmpfs (`mount -t tmpfs`, possible as root), filled with a file of our own
  until the kernel answers ENOSPC, and freed by deleting that file;
* otherwise (no permission to mount) the same nsqd started through a small wrapper that
  makes `os.write` on regular files fail with ENOSPC while a flag file exists: a fault
  injected at the OS boundary, nsqd itself untouched.

Both disks go through the same scenario and the same assertions; the second one also runs
on its own (`injected`) so that path is proven wherever the first one can mount.

While the disk is full: PUB, MPUB and DPUB answer Go's `E_*_FAILED <CMD> failed write
<file>: no space left on device` (fatal, as in Go), HTTP /pub and /mpub answer 500
`{"message":"INTERNAL_ERROR"}`, `/ping` answers 500 `NOK - <the same error>`, and messages
nsqd already holds (here: delivered, then requeued with REQ) stay in memory instead of being
dropped. Once space returns, the next write succeeds, `/ping` is `OK` again, and after a
clean restart every acknowledged message is delivered, and nothing that was never
published.
"""

import contextlib
import json
import os
import re
import time
from pathlib import Path

import pytest

from nsqpy.common.command import (
    encode_dpub,
    encode_fin,
    encode_mpub,
    encode_pub,
    encode_rdy,
    encode_sub,
)
from nsqpy.common.frame import FRAME_TYPE_ERROR
from tests.harness import DaemonProcess, V2Connection
from tests.reliability.support import http, receive_all
from tests.support.polling import poll
from tests.support.tmpfs import Tmpfs

# A record: 4-byte size + 26-byte message header + the body.
BODY_SIZE = 200

# nsqd with `os.write` failing on regular files while the flag file (argv[1]) exists.
_INJECTING_NSQD = """
import errno, os, stat, sys
flag = sys.argv.pop(1)
real_write = os.write
def write(fd, data):
    if os.path.exists(flag) and stat.S_ISREG(os.fstat(fd).st_mode):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    return real_write(fd, data)
os.write = write
from nsqpy.nsqd.__main__ import main
main(sys.argv[1:])
"""

_WRITE_FAILED = re.compile(r"write (/\S+\.diskqueue\.\d{6}\.dat): no space left on device")


# -- the two disks ----------------------------------------------------------------------------


class TmpfsDisk(Tmpfs):
    """A real, 2 MiB tmpfs (tests/support/tmpfs.py)."""

    kind = "tmpfs"

    def __init__(self, mount_point: Path) -> None:
        super().__init__(mount_point, "2m")
        self.data_path = mount_point / "data"
        self.data_path.mkdir()

    @classmethod
    def mount(cls, root: Path) -> "TmpfsDisk | None":
        if os.geteuid() != 0:
            return None
        try:
            return cls(root / "tmpfs")
        except RuntimeError:
            return None

    def daemon(self, args: list[str]) -> DaemonProcess:
        return DaemonProcess("nsqd", args, cwd=self.data_path)


class InjectedDisk:
    """The test's own directory; ENOSPC comes from the wrapper while `flag` exists."""

    kind = "injected"

    def __init__(self, root: Path) -> None:
        self.data_path = root / "data"
        self.data_path.mkdir()
        self.flag = root / "disk-is-full"

    def daemon(self, args: list[str]) -> DaemonProcess:
        args = ["-c", _INJECTING_NSQD, str(self.flag), *args]
        return DaemonProcess("python", args, cwd=self.data_path)

    def fill(self) -> None:
        self.flag.touch()

    def free(self) -> None:
        self.flag.unlink()

    def close(self) -> None:
        pass


@contextlib.contextmanager
def full_disk(root: Path, kind: str):
    disk = TmpfsDisk.mount(root) if kind == "tmpfs-else-injected" else None
    if disk is None:
        disk = InjectedDisk(root)
    try:
        yield disk
    finally:
        disk.close()


# -- clients ----------------------------------------------------------------------------------


def command_reply(port: int, data: bytes) -> tuple[bool, bytes]:
    """(ok, the response or error text) for one command on a fresh connection."""
    connection = V2Connection(port)
    try:
        connection.send(data)
        frame = connection.read_response()
        if frame.frame_type == FRAME_TYPE_ERROR:
            # Go's E_*_FAILED is fatal: nsqd closes the connection after the error.
            assert connection.is_closed_by_peer(), "nsqd kept the connection open"
            return False, frame.data
        return True, frame.data
    finally:
        connection.close()


def body(topic: str, n: int) -> bytes:
    return (b"%s %06d " % (topic.encode(), n)).ljust(BODY_SIZE, b".")


def start(disk, args: list[str]) -> DaemonProcess:
    return disk.daemon(args).start(wait_for=("TCP", "HTTP"))


# -- the scenario -----------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["tmpfs-else-injected", "injected"])
def test_full_disk_refuses_publishes_keeps_everything_and_recovers(tmp_path, kind):
    with full_disk(tmp_path, kind) as disk:
        args = [
            "-tcp-address=127.0.0.1:0",
            "-http-address=127.0.0.1:0",
            f"-data-path={disk.data_path}",
            "-mem-queue-size=0",
            "-sync-every=1",
        ]
        daemon = start(disk, args)
        try:
            run_scenario(disk, daemon, args)
        finally:
            daemon.kill()
        assert "Traceback" not in daemon.log, daemon.log


def run_scenario(disk, daemon: DaemonProcess, args: list[str]) -> None:
    tcp, http_port = daemon.port(), daemon.port("HTTP")
    # "t" has a channel: publishes go to the channel's queue; "u" has none: to its own.
    acked: dict[str, set[bytes]] = {"t": set(), "u": set()}
    tried: dict[str, set[bytes]] = {"t": set(), "u": set()}
    counter = iter(range(1_000_000))

    def pub(topic: str, defer_ms: int | None = None) -> tuple[bool, bytes]:
        data = body(topic, next(counter))
        tried[topic].add(data)
        if defer_ms is None:
            ok, reply = command_reply(tcp, encode_pub(topic, data))
        else:
            ok, reply = command_reply(tcp, encode_dpub(topic, defer_ms, data))
        if ok:
            acked[topic].add(data)
        return ok, reply

    def until_refused(topic: str, defer_ms: int | None = None) -> bytes:
        """A real disk may still take a few records into the last page of a queue's file;
        those were acknowledged and count as stored. The refusal's text."""
        for _ in range(100):
            ok, reply = pub(topic, defer_ms)
            if not ok:
                return reply
        raise AssertionError(f"the full disk never refused a publish to {topic}")

    assert http(http_port, "POST", "/topic/create?topic=t")[0] == 200
    assert http(http_port, "POST", "/channel/create?topic=t&channel=c")[0] == 200
    for _ in range(50):
        assert pub("t") == (True, b"OK")
    assert pub("u") == (True, b"OK")
    assert http(http_port, "GET", "/ping") == (200, b"OK")

    disk.fill()
    reply = until_refused("t")
    match = _WRITE_FAILED.fullmatch(reply.removeprefix(b"E_PUB_FAILED PUB failed ").decode())
    assert reply.startswith(b"E_PUB_FAILED PUB failed ") and match, reply
    assert "/t:c.diskqueue." in match.group(1), match.group(1)
    # /ping names the very error the publisher got.
    status, text = http(http_port, "GET", "/ping")
    assert (status, text) == (500, b"NOK - " + match.group(0).encode())

    batch = [body("t", next(counter)) for _ in range(5)]
    tried["t"].update(batch)
    ok, reply = command_reply(tcp, encode_mpub("t", batch))
    assert not ok and reply.startswith(b"E_MPUB_FAILED MPUB failed write "), reply
    assert reply.endswith(b": no space left on device"), reply
    reply = until_refused("u", defer_ms=1)
    assert reply.startswith(b"E_DPUB_FAILED DPUB failed write "), reply
    assert b"/u.diskqueue." in reply and reply.endswith(b": no space left on device"), reply
    over_http = body("t", next(counter))
    tried["t"].add(over_http)
    assert http(http_port, "POST", "/pub?topic=t", over_http) == (
        500,
        b'{"message":"INTERNAL_ERROR"}',
    )
    lines = [body("t", next(counter)) for _ in range(3)]
    tried["t"].update(lines)
    assert http(http_port, "POST", "/mpub?topic=t", b"\n".join(lines)) == (
        500,
        b'{"message":"INTERNAL_ERROR"}',
    )

    # Stored messages come out of the full disk, and a REQ puts them back where nsqd can
    # (memory): nothing is dropped and nsqd keeps running.
    consumer = V2Connection(tcp)
    consumer.send(encode_sub("t", "c"))
    assert consumer.read_response().data == b"OK"
    consumer.send(encode_rdy(10))
    for message in consumer.read_messages(10):
        consumer.send(b"REQ " + message.id + b" 0\n")
    redelivered = consumer.read_messages(10)
    assert all(m.attempts == 2 for m in redelivered), redelivered
    consumer.close()
    assert daemon.process.poll() is None
    assert http(http_port, "GET", "/ping")[0] == 500

    disk.free()
    # Space is back: the next write succeeds and health turns OK.
    assert pub("t") == (True, b"OK")
    assert pub("u") == (True, b"OK")
    deadline = time.monotonic() + 10
    while http(http_port, "GET", "/ping") != (200, b"OK"):
        assert time.monotonic() < deadline, http(http_port, "GET", "/ping")
        time.sleep(0.01)
    batch = [body("t", next(counter)) for _ in range(5)]
    tried["t"].update(batch)
    assert command_reply(tcp, encode_mpub("t", batch)) == (True, b"OK")
    acked["t"].update(batch)
    over_http = body("t", next(counter))
    tried["t"].add(over_http)
    assert http(http_port, "POST", "/pub?topic=t", over_http) == (200, b"OK")
    acked["t"].add(over_http)

    # A clean restart: everything acknowledged is on disk and delivered.
    assert daemon.stop() == 0, daemon.log
    assert "Traceback" not in daemon.log, daemon.log
    strays = [p.name for p in disk.data_path.iterdir() if p.name.endswith(".tmp")]
    assert strays == [], "a failed metadata write left its temporary file"
    restarted = start(disk, args)
    try:
        tcp = restarted.port()
        for topic, channel in (("t", "c"), ("u", "c")):
            receive_all(tcp, topic, channel, acked[topic], tried[topic])
        assert http(restarted.port("HTTP"), "GET", "/ping") == (200, b"OK")
        topics = json.loads(http(restarted.port("HTTP"), "GET", "/stats?format=json")[1])
        assert {t["topic_name"] for t in topics["topics"]} == {"t", "u"}
    finally:
        restarted.stop()


def small_disk_nsqd(tmp_path: Path, *flags: str) -> tuple[Tmpfs, Path, list[str]]:
    """A real 2 MiB tmpfs, the data directory on it, and the arguments of an nsqd keeping its
    data there with `flags`."""
    disk = Tmpfs(tmp_path / "disk", "2m")
    data_path = disk.mount_point / "data"
    data_path.mkdir()
    addresses = ["-tcp-address=127.0.0.1:0", "-http-address=127.0.0.1:0"]
    return disk, data_path, [*addresses, f"-data-path={data_path}", *flags]


def test_a_log_topic_on_a_full_disk_stops_nothing_and_recovers(tmp_path):
    """A single node's log topic (`--log-topic`) on a disk that fills while a consumer
    finishes messages: publishes are refused with the error, `/ping` says NOK, the channel's
    cursor cannot be written (its sync fails, again and again), retention cannot write the
    log's new start, and nsqd keeps running (`/serverstats` counts the refused publishes);
    once space returns everything works again, and
    after a clean restart every acknowledged message not finished is delivered."""
    disk, data_path, args = small_disk_nsqd(
        tmp_path,
        "-log-topic=lt",
        "-sync-every=1",
        "-sync-timeout=50ms",
        "-max-bytes-per-file=65536",
    )
    daemon = DaemonProcess("nsqd", args, cwd=data_path).start(wait_for=("TCP", "HTTP"))
    try:
        tcp, http_port = daemon.port(), daemon.port("HTTP")
        assert http(http_port, "POST", "/topic/create?topic=lt")[0] == 200
        assert http(http_port, "POST", "/channel/create?topic=lt&channel=c")[0] == 200
        acked = {body("lt", n) for n in range(200)}
        tried = {body("lt", n) for n in range(300)} | {b"after"}
        for data in sorted(acked):
            assert command_reply(tcp, encode_pub("lt", data)) == (True, b"OK")
        consumer = V2Connection(tcp)
        consumer.send(encode_sub("lt", "c"))
        assert consumer.read_response().data == b"OK"
        consumer.send(encode_rdy(10))
        disk.fill()
        refused = 0
        for n in range(200, 300):
            ok, reply = command_reply(tcp, encode_pub("lt", body("lt", n)))
            if ok:
                acked.add(body("lt", n))  # a last page the disk still had
            else:
                refused += 1
                assert reply.startswith(b"E_PUB_FAILED PUB failed write "), reply
        assert refused > 0
        # Youzan's /serverstats counts them.
        status, text = http(http_port, "GET", "/serverstats")
        assert status == 200 and json.loads(text)["server_pub_failed"] == refused, text
        # The consumer finishes what it gets: the cursor moves, and its file cannot be written.
        finished = set()
        for _ in range(10):
            (message,) = consumer.read_messages(1)
            finished.add(message.body)
            consumer.send(b"FIN " + message.id + b"\n")
        poll(lambda: "failed to write its cursor" in daemon.log, "a cursor sync refused")
        assert http(http_port, "POST", "/topic/greedyclean?topic=lt")[0] in (200, 500)
        status, text = http(http_port, "GET", "/ping")
        assert status == 500 and text.startswith(b"NOK - "), text
        assert daemon.process.poll() is None
        consumer.close()
        disk.free()
        assert command_reply(tcp, encode_pub("lt", b"after")) == (True, b"OK")
        acked.add(b"after")
        poll(lambda: http(http_port, "GET", "/ping") == (200, b"OK"), "/ping OK again")
        assert daemon.stop() == 0
        daemon = DaemonProcess("nsqd", args, cwd=data_path).start(wait_for=("TCP", "HTTP"))
        receive_all(daemon.port(), "lt", "c", acked - finished, tried)
        assert "Traceback" not in daemon.log
    finally:
        daemon.kill()
        disk.close()


def youzan_reply(port: int, data: bytes) -> tuple[bool, bytes]:
    """(ok, the response or error text) for one of Youzan's commands (a publish naming its
    partition) on a fresh connection."""
    connection = V2Connection(port)
    try:
        connection.send(data)
        frame = connection.read_response()
        return frame.frame_type != FRAME_TYPE_ERROR, frame.data
    finally:
        connection.close()


def test_youzan_consumers_of_aged_partitions_on_two_workers_ride_out_a_full_disk(tmp_path):
    """A log topic of 4 partitions on an nsqd of two workers (each owns two), each partition
    aged first (retention removed what a channel had passed). Youzan consumers, one a
    partition (`SUB lt c p`, binary IDs), finish messages ten FINs at a time (read by nsqd as a
    run) while the disk fills: every partition's publishes are refused with the error, the
    cursors cannot be written, and no worker exits. Once space returns every partition takes
    publishes again; after a clean restart each partition delivers every acknowledged message
    it had not finished."""
    partitions = range(4)
    disk, data_path, args = small_disk_nsqd(
        tmp_path, "-workers=2", "-sync-every=1", "-sync-timeout=50ms", "-max-bytes-per-file=16384"
    )
    daemon = DaemonProcess("nsqd", args, cwd=data_path).start(wait_for=("TCP", "HTTP"))
    consumers: list[V2Connection] = []
    try:
        tcp, http_port = daemon.port(), daemon.port("HTTP")
        assert http(http_port, "POST", "/topic/create?topic=lt&partition_num=4")[0] == 200
        tried: dict[int, set[bytes]] = {}
        for partition in partitions:
            aged = [body(f"aged{partition}", n) for n in range(150)]
            for at in range(0, len(aged), 50):
                reply = youzan_reply(tcp, encode_mpub("lt", aged[at : at + 50], partition))
                assert reply == (True, b"OK"), reply
            where = f"topic=lt&channel=old&partition={partition}"
            assert http(http_port, "POST", f"/channel/create?{where}")[0] == 200
            assert http(http_port, "POST", f"/channel/setoffset?{where}", b"special:-1")[0] == 200
            clean = f"/topic/greedyclean?topic=lt&partition={partition}"
            assert http(http_port, "POST", clean)[0] == 200
            tried[partition] = set(aged)
        offsets = json.loads(http(http_port, "GET", "/partition/offsets?topic=lt")[1])
        starts = {entry["partition"]: entry["start"]["count"] for entry in offsets["partitions"]}
        assert sorted(starts) == list(partitions) and all(starts.values()), starts
        assert http(http_port, "POST", "/channel/create?topic=lt&channel=c")[0] == 200

        acked: dict[int, set[bytes]] = {}
        for partition in partitions:
            bodies = [body(f"lt{partition}", n) for n in range(60)]
            for data in bodies:
                assert youzan_reply(tcp, encode_pub("lt", data, partition)) == (True, b"OK")
            acked[partition] = set(bodies)
            tried[partition] |= set(bodies)
        for partition in partitions:
            consumer = V2Connection(tcp)
            consumer.send(encode_sub("lt", "c", partition))
            assert consumer.read_response().data == b"OK"
            consumer.send(encode_rdy(10))
            consumers.append(consumer)

        disk.fill()
        for partition in partitions:
            refused = 0
            for n in range(60, 90):
                data = body(f"lt{partition}", n)
                tried[partition].add(data)
                ok, reply = youzan_reply(tcp, encode_pub("lt", data, partition))
                if ok:
                    acked[partition].add(data)  # a last page the disk still had
                else:
                    refused += 1
                    # Not fatal for a Youzan client (nsqd keeps its connection).
                    assert reply.startswith(b"E_PUB_FAILED PUB failed write "), reply
            assert refused > 0, f"partition {partition} took every publish on a full disk"
        finished: dict[int, set[bytes]] = {}
        for partition, consumer in zip(partitions, consumers, strict=True):
            messages = consumer.read_messages(10)
            assert all(len(message.id) == 16 for message in messages)
            assert {message.body for message in messages} <= tried[partition]
            consumer.send(b"".join(encode_fin(message.id) for message in messages))
            finished[partition] = {message.body for message in messages}
        poll(lambda: "failed to write its cursor" in daemon.log, "a cursor sync refused")
        status, text = http(http_port, "GET", "/ping")
        assert status == 500 and text.startswith(b"NOK - "), text
        assert daemon.process.poll() is None
        assert "Traceback" not in daemon.log
        for consumer in consumers:
            consumer.close()
        consumers.clear()

        disk.free()
        for partition in partitions:
            data = b"after %d" % partition
            assert youzan_reply(tcp, encode_pub("lt", data, partition)) == (True, b"OK")
            acked[partition].add(data)
            tried[partition].add(data)
        poll(lambda: http(http_port, "GET", "/ping") == (200, b"OK"), "/ping OK again")
        assert daemon.stop() == 0
        daemon = DaemonProcess("nsqd", args, cwd=data_path).start(wait_for=("TCP", "HTTP"))
        for partition in partitions:
            wanted = acked[partition] - finished[partition]
            receive_all(daemon.port(), "lt", "c", wanted, tried[partition], partition)
        assert "Traceback" not in daemon.log
    finally:
        for consumer in consumers:
            consumer.close()
        daemon.kill()
        disk.close()


def test_every_worker_answers_nok_while_one_workers_topic_cannot_write(tmp_path):
    """`/ping` is the node's health: with `--workers=2`, a full disk refusing the writes of one
    worker's topic makes every worker answer NOK (each says it to the supervisor, which tells
    the others), and every worker answers OK again once that worker's writes succeed."""
    disk, data_path, args = small_disk_nsqd(tmp_path, "-workers=2", "-mem-queue-size=0")
    daemon = DaemonProcess("nsqd", args, cwd=data_path).start(wait_for=("TCP", "HTTP"))
    try:
        http_port = daemon.port("HTTP")
        assert http(http_port, "POST", "/pub?topic=t", b"before")[0] == 200
        disk.fill()
        # The diskqueue file's last page may still take a few.
        statuses = [http(http_port, "POST", "/pub?topic=t", b"x" * 1000)[0] for _ in range(50)]
        assert 500 in statuses, statuses

        def every_ping(status: int) -> bool:
            # Fresh connections, which the kernel gives to either worker.
            return all(http(http_port, "GET", "/ping")[0] == status for _ in range(20))

        poll(lambda: every_ping(500), "every worker's /ping NOK")
        disk.free()
        assert http(http_port, "POST", "/pub?topic=t", b"after")[0] == 200
        poll(lambda: every_ping(200), "every worker's /ping OK again")
        assert daemon.process.poll() is None
        assert "Traceback" not in daemon.log
    finally:
        daemon.kill()
        disk.close()
