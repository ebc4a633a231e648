"""Exactly-once from a log topic to Spark's parquet sink: the driver is killed with SIGKILL in
the middle of a micro-batch, the query restarts from its checkpoint, and the output holds every
published message once."""

import signal
import subprocess
from pathlib import Path

import pytest

from tests.harness import start_nsqd
from tests.spark.exactly_once_driver import start_query
from tests.spark.support import (
    SINK_DRIVER,
    assert_stored_once,
    batch_logs,
    check_exactly_once_sink,
    create_topic,
    hold_after_publishing,
    log_to_log,
    publish,
    run_driver,
    start_driver,
    wait_mid_batch,
)

pytestmark = pytest.mark.spark

ROOT = Path(__file__).resolve().parents[2]
DRIVER = Path(__file__).with_name("exactly_once_driver.py")


def start_parquet_driver(
    nsqd_http: str, checkpoint: Path, output: Path, mode: str
) -> subprocess.Popen:
    return start_driver([str(DRIVER), nsqd_http, "orders", str(checkpoint), str(output), mode])


def kill_mid_batch(driver: subprocess.Popen, checkpoint: Path, hold: Path | None = None) -> None:
    """SIGKILL the driver in the middle of a micro-batch: one planned (in the offset log) and
    not yet committed, after a few that were; with `hold` (an exactly_once_sink_driver.py
    MARKER), once a task of the batch published part of its rows."""
    try:
        wait_mid_batch(checkpoint)
        if hold is not None:
            hold_after_publishing(hold)
        driver.send_signal(signal.SIGKILL)
    finally:
        driver.kill()
        driver.communicate(timeout=30)
    planned, done = batch_logs(checkpoint)
    assert len(planned) > len(done), "the driver was killed between batches"


def test_the_parquet_output_holds_every_message_once_after_the_driver_is_killed(spark, tmp_path):
    data = tmp_path / "nsqd"
    data.mkdir()
    nsqd = start_nsqd(data)
    try:
        http = nsqd.addresses["HTTP"]
        create_topic(http, "orders", 2)
        published = []
        for partition in (0, 1):
            for first in range(0, 600, 100):
                bodies = [b"order-%d-%04d" % (partition, i) for i in range(first, first + 100)]
                publish(http, "orders", partition, bodies)
                published += bodies
        checkpoint, output = tmp_path / "checkpoint", tmp_path / "output"

        kill_mid_batch(start_parquet_driver(http, checkpoint, output, "continuous"), checkpoint)

        # The query again from its checkpoint, in the tests' session (a driver as new as the
        # killed one's restart, without another JVM to start).
        rerun = start_query(spark, http, "orders", str(checkpoint), str(output), "available-now")
        assert rerun.awaitTermination(240), "the query did not drain the topic in 240 s"
        assert rerun.exception() is None, rerun.exception()

        rows = spark.read.parquet(str(output)).collect()
        bodies = sorted(bytes(row.body) for row in rows)
        assert len(bodies) == len(published), "duplicates or losses"
        assert bodies == sorted(published)
    finally:
        nsqd.stop()


@pytest.mark.slow
def test_a_task_run_again_after_publishing_part_of_its_rows_stores_each_row_once(tmp_path):
    """Log topic → Spark → log topic through lookupd, on local[2,3]: one task fails after the
    sink published some of its rows and Spark runs it again; the output topic holds every
    input message once (the retried task's repeats are acknowledged, not stored).

    Slow (40-odd seconds of Spark): the default suite runs the same driver and check through
    Spark Connect, in tests/spark/test_spark_connect.py."""
    check_exactly_once_sink(tmp_path)


@pytest.mark.slow
def test_the_nsq_sink_holds_every_message_once_after_the_driver_is_killed(tmp_path):
    """Log topic → Spark → log topic through lookupd; the driver is killed with SIGKILL while
    a task of a micro-batch has published part of its rows, and the query restarted from its
    checkpoint replays that batch under the same producers.

    Slow (a minute of Spark): the default suite kills the driver the same way, on a
    replicated cluster after two leader kills, in
    tests/spark/test_exactly_once_failover.py."""
    with log_to_log(tmp_path, per_partition=600) as (lookupd_http, nsqd_http, published):
        checkpoint, hold = tmp_path / "ck", tmp_path / "hold"
        arguments = [str(SINK_DRIVER), lookupd_http, str(checkpoint), str(hold), "local[2,3]"]
        kill_mid_batch(start_driver([*arguments, "continuous"]), checkpoint, hold)

        rerun = run_driver([*arguments, "available-now"])
        assert rerun.returncode == 0, rerun.stdout[-5000:]
        assert_stored_once(lookupd_http, nsqd_http, published)
