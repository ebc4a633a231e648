"""nsq_to_file against a real nsqd: Go's file names, rotation by size, gzip, work dir."""

import gzip
import re
import socket

from nsqpy.client.blocking import Producer
from tests.support.polling import poll
from tests.support.stats import channel_stats
from tests.tools.support import run_tool, start_tool, stop_tool

HOST = socket.gethostname().split(".")[0]


def all_finished(nsqd, topic, count):
    stats = channel_stats(nsqd, topic, "nsq_to_file")
    return (
        stats is not None
        and stats["message_count"] == count
        and stats["depth"] == 0
        and stats["in_flight_count"] == 0
    )


def test_nsq_to_file_plain_file_named_like_go(nsqd, topic, tmp_path):
    tcp = nsqd.addresses["TCP"]
    with Producer(tcp) as producer:
        producer.multi_publish(topic, [b"line %d" % i for i in range(10)])
    tool = start_tool(
        "nsq_to_file",
        f"--topic={topic}",
        f"--nsqd-tcp-address={tcp}",
        f"--output-dir={tmp_path}",
    )
    poll(lambda: all_finished(nsqd, topic, 10))
    stop_tool(tool)
    # Normally one file; two if the test straddles an hour (the default <DATETIME> changes).
    paths = sorted(tmp_path.iterdir())
    for path in paths:
        # <TOPIC>.<HOST><REV>.<DATETIME>.log, <REV> removed without gzip/rotation/work dir.
        assert re.fullmatch(rf"{topic}\.{HOST}\.\d{{4}}-\d\d-\d\d_\d\d\.log", path.name)
    assert b"".join(p.read_bytes() for p in paths) == b"".join(b"line %d\n" % i for i in range(10))


def test_nsq_to_file_gzip_rotates_by_size_through_a_work_dir(nsqd, topic, tmp_path):
    tcp = nsqd.addresses["TCP"]
    output, work = tmp_path / "out", tmp_path / "work"
    tool = start_tool(
        "nsq_to_file",
        f"--topic={topic}",
        f"--nsqd-tcp-address={tcp}",
        f"--output-dir={output}",
        f"--work-dir={work}",
        "--gzip",
        "--rotate-size=100",
        "--max-in-flight=5",
        "--datetime-format=%Y",
    )
    bodies = [b"message number %03d" % i for i in range(30)]
    with Producer(tcp) as producer:
        producer.multi_publish(topic, bodies)
    poll(lambda: all_finished(nsqd, topic, 30))
    stop_tool(tool)
    names = sorted(p.name for p in output.iterdir())
    assert len(names) > 1
    for rev, name in enumerate(names):
        assert re.fullmatch(rf"{topic}\.{HOST}-{rev:06d}\.\d{{4}}\.log\.gz", name), name
    assert list(work.iterdir()) == []
    lines = b"".join(gzip.decompress((output / name).read_bytes()) for name in names)
    assert lines.splitlines() == bodies


def test_nsq_to_file_rejects_format_without_rev(tmp_path):
    result = run_tool(
        "nsq_to_file",
        "--topic=t",
        "--nsqd-tcp-address=127.0.0.1:1",
        "--gzip",
        "--filename-format=<TOPIC>.log",
        f"--output-dir={tmp_path}",
    )
    assert result.returncode == 1
    assert b"missing <REV> in --filename-format" in result.stderr


def test_nsq_to_file_rotates_by_interval(nsqd, topic, tmp_path):
    tcp = nsqd.addresses["TCP"]
    tool = start_tool(
        "nsq_to_file",
        f"--topic={topic}",
        f"--nsqd-tcp-address={tcp}",
        f"--output-dir={tmp_path}",
        "--rotate-interval=200ms",
        "--sync-interval=50ms",
        "--datetime-format=%Y",  # no new name at an hour boundary: only the interval rotates
    )
    with Producer(tcp) as producer:
        producer.publish(topic, b"before")
        poll(lambda: all_finished(nsqd, topic, 1))
        # The interval passes and the sync tick opens the next revision.
        poll(lambda: len(list(tmp_path.iterdir())) >= 2)
        producer.publish(topic, b"after")
        poll(lambda: all_finished(nsqd, topic, 2))
    stop_tool(tool)
    files = sorted(tmp_path.iterdir())
    assert files[0].name.startswith(f"{topic}.{HOST}-000000.")
    assert files[1].name.startswith(f"{topic}.{HOST}-000001.")
    assert b"".join(path.read_bytes() for path in files) == b"before\nafter\n"
