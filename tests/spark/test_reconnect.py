"""The reader's connection handling without Spark: the reader object is plain Python, so these
drive `prepareForTriggerAvailableNow`/`read`/`commit` the way Spark's source runner does."""

import time

import pytest

from nsqpy.client.blocking import http_publish
from nsqpy.spark.reader import NSQStreamReader
from tests.harness import start_nsqd
from tests.spark.support import wait_channel_drained

pytestmark = pytest.mark.spark


def rows_of(batches) -> list[dict]:
    """The rows of the Arrow record batches a `read` returned, as dicts."""
    return [row for batch in batches for row in batch.to_pylist()]


def drain(reader: NSQStreamReader, offset: dict, deadline: float) -> tuple[list[dict], dict]:
    """read/commit until the reader reports no new data, like an availableNow query."""
    rows: list[dict] = []
    while time.monotonic() < deadline:
        batches, end = reader.read(offset)
        rows.extend(rows_of(batches))
        if end == offset:
            return rows, offset
        reader.commit(offset)  # Spark commits batch n-1 once batch n is planned
        offset = end
    raise AssertionError("the reader never ran out of data")


@pytest.fixture
def daemons():
    """Every nsqd the test starts, stopped at the end whatever happens."""
    started = []
    yield started
    for daemon in started:
        daemon.stop()


def test_reader_reconnects_after_nsqd_restart(tmp_path, daemons):
    data = tmp_path / "nsqd"
    data.mkdir()
    nsqd = start_nsqd(data, "-msg-timeout=2s")
    daemons.append(nsqd)
    tcp, http = nsqd.addresses["TCP"], nsqd.addresses["HTTP"]
    bodies = {f"body-{i}".encode() for i in range(50)}
    http_publish(http, "restart", sorted(bodies))
    reader = NSQStreamReader(
        {"nsqd": tcp, "nsqd_http": http, "topic": "restart", "channel": "c", "maxbatch": "20"}
    )
    try:
        reader.prepareForTriggerAvailableNow()
        offset = reader.initialOffset()
        batches, offset = reader.read(offset)
        first = rows_of(batches)
        assert 0 < len(first) <= 20

        # nsqd goes away with batch 1 un-FINished and more buffered, and comes back on the
        # same ports and data: it persisted the in-flight messages on shutdown.
        nsqd.stop()
        port = tcp.rsplit(":", 1)[1]
        http_port = http.rsplit(":", 1)[1]
        daemons.append(
            start_nsqd(
                data,
                "-msg-timeout=2s",
                f"-tcp-address=127.0.0.1:{port}",
                f"-http-address=127.0.0.1:{http_port}",
            )
        )
        reader.prepareForTriggerAvailableNow()  # counts what the restarted nsqd holds
        rest, _ = drain(reader, offset, deadline=time.monotonic() + 30)
        received = [row["body"] for row in first + rest]
        assert set(received) == bodies
        # Batch 1 was never FINished: nsqd kept it over the restart and delivers it again.
        first_bodies = {row["body"] for row in first}
        assert first_bodies <= {row["body"] for row in rest}
        assert all(row["attempts"] > 1 for row in rest if row["body"] in first_bodies)

        wait_channel_drained(http, "restart", "c")
    finally:
        reader.stop()
