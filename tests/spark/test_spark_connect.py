"""The connector through Spark Connect: a Connect server started with the `spark-submit`
pyspark ships (`SparkConnectServer`, `local[2,3]`: a failed task is run again), and drivers
that reach it with `SparkSession.builder.remote("sc://...")`. Python data sources work there:
the client sends the source's class, the server's Python workers run it. The pipeline example
and the exactly-once sink test run through it."""

import os
import subprocess
import sys

import pytest

from tests.spark.support import ROOT, SPARK_HOME, check_exactly_once_sink, check_pipeline_example
from tests.support.polling import poll

pytestmark = pytest.mark.spark


@pytest.fixture(scope="module")
def connect_server(tmp_path_factory):
    """The `sc://` address of a Spark Connect server on 127.0.0.1."""
    root = tmp_path_factory.mktemp("spark-connect")
    log = root / "connect.log"
    environment = dict(
        os.environ, SPARK_HOME=str(SPARK_HOME), PYSPARK_PYTHON=sys.executable, PYTHONPATH=str(ROOT)
    )
    settings = {
        "spark.connect.grpc.binding.port": "0",
        "spark.connect.grpc.binding.address": "127.0.0.1",
        "spark.ui.enabled": "false",
        "spark.driver.host": "127.0.0.1",
        "spark.driver.bindAddress": "127.0.0.1",
    }
    command = [
        str(SPARK_HOME / "bin" / "spark-submit"),
        "--class",
        "org.apache.spark.sql.connect.service.SparkConnectServer",
        "--master",
        "local[2,3]",
        *(item for key, value in settings.items() for item in ("--conf", f"{key}={value}")),
    ]
    with open(log, "w") as output:
        server = subprocess.Popen(
            command, env=environment, cwd=root, stdout=output, stderr=subprocess.STDOUT
        )
    try:

        def started() -> str | None:
            for line in log.read_text().splitlines():
                if "Spark Connect server started at: " in line:
                    return "sc://" + line.rsplit(" ", 1)[1]
            assert server.poll() is None, log.read_text()[-3000:]
            return None

        yield poll(started, "the Spark Connect server", timeout=120)
    finally:
        server.kill()
        server.wait(30)


# The pipeline example runs in the default suite on local[2] (tests/spark/test_pipeline_example.py)
# and Spark Connect carries the connector in the retried-task test below: together, a minute of
# CI's two cores.
@pytest.mark.slow
def test_the_pipeline_example_runs_through_spark_connect(connect_server, tmp_path):
    check_pipeline_example(tmp_path, connect_server)


def test_a_retried_task_through_spark_connect_stores_each_row_once(connect_server, tmp_path):
    check_exactly_once_sink(tmp_path, connect_server)
