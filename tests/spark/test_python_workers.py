"""Spark's Python workers import the installed pyspark, never pyspark's own zips: Spark puts
`pyspark.zip` and py4j's first on their PYTHONPATH, and nsqpy/spark/pyspark_first.pth (which
`make install-test` copies into site-packages) takes them off the path before anything is
imported, so no worker compiles pyspark from a zip or reads a zip's directory."""

import os

import pytest
from pyspark.sql import functions as F

pytestmark = pytest.mark.spark


def _worker_paths(_: int) -> str:
    import sys

    import pyspark

    zips = [entry for entry in sys.path if ".zip" in entry]
    cached = [entry for entry in sys.path_importer_cache if "pyspark/python/lib" in entry]
    return f"{pyspark.__file__}|{os.environ.get('PYTHONPATH', '')}|{zips}|{cached}"


def test_python_workers_import_the_installed_pyspark_without_its_zips(spark):
    worker_paths = F.udf(_worker_paths, "string")
    answer = spark.range(1).select(worker_paths("id")).first()[0]
    pyspark_file, pythonpath, zips, cached = answer.split("|")
    assert "pyspark.zip" in pythonpath, pythonpath  # Spark still puts it there
    assert "site-packages/pyspark/__init__.py" in pyspark_file, pyspark_file
    assert "pyspark/python/lib" not in zips, zips
    assert cached == "[]", cached
