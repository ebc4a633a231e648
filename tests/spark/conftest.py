"""A session-wide local[2] SparkSession and a real nsqd subprocess per test."""

import os
import shutil
import sys
import time

import pytest

from nsqpy.client.blocking import http_json
from tests.harness import start_nsqd

# Messages left un-FINished come back after this; short so the restart test is quick.
MSG_TIMEOUT = "2s"


@pytest.fixture(scope="session")
def spark():
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        pytest.fail(
            "java not found: the Spark connector tests (tests/spark) need Java 17 "
            "(Debian: apt-get install openjdk-17-jre-headless); "
            "deselect them with -m 'not spark'"
        )
    from pyspark.sql import SparkSession

    from nsqpy.spark import register

    # Spark's Python workers must import nsqpy.spark and common from this virtualenv.
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    session = (
        SparkSession.builder.master("local[2]")
        .appName("nsqpy-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.default.parallelism", "2")
        .config("spark.sql.streaming.pollingDelay", "10ms")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.driver.host", "127.0.0.1")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    register(session)
    yield session
    session.stop()


@pytest.fixture
def nsqd(tmp_path):
    data = tmp_path / "nsqd"
    data.mkdir()
    daemon = start_nsqd(data, f"-msg-timeout={MSG_TIMEOUT}")
    yield daemon
    daemon.stop()


def addresses(daemon) -> tuple[str, str]:
    return daemon.addresses["TCP"], daemon.addresses["HTTP"]


def topic_stats(http_address: str, topic: str) -> dict | None:
    stats = http_json(http_address, "/stats", format="json", topic=topic)
    for entry in (stats or {}).get("topics") or []:
        if entry["topic_name"] == topic:
            return entry
    return None


def channel_stats(http_address: str, topic: str, channel: str) -> dict | None:
    for entry in (topic_stats(http_address, topic) or {}).get("channels") or []:
        if entry["channel_name"] == channel:
            return entry
    return None


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

    return wait_until(drained, what=f"{topic}:{channel} to drain (depth 0, in flight 0)")


def wait_until(predicate, timeout: float = 20.0, interval: float = 0.05, what: str = ""):
    """Poll `predicate` until it returns a true value (returned), failing after `timeout`."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what or predicate}")
        time.sleep(interval)
