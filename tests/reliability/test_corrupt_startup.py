"""Corrupt or truncated files at startup never stop nsqd from starting and serving (issue #10).

One real nsqd run builds a data directory (module fixture): topic `t` with channels `c` and
`d`, topic `u` with no channel, and Youzan partitions 0 and 1 of `p` with channel `c`, every
message on disk (`--mem-queue-size=0`, small queue files), stopped cleanly. Each test copies
it, damages one file, and starts nsqd on it.

* `nsqd.dat` unusable (empty, truncated, garbage, JSON of the wrong shape, a directory):
  nsqd logs one ERROR line naming the file, moves it to `nsqd.dat.corrupt`, finds the topics
  and channels again from the diskqueue files, serves every queued message, and writes a
  fresh `nsqd.dat` (Go nsqd refuses to start instead).
* a queue's `.meta.dat` truncated or empty: the records are read from the data files.
* a queue's data file missing: the records of the other files are delivered.
"""

import json
import shutil
import struct
import time
from pathlib import Path

import pytest

from nsqpy.common.command import encode_mpub
from nsqpy.nsqd.options import Options
from nsqpy.nsqd.server import NSQD
from tests.harness import V2Connection, start_nsqd
from tests.reliability.support import http, receive_all

T_COUNT = 120
U_COUNT = 20
P_COUNT = 10
# About 16 records per queue file: t's channels span several files.
FILE_BYTES = 4096


def bodies(topic: str, count: int) -> list[bytes]:
    return [(b"%s %05d " % (topic.encode(), n)).ljust(200, b".") for n in range(count)]


@pytest.fixture(scope="module")
def template(tmp_path_factory) -> Path:
    data = tmp_path_factory.mktemp("template")
    daemon = start_nsqd(data, "-mem-queue-size=0", f"-max-bytes-per-file={FILE_BYTES}")
    try:
        port = daemon.port("HTTP")
        for path in (
            "/topic/create?topic=t",
            "/channel/create?topic=t&channel=c",
            "/channel/create?topic=t&channel=d",
            "/topic/create?topic=u",
            "/topic/create?topic=p&partition_num=2",
            "/channel/create?topic=p&channel=c",
        ):
            assert http(port, "POST", path)[0] == 200, path
        connection = V2Connection(daemon.port())
        for topic, count in (("t", T_COUNT), ("u", U_COUNT)):
            connection.send(encode_mpub(topic, bodies(topic, count)))
            assert connection.read_response().data == b"OK"
        connection.close()
        # Partition 1 of p: Youzan's `PUB <topic> <partition>`.
        connection = V2Connection(daemon.port())
        for body in bodies("p", P_COUNT):
            connection.send(b"PUB p 1\n" + struct.pack(">I", len(body)) + body)
            assert connection.read_response().data == b"OK"
        connection.close()
        assert daemon.stop() == 0, daemon.log
    finally:
        daemon.kill()
    return data


def copy_of(template: Path, tmp_path: Path) -> Path:
    data = tmp_path / "data"
    shutil.copytree(template, data)
    return data


def serve_and_check(data: Path, *, t_expected: set[bytes] | None = None):
    """Start nsqd on `data`: it must serve every queued message of t:c, t:d, u and p#1:c
    (t:c only `t_expected`, when given), and take and deliver a new one."""
    daemon = start_nsqd(data)
    try:
        # Before any client: nsqd.dat is there and lists the topics (rewritten if it was lost).
        deadline = time.monotonic() + 10
        while (first_document := _nsqd_dat(data)) is None:
            assert time.monotonic() < deadline, "no nsqd.dat written"
            time.sleep(0.01)
        daemon.first_document = first_document
        port = daemon.port()
        every_t = set(bodies("t", T_COUNT))
        wanted_c = every_t if t_expected is None else t_expected
        receive_all(port, "t", "c", wanted_c, every_t)
        receive_all(port, "t", "d", every_t, every_t)
        receive_all(port, "u", "c", set(bodies("u", U_COUNT)), set(bodies("u", U_COUNT)))
        stats = json.loads(http(daemon.port("HTTP"), "GET", "/stats?format=json")[1])
        depths = {
            (topic["topic_name"], channel["channel_name"]): channel["depth"]
            for topic in stats["topics"]
            for channel in topic["channels"]
        }
        # Partition 1's channel is served again (it is not reachable by a classic SUB).
        assert depths[("p", "c")] in (0, P_COUNT), depths
        connection = V2Connection(port)
        connection.send(encode_mpub("t", [b"fresh"]))
        assert connection.read_response().data == b"OK"
        connection.close()
        receive_all(port, "t", "c", {b"fresh"}, {b"fresh"})
        assert http(daemon.port("HTTP"), "GET", "/ping") == (200, b"OK")
        return daemon
    finally:
        daemon.stop()
        assert "Traceback" not in daemon.log, daemon.log


def _nsqd_dat(data: Path) -> dict | None:
    try:
        return json.loads((data / "nsqd.dat").read_bytes())
    except (OSError, ValueError):
        return None


# -- nsqd.dat -----------------------------------------------------------------------------------


