"""A log topic's delay queue (docs/design.md §13): a DPUB, and a REQ that Youzan's rules move to
the end (a delay of `--req-to-end-threshold` or more, or made while the channel's window is
full), wait in the partition's delay queue, indexed by due time, with their records in the
log. The channel's cursor goes on past them; they come when due, not before, through clean
stops and kill -9. Real nsqd processes, `--log-topic=lt`, channel `c`."""

import json
import time
import urllib.error

from tests.harness import V2Connection, http_request, start_nsqd
from tests.nsqd.log_topic_client import FLAGS, channel_stats, create_channel, mpub, subscribe
from tests.support.polling import poll
from tests.support.tmpfs import Tmpfs


def dpub(port: int, body: bytes, delay_ms: int) -> None:
    connection = V2Connection(port)
    connection.send(b"DPUB lt %d\n" % delay_ms + len(body).to_bytes(4, "big") + body)
    assert connection.read_response().data == b"OK"
    connection.close()


def finish_odd_requeue_even(connection: V2Connection, count: int) -> list[bytes]:
    """Read `count` messages (`m<n>`), FIN the odd ones and REQ the even ones for 120 s, one
    at a time; their bodies, as read."""
    seen: list[bytes] = []
    while len(seen) < count:
        (message,) = connection.read_messages(1)
        seen.append(message.body)
        if int(message.body[1:]) % 2:
            connection.send(b"FIN " + message.id + b"\n")
        else:
            connection.send(b"REQ " + message.id + b" 120000\n")
    return seen


def test_requeues_with_a_long_delay_never_stall_the_channel(tmp_path):
    """The issue's consumer: every even message REQ'd with 120 s, every odd one FINished. With
    the default window (500) every message is delivered once (before the delay queue: 1,500,
    then nothing until the first REQs came due), and the even ones wait."""
    daemon = start_nsqd(tmp_path, *FLAGS)
    try:
        create_channel(daemon)
        bodies = [b"m%05d" % n for n in range(3000)]
        mpub(daemon.port("TCP"), bodies)
        connection = subscribe(daemon.port("TCP"), 200)
        seen = finish_odd_requeue_even(connection, len(bodies))
        assert sorted(seen) == bodies  # each once: none came back early
        # Every REQ waits: most in the delay queue (each time the window filled, what waited
        # in memory moved there), the latest ones in memory (120 s is below the threshold).
        stats = poll(
            lambda: (
                (c := channel_stats(daemon))["delayed_queue_count"] + c["deferred_count"] == 1500
                and c
            ),
            lambda: f"1,500 delayed: {channel_stats(daemon)}",
        )
        assert stats["delayed_queue_count"] >= 1000, stats
        connection.close()
    finally:
        daemon.stop()


def test_a_full_window_opens_again_once_its_moves_are_written_with_nothing_in_flight(tmp_path):
    """RDY 1: when the window fills, the consumer holds nothing and sends nothing more. The
    pump that found it full waits; writing the moved messages is what opens it again, and
    that alone must wake the pump."""
    daemon = start_nsqd(tmp_path, *FLAGS, "--max-confirm-win=8")
    try:
        create_channel(daemon)
        bodies = [b"m%03d" % n for n in range(100)]
        mpub(daemon.port("TCP"), bodies)
        connection = subscribe(daemon.port("TCP"), 1)
        seen = finish_odd_requeue_even(connection, len(bodies))
        assert seen == bodies
        connection.close()
    finally:
        daemon.stop()


def test_a_dpub_is_delayed_through_kill_9_right_after_its_ok(tmp_path):
    daemon = start_nsqd(tmp_path, *FLAGS, "--max-req-timeout=2h")
    try:
        create_channel(daemon)
        for n in range(3):
            dpub(daemon.port("TCP"), b"later%d" % n, 3_600_000)
        published = time.time()
        dpub(daemon.port("TCP"), b"soon", 1500)
        daemon.kill()
        daemon = start_nsqd(tmp_path, *FLAGS, "--max-req-timeout=2h")
        connection = subscribe(daemon.port("TCP"), 10)
        mpub(daemon.port("TCP"), [b"now"])
        (first,) = connection.read_messages(1)
        assert first.body == b"now"
        connection.send(b"FIN " + first.id + b"\n")
        (second,) = connection.read_messages(1)
        assert second.body == b"soon"
        assert time.time() >= published + 1.5
        connection.send(b"FIN " + second.id + b"\n")
        poll(lambda: channel_stats(daemon)["delayed_queue_count"] == 3, "the hour-long three")
        connection.close()
    finally:
        daemon.stop()


