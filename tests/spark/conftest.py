"""A session-wide local[2] SparkSession and a real nsqd subprocess per test."""

import os
import shutil
import sys

import pytest

from tests.harness import start_nsqd
from tests.spark.support import MSG_TIMEOUT

# Every JVM these tests start (drivers, Spark Connect, a standalone master, workers and their
# executors inherit it) runs for seconds on small data: the quick compiler alone and the serial
# collector spend about a quarter less CPU on it than the server defaults, and CI has two cores.
os.environ.setdefault("JAVA_TOOL_OPTIONS", "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC")


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
