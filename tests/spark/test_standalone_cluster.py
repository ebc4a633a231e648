"""The connector on a real Spark cluster: a standalone master and two workers started with the
`spark-class` pyspark ships (no download), each worker with one core, so a job's two tasks run
at once in two executor processes. Jobs run as separate driver processes against the master:
the pipeline example, and the exactly-once sink test, whose reads and writes run on the
executors (which the test checks by their processes)."""

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from nsqpy.client.blocking import http_json
from tests.spark.support import (
    SINK_DRIVER,
    SPARK_HOME,
    assert_stored_once,
    check_exactly_once_sink,
    check_pipeline_example,
    hold_after_publishing,
    log_to_log,
    start_driver,
    wait_mid_batch,
)
from tests.support.polling import poll

pytestmark = pytest.mark.spark

STARTUP = 120.0


class StandaloneCluster:
    """A master and `workers` workers on 127.0.0.1, on ports they choose."""

    def __init__(self, root: Path, workers: int = 2) -> None:
        self.root = root
        self.processes: list[subprocess.Popen] = []
        self.environment = dict(
            os.environ,
            SPARK_HOME=str(SPARK_HOME),
            PYSPARK_PYTHON=sys.executable,
            # The master's REST submission server listens on fixed port 6066: not needed.
            SPARK_MASTER_OPTS="-Dspark.master.rest.enabled=false",
        )
        master_log = root / "master.log"
        self._start(
            "master",
            ["org.apache.spark.deploy.master.Master", "--host", "127.0.0.1"],
            master_log,
        )
        self.url = poll(lambda: _master_url(master_log), "the Spark master", timeout=STARTUP)
        for number in range(workers):
            work = root / f"worker{number}"
            work.mkdir()
            log = root / f"worker{number}.log"
            self._start(
                f"worker{number}",
                [
                    "org.apache.spark.deploy.worker.Worker",
                    self.url,
                    "--host",
                    "127.0.0.1",
                    "--cores",
                    "1",
                    "--memory",
                    "1g",
                    "--work-dir",
                    str(work),
                ],
                log,
            )
            poll(
                lambda log=log: "Successfully registered with master" in log.read_text(),
                f"Spark worker {number} to register",
                timeout=STARTUP,
            )

    def _start(self, name: str, arguments: list[str], log: Path) -> None:
        command = [str(SPARK_HOME / "bin" / "spark-class"), *arguments]
        command += ["--port", "0", "--webui-port", "0"]
        with open(log, "w") as output:
            self.processes.append(
                subprocess.Popen(
                    command,
                    env=self.environment,
                    cwd=self.root,
                    stdout=output,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            )

    def close(self) -> None:
        for process in reversed(self.processes):
            process.kill()
            process.wait(30)

    def logs(self) -> str:
        return "\n".join(
            f"== {log.name}\n{log.read_text()[-3000:]}" for log in sorted(self.root.glob("*.log"))
        )


def _master_url(log: Path) -> str | None:
    for line in log.read_text().splitlines():
        if "Starting Spark master at " in line:
            return line.rsplit(" ", 1)[1]
    return None


@pytest.fixture(scope="module")
def standalone(tmp_path_factory):
    cluster = StandaloneCluster(tmp_path_factory.mktemp("spark-standalone"))
    try:
        yield cluster
    finally:
        cluster.close()


@pytest.mark.slow
def test_the_pipeline_example_runs_on_the_cluster(standalone, tmp_path):
    """Slow (two and a half minutes of Spark on CI's two cores): the default suite runs the
    example on local[2] (test_pipeline_example.py) and through Spark Connect, and runs tasks
    on this cluster's executors in the executor-kill test below."""
    check_pipeline_example(tmp_path, standalone.url, standalone.logs)


@pytest.mark.slow
def test_a_retried_task_on_the_cluster_stores_each_row_once(standalone, tmp_path):
    """The exactly-once sink test (test_exactly_once.py) with its tasks on two executors:
    each reads its partition of "in" from nsqd and publishes it into "out" from there.

    Slow (a minute and a half of Spark): the default suite retries a task that published part
    of its rows on local[2,3] (test_exactly_once.py) and through Spark Connect, and on this
    cluster after an executor kill (below)."""
    marker = check_exactly_once_sink(tmp_path, standalone.url, standalone.logs)
    # The tasks ran in the executors' processes, the two Spark partitions side by side.
    executors = {
        int(line.split()[1]) for line in Path(f"{marker}.executors").read_text().splitlines()
    }
    assert len(executors) == 2 and 0 not in executors, executors


def _started(pid: int) -> int:
    """When the process started, in clock ticks since boot (/proc's `starttime`)."""
    with open(f"/proc/{pid}/stat") as stat:
        return int(stat.read().rsplit(")", 1)[1].split()[19])


def executor_processes(since: int) -> list[int]:
    """The PIDs of the executor JVMs started after the process `since` (a driver): those of
    its application, not the ones a finished application's may still be leaving."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as cmdline:
                    if b"CoarseGrainedExecutorBackend" not in cmdline.read():
                        continue
                if _started(int(entry)) >= _started(since):
                    found.append(int(entry))
            except OSError:
                continue
    return found


def test_an_executor_killed_mid_batch_leaves_each_row_stored_once(standalone, tmp_path):
    """Log topic → Spark → log topic on the cluster; the executor running a task that has
    published part of its rows is killed with SIGKILL. Spark runs the task again on the
    executor it has left, under the same producer: the output holds every message once."""
    with log_to_log(tmp_path, per_partition=600) as (lookupd_http, nsqd_http, published):
        checkpoint, hold = tmp_path / "ck", tmp_path / "hold"
        arguments = [str(SINK_DRIVER), lookupd_http, str(checkpoint), str(hold), standalone.url]
        driver = start_driver([*arguments, "continuous"])
        try:
            wait_mid_batch(checkpoint)
            executor = hold_after_publishing(hold)
            assert executor in executor_processes(since=driver.pid), executor
            os.kill(executor, signal.SIGKILL)

            def all_copied() -> bool:
                assert driver.poll() is None, driver.communicate()[0][-5000:]
                stats = http_json(nsqd_http, "/stats", format="json", topic="out")
                return sum(t["message_count"] for t in stats["topics"]) >= len(published)

            poll(all_copied, "every message in the output topic", timeout=180)
        finally:
            driver.kill()
            driver.communicate(timeout=30)
        assert_stored_once(lookupd_http, nsqd_http, published)