def test_past_the_channels_delayed_cap_a_long_req_stays_in_memory(tmp_path):
    """Youzan's `--max-channel-delayed-qnum`: with a cap of 1, the first long REQ moves to the
    delay queue, the second stays deferred in memory; both come when due."""
    daemon = start_nsqd(
        tmp_path, *FLAGS, "--req-to-end-threshold=1s", "--max-channel-delayed-qnum=1"
    )
    try:
        create_channel(daemon)
        mpub(daemon.port("TCP"), [b"a", b"b"])
        connection = subscribe(daemon.port("TCP"), 10)
        first, second = connection.read_messages(2)
        connection.send(b"REQ " + first.id + b" 2000\n")
        poll(
            lambda: channel_stats(daemon)["delayed_queue_count"] == 1,
            lambda: f"the first moved: {channel_stats(daemon)}",
        )
        connection.send(b"REQ " + second.id + b" 2000\n")
        poll(
            lambda: (
                (c := channel_stats(daemon))["delayed_queue_count"] == 1
                and c["deferred_count"] == 1
                and c["in_flight_count"] == 0
            ),
            lambda: f"the second deferred in memory: {channel_stats(daemon)}",
        )
        again = connection.read_messages(2)
        assert sorted(m.body for m in again) == [b"a", b"b"]
    finally:
        daemon.kill()


def test_a_message_moved_to_the_end_comes_when_due_across_restarts_and_once(tmp_path):
    args = (*FLAGS, "--req-to-end-threshold=1s")
    daemon = start_nsqd(tmp_path, *args)
    try:
        create_channel(daemon)
        mpub(daemon.port("TCP"), [b"a", b"b"])
        connection = subscribe(daemon.port("TCP"), 10)
        first, second = connection.read_messages(2)
        requeued = time.time()
        connection.send(b"REQ " + first.id + b" 4000\n")
        connection.send(b"FIN " + second.id + b"\n")
        # Moved: in the delay queue, and the cursor confirmed both messages and the copy (a
        # record of the log too).
        poll(
            lambda: (
                (c := channel_stats(daemon))["delayed_queue_count"] == 1
                and c["deferred_count"] == 0
                and c["confirmed_count"] == 3
            ),
            lambda: f"the message moved: {channel_stats(daemon)}",
        )
        connection.close()
        assert daemon.stop() == 0
        daemon = start_nsqd(tmp_path, *args)
        connection = subscribe(daemon.port("TCP"), 10)
        (again,) = connection.read_messages(1)
        assert (again.body, again.id) == (first.body, first.id)
        assert again.attempts == 2
        assert time.time() >= requeued + 4.0
        connection.send(b"FIN " + again.id + b"\n")
        poll(lambda: channel_stats(daemon)["delayed_queue_count"] == 0, "the delayed one done")
        connection.close()
        assert daemon.stop() == 0
        daemon = start_nsqd(tmp_path, *args)
        connection = subscribe(daemon.port("TCP"), 10)
        mpub(daemon.port("TCP"), [b"c"])
        (message,) = connection.read_messages(1)
        assert message.body == b"c"  # nothing finished came back first
        connection.close()
    finally:
        daemon.stop()


def test_emptydelayed_drops_the_channels_delayed_messages(tmp_path):
    daemon = start_nsqd(tmp_path, *FLAGS)
    try:
        create_channel(daemon)
        for n in range(5):
            dpub(daemon.port("TCP"), b"d%d" % n, 600_000)
        poll(lambda: channel_stats(daemon)["delayed_queue_count"] == 5, "five delayed")
        http_request(daemon.port("HTTP"), "POST", "/channel/emptydelayed?topic=lt&channel=c")
        assert channel_stats(daemon)["delayed_queue_count"] == 0
        metrics = http_request(daemon.port("HTTP"), "GET", "/metrics").decode()
        (series,) = [line for line in metrics.splitlines() if "nsq_channel_delayed_queue{" in line]
        assert series.endswith(" 0")
    finally:
        daemon.stop()


def test_retention_passes_a_delayed_message_which_still_comes_when_due(tmp_path):
    """The segment holding a DPUB's record is removed by retention: the delayed message was
    written again at the log's end first, so it does not hold retention back and still comes."""
    daemon = start_nsqd(tmp_path, *FLAGS, "--max-bytes-per-file=4096")
    try:
        create_channel(daemon)
        dpub(daemon.port("TCP"), b"delayed", 3000)
        published = time.time()
        mpub(daemon.port("TCP"), [b"x" * 100] * 200)  # 26 KB: several segments
        connection = subscribe(daemon.port("TCP"), 200)
        for _ in range(200):
            (message,) = connection.read_messages(1)
            assert message.body == b"x" * 100
            connection.send(b"FIN " + message.id + b"\n")
        poll(lambda: channel_stats(daemon)["confirmed_count"] == 201, "every message confirmed")
        http_request(daemon.port("HTTP"), "POST", "/topic/greedyclean?topic=lt")
        stats = json.loads(http_request(daemon.port("HTTP"), "GET", "/stats?format=json"))
        (topic,) = stats["topics"]
        assert topic["log_start_offset"] > 0  # the DPUB's record (at 0) is gone
        assert channel_stats(daemon)["delayed_queue_count"] == 1
        (message,) = connection.read_messages(1)
        assert message.body == b"delayed"
        assert time.time() >= published + 3.0 - 0.1
        connection.close()
    finally:
        daemon.stop()


