"""Poison messages (nsqd/dead_letters.py): a channel's attempt limit sends a message delivered
that many times to the channel's dead-letter topic instead of out again; it is counted in
/stats and /metrics, kept in the dead-letter topic's channel `replay`, and put back into the
channel by /channel/replaydeadletters. Real nsqd processes, a classic topic and a log topic."""

import json
import subprocess
import urllib.error

from tests.harness import BIN, V2Connection, http_request, start_nsqd
from tests.nsqd.log_topic_client import FLAGS, create_channel, mpub, subscribe
from tests.support.polling import poll


def channel_of(daemon, topic: str, channel: str) -> dict:
    path = f"/stats?format=json&topic={topic}"
    stats = json.loads(http_request(daemon.port("HTTP"), "GET", path))
    (found,) = [c for t in stats["topics"] for c in t["channels"] if c["channel_name"] == channel]
    return found


def requeue_until_dead(
    connection: V2Connection, poison: bytes, limit: int, others: frozenset[bytes] = frozenset()
) -> list[int]:
    """Receive, REQ the poison message and FIN the rest, until it came `limit` times and each
    of `others` came: the attempts each of its deliveries had."""
    attempts = []
    seen: set[bytes] = set()
    while len(attempts) < limit or not others <= seen:
        for message in connection.read_messages(1):
            if message.body == poison:
                attempts.append(message.attempts)
                connection.send(b"REQ " + message.id + b" 0\n")
            else:
                seen.add(message.body)
                connection.send(b"FIN " + message.id + b"\n")
    return attempts


def test_a_classic_channel_sends_a_message_past_its_attempts_to_its_dead_letter_topic(tmp_path):
    daemon = start_nsqd(tmp_path, "--max-attempts=3")
    http = daemon.port("HTTP")
    try:
        http_request(http, "POST", "/pub?topic=t", b"poison")
        connection = V2Connection(daemon.port("TCP"))
        connection.send(b"SUB t c\n")
        assert connection.read_response().data == b"OK"
        connection.send(b"RDY 1\n")
        assert requeue_until_dead(connection, b"poison", 3) == [1, 2, 3]
        stats = poll(
            lambda: (c := channel_of(daemon, "t", "c"))["dead_letter_count"] == 1 and c,
            lambda: f"one dead letter: {channel_of(daemon, 't', 'c')}",
        )
        assert stats["max_attempts"] == 3 and stats["dead_letter_topic"] == "t.c.dead"
        assert stats["dead_letter_waiting"] == 1
        assert (stats["depth"], stats["in_flight_count"]) == (0, 0)
        # In the dead-letter topic, on its way to `replay` (a new topic fans out from its pump).
        poll(lambda: channel_of(daemon, "t.c.dead", "replay")["depth"] == 1, "in replay")
        metrics = http_request(http, "GET", "/metrics").decode()
        assert 'nsq_channel_dead_letters_total{topic="t",channel="c"} 1' in metrics
        # The next message goes out; the poison one does not come again.
        http_request(http, "POST", "/pub?topic=t", b"good")
        (message,) = connection.read_messages(1)
        assert message.body == b"good"
        connection.send(b"FIN " + message.id + b"\n")

        http_request(http, "POST", "/channel/replaydeadletters?topic=t&channel=c")
        (again,) = connection.read_messages(1)
        assert (again.body, again.attempts) == (b"poison", 1)
        connection.send(b"FIN " + again.id + b"\n")
        assert channel_of(daemon, "t", "c")["dead_letter_waiting"] == 0
        assert channel_of(daemon, "t.c.dead", "replay")["depth"] == 0
        connection.close()
    finally:
        daemon.stop()


def test_a_log_topic_channels_own_limit_is_kept_and_its_dead_letters_replayed(tmp_path):
    """`/channel/setmaxattempts` on a log topic's channel (no flag): kept in nsqd.dat across a
    restart; the dead letter is confirmed in the channel (not delivered again after the
    restart) and replayed into the log for that channel alone."""
    daemon = start_nsqd(tmp_path, *FLAGS)
    http = daemon.port("HTTP")
    try:
        create_channel(daemon)
        http_request(http, "POST", "/channel/create?topic=lt&channel=other")
        http_request(http, "POST", "/channel/setmaxattempts?topic=lt&channel=c&max_attempts=2")
        mpub(daemon.port("TCP"), [b"poison", b"after"])
        connection = subscribe(daemon.port("TCP"), 1)
        assert requeue_until_dead(connection, b"poison", 2, frozenset({b"after"})) == [1, 2]
        poll(lambda: channel_of(daemon, "lt", "c")["confirmed_count"] == 2, "both confirmed")
        connection.close()
        assert daemon.stop() == 0

        daemon = start_nsqd(tmp_path, *FLAGS)
        http = daemon.port("HTTP")
        stats = channel_of(daemon, "lt", "c")
        assert (stats["max_attempts"], stats["dead_letter_topic"]) == (2, "lt.c.dead")
        assert stats["dead_letter_waiting"] == 1
        http_request(http, "POST", "/channel/replaydeadletters?topic=lt&channel=c")
        connection = subscribe(daemon.port("TCP"), 1)
        (again,) = connection.read_messages(1)
        assert (again.body, again.attempts) == (b"poison", 1)
        connection.send(b"FIN " + again.id + b"\n")
        poll(lambda: channel_of(daemon, "lt.c.dead", "replay")["depth"] == 0, "replayed")
        connection.close()
        # The replay was for channel `c` alone; `other` has the two messages once.
        other = channel_of(daemon, "lt", "other")
        assert other["depth"] == 3 and "max_attempts" not in other  # two, and the replay record
    finally:
        daemon.stop()


def _refused(port: int, path: str) -> tuple[int, dict]:
    try:
        http_request(port, "POST", path)
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())
    raise AssertionError(f"{path} was answered 200")


def test_bad_attempt_limits_are_refused(tmp_path):
    daemon = start_nsqd(tmp_path)
    http = daemon.port("HTTP")
    try:
        http_request(http, "POST", "/topic/create?topic=t")
        http_request(http, "POST", "/channel/create?topic=t&channel=c")
        base = "/channel/setmaxattempts?topic=t&channel=c"
        for value in ("x", "-1", "65536"):
            assert _refused(http, f"{base}&max_attempts={value}") == (
                400,
                {"message": "INVALID_ARG_MAX_ATTEMPTS"},
            )
        assert _refused(http, base) == (400, {"message": "MISSING_ARG_MAX_ATTEMPTS"})
        assert _refused(http, "/channel/setmaxattempts?topic=t&channel=d&max_attempts=1") == (
            404,
            {"message": "CHANNEL_NOT_FOUND"},
        )
        # No limit: a channel's stats keep Go's keys.
        assert "max_attempts" not in channel_of(daemon, "t", "c")
    finally:
        daemon.stop()
    finished = subprocess.run(
        [str(BIN / "nsqd"), f"-data-path={tmp_path}", "-max-attempts=70000"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert finished.returncode == 1
    (line,) = [line for line in finished.stderr.splitlines() if "FATAL" in line]
    assert line.endswith("--max-attempts must be between 0 and 65535")
