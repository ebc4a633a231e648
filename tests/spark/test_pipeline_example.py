"""examples/spark_pipeline.py runs as the README shows (`python -m examples.spark_pipeline`),
against a real nsqd: order events published to a log topic, summed per minute by a watermarked
streaming query into Parquet, and checked by the job itself against what it published."""

import subprocess
import sys
from pathlib import Path

import pytest

from tests.harness import start_nsqd

pytestmark = pytest.mark.spark

ROOT = Path(__file__).resolve().parents[2]


def test_the_pipeline_example_writes_totals_that_match_the_published_events(tmp_path):
    data = tmp_path / "nsqd"
    data.mkdir()
    nsqd = start_nsqd(data)
    try:
        result = subprocess.run(
            [
                sys.executable,
                "-m",
                "examples.spark_pipeline",
                f"--nsqd-http={nsqd.addresses['HTTP']}",
                f"--output={tmp_path / 'totals'}",
                f"--checkpoint={tmp_path / 'checkpoint'}",
                "--events=3000",
                "--max-per-batch=1000",
            ],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=300,
        )
    finally:
        nsqd.stop()
    assert result.returncode == 0, result.stdout + result.stderr[-5000:]
    assert "checked: 27 (minute, kind) totals match the 3000 events" in result.stdout
