"""Every Python snippet of the README runs as written: as `python job.py` from this virtualenv,
with no PYSPARK_PYTHON set, against a real nsqd and nsqlookupd whose ephemeral addresses replace
the README's `make run` ones."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.harness import start_nsqd, start_nsqlookupd
from tests.support.ports import with_addresses
from tests.support.stats import channel_stats

pytestmark = pytest.mark.spark

README = Path(__file__).resolve().parents[2] / "README.md"


def python_snippets() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)


@pytest.fixture
def cluster(tmp_path):
    lookupd = start_nsqlookupd()
    data = tmp_path / "nsqd"
    data.mkdir()
    nsqd = start_nsqd(
        data, f"-lookupd-tcp-address={lookupd.addresses['TCP']}", "-broadcast-address=127.0.0.1"
    )
    yield lookupd, nsqd
    nsqd.stop()
    lookupd.stop()


def test_readme_has_a_python_snippet():
    assert python_snippets()


@pytest.mark.parametrize("number", range(len(python_snippets())))
def test_readme_python_snippet_runs_as_written(cluster, tmp_path, number):
    lookupd, nsqd = cluster
    snippet = python_snippets()[number]
    replacements = {
        "127.0.0.1:4150": nsqd.addresses["TCP"],
        "127.0.0.1:4151": nsqd.addresses["HTTP"],
        "127.0.0.1:4160": lookupd.addresses["TCP"],
        "127.0.0.1:4161": lookupd.addresses["HTTP"],
    }
    snippet = with_addresses(snippet, replacements)
    job = tmp_path / "job.py"
    job.write_text(snippet)
    # What a user's shell has: none of the variables the other Spark tests set.
    environment = {
        name: value
        for name, value in os.environ.items()
        if name not in ("PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON", "PYTHONPATH")
    }
    result = subprocess.run(
        [sys.executable, str(job)],
        cwd=tmp_path,
        env=environment,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr[-5000:]
    # The snippet's console sink shows what went through both topics.
    for word in ("HELLO", "FROM", "SPARK"):
        assert re.search(rf"^\| *{word}\|$", result.stdout, flags=re.M), result.stdout
    http = nsqd.addresses["HTTP"]
    for topic, channel in (("events", "spark"), ("shouts", "print")):
        stats = channel_stats(http, topic, channel)
        assert stats["message_count"] == 3 and stats["depth"] == 0, stats
        assert stats["in_flight_count"] == 0, stats
