"""A log topic's channel keeps what was finished out of order (docs/design.md §13): the ranges
acknowledged beyond its confirmed position are persisted with it, so a restart delivers what
was not finished and nothing that was. After a clean stop, nothing finished comes again; after
kill -9, nothing finished before the last `--sync-timeout` write. Real nsqd processes, a
single `--log-topic`."""

import json

from tests.harness import V2Connection, start_nsqd
from tests.nsqd.log_topic_client import FLAGS, channel_stats, create_channel, mpub, subscribe
from tests.support.polling import poll


def publish(port: int, count: int) -> list[bytes]:
    bodies = [b"m%05d" % n for n in range(count)]
    mpub(port, bodies)
    return bodies


def finish_odd_ones(port: int, count: int) -> tuple[V2Connection, set[bytes]]:
    """Receive `count` messages of lt:c and FIN every odd one; the even ones stay in flight
    on the connection returned."""
    connection = subscribe(port, count)
    finished = set()
    received = 0
    while received < count:
        for message in connection.read_messages(1):
            received += 1
            if int(message.body[1:]) % 2:
                connection.send(b"FIN " + message.id + b"\n")
                finished.add(message.body)
    return connection, finished


def receive_all(port: int, expected: int) -> list[bytes]:
    connection = subscribe(port, 500)
    bodies = []
    while len(bodies) < expected:
        for message in connection.read_messages(1):
            bodies.append(message.body)
            connection.send(b"FIN " + message.id + b"\n")
    connection.close()
    return bodies


def ranges_written(data_path) -> list:
    path = data_path / "lt" / "lt-0:c.acked.json"
    return json.loads(path.read_bytes()) if path.exists() else []


def test_a_clean_stop_delivers_nothing_finished_again(tmp_path):
    daemon = start_nsqd(tmp_path, *FLAGS, "--max-confirm-win=100000")
    try:
        create_channel(daemon)
        bodies = publish(daemon.port("TCP"), 2000)
        connection, finished = finish_odd_ones(daemon.port("TCP"), 2000)
        # The FINs were read before the stop: the stats count them (a round trip on HTTP).
        poll(
            lambda: (
                channel_stats(daemon)["confirmed_count"] == 0
                and channel_stats(daemon)["in_flight_count"] == 1000
            ),
            "the 1,000 FINs taken",
        )
        assert daemon.stop() == 0
        connection.close()
        daemon = start_nsqd(tmp_path, *FLAGS, "--max-confirm-win=100000")
        again = receive_all(daemon.port("TCP"), 1000)
    finally:
        daemon.stop()
    assert len(finished) == 1000
    assert sorted(again) == sorted(set(bodies) - finished)


def test_kill_9_delivers_nothing_finished_before_the_last_sync(tmp_path):
    daemon = start_nsqd(tmp_path, *FLAGS)
    try:
        create_channel(daemon)
        bodies = publish(daemon.port("TCP"), 400)
        connection, finished = finish_odd_ones(daemon.port("TCP"), 400)
        # 200 FINs out of order: 200 ranges, the first after message 0 (in flight).
        poll(lambda: len(ranges_written(tmp_path)) == 200, "the ranges written by a sync")
        daemon.kill()
        connection.close()
        daemon = start_nsqd(tmp_path, *FLAGS)
        again = receive_all(daemon.port("TCP"), 200)
    finally:
        daemon.stop()
    assert sorted(again) == sorted(set(bodies) - finished)


def test_more_ranges_than_the_window_after_a_restart_do_not_stall_the_channel(tmp_path):
    """The window stops reading new messages while too many ranges wait; after a restart the
    messages among the ranges are not new, and go out."""
    daemon = start_nsqd(tmp_path, *FLAGS, "--max-confirm-win=1000")
    try:
        create_channel(daemon)
        bodies = publish(daemon.port("TCP"), 600)
        connection, finished = finish_odd_ones(daemon.port("TCP"), 600)
        poll(lambda: len(ranges_written(tmp_path)) == 300, "the ranges written by a sync")
        assert daemon.stop() == 0
        connection.close()
        daemon = start_nsqd(tmp_path, *FLAGS, "--max-confirm-win=20")
        again = receive_all(daemon.port("TCP"), 300)
        poll(lambda: channel_stats(daemon)["confirmed_count"] == 600, "every message confirmed")
    finally:
        daemon.stop()
    assert sorted(again) == sorted(set(bodies) - finished)