def _refused(port: int, method: str, path: str) -> tuple[int, dict]:
    try:
        http_request(port, method, path)
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())
    raise AssertionError(f"{method} {path} was answered 200")


def test_requeuedelayed_makes_every_delayed_message_due_now(tmp_path):
    """Those in the delay queue (DPUBs) and the one deferred in memory (a REQ under the
    threshold) all come at once."""
    daemon = start_nsqd(tmp_path, *FLAGS)
    try:
        create_channel(daemon)
        for n in range(3):
            dpub(daemon.port("TCP"), b"d%d" % n, 600_000)
        mpub(daemon.port("TCP"), [b"req"])
        connection = subscribe(daemon.port("TCP"), 10)
        (message,) = connection.read_messages(1)
        connection.send(b"REQ " + message.id + b" 600000\n")
        poll(
            lambda: (
                (c := channel_stats(daemon))["delayed_queue_count"] == 3
                and c["deferred_count"] == 1
            ),
            lambda: f"three delayed, one deferred: {channel_stats(daemon)}",
        )
        http_request(daemon.port("HTTP"), "POST", "/channel/requeuedelayed?topic=lt&channel=c")
        bodies = sorted(m.body for m in connection.read_messages(4))
        assert bodies == [b"d0", b"d1", b"d2", b"req"]
        connection.close()
    finally:
        daemon.stop()


def test_message_finish_finishes_one_message_whoever_holds_it(tmp_path):
    """Youzan's /message/finish: a message in flight to a consumer (by Youzan's decimal
    `msgid`), one deferred in memory and one in the delay queue (by nsqpy's hex `id`); none
    comes back after a restart, and the consumer's own FIN of the first is refused."""
    args = (*FLAGS, "--req-to-end-threshold=1s")
    daemon = start_nsqd(tmp_path, *args)
    http = daemon.port("HTTP")
    try:
        create_channel(daemon)
        mpub(daemon.port("TCP"), [b"flying", b"memory", b"queue"])
        connection = subscribe(daemon.port("TCP"), 10)
        flying, memory, queue = connection.read_messages(3)
        connection.send(b"REQ " + memory.id + b" 500000\n")  # over 1 s: to the delay queue
        connection.send(b"REQ " + queue.id + b" 500000\n")
        poll(lambda: channel_stats(daemon)["delayed_queue_count"] == 2, "two in the queue")
        mpub(daemon.port("TCP"), [b"deferred"])
        (deferred,) = connection.read_messages(1)
        connection.send(b"REQ " + deferred.id + b" 900\n")  # under 1 s: in memory
        poll(lambda: channel_stats(daemon)["deferred_count"] == 1, "one deferred")

        base = "/message/finish?topic=lt&channel=c"
        http_request(http, "POST", f"{base}&msgid={int(flying.id, 16)}")
        http_request(http, "POST", f"{base}&id={queue.id.decode()}")
        http_request(http, "POST", f"{base}&id={deferred.id.decode()}")
        connection.send(b"FIN " + flying.id + b"\n")
        error = connection.read_response()
        assert error.data == b"E_FIN_FAILED FIN " + flying.id + b" failed ID not in flight"
        stats = channel_stats(daemon)
        assert (stats["in_flight_count"], stats["deferred_count"]) == (0, 0)
        assert stats["delayed_queue_count"] == 1  # `memory`, still delayed

        assert _refused(http, "POST", f"{base}&msgid=x1") == (400, {"message": "INVALID_REQUEST"})
        assert _refused(http, "POST", f"{base}&id={flying.id.decode()}") == (
            500,
            {"message": "Message ID not in flight"},
        )
        assert _refused(http, "POST", "/message/finish?topic=lt&channel=nope&msgid=1") == (
            404,
            {"message": "CHANNEL_NOT_FOUND"},
        )
        connection.close()
        assert daemon.stop() == 0
        daemon = start_nsqd(tmp_path, *args)
        http = daemon.port("HTTP")
        connection = subscribe(daemon.port("TCP"), 10)
        http_request(http, "POST", "/channel/requeuedelayed?topic=lt&channel=c")
        mpub(daemon.port("TCP"), [b"last"])
        bodies = sorted(m.body for m in connection.read_messages(2))
        assert bodies == [b"last", b"memory"]  # the three finished never came back
        connection.close()
    finally:
        daemon.stop()


