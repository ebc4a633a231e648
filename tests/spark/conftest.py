"""A session-wide local[2] SparkSession and a real nsqd subprocess per test; Spark's classes
in a shared archive for every JVM the tests start."""

import os
import shutil
import sys

import pytest

from tests.harness import start_nsqd
from tests.spark.class_archive import JAVA_OPTIONS, archive_options, make_archive
from tests.spark.support import MSG_TIMEOUT

os.environ.setdefault("JAVA_TOOL_OPTIONS", JAVA_OPTIONS)


def _with_class_archive() -> None:
    """Point JAVA_TOOL_OPTIONS at the class archive once it exists (the tests' own options
    untouched when they were given from outside)."""
    if os.environ["JAVA_TOOL_OPTIONS"] == JAVA_OPTIONS:
        os.environ["JAVA_TOOL_OPTIONS"] = archive_options()


@pytest.fixture(scope="session", autouse=True)
def spark_class_archive() -> None:
    """The archive `make install-test` makes; made here when pytest runs without it."""
    if os.environ["JAVA_TOOL_OPTIONS"] == JAVA_OPTIONS:
        make_archive()
    _with_class_archive()


@pytest.fixture(autouse=True)
def _class_archive_when_made() -> None:
    _with_class_archive()


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
