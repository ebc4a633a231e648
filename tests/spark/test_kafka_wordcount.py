"""examples/kafka_wordcount.py, Spark's Kafka word count with only the format and the servers
option renamed, runs against nsqlookupd: `subscribePattern` over two log topics, the `value`
column, and `format("nsq")` found without `register(spark)` (PySpark's static registration of
the `pyspark_nsq` module)."""

import re
import subprocess
import sys
import threading
import time

import pytest

from nsqpy.client.blocking import http_json
from tests.harness import create_partitioned_topic, start_nsqd, start_nsqlookupd
from tests.spark.support import publish, start_driver
from tests.support.polling import poll

pytestmark = pytest.mark.spark

_ROW = re.compile(r"^\|\s*(\S+)\|\s*(\d+)\|$")


def last_table(output: list[str]) -> dict[str, int]:
    """The word counts of the last complete table the console sink printed."""
    tables: list[dict[str, int]] = []
    current: dict[str, int] | None = None
    for line in output:
        if line.startswith("Batch: "):
            current = {}
            tables.append(current)
        elif current is not None and (match := _ROW.match(line.strip())):
            current[match.group(1)] = int(match.group(2))
    return tables[-2] if len(tables) > 1 else {}


def test_the_ported_kafka_word_count_counts_the_words_of_every_matching_topic(tmp_path):
    lookupd = start_nsqlookupd("-broadcast-address=127.0.0.1")
    data = tmp_path / "nsqd"
    data.mkdir()
    nsqd = start_nsqd(
        data, f"-lookupd-tcp-address={lookupd.addresses['TCP']}", "-broadcast-address=127.0.0.1"
    )
    lookupd_http, nsqd_http = lookupd.addresses["HTTP"], nsqd.addresses["HTTP"]
    try:
        poll(lambda: http_json(lookupd_http, "/nodes")["producers"], "the nsqd to register")
        create_partitioned_topic(lookupd_http, nsqd_http, "words-a", 2, "c")
        create_partitioned_topic(lookupd_http, nsqd_http, "words-b", 1, "c")
        create_partitioned_topic(lookupd_http, nsqd_http, "other", 1, "c")
        driver = start_driver(
            ["examples/kafka_wordcount.py", lookupd_http, "subscribePattern", "words-.*"],
            # The example as Spark ships it, on two cores: a small job's settings from
            # outside, as spark-submit's --conf would give them.
            PYSPARK_SUBMIT_ARGS="--master local[2] --conf spark.sql.shuffle.partitions=2"
            " --conf spark.ui.enabled=false pyspark-shell",
        )
        output: list[str] = []
        reader = threading.Thread(
            target=lambda: output.extend(iter(driver.stdout.readline, "")), daemon=True
        )
        reader.start()
        try:
            # The example starts at the latest offsets (Kafka's default): publish until its
            # counts show both topics, each message "hello world <topic>".
            targets = [("words-a", 0), ("words-a", 1), ("words-b", 0), ("other", 0)]
            deadline = time.monotonic() + 120
            sent = 0

            def counted() -> bool:
                nonlocal sent
                assert driver.poll() is None, "".join(output)[-5000:]
                topic, partition = targets[sent % len(targets)]
                publish(nsqd_http, topic, partition, [b"hello world " + topic.encode()])
                sent += 1
                table = last_table(output)
                return table.get("words-a", 0) >= 2 and table.get("words-b", 0) >= 1

            poll(counted, lambda: "".join(output)[-5000:], timeout=deadline - time.monotonic())
            table = last_table(output)
            assert "other" not in table
            assert table["hello"] == table["world"] == table["words-a"] + table["words-b"]
        finally:
            driver.kill()
            driver.wait()
    finally:
        nsqd.stop()
        lookupd.stop()


def test_pyspark_finds_the_nsq_source_without_register(tmp_path):
    """What PySpark's static registration does at a session's start
    (`pyspark.sql.worker.lookup_data_sources`), in a Python started elsewhere, as Spark
    starts its workers: the `DefaultSource` of each `pyspark_*` module it can list."""
    program = (
        "import importlib, pkgutil\n"
        "found = {m.name: importlib.import_module(m.name) for m in pkgutil.iter_modules()"
        " if m.name.startswith('pyspark_')}\n"
        "print(found['pyspark_nsq'].DefaultSource.name())\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", program], cwd=tmp_path, capture_output=True, text=True, timeout=60
    )
    assert result.stdout.strip() == "nsq", result.stderr[-3000:]
