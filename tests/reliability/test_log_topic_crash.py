"""kill -9 on log topics (docs/design.md §13): with `--sync-every=1` every acknowledged publish
is in the partition's log after SIGKILL, and a channel resumes at or before its persisted
confirmed position: messages may come again, none is skipped, and the partition's order holds.
Seeded, against a real nsqd process."""

import random

from tests.harness import V2Connection, http_request, start_nsqd

FLAGS = ("--sync-every=1", "--mem-queue-size=0", "--sync-timeout=50ms")
TRIALS = 3


def test_kill_9_loses_no_acknowledged_message_of_a_log_topic(tmp_path):
    rng = random.Random(0x106)
    daemon = start_nsqd(tmp_path, *FLAGS)
    acknowledged: list[bytes] = []
    consumed: list[bytes] = []
    try:
        port = daemon.port("HTTP")
        http_request(port, "POST", "/topic/create?topic=crash&partition_num=1")
        http_request(port, "POST", "/channel/create?topic=crash&channel=c&partition=0")
        for trial in range(TRIALS):
            publisher = V2Connection(daemon.port("TCP"))
            for n in range(rng.randrange(50, 200)):
                body = b"t%d-%d" % (trial, n)
                publisher.send(b"PUB crash 0\n" + len(body).to_bytes(4, "big") + body)
                assert publisher.read_response().data == b"OK"
                acknowledged.append(body)
            publisher.close()
            consumed += consume(daemon.port("TCP"), rng.randrange(0, 40))
            daemon.kill()
            daemon = start_nsqd(tmp_path, *FLAGS)
        consumed += consume(daemon.port("TCP"), 0, until=set(acknowledged) - set(consumed))
    finally:
        daemon.stop()
    assert set(acknowledged) <= set(consumed)
    # Whatever came again came before anything new: first deliveries are in publish order.
    firsts = list(dict.fromkeys(consumed))
    assert firsts == acknowledged


def consume(port: int, count: int, until: set[bytes] | None = None) -> list[bytes]:
    """`count` messages of crash:c, or (`until`) as many as it takes to see all of those, each
    FINished (binary IDs: a SUB with a partition). A message that does not come within the
    connection's 10 s timeout fails the test."""
    missing = set(until or ())
    if count == 0 and not missing:
        return []
    connection = V2Connection(port)
    connection.send(b"SUB crash c 0\n")
    assert connection.read_response().data == b"OK"
    connection.send(b"RDY %d\n" % (100 if missing else count))
    bodies = []
    while len(bodies) < count or missing:
        (message,) = connection.read_messages(1)
        bodies.append(message.body)
        missing.discard(message.body)
        connection.send(b"FIN " + message.id + b"\n")
    connection.send(b"CLS\n")
    assert connection.read_response().data == b"CLOSE_WAIT"
    connection.close()
    return bodies
