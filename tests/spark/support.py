"""What the Spark connector tests share: addresses, stats, draining and availableNow runs."""

import contextlib
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pyspark

from nsqpy.client.blocking import http_json, http_request
from nsqpy.client.smart import SmartConsumer
from tests.harness import create_partitioned_topic, start_nsqd, start_nsqlookupd
from tests.support.polling import poll
from tests.support.stats import channel_stats

# Messages left un-FINished come back after this; short so the restart test is quick.
MSG_TIMEOUT = "2s"


def addresses(daemon) -> tuple[str, str]:
    return daemon.addresses["TCP"], daemon.addresses["HTTP"]


def collect_available_now(stream, checkpoint) -> list:
    """Run `stream` (a loaded nsq source) with trigger(availableNow=True) into a list of rows;
    the rows, once the query ended by itself without an error."""
    received = []
    query = (
        stream.writeStream.foreachBatch(lambda batch, _batch_id: received.extend(batch.collect()))
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(120)
    assert not query.isActive and query.exception() is None
    return received


def wait_channel_drained(http_address: str, topic: str, channel: str) -> dict:
    """Poll until the channel exists with nothing queued and nothing in flight; its stats."""

    def drained():
        stats = channel_stats(http_address, topic, channel)
        return stats and stats["depth"] == 0 and stats["in_flight_count"] == 0 and stats

    return poll(drained, f"{topic}:{channel} to drain (depth 0, in flight 0)")


def create_topic(http: str, topic: str, partitions: int) -> None:
    http_request(http, "/topic/create", method="POST", topic=topic, partition_num=str(partitions))


def publish(http: str, topic: str, partition: int, bodies: list[bytes]) -> None:
    payload = b"".join(len(body).to_bytes(4, "big") + body for body in bodies)
    http_request(
        http,
        "/mpub",
        method="POST",
        body=len(bodies).to_bytes(4, "big") + payload,
        topic=topic,
        partition=str(partition),
        binary="true",
    )


def aged_topic(http: str, topic: str) -> int:
    """A 1-partition log topic of 400 messages m000..m399, its segments rolling between
    writes of 50 (an nsqd with small segments), whose retention has run: its one channel
    passed everything, and a greedy clean removed every full segment. How many messages
    retention removed (more than none, fewer than all)."""
    create_topic(http, topic, 1)
    for first in range(0, 400, 50):
        publish(http, topic, 0, [b"m%03d" % i for i in range(first, first + 50)])
    where = {"topic": topic, "channel": "done", "partition": "0"}
    http_request(http, "/channel/create", method="POST", **where)
    http_request(http, "/channel/setoffset", method="POST", body=b"special:-1", **where)
    http_request(http, "/topic/greedyclean", method="POST", topic=topic, partition="0")
    offsets = http_json(http, "/partition/offsets", topic=topic)["partitions"][0]
    removed = offsets["start"]["count"]
    assert 0 < removed < 400, removed
    return removed


ROOT = Path(__file__).resolve().parents[2]
# The Spark that pyspark ships: bin/spark-class, bin/spark-submit, its jars.
SPARK_HOME = Path(pyspark.__file__).parent
SINK_DRIVER = Path(__file__).with_name("exactly_once_sink_driver.py")


def start_driver(arguments: list[str], **variables: str) -> subprocess.Popen:
    """`python ARGUMENTS` started from the checkout's root, its Spark workers on this
    interpreter, with the environment `variables` too; its output (stdout and stderr) in
    one pipe."""
    environment = dict(os.environ, PYTHONPATH=str(ROOT), PYSPARK_PYTHON=sys.executable, **variables)
    return subprocess.Popen(
        [sys.executable, *arguments],
        cwd=ROOT,
        env=environment,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def run_driver(arguments: list[str], timeout: float = 300) -> subprocess.CompletedProcess:
    """`start_driver`, until it ends (killed after `timeout`)."""
    with start_driver(arguments) as driver:
        try:
            output, _ = driver.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            driver.kill()
            driver.communicate()
            raise
    return subprocess.CompletedProcess(driver.args, driver.returncode, output)


@contextlib.contextmanager
def log_to_log(tmp_path: Path, per_partition: int = 1000) -> Iterator[tuple[str, str, list]]:
    """An nsqlookupd and an nsqd, log topics "in" and "out" of 2 partitions (with channel "c"),
    and `per_partition` messages published to each partition of "in": (nsqlookupd HTTP, nsqd
    HTTP, the bodies published)."""
    lookupd = start_nsqlookupd("-broadcast-address=127.0.0.1")
    data = tmp_path / "nsqd"
    data.mkdir()
    nsqd = start_nsqd(
        data, f"-lookupd-tcp-address={lookupd.addresses['TCP']}", "-broadcast-address=127.0.0.1"
    )
    try:
        lookupd_http, nsqd_http = lookupd.addresses["HTTP"], nsqd.addresses["HTTP"]
        poll(lambda: http_json(lookupd_http, "/nodes")["producers"], "the nsqd to register")
        create_partitioned_topic(lookupd_http, nsqd_http, "in", 2, "c")
        create_partitioned_topic(lookupd_http, nsqd_http, "out", 2, "c")
        published = []
        for partition in (0, 1):
            bodies = [b"row-%d-%04d" % (partition, i) for i in range(per_partition)]
            publish(nsqd_http, "in", partition, bodies)
            published += bodies
        yield lookupd_http, nsqd_http, published
    finally:
        nsqd.stop()
        lookupd.stop()


def assert_stored_once(lookupd_http: str, nsqd_http: str, published: list) -> None:
    """Topic "out" stores each published body once: its message count, and a read-back."""
    counts = {
        entry["topic_partition"]: entry["message_count"]
        for entry in http_json(nsqd_http, "/stats", format="json", topic="out")["topics"]
    }
    assert sum(counts.values()) == len(published), f"stored {counts}: duplicates or losses"
    with SmartConsumer([lookupd_http], "out", "c", max_in_flight=200) as consumer:
        received = consumer.receive_many(len(published), timeout=60, finish=True)
    assert sorted(message.body for message in received) == sorted(published)


def check_exactly_once_sink(tmp_path: Path, master: str | None = None, logs=str) -> Path:
    """exactly_once_sink_driver.py on `master` (its default: local[2,3]): 2,000 messages in
    log topic "in" streamed into log topic "out" through nsqlookupd, one task failing after
    the sink published 200 of its rows; every message must be in "out" once. The driver's
    marker file (see the driver); `logs()` adds to a failure's message."""
    with log_to_log(tmp_path) as (lookupd_http, nsqd_http, published):
        marker = tmp_path / "failed-after"
        arguments = [str(SINK_DRIVER), lookupd_http, str(tmp_path / "ck"), str(marker)]
        result = run_driver(arguments + ([master] if master else []))
        assert result.returncode == 0, result.stdout[-5000:] + logs()
        # The injected failure came after the sink had published rows of the task.
        assert int(marker.read_text()) == 200, marker.read_text()
        assert_stored_once(lookupd_http, nsqd_http, published)
        return marker


def check_pipeline_example(tmp_path: Path, master: str, logs=str) -> None:
    """examples/spark_pipeline.py on `master` against a fresh nsqd: its own check passes."""
    data = tmp_path / "nsqd"
    data.mkdir()
    nsqd = start_nsqd(data)
    try:
        result = run_driver(
            [
                "-m",
                "examples.spark_pipeline",
                f"--master={master}",
                f"--nsqd-http={nsqd.addresses['HTTP']}",
                f"--output={tmp_path / 'totals'}",
                f"--checkpoint={tmp_path / 'checkpoint'}",
                "--events=3000",
                "--max-per-batch=1000",
            ]
        )
    finally:
        nsqd.stop()
    assert result.returncode == 0, result.stdout[-5000:] + logs()
    assert "checked: 27 (minute, kind) totals match the 3000 events" in result.stdout


def batch_logs(checkpoint: Path) -> tuple[set[str], set[str]]:
    """The batch numbers in a query's offset log (planned) and in its commit log (done)."""

    def numbers(folder: str) -> set[str]:
        path = checkpoint / folder
        return {name for name in os.listdir(path) if name.isdigit()} if path.exists() else set()

    return numbers("offsets"), numbers("commits")


def wait_mid_batch(checkpoint: Path, after: int = 2) -> None:
    """Until a query is in the middle of a micro-batch: one planned and not yet committed,
    after at least `after` that were."""

    def mid_batch() -> bool:
        planned, done = batch_logs(checkpoint)
        return len(done) >= after and len(planned - done) == 1

    poll(mid_batch, "a batch in progress", timeout=120, interval=0.005)


def hold_after_publishing(marker: Path) -> int:
    """Ask a continuous exactly_once_sink_driver.py run (MARKER `marker`) to hold its next
    task of Spark partition 0 once the sink published part of its rows, and wait until it
    did; its executor's PID (0 when local)."""
    marker.with_name(marker.name + ".request").touch()
    held = marker.with_name(marker.name + ".held")

    def holding() -> list[int]:
        line = held.read_text() if held.exists() else ""
        if not line.endswith("\n"):
            return []
        rows, executor = map(int, line.split())
        assert rows, "the held task had no rows to publish"
        return [executor]

    (executor,) = poll(holding, "a task holding after publishing part of its rows", timeout=120)
    return executor


@contextlib.contextmanager
def standalone_lookupd_and_nsqd(tmp_path: Path) -> Iterator[tuple[str, str]]:
    """(nsqlookupd HTTP, nsqd HTTP): a standalone nsqlookupd, which places a partitioned
    topic created through it on its one registered nsqd."""
    daemons = []
    try:
        lookupd = start_nsqlookupd("-broadcast-address=127.0.0.1")
        daemons.append(lookupd)
        data = tmp_path / "nsqd"
        data.mkdir()
        nsqd = start_nsqd(
            data, f"-lookupd-tcp-address={lookupd.addresses['TCP']}", "-broadcast-address=127.0.0.1"
        )
        daemons.append(nsqd)
        lookupd_http = lookupd.addresses["HTTP"]
        poll(lambda: http_json(lookupd_http, "/nodes")["producers"], "the nsqd to register")
        yield lookupd_http, nsqd.addresses["HTTP"]
    finally:
        for daemon in reversed(daemons):
            daemon.stop()


def partition_counts(nsqd_http: str, topic: str) -> dict[int, int]:
    """topic partition -> messages published to it, from the nsqd's /stats."""
    stats = http_json(nsqd_http, "/stats", format="json", topic=topic)
    return {
        entry["topic_partition"]: entry["message_count"]
        for entry in stats.get("topics") or []
        if entry["topic_name"] == topic and "topic_partition" in entry
    }