def _truncated(original: bytes) -> bytes:
    return original[: len(original) // 2]


CORRUPT_NSQD_DAT = {
    "empty": lambda original: b"",
    "truncated": _truncated,
    "cut-by-one-byte": lambda original: original[:-1],
    "garbage": lambda original: b"\x00\xff\xfe garbage \x01" * 10,
    "syntax": lambda original: b"{not json",
    "not-an-object": lambda original: b"[1, 2]",
    "topics-not-a-list": lambda original: b'{"topics": 5}',
    "topic-without-name": lambda original: b'{"topics":[{"paused":false}]}',
    "name-not-a-string": lambda original: b'{"topics":[{"name":7,"channels":[]}]}',
    "channels-not-a-list": lambda original: b'{"topics":[{"name":"t","channels":3}]}',
}
# Every queue of the template, as the fresh nsqd.dat must list it; p is a log topic, whose
# partitions come back as partitions from its log files.
RECOVERED = {("t", None): ["c", "d"], ("u", None): [], ("p", 0): ["c"], ("p", 1): ["c"]}


def listed(document: dict) -> dict:
    return {
        (topic["name"], topic.get("partition")): sorted(c["name"] for c in topic["channels"])
        for topic in document["topics"]
    }


def damage_nsqd_dat(data: Path, damage: str) -> bytes | None:
    """Damage `nsqd.dat` in place; its new bytes (None: it became a directory)."""
    metadata = data / "nsqd.dat"
    if damage == "a-directory":
        metadata.unlink()
        metadata.mkdir()
        return None
    corrupt = CORRUPT_NSQD_DAT[damage](metadata.read_bytes())
    metadata.write_bytes(corrupt)
    return corrupt


@pytest.mark.parametrize("damage", ["empty", "truncated", "topic-without-name", "a-directory"])
def test_corrupt_nsqd_dat_is_set_aside_and_topics_recovered(template, tmp_path, damage):
    """A real nsqd process: one clear line, the file set aside, every message served."""
    data = copy_of(template, tmp_path)
    corrupt = damage_nsqd_dat(data, damage)

    daemon = serve_and_check(data)

    metadata = data / "nsqd.dat"
    naming = [line for line in daemon.lines if str(metadata) in line]
    assert len(naming) == 1, daemon.log
    assert "ERROR" in naming[0] and "nsqd.dat.corrupt" in naming[0], naming[0]
    moved = data / "nsqd.dat.corrupt"
    if corrupt is None:
        assert moved.is_dir()
    else:
        assert moved.read_bytes() == corrupt
    # The fresh nsqd.dat, written before any client came, lists what the queue files
    # showed (pause flags were only in the lost file).
    assert listed(daemon.first_document) == RECOVERED


@pytest.mark.parametrize("damage", [*CORRUPT_NSQD_DAT, "a-directory"])
def test_every_unusable_nsqd_dat_is_recovered_from_the_queue_files(
    template, tmp_path, damage, caplog
):
    """Every kind of damage, in process (no daemon start per case): load_metadata never
    raises, sets the file aside and finds every topic, channel and partition again."""
    data = copy_of(template, tmp_path)
    corrupt = damage_nsqd_dat(data, damage)
    nsqd = NSQD(Options(data_path=str(data), node_id=1))
    try:
        nsqd.load_metadata()
        found = {
            (topic.name, topic.partition if topic.partitioned else None): sorted(topic.channels)
            for topic in nsqd.all_partitions()
        }
        assert found == RECOVERED
        assert [t.backend_depth for t in nsqd.all_partitions() if t.name == "u"] == [U_COUNT]
        assert nsqd.topics["t"].channels["c"].depth == T_COUNT
    finally:
        for topic in nsqd.all_partitions():
            topic.close()
    moved = data / "nsqd.dat.corrupt"
    assert moved.is_dir() if corrupt is None else moved.read_bytes() == corrupt
    errors = [r for r in caplog.records if r.levelname == "ERROR" and "nsqd.dat" in r.message]
    assert len(errors) == 1, [r.message for r in errors]
    assert str(data / "nsqd.dat") in errors[0].message


def test_corrupt_nsqd_dat_twice_keeps_both_copies(template, tmp_path):
    data = copy_of(template, tmp_path)
    (data / "nsqd.dat.corrupt").write_bytes(b"an earlier one")
    (data / "nsqd.dat").write_bytes(b"")
    nsqd = NSQD(Options(data_path=str(data), node_id=1))
    nsqd.load_metadata()
    for topic in nsqd.all_partitions():
        topic.close()
    assert (data / "nsqd.dat.corrupt").read_bytes() == b"an earlier one"
    assert (data / "nsqd.dat.corrupt.1").read_bytes() == b""


# -- diskqueue files ----------------------------------------------------------------------------


@pytest.mark.parametrize("cut", ["half", "empty"])
def test_truncated_queue_metadata_still_serves_every_record(template, tmp_path, cut):
    data = copy_of(template, tmp_path)
    meta = data / "t:c.diskqueue.meta.dat"
    raw = meta.read_bytes()
    meta.write_bytes({"half": raw[: len(raw) // 2], "empty": b""}[cut])
    serve_and_check(data)


def test_missing_data_file_serves_the_other_files(template, tmp_path):
    data = copy_of(template, tmp_path)
    files = sorted(data.glob("t:c.diskqueue.0*.dat"))
    assert len(files) >= 3, files
    lost = records(files[1].read_bytes())
    files[1].unlink()
    serve_and_check(data, t_expected=set(bodies("t", T_COUNT)) - lost)


def records(raw: bytes) -> set[bytes]:
    """The message bodies in one go-diskqueue data file of nsqd messages."""
    found = set()
    position = 0
    while position < len(raw):
        (size,) = struct.unpack_from(">i", raw, position)
        found.add(raw[position + 4 + 26 : position + 4 + size])
        position += 4 + size
    return found
