"""A session-wide local[2] SparkSession and a real nsqd subprocess per test; Spark's classes
in a shared archive for every JVM the tests start."""

import fcntl
import importlib.metadata
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.harness import start_nsqd
from tests.spark.support import MSG_TIMEOUT

# Every JVM these tests start (drivers, Spark Connect, a standalone master, workers and their
# executors inherit it) runs for seconds on small data: the quick compiler alone and the serial
# collector spend about a quarter less CPU on it than the server defaults, and CI has two cores.
JAVA_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
os.environ.setdefault("JAVA_TOOL_OPTIONS", JAVA_OPTIONS)

# Most of a Spark JVM's start is loading and verifying Spark's classes: a dynamic class data
# sharing archive of them (JDK 13+), made once in the virtualenv by a short job, takes a driver's
# session and first job from about 11 s to 6 s. A JVM whose class path differs (a standalone
# master) uses only what matches, silently (the `cds` warnings off).
CLASS_ARCHIVE = Path(sys.prefix) / f"spark-classes-{importlib.metadata.version('pyspark')}.jsa"
_ARCHIVE_JOB = """
from pyspark.sql import SparkSession
spark = SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false").getOrCreate()
spark.createDataFrame([(1, "a")], ["n", "s"]).groupBy("s").count().collect()
spark.stop()
"""


def _with_class_archive() -> None:
    """Point JAVA_TOOL_OPTIONS at the class archive once it exists (the tests' own options
    untouched when they were given from outside)."""
    if os.environ["JAVA_TOOL_OPTIONS"] == JAVA_OPTIONS and CLASS_ARCHIVE.exists():
        os.environ["JAVA_TOOL_OPTIONS"] = (
            f"{JAVA_OPTIONS} -XX:SharedArchiveFile={CLASS_ARCHIVE} -Xlog:cds=off"
            " -Xlog:cds+dynamic=off"
        )


@pytest.fixture(scope="session", autouse=True)
def spark_class_archive() -> None:
    """Make the class archive unless it exists or another test worker is making it (that
    worker's JVMs use it from their next start, this one's once it is there)."""
    if CLASS_ARCHIVE.exists() or os.environ["JAVA_TOOL_OPTIONS"] != JAVA_OPTIONS:
        _with_class_archive()
        return
    if shutil.which("java") is None:
        return
    with open(CLASS_ARCHIVE.with_suffix(".lock"), "w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return
        if not CLASS_ARCHIVE.exists():
            # Written as the JVM exits; renamed, so that no JVM ever opens half of it.
            making = CLASS_ARCHIVE.with_suffix(f".{os.getpid()}.jsa")
            options = f"{JAVA_OPTIONS} -XX:ArchiveClassesAtExit={making}"
            subprocess.run(
                [sys.executable, "-c", _ARCHIVE_JOB],
                env={**os.environ, "JAVA_TOOL_OPTIONS": options},
                capture_output=True,
                timeout=300,
                check=False,
            )
            if making.exists():
                making.rename(CLASS_ARCHIVE)
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