def test_finishmemdelayed_finishes_what_waits_in_memory_and_not_the_delay_queue(tmp_path):
    daemon = start_nsqd(tmp_path, *FLAGS)
    http = daemon.port("HTTP")
    try:
        create_channel(daemon)
        dpub(daemon.port("TCP"), b"queued", 600_000)
        mpub(daemon.port("TCP"), [b"m1", b"m2"])
        connection = subscribe(daemon.port("TCP"), 10)
        for message in connection.read_messages(2):
            connection.send(b"REQ " + message.id + b" 600000\n")
        poll(lambda: channel_stats(daemon)["deferred_count"] == 2, "two deferred in memory")
        http_request(http, "POST", "/channel/finishmemdelayed?topic=lt&channel=c")
        stats = channel_stats(daemon)
        assert (stats["deferred_count"], stats["delayed_queue_count"]) == (0, 1)
        # Finished, not just dropped: the cursor confirmed them, so no restart brings them back.
        poll(lambda: channel_stats(daemon)["confirmed_count"] == 3, "all three confirmed")
        assert http_request(http, "PUT", "/delayqueue/enable?enable=true") == b""
        connection.close()
    finally:
        daemon.stop()


def test_a_consumer_gets_what_follows_delayed_records_at_once(tmp_path):
    """A read that finds only delayed records (passed by the cursor) reads on: a consumer with
    RDY 1 that subscribes after two DPUBs and a PUB gets the PUB without another publish."""
    daemon = start_nsqd(tmp_path, *FLAGS)
    try:
        create_channel(daemon)
        dpub(daemon.port("TCP"), b"later1", 600_000)
        dpub(daemon.port("TCP"), b"later2", 600_000)
        mpub(daemon.port("TCP"), [b"now"])
        connection = subscribe(daemon.port("TCP"), 1)
        (message,) = connection.read_messages(1)
        assert message.body == b"now"
        connection.close()
    finally:
        daemon.stop()


def test_a_move_to_the_delay_queue_on_a_full_disk_keeps_the_message_in_memory(tmp_path):
    """The move's write cannot be made (ENOSPC on a real 8 MiB tmpfs): nsqd stays up (the
    delay queue's index refuses its commits too), the message waits in memory and comes
    when due; with space back, the next long REQ moves."""
    disk = Tmpfs(tmp_path / "disk", "8m")
    args = (*FLAGS, "--req-to-end-threshold=1s")
    daemon = start_nsqd(disk.mount_point, *args)
    try:
        create_channel(daemon)
        mpub(daemon.port("TCP"), [b"full", b"free"])
        connection = subscribe(daemon.port("TCP"), 10)
        full, free = connection.read_messages(2)
        disk.fill()
        requeued = time.time()
        connection.send(b"REQ " + full.id + b" 2000\n")
        (again,) = connection.read_messages(1)
        assert again.body == b"full" and time.time() >= requeued + 2.0
        connection.send(b"FIN " + again.id + b"\n")
        disk.free()
        poll(lambda: _healthy(daemon), "healthy again")
        connection.send(b"REQ " + free.id + b" 600000\n")
        poll(
            lambda: channel_stats(daemon)["delayed_queue_count"] == 1,
            lambda: f"moved with space back: {channel_stats(daemon)} {daemon.log[-1500:]}",
        )
        assert daemon.process.poll() is None
        assert "delay queue" in daemon.log and "database or disk is full" in daemon.log
        connection.close()
    finally:
        daemon.stop()
        disk.close()


def _healthy(daemon) -> bool:
    try:
        return http_request(daemon.port("HTTP"), "GET", "/ping") == b"OK"
    except urllib.error.HTTPError:
        return False  # 500 NOK - <reason>


def test_a_message_attempted_many_times_is_requeued_to_the_delay_queue(tmp_path):
    """Youzan's third rule: past ten attempts, a REQ with a delay (here 1 s, far below the
    15 min threshold, the window far from full) moves the message to the delay queue."""
    daemon = start_nsqd(tmp_path, *FLAGS)
    try:
        create_channel(daemon)
        mpub(daemon.port("TCP"), [b"again"])
        connection = subscribe(daemon.port("TCP"), 1)
        for attempt in range(1, 11):
            (message,) = connection.read_messages(1)
            assert message.attempts == attempt
            connection.send(b"REQ " + message.id + b" 0\n")
        (message,) = connection.read_messages(1)
        assert message.attempts == 11
        connection.send(b"REQ " + message.id + b" 1000\n")
        poll(
            lambda: (
                (c := channel_stats(daemon))["delayed_queue_count"] == 1
                and c["deferred_count"] == 0
            ),
            lambda: f"moved to the delay queue: {channel_stats(daemon)}",
        )
        (again,) = connection.read_messages(1)
        assert (again.body, again.attempts) == (b"again", 12)
        connection.close()
    finally:
        daemon.stop()
