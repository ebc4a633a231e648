"""Spark's classes in a class data sharing archive (JDK 13+), for every JVM the Spark tests
start. Most of a Spark JVM's start is loading and verifying Spark's classes: with the archive a
driver's session and first job take about 6 s instead of 11 s. `make install-test` makes it
(`python -m tests.spark.class_archive`), before any test runs: made by the first Spark test
instead, it took 94 s of a loaded CI worker while the other workers' JVMs went without it.
A JVM whose class path differs (a standalone master) uses only what matches, silently.

An archive serves only the JVM build that wrote it (another build ignores it, silently, and
loads every class again): its name carries the JVM's identity, so that a Java update makes a
new one instead of leaving the tests without."""

import fcntl
import hashlib
import importlib.metadata
import os
import shutil
import subprocess
import sys
from pathlib import Path

# Every JVM these tests start (drivers, Spark Connect, a standalone master, workers and their
# executors inherit it) runs for seconds on small data: the quick compiler alone and the serial
# collector spend about a quarter less CPU on it than the server defaults, and CI has two cores.
JAVA_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"


def _jvm_identity() -> str:
    """A digest of the JVM library pyspark starts (JAVA_HOME's, else the `java` on PATH): its
    path, size and modification time, which an update of the JVM changes."""
    java_home = os.environ.get("JAVA_HOME")
    java = os.path.join(java_home, "bin", "java") if java_home else shutil.which("java")
    if java is None:
        return "nojava"
    home = Path(os.path.realpath(java)).parent.parent
    library = home / "lib" / "server" / "libjvm.so"
    identified = library if library.exists() else Path(os.path.realpath(java))
    status = identified.stat()
    key = f"{identified}:{status.st_size}:{status.st_mtime_ns}"
    return hashlib.blake2b(key.encode(), digest_size=6).hexdigest()


CLASS_ARCHIVE = (
    Path(sys.prefix)
    / f"spark-classes-{importlib.metadata.version('pyspark')}-{_jvm_identity()}.jsa"
)
_ARCHIVE_JOB = """
from pyspark.sql import SparkSession
spark = SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false").getOrCreate()
spark.createDataFrame([(1, "a")], ["n", "s"]).groupBy("s").count().collect()
spark.stop()
"""


def archive_options() -> str:
    """The JVM options that use the archive once it exists."""
    if not CLASS_ARCHIVE.exists():
        return JAVA_OPTIONS
    return (
        f"{JAVA_OPTIONS} -XX:SharedArchiveFile={CLASS_ARCHIVE} -Xlog:cds=off -Xlog:cds+dynamic=off"
    )


def make_archive() -> None:
    """Make the archive unless it exists, java is missing, or another process is making it."""
    if CLASS_ARCHIVE.exists() or shutil.which("java") is None:
        return
    with open(CLASS_ARCHIVE.with_suffix(".lock"), "w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return
        if CLASS_ARCHIVE.exists():
            return
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
            for stale in CLASS_ARCHIVE.parent.glob("spark-classes-*.jsa"):
                if stale != CLASS_ARCHIVE:
                    stale.unlink(missing_ok=True)


if __name__ == "__main__":
    make_archive()
